//! The one HTTP router, served by Lambda, the local server and the tests alike.
//!
//! Routes (`<name>` is the state's path in the repository), one module per resource:
//! - `GET|POST|PUT|DELETE|LOCK|UNLOCK /states/<name>`: read, write, remove, lock, unlock
//!   ([`states`]);
//! - `GET /locks/<name>` (current lock), `POST|LOCK /locks/<name>`, `DELETE|UNLOCK /locks/<name>`
//!   ([`locks`]);
//! - `/?type=git&repository=<url>&ref=<branch>&state=<name>`: the seed tool's address format;
//! - `GET /history/<name>[?page=&per_page=]` (revisions, newest first), `GET
//!   /history/<name>?at=<commit|serial>` (one revision's state), `POST
//!   /history/<name>?restore=<commit|serial>` (admin: write it again on top) ([`history`]);
//! - `GET /states`: every state the caller may read, with its last change and lock; `GET
//!   /locks`: every lock the caller may read ([`list`]);
//! - `/ui/…`: the web console ([`console`]);
//! - `GET /health` (the only route without authentication).
//!
//! Every route takes `?ref=` to address another branch; writes take Terraform's `?ID=`.
//! Every other request needs the Basic credentials of a user of the access policy.
//!
//! [`request`] reads what a request addresses and carries; [`error`] is the one place where
//! errors become statuses; [`log`] logs each outcome in a layer around the router; [`guard`]'s
//! layers refuse cross-site writes from browsers and put the security headers on every answer.

mod backend_block;
mod console;
mod error;
mod guard;
mod history;
mod list;
mod locks;
mod log;
mod request;
mod states;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use gitstate_core::StateName;
use gitstate_core::access::Caller;
use gitstate_core::auth::Access;
use gitstate_core::ports::{Location, StoreError};
use gitstate_core::scope::Scope;
use gitstate_core::service::{Backend, ServiceError};
use http::request::Parts;
use http::{HeaderValue, Method, StatusCode, header};

pub use backend_block::write_backend_block;
pub use error::ApiError;
pub use history::BRANCH_HEADER;
pub use locks::{LOCK_AGE_HEADER, LOCK_CREATED_HEADER, LOCK_USER_HEADER};
pub use request::MAX_QUERY_BYTES;

use request::{Addressed, Resource};

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
    Router::new()
        .fallback(handle)
        .with_state(App {
            backend,
            access,
            limits,
        })
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

/// Every request: within its deadline, or a 504.
async fn handle(State(app): State<App>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let started = tokio::time::Instant::now();
    let mut due = started + app.limits.request_deadline;
    if let Some(Deadline(at)) = parts.extensions.get::<Deadline>() {
        due = due.min(tokio::time::Instant::from_std(*at));
    }
    // Every operation is safe to cut short: a push lands whole or not at all, and a retried LOCK
    // with the same ID, write of the same bytes or UNLOCK of a released lock succeeds.
    match tokio::time::timeout_at(due, dispatch(&app, &parts, body)).await {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => error.into_response(),
        Err(_) => ApiError::Deadline {
            seconds: due.duration_since(started).as_secs_f64(),
        }
        .into_response(),
    }
}

fn client_address(parts: &Parts) -> Option<IpAddr> {
    parts
        .extensions
        .get::<ClientAddr>()
        .map(|c| c.0)
        .or_else(|| {
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0.ip())
        })
}

/// [`route`] within the request's [`Scope`]: when it began, and the state it reads when it is a
/// `GET` of a state at the configured location with credentials (its blob may then come with the
/// access file's, see `gitstate_core::scope`).
async fn dispatch(app: &App, parts: &Parts, body: Body) -> Result<Response, ApiError> {
    let reads = match request::parse_target(&parts.uri) {
        Ok(Addressed {
            resource: Resource::State(name),
            repository: None,
            branch: None,
            ..
        }) if parts.method == Method::GET && parts.headers.contains_key(header::AUTHORIZATION) => {
            Some(name)
        }
        _ => None,
    };
    let scope = Scope {
        began: std::time::Instant::now(),
        reads,
    };
    scope.run(route(app, parts, body)).await
}

/// Authenticate, then hand the request to the handler of the resource it addresses.
async fn route(app: &App, parts: &Parts, body: Body) -> Result<Response, ApiError> {
    let (method, uri, headers) = (&parts.method, &parts.uri, &parts.headers);
    if uri.path() == "/health" {
        // Read like any address, so that a malformed query is refused here too.
        request::parse_target(uri)?;
        return health(method);
    }
    let authorization = headers
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    let caller = app
        .access
        .authenticate(authorization, client_address(parts))
        .await?;
    if console::addresses(uri.path()) {
        return console::serve(app, &caller, parts, body).await;
    }
    let Addressed {
        resource,
        repository,
        branch,
        query,
    } = request::parse_target(uri)?;
    let locate = || app.backend.locate(repository.as_deref(), branch.as_deref());
    let (name, handler) = match resource {
        Resource::StateList => return list::states(app, &caller, method, locate).await,
        Resource::LockList => return list::locks(app, &caller, method, locate).await,
        // `/health` spelt with percent-escapes: still the health check, now authenticated.
        Resource::Health => return health(method),
        Resource::State(name) => (name, Handler::State),
        Resource::Lock(name) => (name, Handler::Lock),
        Resource::History(name) => (name, Handler::History),
    };
    let at = locate()?;
    let body = request::write_body(method, headers, body, app.limits.max_body_bytes).await?;
    let call = Call {
        app,
        caller: &caller,
        at: &at,
        name: &name,
        query: &query,
    };
    match handler {
        Handler::State => states::serve(call, method, body).await,
        Handler::Lock => locks::serve(call, method, body).await,
        Handler::History => history::serve(call, method).await,
    }
}

/// A request to a resource of one state, authenticated and located.
#[derive(Clone, Copy)]
struct Call<'a> {
    app: &'a App,
    caller: &'a Caller,
    at: &'a Location,
    name: &'a StateName,
    query: &'a request::Query,
}

/// The handlers of the resources that address one state.
enum Handler {
    State,
    Lock,
    History,
}

fn health(method: &Method) -> Result<Response, ApiError> {
    match *method {
        Method::GET | Method::HEAD => Ok((StatusCode::OK, "ok\n").into_response()),
        _ => Err(not_allowed(method, "GET")),
    }
}

#[cfg(test)]
mod api_tests;
#[cfg(test)]
mod tests;
