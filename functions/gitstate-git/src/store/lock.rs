//! Locks: create-only pushes of orphan commits to lock refs, conditional deletes, holders.

use gitstate_core::protocol::{PROTOCOL_FILE, PROTOCOL_PREFIX, Protocol};

use super::write::backoff;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gix::ObjectId;

use gitstate_core::ports::{Acquire, CommitMeta, HeldLock, Location, Release, user_from_message};
use gitstate_core::refs::{Clash, branch_clash, lock_clash};
use gitstate_core::{BranchName, LockInfo, StateName};

use super::remote::Remote;
use super::{
    GitStore, ListError, LockError, ReadError, RemoteError, UnlockError, WriteMode, blocking, null,
};
use crate::protocol::Command;
use crate::protocol::{Advert, Service, Updates};
use crate::repository::Corruption;
use crate::repository::NewCommit;
use crate::settings::StateRefs;
use crate::sync::lock;

/// What a LOCK records in the repository once it holds the lock (see
/// [`GitStore::protocol_for_lock`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct ToRecord {
    /// The lock ref prefix: nothing is recorded yet.
    prefix: bool,
    /// The fence: this backend may write states to their own refs.
    fence: bool,
    /// The second fence: this backend answers reads from its LOCKs' proofs.
    proof_fence: bool,
}

impl ToRecord {
    fn nothing(self) -> bool {
        !self.prefix && !self.fence && !self.proof_fence
    }
}

/// How often a LOCK looks again after its tree check raced a write or its push was refused
/// without a holder or a clashing lock to show for it.
const MAX_LOCK_ATTEMPTS: u32 = 10;

impl GitStore {
    pub(super) fn lock_ref(&self, name: &StateName) -> String {
        format!("{}{}", self.options.lock_ref_prefix, name)
    }

    /// The lock, among those `advert` lists, whose ref would clash with the lock ref of `name`.
    pub(super) fn lock_clash(&self, advert: &Advert, name: &StateName) -> Option<Clash> {
        let prefix = self.options.lock_ref_prefix.as_str();
        lock_clash(
            advert.refs.keys().filter_map(|r| r.strip_prefix(prefix)),
            name.as_str(),
        )
    }

    /// What a LOCK decides from: the lock ref, the branch and every other lock ref (one
    /// receive-pack advertisement over HTTP, which lists every ref anyway).
    pub(super) async fn lock_advert(
        &self,
        remote: &Remote,
        at: &Location,
        lock_ref: &str,
    ) -> Result<Advert, RemoteError> {
        let names = vec![lock_ref.to_owned(), at.branch.full_ref()];
        let mut advert = remote.refs(Service::ReceivePack, names).await?;
        for prefix in [self.options.lock_ref_prefix.as_str(), PROTOCOL_PREFIX] {
            let beside = remote.transport.refs_beside(&advert, prefix).await?;
            advert.refs.extend(beside.refs);
        }
        Ok(advert)
    }

    /// The protocol rule of a LOCK, from the advertisement it decides on: a record of another
    /// lock ref prefix refuses it ([`LockError::ProtocolMismatch`]); otherwise what the LOCK
    /// records once it holds the lock: this prefix, where nothing is recorded yet, and the fence
    /// ([`gitstate_core::protocol::STATE_REFS_FENCE`]), where this backend may write states to
    /// their own refs and the repository lacks it, and the second fence
    /// ([`gitstate_core::protocol::PROOF_FENCE`]), where this backend (of `remote`) answers reads
    /// from its LOCKs' proofs and the repository lacks it.
    pub(super) fn protocol_for_lock(
        &self,
        remote: &Remote,
        at: &Location,
        advert: &Advert,
    ) -> Result<ToRecord, LockError> {
        let prefix = &self.options.lock_ref_prefix;
        let refs = || advert.refs.keys().map(String::as_str);
        let atomic = WriteMode::of(advert) == WriteMode::Atomic;
        let fence = self.options.state_refs == StateRefs::Always
            && atomic
            && !gitstate_core::protocol::fenced(refs());
        let proof_fence = !self.options.proof_window.is_zero()
            && atomic
            && remote.transport.proves_for_reads()
            && !gitstate_core::protocol::proof_fenced(refs());
        match gitstate_core::protocol::check(prefix, refs()) {
            Protocol::Differs {
                setting,
                ours,
                recorded,
            } => Err(LockError::ProtocolMismatch {
                setting,
                ours,
                recorded,
            }),
            Protocol::Agrees => {
                if !fence && !proof_fence {
                    lock(&self.protocol_agreed).insert(at.repository.clone());
                }
                Ok(ToRecord {
                    prefix: false,
                    fence,
                    proof_fence,
                })
            }
            Protocol::Unrecorded => Ok(ToRecord {
                prefix: true,
                fence,
                proof_fence,
            }),
        }
    }

