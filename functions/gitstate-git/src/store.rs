//! [`StateStore`] over git: the seed protocol's branch locks, made atomic.
//!
//! - read: advertised tip of the branch → fetch only if the cache lacks it → blob from the ODB;
//! - lock: push of an orphan commit holding `<name>.lock` to the lock ref, create-only;
//! - unlock: delete of the lock ref, conditional on the lock commit that was checked;
//! - write: commit on the advertised tip, pushed with compare-and-swap (atomically with an
//!   unchanged lock ref when a lock is held), rebuilt and retried when another state moved it.
//!   A remote without `atomic` gets the compare-and-swap of the branch alone, the lock having
//!   been checked in the same advertisement that gave the tip (see [`WriteMode`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use gix::ObjectId;
use sha1::{Digest, Sha1};

use gitstate_core::ports::{
    Acquire, Change, CommitMeta, HeldLock, HistoryPage, Listing, Location, Refusal, Release,
    Revision, StateStore, StoreError, WritePlan, Written, user_from_message,
};
use gitstate_core::refs::{Clash, branch_clash, lock_clash};
use gitstate_core::secret::Secret;
use gitstate_core::{BranchName, LockInfo, StateName};

use crate::Error;
use crate::cache::{Cache, Chain, Latest, NewCommit, Walk};
use crate::local::LocalRefs;
use crate::pack;
use crate::settings::{GitAuth, GitSettings};
use crate::smart::{Advert, Command, Connection, PushReport, Service, SmartHttp};

/// History is fetched this many commits deep at first, then four times deeper each time a page
/// needs more, up to [`StoreOptions::max_history_depth`].
const FIRST_HISTORY_DEPTH: u32 = 64;

/// How often a LOCK looks again after its tree check raced a write or its push was refused
/// without a holder or a clashing lock to show for it.
const MAX_LOCK_ATTEMPTS: u32 = 10;
/// A list of states trusts a ref advertisement this recent (in a cold process: the one the
/// access check just made) instead of asking again.
const LIST_REFS_FRESH: Duration = Duration::from_secs(1);

/// History pages a process keeps (each at most 100 revisions).
const MAX_REMEMBERED_HISTORIES: usize = 256;
/// Most files remembered as last changed beyond the deepest fetch.
const MAX_DEEP_CHANGES: usize = 65_536;

/// How often a write is rebuilt on a moved branch before giving up with a retryable 503.
const MAX_WRITE_ATTEMPTS: u32 = 40;
/// How long a write may keep retrying, well under a Lambda timeout.
const WRITE_DEADLINE: Duration = Duration::from_secs(20);

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
}

enum Transport {
    Local(Arc<LocalRefs>),
    Http(SmartHttp),
}

/// One (repository, branch): its cache and how to reach it.
struct Remote {
    cache: Arc<Cache>,
    transport: Transport,
    /// The newest branch tip this process has in its cache (what a fetch says it has), and when
    /// it was last seen on the remote.
    known_tip: Mutex<Option<(ObjectId, Instant)>>,
    /// Receive-pack capabilities, once advertised.
    push_caps: Mutex<Option<Advert>>,
    /// The last full ref advertisement over HTTP, and when it came.
    last_advert: Mutex<Option<(Advert, Instant)>>,
    /// History pages already walked, by (tip, path, skip, limit): a commit's history never
    /// changes, so a warm state page does not walk it again.
    histories: Mutex<HashMap<(ObjectId, String, usize, usize), HistoryPage>>,
    /// Files whose last change lies deeper than `GITSTATE_HISTORY_MAX_DEPTH`, by (branch, path,
    /// blob id): while the file holds that blob, a list does not walk the history for it again.
    deep_changes: Mutex<std::collections::HashSet<(String, String, ObjectId)>>,
    /// `GITSTATE_REQUIRE_ATOMIC`: a receive-pack advertisement without `atomic` is an error.
    require_atomic: bool,
    fetching: tokio::sync::Mutex<()>,
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f).await?
}

fn null() -> ObjectId {
    ObjectId::null(gix::hash::Kind::Sha1)
}

