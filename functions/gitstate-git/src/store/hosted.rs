//! A hosted repository over smart HTTP(S) or SSH: advertisements (the last one kept for the
//! request that asked), fetches into the cache (one at a time), pushes with the capabilities
//! advertised.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use gitstate_core::ReadContext;
use gix::ObjectId;

use super::known::KnownStates;
use super::transport::{Fetch, KnownTip, Transport};
use super::{RemoteError, WriteMode, blocking};
use crate::protocol::{Advert, Service};
use crate::protocol::{Blobs, Command, FetchError, PushReport, SmartClient, Updates};
use crate::repository::Cache;
use crate::repository::pack;
use crate::sync::lock;
use crate::transport::Error as WireError;

pub(super) struct Hosted {
    http: SmartClient,
    /// `GITSTATE_REQUIRE_ATOMIC`: a receive-pack advertisement without `atomic` is an error.
    require_atomic: bool,
    /// Receive-pack capabilities, and whether pushes may go without a fresh advertisement.
    push_caps: Mutex<PushCaps>,
    /// The last full ref advertisement and the last push, under one lock: an advertisement
    /// asked for before a push began is never kept after the push cleared it.
    adverts: Mutex<Adverts>,
    /// Held by each fetch into the cache, and by a rebuild of it.
    fetching: tokio::sync::Mutex<()>,
    /// The remote offers `filter` but would not send blobs by id: fetch commits whole.
    whole_fetches: AtomicBool,
}

#[derive(Default)]
struct PushCaps {
    /// Receive-pack capabilities, once advertised.
    caps: Option<Advert>,
    /// The remote refused a push without a fresh advertisement: always advertise first.
    no_floor: bool,
}

#[derive(Default)]
struct Adverts {
    /// The last full ref advertisement, and when it was asked for.
    last: Option<(Advert, Instant)>,
    /// When this process last began a push.
    pushed: Option<Instant>,
}

impl Hosted {
    pub(super) fn new(http: SmartClient, require_atomic: bool) -> Self {
        Self {
            http,
            require_atomic,
            push_caps: Mutex::default(),
            adverts: Mutex::default(),
            fetching: tokio::sync::Mutex::new(()),
            whole_fetches: AtomicBool::new(false),
        }
    }

    /// What fetches of branch commits bring: their trees only when the remote can send blobs by id
    /// later (and has not refused to), else everything.
    fn blobs(&self) -> Blobs {
        if self.http.offers_filter() && !self.whole_fetches.load(Ordering::Relaxed) {
            Blobs::None
        } else {
            Blobs::All
        }
    }
}

impl Hosted {
    /// One push of `commands` (standing together as `updates` says) with the objects they need.
    async fn send(
        &self,
        cache: &Arc<Cache>,
        commands: Vec<Command>,
        objects: Vec<ObjectId>,
        updates: Updates,
    ) -> Result<PushReport, RemoteError> {
        // What was advertised before a push of ours is out of date.
        *lock(&self.adverts) = Adverts {
            last: None,
            pushed: Some(Instant::now()),
        };
        let known = lock(&self.push_caps).caps.clone();
        let caps = match known {
            Some(caps) => caps,
            None => self.refs(Service::ReceivePack, Vec::new()).await?,
        };
        let pack = if commands.iter().all(|c| c.new.is_null()) {
            None
        } else {
            let cache = cache.clone();
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
        let report = self.http.push(&caps, &commands, updates, pack).await?;
        if updates == Updates::Atomic && commands.len() > 1 {
            let verdicts = report.verdicts(&commands);
            if verdicts.contains(&true) && verdicts.contains(&false) {
                // git's receive-pack ignores `atomic` where it no longer offers it: the
                // capabilities this process pushed with are out of date.
                tracing::error!(
                    ?report,
                    "the remote applied part of a push sent as atomic: it no longer pushes \
                     atomically; advertising before every push from now on"
                );
                Transport::refuse_floor(self);
            }
        }
        Ok(report)
    }
}

/// Index a received pack into the cache.
async fn index(cache: &Arc<Cache>, pack: Vec<u8>) -> Result<(), RemoteError> {
    index_listing(cache, pack).await.map(drop)
}

/// Index a received pack into the cache; the ids of the objects it holds.
async fn index_listing(cache: &Arc<Cache>, pack: Vec<u8>) -> Result<Vec<ObjectId>, RemoteError> {
    let cache = cache.clone();
    Ok(blocking(move || {
        let held = pack::index_into(cache.git_dir(), &pack)?;
        cache.reload()?;
        Ok(held)
    })
    .await?)
}

/// Of `ids`, those `cache` lacks.
pub(super) async fn missing(
    cache: &Arc<Cache>,
    ids: Vec<ObjectId>,
) -> Result<Vec<ObjectId>, RemoteError> {
    let cache = cache.clone();
    Ok(blocking(move || {
        let repo = cache.repo()?;
        Ok(ids.into_iter().filter(|id| !repo.has_object(id)).collect())
    })
    .await?)
}

#[async_trait]
impl Transport for Hosted {
    fn deepens(&self) -> bool {
        true
    }

