//! State refs by name, and what this process knows of them on one remote.
//!
//! A state ref (issue 27) holds one state's newest writes: `refs/gitstate/states/<40 hex>`, the
//! sha1 of the state's path exactly as the branch stores it. One fixed-length component: no
//! directory/file conflicts between `a` and `a/b`, no collisions on hosts that fold case or
//! unicode in ref names, no length limits. The path itself is in the commit.

use std::collections::HashMap;

use gix::ObjectId;
use sha1::{Digest, Sha1};

use crate::protocol::Advert;

/// Where state refs live.
pub(super) const STATE_REF_PREFIX: &str = "refs/gitstate/states/";

/// The state ref of the file at `path`.
pub(super) fn state_ref(path: &str) -> String {
    let digest = Sha1::digest(path.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{STATE_REF_PREFIX}{hex}")
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

    /// The tip of `name` (`Some(None)`: absent), or `None` when this process does not know.
    pub(super) fn tip(&self, name: &str) -> Option<Option<ObjectId>> {
        match self.tips.get(name) {
            Some(known) => Some(*known),
            None if self.complete => Some(None),
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{KnownStates, STATE_REF_PREFIX, state_ref};
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
            let name = state_ref(&path);
            let hex = name.strip_prefix(STATE_REF_PREFIX).expect("prefix");
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
            state_ref("team/app.tfstate"),
            format!(
                "{STATE_REF_PREFIX}{}",
                "6dc979803b7420b1d11e99c324cce2d3a2c938f5"
            )
        );
    }

    #[test]
    fn a_complete_listing_knows_absence_a_partial_one_does_not() {
        let id = ObjectId::from_hex(b"0123456789012345678901234567890123456789").expect("id");
        let (a, b) = (state_ref("a.tfstate"), state_ref("b.tfstate"));
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
}
