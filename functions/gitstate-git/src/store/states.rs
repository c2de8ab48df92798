//! State refs on the read side (issue 27, see `known`): a state exists when the branch has its
//! file, and its newest content is its state ref's tip when it has one, else the branch's file.
//! A state ref whose state the branch lacks is a leftover (a delete whose second push failed):
//! reads answer "no such state".

use std::collections::HashMap;

use gix::ObjectId;

use gitstate_core::fold::FOLDED_PATH;
use gitstate_core::index::{INDEX_PATH, StateIndex};
use gitstate_core::ports::{Location, Revision};
use gitstate_core::{ReadContext, StateName};

use super::known::{is_state_ref_of, states_of};
use super::remote::Remote;
use super::{GitStore, blocking};
use crate::protocol::{Advert, Service};
use crate::repository::{Cache, Corruption};
use crate::store::RemoteError;
use crate::sync::lock;

/// The ref that holds a state's newest content, and its tip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The state's own ref, or the branch (full ref names).
    pub name: String,
    pub tip: ObjectId,
}

impl GitStore {
    /// Which ref and tip hold `name`'s newest content as this process knows it, without asking
    /// the remote: its state ref when this process saw one, the branch tip it last saw when it
    /// saw every ref and no state ref of `name` among them. `None`: this process does not know.
    ///
    /// Knowing that a state has no state ref is as of the last listing of every ref: another
    /// process may have created one since, and a push cannot assert that a ref is absent without
    /// creating it. A caller that asserts the branch tip proves only that the branch did not move.
    pub fn holder(&self, at: &Location, name: &StateName) -> Result<Option<Holder>, RemoteError> {
        let remote = self.remote(at)?;
        let state = remote.state_ref(name.as_str());
        let known = lock(&remote.known_states).tip(&state);
        Ok(match known {
            Some(Some(tip)) => Some(Holder { name: state, tip }),
            Some(None) => remote.cached_tip()?.map(|tip| Holder {
                name: at.branch.full_ref(),
                tip,
            }),
            None => None,
        })
    }
}

impl GitStore {
    /// The advertised branch tip (fetched into the cache) and, when the branch has the file at
    /// `path` and a state ref of it is advertised, that ref's tip (fetched too).
    pub(super) async fn branch_and_state(
        &self,
        remote: &Remote,
        at: &Location,
        path: &str,
    ) -> Result<(Option<ObjectId>, Option<ObjectId>), RemoteError> {
        let branch = at.branch.full_ref();
        let state = remote.state_ref(path);
        let advert = remote
            .refs(Service::UploadPack, vec![branch.clone(), state.clone()])
            .await?;
        let Some(tip) = advert.tip(&branch) else {
            // Deleted outside gitstate while its states' refs remain: no history is the
            // history of no state, which these states are not.
            if advert.tip(&state).is_some() || remote.states_remain().await? {
                return Err(RemoteError::BranchLost(branch));
            }
            return Ok((None, None));
        };
        remote.ensure(vec![tip]).await?;
        remote.saw_tip(tip);
        // A copy's history and versions are another branch's (see the `copies` module).
        remote.not_a_copy(tip, Some(&advert)).await?;
        let state_tip = match advert.tip(&state) {
            Some(state_tip) if remote.branch_has(tip, path).await? => {
                remote.ensure_state(vec![state_tip]).await?;
                if !remote.cache.has_file(state_tip, path)? {
                    return Err(Corruption::StateRef {
                        name: state,
                        commit: state_tip,
                        path: path.to_owned(),
                    }
                    .into());
                }
                Some(state_tip)
            }
            _ => None,
        };
        Ok((Some(tip), state_tip))
    }

    /// The advertised branch tip (fetched), and the newest revision of each of `names` whose
    /// state ref holds it (the branch has the file and a state ref of it is advertised).
    pub(super) async fn newest_of_states(
        &self,
        remote: &Remote,
        at: &Location,
        names: &[StateName],
        read: &ReadContext,
    ) -> Result<(Option<ObjectId>, HashMap<String, Revision>), RemoteError> {
        let branch = at.branch.full_ref();
        let wanted = std::iter::once(branch.clone())
            .chain(names.iter().map(|name| remote.state_ref(name.as_str())))
            .collect();
        // (A list's own look, made in this request, lists every ref these need.)
        let advert = match remote.reusable_advert(read) {
            Some((advert, _)) => advert,
            None => remote.refs(Service::UploadPack, wanted).await?,
        };
        let Some(tip) = advert.tip(&branch) else {
            return Ok((None, HashMap::new()));
        };
        let states: Vec<(String, ObjectId)> = names
            .iter()
            .filter_map(|name| {
                let tip = advert.tip(&remote.state_ref(name.as_str()))?;
                Some((name.to_string(), tip))
            })
            .collect();
        remote
            .ensure(
                std::iter::once(tip)
                    .chain(states.iter().map(|(_, t)| *t))
                    .collect(),
            )
            .await?;
        remote.saw_tip(tip);
        let cache = remote.cache.clone();
        let newest = blocking(move || {
            let mut newest = HashMap::new();
            for (path, state_tip) in states {
                if cache.has_file(tip, &path)? {
                    let revision = cache.revision(state_tip, &path)?;
                    newest.insert(path, revision);
                }
            }
            Ok(newest)
        })
        .await?;
        Ok((Some(tip), newest))
    }
}

