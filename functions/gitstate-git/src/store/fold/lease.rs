//! The fold lease `refs/gitstate/fold`: created only if absent, so one fold runs at a time. Its
//! orphan commit names the holder and the time; a lease older than the lease age (a holder
//! that crashed, a Lambda frozen mid-fold) is taken over by compare-and-swap.

use gix::ObjectId;

use super::Folder;
use crate::protocol::{Advert, Command};
use crate::store::RemoteError;
use crate::store::{blocking, null};

/// The lease ref.
pub(in crate::store) const LEASE_REF: &str = "refs/gitstate/fold";

/// The command that lets go of `lease` (a delete, conditional on it).
pub(super) fn release(lease: ObjectId) -> Command {
    Command {
        old: lease,
        new: null(),
        name: LEASE_REF.to_owned(),
    }
}

/// Who this process is, for the lease's message: the host and the process id.
fn holder() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "unknown host".to_owned());
    format!("{host}, process {}", std::process::id())
}

/// How a bid for the lease ended.
pub(super) enum Bid {
    Held,
    /// Another fold holds it: that fold folds what waits.
    Busy,
    /// The lease changed under the bid: look again.
    Again,
}

impl Folder {
    /// Hold the lease, as `advert` shows it: keep it, create it, or take it over when it is
    /// older than the lease age.
    pub(super) async fn hold_lease(&mut self, advert: &Advert) -> Result<Bid, RemoteError> {
        if self.lease.is_some() {
            return Ok(Bid::Held);
        }
        // The lease this fold pushed, whose answer was lost, landed: it is this fold's.
        if self.sent.is_some() && advert.tip(LEASE_REF) == self.sent {
            self.lease = self.sent.take();
            return Ok(Bid::Held);
        }
        let old = match advert.tip(LEASE_REF) {
            None => null(),
            Some(held) => match self.expired(held).await {
                Ok(true) => {
                    tracing::warn!(lease = %held, "taking over a fold lease past its age");
                    held
                }
                Ok(false) => return Ok(Bid::Busy),
                // Let go of meanwhile (the remote will not send it): look again.
                Err(error) if error.is_transient() => return Ok(Bid::Again),
                Err(error) => return Err(error),
            },
        };
        let message = format!(
            "fold lease\n\nHolder: {}\nSince: {}\n",
            holder(),
            jiff::Timestamp::now()
        );
        let cache = self.remote.cache.clone();
        let commit = blocking(move || cache.orphan(&message)).await?;
        let command = Command {
            old,
            new: commit.id,
            name: LEASE_REF.to_owned(),
        };
        // Until an answer comes, the lease may be this fold's: a look that finds it takes it
        // (see above), and letting go deletes it.
        self.sent = Some(commit.id);
        let report = self
            .remote
            .push(vec![command.clone()], commit.objects)
            .await?;
        self.sent = None;
        if report.all_ok(&[command]) {
            self.lease = Some(commit.id);
            return Ok(Bid::Held);
        }
        // Another fold created it first (it folds what waits), or the lease taken over changed
        // meanwhile (look again).
        Ok(if old.is_null() { Bid::Busy } else { Bid::Again })
    }

    /// Whether the lease commit `held` is older than the lease age (by its committer time).
    async fn expired(&self, held: ObjectId) -> Result<bool, RemoteError> {
        self.remote.ensure_with(vec![held], true).await?;
        let cache = self.remote.cache.clone();
        let (_, since) = blocking(move || cache.commit_summary(held)).await?;
        let age = jiff::Timestamp::now().as_second().saturating_sub(since);
        Ok(u64::try_from(age).unwrap_or(0) >= self.lease_age.as_secs())
    }

    /// Let go of the lease if this fold still holds it. A failure only delays the next fold by
    /// the lease age: logged, not returned.
    pub(super) async fn let_go(&mut self) {
        // (A lease whose push's answer was lost is let go of too: the delete names it, so one
        // that did not land, or that another took over since, is left alone.)
        let Some(lease) = self.lease.take().or(self.sent.take()) else {
            return;
        };
        let command = release(lease);
        match self.remote.push(vec![command.clone()], Vec::new()).await {
            Ok(report) if report.all_ok(&[command]) => {}
            Ok(report) => tracing::warn!(?report, "the fold lease was not released"),
            Err(error) => tracing::warn!(
                error = %gitstate_core::report::chain(&error),
                "the fold lease was not released"
            ),
        }
    }
}
