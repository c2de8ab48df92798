//! The push of a round of branch writes: the chain's compare-and-swap, with the lock refs the
//! writes rest on and the state refs they remove; on a remote without `atomic`, a ref left over
//! by a delete goes first on its own, and a deleted state's ref after the branch moved.

use gix::ObjectId;

use gitstate_core::ports::Written;

use super::queue::Stage;
use crate::protocol::{Command, Updates};
use crate::store::RemoteError;
use crate::store::remote::Remote;
use crate::store::{WriteMode, null};
use crate::sync::lock;

/// The state refs a round's push removes, by when.
pub(super) struct RefCommands {
    /// In the push itself (atomic).
    pub(super) with: Vec<Command>,
    /// Without `atomic`: before the branch moves, each alone.
    before: Vec<Command>,
    /// Without `atomic`: once the branch moved, each alone.
    after: Vec<Command>,
}

impl RefCommands {
    /// `refs` (each with whether it must go before the branch moves) as `mode` pushes them.
    pub(super) fn of(refs: &[(Command, bool)], mode: WriteMode) -> Self {
        let mut commands = Self {
            with: Vec::new(),
            before: Vec::new(),
            after: Vec::new(),
        };
        for (command, first) in refs {
            let list = match (mode, first) {
                (WriteMode::Atomic, _) => &mut commands.with,
                (WriteMode::BranchOnly, true) => &mut commands.before,
                (WriteMode::BranchOnly, false) => &mut commands.after,
            };
            list.push(command.clone());
        }
        commands
    }

    /// Without a branch to move: every ref goes alone, at once (see [`remove_after`]); those
    /// left over.
    pub(super) async fn remove_alone(self, remote: &Remote) -> Vec<String> {
        let mut all = self.with;
        all.extend(self.before);
        all.extend(self.after);
        remove_after(remote, all).await
    }

    fn names(&self) -> impl Iterator<Item = &String> {
        self.with
            .iter()
            .chain(&self.before)
            .chain(&self.after)
            .map(|c| &c.name)
    }
}

/// A round's push.
pub(super) struct Pushing {
    /// The branch tip the round started from.
    pub(super) tip: Option<ObjectId>,
    /// No fresh advertisement: a push at the protocol floor.
    pub(super) floor: bool,
    pub(super) head: ObjectId,
    /// The branch's compare-and-swap, the lock refs and the state refs that go with it.
    pub(super) commands: Vec<Command>,
    pub(super) objects: Vec<ObjectId>,
    pub(super) refs: RefCommands,
}

/// How a round's push ended (see [`push_chain`]).
pub(super) struct ChainEnd {
    /// Refused after an advertisement: what the remote said.
    pub(super) lost: Option<String>,
    /// State refs a delete could not remove after the branch moved.
    pub(super) left: Vec<String>,
    /// The remote's report refused the chain's commits: none of them landed by this push (a
    /// push with no report, or one the host answered with an error, may have).
    pub(super) refused: bool,
}

/// Push the chain with compare-and-swap on the round's tip, atomically with the unchanged lock
/// refs when the remote allows, and move the writes `Pushing` their commits on: `Done` if it
/// landed, else `Fresh` (the next round advertises). Refused at the floor, or by a remote that
/// wants an advertisement first: `None`. Refused after an advertisement (another writer moved
/// the branch, a lock changed, or the remote would not take it): what the remote said. Also the
/// state refs a delete could not remove after the branch moved (left over; see the module doc).
pub(super) async fn push_chain(
    remote: &Remote,
    pushing: Pushing,
    stages: &mut [Stage],
) -> Result<ChainEnd, RemoteError> {
    let Pushing {
        tip,
        floor,
        head,
        commands,
        objects,
        refs,
    } = pushing;
    {
        // Whatever the answer, this process does not know these refs any more until it looks.
        let mut looks = lock(&remote.looks);
        for name in refs.names() {
            looks.unknown(name, tip.unwrap_or_else(null));
        }
    }
    if !refs.before.is_empty() {
        let report = remote.push_each(refs.before.clone(), Vec::new()).await?;
        if !report.all_ok(&refs.before) {
            land(stages, false);
            return Ok(ChainEnd {
                lost: Some(reason(&report)),
                left: Vec::new(),
                refused: true,
            });
        }
    }
    let report = if floor {
        match remote
            .push_at_floor(commands.clone(), objects, Updates::Atomic)
            .await?
        {
            Some(report) if report.all_ok(&commands) => report,
            answer => {
                land(stages, false);
                return Ok(ChainEnd {
                    lost: None,
                    left: Vec::new(),
                    refused: answer.is_some_and(|report| refused_head(&report, &commands)),
                });
            }
        }
    } else {
        remote.push(commands.clone(), objects).await?
    };
    if report.all_ok(&commands) {
        remote.saw_tip(head);
        land(stages, true);
        return Ok(ChainEnd {
            lost: None,
            left: remove_after(remote, refs.after).await,
            refused: false,
        });
    }
    tracing::debug!(?report, "write push lost a race");
    land(stages, false);
    Ok(ChainEnd {
        lost: Some(reason(&report)),
        left: Vec::new(),
        refused: refused_head(&report, &commands),
    })
}

/// Whether `report` refused the branch's update, the first of `commands`: its chain did not
/// land (with `atomic`, nothing did; without, the branch did not move to it).
fn refused_head(report: &crate::protocol::PushReport, commands: &[Command]) -> bool {
    !report.verdicts(commands).first().copied().unwrap_or(false)
}

/// What the remote said of the first ref it refused.
fn reason(report: &crate::protocol::PushReport) -> String {
    report
        .refs
        .iter()
        .find_map(|(name, status)| status.as_ref().err().map(|why| format!("{name}: {why}")))
        .unwrap_or_else(|| "no report for the branch".into())
}

/// The refs of deleted states, removed once the branch moved (without `atomic`); those left
/// over. A ref left over holds only writes the delete carried onto the branch (the fold record
/// names its tip): it reads as no state, and the next create removes it.
async fn remove_after(remote: &Remote, after: Vec<Command>) -> Vec<String> {
    if after.is_empty() {
        return Vec::new();
    }
    let left: Vec<String> = match remote.push_each(after.clone(), Vec::new()).await {
        Ok(report) => after
            .iter()
            .filter(|c| !report.all_ok(std::slice::from_ref(*c)))
            .map(|c| c.name.clone())
            .collect(),
        Err(error) => {
            tracing::warn!(error = %gitstate_core::report::chain(&error), "a deleted state's ref was left over");
            after.iter().map(|c| c.name.clone()).collect()
        }
    };
    if !left.is_empty() {
        // A delete's own removal (the ref moved since: a later round decides again), or one
        // after the branch moved (left over: the next create removes it).
        tracing::warn!(
            ?left,
            "state refs not removed: moved since the round looked, or refused by the remote"
        );
    }
    left
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