    fn proves_for_reads(&self) -> bool {
        true
    }

    /// An advertisement lists every ref.
    fn note_states(&self, known: &mut KnownStates, advert: &Advert, _: &[String]) {
        known.saw_all(advert);
    }

    async fn refs(&self, service: Service, _: Vec<String>) -> Result<Advert, RemoteError> {
        // Stamped when asked, not when answered: it reflects no later write. One asked before a
        // push of ours began is not kept (it may not show that push).
        let asked = Instant::now();
        let advert = self.http.advertise(service).await?;
        let mut adverts = lock(&self.adverts);
        let pushed_since = adverts.pushed.is_some_and(|pushed| pushed >= asked);
        if !pushed_since && adverts.last.as_ref().is_none_or(|(_, kept)| *kept <= asked) {
            adverts.last = Some((advert.clone(), asked));
        }
        drop(adverts);
        if service == Service::ReceivePack {
            if self.require_atomic && WriteMode::of(&advert) != WriteMode::Atomic {
                return Err(RemoteError::AtomicRequired);
            }
            let caps = Advert {
                caps: advert.caps.clone(),
                ..Advert::default()
            };
            lock(&self.push_caps).caps = Some(caps);
        }
        Ok(advert)
    }

    /// See `gitstate_core::read_context`: an advertisement made since the request began
    /// reflects every write that finished before the request.
    fn reusable_advert(&self, read: &ReadContext) -> Option<(Advert, Instant)> {
        let adverts = lock(&self.adverts);
        adverts
            .last
            .as_ref()
            .filter(|(_, when)| read.may_reuse(*when))
            .cloned()
    }

    async fn branch_and_prefix(
        &self,
        _: &str,
        _: &str,
        fresh: Duration,
    ) -> Result<Advert, RemoteError> {
        let recent = lock(&self.adverts)
            .last
            .clone()
            .filter(|(_, when)| when.elapsed() < fresh);
        match recent {
            Some((advert, _)) => Ok(advert),
            None => self.refs(Service::UploadPack, Vec::new()).await,
        }
    }

    /// One upload-pack advertisement (its `symref=HEAD:` capability names `HEAD`'s ref).
    async fn every_ref(&self, read: &ReadContext) -> Result<(Advert, Option<String>), RemoteError> {
        // A read of this request just asked: its advertisement lists every ref.
        let advert = match self.reusable_advert(read) {
            Some((advert, _)) => advert,
            None => self.refs(Service::UploadPack, Vec::new()).await?,
        };
        let head = advert
            .caps
            .iter()
            .find_map(|cap| cap.strip_prefix("symref=HEAD:"))
            .map(str::to_owned);
        Ok((advert, head))
    }

    async fn refs_with_prefix(&self, prefix: &str) -> Result<Advert, RemoteError> {
        let mut advert = self.http.advertise(Service::UploadPack).await?;
        advert.refs.retain(|name, _| name.starts_with(prefix));
        Ok(advert)
    }

