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

use std::collections::VecDeque;

use std::sync::PoisonError;
use std::sync::atomic::AtomicBool;

use tokio::sync::oneshot;

use super::write::{Lost, Outcome, Round, Verdict, Writer, backoff};
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

/// The writes of one branch waiting to be pushed, and whether a task is pushing them.
pub(super) struct Batcher {
    queue: Mutex<VecDeque<Job>>,
    leading: AtomicBool,
    /// Most writes in one push.
    most: usize,
}

impl Batcher {
    pub(super) fn new(most: usize) -> Self {
        Self {
            queue: Mutex::default(),
            leading: AtomicBool::new(false),
            most: most.max(1),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Job>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Become the task that pushes; `false` if one already is.
    fn claim(&self) -> bool {
        !self.leading.swap(true, Ordering::SeqCst)
    }

    /// Writes back to the front of the queue, in their order.
    fn hand_back(&self, jobs: Vec<Job>) {
        let mut queue = self.queue();
        for job in jobs.into_iter().rev() {
            queue.push_front(job);
        }
    }

    /// Move queued writes into `batch` while they fit (at most `most`): distinct,
    /// non-overlapping paths (so each write's tree check and read are the same on the tip as on
    /// the chain before it).
    fn top_up(&self, batch: &mut Vec<Job>, most: usize) {
        let mut queue = self.queue();
        // A caller that went away (a dropped request) gets no write pushed for it.
        queue.retain(|job| !job.reply.is_closed());
        let mut bytes: usize = batch.iter().map(Job::bytes).sum();
        let mut kept = VecDeque::with_capacity(queue.len());
        while let Some(job) = queue.pop_front() {
            let fits = batch.len() < most
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

/// Held by the pushing task: if it panics, the flag is released and the waiting writes are
/// answered (with an error) rather than left waiting.
struct Leading(Arc<Remote>);

impl Drop for Leading {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let batcher = &self.0.batcher;
            batcher.queue().clear();
            batcher.leading.store(false, Ordering::SeqCst);
        }
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
        let (reply, answer) = oneshot::channel();
        remote.batcher.queue().push_back(Job {
            path: path.to_owned(),
            lock: lock.cloned(),
            change,
            plan,
            floor: true,
            attempts: 0,
            started: Instant::now(),
            last_error: None,
            reply,
        });
        if remote.batcher.claim() {
            let writer = Writer {
                remote: remote.clone(),
                at: at.clone(),
                lock_ref_prefix: self.options.lock_ref_prefix.clone(),
            };
            tokio::spawn(writer.lead());
        }
        answer.await.unwrap_or_else(|_| {
            Err(StoreError::Internal(
                "the write task ended unanswered".into(),
            ))
        })
    }
}

/// Where the rounds of one pushing task stand.
#[derive(Default)]
struct Rounds {
    /// Consecutive rounds that lost a race or failed in a way worth a pause.
    lost: u32,
    last_round: Duration,
    /// The last round's push was refused.
    after_loss: Option<Lost>,
    /// One write per round until the queue is empty (see the module doc).
    solo: bool,
}

impl Writer {
    /// Push rounds of queued writes until the queue is empty.
    async fn lead(self) {
        let _leading = Leading(self.remote.clone());
        let batcher = &self.remote.batcher;
        let mut batch: Vec<Job> = Vec::new();
        let mut rounds = Rounds::default();
        loop {
            if rounds.lost > 0 {
                tokio::time::sleep(backoff(rounds.lost + 1, rounds.last_round)).await;
            }
            batch.retain(|job| !job.reply.is_closed());
            if rounds.solo && batch.len() > 1 {
                batcher.hand_back(batch.split_off(1));
            }
            batcher.top_up(&mut batch, if rounds.solo { 1 } else { batcher.most });
            if batch.is_empty() {
                // Let go, then look once more: a write queued just now saw the flag taken.
                batcher.leading.store(false, Ordering::SeqCst);
                if batcher.queue().is_empty() || !batcher.claim() {
                    return;
                }
                rounds = Rounds::default();
                continue;
            }
            let started = Instant::now();
            let round = Round {
                jobs: &batch,
                floor: batch.iter().all(|job| job.floor),
                after_loss: rounds.after_loss.is_some(),
            };
            // A round whose callers have all gone (their requests timed out, say on a hung
            // remote) is dropped where it stands, as their own requests would have been.
            let outcome = tokio::select! {
                outcome = self.write_round(round) => Some(outcome),
                () = callers_gone(&batch) => None,
            };
            rounds.last_round = started.elapsed();
            match outcome {
                Some(outcome) => settle(&mut batch, &mut rounds, outcome),
                None => {
                    tracing::debug!("every caller of a write round went away; dropping it");
                    batch.clear();
                }
            }
        }
    }
}

/// Answer the decided writes of a round and keep the rest.
fn settle(batch: &mut Vec<Job>, rounds: &mut Rounds, outcome: Result<Outcome, Error>) {
    let outcome = match outcome {
        Ok(outcome) => outcome,
        // A tip that moved between advertisement and fetch ("not our ref"), a remote that
        // hiccuped: every round starts from what the remote says now, and a push that did land
        // shows up as "unchanged", so trying again is safe.
        Err(error) if error.is_transient() => {
            tracing::debug!(error = %gitstate_core::report::chain(&error), writes = batch.len(), "write round failed, retrying");
            for job in batch.iter_mut() {
                job.attempts += 1;
                job.last_error = Some(error.echo());
            }
            drop_exhausted(batch);
            rounds.lost += 1;
            rounds.after_loss = None;
            return;
        }
        // Several writes: one of them may be the cause; each goes alone from now on.
        Err(error) if batch.len() > 1 => {
            tracing::debug!(error = %gitstate_core::report::chain(&error), writes = batch.len(), "write round failed; writing one at a time");
            for job in batch.iter_mut() {
                job.attempts += 1;
                job.last_error = Some(error.echo());
            }
            drop_exhausted(batch);
            rounds.solo = true;
            rounds.after_loss = None;
            return;
        }
        Err(error) => {
            // At most one write here.
            if let Some(job) = std::mem::take(batch).pop() {
                job.answer(Err(error.into()));
            }
            rounds.lost = 0;
            rounds.after_loss = None;
            return;
        }
    };
    // Refused twice on a tip that did not move: not a race, but the remote declining (a hook, a
    // size limit). Several writes go one at a time from now on; a lone one is answered.
    let mut declined = None;
    if let (Some(now), Some(before)) = (&outcome.lost, &rounds.after_loss)
        && now.on == before.on
    {
        if now.commits > 1 {
            tracing::debug!(
                "a push of several writes was refused twice on one tip; writing one at a time"
            );
            rounds.solo = true;
        } else {
            declined = Some(now.reason.clone());
        }
    }
    rounds.lost = if outcome.lost.is_some() {
        rounds.lost + 1
    } else {
        0
    };
    rounds.after_loss = outcome.lost;
    let mut kept = Vec::with_capacity(batch.len());
    for (mut job, verdict) in std::mem::take(batch).into_iter().zip(outcome.verdicts) {
        job.attempts += 1;
        match verdict {
            Verdict::Done(written) => job.answer(Ok(written)),
            Verdict::MissedFloor => {
                job.floor = false;
                kept.push(job);
            }
            Verdict::Lost if let Some(reason) = &declined => {
                job.answer(Err(Error::Remote(format!(
                    "the remote refused the push on an unchanged branch: {reason}"
                ))
                .into()));
            }
            Verdict::Lost => {
                job.floor = false;
                // It reached the remote: a transient failure before this one is no longer why.
                job.last_error = None;
                kept.push(job);
            }
        }
    }
    *batch = kept;
    drop_exhausted(batch);
}

/// Done when no caller of `batch` waits any more.
async fn callers_gone(batch: &[Job]) {
    while !batch.iter().all(|job| job.reply.is_closed()) {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn drop_exhausted(batch: &mut Vec<Job>) {
    let (done, kept): (Vec<Job>, Vec<Job>) =
        std::mem::take(batch).into_iter().partition(Job::exhausted);
    for job in done {
        job.give_up();
    }
    *batch = kept;
}

#[cfg(test)]
mod tests {
    use super::overlaps;

    /// Generated pairs of paths over segments that are string prefixes of one another (`a`,
    /// `ab`, `a.b`): two overlap exactly when one's segments begin the other's, never because one
    /// string merely begins the other.
    #[test]
    fn overlap_is_a_prefix_of_segments_never_of_strings() {
        use rand::{Rng, SeedableRng};
        const SEGMENTS: [&str; 5] = ["a", "ab", "a.b", "b", "a.tfstate"];
        let mut rng = rand::rngs::StdRng::seed_from_u64(15);
        let path = |rng: &mut rand::rngs::StdRng| {
            (0..rng.random_range(1..=3))
                .map(|_| SEGMENTS[rng.random_range(0..SEGMENTS.len())])
                .collect::<Vec<_>>()
        };
        let (mut seen_overlap, mut seen_string_prefix) = (0, 0);
        for _ in 0..5_000 {
            let (a, b) = (path(&mut rng), path(&mut rng));
            let (sa, sb) = (a.join("/"), b.join("/"));
            let expected = a.starts_with(&b) || b.starts_with(&a);
            assert_eq!(overlaps(&sa, &sb), expected, "{sa} and {sb}");
            seen_overlap += usize::from(expected);
            seen_string_prefix +=
                usize::from(!expected && (sa.starts_with(&sb) || sb.starts_with(&sa)));
        }
        assert!(
            seen_overlap > 100 && seen_string_prefix > 100,
            "{seen_overlap} {seen_string_prefix}"
        );
    }

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
