//! One round of a batch of writes: where it starts (the protocol floor or a fresh
//! advertisement), each write's check and plan, the chain of commits on the tip, and its push
//! with compare-and-swap.

use std::sync::Arc;
use std::time::Instant;

use gix::ObjectId;

use gitstate_core::StateName;
use gitstate_core::ports::{Change, Location, Refusal, Written};

use super::plan::{Planned, plan_one, written_id};
use super::push::{ChainEnd, Pushing, RefCommands, push_chain};
use super::queue::{Job, Sent, Stage, forget_refused};
use crate::protocol::Command;
use crate::protocol::{Advert, Service};
use crate::repository::NewCommit;
use crate::settings::StateRefs;
use crate::store::RemoteError;
use crate::store::fold::replay_one;
use crate::store::known::{Home, Seen};
use crate::store::remote::Remote;
use crate::store::{WriteMode, null};
use crate::sync::lock;

/// What the rounds of one branch's writes need, owned, so that they run in a task of their own.
pub(super) struct Writer {
    pub(super) remote: Arc<Remote>,
    pub(super) at: Location,
    pub(super) lock_ref_prefix: String,
    pub(super) state_refs: StateRefs,
}

impl Writer {
    fn lock_ref(&self, name: &StateName) -> String {
        format!("{}{}", self.lock_ref_prefix, name)
    }

    /// Where a round starts: at the floor when it can, else from a fresh receive-pack
    /// advertisement of the branch, the writers' lock refs and their states' own refs.
    async fn start(
        &self,
        jobs: &[Job],
        lock_refs: &[Option<String>],
        floor: bool,
    ) -> Result<Start, RemoteError> {
        let (remote, at) = (&*self.remote, &self.at);
        let always = self.state_refs == StateRefs::Always;
        if floor && let Some(start) = floor_start(remote, jobs, lock_refs, always)? {
            return Ok(start);
        }
        let branch = at.branch.full_ref();
        let state_refs: Vec<Option<String>> = jobs
            .iter()
            .map(|job| job.lock.as_ref().map(|_| remote.state_ref(&job.path)))
            .collect();
        let asked = Instant::now();
        let advert = remote
            .refs(
                Service::ReceivePack,
                std::iter::once(branch.clone())
                    .chain(lock_refs.iter().flatten().cloned())
                    .chain(state_refs.iter().flatten().cloned())
                    .collect(),
            )
            .await?;
        let homes = state_refs
            .iter()
            .map(|name| {
                let home = advert.tip(name.as_ref()?).map_or(Home::Absent, Home::At);
                Some((home, asked))
            })
            .collect();
        Ok(Start {
            tip: advert.tip(&branch),
            lock_tips: lock_refs
                .iter()
                .map(|r| r.as_ref().and_then(|r| advert.tip(r)))
                .collect(),
            mode: WriteMode::of(&advert),
            advert: Some(advert),
            homes,
        })
    }

