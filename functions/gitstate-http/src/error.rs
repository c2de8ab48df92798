//! Errors of the HTTP layer, and the only place where statuses are chosen.

use axum::response::{IntoResponse, Response};
use gitstate_core::auth::{AuthError, retry_after_secs};
use gitstate_core::ports::{SealError, StoreError};
use gitstate_core::service::ServiceError;
use http::{HeaderValue, StatusCode, header};

use crate::MAX_QUERY_BYTES;
use crate::log::Outcome;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Service(#[from] ServiceError),
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// A path that names no route: 400, never 404, which Terraform reads as "no state yet".
    #[error(
        "no such route: states are at /states/<name>, locks at /locks/<name> (or the seed format /?type=git&repository=…&ref=…&state=…)"
    )]
    NoRoute,
    /// `hint`: the nearest known name, if one is close, and the names this address takes.
    #[error("unknown query parameter {name:?}{hint}")]
    UnknownParameter { name: String, hint: String },
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
    #[error(
        "cross-site request refused: writes are accepted from this backend's own pages and from \
         clients that are not browsers (Sec-Fetch-Site or Origin names another site)"
    )]
    CrossSite,
    #[error("the form token is missing or wrong: reload the page and try again")]
    FormToken,
    /// A console page of a missing state asked for by a client that is not a browser (no
    /// `Accept: text/html`): Terraform pointed at `/ui/states/<name>` must not read "no state".
    #[error(
        "no state by this name; /ui/states/ is the web console, for browsers: Terraform's address for a state is /states/<name>"
    )]
    ConsoleNotFound,
    /// A console address that names no page, asked for by a browser (other clients get
    /// [`Self::NoRoute`]).
    #[error(
        "no page here: the console shows the states at /ui/ and each state at /ui/states/<name>"
    )]
    NoPage,
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
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::Service(error) => service_status(error),
            Self::Auth(AuthError::Unauthenticated) => StatusCode::UNAUTHORIZED,
            Self::Auth(AuthError::Throttled { .. }) => StatusCode::TOO_MANY_REQUESTS,
            Self::Auth(AuthError::Unavailable(_)) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Method { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::TooLarge { .. } | Self::ResponseTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::NoRoute
            | Self::UnknownParameter { .. }
            | Self::BodyRead
            | Self::Query(_)
            | Self::ContentMd5(_) => StatusCode::BAD_REQUEST,
            Self::MediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::QueryTooLong => StatusCode::URI_TOO_LONG,
            Self::Deadline { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::CrossSite | Self::FormToken => StatusCode::FORBIDDEN,
            Self::Unconfirmed | Self::ConsoleNotFound => StatusCode::BAD_REQUEST,
            Self::NoPage => StatusCode::NOT_FOUND,
            Self::Render(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// What the client reads: 5xx bodies say what to do, never what broke inside.
    fn reason(&self) -> String {
        use ServiceError as S;
        match self {
            Self::Service(S::Store(StoreError::Unavailable(_) | StoreError::Contention { .. })) => {
                "the git remote is busy or unreachable; retry".to_owned()
            }
            Self::Service(S::Store(StoreError::Remote(_))) => {
                "the git remote refused or garbled the request; see the backend's log".to_owned()
            }
            Self::Service(S::Store(
                told @ (StoreError::Incompatible(_)
                | StoreError::ProtocolMismatch { .. }
                | StoreError::Copied { .. }),
            )) => told.to_string(),
            Self::Service(S::Store(StoreError::Diverged)) => S::Diverged.to_string(),
            Self::Service(S::Store(_)) | Self::Render(_) => {
                "internal error; see the backend's log".to_owned()
            }
            Self::Auth(AuthError::Unavailable(_)) => {
                "the access policy could not be read from the git remote; retry".to_owned()
            }
            Self::Service(S::Seal(SealError::Unavailable(_))) => {
                "the key service (KMS) is unavailable; retry".to_owned()
            }
            Self::Service(S::Seal(_) | S::NoKeys) => {
                "the state could not be decrypted or encrypted; see the backend's log".to_owned()
            }
            Self::Deadline { seconds } => format!(
                "the git remote or the key service did not answer within {seconds:.0} s; retrying is safe"
            ),
            other => other.to_string(),
        }
    }
}

fn service_status(error: &ServiceError) -> StatusCode {
    use ServiceError as S;
    match error {
        S::Name(_)
        | S::Branch(_)
        | S::LockBody(_)
        | S::InvalidState(_)
        | S::BadSelector(_)
        | S::AmbiguousVersion { .. }
        | S::LockRequestToState(_) => StatusCode::BAD_REQUEST,
        // What the repository holds is broken, not the request; the reason says what to fix.
        S::NotAState(_) => StatusCode::INTERNAL_SERVER_ERROR,
        S::RepositoryNotAllowed(_) | S::RefNotAllowed(_) | S::Forbidden(_) => StatusCode::FORBIDDEN,
        // The request is well formed; the history holds several answers to it.
        S::Exists | S::Clash(_) | S::SharedSerial { .. } => StatusCode::CONFLICT,
        // Never 404 (Terraform's "no state"), nor 409/423 (a lock conflict to Terraform): the
        // reason names the default branch and the setting.
        S::NoBranch { .. }
        | S::OnAnotherBranch { .. }
        | S::BranchBesideStates { .. }
        | S::StatesElsewhere { .. }
        | S::Store(StoreError::Copied { .. }) => StatusCode::BAD_REQUEST,
        // Only a valid, absent state is 404 (Terraform's "no state"). An unknown revision is a
        // bad selector; "no lock held" answers only GET /locks/<name> (an UNLOCK of a lock nobody
        // holds is 200), so 409 there never reads as a LOCK conflict.
        S::NotFound => StatusCode::NOT_FOUND,
        S::NoSuchVersion(_) => StatusCode::BAD_REQUEST,
        S::NoLock => StatusCode::CONFLICT,
        S::Locked(_) => StatusCode::LOCKED,
        // The write must hold the lock: the reason names lock_address/unlock_address.
        S::Unlocked => StatusCode::PRECONDITION_REQUIRED,
        S::LockMismatch(_) | S::NotLocked { .. } | S::Stale { .. } => StatusCode::CONFLICT,
        S::Store(StoreError::Unavailable(_) | StoreError::Contention { .. }) => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        S::Store(StoreError::Remote(_) | StoreError::Incompatible(_)) => StatusCode::BAD_GATEWAY,
        // Another deployment's lock prefix is recorded: the reason names both values. Not 409
        // or 423, which Terraform reads on a LOCK as a conflict with another holder.
        S::Store(StoreError::ProtocolMismatch { .. }) => StatusCode::PRECONDITION_FAILED,
        S::Store(StoreError::Corrupt(_) | StoreError::Internal(_)) => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        // Encryption at rest: KMS down is retryable, KMS refusing is the gateway's fault,
        // a tampered or unreadable state is ours; none is the client's.
        S::Seal(SealError::Unavailable(_)) => StatusCode::SERVICE_UNAVAILABLE,
        S::Seal(SealError::Refused(_)) => StatusCode::BAD_GATEWAY,
        S::Seal(SealError::Integrity(_) | SealError::Unreadable(_))
        | S::NoKeys
        | S::SealedWithoutKeys => StatusCode::INTERNAL_SERVER_ERROR,
        // Sealed under a key the deployment lacks: never unwrapped, ours to fix (rekey or
        // GITSTATE_KMS_PREVIOUS_KEY_IDS), not the gateway's.
        S::Seal(SealError::ForeignKey(_)) => StatusCode::INTERNAL_SERVER_ERROR,
        // The operator must rekey; the message says so.
        S::Unprotected { .. } | S::Diverged | S::Store(StoreError::Diverged) => {
            StatusCode::CONFLICT
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        // What the log layer writes: the whole chain of a server error, the reason otherwise.
        let outcome = if status.is_server_error() {
            Outcome::Failed(gitstate_core::report::chain(&self))
        } else {
            Outcome::Refused(self.to_string())
        };
        let mut response = match &self {
            // Terraform reads the holder's LockInfo from the body of a 423 or 409.
            Self::Service(ServiceError::Locked(held) | ServiceError::LockMismatch(held)) => {
                crate::json(status, held.info.as_bytes().clone())
            }
            _ => (status, format!("{}\n", one_line(&self.reason()))).into_response(),
        };
        response.extensions_mut().insert(outcome);
        let headers = response.headers_mut();
        if let Self::Method { allowed, .. } = self {
            headers.insert(header::ALLOW, HeaderValue::from_static(allowed));
        }
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"gitstate\", charset=\"UTF-8\""),
            );
        }
        if let Self::Auth(AuthError::Throttled { retry_after }) = self {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(retry_after_secs(retry_after)),
            );
        } else if matches!(
            status,
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
        ) {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests;
