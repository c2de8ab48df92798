//! [`StateStore`] over git: the seed protocol's branch locks, made atomic.
//!
//! - read: advertised tip of the branch → fetch only if the cache lacks it → blob from the ODB;
//! - lock: push of an orphan commit holding `<name>.lock` to the lock ref, create-only;
//! - unlock: delete of the lock ref, conditional on the lock commit that was checked;
//! - write: commit on the advertised tip, pushed with compare-and-swap (atomically with an
//!   unchanged lock ref when a lock is held), rebuilt and retried when another state moved it.
//!   A remote without `atomic` gets the compare-and-swap of the branch alone, the lock having
//!   been checked in the same advertisement that gave the tip (see [`WriteMode`]).

mod copies;
mod error;
mod floor;
mod fold;
mod history;
mod hosted;
mod known;
mod lock;
mod proof;
mod proving;
mod read;
mod remote;
mod session;
mod states;
mod transport;
mod write;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use gix::ObjectId;
use sha1::{Digest, Sha1};

use gitstate_core::fold::FoldReport;
use gitstate_core::ports::{
    Acquire, Beside, BranchStatus, Change, CommitMeta, HeldLock, HistoryPage, Listing, Location,
    Release, Revision, StateStore, StoreError, WritePlan, Written,
};
use gitstate_core::refs::Clash;
use gitstate_core::secret::Secret;
use gitstate_core::{LockInfo, ReadContext, StateName};

use crate::protocol::{Advert, SmartClient};
use crate::repository::local::LocalRefs;
use crate::repository::{self, Cache};
use crate::settings::{GitAuth, GitSettings, StateRefs};
use crate::sync::lock;
use crate::transport::Connection;
pub use error::{
    Broken, FoldError, HistoryError, ListError, LockError, OpenError, ReadError, RemoteError,
    UnlockError, WriteError,
};
use hosted::Hosted;
use remote::Remote;
pub use states::Holder;
use transport::{Embedded, Transport};

/// What the store needs to know, taken from [`GitSettings`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub cache_dir: PathBuf,
    pub lock_ref_prefix: String,
    pub username: Option<String>,
    /// Sent only to repositories of the same origin as `primary`.
    pub token: Option<Secret>,
    /// The configured repository (`GITSTATE_REPOSITORY`).
    pub primary: Option<String>,
    pub auth: GitAuth,
    /// Private CA certificates trusted besides the system roots.
    pub roots: Vec<reqwest::Certificate>,
    /// Refuse remotes whose receive-pack does not advertise `atomic`.
    pub require_atomic: bool,
    pub timeout: Duration,
    /// The most one git answer may hold (`GITSTATE_GIT_MAX_RESPONSE_BYTES`).
    pub max_response_bytes: u64,
    /// How deep history paging and `?at=` may fetch (`GITSTATE_HISTORY_MAX_DEPTH`).
    pub max_history_depth: u32,
    /// The most writes waiting at once that leave in one push (1: each alone).
    pub writes_per_push: usize,
    /// A fold lease older than this is taken over (its holder is gone).
    pub fold_lease_age: Duration,
    /// Fold in the background after a write to a state ref (`serve`, `run`; not Lambda).
    pub fold_after_writes: bool,
    /// Which writes go to a state's own ref (`GITSTATE_STATE_REFS`).
    pub state_refs: StateRefs,
    /// See [`GitSettings::proof_window`].
    pub proof_window: Duration,
}

/// How a write under a lock reaches the remote, decided per remote from its receive-pack
/// advertisement.
///
/// Both modes: a write is a compare-and-swap of the branch from the advertised tip, so no commit
/// of another state is ever lost or rewound, and a write is refused unless the lock ref, read in
/// the same advertisement as that tip, holds the writer's lock ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// One atomic push also asserts that the lock ref is unchanged: the write lands only if the
    /// lock is still the one checked at the moment the branch moves.
    Atomic,
    /// The branch's compare-and-swap alone: the lock check is as of the advertisement, so a
    /// force-unlock (and a new lock) landing between that advertisement and the push does not
    /// stop the write, exactly as with the seed tool's non-atomic protocol. The write still never
    /// overwrites a newer commit on the branch.
    BranchOnly,
}

