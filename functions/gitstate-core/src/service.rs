//! The rules of the backend: locking, writing and reading states, independent of HTTP and git.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;

use crate::access::{Caller, Denied, Role};
use crate::ports::{
    Acquire, Change, CommitMeta, HeldLock, Location, Opened, Protection, Refusal, Release,
    SealError, Sealer, StateStore, StoreError, USER_TRAILER, Written,
};
use crate::refs::{Clash, RefPolicy, RefRefused};
use crate::{BranchName, LockInfo, LockInfoError, NameError, StateName, UnlockRequest};

mod overview;
pub use overview::{CurrentResource, StatePage, StateRow, VersionChanges};

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
    #[error("lock {id} is not held: take the lock again before writing")]
    NotLocked { id: String },
    #[error(
        "stale write refused: serial {sent} is lower than the stored serial {stored} of the same lineage"
    )]
    Stale { stored: u64, sent: u64 },
    #[error("no state stored under this name")]
    NotFound,
    #[error("no lock held on this state")]
    NoLock,
    #[error("already exists")]
    Exists,
    #[error("no such revision of this state: {0}")]
    NoSuchVersion(String),
    #[error("{0:?} is neither a commit id (40 hex digits) nor a serial")]
    BadSelector(String),
    #[error(transparent)]
    Forbidden(#[from] Denied),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error(
        "the stored state is {format}, not encrypted with the configured KMS keys, and encryption is enforced: an operator must run `gitstate rekey`"
    )]
    Unprotected { format: &'static str },
    #[error("no KMS key is configured (GITSTATE_KMS_KEY_IDS)")]
    NoKeys,
}

impl From<Refusal> for ServiceError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Locked(held) => Self::Locked(held),
            Refusal::LockMismatch(held) => Self::LockMismatch(held),
            Refusal::NotLocked { id } => Self::NotLocked { id },
            Refusal::Stale { stored, sent } => Self::Stale { stored, sent },
            Refusal::NotFound => Self::NotFound,
            Refusal::Exists => Self::Exists,
            Refusal::Unprotected { format } => Self::Unprotected { format },
            Refusal::Clash(clash) => Self::Clash(clash),
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
    memo: overview::Memo,
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

