//! The fold: writes kept on each state's own ref, replayed onto the branch of files off the
//! request path. The store does the work; here are what it records on the branch and what it
//! reports.
//!
//! `.gitstate/folded.json` ([`FOLDED_PATH`]) maps every state a fold ever carried to the last
//! state commit it replayed, so the next fold starts after it and never replays a write twice.
//! A fold also reads it to notice a state written on the branch behind the protocol's back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Where the fold record lives on the branch (beside the index).
pub const FOLDED_PATH: &str = ".gitstate/folded.json";

/// What the folds so far carried: per state path, the last state commit replayed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FoldRecord(pub BTreeMap<String, String>);

impl FoldRecord {
    /// The record in `bytes`. An unreadable record is an error, never an empty one: folding
    /// from an empty record would take every state's writes as unfolded.
    pub fn parse(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// Pretty JSON: one line per state, so `git log -p` shows one changed line per fold of it.
    pub fn to_bytes(&self) -> Vec<u8> {
        // A map of strings always serialises.
        let mut out = serde_json::to_vec_pretty(&self.0).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// The last state commit folded for `path`.
    pub fn last(&self, path: &str) -> Option<&str> {
        self.0.get(path).map(String::as_str)
    }

    pub fn set(&mut self, path: &str, commit: String) {
        self.0.insert(path.to_owned(), commit);
    }
}

/// What one fold did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FoldReport {
    /// Writes (state commits) replayed onto the branch.
    pub writes: usize,
    /// States those writes belong to.
    pub states: usize,
    /// States not folded because their file on the branch is not what the last fold left
    /// (someone wrote it on the branch outside the protocol): they need a person.
    pub refused: Vec<String>,
    /// Another fold held the lease: this one did nothing (the holder folds what is waiting).
    pub busy: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Generated records round-trip, one line a state, whatever the paths hold.
    #[test]
    fn records_round_trip() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(27);
        const PIECES: [&str; 6] = ["a", "/", "\"", "\\", "é", "\n"];
        for _ in 0..500 {
            let mut record = FoldRecord::default();
            for _ in 0..rng.random_range(0..8) {
                let path: String = (0..rng.random_range(1..10))
                    .map(|_| PIECES[rng.random_range(0..PIECES.len())])
                    .collect();
                record.set(&path, format!("{:040x}", rng.random::<u64>()));
            }
            let bytes = record.to_bytes();
            assert_eq!(FoldRecord::parse(&bytes).expect("its own output"), record);
            let lines = bytes.iter().filter(|b| **b == b'\n').count();
            let want = if record.0.is_empty() {
                1
            } else {
                record.0.len() + 2
            };
            assert_eq!(lines, want, "one line a state");
        }
        for unreadable in [
            &b"not json"[..],
            b"",
            b"[]",
            b"{\"a\": 1}",
            b"{\"a\": \"b\"",
        ] {
            assert!(FoldRecord::parse(unreadable).is_err(), "{unreadable:?}");
        }
    }
}
