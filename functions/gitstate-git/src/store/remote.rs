//! One remote (repository and branch) and its cache: ref advertisements, fetches, pushes.

use super::*;

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
                let pushed_since = self
                    .last_push
                    .lock()
                    .ok()
                    .and_then(|pushed| *pushed)
                    .is_some_and(|pushed| pushed >= asked);
                if !pushed_since
                    && let Ok(mut last) = self.last_advert.lock()
                    && last.as_ref().is_none_or(|(_, kept)| *kept <= asked)
                {
                    *last = Some((advert.clone(), asked));
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

    /// The last full advertisement, if it came after the request being served began (see
    /// `gitstate_core::scope`): it reflects every write that finished before the request.
    pub(super) fn advert_in_scope(&self) -> Option<Advert> {
        let scope = gitstate_core::scope::Scope::current()?;
        let last = self.last_advert.lock().ok()?;
        last.as_ref()
            .filter(|(_, when)| *when >= scope.began)
            .map(|(advert, _)| advert.clone())
    }

    pub(super) fn saw_tip(&self, tip: ObjectId) {
        if let Ok(mut known) = self.known_tip.lock() {
            *known = Some((tip, Instant::now()));
        }
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
        let known = *self.known_tip.lock().ok()?;
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
        let known = *self
            .known_tip
            .lock()
            .map_err(|_| Error::Corrupt("poisoned".into()))?;
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
        if let Ok(mut known) = self.known_tip.lock() {
            *known = None;
        }
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
        if let Ok(mut pushed) = self.last_push.lock() {
            *pushed = Some(Instant::now());
        }
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
