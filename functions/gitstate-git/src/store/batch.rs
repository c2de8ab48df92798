//! Group commit: writes to one branch that wait at the same time leave in one push.
//!
//! Every write is a compare-and-swap of the branch, so many writers of one branch land one push
//! at a time. Within one process, writes that arrive while another is on its way queue up; one
//! of their callers (the leader) takes all that do not touch the same or an overlapping path and
//! builds one commit per write, each on the one before (a chain on the tip, so every state's
//! history keeps its own author, message and trailers), then pushes the chain in one request.
//! Under a lock, the push also asserts every writer's lock ref unchanged (atomically), so a write
//! whose lock was broken meanwhile makes the whole push lose, and the next round refuses it
//! alone. A lone write is a batch of one: the same requests as without batching.
//!
//! The leader leads until its own write is decided, then hands what is still undecided back to
//! the queue for the next caller to lead. A leader whose caller goes away (a dropped request)
//! drops the writes it held; their callers queue them again, which is safe because a write that
//! did land reads back as unchanged. A write whose caller went away before it left is dropped.

use std::collections::VecDeque;

use tokio::sync::oneshot;

use super::write::{Round, Verdict, backoff};
use super::*;

/// Most bytes of new content in one push (a first write always goes, however large).
const MAX_BATCH_BYTES: usize = 16 << 20;

/// What a caller waits for.
type Reply = Result<Written, StoreError>;

/// One queued write and how far it got.
pub(super) struct Job {
    pub(super) path: String,
    /// The lock the write is made under, if any.
    pub(super) lock: Option<StateName>,
    pub(super) change: Change,
    pub(super) plan: WritePlan,
    /// May still be tried at the protocol floor (nothing refused there yet).
    pub(super) floor: bool,
    attempts: u32,
    started: Instant,
    last_error: Option<StoreError>,
    reply: oneshot::Sender<Reply>,
}

impl Job {
    fn bytes(&self) -> usize {
        match &self.change {
            Change::Put(bytes) => bytes.len(),
            Change::Delete => 0,
        }
    }

    fn answer(self, reply: Reply) {
        // A caller that went away does not need its answer.
        let _ = self.reply.send(reply);
    }

    /// Out of attempts or time: the last transient failure, or contention.
    fn exhausted(&self) -> bool {
        self.attempts >= MAX_WRITE_ATTEMPTS || self.started.elapsed() > WRITE_DEADLINE
    }

    fn give_up(mut self) {
        let reply = match self.last_error.take() {
            Some(error) => Err(error),
            None => Err(StoreError::Contention {
                attempts: self.attempts,
            }),
        };
        self.answer(reply);
    }
}

/// The writes of one branch waiting to be pushed, and who pushes them.
pub(super) struct Batcher {
    queue: Mutex<VecDeque<Job>>,
    leader: tokio::sync::Mutex<()>,
    /// Most writes in one push.
    most: usize,
}

impl Batcher {
    pub(super) fn new(most: usize) -> Self {
        Self {
            queue: Mutex::default(),
            leader: tokio::sync::Mutex::new(()),
            most: most.max(1),
        }
    }

    fn push_back(&self, job: Job) {
        if let Ok(mut queue) = self.queue.lock() {
            queue.push_back(job);
        }
    }

    /// Undecided writes back to the front of the queue, in their order.
    fn hand_back(&self, jobs: Vec<Job>) {
        if let Ok(mut queue) = self.queue.lock() {
            for job in jobs.into_iter().rev() {
                queue.push_front(job);
            }
        }
    }

    /// Move queued writes into `batch` while they fit: distinct, non-overlapping paths (so each
    /// write's tree check and read are the same on the tip as on the chain before it).
    fn top_up(&self, batch: &mut Vec<Job>) {
        let Ok(mut queue) = self.queue.lock() else {
            return;
        };
        // A caller that went away (a dropped request) gets no write pushed for it.
        queue.retain(|job| !job.reply.is_closed());
        let mut bytes: usize = batch.iter().map(Job::bytes).sum();
        let mut kept = VecDeque::with_capacity(queue.len());
        while let Some(job) = queue.pop_front() {
            let fits = batch.len() < self.most
                && (batch.is_empty() || bytes.saturating_add(job.bytes()) <= MAX_BATCH_BYTES)
                && !batch.iter().any(|other| overlaps(&other.path, &job.path));
            if fits {
                bytes = bytes.saturating_add(job.bytes());
                batch.push(job);
            } else {
                kept.push_back(job);
            }
        }
        *queue = kept;
    }
}

/// The same file, or one inside the other's folder.
fn overlaps(a: &str, b: &str) -> bool {
    let inside = |long: &str, short: &str| {
        long.strip_prefix(short)
            .is_some_and(|rest| rest.starts_with('/'))
    };
    a == b || inside(a, b) || inside(b, a)
}

