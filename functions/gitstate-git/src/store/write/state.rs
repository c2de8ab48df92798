//! Updates of a state whose home is its own ref (issue 27): a state commit (the one file, on the
//! ref's tip, or on the branch commit whose file it replaces) pushed to the state ref by
//! compare-and-swap, atomically with "lock ref unchanged" where the remote pushes atomically.
//!
//! While a state's lock is held, only its holder creates or moves the state's ref (a fold moves
//! only the branch; a broken lock makes the holder's atomic push fail), so:
//! - a known tip `T` is pushed `T → S`: a wrong belief costs one refused push;
//! - a ref believed absent is pushed `0 → S` (create-only): the push itself proves it absent,
//!   and if it exists after all the write looks again and the service's plan is asked again
//!   against the newest stored content. The push also asserts the branch at the commit its plan
//!   judged (the file the state commit replaces): a write of the state through the branch since
//!   (an unlocked one, or a backend's whose setting differs) refuses it. No write ever lands
//!   where a newer one would hide it.
//!
//! At the floor (no advertisement) the write rests on a look taken under this process's lock
//! (the GET after its LOCK, its LOCK's assertion, or its own last push). Only a create of the
//! ref asserts the branch (above): the branch is every state's, and git locks a ref it is asked
//! to assert, so asserting it in every write would make concurrent writes of different states
//! queue on it again. A person's edit or removal of the file since is found by the reads and
//! the fold (`States::edited_outside`, `removed_outside`: 409, both kept). Besides:
//! - a look that found the ref's tip: the push names it, so a write the same Terraform run made
//!   meanwhile through another process makes it fail;
//! - a look that found no ref: the push creates it (above).
//!
//! Writes to different states never share a compare-and-swap point, so they need no group
//! commit; each runs in its caller's request (a caller that goes away takes its write with it)
//! with the same attempts and deadline as a branch write.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gix::ObjectId;

use gitstate_core::StateName;
use gitstate_core::ports::{Location, Refusal, Stored, WritePlan, Written};

use super::lead::backoff;
use super::plan::blob_id;
use super::queue::{MAX_WRITE_ATTEMPTS, Sends, Sent, WRITE_DEADLINE, forget_refused};
use crate::protocol::{Command, Service, Updates};
use crate::repository::NewCommit;
use crate::settings::StateRefs;
use crate::store::RemoteError;
use crate::store::known::{Home, Seen};
use crate::store::proving::probe_ref;
use crate::store::remote::Remote;
use crate::store::{GitStore, WriteError, WriteMode, blocking, null};
use crate::sync::lock;

/// Where an update to a state's ref ended.
pub(super) enum Hop {
    Done(Written),
    /// Not an update of a state whose home is its ref (a create, or `auto`/`never` and no ref):
    /// the branch takes it.
    Branch,
}

/// How one attempt ended.
enum Step {
    Done(Hop),
    /// Decide again from a fresh advertisement (missed at the floor).
    Fresh,
    /// The push was refused after an advertisement: the ref or the lock moved.
    Lost,
}

/// Where an attempt starts.
struct Start {
    /// A branch commit that has the state's file, as current as the lock makes it.
    branch: ObjectId,
    home: Home,
    lock_tip: Option<ObjectId>,
    mode: WriteMode,
    floor: bool,
    /// When the look it rests on was asked for.
    at: Instant,
    /// A LOCK's probe standing in the state ref's name (see the `floor` module), at this tip.
    probe: Option<ObjectId>,
}

/// One update's fixed parts.
struct Update<'a> {
    name: &'a StateName,
    /// The branch's full ref name.
    branch_ref: String,
    state_ref: String,
    lock_ref: String,
    bytes: &'a Bytes,
    plan: &'a WritePlan,
    always: bool,
    /// The pushes of this write, on this ref and on the branch (see `queue::Sent`).
    pushed: Sends,
}