    /// Record what `what` names in the repository: create-only pushes of their record refs,
    /// each alone, once per repository. A host that refuses them (some allow only branches and
    /// tags) gets a warning; locking goes on as before.
    async fn record_protocol(
        &self,
        remote: &Remote,
        at: &Location,
        meta: &CommitMeta,
        what: ToRecord,
    ) {
        let prefix = &self.options.lock_ref_prefix;
        let record = async {
            let mut records = Vec::new();
            if what.prefix {
                records.push((
                    gitstate_core::protocol::lock_prefix_record(prefix),
                    format!("record the lock ref prefix {prefix}\n"),
                    gitstate_core::protocol::record_file(prefix),
                ));
            }
            if what.fence {
                records.push((
                    gitstate_core::protocol::STATE_REFS_FENCE.to_owned(),
                    "fence off gitstate versions that do not read states' own refs\n".to_owned(),
                    gitstate_core::protocol::fence_file(),
                ));
            }
            if what.proof_fence {
                records.push((
                    gitstate_core::protocol::PROOF_FENCE.to_owned(),
                    "fence off gitstate versions that do not wait out a LOCK's proof\n".to_owned(),
                    gitstate_core::protocol::proof_fence_file(),
                ));
            }
            let (mut commands, mut objects) = (Vec::new(), Vec::new());
            for (name, message, file) in records {
                let meta = CommitMeta {
                    message,
                    ..meta.clone()
                };
                let commit = remote
                    .commit(
                        None,
                        PROTOCOL_FILE.to_owned(),
                        Some(Bytes::from(file)),
                        meta,
                    )
                    .await?;
                commands.push(Command {
                    old: null(),
                    new: commit.id,
                    name,
                });
                objects.extend(commit.objects);
            }
            let report = remote.push_each(commands.clone(), objects).await?;
            Ok::<bool, RemoteError>(report.all_ok(&commands))
        };
        match record.await {
            Ok(true) => {
                lock(&self.protocol_agreed).insert(at.repository.clone());
            }
            // Another backend recorded first: the next LOCK compares with its record. (A host
            // that declines the ref gets the push again with each LOCK, which goes on
            // advertising: a refusal may be passing, and a LOCK that stopped looking for a
            // record would never see another prefix's.)
            Ok(false) => {}
            Err(error) => tracing::warn!(
                error = %gitstate_core::report::chain(&error),
                "the lock ref prefix could not be recorded in the repository"
            ),
        }
    }

    /// How `path` clashes with the tree of `tip` (fetched into the cache first).
    pub(super) async fn tree_clash(
        &self,
        remote: &Remote,
        tip: ObjectId,
        path: &str,
    ) -> Result<Option<Clash>, RemoteError> {
        remote.ensure(vec![tip]).await?;
        let (cache, path) = (remote.cache.clone(), path.to_owned());
        Ok(blocking(move || cache.path_clash(tip, &path)).await?)
    }

    pub(super) async fn held(
        &self,
        remote: &Remote,
        tip: ObjectId,
        name: &StateName,
    ) -> Result<HeldLock, RemoteError> {
        remote.held(tip, name).await
    }

    pub(super) async fn list_locks(
        &self,
        at: &Location,
    ) -> Result<Vec<(StateName, HeldLock)>, ListError> {
        let remote = self.remote(at)?;
        let prefix = &self.options.lock_ref_prefix;
        let advert = remote.refs_with_prefix(prefix).await?;
        let mut tips: Vec<(StateName, ObjectId)> = advert
            .refs
            .iter()
            .filter_map(|(r, id)| {
                let name = StateName::parse(r.strip_prefix(prefix.as_str())?).ok()?;
                Some((name, *id))
            })
            .collect();
        tips.sort();
        // One fetch for every lock commit the cache lacks.
        remote
            .ensure_with(tips.iter().map(|(_, id)| *id).collect(), true)
            .await?;
        let mut locks = Vec::with_capacity(tips.len());
        for (name, tip) in tips {
            let held = self.held(&remote, tip, &name).await?;
            locks.push((name, held));
        }
        Ok(locks)
    }

