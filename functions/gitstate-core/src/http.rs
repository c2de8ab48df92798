//! The one HTTP router, served by Lambda, the local server and the tests alike.
//!
//! Routes (`<name>` is the state's path in the repository):
//! - `GET|POST|PUT|DELETE|LOCK|UNLOCK /states/<name>`: read, write, remove, lock, unlock;
//! - `GET /locks/<name>` (current lock), `POST|LOCK /locks/<name>`, `DELETE|UNLOCK /locks/<name>`;
//! - `/?type=git&repository=<url>&ref=<branch>&state=<name>`: the seed tool's address format;
//! - `GET /history/<name>[?page=&per_page=]` (revisions, newest first), `GET
//!   /history/<name>?at=<commit|serial>` (one revision's state), `POST
//!   /history/<name>?restore=<commit|serial>` (admin: write it again on top);
//! - `GET /states`: every state the caller may read, with its last change and lock;
//! - `GET /locks`: every lock the caller may read;
//! - `/ui/…`: the web console ([`console`]);
//! - `GET /health` (the only route without authentication).
//!
//! Every route takes `?ref=` to address another branch; writes take Terraform's `?ID=`.
//! Every other request needs the Basic credentials of a user of the access policy.

mod console;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::auth::{Access, AuthError};
use crate::ports::{SealError, StoreError};
use crate::service::{Backend, Selector, ServiceError};
use crate::{LockInfo, StateName};

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

/// Headers of `GET /locks/<name>` that describe the lock beyond Terraform's LockInfo.
pub const LOCK_USER_HEADER: &str = "gitstate-lock-user";
pub const LOCK_CREATED_HEADER: &str = "gitstate-lock-created";
pub const LOCK_AGE_HEADER: &str = "gitstate-lock-age";

fn now_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// A lock as `GET /locks` lists it.
#[derive(Debug, serde::Serialize)]
struct ListedLock<'a> {
    state: &'a str,
    id: &'a str,
    who: &'a str,
    operation: &'a str,
    user: Option<&'a str>,
    created: Option<i64>,
    age_seconds: Option<i64>,
}

/// A state as `GET /states` lists it.
#[derive(Debug, serde::Serialize)]
struct ListedState<'a> {
    state: &'a str,
    serial: Option<u64>,
    lineage: Option<&'a str>,
    /// When it last changed (Unix seconds), by whom and how; absent for a lock on a state not
    /// written yet.
    updated: Option<i64>,
    author: Option<&'a str>,
    operation: Option<&'a str>,
    lock: Option<ListedLock<'a>>,
}

fn listed_lock<'a>(
    name: &'a StateName,
    held: &'a crate::ports::HeldLock,
    now: i64,
) -> ListedLock<'a> {
    ListedLock {
        state: name.as_str(),
        id: held.info.id(),
        who: held.info.who(),
        operation: held.info.operation(),
        user: held.owner.as_deref(),
        created: held.created,
        age_seconds: held.created.map(|c| now.saturating_sub(c).max(0)),
    }
}

#[derive(Debug, serde::Serialize)]
struct HistoryAnswer<'a> {
    state: &'a str,
    page: usize,
    versions: Vec<crate::service::VersionInfo>,
    next_page: Option<usize>,
}

/// Longest query string accepted.
pub const MAX_QUERY_BYTES: usize = 4096;

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

/// Size of `body` inside Lambda's JSON response envelope: quotes and backslashes are escaped,
/// control characters become `\uXXXX`, plus room for the status and headers.
fn envelope_size(body: &[u8]) -> usize {
    let escapes: usize = body
        .iter()
        .map(|b| match b {
            b'"' | b'\\' => 1,
            0..=0x1f => 5,
            _ => 0,
        })
        .sum();
    body.len() + escapes + 2048
}

