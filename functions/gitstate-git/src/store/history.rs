//! History: the last change of each file, a state's revisions page by page, one revision, and
//! deepening the shallow cache as far as they need.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use gix::ObjectId;

use gitstate_core::fold::{FOLDED_PATH, FoldRecord};
use gitstate_core::ports::{HistoryPage, Location, Revision};
use gitstate_core::{ReadContext, StateName};

use super::remote::Remote;
use super::{Broken, GitStore, HistoryError, blocking, null};
use crate::repository::{self, Chain, Latest, Replayed, Walk};
use crate::sync::lock;

/// History is fetched this many commits deep at first, then four times deeper each time a page
/// needs more, up to [`super::StoreOptions::max_history_depth`].
const FIRST_HISTORY_DEPTH: u32 = 64;
/// History pages a process keeps (each at most 100 revisions).
const MAX_REMEMBERED_HISTORIES: usize = 256;
/// Most files remembered as last changed beyond the deepest fetch.
const MAX_DEEP_CHANGES: usize = 65_536;

impl GitStore {
    pub(super) async fn last_changes(
        &self,
        at: &Location,
        names: &[StateName],
        read: &ReadContext,
    ) -> Result<Vec<(StateName, Revision)>, HistoryError> {
        let remote = self.remote(at)?;
        let (tip, newest) = self.newest_of_states(&remote, at, names, read).await?;
        let Some(tip) = tip else {
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
                lock(&remote.deep_changes).contains(&(branch.clone(), path.clone(), *blob))
            })
        };
        let paths: Vec<String> = names
            .iter()
            .map(ToString::to_string)
            .filter(|path| !newest.contains_key(path) && !deep(path))
            .collect();
        let answer = |mut found: HashMap<String, Revision>| {
            found.extend(newest.clone());
            names
                .iter()
                .filter_map(|name| Some((name.clone(), found.remove(name.as_str())?)))
                .collect()
        };
        if paths.is_empty() {
            return Ok(answer(HashMap::new()));
        }
        let max = self.options.max_history_depth;
        let mut depth = FIRST_HISTORY_DEPTH.min(max);
        loop {
            let (cache, wanted) = (remote.cache.clone(), paths.clone());
            match blocking(move || cache.last_changes(tip, &wanted)).await? {
                Latest::Done(found) => return Ok(answer(found)),
                Latest::Shallow { walked, found } => {
                    match deepen_past(&remote, tip, None, walked, depth, max).await? {
                        Deeper::Fetched(next) => depth = next,
                        Deeper::Whole => return Err(HistoryError::Broken(Broken::MissingParent)),
                        Deeper::AtMost => {
                            // As deep as this deployment fetches: files changed only before
                            // that are listed without a last change, and not looked for again
                            // while they hold the same content.
                            tracing::info!(
                                max,
                                "last changes looked up as far as GITSTATE_HISTORY_MAX_DEPTH"
                            );
                            let mut deep = lock(&remote.deep_changes);
                            if deep.len() >= MAX_DEEP_CHANGES {
                                deep.clear();
                            }
                            for path in paths.iter().filter(|p| !found.contains_key(*p)) {
                                if let Some(blob) = blobs.get(path) {
                                    deep.insert((branch.clone(), path.clone(), *blob));
                                }
                            }
                            drop(deep);
                            return Ok(answer(found));
                        }
                    }
                }
            }
        }
    }

    pub(super) async fn history(
        &self,
        at: &Location,
        name: &StateName,
        skip: usize,
        limit: usize,
    ) -> Result<HistoryPage, HistoryError> {
        let remote = self.remote(at)?;
        // A state ref's chain continues into the branch history below its first commit: the
        // walk from its tip lists every write once.
        let tip = match self.branch_and_state(&remote, at, name.as_str()).await? {
            (_, Some(state_tip)) => state_tip,
            (Some(tip), None) => tip,
            (None, None) => return Ok(HistoryPage::default()),
        };
        let key = (tip, name.to_string(), skip, limit);
        let known = lock(&remote.histories).get(&key).cloned();
        if let Some(page) = known {
            return Ok(page);
        }
        let max = self.options.max_history_depth;
        let mut depth = FIRST_HISTORY_DEPTH.min(max);
        loop {
            let (cache, path) = (remote.cache.clone(), name.to_string());
            match blocking(move || cache.history(tip, &path, skip, limit)).await? {
                Walk::Done(page) => {
                    let mut histories = lock(&remote.histories);
                    if histories.len() >= MAX_REMEMBERED_HISTORIES {
                        histories.clear();
                    }
                    histories.insert(key, page.clone());
                    drop(histories);
                    return Ok(page);
                }
                Walk::Shallow { walked, partial } => {
                    match deepen_past(&remote, tip, None, walked, depth, max).await? {
                        Deeper::Fetched(next) => depth = next,
                        Deeper::Whole => return Err(HistoryError::Broken(Broken::MissingParent)),
                        Deeper::AtMost => {
                            // As deep as this deployment fetches: the page ends here.
                            tracing::info!(
                                max,
                                "history listed as far as GITSTATE_HISTORY_MAX_DEPTH"
                            );
                            return Ok(partial);
                        }
                    }
                }
            }
        }
    }

    pub(super) async fn read_version(
        &self,
        at: &Location,
        name: &StateName,
        version: &str,
    ) -> Result<Option<Bytes>, HistoryError> {
        let Ok(commit) = ObjectId::from_hex(version.as_bytes()) else {
            return Ok(None);
        };
        let remote = self.remote(at)?;
        // A revision on the chain of a tip this process already saw (the branch's, or the
        // state's own ref's) needs no git request (history pages read every revision they list
        // this way).
        let seen_state = lock(&remote.known_states)
            .tip(&remote.state_ref(name.as_str()))
            .flatten();
        let mut on_seen_chain = false;
        for seen in seen_state
            .into_iter()
            .chain(remote.recent_tip(Duration::MAX))
        {
            if on_seen_chain || !remote.cache.has(commit)? || !remote.cache.has(seen)? {
                continue;
            }
            let cache = remote.cache.clone();
            on_seen_chain =
                blocking(move || cache.find_on_chain(seen, commit)).await? == Chain::Found;
        }
        let mut commit = commit;
        if !on_seen_chain && !self.find_revision(&remote, at, name, commit).await? {
            // A write listed under its state commit, which a fold or a delete replayed onto the
            // branch (its ref may be gone): read it where the branch carries it.
            match self.find_replay(&remote, name, commit).await? {
                Some(replay) => commit = replay,
                None => return Ok(None),
            }
        }
        let path = name.to_string();
        if remote.cache.is_commit(commit)? {
            remote.want_blobs(commit, vec![path.clone()]).await?;
        }
        let cache = remote.cache.clone();
        match blocking(move || cache.read_path(commit, &path)).await {
            Ok(found) => Ok(found.map(Bytes::from)),
            // Not a commit (a tree or blob id): no such revision.
            Err(repository::Error::Git(_)) => Ok(None),
            Err(other) => Err(other.into()),
        }
    }

    /// Make the cache hold `commit` if it is a revision of `name`: on the first-parent chain of
    /// the state's own ref (which continues into the branch's history), or of the branch.
    async fn find_revision(
        &self,
        remote: &Remote,
        at: &Location,
        name: &StateName,
        commit: ObjectId,
    ) -> Result<bool, HistoryError> {
        let (tip, state_tip) = self.branch_and_state(remote, at, name.as_str()).await?;
        for tip in state_tip.into_iter().chain(tip) {
            if self.find_on_chain_of(remote, tip, commit).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The branch commit that replays the state commit `state_commit` of `name` (see
    /// [`crate::repository::Cache::replay_of`]), on the branch tip the lookup before it saw.
    /// Only a state the fold record names ever had writes replayed: for any other (the record
    /// read from the tip's tree, its blob fetched at most) an id nobody knows costs nothing more;
    /// for one it names, the branch's history is searched as deep as this deployment looks.
    async fn find_replay(
        &self,
        remote: &Remote,
        name: &StateName,
        state_commit: ObjectId,
    ) -> Result<Option<ObjectId>, HistoryError> {
        let Some(tip) = remote.recent_tip(Duration::MAX) else {
            return Ok(None);
        };
        let (cache, path) = (remote.cache.clone(), name.to_string());
        if !remote.cache.has(tip)? || !blocking(move || cache.has_file(tip, FOLDED_PATH)).await? {
            return Ok(None);
        }
        remote.want_blobs(tip, vec![FOLDED_PATH.to_owned()]).await?;
        let cache = remote.cache.clone();
        let record = blocking(move || cache.read_path(tip, FOLDED_PATH)).await?;
        let named = record
            .and_then(|bytes| FoldRecord::parse(&bytes).ok())
            .is_some_and(|record| record.last(&path).is_some());
        if !named {
            return Ok(None);
        }
        let max = self.options.max_history_depth;
        let mut depth = FIRST_HISTORY_DEPTH.min(max);
        loop {
            let cache = remote.cache.clone();
            match blocking(move || cache.replay_of(tip, state_commit)).await? {
                Replayed::At(replay) => return Ok(Some(replay)),
                Replayed::Absent => return Ok(None),
                Replayed::Shallow { boundary, walked } => {
                    match deepen_past(remote, tip, Some(boundary), walked, depth, max).await? {
                        Deeper::Fetched(next) => depth = next,
                        Deeper::AtMost | Deeper::Whole => return Ok(None),
                    }
                }
            }
        }
    }

    /// Make the cache hold `commit` if it is on the first-parent chain of `tip` (a branch or
    /// state ref tip the cache holds), fetching only what that needs: the commit alone first (an
    /// id no ref reaches is refused by the remote, one request), then history down to it,
    /// within [`StoreOptions::max_history_depth`]. `Ok(false)`: not on it (as deep as this
    /// deployment looks).
    async fn find_on_chain_of(
        &self,
        remote: &Remote,
        tip: ObjectId,
        commit: ObjectId,
    ) -> Result<bool, HistoryError> {
        // (The embedded repository fetches nothing: it holds the commit or never will.)
        if !remote.cache.has(commit)? {
            match remote.fetch_one(commit, tip).await {
                Ok(()) => {}
                Err(error) if error.refused() => {
                    tracing::info!(%commit, error = %gitstate_core::report::chain(&error), "the remote has no such commit");
                    return Ok(false);
                }
                Err(other) => return Err(other.into()),
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
                    match deepen_past(remote, tip, Some(boundary), walked, depth, max).await? {
                        Deeper::Fetched(next) => depth = next,
                        Deeper::AtMost | Deeper::Whole => return Ok(false),
                    }
                }
            }
        }
    }
}

/// Where a walk that stopped at the cache's shallow boundary goes next.
enum Deeper {
    /// The history behind the tip was fetched deeper: walk again (and ask for this depth if
    /// that is not enough).
    Fetched(u32),
    /// As deep as this deployment fetches (`GITSTATE_HISTORY_MAX_DEPTH`).
    AtMost,
    /// The repository holds its whole history (see [`super::transport::Transport::deepens`]):
    /// a walk that stopped short of a root found it broken.
    Whole,
}

/// Deepen the cache's history behind `tip` after a walk stopped at its shallow boundary
/// (`boundary`, else looked up) having `walked` commits: at least twice that, at least `depth`,
/// at most `max`, declaring the boundary so only the commits past it come.
async fn deepen_past(
    remote: &Remote,
    tip: ObjectId,
    boundary: Option<ObjectId>,
    walked: usize,
    depth: u32,
    max: u32,
) -> Result<Deeper, HistoryError> {
    if !remote.transport.deepens() {
        return Ok(Deeper::Whole);
    }
    let walked = u32::try_from(walked).unwrap_or(u32::MAX);
    if walked >= max {
        return Ok(Deeper::AtMost);
    }
    let boundary = match boundary {
        Some(boundary) => boundary,
        None => {
            let cache = remote.cache.clone();
            let Chain::Shallow { boundary, .. } =
                blocking(move || cache.find_on_chain(tip, null())).await?
            else {
                return Err(HistoryError::Broken(Broken::BoundaryMoved));
            };
            boundary
        }
    };
    let depth = depth.max(walked.saturating_mul(2)).min(max);
    remote.deepen(tip, boundary, depth).await?;
    Ok(Deeper::Fetched(depth.saturating_mul(4)))
}
