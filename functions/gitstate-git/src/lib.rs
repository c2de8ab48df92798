//! The git store: states and locks kept in a git repository with the branch-lock protocol, over
//! smart HTTP(S) to a hosted repository or directly on an embedded local one.

mod cache;
mod index;
mod local;
mod pack;
pub mod pkt;
pub mod smart;
pub mod ssh;
mod store;

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

/// What every binary serves: the backend over a git store and the access policy guarding it, as
/// `settings` describe them.
pub fn service(
    settings: &gitstate_core::config::Settings,
) -> Result<
    (
        std::sync::Arc<gitstate_core::service::Backend>,
        std::sync::Arc<gitstate_core::auth::Access>,
    ),
    Error,
> {
    service_with(settings, None)
}

/// [`service`], with states sealed by `encryption` when given.
pub fn service_with(
    settings: &gitstate_core::config::Settings,
    encryption: Option<gitstate_core::service::Encryption>,
) -> Result<
    (
        std::sync::Arc<gitstate_core::service::Backend>,
        std::sync::Arc<gitstate_core::auth::Access>,
    ),
    Error,
> {
    let backend = match encryption {
        Some(encryption) => backend(settings)?.with_encryption(encryption),
        None => backend(settings)?,
    };
    let primary = backend
        .locate(None, None)
        .map_err(|e| Error::Config(e.to_string()))?;
    let access = gitstate_core::auth::Access::new(
        backend.store().clone(),
        primary,
        settings.access.clone(),
        std::sync::Arc::new(gitstate_core::password::Argon2id),
    )
    .map_err(|e| Error::Config(format!("access policy: {e}")))?;
    Ok((std::sync::Arc::new(backend), std::sync::Arc::new(access)))
}

/// The backend over a git store, as `settings` describe it.
pub fn backend(
    settings: &gitstate_core::config::Settings,
) -> Result<gitstate_core::service::Backend, Error> {
    let (store, primary) = GitStore::new(settings)?;
    let repositories = gitstate_core::service::Repositories {
        primary,
        default_branch: settings.branch.clone(),
        allowed: settings.allowed_repositories.clone(),
    };
    let refs = settings
        .ref_policy()
        .map_err(|e| Error::Config(e.to_string()))?;
    Ok(gitstate_core::service::Backend::new(
        std::sync::Arc::new(store),
        repositories,
        settings.committer.clone(),
    )
    .with_refs(refs))
}
