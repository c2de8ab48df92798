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
//! included); no page needs JavaScript. This module routes (its part of the router's table)
//! and guards the forms; [`pages`] and [`state_page`] render.

mod download;
mod error_page;
mod pages;
mod state_page;

use askama::Template;
use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use bytes::Bytes;
use gitstate_core::access::Caller;
use gitstate_core::service::Selector;
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use sha2::Sha256;

use crate::body::read_body;
use crate::call::{Authenticated, Read, read_context};
use crate::request::{Params, Target, named, route};
use crate::{ApiError, App, MAX_QUERY_BYTES, guard, not_allowed};

pub(crate) use error_page::for_browsers as error_pages;

/// Where the console lives.
pub const PREFIX: &str = route::CONSOLE;

const STYLE: &str = include_str!("../templates/style.css");

/// The console's routes, each needing the caller's credentials; a path under `/ui/` that is
/// none of them is [`no_page`]. A route named by the rest of the path is added with
/// [`named`] and its prefix listed in [`route::CONSOLE_NAMED`].
pub(crate) fn routes() -> Router<App> {
    let [states, downloads, unlocks, restores] = route::CONSOLE_NAMED;
    let table = Router::new()
        .route(PREFIX, any(redirect))
        .route("/ui/", any(list))
        .route("/ui/style.css", any(style_sheet))
        .route("/ui/{*rest}", any(no_page));
    let table = named(table, states, any(state));
    let table = named(table, downloads, any(download));
    let table = named(table, unlocks, any(unlock));
    named(table, restores, any(restore))
}

fn get(method: &Method) -> bool {
    *method == Method::GET || *method == Method::HEAD
}

/// `/ui`: to `/ui/`.
async fn redirect(_: Authenticated, _: Target) -> Response {
    (StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, "/ui/")]).into_response()
}

async fn list(
    State(app): State<App>,
    Authenticated(caller): Authenticated,
    Read(read): Read,
    target: Target,
    method: Method,
) -> Result<Response, ApiError> {
    if !get(&method) {
        return Err(not_allowed(&method, "GET"));
    }
    pages::list(&app, &caller, &read, target.params()).await
}

async fn style_sheet(_: Authenticated, _: Target, method: Method) -> Result<Response, ApiError> {
    if !get(&method) {
        return Err(not_allowed(&method, "GET"));
    }
    Ok(style())
}

async fn state(
    State(app): State<App>,
    Authenticated(caller): Authenticated,
    Read(read): Read,
    target: Target,
    method: Method,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let name = target.name.as_ref().ok_or(ApiError::NoRoute)?;
    if !get(&method) {
        return Err(not_allowed(&method, "GET"));
    }
    match state_page::state(&app, &caller, &read, &headers, name, target.params()).await {
        // A 404 only where a person reads it: to Terraform it would mean "no state".
        Err(error) if error.status() == StatusCode::NOT_FOUND && !browser(&headers) => {
            Err(ApiError::ConsoleNotFound)
        }
        answer => answer,
    }
}

/// One version's state as a file to save.
async fn download(
    State(app): State<App>,
    Authenticated(caller): Authenticated,
    target: Target,
    method: Method,
) -> Result<Response, ApiError> {
    let name = target.name.as_ref().ok_or(ApiError::NoRoute)?;
    if !get(&method) {
        return Err(not_allowed(&method, "GET"));
    }
    download::version(&app, &caller, name, target.params()).await
}

async fn unlock(
    State(app): State<App>,
    Authenticated(caller): Authenticated,
    target: Target,
    request: Request,
) -> Result<Response, ApiError> {
    act(&app, &caller, target, request, Action::Unlock).await
}

async fn restore(
    State(app): State<App>,
    Authenticated(caller): Authenticated,
    target: Target,
    request: Request,
) -> Result<Response, ApiError> {
    act(&app, &caller, target, request, Action::Restore).await
}

/// Any other path under `/ui/`: a page that is not there for a browser, no route for others.
async fn no_page(_: Authenticated, _: Target, headers: HeaderMap) -> ApiError {
    if browser(&headers) {
        ApiError::NoPage
    } else {
        ApiError::NoRoute
    }
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

/// An admin's form, posted from a console page.
async fn act(
    app: &App,
    caller: &Caller,
    target: Target,
    request: Request,
    action: Action,
) -> Result<Response, ApiError> {
    let name = target.name.as_ref().ok_or(ApiError::NoRoute)?;
    if *request.method() != Method::POST {
        return Err(not_allowed(request.method(), "POST"));
    }
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    same_origin(headers)?;
    let read = read_context(&parts);
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
                .restore(caller, &at, name, &Selector::parse(version)?, &read)
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