impl Remote {
    /// The state refs `advert` lists, with those a repository lists only when asked for.
    pub(super) async fn state_tips(
        &self,
        advert: &Advert,
    ) -> Result<HashMap<String, ObjectId>, RemoteError> {
        let beside = self
            .transport
            .refs_beside(advert, &states_of(&self.branch))
            .await?;
        // (An advertisement that lists every ref was noted when it came: nothing is beside it,
        // and noting that empty answer as every ref would forget every state ref.)
        let names: Vec<String> = beside.refs.keys().cloned().collect();
        if !names.is_empty() {
            self.note_states(&beside, &names);
        }
        Ok(advert
            .refs
            .iter()
            .chain(beside.refs.iter())
            .filter(|(name, _)| is_state_ref_of(&self.branch, name))
            .map(|(name, tip)| (name.clone(), *tip))
            .collect())
    }

    /// `files` (path, blob id) of a branch commit, each blob replaced by the one its state ref
    /// holds when `states` (state ref → tip, commits the cache holds) has one for its path.
    pub(super) async fn newest_blobs(
        &self,
        files: Vec<(String, ObjectId)>,
        states: &HashMap<String, ObjectId>,
    ) -> Result<Vec<(String, ObjectId)>, RemoteError> {
        if states.is_empty() {
            return Ok(files);
        }
        let (cache, branch) = (self.cache.clone(), self.branch.clone());
        let states = states.clone();
        Ok(blocking(move || {
            let repo = cache.repo()?;
            let mut files = files;
            for (path, blob) in &mut files {
                let name = super::known::state_ref(&branch, path);
                let Some(tip) = states.get(&name) else {
                    continue;
                };
                match Cache::blob_id(&repo, *tip, path)? {
                    Some(newest) => *blob = newest,
                    // A damaged ref (see `Corruption::StateRef`): reads and writes of the state
                    // fail on it; a listing of every state shows the branch's file, and says so.
                    None => tracing::warn!(
                        state_ref = %name,
                        commit = %tip,
                        path = %path,
                        "a state ref whose commit lacks the state's file: the listing shows the branch's file; reads and writes of the state fail until a person mends the ref"
                    ),
                }
            }
            Ok(files)
        })
        .await?)
    }

    /// `path` as the state ref at `state` holds it, if the branch at `tip` has the file (else
    /// the ref is a leftover: no such state). Fetches what the cache lacks. A branch file
    /// changed outside gitstate since the ref's writes is [`RemoteError::EditedOutside`]: the
    /// ref's content would hide that edit (see [`Self::edited_outside`]).
    pub(super) async fn read_state_ref(
        &self,
        tip: ObjectId,
        state: ObjectId,
        path: &str,
    ) -> Result<Option<Vec<u8>>, RemoteError> {
        if !self.branch_has(tip, path).await? {
            if self.removed_outside(tip, state, path).await? {
                return Err(RemoteError::EditedOutside(path.to_owned()));
            }
            return Ok(None);
        }
        let content = self.read_state_commit(state, path).await?;
        if self.edited_outside(tip, state, path).await? {
            return Err(RemoteError::EditedOutside(path.to_owned()));
        }
        Ok(Some(content))
    }

    /// Whether the branch at `tip`, which lacks `path`, lost it outside gitstate while the state
    /// ref at `state` holds writes the branch never had. gitstate's own delete replays the
    /// ref's writes first (the fold record names the ref's tip then), takes the state out of
    /// the index, and removes the ref (one is left over only where a host without `atomic`
    /// refused that last push). So: the state index at `tip` still names the state, with other
    /// content than the ref's (`git rm` within the fold lag); or it does not, and neither does
    /// the fold record name the ref's tip (the branch pushed back past the state, or started
    /// over). A person's removal of a state whose writes were all folded stands: `false`. Costs
    /// at most one request (the index's and the record's blobs, once per branch tip).
    pub(super) async fn removed_outside(
        &self,
        tip: ObjectId,
        state: ObjectId,
        path: &str,
    ) -> Result<bool, RemoteError> {
        self.ensure_state(vec![state]).await?;
        self.want_blobs(tip, vec![INDEX_PATH.to_owned(), FOLDED_PATH.to_owned()])
            .await?;
        let (cache, at) = (self.cache.clone(), path.to_owned());
        let on_ref = blocking(move || cache.blob_at(state, &at)).await?;
        match self.left_on_branch(tip, path).await? {
            Some(left) => Ok(on_ref.is_none_or(|on_ref| on_ref != left.as_str())),
            None => Ok(!self.folded_at(tip, state, path).await?),
        }
    }