impl GitStore {
    /// Write `path`, guarded by the lock of `lock` when given: queued with the branch's other
    /// waiting writes and pushed with them (see the module doc), retried on a moved branch.
    pub(super) async fn write_loop(
        &self,
        at: &Location,
        path: &str,
        lock: Option<&StateName>,
        change: Change,
        plan: WritePlan,
    ) -> Result<Written, StoreError> {
        let remote = self.remote(at)?;
        loop {
            let (reply, mut answer) = oneshot::channel();
            remote.batcher.push_back(Job {
                path: path.to_owned(),
                lock: lock.cloned(),
                change: change.clone(),
                plan: plan.clone(),
                floor: true,
                attempts: 0,
                started: Instant::now(),
                last_error: None,
                reply,
            });
            let answered = tokio::select! {
                answered = &mut answer => answered.ok(),
                _leading = remote.batcher.leader.lock() => self.lead(&remote, at, &mut answer).await,
            };
            match answered {
                Some(reply) => return reply,
                // The leader holding this write went away: queue it again.
                None => tracing::debug!("a write's leader went away; queueing it again"),
            }
        }
    }

    /// Push rounds of queued writes until `own` is answered; `None` when it was dropped.
    async fn lead(
        &self,
        remote: &Remote,
        at: &Location,
        own: &mut oneshot::Receiver<Reply>,
    ) -> Option<Reply> {
        let mut batch: Vec<Job> = Vec::new();
        let mut lost_rounds = 0;
        let mut last_round = Duration::ZERO;
        loop {
            match own.try_recv() {
                Ok(reply) => {
                    remote.batcher.hand_back(batch);
                    return Some(reply);
                }
                Err(oneshot::error::TryRecvError::Closed) => {
                    remote.batcher.hand_back(batch);
                    return None;
                }
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            if lost_rounds > 0 {
                tokio::time::sleep(backoff(lost_rounds + 1, last_round)).await;
            }
            remote.batcher.top_up(&mut batch);
            if batch.is_empty() {
                // Only a write that is neither queued nor answered: never expected, but not a
                // reason to spin.
                return None;
            }
            let floor = batch.iter().all(|job| job.floor);
            let started = Instant::now();
            let round = Round {
                jobs: &batch,
                floor,
                after_loss: lost_rounds > 0,
            };
            let outcome = self.write_round(remote, at, round).await;
            last_round = started.elapsed();
            lost_rounds = match self.settle(&mut batch, outcome) {
                true => lost_rounds + 1,
                false => 0,
            };
        }
    }

    /// Answer the decided writes of a round, keep the rest; `true` when the round lost a race
    /// (or failed in a way worth another try after a pause).
    fn settle(&self, batch: &mut Vec<Job>, outcome: Result<Vec<Verdict>, Error>) -> bool {
        let verdicts = match outcome {
            Ok(verdicts) => verdicts,
            // A tip that moved between advertisement and fetch ("not our ref"), a remote that
            // hiccuped: every round starts from what the remote says now, and a push that did
            // land shows up as "unchanged", so trying again is safe.
            Err(error) if error.is_transient() => {
                tracing::debug!(error = %gitstate_core::report::chain(&error), writes = batch.len(), "write round failed, retrying");
                for job in batch.iter_mut() {
                    job.attempts += 1;
                    job.last_error = Some(error.echo());
                }
                self.drop_exhausted(batch);
                return true;
            }
            Err(error) => {
                let mut jobs = std::mem::take(batch).into_iter();
                let first = jobs.next();
                for job in jobs {
                    job.answer(Err(error.echo()));
                }
                if let Some(first) = first {
                    first.answer(Err(error.into()));
                }
                return false;
            }
        };
        let mut lost = false;
        let mut kept = Vec::with_capacity(batch.len());
        for (mut job, verdict) in std::mem::take(batch).into_iter().zip(verdicts) {
            job.attempts += 1;
            match verdict {
                Verdict::Done(written) => job.answer(Ok(written)),
                Verdict::MissedFloor => {
                    job.floor = false;
                    kept.push(job);
                }
                Verdict::Lost => {
                    job.floor = false;
                    lost = true;
                    kept.push(job);
                }
            }
        }
        *batch = kept;
        self.drop_exhausted(batch);
        lost
    }

    fn drop_exhausted(&self, batch: &mut Vec<Job>) {
        let (done, kept): (Vec<Job>, Vec<Job>) =
            std::mem::take(batch).into_iter().partition(Job::exhausted);
        for job in done {
            job.give_up();
        }
        *batch = kept;
    }
}

#[cfg(test)]
mod tests {
    use super::overlaps;

    #[test]
    fn overlapping_paths_are_the_same_file_or_one_inside_the_other() {
        assert!(overlaps("a", "a"));
        assert!(overlaps("net/a", "net"));
        assert!(overlaps("net", "net/a/b"));
        assert!(!overlaps("net", "network/a"));
        assert!(!overlaps("net/a", "net/b"));
        assert!(!overlaps("a.tfstate", "a"));
    }
}