#[derive(Clone)]
struct App {
    backend: Arc<Backend>,
    access: Arc<Access>,
    limits: Limits,
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

/// Build the router over a backend and its access policy.
pub fn router(backend: Arc<Backend>, access: Arc<Access>, limits: Limits) -> Router {
    Router::new().fallback(handle).with_state(App {
        backend,
        access,
        limits,
    })
}

/// Errors of the HTTP layer, and the only place where statuses are chosen.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Service(#[from] ServiceError),
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error("no such route: use /states/<name>, /locks/<name> or /?type=git&repository=…&state=…")]
    NoRoute,
    #[error("method {method} is not allowed here (allowed: {allowed})")]
    Method {
        method: String,
        allowed: &'static str,
    },
    #[error("request body is larger than the limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("could not read the request body")]
    BodyRead,
    #[error("Content-MD5 {0}")]
    ContentMd5(&'static str),
    #[error("unsupported content type {0:?}: send application/json")]
    MediaType(String),
    #[error("bad query: {0}")]
    Query(String),
    #[error("query string is longer than {MAX_QUERY_BYTES} bytes")]
    QueryTooLong,
    #[error("the request did not finish within {seconds:.1} s")]
    Deadline { seconds: f64 },
    #[error("cross-site request refused: the console's forms are accepted from its own pages only")]
    CrossSite,
    #[error("the form token is missing or wrong: reload the page and try again")]
    FormToken,
    #[error("not confirmed: tick the confirmation box")]
    Unconfirmed,
    #[error("a page could not be rendered")]
    Render(#[source] askama::Error),
    #[error(
        "the state needs {size} bytes in a buffered Function URL response, over its limit of {limit}: deploy with InvokeMode RESPONSE_STREAM and GITSTATE_RESPONSE_STREAMING=true to read it"
    )]
    ResponseTooLarge { size: usize, limit: usize },
}

impl ApiError {
    fn status(&self) -> StatusCode {
        use ServiceError as S;
        match self {
            Self::Service(S::Name(_) | S::Branch(_) | S::LockBody(_) | S::InvalidState(_)) => {
                StatusCode::BAD_REQUEST
            }
            Self::Service(S::RepositoryNotAllowed(_) | S::RefNotAllowed(_) | S::Forbidden(_)) => {
                StatusCode::FORBIDDEN
            }
            Self::Auth(AuthError::Unauthenticated) => StatusCode::UNAUTHORIZED,
            Self::Auth(AuthError::Throttled { .. }) => StatusCode::TOO_MANY_REQUESTS,
            Self::Auth(AuthError::Unavailable(_)) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Service(S::Exists | S::Clash(_)) => StatusCode::CONFLICT,
            Self::Service(S::NoSuchVersion(_)) => StatusCode::NOT_FOUND,
            Self::Service(S::BadSelector(_)) => StatusCode::BAD_REQUEST,
            Self::Service(S::Locked(_)) => StatusCode::LOCKED,
            Self::Service(S::LockMismatch(_) | S::NotLocked { .. } | S::Stale { .. }) => {
                StatusCode::CONFLICT
            }
            Self::Service(S::NotFound | S::NoLock) | Self::NoRoute => StatusCode::NOT_FOUND,
            Self::Service(S::Store(StoreError::Unavailable(_) | StoreError::Contention { .. })) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Service(S::Store(StoreError::Remote(_) | StoreError::Incompatible(_))) => {
                StatusCode::BAD_GATEWAY
            }
            Self::Service(S::Store(StoreError::Corrupt(_) | StoreError::Internal(_))) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            // Encryption at rest: KMS down is retryable, KMS refusing is the gateway's fault,
            // a tampered or unreadable state is ours; none is the client's.
            Self::Service(S::Seal(SealError::Unavailable(_))) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Service(S::Seal(SealError::Refused(_))) => StatusCode::BAD_GATEWAY,
            Self::Service(
                S::Seal(SealError::Integrity(_) | SealError::Unreadable(_)) | S::NoKeys,
            ) => StatusCode::INTERNAL_SERVER_ERROR,
            // Sealed under a key the deployment lacks: never unwrapped, ours to fix (rekey or
            // GITSTATE_KMS_PREVIOUS_KEY_IDS), not the gateway's.
            Self::Service(S::Seal(SealError::ForeignKey(_))) => StatusCode::INTERNAL_SERVER_ERROR,
            // The operator must rekey; the message says so.
            Self::Service(S::Unprotected { .. }) => StatusCode::CONFLICT,
            Self::Method { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::TooLarge { .. } | Self::ResponseTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyRead | Self::Query(_) | Self::ContentMd5(_) => StatusCode::BAD_REQUEST,
            Self::MediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::QueryTooLong => StatusCode::URI_TOO_LONG,
            Self::Deadline { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::CrossSite | Self::FormToken => StatusCode::FORBIDDEN,
            Self::Unconfirmed => StatusCode::BAD_REQUEST,
            Self::Render(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        match &self {
            // Terraform reads the holder's LockInfo from the body of a 423 or 409.
            Self::Service(ServiceError::Locked(held) | ServiceError::LockMismatch(held)) => {
                tracing::info!(status = status.as_u16(), "{self}");
                return json(status, held.info.as_bytes().clone());
            }
            _ if status.is_server_error() => {
                tracing::error!(status = status.as_u16(), error = %chain(&self))
            }
            _ => tracing::info!(status = status.as_u16(), "{self}"),
        }
        let reason = match &self {
            // 5xx bodies say what to do, never what broke inside.
            Self::Service(ServiceError::Store(
                StoreError::Unavailable(_) | StoreError::Contention { .. },
            )) => "the git remote is busy or unreachable; retry".to_owned(),
            Self::Service(ServiceError::Store(StoreError::Remote(_))) => {
                "the git remote refused or garbled the request; see the backend's log".to_owned()
            }
            Self::Service(ServiceError::Store(incompatible @ StoreError::Incompatible(_))) => {
                incompatible.to_string()
            }
            Self::Service(ServiceError::Store(_)) | Self::Render(_) => {
                "internal error; see the backend's log".to_owned()
            }
            Self::Auth(AuthError::Unavailable(_)) => {
                "the access policy could not be read from the git remote; retry".to_owned()
            }
            Self::Service(ServiceError::Seal(SealError::Unavailable(_))) => {
                "the key service (KMS) is unavailable; retry".to_owned()
            }
            Self::Service(ServiceError::Seal(_) | ServiceError::NoKeys) => {
                "the state could not be decrypted or encrypted; see the backend's log".to_owned()
            }
            Self::Deadline { seconds } => format!(
                "the git remote or the key service did not answer within {seconds:.0} s; retrying is safe"
            ),
            other => other.to_string(),
        };
        let mut response = (status, format!("{}\n", one_line(&reason))).into_response();
        if let Self::Method { allowed, .. } = self {
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allowed));
        }
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"gitstate\", charset=\"UTF-8\""),
            );
        }
        if let Self::Auth(AuthError::Throttled { retry_after }) = self {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(crate::auth::retry_after_secs(retry_after)),
            );
        } else if matches!(
            status,
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
        ) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// The error and all its sources, for the log.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

