//! The protocol floor: pushes without a fresh ref advertisement when this process already knows
//! the receive-pack capabilities, the branch tip (in its cache) and the lock commit it made.
//!
//! Every such push is conditional on what it assumes, so the server, not the advertisement,
//! decides: a create-only lock fails when a lock exists, a compare-and-swap write fails when the
//! tip moved (atomically with the unchanged lock ref), a delete fails when the lock changed. A
//! refused push makes the caller run the normal path (advertise, re-read, retry). A remote that
//! answers such a push with an error rather than a report is not pushed to at the floor again.
//!
//! A LOCK push also proves the state (where a proof window is set, `GITSTATE_LOCK_PROOF_MS`;
//! see [`ReadsUntil`] for why that holds behind several processes too). After the command that
//! creates the lock ref,
//! the same push asserts where the state's newest content is: its own ref, when this process
//! knows one, by a command `old == new` at the tip it knows (never the zero id: `0 → 0` would
//! be an unchecked delete); otherwise the branch at the tip it knows, and the state ref's
//! absence, which no command asserts, by a probe ([`Probe`]). The commands stand each alone,
//! judged with the lock's create (older git applies them in the order sent, git 2.51 and later
//! in one batch), so once the lock is created nobody else may write the state, and accepted
//! assertions show that the state's newest content was where this process knew it then. The
//! GETs through this process that follow within the window (Terraform's, right after its LOCK,
//! and a create's second one before its write) are then answered from the cache, without a
//! request ([`GitStore::read_proved`]), until this process writes the state or the lock goes; a
//! later one asks. A refused
//! assertion costs nothing: the lock stands on its own verdict, and the GET asks the remote.
//! Only remotes that push atomically get the assertion: there every write of a state under a
//! lock asserts that lock ref unchanged in the same atomic push, so no write of the state can
//! land once the lock is someone else's. (Without `atomic`, a write checks the lock only as of
//! its advertisement: a GET there always asks.)

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gix::ObjectId;

use gitstate_core::ports::{CommitMeta, HeldLock, Location};
use gitstate_core::{LockInfo, StateName};

use super::known::{Home, Seen};
use super::proof::{CLOCK_MARGIN, ReadsUntil, wait_for_reads};
use super::proving::{Proving, probe_ref};
use super::remote::{Proof, Remote};
use super::{GitStore, RemoteError, UnlockError, WriteMode, blocking, null};
use crate::protocol::{Advert, Command, PushReport, Updates};
use crate::sync::lock;

/// Lock commits a process remembers having made.
const MAX_REMEMBERED_LOCKS: usize = 4096;

impl Remote {
    /// The receive-pack capabilities, if this process may push to the remote without a fresh
    /// advertisement (over HTTP, capabilities known, the floor not refused).
    pub(super) fn floor_caps(&self) -> Option<Advert> {
        self.transport.floor_caps()
    }

    /// The branch tip this process last saw, if its cache holds it.
    pub(super) fn cached_tip(&self) -> Result<Option<ObjectId>, RemoteError> {
        match self.recent_tip(Duration::MAX) {
            Some(tip) if self.cache.has(tip)? => Ok(Some(tip)),
            _ => Ok(None),
        }
    }

    /// The lock commit this process made at `lock_ref`, if it made one and has not seen it go.
    pub(super) fn made_lock(&self, lock_ref: &str) -> Option<ObjectId> {
        self.made_lock_at(lock_ref).map(|(commit, _)| commit)
    }

    /// [`Self::made_lock`], and when its push landed.
    pub(super) fn made_lock_at(&self, lock_ref: &str) -> Option<(ObjectId, Instant)> {
        lock(&self.made_locks).get(lock_ref).copied()
    }

    pub(super) fn remember_lock(&self, lock_ref: &str, commit: Option<ObjectId>) {
        self.forget_proof(lock_ref);
        let mut made = lock(&self.made_locks);
        match commit {
            Some(commit) => {
                if made.len() >= MAX_REMEMBERED_LOCKS {
                    made.clear();
                }
                made.insert(lock_ref.to_owned(), (commit, Instant::now()));
            }
            None => {
                made.remove(lock_ref);
            }
        }
    }

