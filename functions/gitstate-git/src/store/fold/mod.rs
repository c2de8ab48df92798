//! The fold: the writes kept on the states' own refs (`refs/gitstate/states/<sha1 of the
//! path>`), replayed onto the branch of files, one branch commit per write.
//!
//! Under the lease `refs/gitstate/fold` ([`lease`]): one advertisement (the branch, the lease,
//! every state ref), the record `.gitstate/folded.json` at the branch tip (the last state
//! commit folded per path), one fetch of the state commits that neither the branch tip nor the
//! record reaches ([`chains`]), a check per state that the branch's file is what the last fold
//! (or the write's base) left, the replays in the order of their committer times on the tip
//! (same author, committer, times, message and trailers, plus `State-commit: <id>`; the index
//! and the record updated in each), and a compare-and-swap of the branch (with the lease's
//! release in the same atomic push when the remote offers `atomic`). A lost race looks again;
//! the record makes sure no write is replayed twice, whoever folds. State refs stay.

mod background;
mod chains;
mod lease;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gix::ObjectId;

use gitstate_core::fold::{FOLDED_PATH, FoldRecord, FoldReport};
use gitstate_core::index::INDEX_PATH;
use gitstate_core::ports::Location;

use super::known::{is_state_ref_of, state_ref, states_of};
use super::remote::Remote;
use super::{FoldError, GitStore, WriteMode, blocking};
use crate::protocol::{Advert, Command, Service};
use crate::store::RemoteError;
use chains::Planned;
pub(super) use chains::replay_one;
use lease::Bid;

/// How many looks one fold takes before it leaves the rest to the next (every look after the
/// first follows a lost race or writes that came meanwhile).
const MAX_FOLD_ROUNDS: u32 = 12;

impl GitStore {
    /// Fold every state ref's unfolded writes onto the branch of `at` (see the module doc).
    pub(super) async fn fold(&self, at: &Location) -> Result<FoldReport, FoldError> {
        let remote = self.remote(at)?;
        let mut folder = Folder {
            remote,
            branch: at.branch.full_ref(),
            lease_age: self.options.fold_lease_age,
            lease: None,
            sent: None,
        };
        let outcome = folder.rounds().await;
        folder.let_go().await;
        match outcome? {
            Some(report) => Ok(report),
            None => Err(FoldError::Contention {
                attempts: MAX_FOLD_ROUNDS,
            }),
        }
    }
}

/// One fold of one branch.
struct Folder {
    remote: Arc<Remote>,
    branch: String,
    /// A lease older than this may be taken from its holder.
    lease_age: Duration,
    /// The lease commit, while this fold holds it.
    lease: Option<ObjectId>,
    /// A lease commit whose push's answer was lost: it may stand (see `lease::hold_lease`).
    sent: Option<ObjectId>,
}

/// How one round ended.
enum Round {
    /// Nothing (more) to fold, or another fold holds the lease.
    Done,
    /// Folded; look again for writes that came meanwhile.
    Folded,
    /// Look again at once.
    Again,
    /// The branch moved under the push: look again after a pause.
    Lost,
}

/// What one look at the remote found.
struct View {
    advert: Advert,
    tip: ObjectId,
    record: FoldRecord,
    /// State refs whose tip the record does not name, with their tips.
    pending: Vec<(String, ObjectId)>,
}