impl WriteMode {
    fn of(advert: &Advert) -> Self {
        if advert.has_cap("atomic") {
            Self::Atomic
        } else {
            Self::BranchOnly
        }
    }
}

pub struct GitStore {
    options: StoreOptions,
    /// The embedded repository, when no hosted one is configured: its identifier and refs.
    local: Option<(String, Arc<LocalRefs>, Arc<Cache>)>,
    remotes: Mutex<HashMap<(String, String), Arc<Remote>>>,
    /// Repositories whose protocol record a LOCK of this process found agreeing (or pushed):
    /// only then may a LOCK skip the advertisement (the protocol floor).
    protocol_agreed: Mutex<HashSet<String>>,
}

/// The repository's work `f`, on a blocking thread.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, repository::Error> + Send + 'static,
) -> Result<T, repository::Error> {
    tokio::task::spawn_blocking(f).await?
}

pub(super) fn null() -> ObjectId {
    ObjectId::null(gix::hash::Kind::Sha1)
}

impl GitStore {
    /// The store for `settings`, and the identifier of its primary repository (the hosted URL, or
    /// the embedded repository's path).
    pub fn new(settings: &GitSettings) -> Result<(Self, String), OpenError> {
        let options = StoreOptions {
            cache_dir: settings.cache_dir.clone(),
            lock_ref_prefix: settings.lock_ref_prefix.clone(),
            username: settings.username.clone(),
            token: settings.token.clone(),
            primary: settings.repository.clone(),
            auth: settings.auth,
            roots: match &settings.ca_pem {
                Some(pem) => crate::transport::private_roots(pem)?,
                None => Vec::new(),
            },
            require_atomic: settings.require_atomic,
            timeout: settings.timeout,
            max_response_bytes: settings.max_response_bytes,
            max_history_depth: settings.max_history_depth,
            writes_per_push: settings.writes_per_push.max(1),
            fold_lease_age: settings.fold_lease_age,
            fold_after_writes: settings.fold_after_writes,
            state_refs: settings.state_refs,
            proof_window: settings.proof_window.min(crate::settings::MAX_PROOF_WINDOW),
        };
        match &settings.repository {
            Some(url) => Ok((
                Self {
                    options,
                    local: None,
                    remotes: Mutex::default(),
                    protocol_agreed: Mutex::default(),
                },
                url.clone(),
            )),
            None => {
                let cache = Arc::new(Cache::open_or_init(&settings.local_repository)?);
                let id = std::fs::canonicalize(&settings.local_repository)?
                    .display()
                    .to_string();
                let refs = Arc::new(LocalRefs::new(cache.clone()));
                Ok((
                    Self {
                        options,
                        local: Some((id.clone(), refs, cache)),
                        remotes: Mutex::default(),
                        protocol_agreed: Mutex::default(),
                    },
                    id,
                ))
            }
        }
    }

    /// The git token, for a repository of the configured repository's origin only: an allowlisted
    /// repository on another host, port or scheme gets no credentials.
    fn token_for(&self, repository: &str) -> Option<&str> {
        let primary = self.options.primary.as_deref()?;
        crate::transport::same_origin(primary, repository)
            .then(|| self.options.token.as_ref().map(Secret::expose))
            .flatten()
    }

