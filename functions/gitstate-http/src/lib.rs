//! The one HTTP router, served by Lambda, the local server and the tests alike: a route table
//! ([`router`]), one module per resource.
//!
//! Routes (`<name>` is the state's path in the repository):
//! - `/states/{*name}`: `GET|POST|PUT|DELETE|LOCK|UNLOCK`: read, write, remove, lock, unlock
//!   ([`states`]);
//! - `/locks/{*name}`: `GET` (current lock), `POST|LOCK`, `DELETE|UNLOCK` ([`locks`]);
//! - `/?type=git&repository=<url>&ref=<branch>&state=<name>`: the seed tool's address format,
//!   served as `/states/<name>`;
//! - `/history/{*name}`: `GET [?page=&per_page=]` (revisions, newest first), `GET ?at=<commit|serial>`
//!   (one revision's state), `POST ?restore=<commit|serial>` (admin: write it again on top)
//!   ([`history`]);
//! - `/states`: `GET` every state the caller may read, with its last change and lock; `/locks`:
//!   `GET` every lock the caller may read ([`list`]);
//! - `/ui`, `/ui/…`: the web console, its own routes ([`console`]);
//! - `/health`: `GET` (the only route without authentication);
//! - anything else: 400 (never 404, which Terraform reads as "no state").
//!
//! Every route takes `?ref=` to address another branch; writes take Terraform's `?ID=`.
//! Methods are matched by the handlers (Terraform's `LOCK` and `UNLOCK` are not standard), each
//! answering 405 with `Allow` to the others. Every other request needs the Basic credentials of a
//! user of the access policy.
//!
//! A request passes, outside in: [`log`]'s layer, which logs each outcome; [`guard`]'s layers,
//! which refuse cross-site writes from browsers and put the security headers on every answer;
//! [`request::decode_path_layer`], which decodes the path once before routing; the route table;
//! [`call::within_deadline`] (a 504 at the deadline); [`call::with_read_context`], which reads
//! the request's [`request::Target`] once and makes its read context (what the store's reads
//! for it may reuse), passed on explicitly by the extractors; then the handler, whose extractors
//! authenticate ([`call::Authenticated`]) before the target's faults are told. [`error`] is the
//! one place where errors become statuses; [`body`] reads what a request carries.

mod backend_block;
mod body;
mod call;
mod console;
mod error;
mod guard;
mod history;
mod list;
mod locks;
mod log;
mod request;
mod states;

use std::net::IpAddr;
use std::sync::Arc;

use axum::Router;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use bytes::Bytes;
use gitstate_core::auth::Access;
use gitstate_core::ports::StoreError;
use gitstate_core::service::{Backend, ServiceError};
use http::{Method, StatusCode, header};

pub use backend_block::write_backend_block;
pub use error::ApiError;
pub use history::BRANCH_HEADER;
pub use locks::{LOCK_AGE_HEADER, LOCK_CREATED_HEADER, LOCK_USER_HEADER};
pub use request::MAX_QUERY_BYTES;

use call::Authenticated;
use request::{Target, named, route};

/// The client's address, set by whatever serves the router when it knows it (Lambda: the
/// Function URL's source IP). The local server provides `ConnectInfo` instead.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub IpAddr);

/// The latest moment an answer can still reach the caller, set by whatever serves the router
/// when it knows one (Lambda: the invocation's deadline less a margin). The router answers 504 by
/// then at the latest, and by [`Limits::request_deadline`] in any case.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(pub std::time::Instant);

/// The scheme the client used, set by whatever serves the router on every request, replacing
/// any the client sent: `https` behind a TLS listener or a Lambda Function URL, `http` on a plain
/// listener. The console's origin check compares it with the scheme of `Origin`.
pub const SCHEME_HEADER: &str = "x-forwarded-proto";

/// Limits applied before a request reaches the service, and to what it answers.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_body_bytes: usize,
    /// Largest response payload the transport can carry (a buffered Function URL: 6 MB for the
    /// whole JSON envelope); `None` when responses are streamed or served directly.
    pub max_response_bytes: Option<usize>,
    /// Longest time one request may take, git and KMS calls included; then a 504.
    pub request_deadline: std::time::Duration,
}

