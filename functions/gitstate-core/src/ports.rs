//! The small traits the service needs from the outside world, and the types they speak.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::refs::Clash;
use crate::{BranchName, LockInfo, ReadContext, StateName};

/// Where states live: one repository and one branch of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Location {
    /// The repository URL (or, for the embedded default, its local path).
    pub repository: String,
    pub branch: BranchName,
}

/// A lock as it is stored, with an opaque token that identifies this very instance of it (for
/// git: the lock commit), so a release can be made conditional on nothing having changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLock {
    pub info: LockInfo,
    pub token: String,
    /// The gitstate user who took the lock, when the store knows it (locks taken by other tools
    /// have none).
    pub owner: Option<String>,
    /// When the lock was taken, in seconds since the Unix epoch, when the store knows it.
    pub created: Option<i64>,
}

/// Who a commit is written as and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitMeta {
    /// The authenticated user.
    pub author_name: String,
    pub author_email: String,
    /// The backend itself (`GITSTATE_COMMITTER_NAME`).
    pub committer_name: String,
    pub committer_email: String,
    pub message: String,
}

/// Outcome of a create-only lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    Acquired,
    Held(HeldLock),
    /// Nothing was written: the name clashes with the branch's tree or with another lock ref.
    Clash(Clash),
}

/// Outcome of a conditional release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    Released,
    /// The lock is no longer the one that was read (released or re-taken meanwhile).
    Changed,
}

/// What a write does to the state file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Put(Bytes),
    Delete,
}

/// Why the service refuses a write after looking at what is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Someone holds the lock and the write did not name it.
    Locked(HeldLock),
    /// The write names a lock ID that is not the holder's.
    LockMismatch(HeldLock),
    /// The write names a lock ID but nobody holds the lock.
    NotLocked { id: String },
    /// Same lineage, lower serial than what is stored.
    Stale { stored: u64, sent: u64 },
    /// The write holds no lock (no lock ID, nobody holds the lock) and the deployment does not
    /// allow unlocked writes.
    Unlocked,
    /// Delete of a state that does not exist.
    NotFound,
    /// Create-only write of a file that already exists.
    Exists,
    /// The stored state is encrypted: the service must open it (asynchronously, with keys)
    /// before it can judge the write; it retries with what it learnt.
    Sealed(Bytes),
    /// Encryption is enforced and the stored state is not under the configured keys.
    Unprotected { format: &'static str },
    /// The name clashes with the tree the commit would be built on (checked by the store before
    /// the plan, against that very tree).
    Clash(Clash),
    /// The state's file in the store was changed outside the backend since its newest writes
    /// were kept apart from it (a git state ref): a person must settle which is the state.
    Diverged,
}

/// The stored state a plan judges: its bytes, and an id of exactly these bytes when the store
/// has one (git: the blob id). By the id the service knows a sealed state it opened or wrote
/// before, without opening it again.
#[derive(Debug, Clone, Copy)]
pub struct Stored<'a> {
    pub content: &'a [u8],
    pub id: Option<&'a str>,
}

/// The service's decision on a write, taken against the freshest lock and state the store has
/// read (again on every retry): refuse it, or say what the commit records.
pub type WritePlan =
    Arc<dyn Fn(Option<&HeldLock>, Option<Stored<'_>>) -> Result<CommitMeta, Refusal> + Send + Sync>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// The change is on the branch; `version` identifies it (for git: the commit id), and
    /// `content` the bytes written, when the store has such an id (see [`Stored::id`]).
    Committed {
        version: String,
        content: Option<String>,
    },
    /// Nothing to do: the stored bytes already equal the new ones.
    Unchanged,
    Refused(Refusal),
}

/// One commit that changed a state file, as the store's history holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revision {
    /// The version id (for git: the commit id).
    pub version: String,
    /// Commit time, seconds since the Unix epoch.
    pub time: i64,
    pub author: String,
    pub message: String,
    /// The commit removed the file.
    pub deleted: bool,
}

