//! The JSON the backend answers with on its listing and history routes, as owned types the
//! server writes and the command line reads. Field names and order are the wire format: a field
//! renamed or moved here changes what every client sees.

use serde::{Deserialize, Serialize};

/// A held lock, as `GET /locks` lists it and `GET /states` shows it beside its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedLock {
    pub state: String,
    /// The lock ID Terraform sent.
    pub id: String,
    /// Who Terraform says holds it (`user@host`), as the client sent it.
    pub who: String,
    pub operation: String,
    /// The authenticated user who took it; absent on locks older than that record.
    pub user: Option<String>,
    /// When it was taken (Unix seconds).
    pub created: Option<i64>,
    /// Seconds since then, as the server saw it when answering.
    pub age_seconds: Option<i64>,
}

/// A state, as `GET /states` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedState {
    pub state: String,
    pub serial: Option<u64>,
    pub lineage: Option<String>,
    /// When it last changed (Unix seconds), by whom and how; absent for a lock on a state not
    /// written yet.
    pub updated: Option<i64>,
    pub author: Option<String>,
    pub operation: Option<String>,
    pub lock: Option<ListedLock>,
}

/// One revision of a state, as the history route lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    /// The commit id.
    pub version: String,
    /// Seconds since the Unix epoch.
    pub time: i64,
    pub author: String,
    pub operation: String,
    pub serial: Option<u64>,
    pub lineage: Option<String>,
    pub deleted: bool,
    /// The revision a restore wrote again (absent from servers older than this field).
    #[serde(default)]
    pub restored_from: Option<String>,
}

/// One page of `GET /history/<state>`, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryAnswer {
    pub state: String,
    pub page: usize,
    pub versions: Vec<VersionInfo>,
    /// The page to ask for next, when there are older revisions.
    pub next_page: Option<usize>,
}

/// The answer of `POST /history/<state>?restore=<selector>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restored {
    /// The revision whose content was written again.
    pub from: String,
    /// The serial of the new revision (above every serial stored before).
    pub serial: u64,
}
