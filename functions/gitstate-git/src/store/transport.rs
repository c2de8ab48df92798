//! How a [`super::remote::Remote`] reaches its repository: one trait, so the store does what
//! differs between kinds of repository by calling the kind's method, not by asking which kind
//! it has (two yes-or-no methods remain, each for one decision: [`Transport::deepens`],
//! [`Transport::proves_for_reads`]). [`Embedded`] is the local bare
//! repository, whose refs are changed by ref transactions and whose objects are already there;
//! [`super::hosted::Hosted`] is a hosted repository over smart HTTP(S) or SSH, whose objects
//! are fetched into a cache.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use gitstate_core::ReadContext;
use gix::ObjectId;

use super::known::{KnownStates, STATE_REF_PREFIX};
use super::{RemoteError, blocking};
use crate::protocol::{Advert, Service};
use crate::protocol::{Command, PushReport};
use crate::repository::Cache;
use crate::repository::local::LocalRefs;

/// The tip this process last saw on the remote, and when (what a fetch says it has).
pub(super) type KnownTip = Mutex<Option<(ObjectId, Instant)>>;

/// What a fetch of commits the cache lacks brings along.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Fetch {
    /// Branch commits: trees, and blobs unless the remote sends them by id later.
    Branch,
    /// Lock commits (no parents): everything, without asking for the capabilities first.
    Orphans,
    /// Branch commits a little past a tip the cache has: everything that changed since.
    Changes,
}

#[async_trait]
pub(super) trait Transport: Send + Sync {
    /// Whether the cache's history may stop at a shallow boundary that [`Self::deepen`] moves
    /// (a hosted repository's cache). The embedded repository holds its whole history: a walk
    /// that stops short of a root found it broken.
    fn deepens(&self) -> bool;

    /// Whether a LOCK proves the state for the read that follows it (see the `floor` module):
    /// there (a hosted repository) that read would cost requests; the embedded repository's
    /// costs none.
    fn proves_for_reads(&self) -> bool;

    /// Remember in `known` the state refs `advert` shows, which [`Self::refs`] gave for
    /// `names`: all of them when an advertisement lists every ref, else those of `names`.
    fn note_states(&self, known: &mut KnownStates, advert: &Advert, names: &[String]);

    /// The refs `names` at least (an advertisement lists every ref), with the capabilities a
    /// push of `service` has.
    async fn refs(&self, service: Service, names: Vec<String>) -> Result<Advert, RemoteError>;

    /// The last full advertisement, if `read` may reuse it (it came after the request being
    /// served began), and when it was asked for.
    fn reusable_advert(&self, read: &ReadContext) -> Option<(Advert, Instant)>;

    /// The branch and every ref under `prefix`, from an advertisement less than `fresh` old
    /// when there is one.
    async fn branch_and_prefix(
        &self,
        branch: &str,
        prefix: &str,
        fresh: Duration,
    ) -> Result<Advert, RemoteError>;

    /// Every ref, and the ref `HEAD` names (from an advertisement `read` may reuse, if any).
    async fn every_ref(&self, read: &ReadContext) -> Result<(Advert, Option<String>), RemoteError>;

    /// Every ref under `prefix`.
    async fn refs_with_prefix(&self, prefix: &str) -> Result<Advert, RemoteError>;

    /// Every ref under `prefix` besides those of `advert`, which [`Self::refs`] gave: nothing
    /// more when an advertisement lists every ref, the refs asked for when it lists only the
    /// names given.
    async fn refs_beside(&self, advert: &Advert, prefix: &str) -> Result<Advert, RemoteError>;

    /// Make `cache` hold `wants`, fetched as `how` says.
    async fn ensure(
        &self,
        cache: &Arc<Cache>,
        known_tip: &KnownTip,
        wants: Vec<ObjectId>,
        how: Fetch,
    ) -> Result<(), RemoteError>;

    /// Make `cache` hold the blobs at `paths` in `commit` (whose trees it has).
    async fn want_blobs(
        &self,
        cache: &Arc<Cache>,
        commit: ObjectId,
        paths: Vec<String>,
    ) -> Result<(), RemoteError>;

    /// Fetch the history behind `tip`, `depth` commits deep, past `boundary`.
    async fn deepen(
        &self,
        cache: &Arc<Cache>,
        tip: ObjectId,
        boundary: ObjectId,
        depth: u32,
    ) -> Result<(), RemoteError>;

    /// Fetch `commit` alone, given `cache` has `tip`.
    async fn fetch_one(
        &self,
        cache: &Arc<Cache>,
        commit: ObjectId,
        tip: ObjectId,
    ) -> Result<(), RemoteError>;

    /// The commits `wants` reach that `haves` do not (a fold's unfolded state commits), brought
    /// into `cache` with their trees and blobs.
    async fn fetch_beyond(
        &self,
        cache: &Arc<Cache>,
        wants: Vec<ObjectId>,
        haves: Vec<ObjectId>,
    ) -> Result<HashSet<ObjectId>, RemoteError>;

    /// After a read of `cache` failed with `failure`: throw the cache away and start empty, no
    /// fetch running meanwhile, unless the remote could not be reached or the cache is the
    /// repository. Whether it started over.
    async fn start_over(
        &self,
        cache: &Arc<Cache>,
        known_tip: &KnownTip,
        failure: &RemoteError,
    ) -> Result<bool, RemoteError>;

