//! One remote (repository and branch): its cache, how to reach it ([`Transport`]), and what
//! this process remembers of it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use gix::ObjectId;

use gitstate_core::ReadContext;
use gitstate_core::ports::{CommitMeta, HistoryPage};

use super::known::{
    Home, KnownStates, Looks, STATE_REF_PREFIX, Seen, is_others, is_state_ref_of, state_ref,
};
use super::transport::{Fetch, KnownTip, Transport};
use super::write::{Batcher, Sent};
use super::{RemoteError, blocking};
use crate::protocol::{Advert, Service};
use crate::protocol::{Command, PushReport};
use crate::repository::{Cache, Chain, NewCommit};
use crate::sync::lock;

/// How deep a retry looks for a write's earlier push on a chain whose history the cache lacks
/// (commits from the tip): the writes that can land between a push and its retry.
const LANDED_DEPTH: u32 = 1024;

/// One remote's folds in the background of this process (see the `fold` module).
#[derive(Debug, Default)]
pub(super) struct Background {
    /// A push of this process wrote a state ref that no fold started since has looked at.
    pub(super) unfolded: AtomicBool,
    /// A fold task runs.
    pub(super) folding: AtomicBool,
}

impl Background {
    /// A push wrote a state ref.
    pub(super) fn wrote_state(&self) {
        self.unfolded.store(true, Ordering::SeqCst);
    }
}

/// What a LOCK push proved (see the `floor` module): once its lock commit `lock` was in place,
/// the state's newest content was still where this process knew it: the branch at `branch`, or
/// the state's own ref at `state`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Proof {
    pub(super) lock: ObjectId,
    pub(super) branch: ObjectId,
    pub(super) state: Option<ObjectId>,
    /// Until when it may answer reads.
    pub(super) until: super::proof::ReadsUntil,
}

/// One (repository, branch): its cache and how to reach it.
pub(super) struct Remote {
    /// The branch (full ref name).
    pub(super) branch: String,
    pub(super) cache: Arc<Cache>,
    pub(super) transport: Box<dyn Transport>,
    /// The newest branch tip this process has in its cache (what a fetch says it has), and when
    /// it was last seen on the remote.
    pub(super) known_tip: KnownTip,
    /// History pages already walked, by (tip, path, skip, limit): a commit's history never
    /// changes, so a warm state page does not walk it again.
    pub(super) histories: Mutex<HashMap<(ObjectId, String, usize, usize), HistoryPage>>,
    /// Files whose last change lies deeper than `GITSTATE_HISTORY_MAX_DEPTH`, by (branch, path,
    /// blob id): while the file holds that blob, a list does not walk the history for it again.
    pub(super) deep_changes: Mutex<HashSet<(String, String, ObjectId)>>,
    /// Lock commits this process pushed, by lock ref, and when each push landed (see the
    /// `floor` module).
    pub(super) made_locks: Mutex<HashMap<String, (ObjectId, Instant)>>,
    /// What the LOCK pushes of this process proved, by lock ref (see the `floor` module).
    pub(super) proofs: Mutex<HashMap<String, Proof>>,
    /// The probes of this process's LOCKs that stand, by lock ref: the delete of each (see the
    /// `floor` module).
    pub(super) probes: Mutex<HashMap<String, Command>>,
    /// The remote declined a LOCK push for its probe: no LOCK probes there (see the `floor`
    /// module).
    pub(super) no_probes: AtomicBool,
    /// Writes waiting to be pushed together (see the `write` module).
    pub(super) batcher: Batcher,
    /// The state refs this process has seen (see the `states` module).
    pub(super) known_states: Mutex<KnownStates>,
    /// The last look at each state's home, with when it was asked (see `known::Seen`).
    pub(super) looks: Mutex<Looks>,
    /// Folds in the background of this process (see the `fold` module).
    pub(super) folds: Background,
    /// While the branch holds no states: its tip, and the other branches a look found holding
    /// states then (see `GitStore::branches_with_states`).
    pub(super) beside: Mutex<Option<(ObjectId, Vec<String>)>>,
    /// The newest tip found not to be a copy of another branch (see the `copies` module).
    pub(super) not_a_copy: Mutex<Option<ObjectId>>,
    /// The prefix of the lock refs (branches that are no branch of states).
    pub(super) lock_prefix: String,
    /// When the look was made that a session note of this process rests on (its own start-up
    /// look, or the one the note it took up rested on), in seconds since the Unix epoch (see
    /// the `session` module).
    pub(super) session_look: Mutex<Option<i64>>,
}