/// Room in Lambda's JSON envelope for the status and headers around the body.
const ENVELOPE_OVERHEAD: usize = 2048;

/// Size of `body` inside Lambda's JSON envelope (one estimate, used both for what a read answers
/// and for what a write accepts): the body as a JSON string, escaped exactly as serde_json does
/// (quotes, backslash and `\b \f \n \r \t` take 2 bytes, other control characters 6), plus
/// [`ENVELOPE_OVERHEAD`].
fn envelope_size(body: &[u8]) -> usize {
    escaped_len(body) + ENVELOPE_OVERHEAD
}

/// Length of `body` (UTF-8) as a JSON string literal, quotes included.
fn escaped_len(body: &[u8]) -> usize {
    let escaped: usize = body
        .iter()
        .map(|b| match b {
            b'"' | b'\\' | 0x08 | 0x0c | b'\n' | b'\r' | b'\t' => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum();
    escaped + 2
}

impl Limits {
    fn check_response(&self, body: &[u8]) -> Result<(), ApiError> {
        match self.max_response_bytes {
            Some(limit) if envelope_size(body) > limit => Err(ApiError::ResponseTooLarge {
                size: envelope_size(body),
                limit,
            }),
            _ => Ok(()),
        }
    }
}

/// What every handler shares: the service, the access policy, the limits.
#[derive(Clone)]
struct App {
    backend: Arc<Backend>,
    access: Arc<Access>,
    limits: Limits,
}

/// Build the router over a backend and its access policy.
pub fn router(backend: Arc<Backend>, access: Arc<Access>, limits: Limits) -> Router {
    let app = App {
        backend,
        access,
        limits,
    };
    let table = Router::new();
    let table = named(table, route::STATE, any(states::serve));
    let table = named(table, route::LOCK, any(locks::serve));
    let table = named(table, route::HISTORY, any(history::serve));
    let routes = table
        .route(route::SEED, any(states::serve))
        .route(route::STATES, any(list::states))
        .route(route::LOCKS, any(list::locks))
        .route(route::HEALTH, any(health))
        .merge(console::routes())
        .fallback(no_route)
        .layer(axum::middleware::from_fn(call::with_read_context))
        .layer(axum::middleware::from_fn_with_state(
            limits,
            call::within_deadline,
        ))
        .with_state(app);
    // The path is decoded before the table routes it, so around it; served as a handler (not a
    // fallback service) so that axum sets `Content-Length` and empties `HEAD` answers after
    // the layers around it (an error page changes the body), as it does for any route.
    let decoded = tower::Layer::layer(
        &axum::middleware::from_fn(request::decode_path_layer),
        routes,
    );
    let decoded = move |request: axum::extract::Request| {
        let routes = decoded.clone();
        async move {
            match tower::ServiceExt::oneshot(routes, request).await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        }
    };
    Router::new()
        .fallback(decoded)
        .layer(axum::middleware::from_fn(guard::cross_site_writes))
        .layer(axum::middleware::from_fn(console::error_pages))
        .layer(axum::middleware::from_fn(console::front_door))
        .layer(axum::middleware::from_fn(guard::security_headers))
        .layer(axum::middleware::from_fn(log::outcomes))
}

fn now_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn to_json(value: &impl serde::Serialize) -> Result<Bytes, ApiError> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|e| ApiError::Service(ServiceError::Store(StoreError::Internal(Box::new(e)))))
}

fn json(status: StatusCode, body: Bytes) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn not_allowed(method: &Method, allowed: &'static str) -> ApiError {
    ApiError::Method {
        method: method.to_string(),
        allowed,
    }
}

/// `/health`: no credentials needed, but a well-formed address.
async fn health(_: Target, method: Method) -> Result<Response, ApiError> {
    match method {
        Method::GET | Method::HEAD => Ok((StatusCode::OK, "ok\n").into_response()),
        _ => Err(not_allowed(&method, "GET")),
    }
}

/// Any path the table does not know, once the caller is authenticated: 400, with the reason the
/// [`Target`] extractor gives (a bad query or path first, else [`ApiError::NoRoute`]).
async fn no_route(_: Authenticated, _: Target) -> ApiError {
    ApiError::NoRoute
}

#[cfg(test)]
mod api_tests;
#[cfg(test)]
mod tests;
