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