    /// Remember what the LOCK push of `lock_ref` proved (see the module doc).
    pub(super) fn remember_proof(&self, lock_ref: &str, proof: Proof) {
        let mut proofs = lock(&self.proofs);
        if proofs.len() >= MAX_REMEMBERED_LOCKS {
            proofs.clear();
        }
        proofs.insert(lock_ref.to_owned(), proof);
    }

    /// What a LOCK of `lock_ref` proved, while reads may rest on it: this process still holds
    /// that lock (as far as it knows), has not written the state since, and the proof is a few
    /// seconds old at most. Every read in that time rests on it: Terraform reads right after
    /// its LOCK, and a create reads once more just before its write.
    pub(super) fn standing_proof(&self, lock_ref: &str) -> Option<Proof> {
        let mut proofs = lock(&self.proofs);
        let proof = *proofs.get(lock_ref)?;
        let holds = self.made_lock(lock_ref) == Some(proof.lock);
        if holds && proof.until.stands() {
            return Some(proof);
        }
        proofs.remove(lock_ref);
        None
    }

    /// Before a write under the lock commit `commit` at `lock_ref`, or its release: wait until
    /// the process that made that lock (if not this one) may no longer answer reads from what
    /// its LOCK proved (see [`ReadsUntil`]).
    pub(super) async fn outwait_proof(
        &self,
        lock_ref: &str,
        commit: ObjectId,
    ) -> Result<(), RemoteError> {
        let wait = self.proof_wait(lock_ref, commit).await?;
        super::proof::wait_out(wait).await;
        Ok(())
    }

    /// How long [`Self::outwait_proof`] waits.
    pub(super) async fn proof_wait(
        &self,
        lock_ref: &str,
        commit: ObjectId,
    ) -> Result<Duration, RemoteError> {
        if self.made_lock(lock_ref) == Some(commit) {
            return Ok(Duration::ZERO);
        }
        let cache = self.cache.clone();
        Ok(match blocking(move || cache.commit_summary(commit)).await {
            Ok((message, _)) => wait_for_reads(&message),
            // Not in the cache (read elsewhere): as long as any maker may answer.
            Err(_) => crate::settings::MAX_PROOF_WINDOW + CLOCK_MARGIN,
        })
    }

    /// A write of the state, or its lock gone: what its LOCK proved no longer stands.
    pub(super) fn forget_proof(&self, lock_ref: &str) {
        lock(&self.proofs).remove(lock_ref);
    }

    /// The tip of the probe this process's LOCK at `lock_ref`, whose lock commit is `commit`,
    /// made and that stands (as far as this process knows).
    pub(super) fn own_probe(&self, lock_ref: &str, commit: ObjectId) -> Option<ObjectId> {
        let probes = lock(&self.probes);
        probes
            .get(lock_ref)
            .filter(|delete| delete.old == commit)
            .map(|delete| delete.old)
    }

    /// The probe at `lock_ref` was deleted at `tip` (by a write that creates the state's ref):
    /// the lock's release does not delete it again.
    pub(super) fn probe_gone(&self, lock_ref: &str, tip: ObjectId) {
        let mut probes = lock(&self.probes);
        if probes.get(lock_ref).is_some_and(|delete| delete.old == tip) {
            probes.remove(lock_ref);
        }
    }

    /// The probe the LOCK of `lock_ref` made stands: `delete` removes it (see [`Probe`]).
    fn remember_probe(&self, lock_ref: &str, delete: Command) {
        let mut probes = lock(&self.probes);
        if probes.len() >= MAX_REMEMBERED_LOCKS {
            probes.clear();
        }
        probes.insert(lock_ref.to_owned(), delete);
    }

    /// The deletes of the probes of the lock commit `commit` at `lock_ref`, for the lock's
    /// release to carry: the one this process's LOCK made (taken), and any at that commit in the
    /// last listing of the refs (a lock another process made, released here by force, or one
    /// taken through another branch's address: a probe names the branch's state ref).
    pub(super) fn probes_of(&self, lock_ref: &str, commit: ObjectId) -> Vec<Command> {
        let mut deletes = Vec::new();
        {
            let mut probes = lock(&self.probes);
            if probes
                .get(lock_ref)
                .is_some_and(|delete| delete.old == commit)
            {
                deletes.extend(probes.remove(lock_ref));
            }
        }
        for name in lock(&self.known_states).probes_at(commit) {
            if !deletes.iter().any(|delete| delete.name == name) {
                deletes.push(Command {
                    old: commit,
                    new: null(),
                    name,
                });
            }
        }
        deletes
    }

