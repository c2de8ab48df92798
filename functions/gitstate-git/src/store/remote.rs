//! One remote (repository and branch) and its cache: ref advertisements, fetches, pushes.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use gix::ObjectId;

use gitstate_core::ports::{CommitMeta, HistoryPage};

use super::write::Batcher;
use super::{WriteMode, blocking};
use crate::Error;
use crate::cache::{Cache, NewCommit};
use crate::local::LocalRefs;
use crate::pack;
use crate::protocol::{Advert, Service};
use crate::smart::{Blobs, Command, PushReport, SmartHttp};
use crate::sync::lock;

pub(super) enum Transport {
    Local(Arc<LocalRefs>),
    Http(SmartHttp),
}

/// One (repository, branch): its cache and how to reach it.
pub(super) struct Remote {
    pub(super) cache: Arc<Cache>,
    pub(super) transport: Transport,
    /// The newest branch tip this process has in its cache (what a fetch says it has), and when
    /// it was last seen on the remote.
    pub(super) known_tip: Mutex<Option<(ObjectId, Instant)>>,
    /// Receive-pack capabilities, once advertised.
    pub(super) push_caps: Mutex<Option<Advert>>,
    /// The last full ref advertisement over HTTP, and when it was asked for.
    pub(super) last_advert: Mutex<Option<(Advert, Instant)>>,
    /// When this process last began a push.
    pub(super) last_push: Mutex<Option<Instant>>,
    /// History pages already walked, by (tip, path, skip, limit): a commit's history never
    /// changes, so a warm state page does not walk it again.
    pub(super) histories: Mutex<HashMap<(ObjectId, String, usize, usize), HistoryPage>>,
    /// Files whose last change lies deeper than `GITSTATE_HISTORY_MAX_DEPTH`, by (branch, path,
    /// blob id): while the file holds that blob, a list does not walk the history for it again.
    pub(super) deep_changes: Mutex<std::collections::HashSet<(String, String, ObjectId)>>,
    /// `GITSTATE_REQUIRE_ATOMIC`: a receive-pack advertisement without `atomic` is an error.
    pub(super) require_atomic: bool,
    pub(super) fetching: tokio::sync::Mutex<()>,
    /// The remote offers `filter` but would not send blobs by id: fetch commits whole.
    pub(super) whole_fetches: std::sync::atomic::AtomicBool,
    /// Lock commits this process pushed, by lock ref (see the `floor` module).
    pub(super) made_locks: Mutex<HashMap<String, ObjectId>>,
    /// The remote refused a push without a fresh advertisement: always advertise first.
    pub(super) no_floor: std::sync::atomic::AtomicBool,
    /// Writes waiting to be pushed together (see the `write` module).
    pub(super) batcher: Batcher,
}

impl Remote {
    pub(super) fn is_cache(&self) -> bool {
        matches!(self.transport, Transport::Http(_))
    }

    pub(super) async fn refs(&self, service: Service, names: Vec<String>) -> Result<Advert, Error> {
        match &self.transport {
            Transport::Local(refs) => {
                let refs = refs.clone();
                blocking(move || refs.list(&names)).await
            }
            Transport::Http(http) => {
                // Stamped when asked, not when answered: it reflects no later write. One asked
                // before a push of ours began is not kept (it may not show that push).
                let asked = Instant::now();
                let advert = http.advertise(service).await?;
                let pushed_since = lock(&self.last_push).is_some_and(|pushed| pushed >= asked);
                let mut last = lock(&self.last_advert);
                if !pushed_since && last.as_ref().is_none_or(|(_, kept)| *kept <= asked) {
                    *last = Some((advert.clone(), asked));
                }
                drop(last);
                if service == Service::ReceivePack {
                    if self.require_atomic && WriteMode::of(&advert) != WriteMode::Atomic {
                        return Err(Error::AtomicRequired);
                    }
                    let caps = Advert {
                        caps: advert.caps.clone(),
                        ..Advert::default()
                    };
                    *lock(&self.push_caps) = Some(caps);
                }
                Ok(advert)
            }
        }
    }

    /// The last full advertisement, if it came after the request being served began (see
    /// `gitstate_core::scope`): it reflects every write that finished before the request.
    pub(super) fn advert_in_scope(&self) -> Option<Advert> {
        let scope = gitstate_core::scope::Scope::current()?;
        let last = lock(&self.last_advert);
        last.as_ref()
            .filter(|(_, when)| *when >= scope.began)
            .map(|(advert, _)| advert.clone())
    }

    pub(super) fn saw_tip(&self, tip: ObjectId) {
        *lock(&self.known_tip) = Some((tip, Instant::now()));
    }