/// A page of a state's history, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryPage {
    pub revisions: Vec<Revision>,
    /// Older revisions exist beyond this page.
    pub more: bool,
}

/// The user recorded in a commit message's trailers, if any (see [`crate::trailers`]).
pub use crate::trailers::user_of as user_from_message;

pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// How a stored state stands against the configured encryption keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    /// Not under any configured key (plaintext, a passphrase, foreign keys).
    Unprotected,
    /// Under a configured key, but not as a write would seal it now: `rekey` rewrites it.
    Partly,
    /// Sealed exactly as a write would seal it now.
    Current,
}

/// Whether a location's branch exists, and if not what its repository holds instead: a branch
/// is created only in an empty repository or where the deployment says so
/// (`GITSTATE_CREATE_REF`), never by the first write of a misconfigured backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BranchStatus {
    Exists,
    Missing {
        /// The branch the remote's `HEAD` names (its default branch), when it says.
        default: Option<String>,
        /// The repository's other refs, gitstate's lock refs and `refs/gitstate/` left out
        /// (none: an empty repository, where the first write may create the branch).
        others: Vec<String>,
    },
}

/// What [`StateStore::branches_with_states`] looks for on a repository's other branches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beside<'a> {
    /// Any state: a tip with the state index ([`crate::index::INDEX_PATH`]) or a `.tfstate`
    /// file (states another tool, or a version before the index, wrote).
    States,
    /// A file at this name or a [`crate::refs::near_name`] of it, on a tip without the index
    /// (terraform-backend-git's states have any name, most often `.json`; gitstate's branches,
    /// environments among them, share names by design).
    SeedState(&'a StateName),
    /// Asked for a branch that holds no states itself (none when its own tip has the index or
    /// a `.tfstate` file, or it has states' refs: then a name it lacks is a new state there):
    /// the branches that hold states instead, and with a name, also those with a file at it
    /// or at a near name of it (the seed's states have any name).
    Instead(Option<&'a StateName>),
    /// As `Instead(None)`, for a write's check behind the read that looked: none, with no
    /// request, where this process knows no tip of the branch or a look of its found no other
    /// branch holding states at the tip it knows; otherwise (no look made, or one that would
    /// refuse, which may be stale) the look is made again.
    Remembered,
}

/// A stored state, opened.
#[derive(Debug, Clone)]
pub struct Opened {
    pub plaintext: Bytes,
    pub protection: Protection,
    /// How it was stored, for messages (e.g. `sops binary mode`, `unencrypted`).
    pub format: &'static str,
}

/// Failures to seal or open a state. None of them is the client's fault.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("the key service is unavailable")]
    Unavailable(#[source] BoxError),
    #[error("the key service refused the state's key")]
    Refused(#[source] BoxError),
    #[error("the stored state failed its integrity check")]
    Integrity(#[source] BoxError),
    /// The stored state is sealed under none of the deployment's keys (nothing was unwrapped).
    #[error("the stored state names none of the configured KMS keys")]
    ForeignKey(#[source] BoxError),
    #[error("the stored state cannot be read")]
    Unreadable(#[source] BoxError),
}

/// Encryption at rest: what every state goes through on its way to and from the store. The
/// location and name are bound into the encryption, so a state copied elsewhere will not open.
#[async_trait]
pub trait Sealer: Send + Sync + 'static {
    /// Whether writes are sealed (otherwise they are stored as sent).
    fn seals(&self) -> bool;

    /// Cheap and synchronous: do these stored bytes need keys to open?
    fn is_sealed(&self, stored: &[u8]) -> bool;

    async fn seal(
        &self,
        plaintext: &[u8],
        at: &Location,
        name: &StateName,
    ) -> Result<Bytes, SealError>;

    async fn open(
        &self,
        stored: Bytes,
        at: &Location,
        name: &StateName,
    ) -> Result<Opened, SealError>;
}

/// Failures of the storage itself, never of the client's request.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The remote could not be reached or answered with a transient failure.
    #[error("the git remote is unavailable")]
    Unavailable(#[source] BoxError),
    /// The remote answered, but not as a git server should (or refused our credentials).
    #[error("the git remote answered unexpectedly")]
    Remote(#[source] BoxError),
    /// The remote lacks what this deployment insists on (e.g. atomic push with
    /// `GITSTATE_REQUIRE_ATOMIC=true`); the reason names the setting and is shown to the client.
    #[error("the git remote cannot be used as configured: {0}")]
    Incompatible(String),
    /// Other writers kept moving the branch; the client may retry.
    #[error("the branch kept moving after {attempts} attempts")]
    Contention { attempts: u32 },
    /// This backend's `setting` differs from the value the repository records (another
    /// deployment locks elsewhere): it refuses to lock, naming both.
    #[error(
        "this backend's {setting} is {ours:?}, but the repository records {recorded:?} (the deployment that locked first): set {setting}={recorded} here, or every backend on the repository would not see the others' locks"
    )]
    ProtocolMismatch {
        setting: &'static str,
        ours: String,
        recorded: String,
    },
    /// What is stored cannot be read back (a lock file without an ID, an unreadable object).
    #[error("stored data is unreadable: {0}")]
    Corrupt(String),
    #[error("internal storage failure")]
    Internal(#[source] BoxError),
    /// The state's file was changed outside the backend while the backend keeps the state apart
    /// from it (a git state ref): a person must settle which is the state.
    #[error("the state was changed outside gitstate while gitstate keeps it apart")]
    Diverged,
    /// The branch (`branch`) and `of` (short names) keep the same states, one a copy of the
    /// other: serving them here would act on the other's resources.
    #[error(
        "branches {branch:?} and {of:?} keep the same states (one is a copy of the other: the same commit, or the same lineages): a plan on either would act on the other's resources; delete the copy, or start it again from an orphan commit holding the empty index .gitstate/index.json"
    )]
    Copied { branch: String, of: String },
}

/// What a list of states reads: the state files at the branch tip, the index, the locks.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    /// Every state file at the tip, with an id of its content (git: the blob id) when the store
    /// has one.
    pub files: Vec<(StateName, Option<String>)>,
    /// The index file ([`crate::index::INDEX_PATH`]) at that tip.
    pub index: Option<Bytes>,
    pub locks: Vec<(StateName, HeldLock)>,
}

/// Storage of states and locks, keyed by location and state name.
#[async_trait]
pub trait StateStore: Send + Sync + 'static {
    /// The state `name`; `read` says what the request it serves allows the store to reuse.
    async fn read_state(
        &self,
        at: &Location,
        name: &StateName,
        read: &ReadContext,
    ) -> Result<Option<Bytes>, StoreError>;

    async fn read_lock(
        &self,
        at: &Location,
        name: &StateName,
    ) -> Result<Option<HeldLock>, StoreError>;

    /// How `name` clashes with the files at the branch tip (a state below which it lies, or one
    /// inside the folder it names), if it does.
    async fn clash(&self, at: &Location, name: &StateName) -> Result<Option<Clash>, StoreError>;

    /// [`Self::clash`] for a name a read just found absent, judged at the branch tip that read
    /// saw where the store keeps it (so it asks the remote nothing more).
    async fn clash_seen(
        &self,
        at: &Location,
        name: &StateName,
    ) -> Result<Option<Clash>, StoreError> {
        self.clash(at, name).await
    }

    /// Create the lock if and only if no lock exists; otherwise report the holder. A lock whose
    /// ref would clash with another lock ref, or whose name clashes with the branch's tree, is
    /// not created ([`Acquire::Clash`]).
    async fn acquire_lock(
        &self,
        at: &Location,
        name: &StateName,
        lock: &LockInfo,
        meta: &CommitMeta,
    ) -> Result<Acquire, StoreError>;

    /// The lock on `name` as this store last made it, known without asking the remote (the
    /// protocol floor): it may have changed since, so only a [`Self::release_lock`] of it, which
    /// is conditional, may rest on it. `None` (the default): read it with [`Self::read_lock`].
    async fn known_lock(
        &self,
        _at: &Location,
        _name: &StateName,
    ) -> Result<Option<HeldLock>, StoreError> {
        Ok(None)
    }

    /// Remove the lock if it is still exactly `held`.
    async fn release_lock(
        &self,
        at: &Location,
        name: &StateName,
        held: &HeldLock,
    ) -> Result<Release, StoreError>;

    /// Apply `change` if `plan` accepts the current lock and state; never loses another writer's
    /// change to the same branch. A name that clashes with the tree the commit would be built on
    /// is refused ([`Refusal::Clash`]) before the plan is asked.
    async fn write_state(
        &self,
        at: &Location,
        name: &StateName,
        change: Change,
        plan: WritePlan,
    ) -> Result<Written, StoreError>;

    /// The revisions of `name` on the branch, newest first: `skip` of them passed over, at most
    /// `limit` returned. A shallow store deepens its history as far as the page needs.
    async fn history(
        &self,
        at: &Location,
        name: &StateName,
        skip: usize,
        limit: usize,
    ) -> Result<HistoryPage, StoreError>;

    /// The content of `name` as revision `version` left it (`None`: no such revision or file).
    async fn read_version(
        &self,
        at: &Location,
        name: &StateName,
        version: &str,
    ) -> Result<Option<Bytes>, StoreError>;

    /// Every lock held on states of this location.
    async fn list_locks(&self, at: &Location) -> Result<Vec<(StateName, HeldLock)>, StoreError>;

    /// The state files on the branch whose path starts with `prefix` (the backend's own
    /// configuration under `.gitstate/` excluded).
    async fn list_states(&self, at: &Location, prefix: &str) -> Result<Vec<StateName>, StoreError>;

    /// The state files, the index and the locks, as one read sees them (an answer of the remote
    /// `read` allows reusing may serve). The default lists files and locks without content ids
    /// or index.
    async fn listing(&self, at: &Location, _read: &ReadContext) -> Result<Listing, StoreError> {
        let files = self.list_states(at, "").await?;
        Ok(Listing {
            files: files.into_iter().map(|name| (name, None)).collect(),
            index: None,
            locks: self.list_locks(at).await?,
        })
    }

    /// The newest revision of each of `names` on the branch (names never written are left out;
    /// an answer of the remote `read` allows reusing may serve). The default asks the history
    /// of each; a store can find them all in one walk.
    async fn last_changes(
        &self,
        at: &Location,
        names: &[StateName],
        _read: &ReadContext,
    ) -> Result<Vec<(StateName, Revision)>, StoreError> {
        let mut found = Vec::new();
        for name in names {
            if let Some(revision) = self.history(at, name, 0, 1).await?.revisions.pop() {
                found.push((name.clone(), revision));
            }
        }
        Ok(found)
    }

    /// Whether the branch of `at` exists, and if not, the repository's default branch and other
    /// refs (within a request, from an answer `read` allows reusing). The default says it exists
    /// (a store without branches).
    async fn branch_status(
        &self,
        _at: &Location,
        _read: &ReadContext,
    ) -> Result<BranchStatus, StoreError> {
        Ok(BranchStatus::Exists)
    }

    /// Branches (short names) whose states' refs remain in the repository of `at` though the
    /// branch is gone (renamed or deleted outside gitstate): writes those refs hold that were
    /// never folded are seen by no backend. For start-up checks, from the look `read` allows
    /// reusing. The default: none (a store without branches).
    async fn stranded_state_refs(
        &self,
        _at: &Location,
        _read: &ReadContext,
    ) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }

    /// Which branches of the repository of `at`, other than its own, hold what `look` asks
    /// for (full ref names). Asked only on the paths where a read or a first write would
    /// otherwise see "no state" beside states kept elsewhere. The default: none (a store
    /// without branches).
    async fn branches_with_states(
        &self,
        _at: &Location,
        _look: Beside<'_>,
        _read: &ReadContext,
    ) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }

    /// Before the first request of a process that is about to write to `at` (the wrapper, as it
    /// starts): learn what its first push needs in one look (within the request `read` stands
    /// for, so that the start-up's other looks reuse it). `Ok(Some(reason))`: that look failed,
    /// and pushes may be refused (a token that may only read); reads go on. The default: a store
    /// with nothing to learn.
    async fn ready_to_write(
        &self,
        _at: &Location,
        _read: &ReadContext,
    ) -> Result<Option<String>, StoreError> {
        Ok(None)
    }

    /// Before the first request of such a process: take up what the last one on the same cache
    /// kept for `at` (see [`Self::keep_session`]), if it is younger than `within`. `true`: the
    /// first push needs no look first, so [`Self::ready_to_write`] may be skipped. The default:
    /// nothing is kept.
    async fn resume_session(
        &self,
        _at: &Location,
        _within: std::time::Duration,
    ) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// After such a process served its program (`keep`: the program succeeded): keep for the
    /// next process on the same cache what its first push needs, or, `keep == false`, forget
    /// what was kept, so that the next one looks. The default: nothing to keep.
    async fn keep_session(&self, _at: &Location, _keep: bool) -> Result<(), StoreError> {
        Ok(())
    }

    /// Replay the writes kept on the states' own refs onto the branch (see [`crate::fold`]).
    /// The default: a store without such refs has nothing to fold.
    async fn fold(&self, _at: &Location) -> Result<crate::fold::FoldReport, StoreError> {
        Ok(crate::fold::FoldReport::default())
    }

    /// Wait until the folds this process runs in the background are done (a wrapper before it
    /// exits). The default: there are none.
    async fn finish_folds(&self) {}

    /// How this store's protocol settings (where locks live) stand against the repository's
    /// record of them ([`crate::protocol`]), read without recording anything. The default: a
    /// store without such settings agrees.
    async fn protocol(&self, _at: &Location) -> Result<crate::protocol::Protocol, StoreError> {
        Ok(crate::protocol::Protocol::Agrees)
    }

    /// A file of the backend's own configuration (e.g. the access file) at the branch tip.
    /// A process that saw the tip less than `fresh_within` ago may answer from that tip without
    /// asking the remote again; otherwise the state `read` names may come along with it.
    async fn read_config(
        &self,
        at: &Location,
        path: &str,
        fresh_within: std::time::Duration,
        read: &ReadContext,
    ) -> Result<Option<Bytes>, StoreError>;

    /// Commit a configuration file if, and only if, it does not exist yet. Returns whether it
    /// was written.
    async fn create_config(
        &self,
        at: &Location,
        path: &str,
        content: Bytes,
        meta: &CommitMeta,
    ) -> Result<bool, StoreError>;

    /// Commit `content` as a configuration file if, and only if, the file still holds exactly
    /// `expected` (`None`: does not exist), so a change made since it was read is never lost.
    /// Returns whether it was written (`false`: the file changed meanwhile; read it again).
    /// The default can only create: a store that can change a configuration file says how.
    async fn replace_config(
        &self,
        at: &Location,
        path: &str,
        expected: Option<Bytes>,
        content: Bytes,
        meta: &CommitMeta,
    ) -> Result<bool, StoreError> {
        match expected {
            None => self.create_config(at, path, content, meta).await,
            Some(_) => Err(StoreError::Incompatible(format!(
                "this store cannot change {path} once it exists"
            ))),
        }
    }
}

/// The plan of a compare-and-swap of a configuration file: accept the write only while the
/// stored file is exactly `expected` (`None`: absent); otherwise refuse it as
/// [`Refusal::Exists`] (the file is not the one the change was made to).
pub fn replace_plan(expected: Option<Bytes>, meta: CommitMeta) -> WritePlan {
    Arc::new(move |_, stored: Option<Stored<'_>>| {
        if stored.map(|s| s.content) == expected.as_deref() {
            Ok(meta.clone())
        } else {
            Err(Refusal::Exists)
        }
    })
}