    fn remote(&self, at: &Location) -> Result<Arc<Remote>, RemoteError> {
        let key = (at.repository.clone(), at.branch.as_str().to_owned());
        let mut remotes = lock(&self.remotes);
        if let Some(remote) = remotes.get(&key) {
            return Ok(remote.clone());
        }
        let (cache, transport): (Arc<Cache>, Box<dyn Transport>) = match &self.local {
            Some((id, refs, cache)) if *id == at.repository => {
                (cache.clone(), Box::new(Embedded(refs.clone())))
            }
            _ => {
                let http = SmartClient::new(
                    &at.repository,
                    &Connection {
                        username: self.options.username.as_deref(),
                        token: self.token_for(&at.repository),
                        auth: self.options.auth,
                        roots: &self.options.roots,
                        timeout: self.options.timeout,
                    },
                )?
                .with_max_response_bytes(self.options.max_response_bytes);
                (
                    Arc::new(open_cache(&self.cache_path(at))?),
                    Box::new(Hosted::new(http, self.options.require_atomic)),
                )
            }
        };
        let remote = Arc::new(Remote::new(
            at.branch.full_ref(),
            cache,
            transport,
            write::Batcher::new(self.options.writes_per_push),
            self.options.lock_ref_prefix.clone(),
        ));
        remotes.insert(key, remote.clone());
        Ok(remote)
    }

    /// The remotes of `repository` this process has opened, one per branch.
    fn remotes_of(&self, repository: &str) -> Vec<Arc<Remote>> {
        lock(&self.remotes)
            .iter()
            .filter(|((repo, _), _)| repo == repository)
            .map(|(_, remote)| remote.clone())
            .collect()
    }

    /// `<cache dir>/<hash of url and branch>-<readable name>.git`
    fn cache_path(&self, at: &Location) -> PathBuf {
        let digest = Sha1::digest(format!("{}\n{}", at.repository, at.branch).as_bytes());
        let hash: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        let readable: String = at
            .repository
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or("repo")
            .trim_end_matches(".git")
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .take(40)
            .collect();
        self.options
            .cache_dir
            .join(format!("{hash}-{readable}.git"))
    }
}

/// Open a cache, starting over if what is on disk is not a usable repository.
fn open_cache(dir: &Path) -> Result<Cache, repository::Error> {
    match Cache::open_or_init(dir) {
        Ok(cache) => Ok(cache),
        Err(error) => {
            tracing::warn!(dir = %dir.display(), error = %gitstate_core::report::chain(&error), "unusable cache, recreating");
            std::fs::remove_dir_all(dir)?;
            Cache::open_or_init(dir)
        }
    }
}

/// One name per operation, end to end: each method here calls the inherent method of the same
/// name, which holds the operation's body, in the module of its kind (`read`, `history`,
/// `lock`, `floor`, `write`, `fold`); no other function of the store bears that name.
#[async_trait]
impl StateStore for GitStore {
    async fn read_state(
        &self,
        at: &Location,
        name: &StateName,
        read: &ReadContext,
    ) -> Result<Option<Bytes>, StoreError> {
        Ok(GitStore::read_state(self, at, name, read).await?)
    }

    async fn list_states(&self, at: &Location, prefix: &str) -> Result<Vec<StateName>, StoreError> {
        Ok(GitStore::list_states(self, at, prefix).await?)
    }

    async fn listing(&self, at: &Location, read: &ReadContext) -> Result<Listing, StoreError> {
        Ok(GitStore::listing(self, at, read).await?)
    }

    async fn last_changes(
        &self,
        at: &Location,
        names: &[StateName],
        read: &ReadContext,
    ) -> Result<Vec<(StateName, Revision)>, StoreError> {
        Ok(GitStore::last_changes(self, at, names, read).await?)
    }

    async fn read_config(
        &self,
        at: &Location,
        path: &str,
        fresh_within: Duration,
        read: &ReadContext,
    ) -> Result<Option<Bytes>, StoreError> {
        Ok(GitStore::read_config(self, at, path, fresh_within, read).await?)
    }

    async fn create_config(
        &self,
        at: &Location,
        path: &str,
        content: Bytes,
        meta: &CommitMeta,
    ) -> Result<bool, StoreError> {
        Ok(GitStore::create_config(self, at, path, content, meta).await?)
    }

    async fn replace_config(
        &self,
        at: &Location,
        path: &str,
        expected: Option<Bytes>,
        content: Bytes,
        meta: &CommitMeta,
    ) -> Result<bool, StoreError> {
        Ok(GitStore::replace_config(self, at, path, expected, content, meta).await?)
    }