    /// Whether a LOCK push may show a state ref's absence (see [`Probe`]).
    pub(super) fn probes_work(&self) -> bool {
        !self.no_probes.load(Ordering::Relaxed)
    }

    /// The remote declined a LOCK push for its probe's name: no more probes.
    fn probes_off(&self) {
        self.no_probes.store(true, Ordering::Relaxed);
    }

    /// Delete probes that must not stand (made by a LOCK push whose lock did not land), or move
    /// them back, each alone. A failure is logged: such a probe costs the state's next GET after
    /// a LOCK a look until a LOCK takes it over or a write that creates the state's ref deletes it.
    pub(super) async fn delete_leftovers(&self, leftovers: Vec<Command>) {
        if leftovers.is_empty() {
            return;
        }
        let names: Vec<String> = leftovers.iter().map(|c| c.name.clone()).collect();
        let deleted = self.push_each(leftovers.clone(), Vec::new()).await;
        match deleted {
            Ok(report) if report.all_ok(&leftovers) => {}
            Ok(report) => tracing::warn!(
                ?names,
                ?report,
                "a probe ref of a LOCK was left behind; delete it by hand"
            ),
            Err(error) => {
                tracing::warn!(?names, error = %gitstate_core::report::chain(&error), "a probe ref of a LOCK was left behind; delete it by hand")
            }
        }
    }

    /// A LOCK push: the lock's create (with the objects of its commit), then `proving`'s
    /// commands, each alone; `floor`: without a fresh advertisement (`None`: the remote wants
    /// one). A push that carried a probe and had every command refused may have been declined
    /// whole (a hook that allows only branches and tags): the lock goes once more alone, and
    /// if it lands then, probes are off for this remote.
    pub(super) async fn push_lock(
        &self,
        (create, objects): (Command, Vec<ObjectId>),
        proving: Option<Proving>,
        floor: bool,
    ) -> Result<Option<LockPush>, RemoteError> {
        let send = |commands: Vec<Command>| {
            let objects = objects.clone();
            async move {
                if floor {
                    self.push_at_floor(commands, objects, Updates::EachAlone)
                        .await
                } else {
                    self.push_each(commands, objects).await.map(Some)
                }
            }
        };
        let commands = lock_commands(create.clone(), proving.as_ref());
        let Some(report) = send(commands.clone()).await? else {
            return Ok(None);
        };
        let probed = proving.as_ref().is_some_and(|p| p.probe.is_some());
        if !probed || report.verdicts(&commands).contains(&true) {
            return Ok(Some(LockPush {
                create,
                commands,
                report,
                proving,
            }));
        }
        let alone = vec![create.clone()];
        let Some(again) = send(alone.clone()).await? else {
            return Ok(None);
        };
        if again.all_ok(&alone) {
            tracing::warn!(
                "the remote declined a LOCK push that probed for a state ref and took the lock \
                 alone: a LOCK does not show there that a state has no ref, so the GET after it \
                 asks the remote"
            );
            self.probes_off();
        }
        Ok(Some(LockPush {
            create,
            commands: alone,
            report: again,
            proving: None,
        }))
    }