fn to_json(value: &impl serde::Serialize) -> Result<Bytes, ApiError> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|e| ApiError::Service(ServiceError::Store(StoreError::Internal(Box::new(e)))))
}

fn json(status: StatusCode, body: Bytes) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// What a request addresses, decoded from its path and query.
enum Resource {
    State,
    StateList,
    Lock,
    History,
    LockList,
    Health,
}

struct Addressed {
    resource: Resource,
    name: Option<StateName>,
    repository: Option<String>,
    branch: Option<String>,
    lock_id: Option<String>,
    page: Option<String>,
    per_page: Option<String>,
    at: Option<String>,
    restore: Option<String>,
}

fn parse_target(uri: &Uri) -> Result<Addressed, ApiError> {
    let query = uri.query().unwrap_or_default();
    if query.len() > MAX_QUERY_BYTES {
        return Err(ApiError::QueryTooLong);
    }
    let mut params: Vec<(String, String)> = Vec::new();
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        if params.iter().any(|(k, _)| *k == key) {
            return Err(ApiError::Query(format!("parameter {key:?} is given twice")));
        }
        params.push((key.into_owned(), value.into_owned()));
    }
    let take = |key: &str| {
        params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    let path = percent_decode(uri.path())?;
    let (resource, name) = if path == "/" {
        match take("type").as_deref() {
            Some("git") => {}
            Some(other) => {
                return Err(ApiError::Query(format!(
                    "type {other:?} is not supported (only type=git)"
                )));
            }
            None => return Err(ApiError::NoRoute),
        }
        if take("repository").is_none() {
            return Err(ApiError::Query(
                "the seed address format needs repository=<url>".into(),
            ));
        }
        let state = take("state")
            .ok_or_else(|| ApiError::Query("the seed address format needs state=<path>".into()))?;
        (
            Resource::State,
            Some(StateName::parse(&state).map_err(ServiceError::from)?),
        )
    } else if let Some(name) = path.strip_prefix("/states/") {
        (
            Resource::State,
            Some(StateName::parse(name).map_err(ServiceError::from)?),
        )
    } else if let Some(name) = path.strip_prefix("/locks/") {
        (
            Resource::Lock,
            Some(StateName::parse(name).map_err(ServiceError::from)?),
        )
    } else if let Some(name) = path.strip_prefix("/history/") {
        (
            Resource::History,
            Some(StateName::parse(name).map_err(ServiceError::from)?),
        )
    } else if path == "/states" || path == "/states/" {
        (Resource::StateList, None)
    } else if path == "/locks" || path == "/locks/" {
        (Resource::LockList, None)
    } else if path == "/health" {
        (Resource::Health, None)
    } else {
        return Err(ApiError::NoRoute);
    };
    let repository = take("repository");
    if let Some(reason) = repository
        .as_deref()
        .and_then(crate::secret::credentials_in_url)
    {
        return Err(ApiError::Query(format!("repository=: {reason}")));
    }
    Ok(Addressed {
        resource,
        name,
        repository,
        branch: take("ref"),
        lock_id: take("ID"),
        page: take("page"),
        per_page: take("per_page"),
        at: take("at"),
        restore: take("restore"),
    })
}

