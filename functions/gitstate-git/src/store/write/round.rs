//! One round of a batch of writes: where it starts (the protocol floor or a fresh
//! advertisement), each write's check and plan, the chain of commits on the tip, and its push
//! with compare-and-swap.

use std::sync::Arc;

use bytes::Bytes;
use gix::ObjectId;

use gitstate_core::StateName;
use gitstate_core::ports::{Change, CommitMeta, Location, Refusal, Stored, Written};

use super::queue::{Job, Stage};
use crate::protocol::Command;
use crate::protocol::{Advert, Service, Updates};
use crate::repository::NewCommit;
use crate::store::RemoteError as Error;
use crate::store::remote::Remote;
use crate::store::{WriteMode, blocking, null};

/// What the rounds of one branch's writes need, owned, so that they run in a task of their own.
pub(super) struct Writer {
    pub(super) remote: Arc<Remote>,
    pub(super) at: Location,
    pub(super) lock_ref_prefix: String,
}

impl Writer {
    fn lock_ref(&self, name: &StateName) -> String {
        format!("{}{}", self.lock_ref_prefix, name)
    }

    /// Where a round starts: at the floor when it can, else from a fresh receive-pack
    /// advertisement of the branch and the writers' lock refs.
    async fn start(&self, lock_refs: &[Option<String>], floor: bool) -> Result<Start, Error> {
        let (remote, at) = (&*self.remote, &self.at);
        if floor && let Some(start) = floor_start(remote, lock_refs)? {
            return Ok(start);
        }
        let branch = at.branch.full_ref();
        let advert = remote
            .refs(
                Service::ReceivePack,
                std::iter::once(branch.clone())
                    .chain(lock_refs.iter().flatten().cloned())
                    .collect(),
            )
            .await?;
        Ok(Start {
            tip: advert.tip(&branch),
            lock_tips: lock_refs
                .iter()
                .map(|r| r.as_ref().and_then(|r| advert.tip(r)))
                .collect(),
            mode: WriteMode::of(&advert),
            advert: Some(advert),
        })
    }

