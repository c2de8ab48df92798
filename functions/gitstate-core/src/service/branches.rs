//! The branch rules: a branch is never created by accident, and a branch that holds no states
//! beside branches that do never reads as "no state" nor takes a first state.

use super::{Backend, ServiceError};
use crate::ports::{Beside, BranchStatus, Location};
use crate::{ReadContext, StateName};

impl Backend {
    /// The rule that a branch is never created by accident: `Ok` when the branch of `at` exists,
    /// when the repository is empty (nothing but gitstate's own refs), or when the deployment
    /// allows creating branches; otherwise [`ServiceError::NoBranch`] naming the remote's default
    /// branch and the setting that chose this one. Creating the configured branch
    /// (`GITSTATE_REF`, not an allowlisted `?ref=`, whose allowlist says which may be made) is
    /// allowed only while no other branch holds states: else
    /// [`ServiceError::BranchBesideStates`] names those (one fetch of their tips' trees, on this
    /// path only). A location passed once is not looked at again.
    pub async fn require_branch(
        &self,
        at: &Location,
        read: &ReadContext,
    ) -> Result<(), ServiceError> {
        if self.branches.lock().is_ok_and(|known| known.contains(at)) {
            return Ok(());
        }
        match self.store.branch_status(at, read).await? {
            BranchStatus::Missing { default, others }
                if !others.is_empty() && !self.create_branches =>
            {
                Err(ServiceError::NoBranch {
                    branch: at.branch.as_str().to_owned(),
                    default,
                    setting: if at.branch == self.repositories.default_branch {
                        "GITSTATE_REF"
                    } else {
                        "the address's ?ref="
                    },
                })
            }
            BranchStatus::Missing { others, .. }
                if !others.is_empty() && self.may_start_beside(at) =>
            {
                self.beside_states(at, Beside::States, read).await?;
                self.branch_seen(at);
                Ok(())
            }
            BranchStatus::Exists | BranchStatus::Missing { .. } => {
                self.branch_seen(at);
                Ok(())
            }
        }
    }

    /// Whether `GITSTATE_CREATE_REF` may start the branch of `at`, the configured one, beside
    /// others: only where none holds states. (An allowlisted `?ref=` is an environment, whose
    /// states share names with the other environments' by design.)
    pub(super) fn may_start_beside(&self, at: &Location) -> bool {
        self.create_branches && at.branch == self.repositories.default_branch
    }

    /// [`ServiceError::BranchBesideStates`] when another branch holds what `look` asks for.
    async fn beside_states(
        &self,
        at: &Location,
        look: Beside<'_>,
        read: &ReadContext,
    ) -> Result<(), ServiceError> {
        let holding = self.store.branches_with_states(at, look, read).await?;
        if holding.is_empty() {
            return Ok(());
        }
        Err(ServiceError::BranchBesideStates {
            branch: at.branch.as_str().to_owned(),
            holding: short_names(&holding),
        })
    }

    /// For a read of `name` that found no state on the configured branch: never "no state"
    /// where the state is kept on another branch. Where `GITSTATE_CREATE_REF` may start the
    /// branch or did, a file by that name (or a near name) on a branch without the state index
    /// is a state there (terraform-backend-git's have any name, most often `.json`); branches
    /// with the index are gitstate's, environments among them, whose states share names by
    /// design. And see [`Backend::states_here`], which also counts such a file.
    pub(super) async fn absent_here(
        &self,
        at: &Location,
        name: &StateName,
        read: &ReadContext,
    ) -> Result<(), ServiceError> {
        if self.may_start_beside(at) {
            self.beside_states(at, Beside::SeedState(name), read)
                .await?;
        }
        self.states_here(at, Beside::Instead(Some(name)), read)
            .await
    }

    /// The configured branch holds no states of its own while other branches hold what `look`
    /// asks for: [`ServiceError::StatesElsewhere`] for a read that finds no state and for a
    /// write. Free where the branch holds states (what the request already saw says so); one
    /// look at the other branches otherwise. An allowlisted `?ref=` is an environment: never
    /// asked.
    pub(super) async fn states_here(
        &self,
        at: &Location,
        look: Beside<'_>,
        read: &ReadContext,
    ) -> Result<(), ServiceError> {
        if at.branch != self.repositories.default_branch {
            return Ok(());
        }
        let holding = self.store.branches_with_states(at, look, read).await?;
        if holding.is_empty() {
            return Ok(());
        }
        Err(ServiceError::StatesElsewhere {
            branch: at.branch.as_str().to_owned(),
            holding: short_names(&holding),
        })
    }

    /// For start-up checks: while the branch of `at` holds no states, the branches (short names)
    /// that hold them instead; reads there that find no state and writes are refused
    /// ([`ServiceError::StatesElsewhere`]).
    pub async fn states_instead(
        &self,
        at: &Location,
        read: &ReadContext,
    ) -> Result<Vec<String>, ServiceError> {
        let holding = self
            .store
            .branches_with_states(at, Beside::Instead(None), read)
            .await?;
        Ok(short_names(&holding))
    }

    /// Remember that the branch of `at` exists (or may be created): it is not looked for again.
    pub(super) fn branch_seen(&self, at: &Location) {
        if let Ok(mut known) = self.branches.lock() {
            known.insert(at.clone());
        }
    }
}

/// Branches' short names (`main` for `refs/heads/main`).
fn short_names(branches: &[String]) -> Vec<String> {
    branches
        .iter()
        .map(|b| b.trim_start_matches("refs/heads/").to_owned())
        .collect()
}
