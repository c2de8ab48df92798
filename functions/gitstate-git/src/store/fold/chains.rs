//! Which state commits a fold replays, and the replays: each state ref's chain down to what the
//! branch tip or the record already reaches, the check that the branch's file is what that
//! chain was written on, and one branch commit per write in the order of committer times.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use gix::ObjectId;

use gitstate_core::fold::{FOLDED_PATH, FoldRecord};

use super::View;
use crate::repository::{self, Cache, StateCommit};
use crate::store::RemoteError;
use crate::store::blocking;
use crate::store::known::state_ref;
use crate::store::remote::Remote;

/// What a look's fold replays.
pub(super) struct Planned {
    /// The writes, in the order replayed.
    pub(super) order: Vec<StateCommit>,
    /// The last replay (the tip when nothing is replayed).
    pub(super) head: ObjectId,
    /// What the remote lacks of the replays.
    pub(super) objects: Vec<ObjectId>,
    /// States not folded because the branch's file is not what their chain was written on.
    pub(super) refused: Vec<String>,
    /// State refs (name, tip) this fold leaves as they are: refused, or left over by a delete.
    pub(super) settled: Vec<(String, ObjectId)>,
}

impl Planned {
    /// How many states the replays belong to.
    pub(super) fn states(&self) -> usize {
        self.order
            .iter()
            .map(|commit| commit.path.as_str())
            .collect::<HashSet<_>>()
            .len()
    }
}

/// One state's unfolded writes, oldest first, and the commit the oldest was written on.
struct Chain {
    name: String,
    tip: ObjectId,
    commits: Vec<StateCommit>,
    base: Option<ObjectId>,
}

/// Fetch the unfolded state commits of `view`, check each state against the branch, and
/// replay those that pass onto the tip.
pub(super) async fn plan(remote: &Arc<Remote>, view: &View) -> Result<Planned, RemoteError> {
    let branch = remote.branch.clone();
    let wants: Vec<ObjectId> = view.pending.iter().map(|(_, tip)| *tip).collect();
    let pending_names: HashSet<&str> = view.pending.iter().map(|(n, _)| n.as_str()).collect();
    let haves: Vec<ObjectId> = std::iter::once(view.tip)
        .chain(
            view.record
                .0
                .iter()
                .filter(|(path, _)| pending_names.contains(state_ref(&branch, path).as_str()))
                .filter_map(|(_, commit)| ObjectId::from_hex(commit.as_bytes()).ok()),
        )
        .collect();
    let unfolded = remote
        .transport
        .fetch_beyond(&remote.cache, wants, haves)
        .await?;
    let (cache, pending) = (remote.cache.clone(), view.pending.clone());
    let chains = blocking(move || {
        pending
            .into_iter()
            .map(|(name, tip)| chain(&cache, (&branch, name), tip, &unfolded))
            .collect::<Result<Vec<_>, _>>()
    })
    .await?;
    // The commits the chains were written on, for the check: their trees, if missing.
    let bases: Vec<ObjectId> = chains.iter().filter_map(|c| c.base).collect();
    remote.ensure(bases).await?;
    let (cache, tip, record) = (remote.cache.clone(), view.tip, view.record.clone());
    Ok(blocking(move || replay(&cache, tip, record, chains)).await?)
}

/// The unfolded writes of the state ref `name` at `tip`: its first-parent chain while the
/// commits are in `unfolded` and state commits of the path the ref is named after.
fn chain(
    cache: &Cache,
    (branch, name): (&str, String),
    tip: ObjectId,
    unfolded: &HashSet<ObjectId>,
) -> Result<Chain, repository::Error> {
    let mut commits = Vec::new();
    let mut at = Some(tip);
    while let Some(id) = at.filter(|id| unfolded.contains(id)) {
        let Some(commit) = cache.state_commit(id)? else {
            break;
        };
        if state_ref(branch, &commit.path) != name {
            break;
        }
        at = commit.parent;
        commits.push(commit);
    }
    commits.reverse();
    let base = commits.first().and_then(|first| first.parent);
    Ok(Chain {
        name,
        tip,
        commits,
        base,
    })
}

