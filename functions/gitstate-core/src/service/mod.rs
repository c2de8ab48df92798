//! The rules of the backend, independent of HTTP and git: one module per concern.
//!
//! - `state`: read, write and delete states (the lock and stale-serial rules of a write);
//! - `lock`: take, release and list locks, and [`Backend::under_lock`] for operations that lock;
//! - `history`: a state's revisions and reading one;
//! - `rekey`, `restore`: the administrators' rewrites, each under the state's lock;
//! - `overview`: the lists and pages of the console and `GET /states`.

use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;

use crate::access::{Caller, Denied, Role};
use crate::ports::{
    BranchStatus, CommitMeta, HeldLock, Location, Opened, Protection, Refusal, SealError, Sealer,
    StateStore, StoreError,
};
use crate::refs::{Clash, RefPolicy, RefRefused};
use crate::{BranchName, LockInfoError, NameError, ReadContext, StateName};

mod branches;
mod history;
mod lock;
mod overview;
mod rekey;
mod restore;
mod sealed;
mod state;

pub use history::{MAX_PAGE, MIN_PREFIX, Selector, VersionInfo, match_prefix};
pub use overview::{CurrentResource, StatePage, StateRow, VersionChanges};
pub use rekey::Rekeyed;
pub use restore::Restored;
pub use state::WriteRequest;

