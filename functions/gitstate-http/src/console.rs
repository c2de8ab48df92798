//! The web console at `/ui/`: server-rendered pages over the same backend and Basic
//! authentication as the API. One handler per resource:
//!
//! - `GET /ui/`: the states the caller may read (`?q=` filters by name); a browser's `GET /`
//!   leads there ([`front_door`]);
//! - `GET /ui/states/<name>[?page=N][&view=compact]`: versions newest first with what each
//!   changed (or one row a version with counts), the current resources, the lock, the backend
//!   block;
//! - `GET /ui/download/<name>?at=<version|serial>`: one version's state, as a file to save;
//! - `POST /ui/unlock/<name>`, `POST /ui/restore/<name>`: admin actions, same-origin only, with
//!   the form token and a confirmation;
//! - `GET /ui/style.css`.
//!
//! Pages never show attribute or output values: only addresses, types, names and serials. Every
//! answer carries a strict Content-Security-Policy (from [`crate::guard`], errors and redirects
//! included); no page needs JavaScript. This module routes
//! and guards the forms; [`pages`] and [`state_page`] render.

mod download;
mod error_page;
mod pages;
mod state_page;

use askama::Template;
use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use gitstate_core::StateName;
use gitstate_core::access::Caller;
use gitstate_core::service::Selector;
use hmac::{Hmac, Mac};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use sha2::Sha256;

use crate::request::{Params, decode_path, read_body, state_name};
use crate::{ApiError, App, MAX_QUERY_BYTES, guard, not_allowed};

pub(crate) use error_page::for_browsers as error_pages;

/// Where the console lives.
pub const PREFIX: &str = "/ui";

const STYLE: &str = include_str!("../templates/style.css");

/// Whether `path` is the console's.
pub(crate) fn addresses(path: &str) -> bool {
    path == PREFIX || path.starts_with("/ui/")
}

/// The console's answer to one request by an authenticated caller.
pub(crate) async fn serve(
    app: &App,
    caller: &Caller,
    parts: &Parts,
    body: Body,
) -> Result<Response, ApiError> {
    let (method, uri) = (&parts.method, &parts.uri);
    let params = Params::of_query(uri)?;
    let path = decode_path(uri.path())?;
    let get = *method == Method::GET || *method == Method::HEAD;
    let only = |allowed: &'static str| Err(not_allowed(method, allowed));
    match path.as_str() {
        PREFIX => {
            return Ok(
                (StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, "/ui/")]).into_response(),
            );
        }
        "/ui/" if get => return pages::list(app, caller, &params).await,
        "/ui/style.css" if get => return Ok(style()),
        "/ui/" | "/ui/style.css" => return only("GET"),
        _ => {}
    }
    let state = |prefix: &str| path.strip_prefix(prefix).map(state_name).transpose();
    if let Some(name) = state("/ui/states/")? {
        if !get {
            return only("GET");
        }
        return match state_page::state(app, caller, &parts.headers, &name, &params).await {
            // A 404 only where a person reads it: to Terraform it would mean "no state".
            Err(error) if error.status() == StatusCode::NOT_FOUND && !browser(&parts.headers) => {
                Err(ApiError::ConsoleNotFound)
            }
            answer => answer,
        };
    }
    if let Some(name) = state("/ui/download/")? {
        if !get {
            return only("GET");
        }
        return download::version(app, caller, &name, &params).await;
    }
    for (prefix, action) in [
        ("/ui/unlock/", Action::Unlock),
        ("/ui/restore/", Action::Restore),
    ] {
        if let Some(name) = state(prefix)? {
            if *method != Method::POST {
                return only("POST");
            }
            return act(app, caller, &parts.headers, body, &name, action).await;
        }
    }
    if browser(&parts.headers) {
        return Err(ApiError::NoPage);
    }
    Err(ApiError::NoRoute)
}

