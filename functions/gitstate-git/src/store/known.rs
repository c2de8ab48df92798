//! State refs by name, and what this process knows of them on one remote.
//!
//! A state ref (issue 27) holds one state's newest writes:
//! `refs/gitstate/states/<branch>/<40 hex>`, the branch's name (as in `refs/heads/<branch>`)
//! and the sha1 of the state's path exactly as the branch stores it. So the same path on two
//! branches has two refs, and the path is one fixed-length component: no directory/file
//! conflicts between `a` and `a/b`, no collisions on hosts that fold case or unicode in ref
//! names, no length limits. The path itself is in the commit.

use std::collections::HashMap;
use std::time::Instant;

use gix::ObjectId;
use sha1::{Digest, Sha1};

use crate::protocol::Advert;

/// Where state refs live.
pub(super) const STATE_REF_PREFIX: &str = "refs/gitstate/states/";

/// The folder of the state refs of `branch` (a full ref name).
pub(super) fn states_of(branch: &str) -> String {
    let name = branch.strip_prefix("refs/heads/").unwrap_or(branch);
    format!("{STATE_REF_PREFIX}{name}/")
}

/// The state ref of the file at `path` on `branch` (a full ref name).
pub(super) fn state_ref(branch: &str, path: &str) -> String {
    let digest = Sha1::digest(path.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}{hex}", states_of(branch))
}

