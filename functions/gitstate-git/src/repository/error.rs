//! What fails in the repository or the cache: gix reading or writing it, a pack received into
//! it, what it holds that cannot be read back, the disk, and the blocking task its work runs on.

/// A failure of the cache or the embedded repository (the layer below the store).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("local git repository")]
    Git(#[from] gix::Error),
    #[error("received pack is invalid")]
    Pack(#[source] gix::Error),
    #[error("cache is corrupt: {0}")]
    Corrupt(Corruption),
    /// A ref name the embedded repository cannot hold.
    #[error("git protocol error: invalid ref name {0}")]
    RefName(String),
    #[error("git protocol error: too many objects for one pack")]
    TooManyObjects,
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The blocking task the repository's work ran on panicked or was cancelled.
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
    /// A state's own ref whose commit lacks the state's file while the branch has it: a ref
    /// gitstate did not make (a state commit's tree holds its one file), so neither "no
    /// state" nor the branch's older file is the answer.
    #[error(
        "the state ref {name} (commit {commit}) has no file {path}, but the branch has it: the ref was not made by gitstate; delete it or point it at the state's newest commit"
    )]
    StateRef {
        name: String,
        commit: gix::ObjectId,
        path: String,
    },
    /// A path read as a file (a state, a configuration file) that the tree holds as something
    /// else, put there behind gitstate's back: never "no state".
    #[error("{path} is a {what} in the repository, not a file: replace it with the file itself")]
    NotAFile { path: String, what: &'static str },
    /// The fold record on the branch is not a record: folding from it could replay writes
    /// twice or refuse states wrongly, so no fold runs until a person mends it.
    #[error(
        ".gitstate/folded.json on the branch cannot be read ({0}): restore it from the branch's history, then fold again"
    )]
    FoldRecord(String),
}

impl Error {
    /// Something the remote cannot be sent (a ref name, a pack too large): git's protocol does
    /// not allow it.
    pub fn garbled(&self) -> bool {
        match self {
            Self::RefName(_) | Self::TooManyObjects => true,
            Self::Git(_) | Self::Pack(_) | Self::Corrupt(_) | Self::Io(_) | Self::Join(_) => false,
        }
    }

    /// What is unreadable, when that is the failure.
    pub fn corruption(&self) -> Option<&Corruption> {
        match self {
            Self::Corrupt(what) => Some(what),
            _ => None,
        }
    }
}

impl From<Corruption> for Error {
    fn from(what: Corruption) -> Self {
        Self::Corrupt(what)
    }
}