    /// An advertisement lists every ref: there is nothing beside it.
    async fn refs_beside(&self, _: &Advert, _: &str) -> Result<Advert, RemoteError> {
        Ok(Advert::default())
    }

    async fn ensure(
        &self,
        cache: &Arc<Cache>,
        known_tip: &KnownTip,
        wants: Vec<ObjectId>,
        how: Fetch,
    ) -> Result<(), RemoteError> {
        let missing_now = missing(cache, wants).await?;
        if missing_now.is_empty() {
            return Ok(());
        }
        let _one_fetch_at_a_time = self.fetching.lock().await;
        let wanted = missing(cache, missing_now).await?;
        if wanted.is_empty() {
            return Ok(());
        }
        let known = *lock(known_tip);
        let haves: Vec<ObjectId> = match known {
            Some((tip, _)) if cache.has(tip)? => vec![tip],
            _ => Vec::new(),
        };
        if how != Fetch::Orphans && !self.http.knows_fetch_capabilities() {
            self.http.advertise(Service::UploadPack).await?;
        }
        let blobs = match how {
            Fetch::Orphans => Blobs::All,
            Fetch::Changes if !haves.is_empty() => Blobs::All,
            Fetch::Branch | Fetch::Changes => self.blobs(),
        };
        let pack = self.http.fetch(&wanted, &haves, blobs).await?;
        index(cache, pack).await?;
        if !missing(cache, wanted).await?.is_empty() {
            return Err(RemoteError::Undelivered("commits"));
        }
        Ok(())
    }

    /// Those the cache lacks come in one request. A remote that will not send blobs by id gets
    /// the commit fetched whole instead, and from then on every fetch brings blobs.
    async fn want_blobs(
        &self,
        cache: &Arc<Cache>,
        commit: ObjectId,
        paths: Vec<String>,
    ) -> Result<(), RemoteError> {
        let reader = cache.clone();
        let lacking = blocking(move || reader.lacking_blobs(commit, &paths)).await?;
        if lacking.is_empty() {
            return Ok(());
        }
        let _one_fetch_at_a_time = self.fetching.lock().await;
        let lacking = missing(cache, lacking).await?;
        if lacking.is_empty() {
            return Ok(());
        }
        match self.http.fetch_blobs(&lacking).await {
            Ok(pack) => index(cache, pack).await?,
            // A remote that cannot be reached now cannot be reached for the whole commit either.
            Err(error @ FetchError::Wire(WireError::Http(_))) => return Err(error.into()),
            Err(error) => {
                let error = RemoteError::from(error);
                let pack = self.http.fetch(&[commit], &[], Blobs::All).await?;
                index(cache, pack).await?;
                tracing::warn!(error = %gitstate_core::report::chain(&error), "the remote does not send blobs by id; fetching whole commits from now on");
                self.whole_fetches.store(true, Ordering::Relaxed);
            }
        }
        if !missing(cache, lacking).await?.is_empty() {
            return Err(RemoteError::Undelivered("blobs"));
        }
        Ok(())
    }

    /// The cache's `boundary` is declared shallow, so only the commits past it are sent.
    async fn deepen(
        &self,
        cache: &Arc<Cache>,
        tip: ObjectId,
        boundary: ObjectId,
        depth: u32,
    ) -> Result<(), RemoteError> {
        let _one_fetch_at_a_time = self.fetching.lock().await;
        tracing::debug!(depth, "deepening the cache's history");
        let pack = self
            .http
            .fetch_deeper(tip, &[boundary], depth, self.blobs())
            .await?;
        index(cache, pack).await
    }

    /// Refused by the remote when no ref reaches `commit`; what `tip`'s tree shares with it is
    /// not sent.
    async fn fetch_one(
        &self,
        cache: &Arc<Cache>,
        commit: ObjectId,
        tip: ObjectId,
    ) -> Result<(), RemoteError> {
        let _one_fetch_at_a_time = self.fetching.lock().await;
        let pack = self.http.fetch(&[commit], &[tip], self.blobs()).await?;
        index(cache, pack).await
    }