fn percent_decode(path: &str) -> Result<String, ApiError> {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok());
            let byte = hex
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| ApiError::Query("bad percent-encoding in the path".into()))?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ApiError::Query("the path is not UTF-8".into()))
}

async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(ApiError::TooLarge { limit });
    }
    // One buffer of the declared size, filled frame by frame: collecting the frames first and
    // joining them after would hold every large state twice.
    let declared = declared.and_then(|d| usize::try_from(d).ok()).unwrap_or(0);
    let mut buffer = Vec::with_capacity(declared.min(limit));
    let mut body = Limited::new(body, limit);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            if e.downcast_ref::<LengthLimitError>().is_some() {
                ApiError::TooLarge { limit }
            } else {
                ApiError::BodyRead
            }
        })?;
        if let Ok(data) = frame.into_data() {
            buffer.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(buffer))
}

/// RFC 1864: when a request carries `Content-MD5` (Terraform sends it with every body), it must
/// be the base64 of the body's MD5, or the request changes nothing.
fn check_content_md5(headers: &HeaderMap, body: &[u8]) -> Result<(), ApiError> {
    use base64::Engine;
    use md5::Digest;
    let mut values = headers.get_all("content-md5").iter();
    let Some(value) = values.next() else {
        return Ok(());
    };
    if values.next().is_some() {
        return Err(ApiError::ContentMd5("is given twice"));
    }
    let sent = base64::engine::general_purpose::STANDARD
        .decode(value.as_bytes().trim_ascii())
        .ok()
        .filter(|digest| digest.len() == 16)
        .ok_or(ApiError::ContentMd5(
            "is not the base64 of a 16-byte MD5 digest",
        ))?;
    if sent.as_slice() != md5::Md5::digest(body).as_slice() {
        return Err(ApiError::ContentMd5(
            "does not match the body (corrupted in transit?)",
        ));
    }
    Ok(())
}

fn check_media_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let text = value
        .to_str()
        .map_err(|_| ApiError::MediaType("<not ASCII>".into()))?;
    let essence = text
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json" || essence.is_empty() {
        Ok(())
    } else {
        Err(ApiError::MediaType(text.chars().take(100).collect()))
    }
}

async fn handle(State(app): State<App>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let client = parts
        .extensions
        .get::<ClientAddr>()
        .map(|c| c.0)
        .or_else(|| {
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0.ip())
        });
    let started = tokio::time::Instant::now();
    let mut due = started + app.limits.request_deadline;
    if let Some(Deadline(at)) = parts.extensions.get::<Deadline>() {
        due = due.min(tokio::time::Instant::from_std(*at));
    }
    // Every operation is safe to cut short: a push lands whole or not at all, and a retried LOCK
    // with the same ID, write of the same bytes or UNLOCK of a released lock succeeds.
    let work = dispatch(&app, parts.method, &parts.uri, &parts.headers, client, body);
    match tokio::time::timeout_at(due, work).await {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => error.into_response(),
        Err(_) => ApiError::Deadline {
            seconds: due.duration_since(started).as_secs_f64(),
        }
        .into_response(),
    }
}