    pub(super) async fn read_lock(
        &self,
        at: &Location,
        name: &StateName,
    ) -> Result<Option<HeldLock>, ReadError> {
        let remote = self.remote(at)?;
        let lock_ref = self.lock_ref(name);
        // The receive-pack advertisement lists the same refs and also carries the push
        // capabilities, so an UNLOCK in a fresh process needs no second advertisement.
        let advert = remote
            .refs(Service::ReceivePack, vec![lock_ref.clone()])
            .await?;
        match advert.tip(&lock_ref) {
            Some(tip) => Ok(Some(self.held(&remote, tip, name).await?)),
            None => Ok(None),
        }
    }

    pub(super) async fn acquire_lock(
        &self,
        at: &Location,
        name: &StateName,
        lock: &LockInfo,
        meta: &CommitMeta,
    ) -> Result<Acquire, LockError> {
        let remote = self.remote(at)?;
        let lock_ref = self.lock_ref(name);
        let agreed = crate::sync::lock(&self.protocol_agreed).contains(&at.repository);
        if agreed && self.lock_at_floor(&remote, at, name, lock, meta).await? {
            return Ok(Acquire::Acquired);
        }
        let mut refused = None;
        let mut last_attempt = Duration::ZERO;
        // A refused push is judged from the refs, not from the error text: someone took the
        // lock first (held), or created a lock ref it clashes with (a directory/file conflict,
        // which git http-backend reports as `ng <ref> failed to update ref`): look again.
        for attempt in 1..=MAX_LOCK_ATTEMPTS {
            if attempt > 1 {
                tokio::time::sleep(backoff(attempt, last_attempt)).await;
            }
            let attempt_started = Instant::now();
            let advert = self.lock_advert(&remote, at, &lock_ref).await?;
            let to_record = self.protocol_for_lock(&remote, at, &advert)?;
            if let Some(tip) = advert.tip(&lock_ref) {
                return Ok(Acquire::Held(self.held(&remote, tip, name).await?));
            }
            if let Some(clash) = self.lock_clash(&advert, name) {
                return Ok(Acquire::Clash(clash));
            }
            if let Some(tip) = advert.tip(&at.branch.full_ref()) {
                match self.tree_clash(&remote, tip, name.as_str()).await {
                    Ok(Some(clash)) => return Ok(Acquire::Clash(clash)),
                    Ok(None) => {}
                    // The branch moved between advertisement and fetch ("not our ref"): look again.
                    Err(error) if error.is_transient() => {
                        tracing::debug!(attempt, error = %gitstate_core::report::chain(&error), "lock's tree check raced a write, retrying");
                        last_attempt = attempt_started.elapsed();
                        refused = None;
                        continue;
                    }
                    Err(error) => return Err(error.into()),
                }
            }
            let branch = advert.tip(&at.branch.full_ref());
            let until = branch.and_then(|_| self.reads_until(&remote, name, &advert));
            let (command, commit) = remote
                .lock_commit(name, lock, meta, &lock_ref, until)
                .await?;
            // (An advertisement lists every ref: the state ref's tip or absence is known.)
            let proving = branch
                .and_then(|branch| self.proving(&remote, at, name, (branch, commit.id), until));
            let pushed = remote
                .push_lock((command, commit.objects), proving, false)
                .await?;
            // (Only a push at the floor goes unanswered: look again.)
            let Some(pushed) = pushed else {
                last_attempt = attempt_started.elapsed();
                continue;
            };
            let Some(report) = pushed.settle(&remote, &lock_ref).await else {
                if !to_record.nothing() {
                    self.record_protocol(&remote, at, meta, to_record).await;
                }
                return Ok(Acquire::Acquired);
            };
            refused = Some(report);
            last_attempt = attempt_started.elapsed();
        }
        match refused {
            Some(report) => Err(LockError::Refused {
                lock_ref,
                report: format!("{report:?}"),
            }),
            // The branch kept moving under the tree check: busy, retryable.
            None => Err(LockError::Contention {
                attempts: MAX_LOCK_ATTEMPTS,
            }),
        }
    }