/// What `rekey` did to one state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rekeyed {
    /// Already sealed under exactly the configured keys.
    Current,
    /// Rewritten; it was stored as `from`.
    Rewritten {
        from: &'static str,
    },
    Missing,
}

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
            memo: overview::Memo::default(),
        }
    }

    /// Let `?ref=` name the branches `refs` allows (by default only the configured branch).
    pub fn with_refs(mut self, refs: RefPolicy) -> Self {
        self.refs = refs;
        self
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

    #[tracing::instrument(skip(self, caller), fields(state = %name, user = %caller.user))]
    pub async fn get_state(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
    ) -> Result<Bytes, ServiceError> {
        caller.require(Role::Read, name)?;
        let stored = self
            .store
            .read_state(at, name)
            .await?
            .ok_or(ServiceError::NotFound)?;
        Ok(self.open(at, name, stored).await?.plaintext)
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

    #[tracing::instrument(skip(self, caller), fields(state = %name, user = %caller.user))]
    pub async fn get_lock(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
    ) -> Result<HeldLock, ServiceError> {
        caller.require(Role::Read, name)?;
        self.store
            .read_lock(at, name)
            .await?
            .ok_or(ServiceError::NoLock)
    }

    /// Take the lock. Taking it again with the same ID succeeds, because clients retry a LOCK
    /// whose answer they did not see.
    #[tracing::instrument(skip(self, caller, body), fields(state = %name, user = %caller.user, lock_id))]
    pub async fn lock(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
        body: Bytes,
    ) -> Result<(), ServiceError> {
        caller.require(Role::Write, name)?;
        let info = LockInfo::parse(body)?;
        tracing::Span::current().record("lock_id", info.id());
        let meta = self.meta(
            caller,
            format!(
                "lock {name}\n\nOperation: {}\nLock-ID: {}\nWho: {}\n{USER_TRAILER}{}\n",
                one_line(info.operation()),
                one_line(info.id()),
                one_line(info.who()),
                caller.user
            ),
        );
        match self.store.acquire_lock(at, name, &info, &meta).await? {
            Acquire::Acquired => Ok(()),
            // Terraform's retry of its own LOCK; the same ID from another user is not a retry.
            Acquire::Held(held)
                if held.info.id() == info.id()
                    && held.owner.as_deref() == Some(caller.user.as_str()) =>
            {
                Ok(())
            }
            Acquire::Held(held) => Err(ServiceError::Locked(held)),
            Acquire::Clash(clash) => Err(clash_for(caller, clash)),
        }
    }

    /// Release the lock. An ID must match the holder; no ID is Terraform's force-unlock.
    /// Releasing a lock nobody holds succeeds. Writers release their own locks; force-unlock
    /// and releasing another user's lock take the admin grant.
    #[tracing::instrument(skip(self, caller, body), fields(state = %name, user = %caller.user))]
    pub async fn unlock(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
        body: &[u8],
    ) -> Result<(), ServiceError> {
        caller.require(Role::Write, name)?;
        let request = UnlockRequest::parse(body)?;
        // The lock this process made, released without reading it first when the request may
        // release it; the release is conditional on it, so a lock that changed meanwhile falls
        // through to reading it.
        if let Some(held) = self.store.known_lock(at, name).await?
            && match &request {
                UnlockRequest::Id(id) => {
                    id == held.info.id() && held.owner.as_deref() == Some(caller.user.as_str())
                }
                UnlockRequest::Force => false,
            }
            && self.store.release_lock(at, name, &held).await? == Release::Released
        {
            return Ok(());
        }
        // A bounded loop: the lock can change between reading it and releasing it.
        for _ in 0..4 {
            let Some(held) = self.store.read_lock(at, name).await? else {
                // Releasing a lock that exists is always allowed (it harms nothing, and no lock
                // may get stuck); a name that cannot hold one is not "unlocked".
                if let Some(clash) = self.store.clash(at, name).await? {
                    return Err(clash_for(caller, clash));
                }
                return Ok(());
            };
            match &request {
                UnlockRequest::Id(id) if id != held.info.id() => {
                    return Err(ServiceError::LockMismatch(held));
                }
                UnlockRequest::Force => {
                    caller.require(Role::Admin, name)?;
                    tracing::warn!(holder = held.info.id(), owner = ?held.owner, "force-unlock");
                }
                UnlockRequest::Id(_) if held.owner.as_deref() != Some(caller.user.as_str()) => {
                    caller.require(Role::Admin, name)?;
                    tracing::warn!(owner = ?held.owner, "unlocking another user's lock");
                }
                UnlockRequest::Id(_) => {}
            }
            if self.store.release_lock(at, name, &held).await? == Release::Released {
                return Ok(());
            }
        }
        Err(StoreError::Contention { attempts: 4 }.into())
    }

    /// Write a state. `lock_id` is Terraform's `?ID=`: present when it holds the lock.
    #[tracing::instrument(skip(self, caller, body), fields(state = %name, user = %caller.user, bytes = body.len()))]
    pub async fn put_state(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
        lock_id: Option<&str>,
        body: Bytes,
    ) -> Result<(), ServiceError> {
        caller.require(Role::Write, name)?;
        let sent = check_state(&body)?;
        self.write(caller, at, name, lock_id, body, sent, Verb::Write)
            .await
    }

    /// Seal `body` and write it, under the lock and stale-serial rules. The stored state the rules
    /// compare against may be sealed: the plan then asks for it to be opened, and the write is
    /// tried again knowing its version.
    #[allow(clippy::too_many_arguments)]
    async fn write(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
        lock_id: Option<&str>,
        body: Bytes,
        sent: Version,
        verb: Verb,
    ) -> Result<(), ServiceError> {
        let body = match &self.encryption {
            Some(e) if e.sealer.seals() => e.sealer.seal(&body, at, name).await?,
            _ => body,
        };
        let mut known: HashMap<Bytes, Version> = HashMap::new();
        for _ in 0..MAX_OPENS {
            let plan = self.write_plan(caller, name, lock_id, &sent, verb, known.clone());
            match self
                .store
                .write_state(at, name, Change::Put(body.clone()), plan)
                .await?
            {
                Written::Committed { .. } | Written::Unchanged => return Ok(()),
                Written::Refused(Refusal::Sealed(stored)) => {
                    let opened = match verb {
                        // rekey rewrites what enforcement would refuse
                        Verb::Rekey => match &self.encryption {
                            Some(e) => e.sealer.open(stored.clone(), at, name).await?,
                            None => return Err(ServiceError::NoKeys),
                        },
                        Verb::Write | Verb::Restore => self.open(at, name, stored.clone()).await?,
                    };
                    known.insert(stored, Version::of(&opened.plaintext));
                }
                Written::Refused(refusal) => return Err(refused(caller, refusal)),
            }
        }
        Err(StoreError::Contention {
            attempts: MAX_OPENS,
        }
        .into())
    }

    fn write_plan(
        &self,
        caller: &Caller,
        name: &StateName,
        lock_id: Option<&str>,
        sent: &Version,
        verb: Verb,
        known: HashMap<Bytes, Version>,
    ) -> crate::ports::WritePlan {
        let base = self.meta(caller, String::new());
        let user = caller.user.clone();
        let (state, lock_id, sent) = (name.to_string(), lock_id.map(str::to_owned), sent.clone());
        let (sealer, enforced) = match &self.encryption {
            Some(e) => (Some(e.sealer.clone()), e.enforced && verb == Verb::Write),
            None => (None, false),
        };
        Arc::new(move |lock: Option<&HeldLock>, stored: Option<&[u8]>| {
            let holder = admit(lock, lock_id.as_deref(), &user)?;
            if let Some(stored) = stored {
                let current = match &sealer {
                    Some(sealer) if sealer.is_sealed(stored) => known
                        .get(stored)
                        .cloned()
                        .ok_or_else(|| Refusal::Sealed(Bytes::copy_from_slice(stored)))?,
                    Some(_) if enforced => {
                        return Err(Refusal::Unprotected {
                            format: "unencrypted",
                        });
                    }
                    _ => Version::of(stored),
                };
                if let (Some(lineage), Some(serial)) = (&sent.lineage, sent.serial) {
                    let newer = current.serial.filter(|s| *s > serial);
                    if let (true, Some(stored)) = (current.lineage.as_ref() == Some(lineage), newer)
                    {
                        return Err(Refusal::Stale {
                            stored,
                            sent: serial,
                        });
                    }
                }
            }
            let serial = sent
                .serial
                .map(|s| format!(" (serial {s})"))
                .unwrap_or_default();
            let mut version = String::new();
            if let Some(serial) = sent.serial {
                version.push_str(&format!("{SERIAL_TRAILER}{serial}\n"));
            }
            if let Some(lineage) = &sent.lineage {
                version.push_str(&format!("{LINEAGE_TRAILER}{}\n", one_line(lineage)));
            }
            Ok(CommitMeta {
                message: format!(
                    "{} {state}{serial}\n\n{version}{}",
                    verb.as_str(),
                    trailer(holder, &user)
                ),
                ..base.clone()
            })
        })
    }

    /// Re-encrypt one state under the configured keys, holding its lock so it never races
    /// Terraform. A state already sealed exactly so is left alone.
    #[tracing::instrument(skip(self, caller), fields(state = %name, user = %caller.user))]
    pub async fn rekey(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
    ) -> Result<Rekeyed, ServiceError> {
        caller.require(Role::Admin, name)?;
        let encryption = self
            .encryption
            .as_ref()
            .filter(|e| e.sealer.seals())
            .ok_or(ServiceError::NoKeys)?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let id = format!("rekey-{nanos:x}-{}", std::process::id());
        let info = serde_json::json!({
            "ID": id, "Operation": "OperationTypeRekey", "Info": "gitstate rekey",
            "Who": format!("{}@gitstate", caller.user), "Version": "", "Created": "", "Path": name.as_str(),
        });
        let body = Bytes::from(info.to_string());
        self.lock(caller, at, name, body.clone()).await?;
        let outcome = async {
            let Some(stored) = self.store.read_state(at, name).await? else {
                return Ok::<_, ServiceError>(Rekeyed::Missing);
            };
            let opened = encryption.sealer.open(stored, at, name).await?;
            if opened.protection == Protection::Current {
                return Ok(Rekeyed::Current);
            }
            let sent = Version::of(&opened.plaintext);
            self.write(
                caller,
                at,
                name,
                Some(&id),
                opened.plaintext,
                sent,
                Verb::Rekey,
            )
            .await?;
            Ok(Rekeyed::Rewritten {
                from: opened.format,
            })
        }
        .await;
        let unlocked = self.unlock(caller, at, name, &body).await;
        let outcome = outcome?;
        unlocked?;
        Ok(outcome)
    }

    /// Remove a state file (Terraform itself never does; administrators may).
    #[tracing::instrument(skip(self, caller), fields(state = %name, user = %caller.user))]
    pub async fn delete_state(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
        lock_id: Option<&str>,
    ) -> Result<(), ServiceError> {
        caller.require(Role::Admin, name)?;
        let base = self.meta(caller, String::new());
        let user = caller.user.clone();
        let (state, lock_id) = (name.to_string(), lock_id.map(str::to_owned));
        let plan = Arc::new(move |lock: Option<&HeldLock>, stored: Option<&[u8]>| {
            let holder = admit(lock, lock_id.as_deref(), &user)?;
            if stored.is_none() {
                return Err(Refusal::NotFound);
            }
            Ok(CommitMeta {
                message: format!("delete {state}\n\n{}", trailer(holder, &user)),
                ..base.clone()
            })
        });
        match self
            .store
            .write_state(at, name, Change::Delete, plan)
            .await?
        {
            Written::Committed { .. } | Written::Unchanged => Ok(()),
            Written::Refused(refusal) => Err(refused(caller, refusal)),
        }
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

/// Check that a body is a JSON object without building a tree of the whole document (states
/// can be large), and read its lineage and serial.
fn check_state(body: &[u8]) -> Result<Version, ServiceError> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ServiceError::InvalidState(
            "the top level must be an object".into(),
        ));
    }
    serde_json::from_slice::<serde::de::IgnoredAny>(body)
        .map_err(|e| ServiceError::InvalidState(e.to_string()))?;
    if !nesting_within(body, MAX_STATE_DEPTH) {
        return Err(ServiceError::InvalidState(format!(
            "nesting deeper than {MAX_STATE_DEPTH} levels"
        )));
    }
    Ok(serde_json::from_slice(body).unwrap_or_default())
}