/// Everything that can go wrong in a request, client mistakes and storage failures alike.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("invalid state name: {0}")]
    Name(#[from] NameError),
    #[error("invalid ref: {0}")]
    Branch(#[source] NameError),
    #[error("{0}")]
    LockBody(#[from] LockInfoError),
    #[error("state is not valid JSON: {0}")]
    InvalidState(String),
    /// A lock request sent to a state's address: Terraform with `lock_address` (or
    /// `unlock_address`) set to the state's address and `lock_method = "POST"` or
    /// `unlock_method = "DELETE"`. Taken as a write, it would replace the state with the lock.
    #[error(
        "this request is meant for the lock ({0}): point lock_address and unlock_address at /locks/<name>, not at the state's address"
    )]
    LockRequestToState(&'static str),
    /// The stored file is not a Terraform state (empty, or not a JSON object): never "no state".
    #[error(
        "the stored file is not a state ({0}): fix or remove it in the repository, or restore a good revision"
    )]
    NotAState(&'static str),
    /// The branch a request resolves to does not exist, and the repository has other branches:
    /// a write would start a new branch beside the states (reads would see none).
    #[error(
        "branch {branch:?} does not exist in the repository, which has other branches{}: set {setting} to the branch the states are on, or GITSTATE_CREATE_REF=true on the backend to create {branch:?} with the first write",
        default.as_ref().map(|d| format!(" (its default branch is {d:?})")).unwrap_or_default()
    )]
    NoBranch {
        branch: String,
        default: Option<String>,
        /// What chose the branch: `GITSTATE_REF` or the request's `?ref=`.
        setting: &'static str,
    },
    /// A state absent from the branch an address resolved to, held by another branch the
    /// address most likely meant (terraform-backend-git's default, for its address format
    /// without `ref=`): planning against "no state" would start it anew beside the real one.
    #[error(
        "state {name:?} is not on branch {branch:?} but is on {elsewhere:?}, terraform-backend-git's default branch: an address without ref= reads the backend's branch (GITSTATE_REF); add ref={elsewhere} to the address (and the branch to GITSTATE_ALLOWED_REFS), or set GITSTATE_REF={elsewhere}"
    )]
    OnAnotherBranch {
        name: String,
        branch: String,
        elsewhere: String,
    },
    /// `GITSTATE_CREATE_REF` is set, and other branches of the repository hold states (their
    /// tips have the state index or `.tfstate` files, or a file by the name read): the first
    /// write would start the configured branch beside them (a typo in `GITSTATE_REF`, a renamed
    /// branch), or started it, and reads see no state there.
    #[error(
        "GITSTATE_CREATE_REF=true starts branch {branch:?} (GITSTATE_REF) only in a repository where no other branch holds states, and {} hold them (or a file by this state's name, or a near one); set GITSTATE_REF to the branch the states are on, or create {branch:?} with git and unset GITSTATE_CREATE_REF if a new branch of states is meant",
        quoted(holding)
    )]
    BranchBesideStates {
        branch: String,
        holding: Vec<String>,
    },
    /// The configured branch holds no states at all (no index, no `.tfstate` file, no states'
    /// refs) while other branches do, or hold a file by the name read (or a near one):
    /// `GITSTATE_REF` names the wrong branch (a redeploy's default, a code branch), and
    /// planning against "no state" would create every resource anew, or a first write would
    /// start states there that hide the others from every later read.
    #[error(
        "branch {branch:?} (GITSTATE_REF) holds no states while {} hold them, so no state is read as absent nor written there; set GITSTATE_REF to the branch the states are on, or, if {branch:?} is to keep states of its own beside them, commit an empty state index to it first: .gitstate/index.json holding {{\"format\":1,\"states\":{{}}}}",
        quoted(holding)
    )]
    StatesElsewhere {
        branch: String,
        holding: Vec<String>,
    },
    #[error("repository {0:?} is not served by this backend (not on its allowlist)")]
    RepositoryNotAllowed(String),
    #[error(transparent)]
    RefNotAllowed(#[from] RefRefused),
    #[error("the name cannot be used: {0}")]
    Clash(Clash),
    #[error("state is locked by {} (lock ID {})", .0.info.who(), .0.info.id())]
    Locked(HeldLock),
    #[error("lock ID does not match the holder's {}", .0.info.id())]
    LockMismatch(HeldLock),
    /// A write without a lock while nobody holds it, and unlocked writes are not allowed.
    #[error(
        "this write holds no lock: set lock_address and unlock_address (/locks/<name>) in the backend block and do not use -lock=false (an operator may allow unlocked writes with GITSTATE_ALLOW_UNLOCKED_WRITES=true)"
    )]
    Unlocked,
    #[error("lock {id} is not held: take the lock again before writing")]
    NotLocked { id: String },
    #[error(
        "stale write refused: serial {sent} is lower than the stored serial {stored} of the same lineage"
    )]
    Stale { stored: u64, sent: u64 },
    #[error("no state stored under this name")]
    NotFound,
    /// `GET /locks/<name>` while nobody holds the lock. Never 404: Terraform pointed at the lock's
    /// address would read "no state" and plan against an empty one.
    #[error(
        "no lock held on this state; this is the lock's address: Terraform's address for the state is /states/<name>"
    )]
    NoLock,
    #[error("already exists")]
    Exists,
    /// An unknown `?at=`/`?restore=` revision: not "no state" either.
    #[error(
        "no such revision of this state: {0}; /history/<name> lists the revisions: Terraform's address for the state is /states/<name>"
    )]
    NoSuchVersion(String),
    #[error(
        "{0:?} is neither a serial nor a commit id (all of its 40 hex digits, or the first 7 or more)"
    )]
    BadSelector(String),
    /// A commit-id prefix (or a number that is also a serial) naming several revisions.
    #[error(
        "{prefix:?} is the start of {count} revisions of this state: give more of the commit id"
    )]
    AmbiguousVersion { prefix: String, count: usize },
    /// A serial that several revisions hold (an older serial pushed again with `-force`, a new
    /// lineage, a state removed and written again): reading or restoring one of them would be a
    /// guess. The reason lists them, newest first, for the caller to name one by its id.
    #[error(
        "serial {serial} names {count} revisions of {state}: name one by its commit id (?at=<id>, ?restore=<id>, or <state>@<id> with the CLI): {listed}",
        count = .revisions.len(),
        listed = short_ids(.revisions)
    )]
    SharedSerial {
        serial: u64,
        state: String,
        revisions: Vec<String>,
    },
    #[error(transparent)]
    Forbidden(#[from] Denied),
    #[error(transparent)]
    Store(StoreError),
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error(
        "the stored state is {format}, not encrypted with the configured KMS keys, and encryption is enforced: an operator must run `gitstate rekey`"
    )]
    Unprotected { format: &'static str },
    #[error("no KMS key is configured (GITSTATE_KMS_KEY_IDS)")]
    NoKeys,
    /// A stored state sealed with sops or terraform-backend-git's aes mode, read by a backend
    /// configured with no keys at all.
    #[error(
        "the state is encrypted (sops, or terraform-backend-git's aes mode) and this backend has no keys configured: set the keys of the deployment that wrote it (GITSTATE_KMS_KEY_IDS, GITSTATE_AGE_RECIPIENTS with GITSTATE_AGE_IDENTITY, or GITSTATE_PGP_FINGERPRINTS), or GITSTATE_PASSPHRASE for the aes mode"
    )]
    SealedWithoutKeys,
    #[error(
        "the state's file on the branch was changed outside gitstate (edited, removed, the branch pushed back or deleted) after its newest writes went to its state ref: a person settles which of them is the state (docs/operating.md, state refs)"
    )]
    Diverged,
}