impl Remote {
    pub(super) fn new(
        branch: String,
        cache: Arc<Cache>,
        transport: Box<dyn Transport>,
        batcher: Batcher,
        lock_prefix: String,
    ) -> Self {
        Self {
            branch,
            cache,
            transport,
            known_tip: Mutex::new(None),
            histories: Mutex::default(),
            deep_changes: Mutex::default(),
            made_locks: Mutex::default(),
            proofs: Mutex::default(),
            probes: Mutex::default(),
            no_probes: AtomicBool::new(false),
            batcher,
            known_states: Mutex::default(),
            looks: Mutex::default(),
            folds: Background::default(),
            beside: Mutex::default(),
            not_a_copy: Mutex::default(),
            lock_prefix,
            session_look: Mutex::default(),
        }
    }

    /// The refs `names` at least (a hosted remote lists every ref); the state refs among them
    /// are remembered.
    pub(super) async fn refs(
        &self,
        service: Service,
        names: Vec<String>,
    ) -> Result<Advert, RemoteError> {
        let asked = Instant::now();
        let advert = self.transport.refs(service, names.clone()).await?;
        self.note_states(&advert, &names);
        self.note_looks(&advert, &names, asked);
        Ok(advert)
    }

    /// Whether one of a write's pushes `sent` landed on the first-parent chain from `tip`, the
    /// branch's (`on_branch`: its commit, or a commit that carried it there from its state's
    /// ref) or a state ref's (see `Cache::landed_on_chain`). Where the cache's history ends
    /// first (a shallow fetch of a tip several writes on), it is fetched deeper, up to
    /// [`LANDED_DEPTH`] commits: a busy branch does not hide a write that landed.
    pub(super) async fn carries_one_of(
        &self,
        tip: ObjectId,
        sent: Vec<Sent>,
        on_branch: bool,
    ) -> Result<bool, RemoteError> {
        for push in sent {
            let base = if on_branch { push.branch } else { push.base };
            let mut reached = 0usize;
            loop {
                let cache = self.cache.clone();
                let chain = blocking(move || cache.landed_on_chain(tip, push.commit, base)).await?;
                let Chain::Shallow { boundary, walked } = chain else {
                    if chain == Chain::Found {
                        return Ok(true);
                    }
                    break;
                };
                let depth = u32::try_from(walked).unwrap_or(u32::MAX);
                if !self.transport.deepens() || walked <= reached || depth >= LANDED_DEPTH {
                    tracing::warn!(commit = %push.commit, walked, "a write's earlier push was not found within the history looked at: the write is judged again");
                    break;
                }
                reached = walked;
                let deeper = depth.saturating_mul(2).max(depth + 16).min(LANDED_DEPTH);
                self.deepen(tip, boundary, deeper).await?;
            }
        }
        Ok(false)
    }

    /// The state ref of the file at `path` on this branch.
    pub(super) fn state_ref(&self, path: &str) -> String {
        state_ref(&self.branch, path)
    }

    /// Remember what `advert`, asked for at `asked`, says of the state refs among `names`
    /// together with the branch (see `known::Seen`).
    pub(super) fn note_looks(&self, advert: &Advert, names: &[String], asked: Instant) {
        let Some(branch) = advert.tip(&self.branch) else {
            return;
        };
        let mut looks = lock(&self.looks);
        for name in names.iter().filter(|n| n.starts_with(STATE_REF_PREFIX)) {
            let home = advert.tip(name).map_or(Home::Absent, Home::At);
            looks.saw(
                name,
                Seen {
                    branch,
                    home,
                    at: asked,
                },
            );
        }
    }

    /// The look at the state ref `name` asked for at `since` or later, if it knows something.
    pub(super) fn look_since(&self, name: &str, since: Instant) -> Option<Seen> {
        lock(&self.looks).since(name, since)
    }

    /// Remember the state refs `advert` shows (see [`Transport::note_states`]).
    pub(super) fn note_states(&self, advert: &Advert, names: &[String]) {
        let mut known = lock(&self.known_states);
        self.transport.note_states(&mut known, advert, names);
    }

    /// The last full advertisement, if `read` may reuse it (it came after the request being
    /// served began): it reflects every write that finished before the request.
    pub(super) fn reusable_advert(&self, read: &ReadContext) -> Option<(Advert, Instant)> {
        self.transport.reusable_advert(read)
    }

    pub(super) fn saw_tip(&self, tip: ObjectId) {
        *lock(&self.known_tip) = Some((tip, Instant::now()));
    }