/// Check each chain against the branch at `tip`, then replay the writes of those that pass,
/// oldest committer time first (a state's own writes always in their order).
fn replay(
    cache: &Cache,
    tip: ObjectId,
    mut record: FoldRecord,
    chains: Vec<Chain>,
) -> Result<Planned, repository::Error> {
    let mut planned = Planned {
        order: Vec::new(),
        head: tip,
        objects: Vec::new(),
        refused: Vec::new(),
        settled: Vec::new(),
    };
    let mut queues: Vec<VecDeque<StateCommit>> = Vec::new();
    for chain in chains {
        let Some(path) = chain.commits.first().map(|c| c.path.clone()) else {
            // No unfolded state commit at its tip (a ref moved by hand, or onto a commit the
            // branch already has): nothing to fold, and no reason to look again.
            planned.settled.push((chain.name, chain.tip));
            continue;
        };
        let on_branch = cache.blob_at(tip, &path)?;
        let written_on = match chain.base {
            Some(base) => cache.blob_at(base, &path)?,
            None => None,
        };
        if on_branch.is_none() && written_on.is_some() {
            // The file the ref's writes were made on was removed from the branch with writes
            // still unfolded: not gitstate's delete (which replays them first), but a person's
            // (`git rm`, `git mv`). Folding would bring the state back; leaving the ref would
            // drop acknowledged writes: a person decides, as for an edit.
            planned.refused.push(path);
            planned.settled.push((chain.name, chain.tip));
        } else if on_branch.is_none() {
            // The branch lacks the state: a delete left this ref behind; nothing to fold.
            tracing::debug!(state = %path, "state ref of a deleted state left as it is");
            planned.settled.push((chain.name, chain.tip));
        } else if on_branch != written_on {
            planned.refused.push(path);
            planned.settled.push((chain.name, chain.tip));
        } else {
            queues.push(chain.commits.into());
        }
    }
    while let Some(next) = oldest(&mut queues) {
        record.set(&next.path, next.id.to_string());
        let made = cache.replay(planned.head, &next, &record)?;
        planned.head = made.id;
        for id in made.objects {
            if !planned.objects.contains(&id) {
                planned.objects.push(id);
            }
        }
        planned.order.push(next);
    }
    Ok(planned)
}

/// The front write with the oldest committer time (ties: the state ref named first), taken off
/// its queue.
fn oldest(queues: &mut [VecDeque<StateCommit>]) -> Option<StateCommit> {
    let index = queues
        .iter()
        .enumerate()
        .filter_map(|(i, queue)| queue.front().map(|front| (front.time(), i)))
        .min()?
        .1;
    queues[index].pop_front()
}

/// What replaying one state's unfolded writes made (see [`replay_one`]).
pub(in crate::store) struct OneState {
    /// The last replay (the head given when there was nothing to replay).
    pub(in crate::store) head: ObjectId,
    /// What the remote lacks of the replays.
    pub(in crate::store) objects: Vec<ObjectId>,
}

/// The fold of one state, as a delete carries it before removing the file: the unfolded writes
/// of the state ref `name` at `state_tip` (the file at `path`) replayed onto the branch commit
/// `head` exactly as a fold replays them (the record at `head` updated in each, so no fold
/// replays them again). `tip` is the branch tip the remote has (`head` is it, or a commit built
/// on it). `None`: the branch's file is not what the chain was written on (a fold refuses the
/// state too).
pub(in crate::store) async fn replay_one(
    remote: &Remote,
    tip: ObjectId,
    head: ObjectId,
    name: String,
    state_tip: ObjectId,
    path: &str,
) -> Result<Option<OneState>, RemoteError> {
    remote.want_blobs(tip, vec![FOLDED_PATH.to_owned()]).await?;
    let cache = remote.cache.clone();
    let record = blocking(move || cache.fold_record(head)).await?;
    let folded = record
        .last(path)
        .and_then(|commit| ObjectId::from_hex(commit.as_bytes()).ok());
    let haves: Vec<ObjectId> = std::iter::once(tip).chain(folded).collect();
    let unfolded = remote
        .transport
        .fetch_beyond(&remote.cache, vec![state_tip], haves)
        .await?;
    let (cache, branch) = (remote.cache.clone(), remote.branch.clone());
    let chain = blocking(move || chain(&cache, (&branch, name), state_tip, &unfolded)).await?;
    if chain.commits.is_empty() {
        return Ok(Some(OneState {
            head,
            objects: Vec::new(),
        }));
    }
    remote.ensure(chain.base.into_iter().collect()).await?;
    let (cache, path) = (remote.cache.clone(), path.to_owned());
    let done = blocking(move || {
        let on_branch = cache.blob_at(head, &path)?;
        let written_on = match chain.base {
            Some(base) => cache.blob_at(base, &path)?,
            None => None,
        };
        if on_branch != written_on {
            return Ok(None);
        }
        let (mut record, mut done) = (
            record,
            OneState {
                head,
                objects: Vec::new(),
            },
        );
        for commit in &chain.commits {
            record.set(&path, commit.id.to_string());
            let made = cache.replay(done.head, commit, &record)?;
            done.head = made.id;
            for id in made.objects {
                if !done.objects.contains(&id) {
                    done.objects.push(id);
                }
            }
        }
        Ok(Some(done))
    })
    .await?;
    Ok(done)
}
