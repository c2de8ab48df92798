//! Folds in the background of a serving process (`gitstate serve`, `gitstate run`): a push that
//! wrote a state ref marks its remote unfolded, and the write that made it starts a fold task
//! unless one runs; a task folds until no write came meanwhile, one task at a time per remote.
//! [`GitStore::finish_folds`] waits for them (the wrapper, before it exits).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gitstate_core::ports::Location;

use super::Folder;
use crate::store::GitStore;
use crate::store::remote::Remote;
use crate::sync::lock;

impl GitStore {
    /// After a write: when it wrote a state ref and this process folds in the background, make
    /// sure a fold task runs (see the module doc).
    pub(in crate::store) fn fold_after_write(&self, at: &Location) {
        if !self.options.fold_after_writes {
            return;
        }
        let Ok(remote) = self.remote(at) else {
            return;
        };
        if !remote.folds.unfolded.load(Ordering::SeqCst)
            || remote.folds.folding.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let (branch, lease_age) = (at.branch.full_ref(), self.options.fold_lease_age);
        tokio::spawn(fold_while_unfolded(remote, branch, lease_age));
    }

    /// Wait until no background fold of this process runs.
    pub(in crate::store) async fn finish_folds(&self) {
        let remotes: Vec<Arc<Remote>> = lock(&self.remotes).values().cloned().collect();
        for remote in remotes {
            while remote.folds.folding.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Fold until no write came during the last fold; then let go (and look once more at the flag,
/// for a write that came as this task let go).
async fn fold_while_unfolded(remote: Arc<Remote>, branch: String, lease_age: Duration) {
    loop {
        while remote.folds.unfolded.swap(false, Ordering::SeqCst) {
            let mut folder = Folder {
                remote: remote.clone(),
                branch: branch.clone(),
                lease_age,
                lease: None,
            };
            let outcome = folder.rounds().await;
            folder.let_go().await;
            match outcome {
                Ok(Some(report)) if report.busy => {
                    tracing::debug!("another fold holds the lease; it folds these writes");
                }
                Ok(Some(_)) => {}
                Ok(None) => tracing::warn!(
                    "a background fold ran out of rounds; the next write folds again"
                ),
                Err(error) => tracing::warn!(
                    error = %gitstate_core::report::chain(&error),
                    "a background fold failed; the next write folds again"
                ),
            }
        }
        remote.folds.folding.store(false, Ordering::SeqCst);
        if !remote.folds.unfolded.load(Ordering::SeqCst)
            || remote.folds.folding.swap(true, Ordering::SeqCst)
        {
            return;
        }
    }
}
