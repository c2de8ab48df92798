//! The git store: states and locks kept in a git repository with the branch-lock protocol, over
//! smart HTTP(S) or SSH to a hosted repository or directly on an embedded local one.
//!
//! Layers, each using only those below it: [`transport`] (the wire: HTTP or SSH) →
//! [`protocol`] (pkt-lines, advertisements, fetch, push) → the repository (`repository`: the
//! cache, packs, the state index, the embedded repository's refs) → `store` ([`GitStore`]).

pub mod protocol;
mod repository;
mod settings;
mod store;
mod sync;
pub mod transport;

pub use settings::{GitAuth, GitSettings, StateRefs};
pub use store::{GitStore, Holder, StoreOptions, WriteMode};

use gitstate_core::ports::StoreError;

/// Failures inside the git adapter; mapped once onto the core's [`StoreError`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("git HTTP request failed")]
    Http(#[source] reqwest::Error),
    #[error(
        "certificate verification failed for git host {host} ({reason}); trust its CA with GITSTATE_GIT_CA_FILE or GITSTATE_GIT_CA_PEM"
    )]
    Certificate { host: String, reason: String },
    #[error(
        "the git remote does not offer atomic push and GITSTATE_REQUIRE_ATOMIC=true refuses such remotes"
    )]
    AtomicRequired,
    #[error("git remote answered HTTP {status} to the {what}")]
    Status { status: u16, what: &'static str },
    #[error("git protocol error: {0}")]
    Protocol(String),
    #[error("git remote reports: {0}")]
    Remote(String),
    #[error("configuration: {0}")]
    Config(String),
    #[error("configuration: {0}")]
    Connect(transport::ConnectError),
    #[error("local git repository")]
    Git(#[from] gix::Error),
    #[error("received pack is invalid")]
    Pack(#[source] gix::Error),
    #[error("cache is corrupt: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("background task failed")]
    Join(#[from] tokio::task::JoinError),
}

impl Error {
    /// An answer over the size limit, over HTTP or SSH (a 502 with this reason).
    pub(crate) fn too_large(what: &str, limit: u64) -> Self {
        Self::Remote(format!(
            "the remote's {what} is larger than {limit} bytes (GITSTATE_GIT_MAX_RESPONSE_BYTES)"
        ))
    }

    /// Failures worth one more try from a fresh look at the remote: a refused fetch of a tip that
    /// just moved, or a remote answering 5xx.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Remote(_) => true,
            Self::Status { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }
}

impl From<transport::ConnectError> for Error {
    /// A client that could not be built stays what it was before there was a `ConnectError`:
    /// an HTTP failure.
    fn from(error: transport::ConnectError) -> Self {
        match error {
            transport::ConnectError::Client(e) => Self::Http(e),
            other => Self::Connect(other),
        }
    }
}

/// A push's own failures keep the texts and kinds they had before pushing had its own error:
/// the remote's refusals are `Remote` (transient), a malformed or impossible exchange `Protocol`.
impl From<protocol::PushError> for Error {
    fn from(error: protocol::PushError) -> Self {
        match error {
            protocol::PushError::Wire(error) => error,
            refused if refused.refused() => Self::Remote(refused.to_string()),
            malformed => Self::Protocol(malformed.to_string()),
        }
    }
}

/// A fetch's own failures keep the texts and kinds they had before fetching had its own error:
/// the remote's `ERR` is `Remote` (the store looks again), no pack at all `Protocol`.
impl From<protocol::FetchError> for Error {
    fn from(error: protocol::FetchError) -> Self {
        match error {
            protocol::FetchError::Wire(error) => error,
            protocol::FetchError::Refused(why) => Self::Remote(why),
            no_pack @ protocol::FetchError::NoPack => Self::Protocol(no_pack.to_string()),
        }
    }
}

/// An advertisement that cannot be read is a protocol error, as before it had its own error.
impl From<protocol::AdvertError> for Error {
    fn from(error: protocol::AdvertError) -> Self {
        match error {
            protocol::AdvertError::Wire(error) => error,
            malformed => Self::Protocol(malformed.to_string()),
        }
    }
}

impl From<Error> for StoreError {
    fn from(error: Error) -> Self {
        match Class::of(&error) {
            Class::Unavailable => StoreError::Unavailable(Box::new(error)),
            Class::Remote => StoreError::Remote(Box::new(error)),
            Class::Incompatible => StoreError::Incompatible(error.to_string()),
            Class::Corrupt => match error {
                Error::Corrupt(what) => StoreError::Corrupt(what),
                other => StoreError::Corrupt(other.to_string()),
            },
            Class::Internal => StoreError::Internal(Box::new(error)),
        }
    }
}

impl Error {
    /// The same failure once more, for another caller of the one request that failed (writes
    /// pushed together): the same kind of [`StoreError`] (so the same status), with this one's
    /// text.
    pub(crate) fn echo(&self) -> StoreError {
        let text = gitstate_core::report::chain(self);
        let shared = || Box::new(Echoed(text.clone()));
        match Class::of(self) {
            Class::Unavailable => StoreError::Unavailable(shared()),
            Class::Remote => StoreError::Remote(shared()),
            Class::Incompatible => StoreError::Incompatible(self.to_string()),
            Class::Corrupt => StoreError::Corrupt(match self {
                Self::Corrupt(what) => what.clone(),
                other => other.to_string(),
            }),
            Class::Internal => StoreError::Internal(shared()),
        }
    }
}

/// A failure first reported to another caller, by its text.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Echoed(String);

/// Which [`StoreError`] a failure becomes.
enum Class {
    Unavailable,
    Remote,
    Incompatible,
    Corrupt,
    Internal,
}

impl Class {
    fn of(error: &Error) -> Self {
        match error {
            Error::Http(e) if e.is_timeout() || e.is_connect() || e.is_request() || e.is_body() => {
                Self::Unavailable
            }
            Error::Status { status, .. } if *status >= 500 || *status == 429 => Self::Unavailable,
            Error::Http(_)
            | Error::Status { .. }
            | Error::Protocol(_)
            | Error::Remote(_)
            | Error::Pack(_)
            | Error::Certificate { .. } => Self::Remote,
            Error::AtomicRequired => Self::Incompatible,
            Error::Corrupt(_) => Self::Corrupt,
            Error::Config(_)
            | Error::Connect(_)
            | Error::Git(_)
            | Error::Io(_)
            | Error::Join(_) => Self::Internal,
        }
    }
}