    /// One round of a batch of writes (distinct, non-overlapping paths): each write's check and
    /// plan against the tip, one commit per write that changes something, chained on the tip,
    /// and one push of the chain. Where each job stands after it, in order: `Done` or `Fresh`.
    pub(super) async fn write_round(&self, round: Round<'_>) -> Result<Outcome, RemoteError> {
        let jobs = round.jobs;
        let lock_refs: Vec<Option<String>> = jobs
            .iter()
            .map(|job| job.lock.as_ref().map(|name| self.lock_ref(name)))
            .collect();
        let start = self.start(jobs, &lock_refs, round.floor).await?;
        self.fetch_for(&round, &start).await?;
        let tip = start.tip;
        // No branch, in a process that saw it: deleted or renamed outside gitstate. A commit
        // would start a new branch without the other states.
        if tip.is_none() && self.remote.branch_lost(&self.lock_ref_prefix).await? {
            return Ok(Outcome::decided(
                jobs.iter()
                    .map(|_| Stage::Done(Written::Refused(Refusal::Diverged)))
                    .collect(),
            ));
        }
        if let Some(tip) = tip {
            self.remote.not_a_copy(tip, start.advert.as_ref()).await?;
        }
        // A new branch git cannot create next to an existing one (`env/a/b` while `env/a`
        // exists): refuse it now rather than push. A clashing branch created by someone else
        // after this look makes the push fail, and the next round refuses it here.
        if tip.is_none()
            && let Some(advert) = &start.advert
            && let Some(clash) = self.remote.branch_clash(advert, &self.at.branch).await?
        {
            return Ok(Outcome::decided(
                jobs.iter()
                    .map(|_| Stage::Done(Written::Refused(Refusal::Clash(clash.clone()))))
                    .collect(),
            ));
        }
        let (mut stages, chain) = self.plan_all(jobs, &start).await?;
        let Some(head) = chain
            .head
            .filter(|head| !chain.commits.is_empty() || Some(*head) != tip)
        else {
            // The branch stays; a ref a delete removes first (without `atomic`) goes alone.
            let refs = RefCommands::of(&chain.refs, start.mode);
            let left = refs.remove_alone(&self.remote).await;
            self.note_homes(jobs, &start, &stages, tip.unwrap_or_else(null), &left);
            return Ok(Outcome::decided(stages));
        };
        let commit_count = chain.commits.len();
        let mut commands = self.commands(&start, head, &stages, lock_refs);
        let refs = RefCommands::of(&chain.refs, start.mode);
        commands.extend(refs.with.iter().cloned());
        let objects = chain.objects;
        let pushing = Pushing {
            tip: start.tip,
            floor: start.advert.is_none(),
            head,
            commands,
            objects,
            refs,
        };
        let ChainEnd { lost, left, .. } =
            push_recorded(&self.remote, jobs, pushing, &mut stages).await?;
        let lost = lost.map(|reason| Lost {
            on: tip,
            state_tips: start
                .homes
                .iter()
                .map(|home| match home {
                    Some((Home::At(state_tip), _)) => Some(*state_tip),
                    _ => None,
                })
                .collect(),
            commits: commit_count,
            reason,
        });
        self.note_homes(jobs, &start, &stages, head, &left);
        for (stage, job) in stages.iter_mut().zip(jobs) {
            if let Stage::Done(Written::Committed { content, .. }) = stage {
                *content = written_id(job);
            }
        }
        Ok(Outcome { stages, lost })
    }

    /// Bring into the cache what the round reads: the tip's trees (and, right after a lost race,
    /// what changed since), the writers' lock commits, the blobs of the written states and of
    /// the index.
    async fn fetch_for(&self, round: &Round<'_>, start: &Start) -> Result<(), RemoteError> {
        let remote = &*self.remote;
        let tip = start.tip;
        let wants: Vec<ObjectId> = tip
            .into_iter()
            .chain(start.lock_tips.iter().flatten().copied())
            .collect();
        if round.after_loss && start.advert.is_some() {
            // Right after a lost race the cache holds a tip a few commits old: what changed
            // since (the index among it) comes in the same request as the trees. If that fails
            // (say it is more than a git answer may hold), the trees alone.
            if let Err(error) = remote.ensure_changes(wants.clone()).await {
                tracing::debug!(error = %gitstate_core::report::chain(&error), "fetching the changes failed; fetching trees");
                remote.ensure(wants).await?;
            }
        } else {
            remote.ensure(wants).await?;
        }
        if let (Some(tip), Some(_)) = (tip, &start.advert) {
            remote.saw_tip(tip);
        }
        let state_tips: Vec<ObjectId> = start
            .homes
            .iter()
            .filter_map(|home| match home {
                Some((Home::At(state_tip), _)) => Some(*state_tip),
                _ => None,
            })
            .collect();
        remote.ensure_state(state_tips).await?;
        if let Some(tip) = tip {
            // The states and the index the commits update, in one fetch if missing.
            let paths = round
                .jobs
                .iter()
                .map(|job| job.path.clone())
                .chain(std::iter::once(gitstate_core::index::INDEX_PATH.to_owned()))
                .collect();
            remote.want_blobs(tip, paths).await?;
        }
        Ok(())
    }