impl GitStore {
    /// The store for `settings`, and the identifier of its primary repository (the hosted URL, or
    /// the embedded repository's path).
    pub fn new(settings: &GitSettings) -> Result<(Self, String), Error> {
        let options = StoreOptions {
            cache_dir: settings.cache_dir.clone(),
            lock_ref_prefix: settings.lock_ref_prefix.clone(),
            username: settings.username.clone(),
            token: settings.token.clone(),
            primary: settings.repository.clone(),
            auth: settings.auth,
            roots: match &settings.ca_pem {
                Some(pem) => crate::smart::private_roots(pem)?,
                None => Vec::new(),
            },
            require_atomic: settings.require_atomic,
            timeout: settings.timeout,
            max_response_bytes: settings.max_response_bytes,
            max_history_depth: settings.max_history_depth,
        };
        match &settings.repository {
            Some(url) => Ok((
                Self {
                    options,
                    local: None,
                    remotes: Mutex::default(),
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
        crate::smart::same_origin(primary, repository)
            .then(|| self.options.token.as_ref().map(Secret::expose))
            .flatten()
    }

    fn remote(&self, at: &Location) -> Result<Arc<Remote>, Error> {
        let key = (at.repository.clone(), at.branch.as_str().to_owned());
        let mut remotes = self
            .remotes
            .lock()
            .map_err(|_| Error::Corrupt("remote table poisoned".into()))?;
        if let Some(remote) = remotes.get(&key) {
            return Ok(remote.clone());
        }
        let (cache, transport) = match &self.local {
            Some((id, refs, cache)) if *id == at.repository => {
                (cache.clone(), Transport::Local(refs.clone()))
            }
            _ => {
                let http = SmartHttp::new(
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
                    Transport::Http(http),
                )
            }
        };
        let remote = Arc::new(Remote {
            cache,
            transport,
            known_tip: Mutex::new(None),
            push_caps: Mutex::new(None),
            last_advert: Mutex::new(None),
            histories: Mutex::default(),
            deep_changes: Mutex::default(),
            require_atomic: self.options.require_atomic,
            fetching: tokio::sync::Mutex::new(()),
        });
        remotes.insert(key, remote.clone());
        Ok(remote)
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

    fn lock_ref(&self, name: &StateName) -> String {
        format!("{}{}", self.options.lock_ref_prefix, name)
    }

    /// The lock, among those `advert` lists, whose ref would clash with the lock ref of `name`.
    fn lock_clash(&self, advert: &Advert, name: &StateName) -> Option<Clash> {
        let prefix = self.options.lock_ref_prefix.as_str();
        lock_clash(
            advert.refs.keys().filter_map(|r| r.strip_prefix(prefix)),
            name.as_str(),
        )
    }

    /// What a LOCK decides from: the lock ref, the branch and every other lock ref (one
    /// receive-pack advertisement over HTTP, which lists every ref anyway).
    async fn lock_advert(
        &self,
        remote: &Remote,
        at: &Location,
        lock_ref: &str,
    ) -> Result<Advert, Error> {
        let names = vec![lock_ref.to_owned(), at.branch.full_ref()];
        let mut advert = remote.refs(Service::ReceivePack, names).await?;
        if !remote.is_cache() {
            // The embedded repository lists only the refs asked for.
            let others = remote
                .refs_with_prefix(&self.options.lock_ref_prefix)
                .await?;
            advert.refs.extend(others.refs);
        }
        Ok(advert)
    }

    /// The existing branch in the way of creating `branch`: from `advert` over HTTP (a ref
    /// advertisement lists every ref), from the refs under `refs/heads/` in the embedded
    /// repository (whose advertisement lists only the refs asked for).
    async fn branch_clash(
        &self,
        remote: &Remote,
        advert: &Advert,
        branch: &BranchName,
    ) -> Result<Option<Clash>, Error> {
        if remote.is_cache() {
            return Ok(branch_clash(advert.refs.keys().map(String::as_str), branch));
        }
        let heads = remote.refs_with_prefix("refs/heads/").await?;
        Ok(branch_clash(heads.refs.keys().map(String::as_str), branch))
    }

    /// How `path` clashes with the tree of `tip` (fetched into the cache first).
    async fn tree_clash(
        &self,
        remote: &Remote,
        tip: ObjectId,
        path: &str,
    ) -> Result<Option<Clash>, Error> {
        remote.ensure(vec![tip]).await?;
        let (cache, path) = (remote.cache.clone(), path.to_owned());
        blocking(move || cache.path_clash(tip, &path)).await
    }

    async fn held(
        &self,
        remote: &Remote,
        tip: ObjectId,
        name: &StateName,
    ) -> Result<HeldLock, Error> {
        let bytes = remote.read_with(tip, name.lock_file(), true).await?;
        let info = bytes
            .and_then(|b| LockInfo::parse(Bytes::from(b)).ok())
            .map_or_else(|| unreadable_lock(tip), Ok)?;
        let cache = remote.cache.clone();
        let (message, created) = blocking(move || cache.commit_summary(tip)).await?;
        Ok(HeldLock {
            info,
            token: tip.to_string(),
            owner: user_from_message(&message),
            created: Some(created),
        })
    }
}

/// A lock ref whose commit has no readable lock file still locks the state; describe it so an
/// administrator can see and force-unlock it.
fn unreadable_lock(tip: ObjectId) -> Result<LockInfo, Error> {
    let json = format!(
        r#"{{"ID":"{tip}","Operation":"unknown","Info":"lock ref without a readable lock file","Who":"unknown","Version":"","Created":"","Path":""}}"#
    );
    LockInfo::parse(Bytes::from(json)).map_err(|e| Error::Corrupt(e.to_string()))
}

/// Open a cache, starting over if what is on disk is not a usable repository.
fn open_cache(dir: &Path) -> Result<Cache, Error> {
    match Cache::open_or_init(dir) {
        Ok(cache) => Ok(cache),
        Err(error) => {
            tracing::warn!(dir = %dir.display(), error = %gitstate_core::report::chain(&error), "unusable cache, recreating");
            std::fs::remove_dir_all(dir)?;
            Cache::open_or_init(dir)
        }
    }
}

impl Remote {
    fn is_cache(&self) -> bool {
        matches!(self.transport, Transport::Http(_))
    }

    async fn refs(&self, service: Service, names: Vec<String>) -> Result<Advert, Error> {
        match &self.transport {
            Transport::Local(refs) => {
                let refs = refs.clone();
                blocking(move || refs.list(&names)).await
            }
            Transport::Http(http) => {
                let advert = http.advertise(service).await?;
                if let Ok(mut last) = self.last_advert.lock() {
                    *last = Some((advert.clone(), Instant::now()));
                }
                if service == Service::ReceivePack {
                    if self.require_atomic && WriteMode::of(&advert) != WriteMode::Atomic {
                        return Err(Error::AtomicRequired);
                    }
                    let caps = Advert {
                        caps: advert.caps.clone(),
                        ..Advert::default()
                    };
                    *self
                        .push_caps
                        .lock()
                        .map_err(|_| Error::Corrupt("poisoned".into()))? = Some(caps);
                }
                Ok(advert)
            }
        }
    }

    fn saw_tip(&self, tip: ObjectId) {
        if let Ok(mut known) = self.known_tip.lock() {
            *known = Some((tip, Instant::now()));
        }
    }

    /// The branch and every ref under `prefix`: one ref advertisement over HTTP, none when one
    /// came less than `fresh` ago.
    async fn branch_and_prefix(
        &self,
        branch: &str,
        prefix: &str,
        fresh: Duration,
    ) -> Result<Advert, Error> {
        match &self.transport {
            Transport::Local(refs) => {
                let (refs, branch, prefix) = (refs.clone(), branch.to_owned(), prefix.to_owned());
                blocking(move || {
                    let mut advert = refs.list_prefix(&prefix)?;
                    advert.refs.extend(refs.list(&[branch])?.refs);
                    Ok(advert)
                })
                .await
            }
            Transport::Http(_) => {
                let recent = self
                    .last_advert
                    .lock()
                    .ok()
                    .and_then(|last| last.clone())
                    .filter(|(_, when)| when.elapsed() < fresh);
                match recent {
                    Some((advert, _)) => Ok(advert),
                    None => self.refs(Service::UploadPack, Vec::new()).await,
                }
            }
        }
    }

    /// Every ref under `prefix`: one ref advertisement over HTTP.
    async fn refs_with_prefix(&self, prefix: &str) -> Result<Advert, Error> {
        match &self.transport {
            Transport::Local(refs) => {
                let (refs, prefix) = (refs.clone(), prefix.to_owned());
                blocking(move || refs.list_prefix(&prefix)).await
            }
            Transport::Http(http) => {
                let mut advert = http.advertise(Service::UploadPack).await?;
                advert.refs.retain(|name, _| name.starts_with(prefix));
                Ok(advert)
            }
        }
    }

    /// Fetch the history behind `tip`, `depth` commits deep, given the cache already holds it down
    /// to `boundary` (only what lies past it is sent).
    async fn deepen(&self, tip: ObjectId, boundary: ObjectId, depth: u32) -> Result<(), Error> {
        let Transport::Http(http) = &self.transport else {
            return Ok(());
        };
        let _one_fetch_at_a_time = self.fetching.lock().await;
        tracing::debug!(depth, "deepening the cache's history");
        let pack = http.fetch_deeper(tip, &[boundary], depth).await?;
        let cache = self.cache.clone();
        blocking(move || {
            pack::index_into(cache.git_dir(), &pack)?;
            cache.reload()
        })
        .await
    }

    /// Fetch `commit` alone (depth 1), given the cache has `tip`: refused by the remote when no
    /// ref reaches it; what `tip`'s tree shares with it is not sent.
    async fn fetch_one(&self, commit: ObjectId, tip: ObjectId) -> Result<(), Error> {
        let Transport::Http(http) = &self.transport else {
            return Ok(());
        };
        let _one_fetch_at_a_time = self.fetching.lock().await;
        let pack = http.fetch(&[commit], &[tip]).await?;
        let cache = self.cache.clone();
        blocking(move || {
            pack::index_into(cache.git_dir(), &pack)?;
            cache.reload()
        })
        .await
    }

    /// The branch tip, if this process saw it on the remote less than `within` ago.
    fn recent_tip(&self, within: Duration) -> Option<ObjectId> {
        let known = *self.known_tip.lock().ok()?;
        known
            .filter(|(_, seen)| seen.elapsed() < within)
            .map(|(tip, _)| tip)
    }

    /// Make sure the cache has `wants` (commits and everything in their trees).
    async fn ensure(&self, wants: Vec<ObjectId>) -> Result<(), Error> {
        self.ensure_with(wants, false).await
    }

    /// [`Self::ensure`] for lock commits, which have no parents: when this process has not seen
    /// the upload-pack capabilities yet, the fetch asks for none rather than spending a request
    /// on the advertisement (a cold UNLOCK stays at three requests). A branch tip needs `shallow`
    /// if offered, so for it the advertisement comes first.
    async fn ensure_with(&self, wants: Vec<ObjectId>, orphans: bool) -> Result<(), Error> {
        let Transport::Http(http) = &self.transport else {
            return Ok(());
        };
        let missing = self.missing(wants).await?;
        if missing.is_empty() {
            return Ok(());
        }
        let _one_fetch_at_a_time = self.fetching.lock().await;
        let missing = self.missing(missing).await?;
        if missing.is_empty() {
            return Ok(());
        }
        let known = *self
            .known_tip
            .lock()
            .map_err(|_| Error::Corrupt("poisoned".into()))?;
        let haves: Vec<ObjectId> = match known {
            Some((tip, _)) if self.cache.has(tip)? => vec![tip],
            _ => Vec::new(),
        };
        if !orphans && !http.knows_fetch_capabilities() {
            http.advertise(Service::UploadPack).await?;
        }
        let pack = http.fetch(&missing, &haves).await?;
        let cache = self.cache.clone();
        blocking(move || {
            pack::index_into(cache.git_dir(), &pack)?;
            cache.reload()
        })
        .await?;
        if !self.missing(missing).await?.is_empty() {
            return Err(Error::Remote(
                "the fetch did not deliver the requested commits".into(),
            ));
        }
        Ok(())
    }

    async fn missing(&self, ids: Vec<ObjectId>) -> Result<Vec<ObjectId>, Error> {
        let cache = self.cache.clone();
        blocking(move || {
            let repo = cache.repo()?;
            Ok(ids.into_iter().filter(|id| !repo.has_object(id)).collect())
        })
        .await
    }

    /// `path` at `commit`, fetching first if needed. A cache that fails to read is rebuilt once.
    async fn read(&self, commit: ObjectId, path: String) -> Result<Option<Vec<u8>>, Error> {
        self.read_with(commit, path, false).await
    }

    /// [`Self::read`]; `orphan`: `commit` has no parents (a lock), see [`Self::ensure_with`].
    async fn read_with(
        &self,
        commit: ObjectId,
        path: String,
        orphan: bool,
    ) -> Result<Option<Vec<u8>>, Error> {
        self.ensure_with(vec![commit], orphan).await?;
        let cache = self.cache.clone();
        let first_path = path.clone();
        match blocking(move || cache.read_path(commit, &first_path)).await {
            Ok(found) => Ok(found),
            Err(error) if self.is_cache() => {
                tracing::warn!(error = %gitstate_core::report::chain(&error), "cache read failed");
                self.rebuild().await?;
                self.ensure_with(vec![commit], orphan).await?;
                let cache = self.cache.clone();
                blocking(move || cache.read_path(commit, &path)).await
            }
            Err(error) => Err(error),
        }
    }

    async fn rebuild(&self) -> Result<(), Error> {
        let _no_fetch_meanwhile = self.fetching.lock().await;
        if let Ok(mut known) = self.known_tip.lock() {
            *known = None;
        }
        let cache = self.cache.clone();
        blocking(move || cache.rebuild()).await
    }

    async fn commit(
        &self,
        parent: Option<ObjectId>,
        path: String,
        content: Option<Bytes>,
        meta: CommitMeta,
    ) -> Result<NewCommit, Error> {
        let cache = self.cache.clone();
        blocking(move || cache.commit(parent, &path, content.as_deref(), &meta)).await
    }

    async fn push(
        &self,
        commands: Vec<Command>,
        objects: Vec<ObjectId>,
    ) -> Result<PushReport, Error> {
        // What was advertised before a push of ours is out of date.
        if let Ok(mut last) = self.last_advert.lock() {
            *last = None;
        }
        match &self.transport {
            Transport::Local(refs) => {
                let refs = refs.clone();
                blocking(move || refs.push(&commands)).await
            }
            Transport::Http(http) => {
                let known = self
                    .push_caps
                    .lock()
                    .map_err(|_| Error::Corrupt("poisoned".into()))?
                    .clone();
                let caps = match known {
                    Some(caps) => caps,
                    None => self.refs(Service::ReceivePack, Vec::new()).await?,
                };
                let pack = if commands.iter().all(|c| c.new.is_null()) {
                    None
                } else {
                    let cache = self.cache.clone();
                    Some(
                        blocking(move || {
                            let objects = objects
                                .into_iter()
                                .map(|id| cache.object(id))
                                .collect::<Result<Vec<_>, _>>()?;
                            pack::write(&objects)
                        })
                        .await?,
                    )
                };
                http.push(&caps, &commands, pack).await
            }
        }
    }
}

#[async_trait]
impl StateStore for GitStore {
    async fn read_state(
        &self,
        at: &Location,
        name: &StateName,
    ) -> Result<Option<Bytes>, StoreError> {
        Ok(self.read_path(at, name.to_string()).await?)
    }

    async fn list_states(&self, at: &Location, prefix: &str) -> Result<Vec<StateName>, StoreError> {
        let remote = self.remote(at)?;
        let branch = at.branch.full_ref();
        let advert = remote
            .refs(Service::UploadPack, vec![branch.clone()])
            .await?;
        let Some(tip) = advert.tip(&branch) else {
            return Ok(Vec::new());
        };
        remote.ensure(vec![tip]).await?;
        let cache = remote.cache.clone();
        let files = blocking(move || cache.list_files(tip)).await?;
        Ok(files
            .iter()
            .filter(|path| path.starts_with(prefix) && !path.starts_with(".gitstate/"))
            .filter_map(|path| StateName::parse(path).ok())
            .collect())
    }

    async fn listing(&self, at: &Location) -> Result<Listing, StoreError> {
        let remote = self.remote(at)?;
        let branch = at.branch.full_ref();
        let prefix = self.options.lock_ref_prefix.as_str();
        let mut fresh = LIST_REFS_FRESH;
        let mut attempt = 0;
        // One advertisement, then one fetch of the tip and every lock commit the cache lacks.
        let (advert, tip) = loop {
            attempt += 1;
            let advert = remote.branch_and_prefix(&branch, prefix, fresh).await?;
            let tip = advert.tip(&branch);
            let wants = advert
                .refs
                .iter()
                .filter(|(name, _)| name.starts_with(prefix))
                .map(|(_, id)| *id)
                .chain(tip)
                .collect();
            match remote.ensure(wants).await {
                Ok(()) => break (advert, tip),
                // A ref moved between advertisement and fetch: look again.
                Err(Error::Remote(why)) if attempt < 4 => {
                    tracing::debug!(why, "refs moved during a list, retrying");
                    fresh = Duration::ZERO;
                }
                Err(other) => return Err(other.into()),
            }
        };
        let (files, index) = match tip {
            Some(tip) => {
                remote.saw_tip(tip);
                let cache = remote.cache.clone();
                blocking(move || {
                    let files = cache.list_blobs(tip)?;
                    let index = cache.read_path(tip, gitstate_core::index::INDEX_PATH)?;
                    Ok((files, index))
                })
                .await?
            }
            None => (Vec::new(), None),
        };
        let files = files
            .into_iter()
            .filter(|(path, _)| !path.starts_with(".gitstate/"))
            .filter_map(|(path, blob)| {
                Some((StateName::parse(&path).ok()?, Some(blob.to_string())))
            })
            .collect();
        let mut lock_tips: Vec<(StateName, ObjectId)> = advert
            .refs
            .iter()
            .filter_map(|(r, id)| Some((StateName::parse(r.strip_prefix(prefix)?).ok()?, *id)))
            .collect();
        lock_tips.sort();
        let mut locks = Vec::with_capacity(lock_tips.len());
        for (name, lock_tip) in lock_tips {
            let held = self.held(&remote, lock_tip, &name).await?;
            locks.push((name, held));
        }
        Ok(Listing {
            files,
            index: index.map(Bytes::from),
            locks,
        })
    }

    async fn last_changes(
        &self,
        at: &Location,
        names: &[StateName],
    ) -> Result<Vec<(StateName, Revision)>, StoreError> {
        let remote = self.remote(at)?;
        let Some(tip) = self.branch_tip(&remote, at).await? else {
            return Ok(Vec::new());
        };
        let branch = at.branch.full_ref();
        let cache = remote.cache.clone();
        let blobs: HashMap<String, ObjectId> = blocking(move || cache.list_blobs(tip))
            .await?
            .into_iter()
            .collect();
        // Files already known to have changed last beyond the deepest fetch are not looked for.
        let deep = |path: &String| {
            blobs.get(path).is_some_and(|blob| {
                remote
                    .deep_changes
                    .lock()
                    .is_ok_and(|deep| deep.contains(&(branch.clone(), path.clone(), *blob)))
            })
        };
        let paths: Vec<String> = names
            .iter()
            .map(ToString::to_string)
            .filter(|path| !deep(path))
            .collect();
        if paths.is_empty() {
            return Ok(Vec::new());
        }
        let answer = |mut found: HashMap<String, Revision>| {
            names
                .iter()
                .filter_map(|name| Some((name.clone(), found.remove(name.as_str())?)))
                .collect()
        };
        let max = self.options.max_history_depth;
        let mut depth = FIRST_HISTORY_DEPTH.min(max);
        loop {
            let (cache, wanted) = (remote.cache.clone(), paths.clone());
            match blocking(move || cache.last_changes(tip, &wanted)).await? {
                Latest::Done(found) => return Ok(answer(found)),
                Latest::Shallow { walked, found } if remote.is_cache() => {
                    let walked = u32::try_from(walked).unwrap_or(u32::MAX);
                    if walked >= max {
                        // As deep as this deployment fetches: files changed only before that
                        // are listed without a last change, and not looked for again while
                        // they hold the same content.
                        tracing::info!(
                            max,
                            "last changes looked up as far as GITSTATE_HISTORY_MAX_DEPTH"
                        );
                        if let Ok(mut deep) = remote.deep_changes.lock() {
                            if deep.len() >= MAX_DEEP_CHANGES {
                                deep.clear();
                            }
                            for path in paths.iter().filter(|p| !found.contains_key(*p)) {
                                if let Some(blob) = blobs.get(path) {
                                    deep.insert((branch.clone(), path.clone(), *blob));
                                }
                            }
                        }
                        return Ok(answer(found));
                    }
                    depth = deepen_past(&remote, tip, walked, depth, max).await?;
                }
                Latest::Shallow { .. } => {
                    return Err(Error::Corrupt("history has a missing parent commit".into()).into());
                }
            }
        }
    }

    async fn read_config(
        &self,
        at: &Location,
        path: &str,
        fresh_within: Duration,
    ) -> Result<Option<Bytes>, StoreError> {
        let remote = self.remote(at)?;
        if let Some(tip) = remote.recent_tip(fresh_within) {
            return Ok(remote.read(tip, path.to_owned()).await?.map(Bytes::from));
        }
        Ok(self.read_path(at, path.to_owned()).await?)
    }

    async fn create_config(
        &self,
        at: &Location,
        path: &str,
        content: Bytes,
        meta: &CommitMeta,
    ) -> Result<bool, StoreError> {
        let meta = meta.clone();
        let plan: WritePlan = Arc::new(move |_, stored| match stored {
            Some(_) => Err(Refusal::Exists),
            None => Ok(meta.clone()),
        });
        Ok(matches!(
            self.write_loop(at, path, None, Change::Put(content), plan)
                .await?,
            Written::Committed { .. }
        ))
    }

    async fn history(
        &self,
        at: &Location,
        name: &StateName,
        skip: usize,
        limit: usize,
    ) -> Result<HistoryPage, StoreError> {
        let remote = self.remote(at)?;
        let Some(tip) = self.branch_tip(&remote, at).await? else {
            return Ok(HistoryPage::default());
        };
        let key = (tip, name.to_string(), skip, limit);
        if let Some(page) = remote
            .histories
            .lock()
            .ok()
            .and_then(|h| h.get(&key).cloned())
        {
            return Ok(page);
        }
        let max = self.options.max_history_depth;
        let mut depth = FIRST_HISTORY_DEPTH.min(max);
        loop {
            let (cache, path) = (remote.cache.clone(), name.to_string());
            match blocking(move || cache.history(tip, &path, skip, limit)).await? {
                Walk::Done(page) => {
                    if let Ok(mut histories) = remote.histories.lock() {
                        if histories.len() >= MAX_REMEMBERED_HISTORIES {
                            histories.clear();
                        }
                        histories.insert(key, page.clone());
                    }
                    return Ok(page);
                }
                Walk::Shallow { walked, partial } if remote.is_cache() => {
                    let walked = u32::try_from(walked).unwrap_or(u32::MAX);
                    if walked >= max {
                        // As deep as this deployment fetches: the page ends here.
                        tracing::info!(max, "history listed as far as GITSTATE_HISTORY_MAX_DEPTH");
                        return Ok(partial);
                    }
                    depth = deepen_past(&remote, tip, walked, depth, max).await?;
                }
                Walk::Shallow { .. } => {
                    return Err(Error::Corrupt("history has a missing parent commit".into()).into());
                }
            }
        }
    }

    async fn read_version(
        &self,
        at: &Location,
        name: &StateName,
        version: &str,
    ) -> Result<Option<Bytes>, StoreError> {
        let Ok(commit) = ObjectId::from_hex(version.as_bytes()) else {
            return Ok(None);
        };
        let remote = self.remote(at)?;
        // A revision on the chain of a tip this process already saw needs no git request (history
        // pages read every revision they list this way).
        let seen_tip = remote.recent_tip(Duration::MAX);
        let on_seen_chain = match seen_tip {
            Some(seen) if remote.cache.has(commit)? => {
                let cache = remote.cache.clone();
                blocking(move || cache.find_on_chain(seen, commit)).await? == Chain::Found
            }
            _ => false,
        };
        if !on_seen_chain && !self.find_on_branch(&remote, at, commit).await? {
            return Ok(None);
        }
        let cache = remote.cache.clone();
        let path = name.to_string();
        match blocking(move || cache.read_path(commit, &path)).await {
            Ok(found) => Ok(found.map(Bytes::from)),
            // Not a commit (a tree or blob id): no such revision.
            Err(Error::Git(_)) => Ok(None),
            Err(other) => Err(other.into()),
        }
    }

    async fn list_locks(&self, at: &Location) -> Result<Vec<(StateName, HeldLock)>, StoreError> {
        let remote = self.remote(at)?;
        let prefix = &self.options.lock_ref_prefix;
        let advert = remote.refs_with_prefix(prefix).await?;
        let mut tips: Vec<(StateName, ObjectId)> = advert
            .refs
            .iter()
            .filter_map(|(r, id)| {
                let name = StateName::parse(r.strip_prefix(prefix.as_str())?).ok()?;
                Some((name, *id))
            })
            .collect();
        tips.sort();
        // One fetch for every lock commit the cache lacks.
        remote
            .ensure_with(tips.iter().map(|(_, id)| *id).collect(), true)
            .await?;
        let mut locks = Vec::with_capacity(tips.len());
        for (name, tip) in tips {
            let held = self.held(&remote, tip, &name).await?;
            locks.push((name, held));
        }
        Ok(locks)
    }

    async fn clash(&self, at: &Location, name: &StateName) -> Result<Option<Clash>, StoreError> {
        let remote = self.remote(at)?;
        let Some(tip) = self.branch_tip(&remote, at).await? else {
            return Ok(None);
        };
        Ok(self.tree_clash(&remote, tip, name.as_str()).await?)
    }

    async fn read_lock(
        &self,
        at: &Location,
        name: &StateName,
    ) -> Result<Option<HeldLock>, StoreError> {
        let remote = self.remote(at)?;
        let lock_ref = self.lock_ref(name);
        // The receive-pack advertisement lists the same refs and also carries the push
        // capabilities, so an UNLOCK in a fresh process needs no second advertisement.
        let advert = remote
            .refs(Service::ReceivePack, vec![lock_ref.clone()])
            .await?;
        match advert.tip(&lock_ref) {
            Some(tip) => Ok(Some(self.held(&remote, tip, name).await?)),
            None => Ok(None),
        }
    }

    async fn acquire_lock(
        &self,
        at: &Location,
        name: &StateName,
        lock: &LockInfo,
        meta: &CommitMeta,
    ) -> Result<Acquire, StoreError> {
        let remote = self.remote(at)?;
        let lock_ref = self.lock_ref(name);
        let mut refused = None;
        let mut last_attempt = Duration::ZERO;
        // A refused push is judged from the refs, not from the error text: someone took the
        // lock first (held), or created a lock ref it clashes with (a directory/file conflict,
        // which git http-backend reports as `ng <ref> failed to update ref`): look again.
        for attempt in 1..=MAX_LOCK_ATTEMPTS {
            if attempt > 1 {
                tokio::time::sleep(backoff(attempt, last_attempt)).await;
            }
            let attempt_started = Instant::now();
            let advert = self.lock_advert(&remote, at, &lock_ref).await?;
            if let Some(tip) = advert.tip(&lock_ref) {
                return Ok(Acquire::Held(self.held(&remote, tip, name).await?));
            }
            if let Some(clash) = self.lock_clash(&advert, name) {
                return Ok(Acquire::Clash(clash));
            }
            if let Some(tip) = advert.tip(&at.branch.full_ref()) {
                match self.tree_clash(&remote, tip, name.as_str()).await {
                    Ok(Some(clash)) => return Ok(Acquire::Clash(clash)),
                    Ok(None) => {}
                    // The branch moved between advertisement and fetch ("not our ref"): look again.
                    Err(error) if error.is_transient() => {
                        tracing::debug!(attempt, error = %gitstate_core::report::chain(&error), "lock's tree check raced a write, retrying");
                        last_attempt = attempt_started.elapsed();
                        refused = None;
                        continue;
                    }
                    Err(error) => return Err(error.into()),
                }
            }
            let commit = remote
                .commit(
                    None,
                    name.lock_file(),
                    Some(lock.as_bytes().clone()),
                    meta.clone(),
                )
                .await?;
            let command = Command {
                old: null(),
                new: commit.id,
                name: lock_ref.clone(),
            };
            let report = remote.push(vec![command.clone()], commit.objects).await?;
            if report.all_ok(&[command]) {
                return Ok(Acquire::Acquired);
            }
            refused = Some(report);
            last_attempt = attempt_started.elapsed();
        }
        match refused {
            Some(report) => Err(Error::Remote(format!(
                "the remote kept refusing to create {lock_ref} ({report:?})"
            ))
            .into()),
            // The branch kept moving under the tree check: busy, retryable.
            None => Err(StoreError::Contention {
                attempts: MAX_LOCK_ATTEMPTS,
            }),
        }
    }

    async fn release_lock(
        &self,
        at: &Location,
        name: &StateName,
        held: &HeldLock,
    ) -> Result<Release, StoreError> {
        let remote = self.remote(at)?;
        let Ok(old) = ObjectId::from_hex(held.token.as_bytes()) else {
            return Ok(Release::Changed);
        };
        // The delete is conditional on the lock commit that was checked: the server refuses it
        // if the lock changed meanwhile, so no fresh advertisement is needed.
        let command = Command {
            old,
            new: null(),
            name: self.lock_ref(name),
        };
        let report = remote.push(vec![command.clone()], Vec::new()).await?;
        Ok(if report.all_ok(&[command]) {
            Release::Released
        } else {
            Release::Changed
        })
    }

    async fn write_state(
        &self,
        at: &Location,
        name: &StateName,
        change: Change,
        plan: WritePlan,
    ) -> Result<Written, StoreError> {
        self.write_loop(at, name.as_str(), Some(name), change, plan)
            .await
    }
}

/// How long to wait before write attempt `attempt` (2, 3, …) after one that took `last`: full
/// jitter over a window that starts at half an attempt's duration and doubles with each loss.
/// Scaling with the attempt (rather than a fixed 10 ms base) spreads contenders by about the time
/// a winner needs from advertisement to push, whatever the remote's round trip (BENCHMARKS.md
/// compares it with the fixed 10 ms base it replaced).
/// Deepen the cache's history behind `tip` after a walk stopped at its shallow boundary having
/// `walked` commits: at least twice that, at least `depth`, at most `max`, declaring the
/// boundary so only the commits past it come. Returns the depth to ask for next time.
async fn deepen_past(
    remote: &Remote,
    tip: ObjectId,
    walked: u32,
    depth: u32,
    max: u32,
) -> Result<u32, Error> {
    let cache = remote.cache.clone();
    let Chain::Shallow { boundary, .. } =
        blocking(move || cache.find_on_chain(tip, null())).await?
    else {
        return Err(Error::Corrupt("history boundary moved".into()));
    };
    let depth = depth.max(walked.saturating_mul(2)).min(max);
    remote.deepen(tip, boundary, depth).await?;
    Ok(depth.saturating_mul(4))
}

fn backoff(attempt: u32, last: Duration) -> Duration {
    let base = (last / 2).clamp(Duration::from_millis(10), Duration::from_millis(250));
    let window = base.saturating_mul(1 << attempt.saturating_sub(2).min(5));
    let millis = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
    Duration::from_millis(rand::random_range(0..millis))
}

/// How one write attempt ended.
enum Attempt {
    Done(Written),
    /// The remote refused the push: another writer moved the branch or the lock changed.
    Lost(PushReport),
}

impl GitStore {
    /// The advertised tip of the branch, fetched into the cache.
    /// Make the cache hold `commit` if it is on the branch's first-parent chain, fetching only what
    /// that needs: the commit alone first (an id no ref reaches is refused by the remote, one
    /// request), then history down to it, within [`StoreOptions::max_history_depth`].
    /// `Ok(false)`: not on the branch (as deep as this deployment looks).
    async fn find_on_branch(
        &self,
        remote: &Remote,
        at: &Location,
        commit: ObjectId,
    ) -> Result<bool, Error> {
        let Some(tip) = self.branch_tip(remote, at).await? else {
            return Ok(false);
        };
        if remote.is_cache() && !remote.cache.has(commit)? {
            match remote.fetch_one(commit, tip).await {
                Ok(()) => {}
                Err(Error::Remote(why)) => {
                    tracing::info!(%commit, "the remote has no such commit: {why}");
                    return Ok(false);
                }
                Err(other) => return Err(other),
            }
        }
        if !remote.cache.is_commit(commit)? {
            // A tree or blob id (or nothing at all): no revision.
            return Ok(false);
        }
        let max = self.options.max_history_depth;
        let mut depth = FIRST_HISTORY_DEPTH.min(max);
        loop {
            let cache = remote.cache.clone();
            match blocking(move || cache.find_on_chain(tip, commit)).await? {
                Chain::Found => return Ok(true),
                Chain::Absent => return Ok(false),
                Chain::Shallow { boundary, walked } => {
                    let walked = u32::try_from(walked).unwrap_or(u32::MAX);
                    if !remote.is_cache() || walked >= max {
                        return Ok(false);
                    }
                    depth = depth.max(walked.saturating_mul(2)).min(max);
                    remote.deepen(tip, boundary, depth).await?;
                    depth = depth.saturating_mul(4);
                }
            }
        }
    }

    async fn branch_tip(&self, remote: &Remote, at: &Location) -> Result<Option<ObjectId>, Error> {
        let branch = at.branch.full_ref();
        let advert = remote
            .refs(Service::UploadPack, vec![branch.clone()])
            .await?;
        let Some(tip) = advert.tip(&branch) else {
            return Ok(None);
        };
        remote.ensure(vec![tip]).await?;
        remote.saw_tip(tip);
        Ok(Some(tip))
    }

    /// Read `path` at the advertised branch tip.
    async fn read_path(&self, at: &Location, path: String) -> Result<Option<Bytes>, Error> {
        let remote = self.remote(at)?;
        let branch = at.branch.full_ref();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let advert = remote
                .refs(Service::UploadPack, vec![branch.clone()])
                .await?;
            let Some(tip) = advert.tip(&branch) else {
                return Ok(None);
            };
            match remote.read(tip, path.clone()).await {
                Ok(state) => {
                    remote.saw_tip(tip);
                    return Ok(state.map(Bytes::from));
                }
                // The tip moved between advertisement and fetch: look again, a few times.
                Err(Error::Remote(why)) if attempt < 4 => {
                    tracing::debug!(why, "tip moved during a read, retrying")
                }
                Err(other) => return Err(other),
            }
        }
    }

    /// Write `path`, guarded by the lock of `lock` when given; retried on a moved branch.
    async fn write_loop(
        &self,
        at: &Location,
        path: &str,
        lock: Option<&StateName>,
        change: Change,
        plan: WritePlan,
    ) -> Result<Written, StoreError> {
        let remote = self.remote(at)?;
        let started = std::time::Instant::now();
        let mut last_error = None;
        let mut last_attempt = Duration::ZERO;
        for attempt in 1..=MAX_WRITE_ATTEMPTS {
            if attempt > 1 {
                tokio::time::sleep(backoff(attempt, last_attempt)).await;
                if started.elapsed() > WRITE_DEADLINE {
                    break;
                }
            }
            let attempt_started = std::time::Instant::now();
            let outcome = self
                .write_attempt(&remote, at, path, lock, &change, &plan)
                .await;
            last_attempt = attempt_started.elapsed();
            match outcome {
                Ok(Attempt::Done(written)) => return Ok(written),
                Ok(Attempt::Lost(report)) => {
                    tracing::debug!(
                        attempt,
                        ?report,
                        "write lost a race, rebuilding on the new tip"
                    );
                }
                // A tip that moved between advertisement and fetch ("not our ref"), a remote that
                // hiccuped: every attempt starts from what the remote says now, and a push that
                // did land shows up as "unchanged", so trying again is safe.
                Err(error) if error.is_transient() => {
                    tracing::debug!(attempt, error = %gitstate_core::report::chain(&error), "write attempt failed, retrying");
                    last_error = Some(error);
                }
                Err(error) => return Err(error.into()),
            }
        }
        match last_error {
            Some(error) => Err(error.into()),
            None => Err(StoreError::Contention {
                attempts: MAX_WRITE_ATTEMPTS,
            }),
        }
    }

    async fn write_attempt(
        &self,
        remote: &Remote,
        at: &Location,
        path: &str,
        lock: Option<&StateName>,
        change: &Change,
        plan: &WritePlan,
    ) -> Result<Attempt, Error> {
        let branch = at.branch.full_ref();
        let lock_ref = lock.map(|name| self.lock_ref(name));
        let advert = remote
            .refs(
                Service::ReceivePack,
                std::iter::once(branch.clone())
                    .chain(lock_ref.clone())
                    .collect(),
            )
            .await?;
        let tip = advert.tip(&branch);
        let lock_tip = match (&lock_ref, lock) {
            (Some(lock_ref), Some(name)) => advert.tip(lock_ref).map(|t| (t, lock_ref, name)),
            _ => None,
        };
        remote
            .ensure(tip.into_iter().chain(lock_tip.map(|l| l.0)).collect())
            .await?;
        // The tree rule, against the very tree the commit is built on: a concurrent writer that
        // slips a clashing path in makes the push below lose the compare-and-swap, and the next
        // attempt sees it here.
        if let Some(tip) = tip {
            let (cache, owned) = (remote.cache.clone(), path.to_owned());
            if let Some(clash) = blocking(move || cache.path_clash(tip, &owned)).await? {
                return Ok(Attempt::Done(Written::Refused(Refusal::Clash(clash))));
            }
        }
        let held = match lock_tip {
            Some((lock_tip, _, name)) => Some(self.held(remote, lock_tip, name).await?),
            None => None,
        };
        let stored = match tip {
            Some(tip) => remote.read(tip, path.to_owned()).await?,
            None => None,
        };
        let meta = match plan(held.as_ref(), stored.as_deref()) {
            Ok(meta) => meta,
            Err(refusal) => return Ok(Attempt::Done(Written::Refused(refusal))),
        };
        let content = match change {
            Change::Put(bytes) if stored.as_deref() == Some(bytes.as_ref()) => {
                return Ok(Attempt::Done(Written::Unchanged));
            }
            Change::Put(bytes) => Some(bytes.clone()),
            Change::Delete => None,
        };
        // A new branch git cannot create next to an existing one (`env/a/b` while `env/a`
        // exists): refuse it now rather than push. A clashing branch created by someone else
        // after this look makes the push fail, and the next attempt refuses it here.
        if tip.is_none()
            && let Some(clash) = self.branch_clash(remote, &advert, &at.branch).await?
        {
            return Ok(Attempt::Done(Written::Refused(Refusal::Clash(clash))));
        }
        let commit = remote.commit(tip, path.to_owned(), content, meta).await?;
        let mut commands = vec![Command {
            old: tip.unwrap_or_else(null),
            new: commit.id,
            name: branch,
        }];
        if let (Some((lock_tip, lock_ref, _)), WriteMode::Atomic) =
            (lock_tip, WriteMode::of(&advert))
        {
            // The plan accepted the lock as it is: the write lands only if it still is.
            commands.push(Command {
                old: lock_tip,
                new: lock_tip,
                name: lock_ref.clone(),
            });
        }
        let report = remote.push(commands.clone(), commit.objects).await?;
        if report.all_ok(&commands) {
            remote.saw_tip(commit.id);
            return Ok(Attempt::Done(Written::Committed {
                version: commit.id.to_string(),
            }));
        }
        Ok(Attempt::Lost(report))
    }
}