async fn dispatch(
    app: &App,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    client: Option<IpAddr>,
    body: Body,
) -> Result<Response, ApiError> {
    let caller = if uri.path() == "/health" {
        None
    } else {
        let authorization = headers
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes);
        Some(app.access.authenticate(authorization, client).await?)
    };
    if let Some(caller) = &caller
        && console::addresses(uri.path())
    {
        return console::serve(app, caller, method, uri, headers, body).await;
    }
    let target = parse_target(uri)?;
    let backend = &app.backend;
    if let (Resource::StateList, Some(caller)) = (&target.resource, &caller) {
        if method != Method::GET && method != Method::HEAD {
            return Err(ApiError::Method {
                method: method.to_string(),
                allowed: "GET",
            });
        }
        let at = backend.locate(target.repository.as_deref(), target.branch.as_deref())?;
        let rows = backend.list_states(caller, &at).await?;
        let now = now_seconds();
        let listed: Vec<ListedState<'_>> = rows
            .iter()
            .map(|row| {
                let entry = row.entry.as_ref();
                ListedState {
                    state: row.name.as_str(),
                    serial: entry.and_then(|e| e.serial),
                    lineage: entry.and_then(|e| e.lineage.as_deref()),
                    updated: entry.map(|e| e.time),
                    author: entry.map(|e| e.author.as_str()),
                    operation: entry.map(|e| e.operation.as_str()),
                    lock: row
                        .lock
                        .as_ref()
                        .map(|held| listed_lock(&row.name, held, now)),
                }
            })
            .collect();
        return Ok(json(StatusCode::OK, to_json(&listed)?));
    }
    if let (Resource::LockList, Some(caller)) = (&target.resource, &caller) {
        if method != Method::GET {
            return Err(ApiError::Method {
                method: method.to_string(),
                allowed: "GET",
            });
        }
        let at = backend.locate(target.repository.as_deref(), target.branch.as_deref())?;
        let locks = backend.list_locks(caller, &at).await?;
        let now = now_seconds();
        let listed: Vec<ListedLock<'_>> = locks
            .iter()
            .map(|(name, held)| listed_lock(name, held, now))
            .collect();
        return Ok(json(StatusCode::OK, to_json(&listed)?));
    }
    let Some(name) = target.name else {
        return match method {
            Method::GET | Method::HEAD => Ok((StatusCode::OK, "ok\n").into_response()),
            other => Err(ApiError::Method {
                method: other.to_string(),
                allowed: "GET",
            }),
        };
    };
    let Some(caller) = caller else {
        return Err(ApiError::NoRoute);
    };
    let caller = &caller;
    let at = backend.locate(target.repository.as_deref(), target.branch.as_deref())?;
    let verb = method.as_str();
    let with_body = !matches!(method, Method::GET | Method::HEAD);
    let body = if with_body {
        check_media_type(headers)?;
        let body = read_body(headers, body, app.limits.max_body_bytes).await?;
        check_content_md5(headers, &body)?;
        body
    } else {
        Bytes::new()
    };
    let ok = || StatusCode::OK.into_response();
    match (target.resource, verb) {
        (Resource::State, "GET") => {
            let state = backend.get_state(caller, &at, &name).await?;
            app.limits.check_response(&state)?;
            Ok(json(StatusCode::OK, state))
        }
        (Resource::State, "POST" | "PUT") => {
            backend
                .put_state(caller, &at, &name, target.lock_id.as_deref(), body)
                .await?;
            Ok(ok())
        }
        (Resource::State, "DELETE") => {
            backend
                .delete_state(caller, &at, &name, target.lock_id.as_deref())
                .await?;
            Ok(ok())
        }
        (Resource::State | Resource::Lock, "LOCK") | (Resource::Lock, "POST") => {
            backend.lock(caller, &at, &name, body).await?;
            Ok(ok())
        }
        (Resource::State | Resource::Lock, "UNLOCK") | (Resource::Lock, "DELETE") => {
            backend.unlock(caller, &at, &name, &body).await?;
            Ok(ok())
        }
        (Resource::Lock, "GET") => {
            let held = backend.get_lock(caller, &at, &name).await?;
            let info: &LockInfo = &held.info;
            let mut response = json(StatusCode::OK, info.as_bytes().clone());
            let headers = response.headers_mut();
            if let Some(value) = held.owner.and_then(|o| HeaderValue::from_str(&o).ok()) {
                headers.insert(LOCK_USER_HEADER, value);
            }
            if let Some(created) = held.created {
                headers.insert(LOCK_CREATED_HEADER, HeaderValue::from(created));
                let age = now_seconds().saturating_sub(created).max(0);
                headers.insert(LOCK_AGE_HEADER, HeaderValue::from(age));
            }
            Ok(response)
        }
        (Resource::History, "GET") => match &target.at {
            Some(selector) => {
                let selector = Selector::parse(selector)?;
                let (version, state) = backend.get_version(caller, &at, &name, &selector).await?;
                app.limits.check_response(&state)?;
                let mut response = json(StatusCode::OK, state);
                if let Ok(value) = HeaderValue::from_str(&version) {
                    response.headers_mut().insert("gitstate-version", value);
                }
                Ok(response)
            }
            None => {
                let number = |text: &Option<String>, default: usize| match text {
                    None => Ok(default),
                    Some(t) => t
                        .parse::<usize>()
                        .map_err(|_| ApiError::Query(format!("{t:?} is not a page number"))),
                };
                let page = number(&target.page, 0)?;
                let per_page = number(&target.per_page, 20)?;
                let (versions, more) = backend.history(caller, &at, &name, page, per_page).await?;
                let answer = HistoryAnswer {
                    state: name.as_str(),
                    page,
                    versions,
                    next_page: more.then_some(page + 1),
                };
                Ok(json(StatusCode::OK, to_json(&answer)?))
            }
        },
        (Resource::History, "POST") => {
            let selector = target.restore.as_deref().ok_or_else(|| {
                ApiError::Query("restore needs ?restore=<commit id or serial>".into())
            })?;
            let restored = backend
                .restore(caller, &at, &name, &Selector::parse(selector)?)
                .await?;
            Ok(json(StatusCode::OK, to_json(&restored)?))
        }
        (Resource::History, other) => Err(ApiError::Method {
            method: other.into(),
            allowed: "GET, POST",
        }),
        (Resource::State, other) => Err(ApiError::Method {
            method: other.into(),
            allowed: "GET, POST, PUT, DELETE, LOCK, UNLOCK",
        }),
        (Resource::Lock, other) => Err(ApiError::Method {
            method: other.into(),
            allowed: "GET, POST, DELETE, LOCK, UNLOCK",
        }),
        (Resource::Health | Resource::LockList | Resource::StateList, _) => Err(ApiError::NoRoute),
    }
}

