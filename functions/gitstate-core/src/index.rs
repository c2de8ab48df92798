//! The state index: what a list of states needs, kept in one file on the branch.
//!
//! `.gitstate/index.json` maps every state to the content it describes (for git: the blob id),
//! its serial and lineage, and the last change (time, author, operation). The store rewrites the
//! entry of a state in the same commit that writes, deletes or restores it, so listing 500 states
//! reads one blob. An entry whose content id is not the state's current one (a commit made by
//! another tool) or that is missing (no index yet) is stale: the list works that state out from
//! its content and history instead.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ports::CommitMeta;
use crate::trailers::{Trailers, operation_of};

/// Where the index lives on the branch (beside the access file, out of the state API's reach).
pub const INDEX_PATH: &str = ".gitstate/index.json";

/// The format written; another number is treated as no index at all (rebuilt).
const FORMAT: u32 = 1;

/// What the index knows of one state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexEntry {
    /// The stored content this entry describes (git: the blob id).
    pub content: String,
    pub serial: Option<u64>,
    pub lineage: Option<String>,
    /// When the state last changed, seconds since the Unix epoch.
    pub time: i64,
    /// Who changed it last (the commit's author: the authenticated user).
    pub author: String,
    /// What changed it (Terraform's operation, or `write`, `restore`, `rekey`…).
    pub operation: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateIndex {
    format: u32,
    pub states: BTreeMap<String, IndexEntry>,
}

impl StateIndex {
    /// The index in `bytes`; `None` for anything unreadable or of another format (then every
    /// entry counts as missing).
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice::<Self>(bytes)
            .ok()
            .filter(|index| index.format == FORMAT)
    }

    /// JSON with one line per state, so `git log -p` shows one changed line per write.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!("{{\"format\":{FORMAT},\"states\":{{");
        for (i, (name, entry)) in self.states.iter().enumerate() {
            out.push_str(if i == 0 { "\n" } else { ",\n" });
            // Strings and numbers always serialise.
            out.push_str(&serde_json::to_string(name).unwrap_or_default());
            out.push(':');
            out.push_str(&serde_json::to_string(entry).unwrap_or_default());
        }
        out.push_str("\n}}\n");
        out.into_bytes()
    }

    /// Record the commit `meta`, made at `time`, that leaves `state` with `content` (`None`: the
    /// commit removes it).
    pub fn record(&mut self, state: &str, content: Option<String>, meta: &CommitMeta, time: i64) {
        match content {
            Some(content) => {
                let trailers = Trailers::parse(&meta.message);
                let entry = IndexEntry {
                    content,
                    serial: trailers.serial,
                    lineage: trailers.lineage,
                    time,
                    author: meta.author_name.clone(),
                    operation: operation_of(&meta.message),
                };
                self.states.insert(state.to_owned(), entry);
            }
            None => {
                self.states.remove(state);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(message: &str) -> CommitMeta {
        CommitMeta {
            author_name: "ann".into(),
            author_email: "a@x".into(),
            committer_name: "gitstate".into(),
            committer_email: "g@x".into(),
            message: message.into(),
        }
    }

    #[test]
    fn entries_follow_the_commit_trailers() {
        let mut index = StateIndex::default();
        let message = "write a (serial 3)\n\nSerial: 3\nLineage: L\nOperation: OperationTypeApply\nLock-ID: x\nWho: w\nUser: ann\n";
        index.record("a", Some("b1".into()), &meta(message), 7);
        index.record("b\"\n", Some("b2".into()), &meta("write x\n"), 8);
        let bytes = index.to_bytes();
        assert_eq!(
            bytes.iter().filter(|b| **b == b'\n').count(),
            4,
            "one line a state"
        );
        let mut parsed = StateIndex::parse(&bytes).expect("round trip");
        assert_eq!(parsed.states, index.states);
        assert_eq!(parsed.states["b\"\n"].operation, "write");
        parsed.record("b\"\n", None, &meta("delete x\n"), 9);
        let entry = &parsed.states["a"];
        assert_eq!(
            (entry.serial, entry.lineage.as_deref(), entry.time),
            (Some(3), Some("L"), 7)
        );
        assert_eq!(
            (entry.author.as_str(), entry.operation.as_str()),
            ("ann", "OperationTypeApply")
        );
        parsed.record("a", None, &meta("delete a\n"), 8);
        assert!(parsed.states.is_empty());
    }

    #[test]
    fn unreadable_or_foreign_indexes_are_absent() {
        for bytes in [
            &b""[..],
            b"[]",
            b"{\"format\":2,\"states\":{}}",
            b"{\"states\":{}}",
        ] {
            assert_eq!(StateIndex::parse(bytes), None, "{bytes:?}");
        }
    }
}
