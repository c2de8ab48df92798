//! One error per store operation: what failed in that operation, with the lower layer's
//! failure ([`RemoteError`]) as the source, and the [`StoreError`] each becomes.

use std::sync::Arc;

use gitstate_core::ports::StoreError;

use super::RemoteError;
use super::class::classify;
use crate::repository;

/// A read at the branch tip: a state, a configuration file, how a name clashes with the tree,
/// whether the branch exists, the repository's protocol record.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Reaching the remote, or reading the cache.
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

/// A list: of the states under a prefix, of the locks, or both with the index.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// Reaching the remote, or reading the cache.
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

/// A LOCK: the create-only push of a lock ref.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Reaching the remote, or reading the cache.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// Every create of the lock ref was refused, with no lock there to explain it.
    #[error("git remote reports: the remote kept refusing to create {lock_ref} ({report})")]
    Refused { lock_ref: String, report: String },
    /// The branch kept moving under the check of the state's name against its tree.
    #[error("the branch kept moving after {attempts} attempts")]
    Contention { attempts: u32 },
    /// The repository records another lock ref prefix than this backend's.
    #[error("this backend's {setting} is {ours:?}, but the repository records {recorded:?}")]
    ProtocolMismatch {
        setting: &'static str,
        ours: String,
        recorded: String,
    },
}

/// An UNLOCK: the conditional delete of a lock ref, or the lock as this store last made it.
#[derive(Debug, thiserror::Error)]
pub enum UnlockError {
    /// Reaching the remote, or reading the cache.
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

/// The history of a state: its revisions, one revision's content, the last change of files.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// Reaching the remote, or reading the cache.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// The cache's history cannot be walked as far as the page needs.
    #[error("cache is corrupt: {0}")]
    Broken(Broken),
}

/// How the cache's history is broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Broken {
    /// A first-parent walk met a commit whose parent is missing below a complete history.
    #[error("history has a missing parent commit")]
    MissingParent,
    /// A walk stopped at a shallow boundary, and the next walk found none.
    #[error("history boundary moved")]
    BoundaryMoved,
}

/// A write of a state or of a configuration file (see the `write` module). It clones: the
/// writes pushed together share one failure, each caller getting it whole.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WriteError {
    /// Reaching the remote, or reading the cache (shared by the writes of the round it failed).
    #[error(transparent)]
    Remote(Arc<RemoteError>),
    /// The push was refused twice on a branch that did not move: the remote declines it.
    #[error("git remote reports: the remote refused the push on an unchanged branch: {0}")]
    Declined(String),
    /// The write lost its push to other writes until it ran out of attempts or time.
    #[error("the branch kept moving after {attempts} attempts")]
    Contention { attempts: u32 },
    /// The task pushing the write ended without answering it.
    #[error("the write task ended unanswered")]
    Unanswered,
    /// A write that names no lock was routed to a state's own ref (never: only updates under a
    /// lock go there).
    #[error("a write without a lock went to a state ref")]
    Misrouted,
}

impl From<RemoteError> for WriteError {
    fn from(error: RemoteError) -> Self {
        Self::Remote(Arc::new(error))
    }
}

/// A fold of the state refs onto the branch (see the `fold` module).
#[derive(Debug, thiserror::Error)]
pub enum FoldError {
    /// Reaching the remote, or reading the cache.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// Every round lost its push to writes that came meanwhile.
    #[error("the branch kept moving after {attempts} attempts")]
    Contention { attempts: u32 },
}

/// Opening the store: its certificates, the embedded repository.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// `GITSTATE_GIT_CA_FILE`/`GITSTATE_GIT_CA_PEM` holds no usable certificate.
    #[error("configuration: {0}")]
    Certificates(#[from] crate::transport::ConnectError),
    /// The embedded repository cannot be opened or created.
    #[error(transparent)]
    Repository(#[from] repository::Error),
    /// The embedded repository's path cannot be resolved.
    #[error(transparent)]
    Path(#[from] std::io::Error),
}

/// The operations' errors whose lower layer is the cache alone take its failure as the
/// remote's (the cache is the remote's copy).
macro_rules! from_repository {
    ($($op:ty),*) => {$(
        impl From<repository::Error> for $op {
            fn from(error: repository::Error) -> Self {
                Self::from(RemoteError::from(error))
            }
        }
        impl From<repository::Corruption> for $op {
            fn from(what: repository::Corruption) -> Self {
                Self::from(RemoteError::from(what))
            }
        }
    )*};
}
from_repository!(
    ReadError,
    ListError,
    LockError,
    UnlockError,
    HistoryError,
    WriteError,
    FoldError
);

impl From<ReadError> for StoreError {
    fn from(error: ReadError) -> Self {
        match error {
            ReadError::Remote(error) => error.into(),
        }
    }
}

impl From<ListError> for StoreError {
    fn from(error: ListError) -> Self {
        match error {
            ListError::Remote(error) => error.into(),
        }
    }
}

impl From<LockError> for StoreError {
    fn from(error: LockError) -> Self {
        match error {
            LockError::Remote(error) => error.into(),
            LockError::Refused { .. } => StoreError::Remote(Box::new(error)),
            LockError::Contention { attempts } => StoreError::Contention { attempts },
            LockError::ProtocolMismatch {
                setting,
                ours,
                recorded,
            } => StoreError::ProtocolMismatch {
                setting,
                ours,
                recorded,
            },
        }
    }
}

impl From<UnlockError> for StoreError {
    fn from(error: UnlockError) -> Self {
        match error {
            UnlockError::Remote(error) => error.into(),
        }
    }
}

impl From<HistoryError> for StoreError {
    fn from(error: HistoryError) -> Self {
        match error {
            HistoryError::Remote(error) => error.into(),
            HistoryError::Broken(how) => StoreError::Corrupt(how.to_string()),
        }
    }
}

impl From<WriteError> for StoreError {
    fn from(error: WriteError) -> Self {
        match error {
            WriteError::Remote(error) => classify(error),
            WriteError::Declined(_) => StoreError::Remote(Box::new(error)),
            WriteError::Contention { attempts } => StoreError::Contention { attempts },
            WriteError::Unanswered | WriteError::Misrouted => StoreError::Internal(Box::new(error)),
        }
    }
}

impl From<FoldError> for StoreError {
    fn from(error: FoldError) -> Self {
        match error {
            FoldError::Remote(error) => error.into(),
            FoldError::Contention { attempts } => StoreError::Contention { attempts },
        }
    }
}

impl LockError {
    /// The remote's refusal: a fresh look may get past it.
    pub fn refused(&self) -> bool {
        match self {
            Self::Remote(error) => error.refused(),
            Self::Refused { .. } => true,
            Self::Contention { .. } | Self::ProtocolMismatch { .. } => false,
        }
    }
}

impl WriteError {
    /// The remote's refusal: a fresh look may get past it.
    pub fn refused(&self) -> bool {
        match self {
            Self::Remote(error) => error.refused(),
            Self::Declined(_) => true,
            Self::Contention { .. } | Self::Unanswered | Self::Misrouted => false,
        }
    }
}
