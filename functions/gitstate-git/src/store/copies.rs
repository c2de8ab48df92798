//! A branch copied under another name (`git push origin prod:refs/heads/staging`, or a new
//! branch made from a branch of states in the host's web page) serves the other branch's states
//! as its own: a plan there would act on the other branch's resources. Every commit the store
//! makes names its branch (the `Branch` trailer). A tip is a copy when
//! - its newest commit that names a branch names another one, which still exists and keeps the
//!   same states: it is that very tip, or both indexes keep one name with one lineage; or
//! - whatever its commits name (nothing, in a repository written before the trailer), another
//!   branch listed beside it has this very tip, and the tip keeps states.
//!
//! Reads of states, the list of states, histories and versions, and writes there are refused
//! (reads of the access file and other config are not: they are the original's, and refusing
//! them would refuse every route). A branch renamed (the old name is gone), or a
//! name taken again by an unrelated branch, is not a copy. Where the tip names its own branch
//! the look costs one commit of the cache and no request.

use gix::ObjectId;

use gitstate_core::ReadContext;
use gitstate_core::index::{INDEX_PATH, StateIndex};

use super::remote::Remote;
use super::{RemoteError, blocking};
use crate::protocol::Advert;
use crate::repository::Marker;
use crate::sync::lock;

/// How many commits of a tip's first-parent line are looked at for the branch they name:
/// commits made by other tools on top of a copy (a README edit) do not hide it.
const MARKER_DEPTH: u32 = 20;

impl Remote {
    /// Refuses the branch at `tip` when it is a copy of another branch (see the module).
    /// `advert`: an advertisement at hand that lists every branch (a hosted remote's), for
    /// the branches beside it; without one (a read or write at the floor), one is asked for
    /// only when a commit names another branch, or when no commit the cache holds names one
    /// (only the branches beside it can tell such a tip from a copy). The answer for the newest
    /// tip that is no copy is remembered.
    pub(super) async fn not_a_copy(
        &self,
        tip: ObjectId,
        advert: Option<&Advert>,
    ) -> Result<(), RemoteError> {
        if *lock(&self.not_a_copy) == Some(tip) {
            return Ok(());
        }
        let listed;
        let advert = match advert {
            None if self.marker(tip, false).await?.is_none() => {
                listed = self.every_ref(&ReadContext::no_request()).await?.0;
                Some(&listed)
            }
            advert => advert,
        };
        let own = self.branch.as_str();
        let beside: Vec<(String, ObjectId)> = advert.map_or_else(Vec::new, |advert| {
            advert
                .refs
                .iter()
                .filter(|(name, _)| name.starts_with("refs/heads/") && **name != own)
                .filter(|(name, _)| !name.starts_with(&self.lock_prefix))
                .map(|(name, tip)| (name.clone(), *tip))
                .collect()
        });
        let named = self.marker(tip, !beside.is_empty()).await?;
        let original = match named.as_deref() {
            Some(name) if format!("refs/heads/{name}") == own => None,
            Some(name) => self.named_original(tip, name, advert).await?,
            // Unnamed: a branch beside it at this very tip, while the tip keeps states.
            None => match beside.iter().find(|(_, at)| *at == tip) {
                Some((other, _)) if self.keeps_states(tip).await? => Some(other.clone()),
                _ => None,
            },
        };
        if let Some(of) = original {
            return Err(RemoteError::BranchCopied {
                branch: self.branch.clone(),
                of,
            });
        }
        *lock(&self.not_a_copy) = Some(tip);
        Ok(())
    }

    /// The branch `name` (short) that a commit on `tip` was made for, when it still exists and
    /// keeps the states `tip` keeps.
    async fn named_original(
        &self,
        tip: ObjectId,
        name: &str,
        advert: Option<&Advert>,
    ) -> Result<Option<String>, RemoteError> {
        let other = format!("refs/heads/{name}");
        let theirs = match advert {
            Some(advert) => advert.tip(&other),
            None => self
                .every_ref(&ReadContext::no_request())
                .await?
                .0
                .tip(&other),
        };
        let copy = match theirs {
            None => false,
            Some(theirs) if theirs == tip => self.keeps_states(tip).await?,
            Some(theirs) => self.same_states(tip, theirs).await?,
        };
        Ok(copy.then_some(other))
    }

    /// The branch the commits on `tip` were made for. Where the cache's history ends before a
    /// commit names one (commits of other tools on top of a shallow fetch) and other branches
    /// are `beside` it, it is fetched deeper once, up to [`MARKER_DEPTH`] commits.
    async fn marker(&self, tip: ObjectId, beside: bool) -> Result<Option<String>, RemoteError> {
        let walk = || {
            let cache = self.cache.clone();
            blocking(move || cache.branch_marker(tip, MARKER_DEPTH as usize))
        };
        let mut marker = walk().await?;
        if let Marker::Shallow { boundary } = marker
            && beside
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

    /// Whether `tip` keeps a state: an entry in its index, or a `.tfstate` file (the empty
    /// index and an access file alone keep none).
    async fn keeps_states(&self, tip: ObjectId) -> Result<bool, RemoteError> {
        let cache = self.cache.clone();
        let files = blocking(move || cache.list_files(tip)).await?;
        if files.iter().any(|path| path.ends_with(".tfstate")) {
            return Ok(true);
        }
        Ok(self.index(tip).await?.is_some_and(|i| !i.states.is_empty()))
    }

    async fn index(&self, tip: ObjectId) -> Result<Option<StateIndex>, RemoteError> {
        let bytes = self.read(tip, INDEX_PATH.to_owned()).await?;
        Ok(bytes.as_deref().and_then(StateIndex::parse))
    }

    /// Whether the indexes at `ours` and `theirs` keep a state under one name with one lineage:
    /// the same Terraform state, kept twice.
    async fn same_states(&self, ours: ObjectId, theirs: ObjectId) -> Result<bool, RemoteError> {
        self.ensure(vec![theirs]).await?;
        let (Some(ours), Some(theirs)) = (self.index(ours).await?, self.index(theirs).await?)
        else {
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