    /// Where each write stands against the round's start (`Done`, `Fresh`, or `Pushing` its
    /// commit), and the chain of those commits.
    async fn plan_all(
        &self,
        jobs: &[Job],
        start: &Start,
    ) -> Result<(Vec<Stage>, Chain), RemoteError> {
        let remote = &*self.remote;
        // Without atomic push no state ref is created (`always` is `never` there): a delete could
        // not remove a ref and the branch's file as one.
        let always = self.state_refs == StateRefs::Always && start.mode == WriteMode::Atomic;
        let mut stages = Vec::with_capacity(jobs.len());
        let mut chain = Chain::on(start.tip);
        for ((job, lock_tip), home) in jobs.iter().zip(&start.lock_tips).zip(&start.homes) {
            let home = home.map(|(home, _)| home);
            let planned = plan_one(remote, start.tip, job, *lock_tip, home, always).await?;
            let stage = match planned {
                // At the floor only a push rests on what this process remembers: a refusal or
                // an "unchanged" is decided again from the remote.
                Planned::Decided(_) if start.advert.is_none() => Stage::Fresh,
                Planned::Decided(written) => Stage::Done(written),
                Planned::ToRef => Stage::ToRef,
                Planned::Wait(wait) => Stage::Wait(wait),
                // A delete carries the state's unfolded writes from what the record at the tip
                // says was folded: at the floor that tip may be older than the state's ref, so
                // it is decided from a fresh advertisement.
                Planned::Commit(None, _)
                    if start.advert.is_none() && matches!(home, Some(Home::At(_))) =>
                {
                    Stage::Fresh
                }
                Planned::Commit(content, meta) => {
                    let state_tip = match home {
                        Some(Home::At(state_tip)) => Some(state_tip),
                        _ => None,
                    };
                    let deleting = content.is_none();
                    if let (true, Some(state_tip), Some(tip)) = (deleting, state_tip, start.tip)
                        && !self.carry(&mut chain, tip, state_tip, &job.path).await?
                    {
                        // A delete first carries the state's unfolded writes, as a fold would;
                        // one that cannot (see `carry`) is refused alone.
                        stages.push(Stage::Done(Written::Refused(Refusal::Diverged)));
                        continue;
                    }
                    let remove_ref = |state_tip| Command {
                        old: state_tip,
                        new: null(),
                        name: remote.state_ref(&job.path),
                    };
                    if let (true, Some(state_tip), WriteMode::BranchOnly) =
                        (deleting, state_tip, start.mode)
                    {
                        // Without atomic push the ref's removal is the delete's point of
                        // decision: a write of the next holder that landed on the ref since this
                        // round's look makes it fail. So the branch takes the carried writes
                        // first, the ref is removed by compare-and-swap once it has them, and the
                        // file goes in a later round, decided again from a fresh look (the lock
                        // included).
                        chain.refs.push((remove_ref(state_tip), false));
                        stages.push(Stage::Fresh);
                        continue;
                    }
                    let commit = remote
                        .commit(chain.head, job.path.clone(), content, meta)
                        .await?;
                    let id = commit.id;
                    chain.add(commit);
                    if let Some(state_tip) = state_tip {
                        // A delete's ref goes with it; so does a ref a delete left behind, which
                        // a create must not leave to hide the new state.
                        chain.refs.push((remove_ref(state_tip), !deleting));
                    }
                    Stage::Pushing(id)
                }
            };
            stages.push(stage);
        }
        Ok((stages, chain))
    }

    /// The unfolded writes of the state at `path` (its ref at `state_tip`), replayed onto the
    /// chain as a fold would replay them. `false`: its file on the branch is not what the ref's
    /// writes were made on (changed outside gitstate; a fold refuses it too), and the chain is
    /// unchanged.
    async fn carry(
        &self,
        chain: &mut Chain,
        tip: ObjectId,
        state_tip: ObjectId,
        path: &str,
    ) -> Result<bool, RemoteError> {
        let remote = &*self.remote;
        let head = chain.head.unwrap_or(tip);
        let name = remote.state_ref(path);
        let Some(carried) = replay_one(remote, tip, head, name, state_tip, path).await? else {
            return Ok(false);
        };
        if carried.head != head {
            chain.head = Some(carried.head);
            for id in carried.objects {
                if !chain.objects.contains(&id) {
                    chain.objects.push(id);
                }
            }
        }
        Ok(true)
    }