    async fn history(
        &self,
        at: &Location,
        name: &StateName,
        skip: usize,
        limit: usize,
    ) -> Result<HistoryPage, StoreError> {
        Ok(GitStore::history(self, at, name, skip, limit).await?)
    }

    async fn read_version(
        &self,
        at: &Location,
        name: &StateName,
        version: &str,
    ) -> Result<Option<Bytes>, StoreError> {
        Ok(GitStore::read_version(self, at, name, version).await?)
    }

    async fn list_locks(&self, at: &Location) -> Result<Vec<(StateName, HeldLock)>, StoreError> {
        Ok(GitStore::list_locks(self, at).await?)
    }

    async fn branch_status(
        &self,
        at: &Location,
        read: &ReadContext,
    ) -> Result<BranchStatus, StoreError> {
        Ok(GitStore::branch_status(self, at, read).await?)
    }

    async fn stranded_state_refs(
        &self,
        at: &Location,
        read: &ReadContext,
    ) -> Result<Vec<String>, StoreError> {
        Ok(GitStore::stranded_state_refs(self, at, read).await?)
    }

    async fn branches_with_states(
        &self,
        at: &Location,
        look: Beside<'_>,
        read: &ReadContext,
    ) -> Result<Vec<String>, StoreError> {
        Ok(GitStore::branches_with_states(self, at, look, read).await?)
    }

    async fn ready_to_write(
        &self,
        at: &Location,
        read: &ReadContext,
    ) -> Result<Option<String>, StoreError> {
        Ok(GitStore::ready_to_write(self, at, read).await?)
    }

    async fn resume_session(
        &self,
        at: &Location,
        within: std::time::Duration,
    ) -> Result<bool, StoreError> {
        Ok(GitStore::resume_session(self, at, within)?)
    }

    async fn keep_session(&self, at: &Location, keep: bool) -> Result<(), StoreError> {
        Ok(GitStore::keep_session(self, at, keep)?)
    }

    async fn protocol(
        &self,
        at: &Location,
    ) -> Result<gitstate_core::protocol::Protocol, StoreError> {
        Ok(GitStore::protocol(self, at).await?)
    }

    async fn clash(&self, at: &Location, name: &StateName) -> Result<Option<Clash>, StoreError> {
        Ok(GitStore::clash(self, at, name).await?)
    }

    async fn clash_seen(
        &self,
        at: &Location,
        name: &StateName,
    ) -> Result<Option<Clash>, StoreError> {
        Ok(GitStore::clash_seen(self, at, name).await?)
    }

    async fn read_lock(
        &self,
        at: &Location,
        name: &StateName,
    ) -> Result<Option<HeldLock>, StoreError> {
        Ok(GitStore::read_lock(self, at, name).await?)
    }

    async fn acquire_lock(
        &self,
        at: &Location,
        name: &StateName,
        lock: &LockInfo,
        meta: &CommitMeta,
    ) -> Result<Acquire, StoreError> {
        Ok(GitStore::acquire_lock(self, at, name, lock, meta).await?)
    }

    async fn known_lock(
        &self,
        at: &Location,
        name: &StateName,
    ) -> Result<Option<HeldLock>, StoreError> {
        Ok(GitStore::known_lock(self, at, name).await?)
    }

    async fn release_lock(
        &self,
        at: &Location,
        name: &StateName,
        held: &HeldLock,
    ) -> Result<Release, StoreError> {
        Ok(GitStore::release_lock(self, at, name, held).await?)
    }

    async fn write_state(
        &self,
        at: &Location,
        name: &StateName,
        change: Change,
        plan: WritePlan,
    ) -> Result<Written, StoreError> {
        Ok(GitStore::write_state(self, at, name, change, plan).await?)
    }

    async fn fold(&self, at: &Location) -> Result<FoldReport, StoreError> {
        Ok(GitStore::fold(self, at).await?)
    }

    async fn finish_folds(&self) {
        GitStore::finish_folds(self).await;
    }
}