impl GitStore {
    /// Update `name` with `bytes` on its own ref (see the module doc).
    pub(super) async fn write_to_ref(
        &self,
        remote: &Arc<Remote>,
        at: &Location,
        name: &StateName,
        bytes: &Bytes,
        plan: &WritePlan,
        (started, pushed): (Instant, &Sends),
    ) -> Result<Hop, WriteError> {
        let update = Update {
            name,
            branch_ref: at.branch.full_ref(),
            state_ref: remote.state_ref(name.as_str()),
            lock_ref: self.lock_ref(name),
            bytes,
            plan,
            always: self.options.state_refs == StateRefs::Always,
            pushed: pushed.clone(),
        };
        let (mut floor, mut attempts, mut losses) = (true, 0u32, 0u32);
        let mut last_error: Option<WriteError> = None;
        let mut last_round = Duration::ZERO;
        loop {
            if attempts >= MAX_WRITE_ATTEMPTS || started.elapsed() > WRITE_DEADLINE {
                return Err(last_error.unwrap_or(WriteError::Contention { attempts }));
            }
            if losses > 0 {
                tokio::time::sleep(backoff(losses + 1, last_round)).await;
            }
            attempts += 1;
            let round_started = Instant::now();
            let step = async {
                let start = match floor.then(|| ref_floor(remote, &update)).flatten() {
                    Some(start) => start,
                    None => match ref_fresh(remote, at, &update).await? {
                        Some(start) => start,
                        None => return Ok(Step::Done(Hop::Branch)),
                    },
                };
                ref_round(remote, &update, &start).await
            };
            let step = step.await;
            last_round = round_started.elapsed();
            floor = false;
            match step {
                Ok(Step::Done(hop)) => return Ok(hop),
                Ok(Step::Fresh) => {}
                Ok(Step::Lost) => {
                    losses += 1;
                    last_error = None;
                }
                Err(error) if error.is_transient() => {
                    tracing::debug!(error = %gitstate_core::report::chain(&error), "state ref write failed, retrying");
                    losses += 1;
                    last_error = Some(error.into());
                }
                Err(error) => return Err(error.into()),
            }
        }
    }
}

/// An attempt at the floor: the lock this process made, and a look under it that knows the
/// state's home (a ref believed absent only when the create-only push may settle it).
fn ref_floor(remote: &Remote, update: &Update<'_>) -> Option<Start> {
    let caps = remote.floor_caps()?;
    if WriteMode::of(&caps) != WriteMode::Atomic {
        return None;
    }
    let (lock_tip, made) = remote.made_lock_at(&update.lock_ref)?;
    let seen = remote.look_since(&update.state_ref, made)?;
    // A known tip: the push names it, so nothing written since through another process of the
    // same Terraform run can be missed (see `round::usable_at_floor`). No ref, under `always`:
    // the push creates it and asserts the branch the look saw (`push_state_commit`).
    let settled_by_push = match seen.home {
        Home::At(_) => true,
        Home::Absent => update.always,
        Home::Unknown => false,
    };
    if !settled_by_push || !remote.cache.has(seen.branch).ok()? {
        return None;
    }
    Some(Start {
        branch: seen.branch,
        home: seen.home,
        lock_tip: Some(lock_tip),
        mode: WriteMode::Atomic,
        floor: true,
        at: seen.at,
        // This lock's own probe, which the ref's create must delete first.
        probe: remote.own_probe(&update.lock_ref, lock_tip),
    })
}

/// An attempt from a fresh receive-pack advertisement of the branch, the state's ref and its
/// lock ref. `None`: no branch (the write is a create).
async fn ref_fresh(
    remote: &Remote,
    at: &Location,
    update: &Update<'_>,
) -> Result<Option<Start>, RemoteError> {
    let branch = at.branch.full_ref();
    let asked = Instant::now();
    let names = vec![
        branch.clone(),
        update.state_ref.clone(),
        update.lock_ref.clone(),
    ];
    let advert = remote.refs(Service::ReceivePack, names).await?;
    let Some(tip) = advert.tip(&branch) else {
        return Ok(None);
    };
    remote.ensure(vec![tip]).await?;
    remote.saw_tip(tip);
    Ok(Some(Start {
        branch: tip,
        home: advert.tip(&update.state_ref).map_or(Home::Absent, Home::At),
        lock_tip: advert.tip(&update.lock_ref),
        mode: WriteMode::of(&advert),
        floor: false,
        at: asked,
        probe: advert.tip(&probe_ref(&update.state_ref)),
    }))
}

