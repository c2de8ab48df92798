//! Group commit: writes to one branch that wait at the same time leave in one push.
//!
//! Every write is a compare-and-swap of the branch, so many writers of one branch land one push
//! at a time. Within one process, writes queue up per branch, and one task (started by the write
//! that found nobody pushing) pushes them until the queue is empty: each round takes the waiting
//! writes that do not touch the same or an overlapping path, builds one commit per write, each on
//! the one before (a chain on the tip, so every state's history keeps its own author, message
//! and trailers), and pushes the chain in one request. Under a lock, the push also asserts every
//! writer's lock ref unchanged (atomically), so a write whose lock was broken meanwhile makes the
//! whole push lose, and the next round refuses it alone. A lone write is a round of one: the same
//! requests as without batching.
//!
//! Callers only wait for their answer: a caller that goes away (a dropped request) takes nothing
//! with it, and its write is dropped if it has not left yet; a round all of whose callers went
//! away is dropped where it stands. A push refused twice on the same tip
//! (not a race: a hook or a size limit refusing one of the writes), or a round that fails for
//! good, is retried one write at a time, so one write cannot fail the others.
//!
//! - [`queue`]: the waiting writes of a branch, and which of them go together;
//! - [`lead`]: the task that pushes rounds until the queue is empty, and what a round's end
//!   means for its writes and the next round ([`lead::Standing`]);
//! - [`round`]: one round, from where it starts to its push.

mod lead;
mod plan;
mod push;
mod queue;
mod round;
mod state;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use gitstate_core::StateName;
use gitstate_core::ports::{Change, CommitMeta, Location, Refusal, WritePlan, Written};

use crate::settings::StateRefs;
use crate::store::{GitStore, WriteError};

pub(super) use lead::backoff;
pub(super) use queue::{Batcher, Sent};
use queue::{Job, Routed, Sends};
use round::Writer;
use state::Hop;

/// How often one write may go from the branch to its state's ref or back (a create that turned
/// out an update, an update whose state's home turned out to be its ref).
const MAX_HOPS: u32 = 4;

impl GitStore {
    pub(super) async fn create_config(
        &self,
        at: &Location,
        path: &str,
        content: Bytes,
        meta: &CommitMeta,
    ) -> Result<bool, WriteError> {
        let meta = meta.clone();
        let plan: WritePlan = Arc::new(move |_, stored: Option<_>| match stored {
            Some(_) => Err(Refusal::Exists),
            None => Ok(meta.clone()),
        });
        Ok(matches!(
            self.write_file(at, path, None, Change::Put(content), plan)
                .await?,
            Written::Committed { .. }
        ))
    }

    pub(super) async fn replace_config(
        &self,
        at: &Location,
        path: &str,
        expected: Option<Bytes>,
        content: Bytes,
        meta: &CommitMeta,
    ) -> Result<bool, WriteError> {
        let plan = gitstate_core::ports::replace_plan(expected, meta.clone());
        Ok(!matches!(
            self.write_file(at, path, None, Change::Put(content), plan)
                .await?,
            Written::Refused(_)
        ))
    }

    /// The state `name`, written under its lock (see [`Self::write_file`]); a fold may follow in
    /// the background (see the `fold` module).
    pub(super) async fn write_state(
        &self,
        at: &Location,
        name: &StateName,
        change: Change,
        plan: WritePlan,
    ) -> Result<Written, WriteError> {
        let written = self
            .write_file(at, name.as_str(), Some(name), change, plan)
            .await;
        self.fold_after_write(at);
        written
    }

    /// The one write of [`GitStore::write_state`] and [`GitStore::create_config`]: `path`,
    /// guarded by the lock of `lock` when given (a state). An update of a state whose home is
    /// its own ref (`GITSTATE_STATE_REFS=always`, or a state that has one) goes there (see the
    /// `state` module); every other write is queued with the branch's waiting writes and pushed
    /// with them (see the module doc), retried on a moved branch.
    pub(super) async fn write_file(
        &self,
        at: &Location,
        path: &str,
        lock: Option<&StateName>,
        change: Change,
        plan: WritePlan,
    ) -> Result<Written, WriteError> {
        let remote = self.remote(at)?;
        let started = Instant::now();
        // Every push of this write, on whichever ref: a retry after a lost answer looks for
        // them all (the state's ref may be gone by then, its writes carried onto the branch).
        let pushed = Sends::default();
        let Some(name) = lock else {
            return match self
                .queued(at, path, None, (change, plan), (started, &pushed))
                .await?
            {
                Routed::Written(written) => Ok(written),
                // (A write without a lock never waits for one.)
                Routed::ToRef | Routed::Wait(_) => Err(WriteError::Misrouted),
            };
        };
        // What the state's LOCK proved is about to be out of date.
        remote.forget_proof(&self.lock_ref(name));
        // A create goes to the branch; where a look under this lock already found no file and
        // no ref, the write does not ask the state's ref first (the branch round decides again
        // from its own advertisement, and sends an update found there to the ref).
        let mut to_ref = self.options.state_refs == StateRefs::Always
            && matches!(change, Change::Put(_))
            && !state::known_create(&remote, &self.lock_ref(name), path).await;
        for _ in 0..MAX_HOPS {
            match &change {
                Change::Put(bytes) if to_ref => {
                    match self
                        .write_to_ref(&remote, at, name, bytes, &plan, (started, &pushed))
                        .await?
                    {
                        Hop::Done(written) => return Ok(written),
                        Hop::Branch => to_ref = false,
                    }
                }
                _ => {
                    let write = (change.clone(), plan.clone());
                    match self
                        .queued(at, path, Some(name), write, (started, &pushed))
                        .await?
                    {
                        Routed::Written(written) => return Ok(written),
                        Routed::ToRef => to_ref = true,
                        Routed::Wait(wait) => crate::store::proof::wait_out(wait).await,
                    }
                }
            }
        }
        Err(WriteError::Contention { attempts: MAX_HOPS })
    }

    /// A write queued with the branch's waiting writes, and where it ended.
    async fn queued(
        &self,
        at: &Location,
        path: &str,
        lock: Option<&StateName>,
        (change, plan): (Change, WritePlan),
        (started, pushed): (Instant, &Sends),
    ) -> Result<Routed, WriteError> {
        let remote = self.remote(at)?;
        let (job, answer) = Job::new(path, lock, change, plan, started, pushed.clone());
        remote.batcher.push(job);
        if remote.batcher.claim() {
            let writer = Writer {
                remote: remote.clone(),
                at: at.clone(),
                lock_ref_prefix: self.options.lock_ref_prefix.clone(),
                state_refs: self.options.state_refs,
            };
            tokio::spawn(writer.lead());
        }
        answer.await.unwrap_or(Err(WriteError::Unanswered))
    }
}
