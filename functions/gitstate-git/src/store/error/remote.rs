//! [`RemoteError`]: what reaching one remote and its cache fails with, below every operation.

use crate::protocol::{AdvertError, FetchError, PushError};
use crate::{repository, transport};

/// A failure reaching a remote (repository and branch) or its cache: the lower layer every
/// store operation stands on. Each exchange has its own error ([`transport::ConnectError`],
/// [`AdvertError`], [`FetchError`], [`PushError`]) with the wire's ([`transport::Error`]) as its
/// source, the cache its own ([`repository::Error`]); the store's decisions read their variants.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The wire failed outside any one exchange.
    #[error(transparent)]
    Wire(transport::Error),
    /// No wire to the remote could be made (its URL, credentials or certificates).
    #[error("configuration: {0}")]
    Connect(transport::ConnectError),
    #[error(transparent)]
    Advert(#[from] AdvertError),
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error(transparent)]
    Push(#[from] PushError),
    #[error(
        "the git remote does not offer atomic push and GITSTATE_REQUIRE_ATOMIC=true refuses such remotes"
    )]
    AtomicRequired,
    /// A fetch answered with a pack that lacks what was asked for (`commits`, `blobs`).
    #[error("git remote reports: the fetch did not deliver the requested {0}")]
    Undelivered(&'static str),
    /// The cache (or the embedded repository) failed.
    #[error(transparent)]
    Repository(#[from] repository::Error),
    /// The state's file on the branch (this path) was written outside gitstate while its state
    /// ref holds the state: answering either would hide the other.
    #[error("{0}: the branch's file was written outside gitstate while the state's ref holds it")]
    EditedOutside(String),
    /// The branch (this full ref) is gone while its states' refs remain: deleted or renamed
    /// outside gitstate, which never deletes a branch.
    #[error("{0} is gone while its states' refs remain: it was deleted outside gitstate")]
    BranchLost(String),
    /// The branch (`branch`, a full ref) and `of` keep the same states, one a copy of the other:
    /// either would act on the other's resources.
    #[error(
        "{branch} and {of} keep the same states (one is a copy of the other): a plan on either would act on the other's resources"
    )]
    BranchCopied { branch: String, of: String },
}

impl RemoteError {
    /// The wire's failure under any exchange's error, if that is what this is.
    pub fn wire(&self) -> Option<&transport::Error> {
        match self {
            Self::Wire(wire) => Some(wire),
            Self::Advert(error) => error.wire(),
            Self::Fetch(error) => error.wire(),
            Self::Push(error) => error.wire(),
            Self::Connect(_)
            | Self::AtomicRequired
            | Self::Undelivered(_)
            | Self::Repository(_)
            | Self::EditedOutside(_)
            | Self::BranchLost(_)
            | Self::BranchCopied { .. } => None,
        }
    }

    /// The remote's own refusal, or a failure it reported: a fresh look may get past it (a
    /// fetch of a tip that moved since it was advertised, say).
    pub fn refused(&self) -> bool {
        match self {
            Self::Wire(error) => error.refused(),
            Self::Advert(error) => error.refused(),
            Self::Fetch(error) => error.refused(),
            Self::Push(error) => error.refused(),
            Self::Undelivered(_) => true,
            Self::Connect(_)
            | Self::AtomicRequired
            | Self::Repository(_)
            | Self::EditedOutside(_)
            | Self::BranchLost(_)
            | Self::BranchCopied { .. } => false,
        }
    }

    /// The remote answered with something git's protocol does not allow, or an exchange that
    /// cannot be made with what it offers.
    pub fn garbled(&self) -> bool {
        match self {
            Self::Wire(error) => error.garbled(),
            Self::Advert(error) => error.garbled(),
            Self::Fetch(error) => error.garbled(),
            Self::Push(error) => error.garbled(),
            Self::Repository(error) => error.garbled(),
            Self::Connect(_)
            | Self::AtomicRequired
            | Self::Undelivered(_)
            | Self::EditedOutside(_)
            | Self::BranchLost(_)
            | Self::BranchCopied { .. } => false,
        }
    }

    /// The remote answered with an HTTP error status.
    pub fn status(&self) -> Option<u16> {
        match self.wire() {
            Some(transport::Error::Status { status, .. }) => Some(*status),
            _ => None,
        }
    }

    /// Failures worth one more try from a fresh look at the remote: the remote's refusal (a
    /// fetch of a tip that just moved), or a remote answering 5xx or 429.
    pub fn is_transient(&self) -> bool {
        self.refused() || self.wire().is_some_and(transport::Error::busy)
    }
}

impl From<transport::Error> for RemoteError {
    fn from(error: transport::Error) -> Self {
        Self::Wire(error)
    }
}

impl From<transport::ConnectError> for RemoteError {
    /// A client that could not be built stays what it was before there was a `ConnectError`:
    /// an HTTP failure.
    fn from(error: transport::ConnectError) -> Self {
        match error {
            transport::ConnectError::Client(e) => Self::Wire(transport::Error::Http(e)),
            other => Self::Connect(other),
        }
    }
}

impl From<repository::Corruption> for RemoteError {
    fn from(what: repository::Corruption) -> Self {
        Self::Repository(repository::Error::Corrupt(what))
    }
}
