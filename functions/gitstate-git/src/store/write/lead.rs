//! The pushing task of one branch: rounds of queued writes until the queue is empty, and what
//! each round's end means for its writes and for the next round.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::store::RemoteError;
use crate::store::WriteError;

use super::queue::{Job, Routed, Stage};
use super::round::{Lost, Outcome, Round, Writer};
use crate::store::remote::Remote;

/// Held by the pushing task: if it panics, the flag is released and the waiting writes are
/// answered (with an error) rather than left waiting.
struct Leading(Arc<Remote>);

impl Drop for Leading {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.batcher.abandon();
        }
    }
}

/// Where the pushing task stands between rounds: all a round leaves to the next.
struct Standing {
    /// Rounds in a row that lost a race or failed in a way worth a pause; the pause grows with it.
    losses: u32,
    /// How long the last round took; the pause scales with it.
    last_round: Duration,
    /// The last round's push was refused: the next fetches what changed since, and a second
    /// refusal on the same tip is the remote declining, not a race.
    refused: Option<Lost>,
    /// Most writes in the next round: the batcher's most, or one at a time (until the queue is
    /// empty) once several failed together for good or were declined together.
    width: usize,
}

impl Standing {
    fn new(width: usize) -> Self {
        Self {
            losses: 0,
            last_round: Duration::ZERO,
            refused: None,
            width,
        }
    }

    /// The pause before the next round.
    fn pause(&self) -> Option<Duration> {
        (self.losses > 0).then(|| backoff(self.losses + 1, self.last_round))
    }
}

impl Writer {
    /// Push rounds of queued writes until the queue is empty.
    pub(super) async fn lead(self) {
        let _leading = Leading(self.remote.clone());
        let batcher = &self.remote.batcher;
        let mut batch: Vec<Job> = Vec::new();
        let mut standing = Standing::new(batcher.most);
        loop {
            if let Some(pause) = standing.pause() {
                tokio::time::sleep(pause).await;
            }
            batch.retain(|job| !job.abandoned());
            if batch.len() > standing.width {
                batcher.hand_back(batch.split_off(standing.width));
            }
            batcher.top_up(&mut batch, standing.width);
            if batch.is_empty() {
                // Let go only with nothing queued, in one step: a write queued after this finds
                // nobody leading and leads.
                if batcher.release_if_empty() {
                    return;
                }
                standing = Standing::new(batcher.most);
                continue;
            }
            let started = Instant::now();
            let round = Round {
                jobs: &batch,
                floor: batch.iter().all(|job| matches!(job.stage, Stage::Floor)),
                after_loss: standing.refused.is_some(),
            };
            // A round whose callers have all gone (their requests timed out, say on a hung
            // remote) is dropped where it stands, as their own requests would have been.
            let outcome = tokio::select! {
                outcome = self.write_round(round) => Some(outcome),
                () = callers_gone(&batch) => None,
            };
            standing.last_round = started.elapsed();
            match outcome {
                Some(Ok(outcome)) => settle(&mut batch, &mut standing, outcome),
                Some(Err(error)) => settle_failure(&mut batch, &mut standing, error),
                None => {
                    tracing::debug!("every caller of a write round went away; dropping it");
                    batch.clear();
                }
            }
        }
    }
}

/// A round that failed before its push had a verdict.
fn settle_failure(batch: &mut Vec<Job>, standing: &mut Standing, error: RemoteError) {
    standing.refused = None;
    // A tip that moved between advertisement and fetch ("not our ref"), a remote that hiccuped:
    // every round starts from what the remote says now, and a push that did land shows up as
    // "unchanged", so trying again is safe. Several writes failing for good: one of them may be
    // the cause; each goes alone from now on.
    let transient = error.is_transient();
    if !transient && batch.len() <= 1 {
        if let Some(job) = std::mem::take(batch).pop() {
            job.answer(Err(WriteError::from(error)));
        }
        standing.losses = 0;
        return;
    }
    if transient {
        tracing::debug!(error = %gitstate_core::report::chain(&error), writes = batch.len(), "write round failed, retrying");
        standing.losses += 1;
    } else {
        tracing::debug!(error = %gitstate_core::report::chain(&error), writes = batch.len(), "write round failed; writing one at a time");
        standing.width = 1;
    }
    let error = WriteError::from(error);
    for job in batch.iter_mut() {
        job.attempts += 1;
        job.last_error = Some(error.clone());
    }
    drop_exhausted(batch);
}

/// Answer the decided writes of a round and keep the rest.
fn settle(batch: &mut Vec<Job>, standing: &mut Standing, outcome: Outcome) {
    let declined = declined(standing, outcome.lost.as_ref());
    // A write not done lost the round's push when it has a `Lost`, else it missed the floor.
    let lost = outcome.lost.is_some();
    standing.losses = if lost { standing.losses + 1 } else { 0 };
    standing.refused = outcome.lost;
    let mut kept = Vec::with_capacity(batch.len());
    for (mut job, stage) in std::mem::take(batch).into_iter().zip(outcome.stages) {
        job.attempts += 1;
        match stage {
            Stage::Done(written) => job.answer(Ok(Routed::Written(written))),
            Stage::ToRef => job.answer(Ok(Routed::ToRef)),
            Stage::Wait(wait) => job.answer(Ok(Routed::Wait(wait))),
            _ if let Some(reason) = &declined => {
                job.answer(Err(WriteError::Declined(reason.clone())));
            }
            Stage::Floor | Stage::Fresh | Stage::Pushing(_) => {
                if lost {
                    // It reached the remote: a transient failure before this one is no longer
                    // why.
                    job.last_error = None;
                }
                job.stage = Stage::Fresh;
                kept.push(job);
            }
        }
    }
    *batch = kept;
    drop_exhausted(batch);
}

/// Refused twice on a tip that did not move: not a race, but the remote declining (a hook, a
/// size limit). Several writes go one at a time from now on; a lone one is answered with the
/// remote's reason (returned).
fn declined(standing: &mut Standing, now: Option<&Lost>) -> Option<String> {
    let (now, before) = (now?, standing.refused.as_ref()?);
    if now.on != before.on || now.state_tips != before.state_tips {
        return None;
    }
    if now.commits > 1 {
        tracing::debug!(
            "a push of several writes was refused twice on one tip; writing one at a time"
        );
        standing.width = 1;
        return None;
    }
    Some(now.reason.clone())
}

/// Done when no caller of `batch` waits any more.
async fn callers_gone(batch: &[Job]) {
    while !batch.iter().all(Job::abandoned) {
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

/// How long to wait before write attempt `attempt` (2, 3, …) after one that took `last`: full
/// jitter over a window that starts at half an attempt's duration and doubles with each loss.
/// Scaling with the attempt (rather than a fixed 10 ms base) spreads contenders by about the time
/// a winner needs from advertisement to push, whatever the remote's round trip (BENCHMARKS.md
/// compares it with the fixed 10 ms base it replaced).
pub(in crate::store) fn backoff(attempt: u32, last: Duration) -> Duration {
    let base = (last / 2).clamp(Duration::from_millis(10), Duration::from_millis(250));
    let window = base.saturating_mul(1 << attempt.saturating_sub(2).min(5));
    let millis = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
    Duration::from_millis(rand::random_range(0..millis))
}