    /// Whether the fold record at `tip` names `state` as the last write of `path` on the
    /// branch. An unreadable record is an error (see [`Cache::fold_record`]).
    async fn folded_at(
        &self,
        tip: ObjectId,
        state: ObjectId,
        path: &str,
    ) -> Result<bool, RemoteError> {
        self.want_blobs(tip, vec![FOLDED_PATH.to_owned()]).await?;
        let cache = self.cache.clone();
        let record = blocking(move || cache.fold_record(tip)).await?;
        Ok(record.last(path) == Some(state.to_string().as_str()))
    }

    /// The content the state index at `tip` says gitstate last left at `path` (`None`: the
    /// index does not name the state, or there is no index).
    async fn left_on_branch(
        &self,
        tip: ObjectId,
        path: &str,
    ) -> Result<Option<String>, RemoteError> {
        self.want_blobs(tip, vec![INDEX_PATH.to_owned()]).await?;
        let cache = self.cache.clone();
        let index = blocking(move || cache.read_path(tip, INDEX_PATH)).await?;
        Ok(index
            .as_deref()
            .and_then(StateIndex::parse)
            .and_then(|index| index.states.get(path).map(|entry| entry.content.clone())))
    }

    /// Whether the branch's file at `tip` was written outside gitstate while the state ref at
    /// `state` holds the state (a person's commit, terraform-backend-git, a restore with the git
    /// CLI). The branch's file is the ref's content, or (the branch lags the ref's unfolded
    /// writes) what gitstate last left there, which the state index at `tip` names: every commit
    /// gitstate makes records there the content it leaves, and other tools do not. An index that
    /// does not name the state (none yet, a repository of an older version) proves nothing:
    /// `false`. Costs no request unless the branch lags, then at most one (the index's blob, once
    /// per branch tip). Reads answer such a state 409; so do writes to its ref (`write::state`).
    pub(super) async fn edited_outside(
        &self,
        tip: ObjectId,
        state: ObjectId,
        path: &str,
    ) -> Result<bool, RemoteError> {
        let (cache, at) = (self.cache.clone(), path.to_owned());
        let (on_branch, on_ref) = blocking(move || {
            Ok::<_, crate::repository::Error>((
                cache.blob_at(tip, &at)?,
                cache.blob_at(state, &at)?,
            ))
        })
        .await?;
        let Some(on_branch) = on_branch.filter(|blob| Some(*blob) != on_ref) else {
            return Ok(false);
        };
        let left = self.left_on_branch(tip, path).await?;
        Ok(left.is_some_and(|left| on_branch != left.as_str()))
    }

    /// `path` as the state commit `state` holds it, for a state the branch has: a state commit
    /// without the file is a damaged ref ([`Corruption::StateRef`]), never "no state".
    pub(super) async fn read_state_commit(
        &self,
        state: ObjectId,
        path: &str,
    ) -> Result<Vec<u8>, RemoteError> {
        self.ensure_state(vec![state]).await?;
        match self.read(state, path.to_owned()).await? {
            Some(content) => Ok(content),
            None => Err(Corruption::StateRef {
                name: self.state_ref(path),
                commit: state,
                path: path.to_owned(),
            }
            .into()),
        }
    }

    /// Whether the branch commit `tip` has a file at `path` (its trees are fetched if missing).
    pub(super) async fn branch_has(&self, tip: ObjectId, path: &str) -> Result<bool, RemoteError> {
        self.ensure(vec![tip]).await?;
        let (cache, path) = (self.cache.clone(), path.to_owned());
        Ok(blocking(move || cache.has_file(tip, &path)).await?)
    }

    /// Make the cache hold the state commits `tips`, with their blobs (a state commit's tree
    /// holds one file): what the branch tip this process knows lacks comes in one request.
    pub(super) async fn ensure_state(&self, tips: Vec<ObjectId>) -> Result<(), RemoteError> {
        if tips.is_empty() {
            return Ok(());
        }
        self.ensure_changes(tips).await
    }
}