    /// One fetch: the remote sends exactly those commits (and their trees and blobs), so the
    /// pack's commits are the answer.
    async fn fetch_beyond(
        &self,
        cache: &Arc<Cache>,
        wants: Vec<ObjectId>,
        haves: Vec<ObjectId>,
    ) -> Result<HashSet<ObjectId>, RemoteError> {
        let _one_fetch_at_a_time = self.fetching.lock().await;
        let pack = self.http.fetch_beyond(&wants, &haves).await?;
        let held = index_listing(cache, pack).await?;
        let reader = cache.clone();
        let (commits, lacking) = blocking(move || {
            let (mut commits, mut lacking) = (HashSet::new(), Vec::new());
            for id in held {
                if reader.is_commit(id)? {
                    if reader.lacks_trees(id)? {
                        lacking.push(id);
                    }
                    commits.insert(id);
                }
            }
            Ok((commits, lacking))
        })
        .await?;
        if lacking.is_empty() {
            return Ok(commits);
        }
        // The remote left out the trees it takes the haves to hold: a write that repeats a state
        // of the last folded commit (or of the branch's history, which this shallow cache lacks)
        // has that commit's very trees. Such commits come again whole, alone (a state commit's
        // tree is one file).
        tracing::debug!(
            commits = lacking.len(),
            "fetching the trees a fold's fetch left out"
        );
        let pack = self.http.fetch(&lacking, &[], self.blobs()).await?;
        index(cache, pack).await?;
        let reader = cache.clone();
        let still = blocking(move || {
            for id in lacking {
                if reader.lacks_trees(id)? {
                    return Ok(true);
                }
            }
            Ok(false)
        })
        .await?;
        if still {
            return Err(RemoteError::Undelivered("trees"));
        }
        Ok(commits)
    }

    async fn start_over(
        &self,
        cache: &Arc<Cache>,
        known_tip: &KnownTip,
        failure: &RemoteError,
    ) -> Result<bool, RemoteError> {
        let unreachable = matches!(
            failure.wire(),
            Some(WireError::Http(_) | WireError::Status { .. } | WireError::Certificate { .. })
        );
        if unreachable {
            return Ok(false);
        }
        tracing::warn!(error = %gitstate_core::report::chain(failure), "cache read failed");
        let _no_fetch_meanwhile = self.fetching.lock().await;
        *lock(known_tip) = None;
        let cache = cache.clone();
        blocking(move || cache.rebuild()).await?;
        Ok(true)
    }

    async fn push(
        &self,
        cache: &Arc<Cache>,
        commands: Vec<Command>,
        objects: Vec<ObjectId>,
    ) -> Result<PushReport, RemoteError> {
        self.send(cache, commands, objects, Updates::Atomic).await
    }

    async fn push_each(
        &self,
        cache: &Arc<Cache>,
        commands: Vec<Command>,
        objects: Vec<ObjectId>,
    ) -> Result<PushReport, RemoteError> {
        self.send(cache, commands, objects, Updates::EachAlone)
            .await
    }

    /// Capabilities known and the floor not refused.
    fn floor_caps(&self) -> Option<Advert> {
        let push_caps = lock(&self.push_caps);
        if push_caps.no_floor {
            return None;
        }
        push_caps.caps.clone()
    }

    fn refuse_floor(&self) {
        *lock(&self.push_caps) = PushCaps {
            caps: None,
            no_floor: true,
        };
    }

    fn take_caps(&self, caps: Advert) -> bool {
        let usable = caps.is_for_pushes()
            && (!self.require_atomic || WriteMode::of(&caps) == WriteMode::Atomic);
        let mut push_caps = lock(&self.push_caps);
        if !usable || push_caps.no_floor || push_caps.caps.is_some() {
            return false;
        }
        push_caps.caps = Some(caps);
        true
    }
}
