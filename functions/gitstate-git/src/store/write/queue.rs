//! The writes of one branch waiting to be pushed: callers queue them, the pushing task takes
//! them in batches of writes that do not overlap.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use gitstate_core::StateName;
use gitstate_core::ports::{Change, WritePlan, Written};
use gitstate_core::refs::near_name;

use crate::store::WriteError;
use crate::sync::lock;

/// How often a write is rebuilt on a moved branch before giving up with a retryable 503.
pub(super) const MAX_WRITE_ATTEMPTS: u32 = 40;
/// How long a write may keep retrying, well under a Lambda timeout.
pub(super) const WRITE_DEADLINE: Duration = Duration::from_secs(20);
/// Most bytes of new content in one push (a first write always goes, however large).
const MAX_BATCH_BYTES: usize = 16 << 20;

/// Where one write stands: what the round it goes into reads, and what that round leaves it
/// at. A write starts at `Floor`; a round moves it to `Pushing` (its commit is in the round's
/// chain) and then to `Done` or `Fresh`, or straight to one of them.
pub(super) enum Stage {
    /// Nothing refused at the protocol floor yet: a round may start from what this process
    /// knows, without a fresh advertisement.
    Floor,
    /// Decide from a fresh advertisement: missed at the floor, or its push lost.
    Fresh,
    /// Its commit is in the round's chain: the push decides.
    Pushing(gix::ObjectId),
    /// Decided: the caller's answer.
    Done(Written),
    /// An update of a state whose home is its own ref: not for the branch.
    ToRef,
    /// Under a lock another process made, whose LOCK's proof may still answer reads for this
    /// long: the caller waits, then queues the write again (the branch's other writes go on).
    Wait(std::time::Duration),
}

/// Where a queued write ended: written (or refused, or unchanged), or handed back to go to the
/// state's own ref or to wait.
pub(super) enum Routed {
    Written(Written),
    ToRef,
    /// Queue it again after this long (see [`Stage::Wait`]).
    Wait(std::time::Duration),
}

/// What a caller waits for.
pub(super) type Reply = Result<Routed, WriteError>;

/// A push that carried one of a write's commits: it may have landed, whatever the caller heard
/// back (an answer lost on the way).
#[derive(Debug, Clone, Copy)]
pub(in crate::store) struct Sent {
    pub(in crate::store) commit: gix::ObjectId,
    /// The tip of the ref it went to when it left: the commit cannot sit below it.
    pub(in crate::store) base: Option<gix::ObjectId>,
    /// The branch tip known when it left: a fold or a delete that carried it onto the branch
    /// (a commit whose `State-commit` trailer names it) sits above it.
    pub(in crate::store) branch: Option<gix::ObjectId>,
}

/// Forget the last push of `commit` in `pushed`: the remote refused it with its report, so it
/// landed nothing. (An earlier push of the same commit, whose answer was lost, stays.)
pub(super) fn forget_refused(pushed: &Sends, commit: gix::ObjectId) {
    let mut pushed = lock(pushed);
    if let Some(last) = pushed.iter().rposition(|sent| sent.commit == commit) {
        pushed.remove(last);
    }
}

/// Every push of one write, wherever it went (its state's ref, then the branch, or back): one
/// record for all its hops.
pub(super) type Sends = std::sync::Arc<Mutex<Vec<Sent>>>;

/// One queued write and how far it got.
pub(super) struct Job {
    pub(super) path: String,
    /// The lock the write is made under, if any.
    pub(super) lock: Option<StateName>,
    pub(super) change: Change,
    pub(super) plan: WritePlan,
    /// Where the write stands: [`Stage::Floor`] or [`Stage::Fresh`] while queued.
    pub(super) stage: Stage,
    pub(super) attempts: u32,
    pub(super) started: Instant,
    /// The last transient failure, the answer if the write runs out of attempts.
    pub(super) last_error: Option<WriteError>,
    /// The pushes that carried this write's commits, on the branch and on its state's ref.
    pub(super) pushed: Sends,
    reply: oneshot::Sender<Reply>,
}

impl Job {
    /// A write of `change` at `path`, and where its caller waits for the answer.
    pub(super) fn new(
        path: &str,
        lock: Option<&StateName>,
        change: Change,
        plan: WritePlan,
        started: Instant,
        pushed: Sends,
    ) -> (Self, oneshot::Receiver<Reply>) {
        let (reply, answer) = oneshot::channel();
        let job = Self {
            path: path.to_owned(),
            lock: lock.cloned(),
            change,
            plan,
            stage: Stage::Floor,
            attempts: 0,
            started,
            last_error: None,
            pushed,
            reply,
        };
        (job, answer)
    }