/// Whether `name` is a state ref of `branch` (not one of a branch in a folder of its name).
pub(super) fn is_state_ref_of(branch: &str, name: &str) -> bool {
    name.strip_prefix(&states_of(branch))
        .is_some_and(|hex| hex.len() == 40 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Whether the ref `name` is one of the repository's own (a branch, a tag, anything a person
/// made), not gitstate's: its lock refs under `locks` and everything under `refs/gitstate/`
/// aside. A repository with none is empty to the branch rule.
pub(super) fn is_others(name: &str, locks: &str) -> bool {
    name != "HEAD" && !name.starts_with(locks) && !name.starts_with("refs/gitstate/")
}

/// The state refs this process has seen, by name: a tip, or known to be absent.
#[derive(Debug, Default)]
pub(super) struct KnownStates {
    /// A listing of every ref was seen: a state ref not in `tips` is absent.
    complete: bool,
    tips: HashMap<String, Option<ObjectId>>,
}

/// State refs remembered at most (a listing of more is kept, but not marked complete).
const MAX_KNOWN: usize = 1 << 16;

impl KnownStates {
    /// `advert` lists every ref of the remote.
    pub(super) fn saw_all(&mut self, advert: &Advert) {
        let tips: HashMap<String, Option<ObjectId>> = advert
            .refs
            .iter()
            .filter(|(name, _)| name.starts_with(STATE_REF_PREFIX))
            .map(|(name, tip)| (name.clone(), Some(*tip)))
            .take(MAX_KNOWN)
            .collect();
        self.complete = tips.len() < MAX_KNOWN;
        self.tips = tips;
    }

    /// `name` is at `tip` (`None`: absent), as an advertisement of it or a push to it says.
    pub(super) fn saw(&mut self, name: &str, tip: Option<ObjectId>) {
        if self.tips.len() >= MAX_KNOWN && !self.tips.contains_key(name) {
            self.tips.clear();
            self.complete = false;
        }
        self.tips.insert(name.to_owned(), tip);
    }

    /// The LOCK probes (`<state ref>/absent`) seen at `commit`, a lock commit.
    pub(super) fn probes_at(&self, commit: ObjectId) -> Vec<String> {
        self.tips
            .iter()
            .filter(|(name, tip)| name.ends_with("/absent") && **tip == Some(commit))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The tip of `name` (`Some(None)`: absent), or `None` when this process does not know.
    pub(super) fn tip(&self, name: &str) -> Option<Option<ObjectId>> {
        match self.tips.get(name) {
            Some(known) => Some(*known),
            None if self.complete => Some(None),
            None => None,
        }
    }
}

/// Where a state's newest content was, as one look (an advertisement asked for the branch and
/// the state's ref by name, or a push of this process) found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Home {
    /// No state ref: the branch's file.
    Absent,
    /// The state ref, at this tip.
    At(ObjectId),
    /// A push of this process changed the ref, or may have: nothing is known.
    Unknown,
}

/// One look at a state: the branch tip, the state's home, and when the look was asked for (no
/// later than the moment it described).
///
/// While this process holds a state's lock, nobody else creates, moves or deletes that state's
/// ref or file (the fold moves only the branch, and replays a state only while it has a ref),
/// so a look asked after this process's LOCK landed stays true until this process writes; a
/// look asked before it proves nothing (another holder may have come and gone since).
#[derive(Debug, Clone, Copy)]
pub(super) struct Seen {
    pub(super) branch: ObjectId,
    pub(super) home: Home,
    pub(super) at: Instant,
}

/// The last look at each state ref this process took, by ref name.
#[derive(Debug, Default)]
pub(super) struct Looks(HashMap<String, Seen>);

impl Looks {
    /// Keep `seen` for `name` unless a later look is kept already.
    pub(super) fn saw(&mut self, name: &str, seen: Seen) {
        if self.0.len() >= MAX_KNOWN && !self.0.contains_key(name) {
            self.0.clear();
        }
        match self.0.get(name) {
            Some(kept) if kept.at > seen.at => {}
            _ => {
                self.0.insert(name.to_owned(), seen);
            }
        }
    }

    /// A push of this process may have changed `name` (about to push, or pushed without an
    /// answer): looks asked before now prove nothing.
    pub(super) fn unknown(&mut self, name: &str, branch: ObjectId) {
        let seen = Seen {
            branch,
            home: Home::Unknown,
            at: Instant::now(),
        };
        self.0.insert(name.to_owned(), seen);
    }

    /// What a push of this process that landed left: kept whatever was kept before.
    pub(super) fn landed(&mut self, name: &str, seen: Seen) {
        self.0.insert(name.to_owned(), seen);
    }

    /// The last look at `name` if it was asked for at `since` or later and knows something.
    pub(super) fn since(&self, name: &str, since: Instant) -> Option<Seen> {
        self.0
            .get(name)
            .filter(|seen| seen.at >= since && seen.home != Home::Unknown)
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::{Home, KnownStates, Looks, STATE_REF_PREFIX, Seen, is_state_ref_of, state_ref};
    use crate::protocol::Advert;
    use gix::ObjectId;

    /// Generated paths (folders of one another, case and unicode variants, long ones): every
    /// state ref is one component of 40 lowercase hex digits under the prefix, and distinct
    /// paths never share one.
    #[test]
    fn state_refs_are_one_fixed_component_and_distinct() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(27);
        let parts = [
            "a",
            "A",
            "a/b",
            "é",
            "e\u{301}",
            "ß",
            "ss",
            "x".repeat(300).leak(),
        ];
        let mut seen = std::collections::HashMap::new();
        for _ in 0..5_000 {
            let path: Vec<&str> = (0..rng.random_range(1..=4))
                .map(|_| parts[rng.random_range(0..parts.len())])
                .collect();
            let path = format!("{}.tfstate", path.join("/"));
            let name = state_ref("refs/heads/main", &path);
            assert!(is_state_ref_of("refs/heads/main", &name), "{name}");
            assert!(!is_state_ref_of("refs/heads/ma", &name), "{name}");
            let hex = name
                .strip_prefix(STATE_REF_PREFIX)
                .and_then(|rest| rest.strip_prefix("main/"))
                .expect("prefix");
            assert_eq!(hex.len(), 40, "{name}");
            assert!(
                hex.chars()
                    .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
            );
            if let Some(other) = seen.insert(name.clone(), path.clone()) {
                assert_eq!(other, path, "two paths share {name}");
            }
        }
        assert!(seen.len() > 500, "{}", seen.len());
        // What `printf %s PATH | sha1sum` gives, as docs/operating.md tells operators.
        assert_eq!(
            state_ref("refs/heads/main", "team/app.tfstate"),
            format!(
                "{STATE_REF_PREFIX}main/{}",
                "6dc979803b7420b1d11e99c324cce2d3a2c938f5"
            )
        );
    }

    #[test]
    fn a_complete_listing_knows_absence_a_partial_one_does_not() {
        let id = ObjectId::from_hex(b"0123456789012345678901234567890123456789").expect("id");
        let (a, b) = (
            state_ref("refs/heads/main", "a.tfstate"),
            state_ref("refs/heads/main", "b.tfstate"),
        );
        let mut known = KnownStates::default();
        assert_eq!(known.tip(&a), None);
        known.saw(&a, Some(id));
        assert_eq!((known.tip(&a), known.tip(&b)), (Some(Some(id)), None));
        let mut advert = Advert::default();
        advert.refs.insert(b.clone(), id);
        advert.refs.insert("refs/heads/main".into(), id);
        known.saw_all(&advert);
        assert_eq!((known.tip(&a), known.tip(&b)), (Some(None), Some(Some(id))));
    }

    /// A look is kept unless a later one is; a push of this process voids every look asked
    /// before it; only looks asked at or after a given moment (a lock's) are given out.
    #[test]
    fn looks_are_as_of_when_they_were_asked() {
        let id = |b: u8| ObjectId::from_bytes_or_panic(&[b; 20]);
        let name = "refs/gitstate/states/main/x";
        let t0 = std::time::Instant::now();
        let t1 = t0 + std::time::Duration::from_millis(5);
        let seen = |home, at| Seen {
            branch: id(1),
            home,
            at,
        };
        let mut looks = Looks::default();
        looks.saw(name, seen(Home::At(id(2)), t1));
        // An older look (asked before, answered after) does not replace a newer one.
        looks.saw(name, seen(Home::Absent, t0));
        assert_eq!(looks.since(name, t1).map(|s| s.home), Some(Home::At(id(2))));
        // Nothing asked before the lock is given out.
        let lock = t1 + std::time::Duration::from_millis(5);
        assert!(looks.since(name, lock).is_none());
        // A push voids what was seen; what it landed is known again.
        looks.unknown(name, id(1));
        assert!(looks.since(name, t0).is_none());
        looks.landed(name, seen(Home::At(id(3)), t1));
        assert_eq!(looks.since(name, t1).map(|s| s.home), Some(Home::At(id(3))));
    }
}