    /// One round of a batch of writes (distinct, non-overlapping paths): each write's check and
    /// plan against the tip, one commit per write that changes something, chained on the tip,
    /// and one push of the chain. Where each job stands after it, in order: `Done` or `Fresh`.
    pub(super) async fn write_round(&self, round: Round<'_>) -> Result<Outcome, Error> {
        let jobs = round.jobs;
        let lock_refs: Vec<Option<String>> = jobs
            .iter()
            .map(|job| job.lock.as_ref().map(|name| self.lock_ref(name)))
            .collect();
        let start = self.start(&lock_refs, round.floor).await?;
        self.fetch_for(&round, &start).await?;
        let tip = start.tip;
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
        let Some(head) = chain.head.filter(|_| !chain.commits.is_empty()) else {
            return Ok(Outcome::decided(stages));
        };
        let commit_count = chain.commits.len();
        let commands = self.commands(&start, head, &stages, lock_refs);
        let objects = chain.objects;
        let lost = push_chain(&self.remote, &start, head, commands, objects, &mut stages)
            .await?
            .map(|reason| Lost {
                on: tip,
                commits: commit_count,
                reason,
            });
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
    async fn fetch_for(&self, round: &Round<'_>, start: &Start) -> Result<(), Error> {
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
    async fn plan_all(&self, jobs: &[Job], start: &Start) -> Result<(Vec<Stage>, Chain), Error> {
        let remote = &*self.remote;
        let mut stages = Vec::with_capacity(jobs.len());
        let mut chain = Chain::on(start.tip);
        for (job, lock_tip) in jobs.iter().zip(&start.lock_tips) {
            let stage = match plan_one(remote, start.tip, job, *lock_tip).await? {
                // At the floor only a push rests on what this process remembers: a refusal or
                // an "unchanged" is decided again from the remote.
                Planned::Decided(_) if start.advert.is_none() => Stage::Fresh,
                Planned::Decided(written) => Stage::Done(written),
                Planned::Commit(content, meta) => {
                    let commit = remote
                        .commit(chain.head, job.path.clone(), content, meta)
                        .await?;
                    let id = commit.id;
                    chain.add(commit);
                    Stage::Pushing(id)
                }
            };
            stages.push(stage);
        }
        Ok((stages, chain))
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

/// One write's tree check, lock and plan against `tip`: decided, or what to commit.
async fn plan_one(
    remote: &Remote,
    tip: Option<ObjectId>,
    job: &Job,
    lock_tip: Option<ObjectId>,
) -> Result<Planned, Error> {
    // The tree rule, against the very tree the commit is built on: a concurrent writer that
    // slips a clashing path in makes the push lose the compare-and-swap, and the next round
    // sees it here. Writes in one round never overlap, so the tip's tree is the chain's.
    if let Some(tip) = tip {
        let (cache, owned) = (remote.cache.clone(), job.path.clone());
        if let Some(clash) = blocking(move || cache.path_clash(tip, &owned)).await? {
            return Ok(Planned::Decided(Written::Refused(Refusal::Clash(clash))));
        }
    }
    let held = match (lock_tip, &job.lock) {
        (Some(lock_tip), Some(name)) => Some(remote.held(lock_tip, name).await?),
        _ => None,
    };
    let stored = match tip {
        Some(tip) => remote.read(tip, job.path.clone()).await?,
        None => None,
    };
    let id = stored.as_deref().and_then(blob_id);
    let judged = stored.as_deref().map(|content| Stored {
        content,
        id: id.as_deref(),
    });
    let meta = match (job.plan)(held.as_ref(), judged) {
        Ok(meta) => meta,
        Err(refusal) => return Ok(Planned::Decided(Written::Refused(refusal))),
    };
    Ok(match &job.change {
        Change::Put(bytes) if stored.as_deref() == Some(bytes.as_ref()) => {
            Planned::Decided(Written::Unchanged)
        }
        Change::Put(bytes) => Planned::Commit(Some(bytes.clone()), meta),
        Change::Delete => Planned::Commit(None, meta),
    })
}

/// The git blob id of `content` (what a plan and the service know a stored state by); none if
/// it cannot be computed, so a sealed state is then opened rather than judged by a shared id.
fn blob_id(content: &[u8]) -> Option<String> {
    gix::objs::compute_hash(gix::hash::Kind::Sha1, gix::objs::Kind::Blob, content)
        .ok()
        .map(|id| id.to_string())
}

/// The blob id of what `job` writes, if it writes content.
fn written_id(job: &Job) -> Option<String> {
    match &job.change {
        Change::Put(bytes) => blob_id(bytes),
        Change::Delete => None,
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
    /// How many commits it carried.
    pub(super) commits: usize,
    /// What the remote said of the first ref it refused.
    pub(super) reason: String,
}

enum Planned {
    Decided(Written),
    Commit(Option<Bytes>, CommitMeta),
}

/// Commits built one on another on the round's tip.
struct Chain {
    head: Option<ObjectId>,
    commits: Vec<ObjectId>,
    /// What the remote lacks for all of them.
    objects: Vec<ObjectId>,
}

impl Chain {
    fn on(tip: Option<ObjectId>) -> Self {
        Self {
            head: tip,
            commits: Vec::new(),
            objects: Vec::new(),
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
}

/// A round at the floor: on the tip this process last saw and, under locks, the lock commits it
/// made, when the remote pushes atomically (without `atomic` a lock is only checked as of an
/// advertisement, so a write under a lock takes a fresh one). `None`: advertise.
fn floor_start(remote: &Remote, lock_refs: &[Option<String>]) -> Result<Option<Start>, Error> {
    let Some(caps) = remote.floor_caps() else {
        return Ok(None);
    };
    let Some(tip) = remote.cached_tip()? else {
        return Ok(None);
    };
    let mode = WriteMode::of(&caps);
    let mut lock_tips = Vec::with_capacity(lock_refs.len());
    for lock_ref in lock_refs {
        lock_tips.push(match lock_ref {
            None => None,
            Some(_) if mode != WriteMode::Atomic => return Ok(None),
            Some(lock_ref) => match remote.made_lock(lock_ref) {
                Some(commit) => Some(commit),
                None => return Ok(None),
            },
        });
    }
    Ok(Some(Start {
        tip: Some(tip),
        lock_tips,
        mode,
        advert: None,
    }))
}

/// Push the chain with compare-and-swap on the round's tip, atomically with the unchanged lock
/// refs when the remote allows, and move the writes `Pushing` their commits on: `Done` if it
/// landed, else `Fresh` (the next round advertises). Refused at the floor, or by a remote that
/// wants an advertisement first: `None`. Refused after an advertisement (another writer moved
/// the branch, a lock changed, or the remote would not take it): what the remote said.
async fn push_chain(
    remote: &Remote,
    start: &Start,
    head: ObjectId,
    commands: Vec<Command>,
    objects: Vec<ObjectId>,
    stages: &mut [Stage],
) -> Result<Option<String>, Error> {
    let report = if start.advert.is_none() {
        match remote
            .push_at_floor(commands.clone(), objects, Updates::Atomic)
            .await?
        {
            Some(report) if report.all_ok(&commands) => report,
            _ => {
                land(stages, false);
                return Ok(None);
            }
        }
    } else {
        remote.push(commands.clone(), objects).await?
    };
    if report.all_ok(&commands) {
        remote.saw_tip(head);
        land(stages, true);
        return Ok(None);
    }
    tracing::debug!(?report, "write push lost a race");
    let reason = report
        .refs
        .iter()
        .find_map(|(name, status)| status.as_ref().err().map(|why| format!("{name}: {why}")))
        .unwrap_or_else(|| "no report for the branch".into());
    land(stages, false);
    Ok(Some(reason))
}

/// The writes `Pushing` their commits: `Done` if the push `landed`, else `Fresh`.
fn land(stages: &mut [Stage], landed: bool) {
    for stage in stages.iter_mut() {
        if let Stage::Pushing(commit) = stage {
            *stage = if landed {
                Stage::Done(Written::Committed {
                    version: commit.to_string(),
                    content: None,
                })
            } else {
                Stage::Fresh
            };
        }
    }
}
