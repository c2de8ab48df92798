//! The git store: states and locks kept in a git repository with the branch-lock protocol, over
//! smart HTTP(S) to a hosted repository or directly on an embedded local one.

mod cache;
mod index;
mod local;
mod pack;
pub mod pkt;
mod settings;
pub mod smart;
pub mod ssh;
mod store;

pub use settings::{GitAuth, GitSettings};
pub use store::{GitStore, StoreOptions, WriteMode};

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

impl From<Error> for StoreError {
    fn from(error: Error) -> Self {
        match error {
            Error::Http(e) if e.is_timeout() || e.is_connect() || e.is_request() || e.is_body() => {
                StoreError::Unavailable(Box::new(Error::Http(e)))
            }
            Error::Status { status, .. } if status >= 500 || status == 429 => {
                StoreError::Unavailable(Box::new(error))
            }
            Error::Http(_)
            | Error::Status { .. }
            | Error::Protocol(_)
            | Error::Remote(_)
            | Error::Pack(_)
            | Error::Certificate { .. } => StoreError::Remote(Box::new(error)),
            Error::AtomicRequired => StoreError::Incompatible(error.to_string()),
            Error::Corrupt(what) => StoreError::Corrupt(what),
            Error::Config(_) | Error::Git(_) | Error::Io(_) | Error::Join(_) => {
                StoreError::Internal(Box::new(error))
            }
        }
    }
}