/// Print the `backend "http"` block that points Terraform at `base` for `state`.
pub fn write_backend_block(
    out: &mut impl std::io::Write,
    base: &str,
    state: &str,
) -> std::io::Result<()> {
    let base = base.trim_end_matches('/');
    writeln!(
        out,
        r#"
terraform {{
  backend "http" {{
    address        = "{base}/states/{state}"
    lock_address   = "{base}/locks/{state}"
    unlock_address = "{base}/locks/{state}"
    lock_method    = "POST"
    unlock_method  = "DELETE"
  }}
}}"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request naming a repository with credentials in it is 400 before anything looks it up,
    /// and the reason does not repeat the secret.
    #[test]
    fn repository_parameter_with_credentials_is_400() {
        for url in [
            "https://u:tok-1@h.example/o/r.git",
            "https://tok-1@h.example/o/r.git",
            "http://u%40x:tok-1@127.0.0.1:9/r.git",
            "ssh://git:tok-1@h.example/r.git",
        ] {
            let query: String = form_urlencoded::Serializer::new(String::new())
                .append_pair("type", "git")
                .append_pair("repository", url)
                .append_pair("state", "x.tfstate")
                .finish();
            let uri: Uri = format!("/?{query}").parse().expect("uri");
            match parse_target(&uri) {
                Err(error @ ApiError::Query(_)) => {
                    assert_eq!(error.status(), StatusCode::BAD_REQUEST);
                    assert!(!error.to_string().contains("tok-1"), "{error}");
                }
                Err(other) => panic!("{url}: {other}"),
                Ok(_) => panic!("{url} accepted"),
            }
        }
        let uri: Uri = "/?type=git&repository=ssh%3A%2F%2Fgit%40h%2Fr&state=x"
            .parse()
            .expect("uri");
        assert!(parse_target(&uri).is_ok(), "an ssh user name is no secret");
    }
}
