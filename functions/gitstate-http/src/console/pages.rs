//! The console's list of states, and what every page shows alike (times, locks, operations).

use askama::Template;
use axum::response::Response;
use gitstate_core::access::Caller;
use gitstate_core::ports::HeldLock;
use gitstate_core::service::StateRow;
use gitstate_core::{ReadContext, wording};

use super::html;
use crate::request::Params;
use crate::{ApiError, App, now_seconds};

/// A time as the pages show it.
pub(super) fn when(seconds: i64) -> String {
    jiff::Timestamp::from_second(seconds)
        .map(|t| t.strftime("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_else(|_| seconds.to_string())
}

pub(super) fn datetime(seconds: i64) -> String {
    jiff::Timestamp::from_second(seconds)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// A lock as the pages show it.
pub(super) struct LockView {
    pub id: String,
    pub who: String,
    pub user: String,
    pub operation: Operation,
    pub since: String,
    pub age: String,
}

/// An operation: the words shown, and what the client sent (the element's title).
pub(super) struct Operation {
    pub shown: String,
    pub sent: String,
}

impl Operation {
    pub(super) fn of(sent: &str) -> Self {
        Self {
            shown: wording::operation(sent),
            sent: sent.to_owned(),
        }
    }
}

impl LockView {
    pub(super) fn of(held: &HeldLock, now: i64) -> Self {
        Self {
            id: held.info.id().to_owned(),
            who: held.info.who().to_owned(),
            user: held.owner.clone().unwrap_or_else(|| "unknown".into()),
            operation: Operation::of(held.info.operation()),
            since: held.created.map(when).unwrap_or_default(),
            age: held
                .created
                .map(|c| wording::age(now.saturating_sub(c)))
                .unwrap_or_else(|| "unknown".into()),
        }
    }
}

struct Row {
    name: String,
    serial: String,
    when: String,
    datetime: String,
    author: String,
    operation: Option<Operation>,
    lock: Option<LockView>,
}

#[derive(Template)]
#[template(path = "list.html")]
struct ListPage {
    user: String,
    /// The branch shown, and `?ref=<branch>` when the request named one (links keep it).
    branch: String,
    ref_query: String,
    filter: String,
    total: usize,
    rows: Vec<Row>,
}

pub(super) async fn list(
    app: &App,
    caller: &Caller,
    read: &ReadContext,
    params: &Params,
) -> Result<Response, ApiError> {
    let at = app.backend.locate(None, params.get("ref"))?;
    let rows: Vec<StateRow> = app.backend.list_states(caller, &at, read).await?;
    let filter = params.get("q").unwrap_or_default().trim().to_owned();
    let needle = filter.to_lowercase();
    let now = now_seconds();
    let total = rows.len();
    let rows = rows
        .iter()
        .filter(|row| row.name.as_str().to_lowercase().contains(&needle))
        .map(|row| {
            let entry = row.entry.as_ref();
            Row {
                name: row.name.to_string(),
                serial: entry
                    .and_then(|e| e.serial)
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "–".into()),
                when: entry.map(|e| when(e.time)).unwrap_or_default(),
                datetime: entry.map(|e| datetime(e.time)).unwrap_or_default(),
                author: entry.map(|e| e.author.clone()).unwrap_or_default(),
                operation: entry.map(|e| Operation::of(&e.operation)),
                lock: row.lock.as_ref().map(|held| LockView::of(held, now)),
            }
        })
        .collect();
    html(&ListPage {
        user: caller.user.clone(),
        branch: at.branch.to_string(),
        ref_query: ref_query(params),
        filter,
        total,
        rows,
    })
}

/// `?ref=<branch>` for the links of a page that was asked for a branch; empty otherwise.
pub(super) fn ref_query(params: &Params) -> String {
    params.get("ref").map_or_else(String::new, |branch| {
        format!(
            "?ref={}",
            percent_encoding::utf8_percent_encode(branch, percent_encoding::NON_ALPHANUMERIC)
        )
    })
}