/// Branch names in a reason, each quoted.
fn quoted(names: &[String]) -> String {
    let quoted: Vec<String> = names.iter().map(|name| format!("{name:?}")).collect();
    quoted.join(", ")
}

/// Revisions shown in a reason: the first few, 12 hex digits each, then how many more.
const SHOWN_IDS: usize = 8;

fn short_ids(ids: &[String]) -> String {
    let shown: Vec<&str> = ids
        .iter()
        .take(SHOWN_IDS)
        .map(|id| id.get(..12).unwrap_or(id))
        .collect();
    match ids.len().saturating_sub(SHOWN_IDS) {
        0 => shown.join(", "),
        more => format!(
            "{} and {more} more (/history/<name> lists them)",
            shown.join(", ")
        ),
    }
}

impl From<StoreError> for ServiceError {
    /// A state changed outside the backend is the refusal a write meets too: one answer.
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Diverged => Self::Diverged,
            other => Self::Store(other),
        }
    }
}

impl From<Refusal> for ServiceError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Locked(held) => Self::Locked(held),
            Refusal::LockMismatch(held) => Self::LockMismatch(held),
            Refusal::NotLocked { id } => Self::NotLocked { id },
            Refusal::Stale { stored, sent } => Self::Stale { stored, sent },
            Refusal::Unlocked => Self::Unlocked,
            Refusal::NotFound => Self::NotFound,
            Refusal::Exists => Self::Exists,
            Refusal::Unprotected { format } => Self::Unprotected { format },
            Refusal::Clash(clash) => Self::Clash(clash),
            Refusal::Diverged => Self::Diverged,
            // Only escapes when the stored state kept changing while it was being opened.
            Refusal::Sealed(_) => Self::Store(StoreError::Contention {
                attempts: MAX_OPENS,
            }),
        }
    }
}

/// A clash as the caller may be told it: the state in the way is named only when the caller may
/// read it (a 409 must not reveal states outside the caller's grants).
fn clash_for(caller: &Caller, clash: Clash) -> ServiceError {
    ServiceError::Clash(
        clash.told(|other| {
            StateName::parse(other).is_ok_and(|other| caller.may(Role::Read, &other))
        }),
    )
}

/// A store's refusal as the caller may be told it (see [`clash_for`]).
fn refused(caller: &Caller, refusal: Refusal) -> ServiceError {
    match refusal {
        Refusal::Clash(clash) => clash_for(caller, clash),
        other => other.into(),
    }
}

/// The name and e-mail address commits are written under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub email: String,
}

/// Which repositories and branches requests may address.
#[derive(Debug, Clone)]
pub struct Repositories {
    /// The configured repository; requests that name none use it.
    pub primary: String,
    pub default_branch: BranchName,
    /// Further repositories a request may name (the seed tool's `repository=` parameter).
    pub allowed: Vec<String>,
}

impl Repositories {
    fn find(&self, url: &str) -> Option<&str> {
        let wanted = normalise(url);
        std::iter::once(&self.primary)
            .chain(&self.allowed)
            .find(|known| normalise(known) == wanted)
            .map(String::as_str)
    }
}

/// Compare repository URLs without caring for a trailing slash or `.git`.
fn normalise(url: &str) -> &str {
    let url = url.trim_end_matches('/');
    url.strip_suffix(".git").unwrap_or(url)
}

