//! One state's page: its lock, its versions (as cards with what each changed, or compact, one
//! row a version with counts), its current resources and the backend block that points
//! Terraform at it.

use std::collections::HashMap;

use askama::Template;
use axum::response::Response;
use gitstate_core::access::{Caller, Role};
use gitstate_core::changes::Changes;
use gitstate_core::service::{MAX_PAGE, StatePage, VersionChanges};
use gitstate_core::{ReadContext, StateName};
use http::{HeaderMap, header};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

use super::pages::{LockView, Operation, datetime, ref_query, when};
use super::{form_token, html};
use crate::request::Params;
use crate::{ApiError, App, SCHEME_HEADER, backend_block, now_seconds};

/// Versions on one page of a state (`?per_page=` up to 100).
const PER_PAGE: usize = 20;

/// Characters of a version ID shown (the whole ID is the element's title).
const SHORT: usize = 10;

/// How versions are listed: `?view=compact` for one row a version, cards otherwise.
#[derive(Clone, Copy, PartialEq, Eq)]
enum View {
    Cards,
    Compact,
}

impl View {
    fn of(params: &Params) -> Result<Self, ApiError> {
        match params.get("view") {
            None | Some("cards") => Ok(Self::Cards),
            Some("compact") => Ok(Self::Compact),
            Some(other) => Err(ApiError::Query(format!(
                "view {:?}: it is \"cards\" or \"compact\"",
                other.chars().take(40).collect::<String>()
            ))),
        }
    }
}

/// The version a restore wrote again.
struct RestoredView {
    version: String,
    short: String,
    /// Its serial, when it is listed on the same page.
    serial: Option<String>,
}

struct VersionView {
    version: String,
    short: String,
    serial: String,
    when: String,
    datetime: String,
    author: String,
    operation: Operation,
    restored: Option<RestoredView>,
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
    compact: bool,
    versions: Vec<VersionView>,
    page: usize,
    per_page: usize,
    more: bool,
    resources: Option<Vec<ResourceView>>,
    backend_block: String,
}

impl StatePageView {
    /// The query of a link to this page of versions shown the other way.
    fn view_link(&self, compact: bool) -> String {
        self.link(self.page, compact)
    }

    /// The query of a link to another page of versions shown the same way.
    fn page_link(&self, page: usize) -> String {
        self.link(page, self.compact)
    }

    fn link(&self, page: usize, compact: bool) -> String {
        let mut query = format!("?page={page}&per_page={}", self.per_page);
        if compact {
            query.push_str("&view=compact");
        }
        query.push_str(&self.ref_suffix());
        query
    }

    /// `&ref=<branch>` when the page shows a branch it was asked for; empty otherwise.
    fn ref_suffix(&self) -> String {
        self.ref_param.as_ref().map_or_else(String::new, |branch| {
            format!("&ref={}", utf8_percent_encode(branch, NON_ALPHANUMERIC))
        })
    }
}

fn number(params: &Params, key: &str, default: usize, what: &str) -> Result<usize, ApiError> {
    match params.get(key) {
        None => Ok(default),
        Some(text) => text
            .parse::<usize>()
            .map_err(|_| ApiError::Query(format!("{text:?} is not {what}"))),
    }
}

pub(super) async fn state(
    app: &App,
    caller: &Caller,
    read: &ReadContext,
    headers: &HeaderMap,
    name: &StateName,
    params: &Params,
) -> Result<Response, ApiError> {
    let at = app.backend.locate(None, params.get("ref"))?;
    let page = number(params, "page", 0, "a page number")?;
    let per_page = number(params, "per_page", PER_PAGE, "a number of versions")?.clamp(1, MAX_PAGE);
    let view = View::of(params)?;
    let found: StatePage = app
        .backend
        .state_page(caller, &at, name, page, per_page, read)
        .await?;
    let admin = caller.may(Role::Admin, name);
    let notice = match params.get("done") {
        Some("unlocked") => Some("The lock was released."),
        Some("restored") => Some("The version was restored as the newest version."),
        _ => None,
    };
    let ref_param = params.get("ref").map(|_| at.branch.to_string());
    html(&StatePageView {
        user: caller.user.clone(),
        name: name.to_string(),
        backend_block: backend_block(headers, name, ref_param.as_deref()),
        branch: at.branch.to_string(),
        ref_param,
        ref_query: ref_query(params),
        notice,
        admin,
        // Only admins get a form, so only they need the token.
        token: if admin {
            form_token(app, caller)?
        } else {
            String::new()
        },
        lock: found
            .lock
            .as_ref()
            .map(|held| LockView::of(held, now_seconds())),
        compact: view == View::Compact,
        versions: versions(found.versions, admin, page),
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

/// The versions of one page as shown: the newest of the first page is never offered for
/// restore (it is the current state).
fn versions(found: Vec<VersionChanges>, admin: bool, page: usize) -> Vec<VersionView> {
    let serials: HashMap<String, Option<u64>> = found
        .iter()
        .map(|v| (v.info.version.clone(), v.info.serial))
        .collect();
    found
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let info = v.info;
            let restored = info.restored_from.map(|from| RestoredView {
                short: from.chars().take(SHORT).collect(),
                serial: serials.get(&from).copied().flatten().map(|s| s.to_string()),
                version: from,
            });
            VersionView {
                short: info.version.chars().take(SHORT).collect(),
                serial: info.serial.map_or_else(|| "–".into(), |s| s.to_string()),
                when: when(info.time),
                datetime: datetime(info.time),
                operation: Operation::of(&info.operation),
                restored,
                deleted: info.deleted,
                changes: v.changes,
                restorable: admin && !info.deleted && !(page == 0 && i == 0),
                author: info.author,
                version: info.version,
            }
        })
        .collect()
}

/// The `backend "http"` block for this state at the address the browser used: the scheme
/// whatever serves the router set, the `Host` the browser sent; `?ref=` when the page shows
/// another branch than the default, so that the block never points at another state.
fn backend_block(headers: &HeaderMap, name: &StateName, branch: Option<&str>) -> String {
    let scheme = match headers.get(SCHEME_HEADER).and_then(|v| v.to_str().ok()) {
        Some(proto) if proto.eq_ignore_ascii_case("https") => "https",
        _ => "http",
    };
    // Only what a host and port are made of, so the block stays valid HCL whatever was sent.
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .unwrap_or("localhost");
    backend_block::backend_block(&format!("{scheme}://{host}"), name.as_str(), branch)
}