/// Commit trailers recording the Terraform version of what a write stored.
pub(crate) const SERIAL_TRAILER: &str = "Serial: ";
pub(crate) const LINEAGE_TRAILER: &str = "Lineage: ";

/// The value of trailer `key` in a commit message.
pub(crate) fn trailer_value<'a>(message: &'a str, key: &str) -> Option<&'a str> {
    message
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix(key))
        .map(str::trim)
}

/// Which revision of a state a request means: a commit id, or a Terraform serial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    Version(String),
    Serial(u64),
}

impl Selector {
    pub fn parse(text: &str) -> Result<Self, ServiceError> {
        let is_hex = text.len() == 40 && text.bytes().all(|b| b.is_ascii_hexdigit());
        if is_hex {
            return Ok(Self::Version(text.to_ascii_lowercase()));
        }
        match text.parse::<u64>() {
            Ok(serial) if text.len() < 20 => Ok(Self::Serial(serial)),
            _ => Err(ServiceError::BadSelector(text.chars().take(64).collect())),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Write,
    Rekey,
    Restore,
}

impl Verb {
    fn as_str(self) -> &'static str {
        match self {
            Self::Write => "write",
            Self::Rekey => "rekey",
            Self::Restore => "restore",
        }
    }
}

/// One revision of a state, as the history route lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VersionInfo {
    pub version: String,
    /// Seconds since the Unix epoch.
    pub time: i64,
    pub author: String,
    pub operation: String,
    pub serial: Option<u64>,
    pub lineage: Option<String>,
    pub deleted: bool,
}

/// The outcome of a restore.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Restored {
    /// The revision whose content was written again.
    pub from: String,
    /// The serial of the new revision (above every serial stored before).
    pub serial: u64,
}

/// Most revisions one history page lists.
pub const MAX_PAGE: usize = 100;

