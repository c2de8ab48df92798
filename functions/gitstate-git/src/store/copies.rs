//! A branch copied under another name (`git push origin prod:refs/heads/staging`, or a new
//! branch made from a branch of states in the host's web page) serves the other branch's states
//! as its own: a plan there would act on the other branch's resources. Every commit the store
//! makes names its branch (the `Branch` trailer). A tip whose newest such commit names another
//! branch, which still exists and keeps the same states (it is that very tip, or the same
//! lineage under the same name in both indexes), is a copy: reads and writes there are refused.
//! A branch renamed (the old name is gone), or a name taken again by an unrelated branch, is
//! not. The look costs nothing where the tip names its own branch: one commit of the cache.

use gix::ObjectId;

use gitstate_core::ReadContext;
use gitstate_core::index::{INDEX_PATH, StateIndex};

use super::remote::Remote;
use super::{RemoteError, blocking};
use crate::repository::Marker;
use crate::sync::lock;

/// How many commits of a tip's first-parent line are looked at for the branch they name:
/// commits made by other tools on top of a copy (a README edit) do not hide it.
const MARKER_DEPTH: u32 = 20;

impl Remote {
    /// Refuses the branch at `tip` when it is a copy of another branch (see the module). The
    /// answer for the newest tip that is not is remembered.
    pub(super) async fn not_a_copy(
        &self,
        tip: ObjectId,
        read: &ReadContext,
    ) -> Result<(), RemoteError> {
        if *lock(&self.not_a_copy) == Some(tip) {
            return Ok(());
        }
        let marker = self.marker(tip).await?;
        let own = self
            .branch
            .strip_prefix("refs/heads/")
            .unwrap_or(&self.branch);
        if let Some(name) = marker.filter(|name| name != own) {
            let other = format!("refs/heads/{name}");
            let (advert, _) = self.every_ref(read).await?;
            let copy = match advert.tip(&other) {
                None => false,
                Some(theirs) => theirs == tip || self.same_states(tip, theirs).await?,
            };
            if copy {
                return Err(RemoteError::BranchCopied {
                    branch: self.branch.clone(),
                    of: other,
                });
            }
        }
        *lock(&self.not_a_copy) = Some(tip);
        Ok(())
    }

    /// The branch the commits on `tip` were made for. Where the cache's history ends before a
    /// commit names one (commits of other tools on top of a shallow fetch), it is fetched deeper
    /// once, up to [`MARKER_DEPTH`] commits.
    async fn marker(&self, tip: ObjectId) -> Result<Option<String>, RemoteError> {
        let walk = || {
            let cache = self.cache.clone();
            blocking(move || cache.branch_marker(tip, MARKER_DEPTH as usize))
        };
        let mut marker = walk().await?;
        if let Marker::Shallow { boundary } = marker
            && self.transport.deepens()
        {
            self.deepen(tip, boundary, MARKER_DEPTH).await?;
            marker = walk().await?;
        }
        Ok(match marker {
            Marker::Named(branch) => Some(branch),
            Marker::Unnamed | Marker::Shallow { .. } => None,
        })
    }

    /// Whether the indexes at `ours` and `theirs` keep a state under one name with one lineage:
    /// the same Terraform state, kept twice.
    async fn same_states(&self, ours: ObjectId, theirs: ObjectId) -> Result<bool, RemoteError> {
        self.ensure(vec![theirs]).await?;
        let index = |bytes: Option<Vec<u8>>| bytes.as_deref().and_then(StateIndex::parse);
        let Some(ours) = index(self.read(ours, INDEX_PATH.to_owned()).await?) else {
            return Ok(false);
        };
        let Some(theirs) = index(self.read(theirs, INDEX_PATH.to_owned()).await?) else {
            return Ok(false);
        };
        Ok(ours.states.iter().any(|(name, entry)| {
            entry.lineage.is_some()
                && theirs
                    .states
                    .get(name)
                    .is_some_and(|other| other.lineage == entry.lineage)
        }))
    }
}