/// `GET /` (no query) from a browser: to the console, before credentials are asked for. Every
/// other client keeps the router's answer, a 400 naming the routes: Terraform pointed at `/`
/// must read neither a state nor "no state", and is never sent to an HTML page it would follow.
pub(crate) async fn front_door(request: Request, next: Next) -> Response {
    let uri = request.uri();
    let bare = uri.path() == "/" && uri.query().is_none_or(str::is_empty);
    let get = matches!(*request.method(), Method::GET | Method::HEAD);
    if bare && get && browser(request.headers()) {
        return (
            StatusCode::SEE_OTHER,
            [(header::LOCATION, "/ui/"), (header::VARY, "Accept")],
        )
            .into_response();
    }
    next.run(request).await
}

/// Whether a request comes from a browser: it asks for HTML (Terraform, OpenTofu and other
/// API clients send no `Accept: text/html`).
pub(crate) fn browser(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/html"))
}

fn style() -> Response {
    let mut response = (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        STYLE,
    )
        .into_response();
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, max-age=3600"),
    );
    response
}

fn html(page: &impl Template) -> Result<Response, ApiError> {
    let text = page.render().map_err(ApiError::Render)?;
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        text,
    )
        .into_response())
}

/// The form token of a caller: an HMAC of the user name keyed by the user's stored argon2 hash,
/// which never leaves the server. A cross-site page cannot know it, a leaked page does not let
/// anyone test password guesses at HMAC speed; every Lambda container and every restart computes
/// the same one; it changes with the password.
pub(crate) fn form_token(app: &App, caller: &Caller) -> Result<String, ApiError> {
    let phc = app
        .access
        .stored_hash(&caller.user)
        .ok_or(ApiError::FormToken)?;
    Ok(token_for(phc.expose(), &caller.user))
}

fn token_for(phc: &str, user: &str) -> String {
    // HMAC accepts keys of any length; this cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(phc.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
    mac.update(b"gitstate console form\0");
    mac.update(user.as_bytes());
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
}

/// Refuse anything but a post from the console's own pages: one a browser marks as coming from
/// another site, the user's own action, or that names no origin at all.
fn same_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    match guard::site(headers) {
        guard::Site::SameOrigin => Ok(()),
        _ => Err(ApiError::CrossSite),
    }
}

#[derive(Clone, Copy)]
enum Action {
    Unlock,
    Restore,
}

async fn act(
    app: &App,
    caller: &Caller,
    headers: &HeaderMap,
    body: Body,
    name: &StateName,
    action: Action,
) -> Result<Response, ApiError> {
    same_origin(headers)?;
    let body: Bytes = read_body(headers, body, MAX_QUERY_BYTES).await?;
    let form = Params::parse(&body)?;
    let expected = form_token(app, caller)?;
    let sent = form.get("token").unwrap_or_default();
    // Compared in constant time.
    let matches = sent.len() == expected.len()
        && sent
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if !matches {
        return Err(ApiError::FormToken);
    }
    if form.get("confirm") != Some("yes") {
        return Err(ApiError::Unconfirmed);
    }
    let backend = &app.backend;
    // A page shown for another branch (`?ref=`) sends it back with its form.
    let branch = form.get("ref").filter(|b| !b.is_empty());
    let at = backend.locate(None, branch)?;
    let done = match action {
        Action::Unlock => {
            // Release the very lock the page showed: if it changed meanwhile, 409.
            let id = form
                .get("lock")
                .filter(|id| !id.is_empty())
                .ok_or_else(|| ApiError::Query("the form names no lock".into()))?;
            let info = serde_json::json!({ "ID": id }).to_string();
            backend.unlock(caller, &at, name, info.as_bytes()).await?;
            "unlocked"
        }
        Action::Restore => {
            let version = form
                .get("version")
                .ok_or_else(|| ApiError::Query("the form names no version".into()))?;
            backend
                .restore(caller, &at, name, &Selector::parse(version)?)
                .await?;
            "restored"
        }
    };
    let location = match branch {
        Some(branch) => format!(
            "/ui/states/{name}?done={done}&ref={}",
            percent_encoding::utf8_percent_encode(branch, percent_encoding::NON_ALPHANUMERIC)
        ),
        None => format!("/ui/states/{name}?done={done}"),
    };
    Ok((StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response())
}

#[cfg(test)]
mod page_tests;
#[cfg(test)]
mod tests;