impl Backend {
    /// One page of a state's revisions, newest first (read grant).
    #[tracing::instrument(skip(self, caller), fields(state = %name, user = %caller.user))]
    pub async fn history(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
        page: usize,
        per_page: usize,
    ) -> Result<(Vec<VersionInfo>, bool), ServiceError> {
        caller.require(Role::Read, name)?;
        let per_page = per_page.clamp(1, MAX_PAGE);
        let found = self
            .store
            .history(at, name, page.saturating_mul(per_page), per_page)
            .await?;
        let mut versions = Vec::with_capacity(found.revisions.len());
        for revision in found.revisions {
            let message = &revision.message;
            let mut serial = trailer_value(message, SERIAL_TRAILER).and_then(|s| s.parse().ok());
            let mut lineage = trailer_value(message, LINEAGE_TRAILER).map(str::to_owned);
            if serial.is_none() && !revision.deleted {
                // Written by another tool: look at the content itself.
                if let Some(bytes) = self.store.read_version(at, name, &revision.version).await? {
                    match self.open_revision(at, name, bytes).await {
                        Ok(bytes) => {
                            let version = Version::of(&bytes);
                            (serial, lineage) = (version.serial, version.lineage);
                        }
                        // Listed without a serial; reading that version reports the failure.
                        Err(ServiceError::Seal(error)) => {
                            tracing::warn!(version = %revision.version, error = %error, "a version does not open: listed without a serial");
                        }
                        Err(other) => return Err(other),
                    }
                }
            }
            let operation = trailer_value(message, "Operation: ")
                .map(str::to_owned)
                .or_else(|| message.split_whitespace().next().map(str::to_owned))
                .unwrap_or_default();
            versions.push(VersionInfo {
                version: revision.version,
                time: revision.time,
                author: revision.author,
                operation,
                serial,
                lineage,
                deleted: revision.deleted,
            });
        }
        Ok((versions, found.more))
    }

    /// Resolve a selector to a revision id: serials are looked up in the history.
    async fn resolve(
        &self,
        at: &Location,
        name: &StateName,
        selector: &Selector,
    ) -> Result<String, ServiceError> {
        let serial = match selector {
            Selector::Version(version) => return Ok(version.clone()),
            Selector::Serial(serial) => *serial,
        };
        let operator = Caller::operator("history");
        for page in 0.. {
            let (versions, more) = self.history(&operator, at, name, page, MAX_PAGE).await?;
            if let Some(found) = versions
                .iter()
                .find(|v| v.serial == Some(serial) && !v.deleted)
            {
                return Ok(found.version.clone());
            }
            if !more {
                break;
            }
        }
        Err(ServiceError::NoSuchVersion(format!("serial {serial}")))
    }

    /// The state as one revision left it (read grant).
    #[tracing::instrument(skip(self, caller), fields(state = %name, user = %caller.user))]
    pub async fn get_version(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
        selector: &Selector,
    ) -> Result<(String, Bytes), ServiceError> {
        caller.require(Role::Read, name)?;
        let version = self.resolve(at, name, selector).await?;
        let stored = self
            .store
            .read_version(at, name, &version)
            .await?
            .ok_or_else(|| ServiceError::NoSuchVersion(version.clone()))?;
        Ok((version, self.open_revision(at, name, stored).await?))
    }

    /// Write an earlier revision again as a new one on top, under the state's lock, with its
    /// serial above the current one so Terraform takes it (admin grant). History is never
    /// rewritten; a lock held by someone else refuses the restore.
    #[tracing::instrument(skip(self, caller), fields(state = %name, user = %caller.user))]
    pub async fn restore(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
        selector: &Selector,
    ) -> Result<Restored, ServiceError> {
        caller.require(Role::Admin, name)?;
        // The write below checks again against the tree it builds on; this answers before any
        // history is read.
        if let Some(clash) = self.store.clash(at, name).await? {
            return Err(clash_for(caller, clash));
        }
        let (from, old) = self.get_version(caller, at, name, selector).await?;
        let mut state: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&old)
            .map_err(|e| ServiceError::InvalidState(format!("revision {from}: {e}")))?;
        let current = match self.store.read_state(at, name).await? {
            Some(stored) => Version::of(&self.open_revision(at, name, stored).await?).serial,
            None => None,
        };
        let old_serial = state.get("serial").and_then(serde_json::Value::as_u64);
        let serial = current.max(old_serial).unwrap_or(0).saturating_add(1);
        state.insert("serial".into(), serial.into());
        let body =
            serde_json::to_vec(&state).map_err(|e| ServiceError::InvalidState(e.to_string()))?;
        let sent = Version {
            lineage: state
                .get("lineage")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned),
            serial: Some(serial),
        };

        let id = format!("gitstate-restore-{:016x}", rand::random::<u64>());
        let info = serde_json::json!({
            "ID": id,
            "Operation": "OperationTypeRestore",
            "Info": format!("restore of revision {from}"),
            "Who": caller.user,
            "Version": "",
            "Created": "",
            "Path": name.as_str(),
        });
        let info = Bytes::from(info.to_string());
        self.lock(caller, at, name, info.clone()).await?;
        let written = self
            .write(
                caller,
                at,
                name,
                Some(&id),
                Bytes::from(body),
                sent,
                Verb::Restore,
            )
            .await;
        let released = self.unlock(caller, at, name, &info).await;
        written?;
        released?;
        Ok(Restored { from, serial })
    }

    /// Every lock on states the caller may read (one ref advertisement, and one fetch of the
    /// lock commits not cached yet).
    #[tracing::instrument(skip(self, caller), fields(user = %caller.user))]
    pub async fn list_locks(
        &self,
        caller: &Caller,
        at: &Location,
    ) -> Result<Vec<(StateName, HeldLock)>, ServiceError> {
        let mut locks = self.store.list_locks(at).await?;
        locks.retain(|(name, _)| caller.may(Role::Read, name));
        Ok(locks)
    }
}

/// The lock rule for writes: with an ID, it must be the holder's and the lock `user`'s own;
/// without one, nobody may hold it.
fn admit<'a>(
    lock: Option<&'a HeldLock>,
    id: Option<&str>,
    user: &str,
) -> Result<Option<&'a HeldLock>, Refusal> {
    match (lock, id) {
        // The holder's ID from another user (administrators too: they force-unlock first).
        (Some(held), Some(id)) if held.info.id() == id && held.owner.as_deref() != Some(user) => {
            Err(Refusal::Locked(held.clone()))
        }
        (Some(held), Some(id)) if held.info.id() == id => Ok(Some(held)),
        (Some(held), Some(_)) => Err(Refusal::LockMismatch(held.clone())),
        (None, Some(id)) => Err(Refusal::NotLocked { id: id.to_owned() }),
        (Some(held), None) => Err(Refusal::Locked(held.clone())),
        (None, None) => Ok(None),
    }
}