    /// What this process knows of each state's home after the round: a push that landed left
    /// the state on the branch (any ref of it removed); one that did not proves nothing.
    fn note_homes(
        &self,
        jobs: &[Job],
        start: &Start,
        stages: &[Stage],
        head: ObjectId,
        left: &[String],
    ) {
        let mut looks = lock(&self.remote.looks);
        for ((job, stage), home) in jobs.iter().zip(stages).zip(&start.homes) {
            let Some((_, at)) = home else {
                continue;
            };
            let name = self.remote.state_ref(&job.path);
            match stage {
                // A ref a delete could not remove (without atomic push): left over.
                _ if left.contains(&name) => looks.unknown(&name, head),
                Stage::Done(Written::Committed { .. }) => {
                    let seen = Seen {
                        branch: head,
                        home: Home::Absent,
                        at: *at,
                    };
                    looks.landed(&name, seen);
                }
                Stage::Fresh => looks.unknown(&name, head),
                _ => {}
            }
        }
    }

    /// The push of a round: the branch from its tip to `head`, and, when the remote pushes
    /// atomically, every lock ref a write rests on, unchanged.
    fn commands(
        &self,
        start: &Start,
        head: ObjectId,
        stages: &[Stage],
        lock_refs: Vec<Option<String>>,
    ) -> Vec<Command> {
        let mut commands = vec![Command {
            old: start.tip.unwrap_or_else(null),
            new: head,
            name: self.at.branch.full_ref(),
        }];
        if start.mode == WriteMode::Atomic {
            for ((stage, lock_tip), lock_ref) in stages.iter().zip(&start.lock_tips).zip(lock_refs)
            {
                if let (Stage::Pushing(_), Some(lock_tip), Some(lock_ref)) =
                    (stage, lock_tip, lock_ref)
                {
                    // The plan accepted the lock as it is: the write lands only if it still is.
                    commands.push(Command {
                        old: *lock_tip,
                        new: *lock_tip,
                        name: lock_ref,
                    });
                }
            }
        }
        commands
    }
}

/// A batch of writes, once.
pub(super) struct Round<'a> {
    pub(super) jobs: &'a [Job],
    /// Try at the protocol floor (no fresh advertisement): every job is at [`Stage::Floor`].
    pub(super) floor: bool,
    /// The round before lost a race: the tip moved on a little.
    pub(super) after_loss: bool,
}

/// How a round ended.
pub(super) struct Outcome {
    /// One per job, in order: [`Stage::Done`], or [`Stage::Fresh`] (missed at the floor, or its
    /// push lost: `lost` tells which).
    pub(super) stages: Vec<Stage>,
    /// The remote refused the round's push (not at the floor).
    pub(super) lost: Option<Lost>,
}

impl Outcome {
    fn decided(stages: Vec<Stage>) -> Self {
        Self { stages, lost: None }
    }
}

/// A push the remote refused.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Lost {
    /// The tip it was built on.
    pub(super) on: Option<ObjectId>,
    /// The tips of the writes' state refs it named (a push that removes one loses when the
    /// ref moved, though the branch did not).
    pub(super) state_tips: Vec<Option<ObjectId>>,
    /// How many commits it carried.
    pub(super) commits: usize,
    /// What the remote said of the first ref it refused.
    pub(super) reason: String,
}

/// Commits built one on another on the round's tip.
struct Chain {
    head: Option<ObjectId>,
    commits: Vec<ObjectId>,
    /// What the remote lacks for all of them.
    objects: Vec<ObjectId>,
    /// State refs the push removes, each with whether it must go before the branch moves (a
    /// ref left over by a delete, which the new state's create replaces) or after (a deleted
    /// state's own ref).
    refs: Vec<(Command, bool)>,
}

impl Chain {
    fn on(tip: Option<ObjectId>) -> Self {
        Self {
            head: tip,
            commits: Vec::new(),
            objects: Vec::new(),
            refs: Vec::new(),
        }
    }

    fn add(&mut self, commit: NewCommit) {
        self.head = Some(commit.id);
        self.commits.push(commit.id);
        for id in commit.objects {
            if !self.objects.contains(&id) {
                self.objects.push(id);
            }
        }
    }
}

/// Where a round starts.
struct Start {
    tip: Option<ObjectId>,
    /// Per job, the lock commit the write rests on, when it writes under a lock that exists.
    lock_tips: Vec<Option<ObjectId>>,
    mode: WriteMode,
    /// The advertisement it came from; `None` at the floor.
    advert: Option<Advert>,
    /// Per job writing a state, where its newest content is and when that was looked at.
    homes: Vec<Option<(Home, Instant)>>,
}

