//! The protocol record: the settings that decide where locks live, recorded in the repository.
//! Every backend on one repository must agree on them, or they would not see each other's locks.
//!
//! The record is a ref whose name carries the value
//! (`refs/gitstate/protocol/lock-ref-prefix/refs/heads/locks` for `refs/heads/locks/`): every ref
//! advertisement a LOCK already reads shows it, so checking it costs no request. Its commit holds
//! `protocol.json` for people. The first LOCK pushes it together with its lock ref; a backend
//! whose prefix differs refuses to lock, naming both values. Later settings (where pending writes
//! live, say) get refs of their own under [`PROTOCOL_PREFIX`].

/// Where the records live: outside every branch (locks belong to the repository).
pub const PROTOCOL_PREFIX: &str = "refs/gitstate/protocol/";
const LOCK_PREFIX_RECORD: &str = "refs/gitstate/protocol/lock-ref-prefix/";
/// The file in a record's commit.
pub const PROTOCOL_FILE: &str = "protocol.json";

/// The fence: a record among the lock ref prefix records whose value is no lock ref prefix.
/// Versions of gitstate from before states had refs of their own (which would read the branch
/// and write behind a state's ref) read it as another deployment's prefix, so they refuse to
/// lock (412) and to start, naming it; this version ignores it. A backend that may write states
/// to their own refs records it with its first LOCK of the repository.
pub const STATE_REFS_FENCE: &str =
    "refs/gitstate/protocol/lock-ref-prefix/upgrade-gitstate-states-live-on-refs";

/// What the fence's commit holds, for whoever looks at it with git.
pub fn fence_file() -> Vec<u8> {
    fence_json(
        "states of this repository may live on refs/gitstate/states/<branch>/<sha1 of the path>: gitstate versions that do not read them refuse to lock here",
    )
}

/// A fence's `protocol.json`: what it fences off, in a sentence.
fn fence_json(why: &str) -> Vec<u8> {
    let mut text =
        serde_json::to_vec_pretty(&serde_json::json!({ "fence": why })).unwrap_or_default();
    text.push(b'\n');
    text
}

/// Whether `refs` (any refs) hold the fence.
pub fn fenced<'a>(refs: impl IntoIterator<Item = &'a str>) -> bool {
    refs.into_iter().any(|r| r == STATE_REFS_FENCE)
}

/// The second fence, the same way: versions of gitstate from before a LOCK's proof answered
/// reads in every shape do not wait out another process's proof before they write under its
/// lock or release it, so they must not write here once a backend answers from its proofs.
/// Such a backend records it with its first LOCK of the repository.
pub const PROOF_FENCE: &str =
    "refs/gitstate/protocol/lock-ref-prefix/upgrade-gitstate-waits-out-lock-proofs";

/// What the second fence's commit holds, for whoever looks at it with git.
pub fn proof_fence_file() -> Vec<u8> {
    fence_json(
        "backends of this repository answer the reads right after their LOCK from what it proved, and every other backend waits out the time the lock commit records (Reads-Proved-Until) before it writes under that lock or releases it: gitstate versions that do not wait refuse to lock here",
    )
}

/// Whether `refs` (any refs) hold the second fence.
pub fn proof_fenced<'a>(refs: impl IntoIterator<Item = &'a str>) -> bool {
    refs.into_iter().any(|r| r == PROOF_FENCE)
}

/// How a backend's settings stand against the repository's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Protocol {
    /// Recorded, and the settings agree.
    Agrees,
    /// Nothing recorded yet.
    Unrecorded,
    /// Recorded with another value of `setting`.
    Differs {
        setting: &'static str,
        ours: String,
        recorded: String,
    },
}

/// The ref that records `lock_ref_prefix` (which ends in `/`).
pub fn lock_prefix_record(lock_ref_prefix: &str) -> String {
    format!(
        "{LOCK_PREFIX_RECORD}{}",
        lock_ref_prefix.trim_end_matches('/')
    )
}

/// What a record's commit holds, for whoever looks at it with git.
pub fn record_file(lock_ref_prefix: &str) -> Vec<u8> {
    let mut text = serde_json::to_vec_pretty(&serde_json::json!({
        "lock_ref_prefix": lock_ref_prefix,
    }))
    .unwrap_or_default();
    text.push(b'\n');
    text
}

