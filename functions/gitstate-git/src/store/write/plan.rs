//! One write's decision in a round of branch writes: its tree check, the lock and the plan
//! against the newest stored content (the state's own ref when it has one), and what that makes
//! of it: decided, an update for the state's own ref, or a commit on the branch (a create that
//! also removes a ref left over by a delete, a delete that first carries the state's unfolded
//! writes).

use bytes::Bytes;
use gix::ObjectId;

use gitstate_core::ports::{Change, CommitMeta, Refusal, Stored, Written};

use super::queue::Job;
use crate::store::RemoteError;
use crate::store::blocking;
use crate::store::known::Home;
use crate::store::remote::Remote;

/// What one write of a round comes to.
pub(super) enum Planned {
    Decided(Written),
    /// An update of a state whose home is its own ref (or is to be: `GITSTATE_STATE_REFS=always`).
    ToRef,
    /// A commit on the branch: `None` removes the file.
    Commit(Option<Bytes>, CommitMeta),
    /// Not before this long: the lock is another process's, whose LOCK's proof may still answer
    /// reads (see the `floor` module).
    Wait(std::time::Duration),
}

/// One write's tree check, lock and plan against the branch at `tip`, the state's home being
/// `home` (`None`: not a state, or no state refs to think of). `always`: every update of an
/// existing state goes to its own ref.
pub(super) async fn plan_one(
    remote: &Remote,
    tip: Option<ObjectId>,
    job: &Job,
    lock_tip: Option<ObjectId>,
    home: Option<Home>,
    always: bool,
) -> Result<Planned, RemoteError> {
    // The tree rule, against the very tree the commit is built on: a concurrent writer that
    // slips a clashing path in makes the push lose the compare-and-swap, and the next round
    // sees it here. Writes in one round never overlap, so the tip's tree is the chain's.
    let on_branch = match tip {
        Some(tip) => {
            let (cache, owned) = (remote.cache.clone(), job.path.clone());
            if let Some(clash) = blocking(move || cache.path_clash(tip, &owned)).await? {
                return Ok(Planned::Decided(Written::Refused(Refusal::Clash(clash))));
            }
            remote.branch_has(tip, &job.path).await?
        }
        None => false,
    };
    let held = match (lock_tip, &job.lock) {
        (Some(lock_tip), Some(name)) => Some(remote.held(lock_tip, name).await?),
        _ => None,
    };
    let state_tip = match home {
        Some(Home::At(state_tip)) => Some(state_tip),
        _ => None,
    };
    // The branch is gone while the state's ref holds the state (deleted outside gitstate): a
    // commit would start a new branch without the other states.
    if tip.is_none() && state_tip.is_some() {
        return Ok(Planned::Decided(Written::Refused(Refusal::Diverged)));
    }
    // A state's newest content is its ref's while the branch has its file; a ref without the
    // file is left over by a delete and holds no state.
    let stored = match (tip, state_tip) {
        (Some(_), Some(state_tip)) if on_branch => {
            Some(remote.read_state_commit(state_tip, &job.path).await?)
        }
        (Some(tip), _) if on_branch => remote.read(tip, job.path.clone()).await?,
        _ => None,
    };
    // A push of this write went out before (its answer lost, say) and the branch carries that
    // push's commit: it landed, under the lock it asserted, whatever the lock is now and
    // whatever was written after it (the rules would refuse, or write again, what is already
    // written).
    let pushed = crate::sync::lock(&job.pushed).clone();
    if let Some(tip) = tip
        && !pushed.is_empty()
        && remote.carries_one_of(tip, pushed, true).await?
    {
        tracing::info!(state = %job.path, "a write's earlier push landed though its answer was lost");
        return Ok(Planned::Decided(Written::Unchanged));
    }
    // The branch's file written outside gitstate since the ref's writes: a delete or a write
    // would bury that edit (see `Remote::edited_outside`), so it is the reads' refusal.
    // Or the file removed outside gitstate while the ref holds writes the branch never had
    // (`Remote::removed_outside`): a create would drop them with the leftover ref.
    if let (Some(tip), Some(state_tip)) = (tip, state_tip) {
        let outside = match on_branch {
            true => remote.edited_outside(tip, state_tip, &job.path).await?,
            false => remote.removed_outside(tip, state_tip, &job.path).await?,
        };
        if outside {
            return Ok(Planned::Decided(Written::Refused(Refusal::Diverged)));
        }
    }
    let id = stored.as_deref().and_then(blob_id);
    let judged = stored.as_deref().map(|content| Stored {
        content,
        id: id.as_deref(),
    });
    let meta = match (job.plan)(held.as_ref(), judged) {
        Ok(meta) => meta,
        Err(refusal) => return Ok(Planned::Decided(Written::Refused(refusal))),
    };
    let to_ref = on_branch && home.is_some() && (state_tip.is_some() || always);
    let planned = match &job.change {
        Change::Put(bytes) if stored.as_deref() == Some(bytes.as_ref()) => {
            Planned::Decided(Written::Unchanged)
        }
        Change::Put(_) if to_ref => Planned::ToRef,
        Change::Put(bytes) => Planned::Commit(Some(bytes.clone()), meta),
        Change::Delete => Planned::Commit(None, meta),
    };
    // A commit under a lock another process made waits out the reads that process may answer
    // from its LOCK (see the `floor` module), in its caller, not in the round; a write to the
    // state's ref waits where it pushes.
    if let (Planned::Commit(..), Some(lock_tip), Some(name)) = (&planned, lock_tip, &job.lock) {
        let lock_ref = format!("{}{name}", remote.lock_prefix);
        let wait = remote.proof_wait(&lock_ref, lock_tip).await?;
        if !wait.is_zero() {
            return Ok(Planned::Wait(wait));
        }
    }
    Ok(planned)
}

/// The git blob id of `content` (what a plan and the service know a stored state by); none if
/// it cannot be computed, so a sealed state is then opened rather than judged by a shared id.
pub(super) fn blob_id(content: &[u8]) -> Option<String> {
    gix::objs::compute_hash(gix::hash::Kind::Sha1, gix::objs::Kind::Blob, content)
        .ok()
        .map(|id| id.to_string())
}

/// The blob id of what `job` writes, if it writes content.
pub(super) fn written_id(job: &Job) -> Option<String> {
    match &job.change {
        Change::Put(bytes) => blob_id(bytes),
        Change::Delete => None,
    }
}