/// A round at the floor: on the tip this process last saw and, under locks, the lock commits it
/// made, when the remote pushes atomically (without `atomic` a lock is only checked as of an
/// advertisement, so a write under a lock takes a fresh one), and each state's home as a look
/// under that lock found it (see `known::Seen`). `None`: advertise.
fn floor_start(
    remote: &Remote,
    jobs: &[Job],
    lock_refs: &[Option<String>],
    always: bool,
) -> Result<Option<Start>, RemoteError> {
    let Some(caps) = remote.floor_caps() else {
        return Ok(None);
    };
    let Some(tip) = remote.cached_tip()? else {
        return Ok(None);
    };
    let mode = WriteMode::of(&caps);
    let mut lock_tips = Vec::with_capacity(lock_refs.len());
    let mut homes = Vec::with_capacity(lock_refs.len());
    for (lock_ref, job) in lock_refs.iter().zip(jobs) {
        let (lock_tip, home) = match lock_ref {
            None => (None, None),
            Some(_) if mode != WriteMode::Atomic => return Ok(None),
            Some(lock_ref) => {
                let Some((commit, made)) = remote.made_lock_at(lock_ref) else {
                    return Ok(None);
                };
                // A ref's tip is checked by the push (compare-and-swap); its absence cannot be
                // (see `usable_at_floor`).
                let look = remote.look_since(&remote.state_ref(&job.path), made);
                // A create on the very tip the look saw (see `usable_at_floor`).
                let creates = look.is_some_and(|seen| seen.branch == tip)
                    && !matches!(job.change, Change::Delete)
                    && !remote.cache.has_file(tip, &job.path)?;
                match look {
                    Some(seen) if usable_at_floor(seen.home, always, creates) => {
                        (Some(commit), Some((seen.home, seen.at)))
                    }
                    _ => return Ok(None),
                }
            }
        };
        lock_tips.push(lock_tip);
        homes.push(home);
    }
    Ok(Some(Start {
        tip: Some(tip),
        lock_tips,
        mode,
        advert: None,
        homes,
    }))
}

/// Whether a look under this process's lock at a state's home may carry a write at the floor.
///
/// A lock is a Terraform run's, not a process's: the run's other requests may reach other
/// processes, and what they write there this process does not see. A known ref tip is safe
/// whatever happened since, as every push names it as the old id (a ref moved or removed
/// refuses the push). "No ref" is safe only where no process behind this one creates refs
/// (`auto`, `never`: every process serving one Terraform run has the same setting); with
/// `always` another process of the run may have created the ref since, so an update
/// advertises. A create may rest on it whatever the setting (`creates`: the look saw the very
/// tip the write starts on, which lacks the file): a state ref is only made for a state the
/// branch has, so none can be made without the branch moving first (the file's create, or a
/// break-glass delete that leaves a ref behind), which the push's compare-and-swap refuses.
fn usable_at_floor(home: Home, always: bool, creates: bool) -> bool {
    match home {
        Home::At(_) => true,
        Home::Absent => !always || creates,
        Home::Unknown => false,
    }
}

/// Push a round's chain (see [`push_chain`]), each write's commit in it recorded first in the
/// write's record of pushes (from here it may land, whatever the round hears back) and struck
/// from it again when the remote's report refused the chain (a commit like it found on the
/// branch later is another request's: the same change, parent and second).
async fn push_recorded(
    remote: &Remote,
    jobs: &[Job],
    pushing: Pushing,
    stages: &mut [Stage],
) -> Result<ChainEnd, RemoteError> {
    let tip = pushing.tip;
    let mut carried = Vec::new();
    for (stage, job) in stages.iter().zip(jobs) {
        if let Stage::Pushing(commit) = stage {
            lock(&job.pushed).push(Sent {
                commit: *commit,
                base: tip,
                branch: tip,
            });
            carried.push((job, *commit));
        }
    }
    let end = push_chain(remote, pushing, stages).await?;
    if end.refused {
        for (job, commit) in carried {
            forget_refused(&job.pushed, commit);
        }
    }
    Ok(end)
}