    /// The branch and every ref under `prefix`: one ref advertisement over HTTP, none when one
    /// came less than `fresh` ago.
    pub(super) async fn branch_and_prefix(
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
                let recent = lock(&self.last_advert)
                    .clone()
                    .filter(|(_, when)| when.elapsed() < fresh);
                match recent {
                    Some((advert, _)) => Ok(advert),
                    None => self.refs(Service::UploadPack, Vec::new()).await,
                }
            }
        }
    }

    /// Every ref, and the ref `HEAD` names: one upload-pack advertisement over HTTP (its
    /// `symref=HEAD:` capability), the repository's refs and `HEAD` when embedded.
    pub(super) async fn every_ref(&self) -> Result<(Advert, Option<String>), Error> {
        match &self.transport {
            Transport::Local(refs) => {
                let refs = refs.clone();
                blocking(move || Ok((refs.list_prefix("refs/")?, refs.head_target()))).await
            }
            Transport::Http(_) => {
                // A read of this request just asked: its advertisement lists every ref.
                let advert = match self.advert_in_scope() {
                    Some(advert) => advert,
                    None => self.refs(Service::UploadPack, Vec::new()).await?,
                };
                let head = advert
                    .caps
                    .iter()
                    .find_map(|cap| cap.strip_prefix("symref=HEAD:"))
                    .map(str::to_owned);
                Ok((advert, head))
            }
        }
    }

    /// Every ref under `prefix`: one ref advertisement over HTTP.
    pub(super) async fn refs_with_prefix(&self, prefix: &str) -> Result<Advert, Error> {
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
    pub(super) async fn deepen(
        &self,
        tip: ObjectId,
        boundary: ObjectId,
        depth: u32,
    ) -> Result<(), Error> {
        let Transport::Http(http) = &self.transport else {
            return Ok(());
        };
        let _one_fetch_at_a_time = self.fetching.lock().await;
        tracing::debug!(depth, "deepening the cache's history");
        let pack = http
            .fetch_deeper(tip, &[boundary], depth, self.blobs(http))
            .await?;
        self.index(pack).await
    }

    /// Fetch `commit` alone (depth 1), given the cache has `tip`: refused by the remote when no
    /// ref reaches it; what `tip`'s tree shares with it is not sent.
    pub(super) async fn fetch_one(&self, commit: ObjectId, tip: ObjectId) -> Result<(), Error> {
        let Transport::Http(http) = &self.transport else {
            return Ok(());
        };
        let _one_fetch_at_a_time = self.fetching.lock().await;
        let pack = http.fetch(&[commit], &[tip], self.blobs(http)).await?;
        self.index(pack).await
    }

    /// The branch tip, if this process saw it on the remote less than `within` ago.
    pub(super) fn recent_tip(&self, within: Duration) -> Option<ObjectId> {
        let known = *lock(&self.known_tip);
        known
            .filter(|(_, seen)| seen.elapsed() < within)
            .map(|(tip, _)| tip)
    }

    /// What fetches of branch commits bring: their trees only when the remote can send blobs by id
    /// later (and has not refused to), else everything.
    fn blobs(&self, http: &SmartHttp) -> Blobs {
        if http.offers_filter() && !self.whole_fetches.load(Ordering::Relaxed) {
            Blobs::None
        } else {
            Blobs::All
        }
    }

    /// Index a received pack into the cache.
    async fn index(&self, pack: Vec<u8>) -> Result<(), Error> {
        let cache = self.cache.clone();
        blocking(move || {
            pack::index_into(cache.git_dir(), &pack)?;
            cache.reload()
        })
        .await
    }

    /// Make sure the cache holds the blobs at `paths` in `commit` (whose trees it has): those it
    /// lacks come in one request. A remote that will not send blobs by id gets the commit fetched
    /// whole instead, and from then on every fetch brings blobs.
    pub(super) async fn want_blobs(
        &self,
        commit: ObjectId,
        paths: Vec<String>,
    ) -> Result<(), Error> {
        let Transport::Http(http) = &self.transport else {
            return Ok(());
        };
        let cache = self.cache.clone();
        let lacking = blocking(move || cache.lacking_blobs(commit, &paths)).await?;
        if lacking.is_empty() {
            return Ok(());
        }
        let _one_fetch_at_a_time = self.fetching.lock().await;
        let lacking = self.missing(lacking).await?;
        if lacking.is_empty() {
            return Ok(());
        }
        match http.fetch_blobs(&lacking).await {
            Ok(pack) => self.index(pack).await?,
            // A remote that cannot be reached now cannot be reached for the whole commit either.
            Err(error @ Error::Http(_)) => return Err(error),
            Err(error) => {
                let pack = http.fetch(&[commit], &[], Blobs::All).await?;
                self.index(pack).await?;
                tracing::warn!(error = %gitstate_core::report::chain(&error), "the remote does not send blobs by id; fetching whole commits from now on");
                self.whole_fetches.store(true, Ordering::Relaxed);
            }
        }
        if !self.missing(lacking).await?.is_empty() {
            return Err(Error::Remote(
                "the fetch did not deliver the requested blobs".into(),
            ));
        }
        Ok(())
    }

    /// Make sure the cache has `wants` (commits and their trees; blobs, see [`Self::blobs`]).
    pub(super) async fn ensure(&self, wants: Vec<ObjectId>) -> Result<(), Error> {
        self.ensure_how(wants, Fetch::Branch).await
    }

    /// [`Self::ensure`] for a tip a few commits past the one the cache knows: blobs and all, as
    /// only what changed since is sent.
    pub(super) async fn ensure_changes(&self, wants: Vec<ObjectId>) -> Result<(), Error> {
        self.ensure_how(wants, Fetch::Changes).await
    }

    /// [`Self::ensure`] for lock commits, which have no parents: when this process has not seen
    /// the upload-pack capabilities yet, the fetch asks for none rather than spending a request
    /// on the advertisement (a cold UNLOCK stays at three requests). A branch tip needs `shallow`
    /// if offered, so for it the advertisement comes first.
    pub(super) async fn ensure_with(
        &self,
        wants: Vec<ObjectId>,
        orphans: bool,
    ) -> Result<(), Error> {
        let how = if orphans {
            Fetch::Orphans
        } else {
            Fetch::Branch
        };
        self.ensure_how(wants, how).await
    }

    async fn ensure_how(&self, wants: Vec<ObjectId>, how: Fetch) -> Result<(), Error> {
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
        let known = *lock(&self.known_tip);
        let haves: Vec<ObjectId> = match known {
            Some((tip, _)) if self.cache.has(tip)? => vec![tip],
            _ => Vec::new(),
        };
        if how != Fetch::Orphans && !http.knows_fetch_capabilities() {
            http.advertise(Service::UploadPack).await?;
        }
        let blobs = match how {
            Fetch::Orphans => Blobs::All,
            Fetch::Changes if !haves.is_empty() => Blobs::All,
            Fetch::Branch | Fetch::Changes => self.blobs(http),
        };
        let pack = http.fetch(&missing, &haves, blobs).await?;
        self.index(pack).await?;
        if !self.missing(missing).await?.is_empty() {
            return Err(Error::Remote(
                "the fetch did not deliver the requested commits".into(),
            ));
        }
        Ok(())
    }

    pub(super) async fn missing(&self, ids: Vec<ObjectId>) -> Result<Vec<ObjectId>, Error> {
        let cache = self.cache.clone();
        blocking(move || {
            let repo = cache.repo()?;
            Ok(ids.into_iter().filter(|id| !repo.has_object(id)).collect())
        })
        .await
    }

    /// `path` at `commit`, fetching first if needed. A cache that fails to read is rebuilt once.
    pub(super) async fn read(
        &self,
        commit: ObjectId,
        path: String,
    ) -> Result<Option<Vec<u8>>, Error> {
        self.read_with(commit, path, false).await
    }

    /// [`Self::read`]; `orphan`: `commit` has no parents (a lock), see [`Self::ensure_with`].
    pub(super) async fn read_with(
        &self,
        commit: ObjectId,
        path: String,
        orphan: bool,
    ) -> Result<Option<Vec<u8>>, Error> {
        self.ensure_with(vec![commit], orphan).await?;
        match self.blob_at(commit, path.clone()).await {
            Ok(found) => Ok(found),
            // A cache that cannot be read (not a remote that cannot be reached) starts over.
            Err(error)
                if self.is_cache()
                    && !matches!(
                        error,
                        Error::Http(_) | Error::Status { .. } | Error::Certificate { .. }
                    ) =>
            {
                tracing::warn!(error = %gitstate_core::report::chain(&error), "cache read failed");
                self.rebuild().await?;
                self.ensure_with(vec![commit], orphan).await?;
                self.blob_at(commit, path).await
            }
            Err(error) => Err(error),
        }
    }

    /// `path` at `commit` (which the cache holds), its blob fetched first if missing.
    async fn blob_at(&self, commit: ObjectId, path: String) -> Result<Option<Vec<u8>>, Error> {
        self.want_blobs(commit, vec![path.clone()]).await?;
        let cache = self.cache.clone();
        blocking(move || cache.read_path(commit, &path)).await
    }

    pub(super) async fn rebuild(&self) -> Result<(), Error> {
        let _no_fetch_meanwhile = self.fetching.lock().await;
        *lock(&self.known_tip) = None;
        let cache = self.cache.clone();
        blocking(move || cache.rebuild()).await
    }

    pub(super) async fn commit(
        &self,
        parent: Option<ObjectId>,
        path: String,
        content: Option<Bytes>,
        meta: CommitMeta,
    ) -> Result<NewCommit, Error> {
        let cache = self.cache.clone();
        blocking(move || cache.commit(parent, &path, content.as_deref(), &meta)).await
    }

    pub(super) async fn push(
        &self,
        commands: Vec<Command>,
        objects: Vec<ObjectId>,
    ) -> Result<PushReport, Error> {
        // What was advertised before a push of ours is out of date.
        *lock(&self.last_push) = Some(Instant::now());
        *lock(&self.last_advert) = None;
        match &self.transport {
            Transport::Local(refs) => {
                let refs = refs.clone();
                blocking(move || refs.push(&commands)).await
            }
            Transport::Http(http) => {
                let known = lock(&self.push_caps).clone();
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

/// What a fetch of commits the cache lacks brings along.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fetch {
    /// Branch commits: trees, and blobs unless the remote sends them by id later.
    Branch,
    /// Lock commits (no parents): everything, without asking for the capabilities first.
    Orphans,
    /// Branch commits a little past a tip the cache has: everything that changed since.
    Changes,
}
