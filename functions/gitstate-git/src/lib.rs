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

/// Failures inside the git adapter; mapped once onto the core's [`StoreError`] (`Class::of`).
///
/// Each operation on the remote has its own error ([`transport::ConnectError`],
/// [`protocol::AdvertError`], [`protocol::FetchError`], [`protocol::PushError`]), with the
/// wire's ([`transport::Error`]) as its source; the store's decisions read their variants.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The wire failed outside any one operation.
    #[error(transparent)]
    Wire(transport::Error),
    #[error("configuration: {0}")]
    Connect(transport::ConnectError),
    #[error(transparent)]
    Advert(#[from] protocol::AdvertError),
    #[error(transparent)]
    Fetch(#[from] protocol::FetchError),
    #[error(transparent)]
    Push(#[from] protocol::PushError),
    #[error(
        "the git remote does not offer atomic push and GITSTATE_REQUIRE_ATOMIC=true refuses such remotes"
    )]
    AtomicRequired,
    /// A fetch answered with a pack that lacks what was asked for (`commits`, `blobs`).
    #[error("git remote reports: the fetch did not deliver the requested {0}")]
    Undelivered(&'static str),
    /// Every create of a lock ref was refused, with no lock there to explain it.
    #[error("git remote reports: the remote kept refusing to create {lock_ref} ({report})")]
    LockRefused { lock_ref: String, report: String },
    /// A write's push was refused twice on a branch that did not move: the remote declines it.
    #[error("git remote reports: the remote refused the push on an unchanged branch: {0}")]
    Declined(String),
    /// A ref name the embedded repository cannot hold.
    #[error("git protocol error: invalid ref name {0}")]
    RefName(String),
    #[error("git protocol error: too many objects for one pack")]
    TooManyObjects,
    #[error("local git repository")]
    Git(#[from] gix::Error),
    #[error("received pack is invalid")]
    Pack(#[source] gix::Error),
    #[error("cache is corrupt: {0}")]
    Corrupt(Corruption),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("background task failed")]
    Join(#[from] tokio::task::JoinError),
}

/// What the cache or the repository holds that cannot be read back.
#[derive(Debug, thiserror::Error)]
pub enum Corruption {
    #[error("tree {id}: {why}")]
    Tree { id: gix::ObjectId, why: String },
    #[error("listing references: {0}")]
    ListingRefs(String),
    #[error("reading a reference: {0}")]
    Reference(String),
    /// A first-parent walk met a commit whose parent is missing below a complete history.
    #[error("history has a missing parent commit")]
    MissingParent,
    /// A walk stopped at a shallow boundary, and the next walk found none.
    #[error("history boundary moved")]
    BoundaryMoved,
    /// The stand-in for a lock ref without a readable lock file could not be made.
    #[error("{0}")]
    LockInfo(String),
    /// A commit whose people or times cannot be read (a fold reads them to replay it).
    #[error("commit {id}: {why}")]
    Commit { id: gix::ObjectId, why: String },
    /// A walk of the history that could not go on.
    #[error("walking the history: {0}")]
    Walk(String),
    /// The index of a pack just received cannot be read back.
    #[error("the index of a received pack: {0}")]
    PackIndex(String),
    /// The fold record on the branch is not a record: folding from it could replay writes
    /// twice or refuse states wrongly, so no fold runs until a person mends it.
    #[error(
        ".gitstate/folded.json on the branch cannot be read ({0}): restore it from the branch's history, then fold again"
    )]
    FoldRecord(String),
}

impl Error {
    /// The wire's failure under any operation's error, if that is what this is.
    pub fn wire(&self) -> Option<&transport::Error> {
        match self {
            Self::Wire(wire) => Some(wire),
            Self::Advert(error) => error.wire(),
            Self::Fetch(error) => error.wire(),
            Self::Push(error) => error.wire(),
            _ => None,
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
            Self::Undelivered(_) | Self::LockRefused { .. } | Self::Declined(_) => true,
            Self::Connect(_)
            | Self::AtomicRequired
            | Self::RefName(_)
            | Self::TooManyObjects
            | Self::Git(_)
            | Self::Pack(_)
            | Self::Corrupt(_)
            | Self::Io(_)
            | Self::Join(_) => false,
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
            Self::RefName(_) | Self::TooManyObjects => true,
            Self::Connect(_)
            | Self::AtomicRequired
            | Self::Undelivered(_)
            | Self::LockRefused { .. }
            | Self::Declined(_)
            | Self::Git(_)
            | Self::Pack(_)
            | Self::Corrupt(_)
            | Self::Io(_)
            | Self::Join(_) => false,
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

impl From<transport::Error> for Error {
    fn from(error: transport::Error) -> Self {
        Self::Wire(error)
    }
}

impl From<transport::ConnectError> for Error {
    /// A client that could not be built stays what it was before there was a `ConnectError`:
    /// an HTTP failure.
    fn from(error: transport::ConnectError) -> Self {
        match error {
            transport::ConnectError::Client(e) => Self::Wire(transport::Error::Http(e)),
            other => Self::Connect(other),
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
                Error::Corrupt(what) => StoreError::Corrupt(what.to_string()),
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
                Self::Corrupt(what) => what.to_string(),
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
            Error::Wire(wire) => Self::of_wire(wire),
            Error::Advert(_) | Error::Fetch(_) | Error::Push(_) => {
                error.wire().map_or(Self::Remote, Self::of_wire)
            }
            Error::Undelivered(_)
            | Error::LockRefused { .. }
            | Error::Declined(_)
            | Error::RefName(_)
            | Error::TooManyObjects
            | Error::Pack(_) => Self::Remote,
            Error::AtomicRequired => Self::Incompatible,
            Error::Corrupt(_) => Self::Corrupt,
            Error::Connect(_) | Error::Git(_) | Error::Io(_) | Error::Join(_) => Self::Internal,
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

#[cfg(test)]
mod tests {
    use gitstate_core::ports::StoreError;

    use super::{Corruption, Error};

    /// The store's own failures keep the texts and kinds they had as string variants: the
    /// remote's refusals transient, what the remote cannot be sent garbled, both the remote's
    /// fault (502); corruption says what is unreadable; each echoed to another caller as the
    /// same kind of error.
    #[test]
    fn the_stores_own_failures_keep_their_texts_and_kinds() {
        let remote = |error: &StoreError| matches!(error, StoreError::Remote(_));
        type Case = (fn() -> Error, &'static str, bool, bool);
        let cases: [Case; 5] = [
            (
                || Error::Undelivered("commits"),
                "git remote reports: the fetch did not deliver the requested commits",
                true,
                false,
            ),
            (
                || Error::LockRefused {
                    lock_ref: "refs/heads/locks/a".into(),
                    report: "r".into(),
                },
                "git remote reports: the remote kept refusing to create refs/heads/locks/a (r)",
                true,
                false,
            ),
            (
                || Error::Declined("hook".into()),
                "git remote reports: the remote refused the push on an unchanged branch: hook",
                true,
                false,
            ),
            (
                || Error::RefName("refs/x..y".into()),
                "git protocol error: invalid ref name refs/x..y",
                false,
                true,
            ),
            (
                || Error::TooManyObjects,
                "git protocol error: too many objects for one pack",
                false,
                true,
            ),
        ];
        for (make, text, refused, garbled) in cases {
            let error = make();
            assert_eq!(error.to_string(), text);
            assert_eq!(error.refused(), refused, "{text}");
            assert_eq!(error.is_transient(), refused, "{text}");
            assert_eq!(error.garbled(), garbled, "{text}");
            assert!(error.wire().is_none() && error.status().is_none(), "{text}");
            assert!(remote(&error.echo()), "{text}");
            assert!(remote(&StoreError::from(make())), "{text}");
        }
        let corrupt = || Error::Corrupt(Corruption::MissingParent);
        assert_eq!(
            corrupt().to_string(),
            "cache is corrupt: history has a missing parent commit"
        );
        for store_error in [StoreError::from(corrupt()), corrupt().echo()] {
            assert!(
                matches!(&store_error, StoreError::Corrupt(what) if what == "history has a missing parent commit"),
                "{store_error:?}"
            );
        }
        assert!(matches!(
            StoreError::from(Error::AtomicRequired),
            StoreError::Incompatible(_)
        ));
        assert!(!Error::AtomicRequired.is_transient());
    }
}
