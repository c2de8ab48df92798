//! The one place a failure of the store becomes the core's [`StoreError`] (and so, in the HTTP
//! layer, a status): [`Class::of`] each lower failure, then each operation's error by variant.

use std::borrow::Borrow;

use gitstate_core::ports::StoreError;

use super::RemoteError;
use crate::{repository, transport};

/// Which [`StoreError`] a failure becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    Unavailable,
    Remote,
    Incompatible,
    Corrupt,
    Internal,
    Diverged,
}

impl Class {
    pub(super) fn of(error: &RemoteError) -> Self {
        match error {
            RemoteError::Wire(wire) => Self::of_wire(wire),
            RemoteError::Advert(_) | RemoteError::Fetch(_) | RemoteError::Push(_) => {
                error.wire().map_or(Self::Remote, Self::of_wire)
            }
            RemoteError::Undelivered(_) => Self::Remote,
            RemoteError::AtomicRequired => Self::Incompatible,
            RemoteError::Connect(_) => Self::Internal,
            RemoteError::Repository(error) => Self::of_repository(error),
            RemoteError::EditedOutside(_)
            | RemoteError::BranchLost(_)
            | RemoteError::BranchCopied { .. } => Self::Diverged,
        }
    }

    /// What the remote sent that the cache cannot take, or what the remote cannot be sent: the
    /// remote's; what the cache holds unreadably: corrupt; the disk, gix, a blocking task:
    /// internal.
    fn of_repository(error: &repository::Error) -> Self {
        match error {
            repository::Error::Pack(_)
            | repository::Error::RefName(_)
            | repository::Error::TooManyObjects => Self::Remote,
            repository::Error::Corrupt(_) => Self::Corrupt,
            repository::Error::Git(_) | repository::Error::Io(_) | repository::Error::Join(_) => {
                Self::Internal
            }
        }
    }

    /// Unreachable or busy: unavailable (retry later); the wire on this side (ssh that cannot
    /// start): internal; anything else the remote said or did: the remote's.
    fn of_wire(error: &transport::Error) -> Self {
        if error.unreachable() || error.busy() {
            Self::Unavailable
        } else if error.local() {
            Self::Internal
        } else {
            Self::Remote
        }
    }
}

/// What is unreadable, for a [`StoreError::Corrupt`]: the corruption itself when that is the
/// failure, else the failure's text.
fn corrupt_text(error: &RemoteError) -> String {
    match error {
        RemoteError::Repository(repository::Error::Corrupt(what)) => what.to_string(),
        other => other.to_string(),
    }
}

impl From<RemoteError> for StoreError {
    fn from(error: RemoteError) -> Self {
        classify(error)
    }
}

/// The [`StoreError`] of `error`, which is or shares a [`RemoteError`] (and stays its source):
/// a failure shared by several callers (writes pushed together) gives each the same kind of
/// `StoreError` (so the same status) with the same text.
pub(super) fn classify<E>(error: E) -> StoreError
where
    E: Borrow<RemoteError> + std::error::Error + Send + Sync + 'static,
{
    if let RemoteError::BranchCopied { branch, of } = error.borrow() {
        let short = |name: &str| name.strip_prefix("refs/heads/").unwrap_or(name).to_owned();
        return StoreError::Copied {
            branch: short(branch),
            of: short(of),
        };
    }
    match Class::of(error.borrow()) {
        Class::Unavailable => StoreError::Unavailable(Box::new(error)),
        Class::Remote => StoreError::Remote(Box::new(error)),
        Class::Incompatible => StoreError::Incompatible(error.to_string()),
        Class::Corrupt => StoreError::Corrupt(corrupt_text(error.borrow())),
        Class::Internal => StoreError::Internal(Box::new(error)),
        Class::Diverged => {
            tracing::warn!(error = %error, "a state's file on the branch was written outside gitstate");
            StoreError::Diverged
        }
    }
}

impl From<repository::Error> for StoreError {
    fn from(error: repository::Error) -> Self {
        RemoteError::from(error).into()
    }
}
