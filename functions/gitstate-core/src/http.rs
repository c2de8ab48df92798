//! The one HTTP router, served by Lambda, the local server and the tests alike.
//!
//! Routes (`<name>` is the state's path in the repository):
//! - `GET|POST|PUT|DELETE|LOCK|UNLOCK /states/<name>`: read, write, remove, lock, unlock;
//! - `GET /locks/<name>` (current lock), `POST|LOCK /locks/<name>`, `DELETE|UNLOCK /locks/<name>`;
//! - `/?type=git&repository=<url>&ref=<branch>&state=<name>`: the seed tool's address format;
//! - `GET /health` (the only route without authentication).
//!
//! Every route takes `?ref=` to address another branch; writes take Terraform's `?ID=`.
//! Every other request needs the Basic credentials of a user of the access policy.

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
use crate::service::{Backend, ServiceError};
use crate::{LockInfo, StateName};

/// The client's address, set by whatever serves the router when it knows it (Lambda: the
/// Function URL's source IP). The local server provides `ConnectInfo` instead.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub IpAddr);

/// Headers of `GET /locks/<name>` that describe the lock beyond Terraform's LockInfo.
pub const LOCK_USER_HEADER: &str = "gitstate-lock-user";
pub const LOCK_CREATED_HEADER: &str = "gitstate-lock-created";

/// Longest query string accepted.
pub const MAX_QUERY_BYTES: usize = 4096;

/// Limits applied before a request reaches the service.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_body_bytes: usize,
}

#[derive(Clone)]
struct App {
    backend: Arc<Backend>,
    access: Arc<Access>,
    limits: Limits,
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
    #[error("unsupported content type {0:?}: send application/json")]
    MediaType(String),
    #[error("bad query: {0}")]
    Query(String),
    #[error("query string is longer than {MAX_QUERY_BYTES} bytes")]
    QueryTooLong,
}

impl ApiError {
    fn status(&self) -> StatusCode {
        use ServiceError as S;
        match self {
            Self::Service(S::Name(_) | S::Branch(_) | S::LockBody(_) | S::InvalidState(_)) => {
                StatusCode::BAD_REQUEST
            }
            Self::Service(S::RepositoryNotAllowed(_) | S::Forbidden(_)) => StatusCode::FORBIDDEN,
            Self::Auth(AuthError::Unauthenticated) => StatusCode::UNAUTHORIZED,
            Self::Auth(AuthError::Unavailable(_)) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Service(S::Exists) => StatusCode::CONFLICT,
            Self::Service(S::Locked(_)) => StatusCode::LOCKED,
            Self::Service(S::LockMismatch(_) | S::NotLocked { .. } | S::Stale { .. }) => {
                StatusCode::CONFLICT
            }
            Self::Service(S::NotFound | S::NoLock) | Self::NoRoute => StatusCode::NOT_FOUND,
            Self::Service(S::Store(StoreError::Unavailable(_) | StoreError::Contention { .. })) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Service(S::Store(StoreError::Remote(_))) => StatusCode::BAD_GATEWAY,
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
            // The operator must rekey; the message says so.
            Self::Service(S::Unprotected { .. }) => StatusCode::CONFLICT,
            Self::Method { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyRead | Self::Query(_) => StatusCode::BAD_REQUEST,
            Self::MediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::QueryTooLong => StatusCode::URI_TOO_LONG,
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
            Self::Service(ServiceError::Store(_)) => {
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
        if status == StatusCode::SERVICE_UNAVAILABLE {
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

fn json(status: StatusCode, body: Bytes) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// What a request addresses, decoded from its path and query.
enum Resource {
    State,
    Lock,
    Health,
}

struct Addressed {
    resource: Resource,
    name: Option<StateName>,
    repository: Option<String>,
    branch: Option<String>,
    lock_id: Option<String>,
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
    } else if path == "/health" {
        (Resource::Health, None)
    } else {
        return Err(ApiError::NoRoute);
    };
    Ok(Addressed {
        resource,
        name,
        repository: take("repository"),
        branch: take("ref"),
        lock_id: take("ID"),
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
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(ApiError::TooLarge { limit })
        }
        Err(_) => Err(ApiError::BodyRead),
    }
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
    match dispatch(&app, parts.method, &parts.uri, &parts.headers, client, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
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
    let target = parse_target(uri)?;
    let backend = &app.backend;
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
        read_body(headers, body, app.limits.max_body_bytes).await?
    } else {
        Bytes::new()
    };
    let ok = || StatusCode::OK.into_response();
    match (target.resource, verb) {
        (Resource::State, "GET") => Ok(json(
            StatusCode::OK,
            backend.get_state(caller, &at, &name).await?,
        )),
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
            }
            Ok(response)
        }
        (Resource::State, other) => Err(ApiError::Method {
            method: other.into(),
            allowed: "GET, POST, PUT, DELETE, LOCK, UNLOCK",
        }),
        (Resource::Lock, other) => Err(ApiError::Method {
            method: other.into(),
            allowed: "GET, POST, DELETE, LOCK, UNLOCK",
        }),
        (Resource::Health, _) => Err(ApiError::NoRoute),
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