/// One attempt: the plan against the newest stored content, the state commit, its push.
async fn ref_round(
    remote: &Remote,
    update: &Update<'_>,
    start: &Start,
) -> Result<Step, RemoteError> {
    let path = update.name.as_str();
    // At the floor only a push rests on what this process remembers: anything else is decided
    // again from the remote.
    let decided = |hop| {
        if start.floor {
            Step::Fresh
        } else {
            Step::Done(hop)
        }
    };
    remote.not_a_copy(start.branch, None).await?;
    if !remote.branch_has(start.branch, path).await? {
        return Ok(Step::Done(Hop::Branch));
    }
    // Without atomic push no state ref is created: a delete could not remove it and the
    // branch's file as one.
    let state_tip = match start.home {
        Home::At(state_tip) => Some(state_tip),
        Home::Absent if update.always && start.mode == WriteMode::Atomic => None,
        _ => return Ok(decided(Hop::Branch)),
    };
    let stored = match state_tip {
        Some(state_tip) => Some(remote.read_state_commit(state_tip, path).await?),
        None => remote.read(start.branch, path.to_owned()).await?,
    };
    // This write's earlier push landed: its commit is on the state's ref (see `plan::plan_one`).
    let pushed = lock(&update.pushed).clone();
    if let Some(state_tip) = state_tip
        && !pushed.is_empty()
        && remote.carries_one_of(state_tip, pushed, false).await?
    {
        tracing::info!(state = %update.name, "a write's earlier push landed though its answer was lost");
        // It is on the state's ref: a write for the fold, as if its answer had come.
        remote.folds.wrote_state();
        return Ok(decided(Hop::Done(Written::Unchanged)));
    }
    // The branch's file written outside gitstate since the ref's writes: a write on the ref
    // would bury that edit as a read would hide it (`Remote::edited_outside`), so it is the
    // reads' refusal. No request where a read of this tip looked already (the GET after the
    // LOCK): the index's blob is in the cache.
    if let Some(state_tip) = state_tip
        && remote.edited_outside(start.branch, state_tip, path).await?
    {
        return Ok(decided(Hop::Done(Written::Refused(Refusal::Diverged))));
    }
    let held = match start.lock_tip {
        Some(lock_tip) => Some(remote.held(lock_tip, update.name).await?),
        None => None,
    };
    let id = stored.as_deref().and_then(blob_id);
    let judged = stored.as_deref().map(|content| Stored {
        content,
        id: id.as_deref(),
    });
    let meta = match (update.plan)(held.as_ref(), judged) {
        Ok(meta) => meta,
        Err(refusal) => return Ok(decided(Hop::Done(Written::Refused(refusal)))),
    };
    if stored.as_deref() == Some(update.bytes.as_ref()) {
        return Ok(decided(Hop::Done(Written::Unchanged)));
    }
    // Under a lock another process made: not before the reads it may answer from its LOCK are
    // over (see the `floor` module).
    if let Some(lock_tip) = start.lock_tip {
        remote.outwait_proof(&update.lock_ref, lock_tip).await?;
    }
    if let (None, Some(probe)) = (state_tip, start.probe) {
        clear_probe(remote, update, probe).await?;
    }
    let parent = state_tip.unwrap_or(start.branch);
    let meta = remote.marked(meta);
    let (cache, owned, bytes) = (remote.cache.clone(), path.to_owned(), update.bytes.clone());
    let commit = blocking(move || cache.state_commit_on(parent, &owned, &bytes, &meta)).await?;
    push_state_commit(remote, update, start, state_tip, commit).await
}

/// Delete a LOCK's probe at `tip` that stands in the way of creating the state's ref: this write
/// decided under the state's lock, or with no lock held, so the probe is of a lock released
/// since (elsewhere, or by force) or of this very lock, whose holder is writing. A refusal is
/// left to the create-only push that follows, which then loses and looks again.
async fn clear_probe(
    remote: &Remote,
    update: &Update<'_>,
    tip: ObjectId,
) -> Result<(), RemoteError> {
    let delete = Command {
        old: tip,
        new: null(),
        name: probe_ref(&update.state_ref),
    };
    match remote.own_probe(&update.lock_ref, tip) {
        Some(_) => {
            tracing::debug!(probe = %delete.name, "deleting this lock's probe before the state's ref is created")
        }
        None => {
            tracing::info!(probe = %delete.name, "deleting a LOCK's probe left standing in a state ref's name")
        }
    }
    let report = remote.push_each(vec![delete.clone()], Vec::new()).await?;
    if report.all_ok(&[delete]) {
        remote.probe_gone(&update.lock_ref, tip);
    }
    Ok(())
}