/// How `lock_ref_prefix` stands against the records among `refs` (any refs: others are ignored).
pub fn check<'a>(lock_ref_prefix: &str, refs: impl IntoIterator<Item = &'a str>) -> Protocol {
    let mut recorded: Vec<String> = refs
        .into_iter()
        .filter(|r| *r != STATE_REFS_FENCE && *r != PROOF_FENCE)
        .filter_map(|r| r.strip_prefix(LOCK_PREFIX_RECORD))
        .map(|value| format!("{value}/"))
        .collect();
    recorded.sort();
    if recorded.is_empty() {
        return Protocol::Unrecorded;
    }
    match recorded.iter().find(|value| *value != lock_ref_prefix) {
        None => Protocol::Agrees,
        Some(other) => Protocol::Differs {
            setting: "GITSTATE_LOCK_REF_PREFIX",
            ours: lock_ref_prefix.to_owned(),
            recorded: other.clone(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check of versions from before the fence: this one, without the fence's exclusion.
    fn check_before_the_fence<'a>(prefix: &str, refs: impl IntoIterator<Item = &'a str>) -> bool {
        refs.into_iter()
            .filter_map(|r| r.strip_prefix(LOCK_PREFIX_RECORD))
            .any(|value| format!("{value}/") != prefix)
    }

    #[test]
    fn the_fence_stops_versions_before_it_and_no_other() {
        for ours in ["refs/heads/locks/", "refs/locks/", "refs/a/b/c/"] {
            let record = lock_prefix_record(ours);
            // This version: the fence changes nothing, recorded or not.
            for refs in [
                vec![record.as_str()],
                vec![record.as_str(), STATE_REFS_FENCE],
            ] {
                assert_eq!(check(ours, refs.iter().copied()), Protocol::Agrees);
            }
            assert_eq!(check(ours, [STATE_REFS_FENCE]), Protocol::Unrecorded);
            assert_eq!(
                check(ours, [record.as_str(), PROOF_FENCE, STATE_REFS_FENCE]),
                Protocol::Agrees
            );
            assert_eq!(check(ours, [PROOF_FENCE]), Protocol::Unrecorded);
            assert!(proof_fenced([record.as_str(), PROOF_FENCE]));
            assert!(!proof_fenced([record.as_str(), STATE_REFS_FENCE]));
            assert!(check_before_the_fence(ours, [record.as_str(), PROOF_FENCE]));
            assert!(fenced([record.as_str(), STATE_REFS_FENCE]));
            assert!(!fenced([record.as_str()]));
            // A version before it reads the fence as another deployment's prefix, whatever its own.
            assert!(!check_before_the_fence(ours, [record.as_str()]));
            assert!(check_before_the_fence(
                ours,
                [record.as_str(), STATE_REFS_FENCE]
            ));
        }
        // No lock ref prefix can be the fence's value (prefixes start with `refs/`), and the
        // fence is no folder or file of any prefix's record (no directory/file conflict).
        for fence in [STATE_REFS_FENCE, PROOF_FENCE] {
            let value = fence.strip_prefix(LOCK_PREFIX_RECORD).expect("a record");
            assert!(!value.starts_with("refs") && !value.contains('/'));
        }
    }

    #[test]
    fn records_name_their_value_and_differences_name_both() {
        for ours in ["refs/heads/locks/", "refs/locks/", "refs/a/b/c/"] {
            let record = lock_prefix_record(ours);
            assert!(record.starts_with(PROTOCOL_PREFIX), "{record}");
            assert_eq!(
                check(ours, [record.as_str(), "refs/heads/main"]),
                Protocol::Agrees
            );
            assert_eq!(check(ours, ["refs/heads/main"]), Protocol::Unrecorded);
            let theirs = lock_prefix_record("refs/other/");
            assert_eq!(
                check(ours, [record.as_str(), theirs.as_str()]),
                Protocol::Differs {
                    setting: "GITSTATE_LOCK_REF_PREFIX",
                    ours: ours.to_owned(),
                    recorded: "refs/other/".to_owned(),
                }
            );
        }
    }
}