    /// Apply `commands`, sending `objects` from `cache` if the repository needs them.
    async fn push(
        &self,
        cache: &Arc<Cache>,
        commands: Vec<Command>,
        objects: Vec<ObjectId>,
    ) -> Result<PushReport, RemoteError>;

    /// A push of `commands` each alone, applied in the order given, each with its own verdict
    /// (a remote without `atomic` takes such a push too). The default pushes them one by one.
    async fn push_each(
        &self,
        cache: &Arc<Cache>,
        commands: Vec<Command>,
        objects: Vec<ObjectId>,
    ) -> Result<PushReport, RemoteError> {
        let mut report = PushReport::default();
        for command in commands {
            let one = self.push(cache, vec![command], objects.clone()).await?;
            report.refs.extend(one.refs);
        }
        Ok(report)
    }

    /// The receive-pack capabilities, if a push may go without a fresh advertisement (the
    /// protocol floor, see the `floor` module).
    fn floor_caps(&self) -> Option<Advert>;

    /// The remote answered a push at the floor with an error: advertise first from now on.
    fn refuse_floor(&self);

    /// Receive-pack capabilities an earlier process on this cache saw (see the `session`
    /// module): `false` when they cannot stand in for an advertisement here.
    fn take_caps(&self, caps: Advert) -> bool;
}

/// The embedded repository: the cache is the repository, so nothing is fetched; refs change
/// by ref transactions with a push's create-only and compare-and-swap semantics.
pub(super) struct Embedded(pub(super) Arc<LocalRefs>);

#[async_trait]
impl Transport for Embedded {
    fn deepens(&self) -> bool {
        false
    }

    fn proves_for_reads(&self) -> bool {
        false
    }

    /// The repository lists only the refs asked for.
    fn note_states(&self, known: &mut KnownStates, advert: &Advert, names: &[String]) {
        for name in names.iter().filter(|n| n.starts_with(STATE_REF_PREFIX)) {
            known.saw(name, advert.tip(name));
        }
    }

    async fn refs(&self, _: Service, names: Vec<String>) -> Result<Advert, RemoteError> {
        let refs = self.0.clone();
        Ok(blocking(move || refs.list(&names)).await?)
    }

    fn reusable_advert(&self, _: &ReadContext) -> Option<(Advert, Instant)> {
        None
    }

    async fn branch_and_prefix(
        &self,
        branch: &str,
        prefix: &str,
        _: Duration,
    ) -> Result<Advert, RemoteError> {
        let (refs, branch, prefix) = (self.0.clone(), branch.to_owned(), prefix.to_owned());
        Ok(blocking(move || {
            let mut advert = refs.list_prefix(&prefix)?;
            advert.refs.extend(refs.list(&[branch])?.refs);
            Ok(advert)
        })
        .await?)
    }

    async fn every_ref(&self, _: &ReadContext) -> Result<(Advert, Option<String>), RemoteError> {
        let refs = self.0.clone();
        Ok(blocking(move || Ok((refs.list_prefix("refs/")?, refs.head_target()))).await?)
    }

    async fn refs_with_prefix(&self, prefix: &str) -> Result<Advert, RemoteError> {
        let (refs, prefix) = (self.0.clone(), prefix.to_owned());
        Ok(blocking(move || refs.list_prefix(&prefix)).await?)
    }

    /// The repository lists only the refs asked for: those under `prefix` are listed now.
    async fn refs_beside(&self, _: &Advert, prefix: &str) -> Result<Advert, RemoteError> {
        self.refs_with_prefix(prefix).await
    }

    async fn ensure(
        &self,
        _: &Arc<Cache>,
        _: &KnownTip,
        _: Vec<ObjectId>,
        _: Fetch,
    ) -> Result<(), RemoteError> {
        Ok(())
    }

    async fn want_blobs(
        &self,
        _: &Arc<Cache>,
        _: ObjectId,
        _: Vec<String>,
    ) -> Result<(), RemoteError> {
        Ok(())
    }

    async fn deepen(
        &self,
        _: &Arc<Cache>,
        _: ObjectId,
        _: ObjectId,
        _: u32,
    ) -> Result<(), RemoteError> {
        Ok(())
    }

    async fn fetch_one(&self, _: &Arc<Cache>, _: ObjectId, _: ObjectId) -> Result<(), RemoteError> {
        Ok(())
    }

    /// Nothing to fetch: a walk of the repository's history.
    async fn fetch_beyond(
        &self,
        cache: &Arc<Cache>,
        wants: Vec<ObjectId>,
        haves: Vec<ObjectId>,
    ) -> Result<HashSet<ObjectId>, RemoteError> {
        let cache = cache.clone();
        Ok(blocking(move || cache.beyond(wants, haves)).await?)
    }

    /// The cache is the repository: there is nothing to start over from.
    async fn start_over(
        &self,
        _: &Arc<Cache>,
        _: &KnownTip,
        _: &RemoteError,
    ) -> Result<bool, RemoteError> {
        Ok(false)
    }

    async fn push(
        &self,
        _: &Arc<Cache>,
        commands: Vec<Command>,
        _: Vec<ObjectId>,
    ) -> Result<PushReport, RemoteError> {
        let refs = self.0.clone();
        Ok(blocking(move || refs.push(&commands)).await?)
    }

    fn floor_caps(&self) -> Option<Advert> {
        None
    }

    fn refuse_floor(&self) {}

    fn take_caps(&self, _: Advert) -> bool {
        false
    }
}