/// The backend: the rules, over a store.
pub struct Backend {
    store: Arc<dyn StateStore>,
    repositories: Repositories,
    /// Which branches `?ref=` may name.
    refs: RefPolicy,
    committer: Identity,
    encryption: Option<Encryption>,
    /// Let writes without a lock through (`GITSTATE_ALLOW_UNLOCKED_WRITES`), each with a warning.
    unlocked_writes: bool,
    /// Let the first write create a missing branch in a repository that has others
    /// (`GITSTATE_CREATE_REF`).
    create_branches: bool,
    /// Repositories whose protocol record was seen agreeing (checked before an unlocked write).
    protocols: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Locations whose branch was seen to exist or allowed to be created (not looked for again:
    /// a write costs no request for it).
    branches: std::sync::Mutex<std::collections::HashSet<Location>>,
    memo: overview::Memo,
    /// Versions of sealed states this process opened or wrote, by stored id.
    sealed: Arc<sealed::SealedVersions>,
    /// Tells a sealed file by its shape, for a backend without keys (the encryption adapter's
    /// knowledge: [`Backend::with_sealed_files`]).
    looks_sealed: fn(&[u8]) -> bool,
}

/// Encryption at rest: every state passes through the sealer; lock and configuration files stay
/// plain.
#[derive(Clone)]
pub struct Encryption {
    pub sealer: Arc<dyn Sealer>,
    /// Refuse to serve or overwrite a state that is not under the configured keys.
    pub enforced: bool,
}

/// How often a write opens a stored state that keeps changing under it before giving up.
const MAX_OPENS: u32 = 4;

/// Lineage and serial of a Terraform state, when it has them (OpenTofu-encrypted states do not).
#[derive(Debug, Default, Clone, Deserialize)]
struct Version {
    lineage: Option<String>,
    serial: Option<u64>,
}

impl Version {
    fn of(bytes: &[u8]) -> Self {
        serde_json::from_slice(bytes).unwrap_or_default()
    }
}

impl Backend {
    pub fn new(
        store: Arc<dyn StateStore>,
        repositories: Repositories,
        committer: Identity,
    ) -> Self {
        Self {
            refs: RefPolicy::only(repositories.default_branch.clone()),
            store,
            repositories,
            committer,
            encryption: None,
            unlocked_writes: false,
            create_branches: false,
            branches: std::sync::Mutex::default(),
            protocols: std::sync::Mutex::default(),
            memo: overview::Memo::default(),
            sealed: Arc::default(),
            looks_sealed: |_| false,
        }
    }

    /// How a sealed file is told by its shape: a backend without keys neither serves one as a
    /// state nor writes over it ([`ServiceError::SealedWithoutKeys`]).
    pub fn with_sealed_files(mut self, looks_sealed: fn(&[u8]) -> bool) -> Self {
        self.looks_sealed = looks_sealed;
        self
    }

    /// Let `?ref=` name the branches `refs` allows (by default only the configured branch).
    pub fn with_refs(mut self, refs: RefPolicy) -> Self {
        self.refs = refs;
        self
    }

    /// Accept writes and deletes that hold no lock (by default they are refused with
    /// [`ServiceError::Unlocked`]); each one is logged as a warning.
    pub fn with_unlocked_writes(mut self, allow: bool) -> Self {
        self.unlocked_writes = allow;
        self
    }

    /// Let the first write create a missing branch in a repository that has other branches (by
    /// default only an empty repository's branch is created; otherwise [`ServiceError::NoBranch`]).
    pub fn with_branch_creation(mut self, allow: bool) -> Self {
        self.create_branches = allow;
        self
    }

    /// Whether the branch of `at` exists, and if not what the repository holds (for start-up
    /// checks: `serve`, `run` and `gitstate config` say what they found). A branch found is
    /// not looked for again (see [`Self::require_branch`]).
    pub async fn branch_status(
        &self,
        at: &Location,
        read: &ReadContext,
    ) -> Result<BranchStatus, ServiceError> {
        let status = self.store.branch_status(at, read).await?;
        if status == BranchStatus::Exists {
            self.branch_seen(at);
        }
        Ok(status)
    }

    /// Branches whose states' refs remain though the branch is gone, the configured one left
    /// out (its requests are refused on it): see
    /// [`crate::ports::StateStore::stranded_state_refs`].
    pub async fn stranded_state_refs(
        &self,
        at: &Location,
        read: &ReadContext,
    ) -> Result<Vec<String>, ServiceError> {
        let mut gone = self.store.stranded_state_refs(at, read).await?;
        gone.retain(|branch| branch != at.branch.as_str());
        Ok(gone)
    }

    /// Before a process that is about to write serves its first request (the wrapper, as it
    /// starts): see [`crate::ports::StateStore::ready_to_write`].
    pub async fn ready_to_write(
        &self,
        at: &Location,
        read: &ReadContext,
    ) -> Result<Option<String>, ServiceError> {
        Ok(self.store.ready_to_write(at, read).await?)
    }

    /// Before the first request of such a process: take up what the last one on the same cache
    /// kept (see [`crate::ports::StateStore::resume_session`]). The branch that note saw counts
    /// as seen, as in a process that saw it itself (one deleted since is the store's to tell).
    pub async fn resume_session(
        &self,
        at: &Location,
        within: std::time::Duration,
    ) -> Result<bool, ServiceError> {
        let resumed = self.store.resume_session(at, within).await?;
        if resumed {
            self.branch_seen(at);
        }
        Ok(resumed)
    }

    /// After such a process served its program: see
    /// [`crate::ports::StateStore::keep_session`].
    pub async fn keep_session(&self, at: &Location, keep: bool) -> Result<(), ServiceError> {
        Ok(self.store.keep_session(at, keep).await?)
    }