impl Folder {
    /// Look, fold, push, until a look finds nothing left to fold; `None`: out of rounds.
    async fn rounds(&mut self) -> Result<Option<FoldReport>, RemoteError> {
        let mut report = FoldReport::default();
        // States this fold will not fold (refused, or left over by a delete): not a reason to
        // look again.
        let mut settled: HashSet<(String, ObjectId)> = HashSet::new();
        let mut losses = 0;
        for _ in 0..MAX_FOLD_ROUNDS {
            let started = Instant::now();
            match self.round(&mut settled, &mut report).await {
                Ok(Round::Done) => return Ok(Some(report)),
                Ok(Round::Folded) => losses = 0,
                Ok(Round::Again) => {}
                Ok(Round::Lost) => {
                    losses += 1;
                    tokio::time::sleep(super::write::backoff(losses + 1, started.elapsed())).await;
                }
                // A tip that moved between the look and a fetch ("not our ref"), a remote that
                // hiccuped: look again.
                Err(error) if error.is_transient() => {
                    tracing::debug!(error = %gitstate_core::report::chain(&error), "fold round failed, looking again");
                    losses += 1;
                    tokio::time::sleep(super::write::backoff(losses + 1, started.elapsed())).await;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(None)
    }

    /// One look and what follows from it.
    async fn round(
        &mut self,
        settled: &mut HashSet<(String, ObjectId)>,
        report: &mut FoldReport,
    ) -> Result<Round, RemoteError> {
        let Some(view) = self.look(settled).await? else {
            return Ok(Round::Done);
        };
        match self.hold_lease(&view.advert).await? {
            Bid::Held => {}
            Bid::Busy => {
                report.busy = true;
                return Ok(Round::Done);
            }
            Bid::Again => return Ok(Round::Again),
        }
        let planned = chains::plan(&self.remote, &view).await?;
        for name in &planned.refused {
            if !report.refused.contains(name) {
                tracing::warn!(state = %name, "not folded: its file on the branch is not what the last fold left");
                report.refused.push(name.clone());
            }
        }
        settled.extend(planned.settled.iter().cloned());
        if planned.order.is_empty() {
            return Ok(Round::Again);
        }
        if !self.push(&view, &planned).await? {
            return Ok(Round::Lost);
        }
        report.writes += planned.order.len();
        report.states += planned.states();
        Ok(Round::Folded)
    }

    /// The branch, the lease and every state ref, and the record at the tip. `None`: nothing
    /// to fold (no branch, no state ref, or every state ref's tip folded or settled).
    async fn look(
        &mut self,
        settled: &HashSet<(String, ObjectId)>,
    ) -> Result<Option<View>, RemoteError> {
        let remote = &self.remote;
        let names = vec![self.branch.clone(), lease::LEASE_REF.to_owned()];
        let mut advert = remote.refs(Service::ReceivePack, names).await?;
        let beside = remote
            .transport
            .refs_beside(&advert, &states_of(&self.branch))
            .await?;
        advert.refs.extend(beside.refs);
        if self.lease.is_some() && advert.tip(lease::LEASE_REF) != self.lease {
            // Taken over (this fold ran past the lease's age): bid again.
            self.lease = None;
        }
        let Some(tip) = advert.tip(&self.branch) else {
            return Ok(None);
        };
        let states: Vec<(String, ObjectId)> = advert
            .refs
            .iter()
            .filter(|(name, _)| is_state_ref_of(&self.branch, name))
            .map(|(name, id)| (name.clone(), *id))
            .filter(|state| !settled.contains(state))
            .collect();
        if states.is_empty() {
            return Ok(None);
        }
        let record = self.record_at(tip).await?;
        let folded: HashMap<String, &str> = record
            .0
            .iter()
            .map(|(path, commit)| (state_ref(&self.branch, path), commit.as_str()))
            .collect();
        let mut pending: Vec<(String, ObjectId)> = states
            .into_iter()
            .filter(|(name, id)| folded.get(name) != Some(&id.to_string().as_str()))
            .collect();
        pending.sort();
        Ok((!pending.is_empty()).then_some(View {
            advert,
            tip,
            record,
            pending,
        }))
    }

    /// The fold record at `tip` (fetched with the tip's trees and the index when missing).
    async fn record_at(&self, tip: ObjectId) -> Result<FoldRecord, RemoteError> {
        let remote = &self.remote;
        remote.ensure(vec![tip]).await?;
        remote.saw_tip(tip);
        remote
            .want_blobs(tip, vec![FOLDED_PATH.to_owned(), INDEX_PATH.to_owned()])
            .await?;
        let cache = remote.cache.clone();
        Ok(blocking(move || cache.fold_record(tip)).await?)
    }

    /// Push the replays: the branch from the tip looked at to the last replay, and, on a remote
    /// that pushes atomically, the lease's release with it. Whether it landed.
    async fn push(&mut self, view: &View, planned: &Planned) -> Result<bool, RemoteError> {
        let mut commands = vec![Command {
            old: view.tip,
            new: planned.head,
            name: self.branch.clone(),
        }];
        let release = self
            .lease
            .filter(|_| WriteMode::of(&view.advert) == WriteMode::Atomic);
        if let Some(lease) = release {
            commands.push(lease::release(lease));
        }
        let report = self
            .remote
            .push(commands.clone(), planned.objects.clone())
            .await?;
        if !report.all_ok(&commands) {
            tracing::debug!(?report, "fold push lost a race");
            return Ok(false);
        }
        self.remote.saw_tip(planned.head);
        if release.is_some() {
            self.lease = None;
        }
        tracing::info!(
            writes = planned.order.len(),
            states = planned.states(),
            "folded state refs onto the branch"
        );
        Ok(true)
    }
}