    /// A tip an earlier process on this cache saw at `when` (see the `session` module), where
    /// this process has seen none yet.
    pub(super) fn saw_tip_at(&self, tip: ObjectId, when: Instant) {
        lock(&self.known_tip).get_or_insert((tip, when));
    }

    /// The branch and every ref under `prefix`: one ref advertisement over HTTP, none when one
    /// came less than `fresh` ago.
    pub(super) async fn branch_and_prefix(
        &self,
        branch: &str,
        prefix: &str,
        fresh: Duration,
    ) -> Result<Advert, RemoteError> {
        let advert = self
            .transport
            .branch_and_prefix(branch, prefix, fresh)
            .await?;
        self.note_states(&advert, &[]);
        Ok(advert)
    }

    /// Every ref, and the ref `HEAD` names: one upload-pack advertisement over HTTP (its
    /// `symref=HEAD:` capability, one `read` may reuse), the repository's refs and `HEAD` when
    /// embedded.
    pub(super) async fn every_ref(
        &self,
        read: &ReadContext,
    ) -> Result<(Advert, Option<String>), RemoteError> {
        let (advert, head) = self.transport.every_ref(read).await?;
        self.note_states(&advert, &[]);
        Ok((advert, head))
    }

    /// Every ref under `prefix`: one ref advertisement over HTTP.
    pub(super) async fn refs_with_prefix(&self, prefix: &str) -> Result<Advert, RemoteError> {
        self.transport.refs_with_prefix(prefix).await
    }

    /// Whether the branch, which a look just found missing, was deleted or renamed outside
    /// gitstate (which never deletes one): this process saw it, and the repository is no empty
    /// one (the branch's states' refs remain, or other refs do, as the branch rule counts
    /// them: `known::is_others`). One look, made only then; a process that never saw the branch asks
    /// nothing here (the branch rule judges it with every ref in view). An empty repository is
    /// starting over, in this process as in a new one.
    pub(super) async fn branch_lost(&self, locks: &str) -> Result<bool, RemoteError> {
        if self.recent_tip(Duration::MAX).is_none() {
            return Ok(false);
        }
        let advert = self.refs_with_prefix("refs/").await?;
        Ok(advert
            .refs
            .keys()
            .any(|name| is_state_ref_of(&self.branch, name) || is_others(name, locks)))
    }

    /// Whether states' refs of the branch remain (one look for them): with the branch missing,
    /// it was deleted outside gitstate. For the lists and the history, which ask only when
    /// they find no branch.
    pub(super) async fn states_remain(&self) -> Result<bool, RemoteError> {
        let states = super::known::states_of(&self.branch);
        let advert = self.refs_with_prefix(&states).await?;
        Ok(advert
            .refs
            .keys()
            .any(|name| is_state_ref_of(&self.branch, name)))
    }

    /// Fetch the history behind `tip`, `depth` commits deep, given the cache already holds it down
    /// to `boundary` (only what lies past it is sent).
    pub(super) async fn deepen(
        &self,
        tip: ObjectId,
        boundary: ObjectId,
        depth: u32,
    ) -> Result<(), RemoteError> {
        self.transport
            .deepen(&self.cache, tip, boundary, depth)
            .await
    }

    /// Fetch `commit` alone (depth 1), given the cache has `tip`: refused by the remote when no
    /// ref reaches it; what `tip`'s tree shares with it is not sent.
    pub(super) async fn fetch_one(
        &self,
        commit: ObjectId,
        tip: ObjectId,
    ) -> Result<(), RemoteError> {
        self.transport.fetch_one(&self.cache, commit, tip).await
    }

    /// The branch tip, if this process saw it on the remote less than `within` ago.
    pub(super) fn recent_tip(&self, within: Duration) -> Option<ObjectId> {
        let known = *lock(&self.known_tip);
        known
            .filter(|(_, seen)| seen.elapsed() < within)
            .map(|(tip, _)| tip)
    }

    /// Make sure the cache holds the blobs at `paths` in `commit` (whose trees it has): those it
    /// lacks come in one request. A remote that will not send blobs by id gets the commit fetched
    /// whole instead, and from then on every fetch brings blobs.
    pub(super) async fn want_blobs(
        &self,
        commit: ObjectId,
        paths: Vec<String>,
    ) -> Result<(), RemoteError> {
        self.transport.want_blobs(&self.cache, commit, paths).await
    }

    /// Make sure the cache has `wants` (commits and their trees; blobs when the remote cannot
    /// send them by id later).
    pub(super) async fn ensure(&self, wants: Vec<ObjectId>) -> Result<(), RemoteError> {
        self.ensure_how(wants, Fetch::Branch).await
    }

