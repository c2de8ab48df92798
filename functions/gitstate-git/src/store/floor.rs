//! The protocol floor: pushes without a fresh ref advertisement when this process already knows
//! the receive-pack capabilities, the branch tip (in its cache) and the lock commit it made.
//!
//! Every such push is conditional on what it assumes, so the server, not the advertisement,
//! decides: a create-only lock fails when a lock exists, a compare-and-swap write fails when the
//! tip moved (atomically with the unchanged lock ref), a delete fails when the lock changed. A
//! refused push makes the caller run the normal path (advertise, re-read, retry). A remote that
//! answers such a push with an error rather than a report is not pushed to at the floor again.
//!
//! A LOCK push also proves the state, when the state has a ref of its own that this process
//! knows: after the command that creates the lock ref, the same push carries a command
//! `old == new` on the state's ref at the tip this process knows (never the zero id: `0 → 0`
//! would be an unchecked delete). A state without a ref is not proved: asserting the branch
//! cannot show that nobody created the state's ref since this process last listed the refs
//! (a push cannot assert that a ref is absent), so its GET asks the remote. The two stand each alone, applied in the
//! order sent, so once the lock is created nobody else may write the state, and an accepted
//! assertion shows that the tip still held the state's newest content at that moment. The GET
//! that follows (Terraform's, right after its LOCK) is then answered from the cache, without a
//! request ([`GitStore::read_proved`]). A refused assertion costs nothing: the lock stands on
//! its own verdict, and the GET asks the remote. Only remotes that push atomically get the
//! assertion: there every write of a state under a lock asserts that lock ref unchanged in
//! the same atomic push, so no write of the state can land once the lock is someone else's.
//! (Without `atomic`, a write checks the lock only as of its advertisement: a GET there
//! always asks.)

use std::time::{Duration, Instant};

use gix::ObjectId;

use gitstate_core::ports::{CommitMeta, HeldLock, Location};
use gitstate_core::{LockInfo, StateName};

use super::known::{Home, Seen};
use super::remote::{Proof, Remote};
use super::{GitStore, RemoteError, UnlockError, WriteMode, blocking};
use crate::protocol::{Advert, Command, PushReport, Updates};
use crate::sync::lock;

/// Lock commits a process remembers having made.
const MAX_REMEMBERED_LOCKS: usize = 4096;

/// How long what a LOCK proved answers the GET that follows it (Terraform reads right after it
/// locks): a lock broken by force meanwhile is the only way the state could have moved on.
const PROOF_LIFETIME: Duration = Duration::from_secs(60);

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

    /// What a LOCK of `lock_ref` proved, taken: one read rests on it, while this process still
    /// holds that lock (as far as it knows) and the proof is recent.
    pub(super) fn take_proof(&self, lock_ref: &str) -> Option<Proof> {
        let proof = lock(&self.proofs).remove(lock_ref)?;
        let holds = self.made_lock(lock_ref) == Some(proof.lock);
        (holds && proof.made.elapsed() < PROOF_LIFETIME).then_some(proof)
    }

    /// A write of the state, or its lock gone: what its LOCK proved no longer stands.
    pub(super) fn forget_proof(&self, lock_ref: &str) {
        lock(&self.proofs).remove(lock_ref);
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
        let (command, commit) = remote.lock_commit(name, lock, meta, &lock_ref).await?;
        let proving = match self.holder(at, name)? {
            // Only a state whose ref this process knows: an assertion of the branch cannot show
            // that no state ref was created since this process last listed them.
            Some(held)
                if self.options.single_front
                    && WriteMode::of(&caps) == WriteMode::Atomic
                    && held.name != at.branch.full_ref() =>
            {
                let state = (held.name != at.branch.full_ref()).then_some(held.tip);
                let proving = Proving::new(&held.name, held.tip, tip, state);
                Some(proving.of(remote.state_ref(name.as_str())))
            }
            _ => None,
        };
        let commands = lock_commands(command.clone(), proving.as_ref());
        match remote
            .push_at_floor(commands.clone(), commit.objects, Updates::EachAlone)
            .await?
        {
            Some(report) if report.all_ok(&[command]) => {
                remote.remember_lock(&lock_ref, Some(commit.id));
                remember_proved(remote, &report, (&lock_ref, commit.id), proving);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// A read of `name` right after this process's LOCK of it: the state at the tip that LOCK
    /// proved, from the cache (its blob fetched if the cache lacks it). `None`: nothing proved
    /// stands (taken by an earlier read, a write or UNLOCK since, or never made): ask the remote.
    pub(super) async fn read_proved(
        &self,
        at: &Location,
        name: &StateName,
    ) -> Result<Option<Option<bytes::Bytes>>, RemoteError> {
        let remote = self.remote(at)?;
        let Some(proof) = remote.take_proof(&self.lock_ref(name)) else {
            return Ok(None);
        };
        let wanted = std::iter::once(proof.branch).chain(proof.state);
        for commit in wanted {
            if !remote.cache.has(commit)? {
                return Ok(None);
            }
        }
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

/// What a LOCK push asserts after the lock's create: the ref that holds the state's newest
/// content (its state ref, or the branch) at the tip this process knows.
pub(super) struct Proving {
    assert: Command,
    branch: ObjectId,
    state: Option<ObjectId>,
    /// The state's ref (whether `assert` names it or the branch).
    state_ref: String,
}

impl Proving {
    /// The ref `held` at `tip`: the branch at `branch`, or the state ref (`state`: its tip).
    pub(super) fn new(
        held: &str,
        tip: ObjectId,
        branch: ObjectId,
        state: Option<ObjectId>,
    ) -> Self {
        // Never the zero id: `0 → 0` is a delete without a check.
        let assert = Command {
            old: tip,
            new: tip,
            name: held.to_owned(),
        };
        Self {
            assert,
            branch,
            state,
            state_ref: String::new(),
        }
    }

    /// The proof is of the state whose ref is `state_ref`.
    pub(super) fn of(self, state_ref: String) -> Self {
        Self { state_ref, ..self }
    }
}

/// The commands of a LOCK push: the lock ref's create, then, when `proving`, its assertion,
/// each standing alone.
pub(super) fn lock_commands(create: Command, proving: Option<&Proving>) -> Vec<Command> {
    let assert = proving.map(|p| p.assert.clone());
    std::iter::once(create).chain(assert).collect()
}

/// After a LOCK push that created `lock_commit` at `lock_ref`: remember what its assertion
/// proved, if it carried one and the remote accepted it.
pub(super) fn remember_proved(
    remote: &Remote,
    report: &PushReport,
    (lock_ref, lock_commit): (&str, ObjectId),
    proving: Option<Proving>,
) {
    let Some(proving) = proving else {
        return;
    };
    if report.all_ok(std::slice::from_ref(&proving.assert)) {
        if proving.state.is_none() {
            // The branch itself was asserted: its tip is current, a write may start there.
            remote.saw_tip(proving.branch);
        }
        let proof = Proof {
            lock: lock_commit,
            branch: proving.branch,
            state: proving.state,
            made: Instant::now(),
        };
        remote.remember_proof(lock_ref, proof);
        // Asserted after the lock was created: a look under the lock (see `known::Seen`).
        if let Some(state) = proving.state {
            let seen = Seen {
                branch: proving.branch,
                home: Home::At(state),
                at: Instant::now(),
            };
            lock(&remote.looks).saw(&proving.state_ref, seen);
        }
    } else {
        tracing::debug!(?report, "the state moved since this process last saw it");
    }
}