fn trailer(holder: Option<&HeldLock>, user: &str) -> String {
    let lock = match holder {
        Some(held) => format!(
            "Operation: {}\nLock-ID: {}\nWho: {}\n",
            one_line(held.info.operation()),
            one_line(held.info.id()),
            one_line(held.info.who())
        ),
        None => "Lock-ID: none (written without a lock)\n".to_owned(),
    };
    format!("{lock}{USER_TRAILER}{user}\n")
}

/// Client-chosen text goes into commit messages: keep it to one printable line.
fn one_line(s: &str) -> String {
    s.chars()
        .take(200)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Deepest nesting accepted in a state: serde_json's own limit, which refused deeper states while
/// they were parsed into a tree. Skipping a value (`IgnoredAny`) has no limit.
const MAX_STATE_DEPTH: usize = 128;

/// Whether the arrays and objects of a (valid) JSON document nest at most `max` deep; one pass,
/// no tree.
fn nesting_within(json: &[u8], max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &byte in json {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > max {
                    return false;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::Grant;
    use crate::testing::MemoryStore;

    fn admin() -> Caller {
        Caller::operator("root")
    }

    fn writer(name: &str) -> Caller {
        Caller::new(name, vec![Grant::parse("write:net/").expect("valid")])
    }

    fn backend() -> (Backend, Location, StateName) {
        let repos = Repositories {
            primary: "https://git.example/org/state.git".into(),
            default_branch: BranchName::parse("main").expect("valid"),
            allowed: vec!["https://git.example/org/other".into()],
        };
        let identity = Identity {
            name: "gitstate".into(),
            email: "gitstate@localhost".into(),
        };
        let backend = Backend::new(Arc::new(MemoryStore::default()), repos, identity);
        let at = backend.locate(None, None).expect("primary");
        (
            backend,
            at,
            StateName::parse("net/prod.tfstate").expect("valid"),
        )
    }

    fn lock_body(id: &str) -> Bytes {
        Bytes::from(format!(
            r#"{{"ID":"{id}","Operation":"OperationTypeApply","Who":"me@host"}}"#
        ))
    }

    fn state(lineage: &str, serial: u64) -> Bytes {
        Bytes::from(format!(
            r#"{{"version":4,"lineage":"{lineage}","serial":{serial}}}"#
        ))
    }

    #[test]
    fn nesting_is_bounded_outside_strings() {
        let deep = |n: usize| format!("{}1{}", r#"{"a":"#.repeat(n), "}".repeat(n));
        assert!(nesting_within(
            deep(MAX_STATE_DEPTH).as_bytes(),
            MAX_STATE_DEPTH
        ));
        assert!(!nesting_within(
            deep(MAX_STATE_DEPTH + 1).as_bytes(),
            MAX_STATE_DEPTH
        ));
        let brackets_in_strings = format!(r#"{{"s":"{}\"{}"}}"#, "[{".repeat(500), "{".repeat(9));
        assert!(nesting_within(brackets_in_strings.as_bytes(), 2));
    }

    #[tokio::test]
    async fn lock_is_exclusive_and_idempotent() {
        // GIVEN a lock held by A
        let (b, at, name) = backend();
        b.lock(&admin(), &at, &name, lock_body("A"))
            .await
            .expect("first lock");
        // WHEN A locks again, THEN it succeeds; WHEN B locks, THEN it sees A
        b.lock(&admin(), &at, &name, lock_body("A"))
            .await
            .expect("same ID again");
        match b.lock(&admin(), &at, &name, lock_body("B")).await {
            Err(ServiceError::Locked(held)) => assert_eq!(held.info.id(), "A"),
            other => panic!("expected Locked, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn unlock_rules() {
        let (b, at, name) = backend();
        b.unlock(&admin(), &at, &name, b"")
            .await
            .expect("unlocking nothing is fine");
        b.lock(&admin(), &at, &name, lock_body("A"))
            .await
            .expect("lock");
        assert!(matches!(
            b.unlock(&admin(), &at, &name, &lock_body("B")).await,
            Err(ServiceError::LockMismatch(_))
        ));
        b.unlock(&admin(), &at, &name, &lock_body("A"))
            .await
            .expect("holder unlocks");
        b.lock(&admin(), &at, &name, lock_body("C"))
            .await
            .expect("lock again");
        b.unlock(&admin(), &at, &name, b"")
            .await
            .expect("force-unlock");
        assert!(matches!(
            b.get_lock(&admin(), &at, &name).await,
            Err(ServiceError::NoLock)
        ));
    }

    #[tokio::test]
    async fn write_rules() {
        let (b, at, name) = backend();
        b.put_state(&admin(), &at, &name, None, state("L", 1))
            .await
            .expect("unlocked write without ID");
        assert!(matches!(
            b.put_state(&admin(), &at, &name, Some("X"), state("L", 2))
                .await,
            Err(ServiceError::NotLocked { .. })
        ));
        b.lock(&admin(), &at, &name, lock_body("A"))
            .await
            .expect("lock");
        assert!(matches!(
            b.put_state(&admin(), &at, &name, None, state("L", 2)).await,
            Err(ServiceError::Locked(_))
        ));
        assert!(matches!(
            b.put_state(&admin(), &at, &name, Some("B"), state("L", 2))
                .await,
            Err(ServiceError::LockMismatch(_))
        ));
        b.put_state(&admin(), &at, &name, Some("A"), state("L", 3))
            .await
            .expect("holder writes");
        assert!(matches!(
            b.put_state(&admin(), &at, &name, Some("A"), state("L", 2))
                .await,
            Err(ServiceError::Stale { stored: 3, sent: 2 })
        ));
        b.put_state(&admin(), &at, &name, Some("A"), state("other-lineage", 1))
            .await
            .expect("new lineage");
        b.put_state(
            &admin(),
            &at,
            &name,
            Some("A"),
            Bytes::from_static(b"{\"encrypted_data\":\"x\"}"),
        )
        .await
        .expect("no serial");
        assert!(matches!(
            b.put_state(&admin(), &at, &name, Some("A"), Bytes::from_static(b"[]"))
                .await,
            Err(ServiceError::InvalidState(_))
        ));
        assert_eq!(
            b.get_state(&admin(), &at, &name)
                .await
                .expect("stored")
                .as_ref(),
            b"{\"encrypted_data\":\"x\"}"
        );
    }

    #[tokio::test]
    async fn delete_requires_existing_state() {
        let (b, at, name) = backend();
        assert!(matches!(
            b.delete_state(&admin(), &at, &name, None).await,
            Err(ServiceError::NotFound)
        ));
        b.put_state(&admin(), &at, &name, None, state("L", 1))
            .await
            .expect("write");
        b.delete_state(&admin(), &at, &name, None)
            .await
            .expect("delete");
        assert!(matches!(
            b.get_state(&admin(), &at, &name).await,
            Err(ServiceError::NotFound)
        ));
    }

    #[test]
    fn allowlist() {
        let (b, _, _) = backend();
        assert!(matches!(
            b.locate(None, Some("dev")),
            Err(ServiceError::RefNotAllowed(_))
        ));
        let refs = crate::refs::AllowedRefs::parse("dev").expect("valid");
        let policy = RefPolicy::new(
            BranchName::parse("main").expect("valid"),
            crate::refs::DEFAULT_LOCK_PREFIX,
            refs,
        )
        .expect("valid");
        let b = b.with_refs(policy);
        assert!(
            b.locate(Some("https://git.example/org/other.git/"), Some("dev"))
                .is_ok()
        );
        assert!(matches!(
            b.locate(None, Some("locks/net/prod.tfstate")),
            Err(ServiceError::RefNotAllowed(_))
        ));
        assert!(
            b.locate(Some("https://git.example/org/state"), None)
                .is_ok()
        );
        assert!(matches!(
            b.locate(Some("https://evil.example/x"), None),
            Err(ServiceError::RepositoryNotAllowed(_))
        ));
        assert!(matches!(
            b.locate(None, Some("a..b")),
            Err(ServiceError::Branch(_))
        ));
    }

    #[tokio::test]
    async fn writers_release_only_their_own_locks() {
        let (b, at, name) = backend();
        b.lock(&writer("ann"), &at, &name, lock_body("A"))
            .await
            .expect("ann locks");
        match b.unlock(&writer("bob"), &at, &name, &lock_body("A")).await {
            Err(ServiceError::Forbidden(denied)) => assert_eq!(denied.role, Role::Admin),
            other => panic!("bob must not release ann's lock: {other:?}"),
        }
        assert!(
            matches!(
                b.unlock(&writer("ann"), &at, &name, b"").await,
                Err(ServiceError::Forbidden(_))
            ),
            "force-unlock takes admin, even for the owner"
        );
        b.unlock(&writer("ann"), &at, &name, &lock_body("A"))
            .await
            .expect("ann releases her own lock");
        b.lock(&writer("ann"), &at, &name, lock_body("B"))
            .await
            .expect("lock again");
        b.unlock(&admin(), &at, &name, b"")
            .await
            .expect("admin force-unlocks");
        let outside = StateName::parse("app/x.tfstate").expect("valid");
        assert!(matches!(
            b.get_state(&writer("ann"), &at, &outside).await,
            Err(ServiceError::Forbidden(_))
        ));
        assert!(matches!(
            b.delete_state(&writer("ann"), &at, &name, None).await,
            Err(ServiceError::Forbidden(_))
        ));
    }

    #[tokio::test]
    async fn commits_are_authored_by_the_user() {
        let store = Arc::new(MemoryStore::default());
        let b = Backend::new(
            store.clone(),
            Repositories {
                primary: "r".into(),
                default_branch: BranchName::parse("main").expect("valid"),
                allowed: Vec::new(),
            },
            Identity {
                name: "gitstate".into(),
                email: "gitstate@localhost".into(),
            },
        );
        let at = b.locate(None, None).expect("primary");
        let name = StateName::parse("net/a.tfstate").expect("valid");
        b.lock(&writer("ann"), &at, &name, lock_body("A"))
            .await
            .expect("lock");
        b.put_state(&writer("ann"), &at, &name, Some("A"), state("L", 1))
            .await
            .expect("write");
        let history = store.history();
        assert!(history.iter().all(|c| c.author_name == "ann"));
        assert!(history.iter().all(|c| c.message.contains("User: ann\n")));
        let held = b.get_lock(&admin(), &at, &name).await.expect("held");
        assert_eq!(held.owner.as_deref(), Some("ann"));
    }

    /// Every operation on a name that lies below a state or is a folder of states is 409 and
    /// changes nothing, in the memory store as in git; a held lock can always be released.
    #[tokio::test]
    async fn names_that_clash_with_the_tree_are_refused() {
        for (existing, clashing) in [
            ("a", "a/b.tfstate"),
            ("a/b", "a/b/c/d.tfstate"),
            ("team/app/prod.tfstate", "team/app"),
            ("team/app/prod.tfstate", "team"),
        ] {
            let (b, at, _) = backend();
            let existing = StateName::parse(existing).expect("valid");
            let name = StateName::parse(clashing).expect("valid");
            b.put_state(&admin(), &at, &existing, None, state("L", 1))
                .await
                .expect("first state");
            let before = b.store().list_states(&at, "").await.expect("list");
            let is_clash = |r: Result<(), ServiceError>| matches!(r, Err(ServiceError::Clash(_)));
            assert!(is_clash(
                b.put_state(&admin(), &at, &name, None, state("M", 1)).await
            ));
            assert!(is_clash(b.lock(&admin(), &at, &name, lock_body("X")).await));
            assert!(is_clash(
                b.unlock(&admin(), &at, &name, &lock_body("X")).await
            ));
            assert!(is_clash(b.delete_state(&admin(), &at, &name, None).await));
            assert!(matches!(
                b.restore(&admin(), &at, &name, &Selector::Serial(1)).await,
                Err(ServiceError::Clash(_))
            ));
            assert_eq!(b.store().list_states(&at, "").await.expect("list"), before);
            assert!(b.list_locks(&admin(), &at).await.expect("locks").is_empty());
        }
    }

    /// A 409 names the state in the way only to a caller who may read it: every pair of names
    /// over {a, b} up to three deep where one is a folder of the other, as a state in the tree
    /// and as a held lock, met by a caller whose only grant is `admin:<its own name>`.
    #[tokio::test]
    async fn clashes_name_only_states_the_caller_may_read() {
        let mut names = vec![String::new()];
        for _ in 0..3 {
            let longer: Vec<String> = names
                .iter()
                .flat_map(|n| {
                    ["a", "b"].map(|s| format!("{n}{}{s}", if n.is_empty() { "" } else { "/" }))
                })
                .collect();
            names.extend(longer);
        }
        names.retain(|n| !n.is_empty());
        let mut pairs = 0;
        for existing in &names {
            for clashing in &names {
                let below = |a: &str, b: &str| a.starts_with(&format!("{b}/"));
                if !below(existing, clashing) && !below(clashing, existing) {
                    continue;
                }
                pairs += 1;
                let caller = Caller::new(
                    "ops",
                    vec![Grant::parse(&format!("admin:{clashing}")).expect("valid")],
                );
                let readable = existing.starts_with(clashing.as_str());
                let told = |r: Result<(), ServiceError>, what: &str| match r {
                    Err(ServiceError::Clash(Clash::Unreadable)) => assert!(!readable, "{what}"),
                    Err(ServiceError::Clash(
                        Clash::BelowState(o) | Clash::Folder(o) | Clash::LockRef(o),
                    )) => assert!(readable && o == *existing, "{what}: {o}"),
                    other => panic!("{what}: {other:?}"),
                };
                let what = format!("{clashing} against {existing}");
                let existing = StateName::parse(existing).expect("valid");
                let name = StateName::parse(clashing).expect("valid");
                // in the tree
                let (b, at, _) = backend();
                b.put_state(&admin(), &at, &existing, None, state("L", 1))
                    .await
                    .expect("first state");
                told(
                    b.put_state(&caller, &at, &name, None, state("M", 1)).await,
                    &what,
                );
                told(b.lock(&caller, &at, &name, lock_body("X")).await, &what);
                told(b.unlock(&caller, &at, &name, &lock_body("X")).await, &what);
                told(b.delete_state(&caller, &at, &name, None).await, &what);
                told(
                    b.restore(&caller, &at, &name, &Selector::Serial(1))
                        .await
                        .map(drop),
                    &what,
                );
                // as a held lock
                let (b, at, _) = backend();
                b.lock(&admin(), &at, &existing, lock_body("E"))
                    .await
                    .expect("lock");
                told(b.lock(&caller, &at, &name, lock_body("X")).await, &what);
            }
        }
        assert!(pairs > 20, "{pairs} pairs");
    }

    #[tokio::test]
    async fn lock_refs_that_clash_are_refused_and_held_locks_released() {
        let (b, at, _) = backend();
        let child = StateName::parse("a/b.tfstate").expect("valid");
        let parent = StateName::parse("a").expect("valid");
        b.lock(&admin(), &at, &child, lock_body("C"))
            .await
            .expect("lock");
        match b.lock(&admin(), &at, &parent, lock_body("P")).await {
            Err(ServiceError::Clash(Clash::LockRef(other))) => assert_eq!(other, "a/b.tfstate"),
            other => panic!("expected a lock clash, got {other:?}"),
        }
        b.unlock(&admin(), &at, &child, &lock_body("C"))
            .await
            .expect("unlock");
        b.lock(&admin(), &at, &parent, lock_body("P"))
            .await
            .expect("lock parent");
        assert!(matches!(
            b.lock(&admin(), &at, &child, lock_body("C")).await,
            Err(ServiceError::Clash(Clash::LockRef(_)))
        ));
    }

    /// A write that would create its branch next to an existing branch it clashes with (one a
    /// path prefix of the other) is 409 naming that branch, and creates nothing; seeded random
    /// branch pairs over a small alphabet, so that clashes are frequent.
    #[tokio::test]
    async fn branches_that_clash_are_refused_generated() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(44);
        let mut random_branch = || {
            let segments = rng.random_range(1..=3);
            let path: Vec<&str> = (0..segments)
                .map(|_| ["env", "a", "b"][rng.random_range(0..3)])
                .collect();
            BranchName::parse(&path.join("/")).expect("valid branch")
        };
        let (mut clashes, mut created) = (0, 0);
        for _ in 0..400 {
            let (b, at, name) = backend();
            let existing = Location {
                branch: random_branch(),
                ..at.clone()
            };
            let new = Location {
                branch: random_branch(),
                ..at.clone()
            };
            b.put_state(&admin(), &existing, &name, None, state("L", 1))
                .await
                .expect("first branch");
            let answer = b
                .put_state(&admin(), &new, &name, None, state("M", 1))
                .await;
            let clash =
                crate::refs::paths_clash(&existing.branch.full_ref(), &new.branch.full_ref());
            match answer {
                Err(ServiceError::Clash(Clash::Branch {
                    branch,
                    existing: other,
                })) => {
                    assert!(clash, "{} {}", existing.branch, new.branch);
                    assert_eq!(
                        (branch.as_str(), other.as_str()),
                        (new.branch.as_str(), existing.branch.as_str())
                    );
                    assert!(
                        b.store()
                            .list_states(&new, "")
                            .await
                            .expect("list")
                            .is_empty()
                    );
                    clashes += 1;
                }
                Ok(()) => {
                    assert!(!clash, "{} {}", existing.branch, new.branch);
                    created += 1;
                }
                other => panic!("{} after {}: {other:?}", new.branch, existing.branch),
            }
        }
        assert!(
            clashes > 40 && created > 40,
            "{clashes} clashes, {created} created"
        );
    }

    #[tokio::test]
    async fn the_holders_id_from_another_user_is_locked() {
        let (b, at, name) = backend();
        b.lock(&writer("ann"), &at, &name, lock_body("A"))
            .await
            .expect("ann locks");
        b.lock(&writer("ann"), &at, &name, lock_body("A"))
            .await
            .expect("ann retries");
        for caller in [writer("bob"), admin()] {
            assert!(matches!(
                b.lock(&caller, &at, &name, lock_body("A")).await,
                Err(ServiceError::Locked(_))
            ));
            assert!(matches!(
                b.put_state(&caller, &at, &name, Some("A"), state("L", 1))
                    .await,
                Err(ServiceError::Locked(_))
            ));
        }
        b.put_state(&writer("ann"), &at, &name, Some("A"), state("L", 1))
            .await
            .expect("the holder writes");
    }

    /// Seals by prefixing the current key's name; opens only what the current key sealed, like a
    /// deployment whose key was replaced (or whose key service is down) after some writes.
    struct KeyedSealer {
        key: std::sync::Mutex<&'static str>,
        /// Keys it can still open with besides the current one.
        previous: std::sync::Mutex<Vec<&'static str>>,
        down: std::sync::atomic::AtomicBool,
    }

    impl KeyedSealer {
        fn key(&self) -> &'static str {
            *self.key.lock().expect("not poisoned")
        }
    }

    #[async_trait::async_trait]
    impl Sealer for KeyedSealer {
        fn seals(&self) -> bool {
            true
        }
        fn is_sealed(&self, _: &[u8]) -> bool {
            true
        }
        async fn seal(
            &self,
            plain: &[u8],
            _: &Location,
            _: &StateName,
        ) -> Result<Bytes, SealError> {
            Ok([self.key().as_bytes(), b":", plain].concat().into())
        }
        async fn open(
            &self,
            stored: Bytes,
            _: &Location,
            _: &StateName,
        ) -> Result<Opened, SealError> {
            if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(SealError::Unavailable("key service down".into()));
            }
            let mut keys = self.previous.lock().expect("not poisoned").clone();
            keys.push(self.key());
            let plain = keys
                .iter()
                .find_map(|key| stored.strip_prefix(format!("{key}:").as_bytes()))
                .ok_or_else(|| SealError::ForeignKey("sealed under another key".into()))?;
            Ok(Opened {
                plaintext: Bytes::copy_from_slice(plain),
                protection: Protection::Current,
                format: "test",
            })
        }
    }

    /// States written under a key the deployment no longer has (or while its key service is down)
    /// among readable ones: the list still lists every state (the unopenable ones without a
    /// serial) and each state page is still served, with the unopenable versions' changes unknown.
    #[tokio::test]
    async fn unopenable_states_leave_lists_and_pages_working() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        for round in 0..6 {
            let sealer = Arc::new(KeyedSealer {
                key: std::sync::Mutex::new("old"),
                previous: std::sync::Mutex::new(Vec::new()),
                down: false.into(),
            });
            let (b, at, _) = backend();
            let b = b.with_encryption(Encryption {
                sealer: sealer.clone(),
                enforced: false,
            });
            let count = rng.random_range(2..7);
            let names: Vec<StateName> = (0..count)
                .map(|i| StateName::parse(&format!("s{round}/n{i}.tfstate")).expect("valid"))
                .collect();
            // Serial-less contents make the list open the newest version.
            let body = |serial: u64| {
                Bytes::from(format!(
                    r#"{{"version":4,"resources":[{{"mode":"managed","type":"t","name":"r{serial}"}}]}}"#
                ))
            };
            for name in &names {
                b.put_state(&admin(), &at, name, None, body(1))
                    .await
                    .expect("old key");
            }
            // The key is replaced; some states are written twice more under the new one, then
            // the old key is gone.
            *sealer.key.lock().expect("not poisoned") = "new";
            sealer.previous.lock().expect("not poisoned").push("old");
            let rewritten: Vec<bool> = names.iter().map(|_| rng.random_bool(0.5)).collect();
            for (name, again) in names.iter().zip(&rewritten) {
                if *again {
                    for serial in [2, 3] {
                        b.put_state(&admin(), &at, name, None, body(serial))
                            .await
                            .expect("new key");
                    }
                }
            }
            sealer.previous.lock().expect("not poisoned").clear();
            // Down first: what does not open is not remembered, so it opens once the service is back.
            for down in [true, false] {
                sealer.down.store(down, std::sync::atomic::Ordering::SeqCst);
                let rows = b
                    .list_states(&admin(), &at)
                    .await
                    .expect("the list is served");
                assert_eq!(rows.len(), names.len(), "every state is listed");
                assert!(rows.iter().all(|row| row.entry.is_some()));
                for (name, again) in names.iter().zip(&rewritten) {
                    let page = b
                        .state_page(&admin(), &at, name, 0, 10)
                        .await
                        .expect("the page is served");
                    let opens = |i: usize| !down && *again && i == 0;
                    assert_eq!(page.versions.len(), 1 + 2 * usize::from(*again));
                    for (i, version) in page.versions.iter().enumerate() {
                        // Changes need this version and the one before it to open.
                        assert_eq!(
                            version.changes.is_some(),
                            opens(i),
                            "{name} #{i} down={down}"
                        );
                    }
                    assert_eq!(page.resources.is_some(), opens(0), "{name}");
                }
            }
        }
    }
}