    /// How this backend's settings stand against the protocol the repository of `at` records
    /// (for start-up checks: `serve` and `run` refuse to start on
    /// [`crate::protocol::Protocol::Differs`]). Locks check it themselves.
    pub async fn protocol_status(
        &self,
        at: &Location,
    ) -> Result<crate::protocol::Protocol, ServiceError> {
        Ok(self.store.protocol(at).await?)
    }

    /// Before a write without a lock (allowed by `GITSTATE_ALLOW_UNLOCKED_WRITES`): the lock
    /// ref prefix the repository records is this backend's, as a LOCK would check. Once per
    /// repository and process (one upload-pack advertisement, on this non-default path only).
    async fn require_protocol(&self, at: &Location) -> Result<(), ServiceError> {
        if self
            .protocols
            .lock()
            .is_ok_and(|known| known.contains(&at.repository))
        {
            return Ok(());
        }
        match self.store.protocol(at).await? {
            crate::protocol::Protocol::Differs {
                setting,
                ours,
                recorded,
            } => Err(StoreError::ProtocolMismatch {
                setting,
                ours,
                recorded,
            }
            .into()),
            // Unrecorded: the first LOCK records it; unlocked writes do not look again.
            crate::protocol::Protocol::Agrees | crate::protocol::Protocol::Unrecorded => {
                if let Ok(mut known) = self.protocols.lock() {
                    known.insert(at.repository.clone());
                }
                Ok(())
            }
        }
    }

    /// Seal every state written from now on and open every state read.
    pub fn with_encryption(mut self, encryption: Encryption) -> Self {
        self.encryption = Some(encryption);
        self
    }

    /// Resolve the repository and branch a request addresses, refusing repositories that are not
    /// configured: the function's git credentials must never be pointed at arbitrary hosts.
    pub fn locate(
        &self,
        repository: Option<&str>,
        branch: Option<&str>,
    ) -> Result<Location, ServiceError> {
        let repository = match repository {
            None => self.repositories.primary.clone(),
            Some(url) => self
                .repositories
                .find(url)
                .ok_or_else(|| ServiceError::RepositoryNotAllowed(url.chars().take(200).collect()))?
                .to_owned(),
        };
        let branch = match branch {
            None => self.repositories.default_branch.clone(),
            Some(b) => {
                let branch = BranchName::parse(b).map_err(ServiceError::Branch)?;
                self.refs.check(&branch)?;
                branch
            }
        };
        Ok(Location { repository, branch })
    }

    /// The store this backend writes to.
    pub fn store(&self) -> &Arc<dyn StateStore> {
        &self.store
    }

    /// The identity commits are written under when no user is known.
    pub fn committer(&self) -> &Identity {
        &self.committer
    }

    /// Open a past revision: decrypted with the context it was written under, whatever the
    /// policy says of current states (history already holds what it holds).
    async fn open_revision(
        &self,
        at: &Location,
        name: &StateName,
        stored: Bytes,
    ) -> Result<Bytes, ServiceError> {
        match &self.encryption {
            Some(encryption) => Ok(encryption.sealer.open(stored, at, name).await?.plaintext),
            None if (self.looks_sealed)(&stored) => Err(ServiceError::SealedWithoutKeys),
            None => Ok(stored),
        }
    }

    /// Open a stored state, enforcing the encryption policy.
    async fn open(
        &self,
        at: &Location,
        name: &StateName,
        stored: Bytes,
    ) -> Result<Opened, ServiceError> {
        let Some(encryption) = &self.encryption else {
            if (self.looks_sealed)(&stored) {
                return Err(ServiceError::SealedWithoutKeys);
            }
            return Ok(Opened {
                plaintext: stored,
                protection: Protection::Unprotected,
                format: "unencrypted",
            });
        };
        let opened = encryption.sealer.open(stored, at, name).await?;
        if encryption.enforced && opened.protection == Protection::Unprotected {
            return Err(ServiceError::Unprotected {
                format: opened.format,
            });
        }
        Ok(opened)
    }

    /// Commits are authored as the authenticated user, at the backend's e-mail address.
    fn meta(&self, caller: &Caller, message: String) -> CommitMeta {
        CommitMeta {
            author_name: caller.user.clone(),
            author_email: self.committer.email.clone(),
            committer_name: self.committer.name.clone(),
            committer_email: self.committer.email.clone(),
            message,
        }
    }
}

#[cfg(test)]
mod prefix_tests;
#[cfg(test)]
mod tests;