/// Push the state commit `commit` to the state's ref by compare-and-swap from `state_tip`
/// (create-only when `None`), with the lock ref unchanged where the push is atomic, and a
/// create with the branch unchanged since the look it rests on.
async fn push_state_commit(
    remote: &Remote,
    update: &Update<'_>,
    start: &Start,
    state_tip: Option<ObjectId>,
    commit: NewCommit,
) -> Result<Step, RemoteError> {
    let command = Command {
        old: state_tip.unwrap_or_else(null),
        new: commit.id,
        name: update.state_ref.clone(),
    };
    let mut commands = vec![command];
    if let (WriteMode::Atomic, Some(lock_tip)) = (start.mode, start.lock_tip) {
        // The plan accepted the lock as it is: the write lands only if it still is.
        commands.push(Command {
            old: lock_tip,
            new: lock_tip,
            name: update.lock_ref.clone(),
        });
    }
    if state_tip.is_none() {
        // The branch as the plan judged it, still there, or the push is refused: its file says
        // whether the state exists, and a create-only push (`0 → S`) replaces it, so a branch
        // write landed since the look would be lost behind the new ref. A write to a ref that
        // exists does not assert the branch, at the floor or not: every push of every apply
        // would lock the one branch ref on the host (git's ref transaction locks a ref it only
        // verifies), the compare-and-swap point the state refs are there to avoid. What may
        // land on the branch since the look does not hide the write: gitstate's own delete
        // removes the ref, so the compare-and-swap from the state's tip fails; a fold carries
        // the ref's content; and a person's edit or `git rm` of the file is found by the next
        // read and fold (`States::edited_outside`, `removed_outside`): 409, both kept, a person
        // decides.
        commands.push(Command {
            old: start.branch,
            new: start.branch,
            name: update.branch_ref.clone(),
        });
    }
    lock(&remote.looks).unknown(&update.state_ref, start.branch);
    lock(&update.pushed).push(Sent {
        commit: commit.id,
        base: Some(state_tip.unwrap_or(start.branch)),
        branch: Some(start.branch),
    });
    let report = if start.floor {
        match remote
            .push_at_floor(commands.clone(), commit.objects, Updates::Atomic)
            .await?
        {
            Some(report) => report,
            None => return Ok(Step::Fresh),
        }
    } else {
        remote.push(commands.clone(), commit.objects).await?
    };
    if !report.all_ok(&commands) {
        // Refused with a report (atomic): it landed nothing (see `queue::forget_refused`).
        forget_refused(&update.pushed, commit.id);
        tracing::debug!(?report, "state ref write lost a race");
        return Ok(if start.floor { Step::Fresh } else { Step::Lost });
    }
    let seen = Seen {
        branch: start.branch,
        home: Home::At(commit.id),
        at: start.at,
    };
    lock(&remote.looks).landed(&update.state_ref, seen);
    Ok(Step::Done(Hop::Done(Written::Committed {
        version: commit.id.to_string(),
        content: blob_id(update.bytes),
    })))
}

/// Whether a look at the state's home taken under this process's lock of it (the GET after the
/// LOCK, say) found neither a ref nor, in the branch commit it saw, the file (read from the
/// cache, no request): the write is a create. `false` when that is not known.
pub(super) async fn known_create(remote: &Remote, lock_ref: &str, path: &str) -> bool {
    let Some((_, made)) = remote.made_lock_at(lock_ref) else {
        return false;
    };
    let Some(seen) = remote.look_since(&remote.state_ref(path), made) else {
        return false;
    };
    if seen.home != Home::Absent {
        return false;
    }
    let (cache, path) = (remote.cache.clone(), path.to_owned());
    let absent =
        blocking(move || Ok(cache.has(seen.branch)? && !cache.has_file(seen.branch, &path)?)).await;
    absent.unwrap_or(false)
}
