//! The console's pages: the list of states and one state's page, rendered from the templates.

use askama::Template;
use axum::response::Response;
use gitstate_core::StateName;
use gitstate_core::access::{Caller, Role};
use gitstate_core::changes::Changes;
use gitstate_core::ports::HeldLock;
use gitstate_core::service::{MAX_PAGE, StatePage, StateRow};

use super::{form_token, html};
use crate::request::Params;
use crate::{ApiError, App, now_seconds};

/// Versions on one page of a state (`?per_page=` up to 100).
const PER_PAGE: usize = 20;

/// A time as the pages show it.
fn when(seconds: i64) -> String {
    jiff::Timestamp::from_second(seconds)
        .map(|t| t.strftime("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_else(|_| seconds.to_string())
}

fn datetime(seconds: i64) -> String {
    jiff::Timestamp::from_second(seconds)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// `45 s`, `12 min`, `3 h 5 min`, `2 d 4 h`.
fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86400, s % 86400 / 3600),
    }
}

/// A lock as the pages show it.
struct LockView {
    id: String,
    who: String,
    user: String,
    operation: String,
    since: String,
    age: String,
}

impl LockView {
    fn of(held: &HeldLock, now: i64) -> Self {
        Self {
            id: held.info.id().to_owned(),
            who: held.info.who().to_owned(),
            user: held.owner.clone().unwrap_or_else(|| "unknown".into()),
            operation: held.info.operation().to_owned(),
            since: held.created.map(when).unwrap_or_default(),
            age: held
                .created
                .map(|c| age(now.saturating_sub(c)))
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
    operation: String,
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
    params: &Params,
) -> Result<Response, ApiError> {
    let at = app.backend.locate(None, params.get("ref"))?;
    let rows: Vec<StateRow> = app.backend.list_states(caller, &at).await?;
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
                operation: entry.map(|e| e.operation.clone()).unwrap_or_default(),
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

struct VersionView {
    version: String,
    short: String,
    serial: String,
    when: String,
    datetime: String,
    author: String,
    operation: String,
    deleted: bool,
    /// `None`: not readable as a Terraform state.
    changes: Option<Changes>,
    restorable: bool,
}

struct ResourceView {
    address: String,
    kind: String,
    mode: String,
}

#[derive(Template)]
#[template(path = "state.html")]
struct StatePageView {
    user: String,
    name: String,
    /// The branch shown, and `ref=<branch>` when the request named one (links and forms keep it).
    branch: String,
    ref_param: Option<String>,
    ref_query: String,
    notice: Option<&'static str>,
    admin: bool,
    token: String,
    lock: Option<LockView>,
    versions: Vec<VersionView>,
    page: usize,
    per_page: usize,
    more: bool,
    resources: Option<Vec<ResourceView>>,
}

pub(super) async fn state(
    app: &App,
    caller: &Caller,
    name: &StateName,
    params: &Params,
) -> Result<Response, ApiError> {
    let at = app.backend.locate(None, params.get("ref"))?;
    let page = match params.get("page") {
        None => 0,
        Some(text) => text
            .parse::<usize>()
            .map_err(|_| ApiError::Query(format!("{text:?} is not a page number")))?,
    };
    let per_page = match params.get("per_page") {
        None => PER_PAGE,
        Some(text) => text
            .parse::<usize>()
            .map_err(|_| ApiError::Query(format!("{text:?} is not a number of versions")))?,
    }
    .clamp(1, MAX_PAGE);
    let found: StatePage = app
        .backend
        .state_page(caller, &at, name, page, per_page)
        .await?;
    let admin = caller.may(Role::Admin, name);
    let now = now_seconds();
    let notice = match params.get("done") {
        Some("unlocked") => Some("The lock was released."),
        Some("restored") => Some("The version was restored as the newest version."),
        _ => None,
    };
    let versions = found
        .versions
        .into_iter()
        .enumerate()
        .map(|(i, v)| VersionView {
            short: v.info.version.chars().take(10).collect(),
            serial: v
                .info
                .serial
                .map(|s| s.to_string())
                .unwrap_or_else(|| "–".into()),
            when: when(v.info.time),
            datetime: datetime(v.info.time),
            author: v.info.author,
            operation: v.info.operation,
            deleted: v.info.deleted,
            changes: v.changes,
            restorable: admin && !v.info.deleted && !(page == 0 && i == 0),
            version: v.info.version,
        })
        .collect();
    html(&StatePageView {
        user: caller.user.clone(),
        name: name.to_string(),
        branch: at.branch.to_string(),
        ref_param: params.get("ref").map(|_| at.branch.to_string()),
        ref_query: ref_query(params),
        notice,
        admin,
        // Only admins get a form, so only they need the token.
        token: if admin {
            form_token(app, caller)?
        } else {
            String::new()
        },
        lock: found.lock.as_ref().map(|held| LockView::of(held, now)),
        versions,
        page,
        per_page,
        more: found.more,
        resources: found.resources.map(|list| {
            list.into_iter()
                .map(|r| ResourceView {
                    address: r.address,
                    kind: r.kind,
                    mode: r.mode,
                })
                .collect()
        }),
    })
}

/// `?ref=<branch>` for the links of a page that was asked for a branch; empty otherwise.
fn ref_query(params: &Params) -> String {
    params.get("ref").map_or_else(String::new, |branch| {
        format!(
            "?ref={}",
            percent_encoding::utf8_percent_encode(branch, percent_encoding::NON_ALPHANUMERIC)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::age;

    #[test]
    fn ages_read_naturally() {
        assert_eq!(age(-5), "0 s");
        assert_eq!(age(59), "59 s");
        assert_eq!(age(61), "1 min");
        assert_eq!(age(3 * 3600 + 5 * 60), "3 h 5 min");
        assert_eq!(age(2 * 86400 + 4 * 3600), "2 d 4 h");
    }
}