    /// A push at the floor: `Ok(None)` when the remote answered it with an error instead of a
    /// report (it wants a fresh advertisement first), and the floor is off for this remote.
    pub(super) async fn push_at_floor(
        &self,
        commands: Vec<Command>,
        objects: Vec<ObjectId>,
        updates: Updates,
    ) -> Result<Option<PushReport>, RemoteError> {
        let pushed = match updates {
            Updates::Atomic => self.push(commands, objects).await,
            Updates::EachAlone => self.push_each(commands, objects).await,
        };
        match pushed {
            Ok(report) => Ok(Some(report)),
            // An HTTP error status, or an answer that is not a report: not pushed to this way
            // again.
            Err(error) if error.status().is_some() || error.garbled() => {
                tracing::warn!(error = %gitstate_core::report::chain(&error), "the remote refused a push without a fresh advertisement; advertising first from now on");
                self.transport.refuse_floor();
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }
}

impl GitStore {
    /// LOCK at the floor: one create-only push, when the tree this process last saw has no clash,
    /// with the assertion that proves the state (see the module doc).
    /// `false`: not tried or refused (a lock exists, or its ref clashes): the normal path looks.
    pub(super) async fn lock_at_floor(
        &self,
        remote: &Remote,
        at: &Location,
        name: &StateName,
        lock: &LockInfo,
        meta: &CommitMeta,
    ) -> Result<bool, RemoteError> {
        let Some(caps) = remote.floor_caps() else {
            return Ok(false);
        };
        let Some(tip) = remote.cached_tip()? else {
            return Ok(false);
        };
        let (cache, path) = (remote.cache.clone(), name.to_string());
        if blocking(move || cache.path_clash(tip, &path))
            .await?
            .is_some()
        {
            return Ok(false);
        }
        let lock_ref = self.lock_ref(name);
        let until = self.reads_until(remote, name, &caps);
        let (command, commit) = remote
            .lock_commit(name, lock, meta, &lock_ref, until)
            .await?;
        let proving = self.proving(remote, at, name, (tip, commit.id), until);
        let pushed = remote
            .push_lock((command, commit.objects), proving, true)
            .await?;
        match pushed {
            Some(pushed) => Ok(pushed.settle(remote, &lock_ref).await.is_none()),
            None => Ok(false),
        }
    }

    /// Until when this process may answer the GETs of `name` from what its LOCK proves (to
    /// record in the lock commit), where it may: a proof window is set, and the remote
    /// (capabilities `caps`) pushes atomically and lists every ref; the state has a ref this
    /// process knows, or its absence can be probed (see the module doc).
    pub(super) fn reads_until(
        &self,
        remote: &Remote,
        name: &StateName,
        caps: &Advert,
    ) -> Option<ReadsUntil> {
        let window = self.options.proof_window;
        if window.is_zero()
            || !remote.transport.proves_for_reads()
            || WriteMode::of(caps) != WriteMode::Atomic
        {
            return None;
        }
        let state_ref = remote.state_ref(name.as_str());
        let has_ref = matches!(lock(&remote.known_states).tip(&state_ref), Some(Some(_)));
        (has_ref || remote.probes_work()).then(|| ReadsUntil::after(window))
    }

    /// What a LOCK push of `name` asserts after the lock's create (see the module doc), where
    /// its lock commit (`branch.1`) records [`Self::reads_until`]: the state's own ref at the tip
    /// this process knows, or, knowing of none, the branch at `branch.0` and the ref's absence.
    pub(super) fn proving(
        &self,
        remote: &Remote,
        at: &Location,
        name: &StateName,
        (branch, lock_commit): (ObjectId, ObjectId),
        until: Option<ReadsUntil>,
    ) -> Option<Proving> {
        let until = until?;
        let state_ref = remote.state_ref(name.as_str());
        let (known, left) = {
            let known = lock(&remote.known_states);
            let left = known.tip(&probe_ref(&state_ref)).flatten();
            (known.tip(&state_ref), left)
        };
        let proving = match known {
            Some(Some(tip)) => Proving::own(&state_ref, tip, &at.branch.full_ref(), branch),
            // (Where this process creates state refs itself, `always`, the first update under
            // this lock deletes the probe before it creates the ref: see `write::state`.)
            _ if remote.probes_work() => Proving::absent(
                &at.branch.full_ref(),
                branch,
                &state_ref,
                (lock_commit, left),
            ),
            _ => return None,
        };
        Some(Proving {
            until: Some(until),
            ..proving
        })
    }

    /// A read of `name` right after this process's LOCK of it: the state at the tip that LOCK
    /// proved, from the cache (its blob fetched if the cache lacks it). `None`: nothing proved
    /// stands (a write or UNLOCK since, too old, or never made): ask the remote.
    pub(super) async fn read_proved(
        &self,
        at: &Location,
        name: &StateName,
    ) -> Result<Option<Option<bytes::Bytes>>, RemoteError> {
        let remote = self.remote(at)?;
        let Some(proof) = remote.standing_proof(&self.lock_ref(name)) else {
            return Ok(None);
        };
        let wanted = std::iter::once(proof.branch).chain(proof.state);
        for commit in wanted {
            if !remote.cache.has(commit)? {
                return Ok(None);
            }
        }
        remote.not_a_copy(proof.branch, None).await?;
        let path = name.to_string();
        let state = match proof.state {
            Some(state) => remote.read_state_ref(proof.branch, state, &path).await?,
            None => remote.read(proof.branch, path).await?,
        };
        Ok(Some(state.map(bytes::Bytes::from)))
    }

    /// The lock this process made for `name`, read from its cache without asking the remote.
    pub(super) async fn known_lock(
        &self,
        at: &Location,
        name: &StateName,
    ) -> Result<Option<HeldLock>, UnlockError> {
        let remote = self.remote(at)?;
        if remote.floor_caps().is_none() {
            return Ok(None);
        }
        let Some(commit) = remote.made_lock(&self.lock_ref(name)) else {
            return Ok(None);
        };
        if !remote.cache.has(commit)? {
            return Ok(None);
        }
        Ok(Some(self.held(&remote, commit, name).await?))
    }
}

/// A LOCK push as sent, and its report.
pub(super) struct LockPush {
    create: Command,
    commands: Vec<Command>,
    pub(super) report: PushReport,
    proving: Option<Proving>,
}

impl LockPush {
    /// Remember the lock commit if its create landed at `lock_ref`, and what the push proved;
    /// delete what a probe left behind. `None`: the lock landed; else the refused report.
    pub(super) async fn settle(self, remote: &Remote, lock_ref: &str) -> Option<PushReport> {
        let landed = self.report.all_ok(std::slice::from_ref(&self.create));
        let commit = self.create.new;
        if landed {
            remote.remember_lock(lock_ref, Some(commit));
        }
        let made = landed.then_some((lock_ref, commit));
        let leftovers = remember_proved(remote, &self.report, &self.commands, made, self.proving);
        remote.delete_leftovers(leftovers).await;
        (!landed).then_some(self.report)
    }
}

/// The commands of a LOCK push: the lock ref's create, then, when `proving`, its assertion
/// (and probe), each standing alone.
fn lock_commands(create: Command, proving: Option<&Proving>) -> Vec<Command> {
    let proving = proving.map(Proving::commands).unwrap_or_default();
    std::iter::once(create).chain(proving).collect()
}

/// After a LOCK push of `commands` (see [`lock_commands`]), which `made` its lock commit at
/// its lock ref or not: remember what its assertion proved, if it carried one and the remote
/// accepted it. Returns the refs a probe left behind, which the caller deletes.
fn remember_proved(
    remote: &Remote,
    report: &PushReport,
    commands: &[Command],
    made: Option<(&str, ObjectId)>,
    proving: Option<Proving>,
) -> Vec<Command> {
    let Some(proving) = proving else {
        return Vec::new();
    };
    let verdicts = report.verdicts(commands);
    let judged = proving.judge(verdicts.get(1..).unwrap_or_default());
    let Some((lock_ref, lock_commit)) = made else {
        // The lock is someone else's: a probe made anyway goes at once, and one moved from a
        // probe this process saw goes back where it was (that probe may be the holder's).
        return judged
            .probe
            .map(|delete| proving.undo_probe(delete))
            .into_iter()
            .collect();
    };
    if let Some(probe) = judged.probe {
        remote.remember_probe(lock_ref, probe);
    }
    if !judged.proved {
        tracing::debug!(?report, "the state moved since this process last saw it");
        return Vec::new();
    }
    let Some(until) = proving.until else {
        return Vec::new();
    };
    // The branch was asserted: its tip is current, a write may start there.
    remote.saw_tip(proving.branch);
    let proof = Proof {
        lock: lock_commit,
        branch: proving.branch,
        state: proving.state,
        until,
    };
    remote.remember_proof(lock_ref, proof);
    // Asserted after the lock was created: a look under the lock (see `known::Seen`).
    let seen = Seen {
        branch: proving.branch,
        home: proving.state.map_or(Home::Absent, Home::At),
        at: Instant::now(),
    };
    lock(&remote.looks).saw(&proving.state_ref, seen);
    Vec::new()
}
