//! The protocol floor: pushes without a fresh ref advertisement when this process already knows
//! the receive-pack capabilities, the branch tip (in its cache) and the lock commit it made.
//!
//! Every such push is conditional on what it assumes, so the server, not the advertisement,
//! decides: a create-only lock fails when a lock exists, a compare-and-swap write fails when the
//! tip moved (atomically with the unchanged lock ref), a delete fails when the lock changed. A
//! refused push makes the caller run the normal path (advertise, re-read, retry). A remote that
//! answers such a push with an error rather than a report is not pushed to at the floor again.

use std::time::Duration;

use gix::ObjectId;

use gitstate_core::ports::{CommitMeta, HeldLock, Location};
use gitstate_core::{LockInfo, StateName};

use super::remote::Remote;
use super::{GitStore, blocking};
use crate::Error;
use crate::protocol::{Advert, Command, PushReport};
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
    pub(super) fn cached_tip(&self) -> Result<Option<ObjectId>, Error> {
        match self.recent_tip(Duration::MAX) {
            Some(tip) if self.cache.has(tip)? => Ok(Some(tip)),
            _ => Ok(None),
        }
    }

    /// The lock commit this process made at `lock_ref`, if it made one and has not seen it go.
    pub(super) fn made_lock(&self, lock_ref: &str) -> Option<ObjectId> {
        lock(&self.made_locks).get(lock_ref).copied()
    }

    pub(super) fn remember_lock(&self, lock_ref: &str, commit: Option<ObjectId>) {
        let mut made = lock(&self.made_locks);
        match commit {
            Some(commit) => {
                if made.len() >= MAX_REMEMBERED_LOCKS {
                    made.clear();
                }
                made.insert(lock_ref.to_owned(), commit);
            }
            None => {
                made.remove(lock_ref);
            }
        }
    }

    /// A push at the floor: `Ok(None)` when the remote answered it with an error instead of a
    /// report (it wants a fresh advertisement first), and the floor is off for this remote.
    pub(super) async fn push_at_floor(
        &self,
        commands: Vec<Command>,
        objects: Vec<ObjectId>,
    ) -> Result<Option<PushReport>, Error> {
        match self.push(commands, objects).await {
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
    /// LOCK at the floor: one create-only push, when the tree this process last saw has no clash.
    /// `false`: not tried or refused (a lock exists, or its ref clashes): the normal path looks.
    pub(super) async fn lock_at_floor(
        &self,
        remote: &Remote,
        name: &StateName,
        lock: &LockInfo,
        meta: &CommitMeta,
    ) -> Result<bool, Error> {
        if remote.floor_caps().is_none() {
            return Ok(false);
        }
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
        match remote
            .push_at_floor(vec![command.clone()], commit.objects)
            .await?
        {
            Some(report) if report.all_ok(&[command]) => {
                remote.remember_lock(&lock_ref, Some(commit.id));
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// The lock this process made for `name`, read from its cache without asking the remote.
    pub(super) async fn known_lock(
        &self,
        at: &Location,
        name: &StateName,
    ) -> Result<Option<HeldLock>, Error> {
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