    /// The caller went away (its request was dropped).
    pub(super) fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }

    fn bytes(&self) -> usize {
        match &self.change {
            Change::Put(bytes) => bytes.len(),
            Change::Delete => 0,
        }
    }

    pub(super) fn answer(self, reply: Reply) {
        // A caller that went away does not need its answer.
        let _ = self.reply.send(reply);
    }

    /// Out of attempts or time: the last transient failure, or contention.
    pub(super) fn exhausted(&self) -> bool {
        self.attempts >= MAX_WRITE_ATTEMPTS || self.started.elapsed() > WRITE_DEADLINE
    }

    pub(super) fn give_up(mut self) {
        let error = self.last_error.take().unwrap_or(WriteError::Contention {
            attempts: self.attempts,
        });
        self.answer(Err(error));
    }
}

/// The writes of one branch waiting to be pushed, and whether a task is pushing them.
pub(in crate::store) struct Batcher {
    /// One lock for both, so that the pushing task lets go exactly when the queue is empty.
    queue: Mutex<Queue>,
    /// Most writes in one push.
    pub(super) most: usize,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// A task is pushing the queued writes.
    leading: bool,
}

impl Batcher {
    pub(in crate::store) fn new(most: usize) -> Self {
        Self {
            queue: Mutex::default(),
            most: most.max(1),
        }
    }

    /// Queue `job`.
    pub(super) fn push(&self, job: Job) {
        lock(&self.queue).jobs.push_back(job);
    }

    /// Become the task that pushes; `false` if one already is.
    pub(super) fn claim(&self) -> bool {
        let mut queue = lock(&self.queue);
        !std::mem::replace(&mut queue.leading, true)
    }

    /// Stop being the task that pushes if no write waits (`true`); else go on leading.
    pub(super) fn release_if_empty(&self) -> bool {
        let mut queue = lock(&self.queue);
        if queue.jobs.is_empty() {
            queue.leading = false;
        }
        !queue.leading
    }

    /// The pushing task failed: drop every waiting write (its caller gets an error) and let go.
    pub(super) fn abandon(&self) {
        let mut queue = lock(&self.queue);
        queue.jobs.clear();
        queue.leading = false;
    }

    /// Writes back to the front of the queue, in their order.
    pub(super) fn hand_back(&self, jobs: Vec<Job>) {
        let queue = &mut lock(&self.queue).jobs;
        for job in jobs.into_iter().rev() {
            queue.push_front(job);
        }
    }

    /// Move queued writes into `batch` while they fit (at most `most`): distinct,
    /// non-overlapping paths (so each write's tree check and read are the same on the tip as on
    /// the chain before it).
    pub(super) fn top_up(&self, batch: &mut Vec<Job>, most: usize) {
        let queue = &mut lock(&self.queue).jobs;
        // A caller that went away (a dropped request) gets no write pushed for it.
        queue.retain(|job| !job.abandoned());
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

/// The same file, one inside the other's folder, or near names of each other (see
/// [`near_name`]): the tree rule refuses the second of such writes, so checked against one tip
/// together both would pass it.
fn overlaps(a: &str, b: &str) -> bool {
    let inside = |long: &str, short: &str| {
        long.strip_prefix(short)
            .is_some_and(|rest| rest.starts_with('/'))
    };
    a == b || inside(a, b) || inside(b, a) || near_name(a, b)
}

#[cfg(test)]
mod tests {
    use super::overlaps;
    use gitstate_core::refs::near_name;

    /// Generated pairs of paths over segments that are string prefixes of one another (`a`,
    /// `ab`, `a.b`): two overlap exactly when one's segments begin the other's or they are near
    /// names (`a` and `a.tfstate`), never because one string merely begins the other.
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
            let expected = a.starts_with(&b) || b.starts_with(&a) || near_name(&sa, &sb);
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
    fn overlapping_paths_are_the_same_file_one_inside_the_other_or_near_names() {
        assert!(overlaps("a", "a"));
        assert!(overlaps("net/a", "net"));
        assert!(overlaps("net", "net/a/b"));
        assert!(!overlaps("net", "network/a"));
        assert!(!overlaps("net/a", "net/b"));
        assert!(overlaps("net/a.tfstate", "net/a"));
        assert!(overlaps("Net/A.json", "net/a.tfstate"));
        assert!(!overlaps("a.tfstate", "ab"));
        assert!(!overlaps("net/a.tfstate", "network/a"));
    }
}