    /// [`Self::ensure`] for a tip a few commits past the one the cache knows: blobs and all, as
    /// only what changed since is sent.
    pub(super) async fn ensure_changes(&self, wants: Vec<ObjectId>) -> Result<(), RemoteError> {
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
    ) -> Result<(), RemoteError> {
        let how = if orphans {
            Fetch::Orphans
        } else {
            Fetch::Branch
        };
        self.ensure_how(wants, how).await
    }

    async fn ensure_how(&self, wants: Vec<ObjectId>, how: Fetch) -> Result<(), RemoteError> {
        self.transport
            .ensure(&self.cache, &self.known_tip, wants, how)
            .await
    }

    /// `path` at `commit`, fetching first if needed. A cache that fails to read starts over once
    /// (see [`Transport::start_over`]).
    pub(super) async fn read(
        &self,
        commit: ObjectId,
        path: String,
    ) -> Result<Option<Vec<u8>>, RemoteError> {
        self.read_with(commit, path, false).await
    }

    /// [`Self::read`]; `orphan`: `commit` has no parents (a lock), see [`Self::ensure_with`].
    pub(super) async fn read_with(
        &self,
        commit: ObjectId,
        path: String,
        orphan: bool,
    ) -> Result<Option<Vec<u8>>, RemoteError> {
        self.ensure_with(vec![commit], orphan).await?;
        let error = match self.blob_at(commit, path.clone()).await {
            Ok(found) => return Ok(found),
            Err(error) => error,
        };
        let started_over = self
            .transport
            .start_over(&self.cache, &self.known_tip, &error)
            .await?;
        if !started_over {
            return Err(error);
        }
        self.ensure_with(vec![commit], orphan).await?;
        self.blob_at(commit, path).await
    }

    /// `path` at `commit` (which the cache holds), its blob fetched first if missing.
    async fn blob_at(
        &self,
        commit: ObjectId,
        path: String,
    ) -> Result<Option<Vec<u8>>, RemoteError> {
        self.want_blobs(commit, vec![path.clone()]).await?;
        let cache = self.cache.clone();
        Ok(blocking(move || cache.read_path(commit, &path)).await?)
    }

    pub(super) async fn commit(
        &self,
        parent: Option<ObjectId>,
        path: String,
        content: Option<Bytes>,
        meta: CommitMeta,
    ) -> Result<NewCommit, RemoteError> {
        let meta = self.marked(meta);
        let cache = self.cache.clone();
        Ok(blocking(move || cache.commit(parent, &path, content.as_deref(), &meta)).await?)
    }

    /// `meta` with its message naming this branch (see `copies`).
    pub(super) fn marked(&self, meta: CommitMeta) -> CommitMeta {
        let short = self
            .branch
            .strip_prefix("refs/heads/")
            .unwrap_or(&self.branch);
        CommitMeta {
            message: gitstate_core::trailers::with_branch(&meta.message, short),
            ..meta
        }
    }

    pub(super) async fn push(
        &self,
        commands: Vec<Command>,
        objects: Vec<ObjectId>,
    ) -> Result<PushReport, RemoteError> {
        let report = self
            .transport
            .push(&self.cache, commands.clone(), objects)
            .await?;
        self.note_pushed(&commands, &report);
        Ok(report)
    }

    /// A push that wrote a state ref leaves writes for a fold; the state refs it changed are
    /// remembered.
    fn note_pushed(&self, commands: &[Command], report: &PushReport) {
        let mut known = lock(&self.known_states);
        let verdicts = report.verdicts(commands);
        let landed = commands
            .iter()
            .zip(verdicts)
            .filter(|(c, ok)| *ok && c.name.starts_with(STATE_REF_PREFIX));
        let mut wrote_state = false;
        for (command, _) in landed {
            known.saw(&command.name, Some(command.new).filter(|id| !id.is_null()));
            // A state's write, not a LOCK's probe (a ref inside a state ref's name).
            wrote_state |= is_state_ref_of(&self.branch, &command.name)
                && !command.new.is_null()
                && command.old != command.new;
        }
        drop(known);
        if wrote_state {
            self.folds.wrote_state();
        }
    }

    /// A push of `commands` each alone, applied in order (see [`Transport::push_each`]).
    pub(super) async fn push_each(
        &self,
        commands: Vec<Command>,
        objects: Vec<ObjectId>,
    ) -> Result<PushReport, RemoteError> {
        let report = self
            .transport
            .push_each(&self.cache, commands.clone(), objects)
            .await?;
        self.note_pushed(&commands, &report);
        Ok(report)
    }
}