    pub(super) async fn release_lock(
        &self,
        at: &Location,
        name: &StateName,
        held: &HeldLock,
    ) -> Result<Release, UnlockError> {
        let remote = self.remote(at)?;
        let Ok(old) = ObjectId::from_hex(held.token.as_bytes()) else {
            return Ok(Release::Changed);
        };
        // The delete is conditional on the lock commit that was checked: the server refuses it
        // if the lock changed meanwhile, so no fresh advertisement is needed.
        let lock_ref = self.lock_ref(name);
        let command = Command {
            old,
            new: null(),
            name: lock_ref.clone(),
        };
        // The probes of this lock (this process's LOCK's, or any seen at its commit, whichever
        // branch's address made them) go with the lock, each delete alone (see the `floor`
        // module).
        let remotes = self.remotes_of(&at.repository);
        let mut commands = vec![command.clone()];
        for probe in remotes.iter().flat_map(|r| r.probes_of(&lock_ref, old)) {
            if !commands.iter().any(|c| c.name == probe.name) {
                commands.push(probe);
            }
        }
        let updates = if commands.len() > 1 {
            Updates::EachAlone
        } else {
            Updates::Atomic
        };
        // A lock another process made: not before the reads its maker may answer from its LOCK
        // are over (see the `floor` module).
        if !remotes.iter().any(|r| r.made_lock(&lock_ref) == Some(old)) {
            remote.outwait_proof(&lock_ref, old).await?;
        }
        // Gone or changed either way: a later look asks the remote. Lock refs are the
        // repository's, so a lock taken through another branch's address is forgotten there too.
        for remote in remotes {
            if remote.made_lock(&lock_ref) == Some(old) {
                remote.remember_lock(&lock_ref, None);
            }
        }
        let (report, unanswered) = match remote
            .push_at_floor(commands.clone(), Vec::new(), updates)
            .await?
        {
            Some(report) => (report, false),
            None => (remote.push_each(commands, Vec::new()).await?, true),
        };
        Ok(if report.all_ok(&[command]) {
            Release::Released
        } else if unanswered {
            // The first push got no report (its answer lost on the way back, or an error
            // status): it may have deleted the lock, and the same delete now finds the ref
            // elsewhere. The lock asked for is gone either way (by that push, or by a
            // force-unlock); what holds the ref now is another lock, not this one to refuse.
            tracing::info!(
                lock = held.info.id(),
                "the lock's release was unanswered and the lock is gone since: released"
            );
            Release::Released
        } else {
            Release::Changed
        })
    }
}

/// A lock ref whose commit has no readable lock file still locks the state; describe it so an
/// administrator can see and force-unlock it.
fn unreadable_lock(tip: ObjectId) -> Result<LockInfo, RemoteError> {
    let json = format!(
        r#"{{"ID":"{tip}","Operation":"unknown","Info":"lock ref without a readable lock file","Who":"unknown","Version":"","Created":"","Path":""}}"#
    );
    LockInfo::parse(Bytes::from(json)).map_err(|e| Corruption::LockInfo(e.to_string()).into())
}

impl Remote {
    /// The existing branch in the way of creating `branch`, among the refs of `advert` and
    /// the branches beside it (see [`super::transport::Transport::refs_beside`]).
    pub(super) async fn branch_clash(
        &self,
        advert: &Advert,
        branch: &BranchName,
    ) -> Result<Option<Clash>, RemoteError> {
        let heads = self.transport.refs_beside(advert, "refs/heads/").await?;
        let refs = advert.refs.keys().chain(heads.refs.keys());
        Ok(branch_clash(refs.map(String::as_str), branch))
    }

    /// A new orphan commit holding `name`'s lock file, and the create-only push of it to
    /// `lock_ref` (refused by the remote if any lock is there).
    pub(super) async fn lock_commit(
        &self,
        name: &StateName,
        lock: &LockInfo,
        meta: &CommitMeta,
        lock_ref: &str,
        until: Option<super::proof::ReadsUntil>,
    ) -> Result<(Command, NewCommit), RemoteError> {
        let meta = match until {
            Some(until) => CommitMeta {
                message: until.recorded(&meta.message),
                ..meta.clone()
            },
            None => meta.clone(),
        };
        let commit = self
            .commit(None, name.lock_file(), Some(lock.as_bytes().clone()), meta)
            .await?;
        let command = Command {
            old: null(),
            new: commit.id,
            name: lock_ref.to_owned(),
        };
        Ok((command, commit))
    }

    /// The lock the lock commit `tip` records for `name`.
    pub(super) async fn held(
        &self,
        tip: ObjectId,
        name: &StateName,
    ) -> Result<HeldLock, RemoteError> {
        let bytes = self.read_with(tip, name.lock_file(), true).await?;
        let info = bytes
            .and_then(|b| LockInfo::parse(Bytes::from(b)).ok())
            .map_or_else(|| unreadable_lock(tip), Ok)?;
        let cache = self.cache.clone();
        let (message, created) = blocking(move || cache.commit_summary(tip)).await?;
        Ok(HeldLock {
            info,
            token: tip.to_string(),
            owner: user_from_message(&message),
            created: Some(created),
        })
    }
}
