//! Reads at the branch tip: a state, the states under a prefix, the list with its locks, a
//! configuration file.

use std::time::Duration;

use bytes::Bytes;
use gix::ObjectId;

use gitstate_core::index::INDEX_PATH;
use gitstate_core::ports::{Beside, BranchStatus, Listing, Location};
use gitstate_core::refs::{Clash, near_name};
use gitstate_core::{ReadContext, StateName};

use super::known::{STATE_REF_PREFIX, is_others, is_state_ref_of};
use super::remote::Remote;
use super::{GitStore, ListError, ReadError, RemoteError, blocking};
use crate::protocol::Service;
use crate::repository::Cache;
use crate::sync::lock;

/// A look at the protocol record trusts a ref advertisement this recent (at start-up, the
/// branch's look just made) instead of asking again.
pub(super) const LIST_REFS_FRESH: Duration = Duration::from_secs(1);

impl GitStore {
    /// The state `name`: as the LOCK before it proved it (see the `floor` module), else at the
    /// advertised tip.
    pub(super) async fn read_state(
        &self,
        at: &Location,
        name: &StateName,
        read: &ReadContext,
    ) -> Result<Option<Bytes>, ReadError> {
        if let Some(state) = self.read_proved(at, name).await? {
            return Ok(state);
        }
        let path = name.to_string();
        Ok(self
            .read_path_with(at, path, None, read, Copies::Refused)
            .await?)
    }

    /// How this store's lock ref prefix stands against the repository's record of it.
    pub(super) async fn protocol(
        &self,
        at: &Location,
    ) -> Result<gitstate_core::protocol::Protocol, ReadError> {
        let remote = self.remote(at)?;
        // A look at start-up comes right after the branch's: one advertisement for both.
        let advert = remote
            .branch_and_prefix(
                &at.branch.full_ref(),
                gitstate_core::protocol::PROTOCOL_PREFIX,
                LIST_REFS_FRESH,
            )
            .await?;
        Ok(gitstate_core::protocol::check(
            &self.options.lock_ref_prefix,
            advert.refs.keys().map(String::as_str),
        ))
    }

    /// How `name` clashes with the files at the branch tip.
    pub(super) async fn clash(
        &self,
        at: &Location,
        name: &StateName,
    ) -> Result<Option<Clash>, ReadError> {
        let remote = self.remote(at)?;
        let Some(tip) = self.branch_tip(&remote, at).await? else {
            return Ok(None);
        };
        Ok(self.tree_clash(&remote, tip, name.as_str()).await?)
    }

    /// How `name` clashes with the files at the branch tip this process saw last (the read
    /// just made sets it), from the cache: no git request. None without such a tip.
    pub(super) async fn clash_seen(
        &self,
        at: &Location,
        name: &StateName,
    ) -> Result<Option<Clash>, ReadError> {
        let remote = self.remote(at)?;
        let Some(tip) = remote.cached_tip()? else {
            return Ok(None);
        };
        let (cache, path) = (remote.cache.clone(), name.to_string());
        Ok(blocking(move || cache.path_clash(tip, &path)).await?)
    }

    pub(super) async fn list_states(
        &self,
        at: &Location,
        prefix: &str,
    ) -> Result<Vec<StateName>, ListError> {
        let remote = self.remote(at)?;
        let branch = at.branch.full_ref();
        let advert = remote
            .refs(Service::UploadPack, vec![branch.clone()])
            .await?;
        let Some(tip) = advert.tip(&branch) else {
            return Ok(Vec::new());
        };
        remote.ensure(vec![tip]).await?;
        let cache = remote.cache.clone();
        let files = blocking(move || cache.list_files(tip)).await?;
        Ok(files
            .iter()
            .filter(|path| path.starts_with(prefix) && !path.starts_with(".gitstate/"))
            .filter_map(|path| StateName::parse(path).ok())
            .collect())
    }

    pub(super) async fn listing(
        &self,
        at: &Location,
        read: &ReadContext,
    ) -> Result<Listing, ListError> {
        let remote = self.remote(at)?;
        let branch = at.branch.full_ref();
        let prefix = self.options.lock_ref_prefix.as_str();
        // An advertisement asked for since the request began (in a cold process, the one the
        // access check just made) shows every write that finished before the request; an older
        // one may not, whatever its age.
        let mut reuse = true;
        let mut attempt = 0;
        // One advertisement, then one fetch of the tip and every lock commit the cache lacks.
        let (advert, tip, states) = loop {
            attempt += 1;
            let advert = match remote.reusable_advert(read).filter(|_| reuse) {
                Some((advert, _)) => advert,
                None => {
                    remote
                        .branch_and_prefix(&branch, prefix, Duration::ZERO)
                        .await?
                }
            };
            let tip = advert.tip(&branch);
            // The states' own refs: their tips' trees give the newest content ids.
            let states = remote.state_tips(&advert).await?;
            let wants = advert
                .refs
                .iter()
                .filter(|(name, _)| name.starts_with(prefix))
                .map(|(_, id)| *id)
                .chain(states.values().copied())
                .chain(tip)
                .collect();
            match remote.ensure(wants).await {
                Ok(()) => break (advert, tip, states),
                // A ref moved between advertisement and fetch: look again.
                Err(error) if error.refused() && attempt < 4 => {
                    tracing::debug!(error = %gitstate_core::report::chain(&error), "refs moved during a list, retrying");
                    reuse = false;
                }
                Err(other) => return Err(other.into()),
            }
        };
        // A copy's states are another branch's (see the `copies` module): not listed as its own.
        if let Some(tip) = tip {
            remote.not_a_copy(tip, Some(&advert)).await?;
        }
        let (files, index) = files_and_index(&remote, &branch, tip, &states).await?;
        let files = files
            .into_iter()
            .filter(|(path, _)| !path.starts_with(".gitstate/"))
            .filter_map(|(path, blob)| {
                Some((StateName::parse(&path).ok()?, Some(blob.to_string())))
            })
            .collect();
        let mut lock_tips: Vec<(StateName, ObjectId)> = advert
            .refs
            .iter()
            .filter_map(|(r, id)| Some((StateName::parse(r.strip_prefix(prefix)?).ok()?, *id)))
            .collect();
        lock_tips.sort();
        let mut locks = Vec::with_capacity(lock_tips.len());
        for (name, lock_tip) in lock_tips {
            let held = self.held(&remote, lock_tip, &name).await?;
            locks.push((name, held));
        }
        Ok(Listing {
            files,
            index: index.map(Bytes::from),
            locks,
        })
    }

    pub(super) async fn read_config(
        &self,
        at: &Location,
        path: &str,
        fresh_within: Duration,
        read: &ReadContext,
    ) -> Result<Option<Bytes>, ReadError> {
        let remote = self.remote(at)?;
        if let Some(tip) = remote.recent_tip(fresh_within) {
            return Ok(remote.read(tip, path.to_owned()).await?.map(Bytes::from));
        }
        // The state the request reads next, if it is one: its blob comes with this file's.
        let also = read.reads().map(ToString::to_string);
        let path = path.to_owned();
        Ok(self
            .read_path_with(at, path, also, read, Copies::Read)
            .await?)
    }

    /// Whether the branch exists; if not, the remote's default branch (its `HEAD`) and its other
    /// refs, the lock refs and gitstate's own `refs/gitstate/` left out. Over HTTP this is the
    /// upload-pack advertisement a read of the same request (`read`) made, or one made now.
    pub(super) async fn branch_status(
        &self,
        at: &Location,
        read: &ReadContext,
    ) -> Result<BranchStatus, ReadError> {
        let remote = self.remote(at)?;
        let branch = at.branch.full_ref();
        let (mut advert, mut head) = remote.every_ref(read).await?;
        if advert.tip(&branch).is_some() {
            return Ok(BranchStatus::Exists);
        }
        // Not an empty repository: the branch was deleted outside gitstate, its states' refs
        // holding them (the look that `read` reused lists every ref).
        if advert
            .refs
            .keys()
            .any(|name| is_state_ref_of(&branch, name))
        {
            return Err(RemoteError::BranchLost(branch).into());
        }
        // The look `read` reused was for pushes ([`Self::ready_to_write`]), which does not name
        // `HEAD`: the branch is missing, so ask the look that does.
        if head.is_none() && advert.is_for_pushes() {
            (advert, head) = remote.every_ref(&ReadContext::no_request()).await?;
        }
        let locks = self.options.lock_ref_prefix.as_str();
        let mut others: Vec<String> = advert
            .refs
            .into_keys()
            .filter(|r| is_others(r, locks))
            .collect();
        others.sort();
        let default = head
            .filter(|head| others.contains(head))
            .map(|head| head.trim_start_matches("refs/heads/").to_owned());
        Ok(BranchStatus::Missing { default, others })
    }

    /// Branches whose states' refs (`refs/gitstate/states/<branch>/<sha1>`) the advertisement
    /// `read` allows reusing lists, though it lists no such branch.
    pub(super) async fn stranded_state_refs(
        &self,
        at: &Location,
        read: &ReadContext,
    ) -> Result<Vec<String>, ReadError> {
        let remote = self.remote(at)?;
        let (advert, _) = remote.every_ref(read).await?;
        let mut gone: Vec<String> = advert
            .refs
            .keys()
            .filter_map(|name| {
                let (branch, _) = name.strip_prefix(STATE_REF_PREFIX)?.rsplit_once('/')?;
                let full = format!("refs/heads/{branch}");
                (is_state_ref_of(&full, name) && advert.tip(&full).is_none())
                    .then(|| branch.to_owned())
            })
            .collect();
        gone.sort();
        gone.dedup();
        Ok(gone)
    }

    /// Which branches other than that of `at` hold what `look` asks for (see [`Beside`]). For
    /// [`Beside::Instead`], the branch's own tip as the read just saw it comes first, with no
    /// request: a branch that holds states answers none at once. Otherwise the advertisement
    /// `read` allows reusing, and one fetch of the tips the cache lacks (their trees, no blobs
    /// where the host filters). Lock refs, tags and other refs hold no states. What such a look
    /// finds is remembered for [`Beside::Remembered`].
    pub(super) async fn branches_with_states(
        &self,
        at: &Location,
        look: Beside<'_>,
        read: &ReadContext,
    ) -> Result<Vec<String>, ReadError> {
        let remote = self.remote(at)?;
        let alone = !matches!(look, Beside::States | Beside::SeedState(_));
        if alone {
            let known = remote.recent_tip(Duration::MAX);
            // A tip the cache cannot open is looked at again below, from the advertisement.
            if let Some(tip) = known
                && tip_holds_states(&remote, tip).await.unwrap_or(false)
            {
                return Ok(Vec::new());
            }
            // A look of this process found no other branch holding states at the tip it
            // knows: nothing to ask. Otherwise (none made, or one that would refuse, which may
            // be stale) the look is made now.
            let beside = lock(&remote.beside).clone();
            if look == Beside::Remembered
                && (known.is_none()
                    || beside
                        .is_some_and(|(tip, holding)| Some(tip) == known && holding.is_empty()))
            {
                return Ok(Vec::new());
            }
        }
        let look = match look {
            Beside::Remembered => Beside::Instead(None),
            other => other,
        };
        let (advert, _) = remote.every_ref(read).await?;
        let own = at.branch.full_ref();
        let own_tip = advert.tip(&own);
        if alone {
            match own_tip {
                // No branch: the branch rule's case, not this one's.
                None => return Ok(Vec::new()),
                Some(_) if advert.refs.keys().any(|r| is_state_ref_of(&own, r)) => {
                    return Ok(Vec::new());
                }
                Some(tip) => {
                    remote.ensure(vec![tip]).await?;
                    if tip_holds_states(&remote, tip).await? {
                        return Ok(Vec::new());
                    }
                }
            }
        }
        let locks = &self.options.lock_ref_prefix;
        let tips: Vec<(String, ObjectId)> = advert
            .refs
            .iter()
            .filter(|(branch, _)| {
                branch.starts_with("refs/heads/") && **branch != own && !branch.starts_with(locks)
            })
            .map(|(branch, tip)| (branch.clone(), *tip))
            .collect();
        if !tips.is_empty() {
            remote
                .ensure(tips.iter().map(|(_, tip)| *tip).collect())
                .await?;
        }
        let cache = remote.cache.clone();
        let want = Want::of(look);
        let found = blocking(move || holders(&cache, tips, &want))
            .await
            .map_err(RemoteError::from)?;
        if let (true, Some(tip)) = (alone, own_tip) {
            *lock(&remote.beside) = Some((tip, found.with_states));
        }
        Ok(found.holding)
    }

    /// Before the first request of a process that is about to write (the wrapper, as it
    /// starts): one receive-pack advertisement, which lists every ref as the start-up's other
    /// looks need (within `read`, they reuse it) and carries the push capabilities, so the first
    /// LOCK may go at the floor (see the `floor` module) without an advertisement of its own:
    /// the branch tip is brought into the cache, and a protocol record that agrees is noted as
    /// a LOCK's look would. `Some(reason)`: the advertisement failed (a token or key that may
    /// only read is refused it; a remote that is down fails the start-up's next look too); the
    /// start-up's looks go on without it. `GITSTATE_REQUIRE_ATOMIC` on a remote without atomic
    /// push is an error.
    pub(super) async fn ready_to_write(
        &self,
        at: &Location,
        _read: &ReadContext,
    ) -> Result<Option<String>, ReadError> {
        let remote = self.remote(at)?;
        let branch = at.branch.full_ref();
        let looked = jiff::Timestamp::now().as_second();
        let advert = match remote
            .refs(Service::ReceivePack, vec![branch.clone()])
            .await
        {
            Ok(advert) => advert,
            // A setting this remote cannot meet: the first LOCK would fail on it.
            Err(error @ RemoteError::AtomicRequired) => return Err(error.into()),
            Err(error) => return Ok(Some(gitstate_core::report::chain(&error))),
        };
        // Notes the protocol as agreed when nothing is left to record, as a LOCK's look would;
        // a mismatch or a record to make is the first LOCK's, on its normal path.
        let _ = self.protocol_for_lock(&remote, at, &advert);
        if let Some(tip) = advert.tip(&branch) {
            // A fetch that fails here is the first LOCK's to make again, on its normal path.
            if let Err(error) = remote.ensure(vec![tip]).await {
                return Ok(Some(gitstate_core::report::chain(&error)));
            }
            remote.saw_tip(tip);
        }
        *crate::sync::lock(&remote.session_look) = Some(looked);
        Ok(None)
    }

    /// The advertised tip of the branch, fetched into the cache.
    pub(super) async fn branch_tip(
        &self,
        remote: &Remote,
        at: &Location,
    ) -> Result<Option<ObjectId>, RemoteError> {
        let branch = at.branch.full_ref();
        let advert = remote
            .refs(Service::UploadPack, vec![branch.clone()])
            .await?;
        let Some(tip) = advert.tip(&branch) else {
            return Ok(None);
        };
        remote.ensure(vec![tip]).await?;
        remote.saw_tip(tip);
        Ok(Some(tip))
    }

    /// Read `path` at the advertised branch tip, fetching the blob at `also` in the same request
    /// if the cache lacks it. An advertisement `read` may reuse (made since its request began)
    /// is used rather than asking again. `copies`: whether a copy of another branch is refused.
    async fn read_path_with(
        &self,
        at: &Location,
        path: String,
        also: Option<String>,
        read: &ReadContext,
        copies: Copies,
    ) -> Result<Option<Bytes>, RemoteError> {
        let remote = self.remote(at)?;
        let branch = at.branch.full_ref();
        let state = remote.state_ref(&path);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let advert = match remote.reusable_advert(read).filter(|_| attempt == 1) {
                Some((advert, asked)) => {
                    remote.note_looks(&advert, std::slice::from_ref(&state), asked);
                    advert
                }
                None => {
                    remote
                        .refs(Service::UploadPack, vec![branch.clone(), state.clone()])
                        .await?
                }
            };
            let state_tip = advert.tip(&state);
            let Some(tip) = advert.tip(&branch) else {
                // The branch is gone while the state's ref holds the state, or in a process
                // that saw the branch: deleted or renamed outside gitstate, never "no state".
                let locks = &self.options.lock_ref_prefix;
                return match state_tip.is_some() || remote.branch_lost(locks).await? {
                    true => Err(RemoteError::BranchLost(branch)),
                    false => Ok(None),
                };
            };
            let reading = async {
                if let Some(state_tip) = state_tip {
                    // The state's own ref holds its newest content.
                    return remote.read_state_ref(tip, state_tip, &path).await;
                }
                if let Some(also) = &also {
                    remote.ensure(vec![tip]).await?;
                    remote
                        .want_blobs(tip, vec![path.clone(), also.clone()])
                        .await?;
                }
                remote.read(tip, path.clone()).await
            };
            match reading.await {
                Ok(state) => {
                    remote.saw_tip(tip);
                    let judged = match copies {
                        Copies::Refused => remote.not_a_copy(tip, Some(&advert)).await,
                        Copies::Read => Ok(()),
                    };
                    match judged {
                        Ok(()) => return Ok(state.map(Bytes::from)),
                        // A branch moved while the copy check fetched it: look again too.
                        Err(error) if error.refused() && attempt < 4 => {
                            tracing::debug!(error = %gitstate_core::report::chain(&error), "a tip moved during the copy check, retrying")
                        }
                        Err(other) => return Err(other),
                    }
                }
                // The tip moved between advertisement and fetch: look again, a few times.
                Err(error) if error.refused() && attempt < 4 => {
                    tracing::debug!(error = %gitstate_core::report::chain(&error), "tip moved during a read, retrying")
                }
                Err(other) => return Err(other),
            }
        }
    }
}

/// The files of the branch at `tip` (each blob the newest its state ref holds, from `states`)
/// and its state index. No branch: none, unless the states' refs of `branch` remain, which
/// makes it a branch deleted outside gitstate, never an empty list.
async fn files_and_index(
    remote: &Remote,
    branch: &str,
    tip: Option<ObjectId>,
    states: &std::collections::HashMap<String, ObjectId>,
) -> Result<(Vec<(String, ObjectId)>, Option<Vec<u8>>), RemoteError> {
    let Some(tip) = tip else {
        if remote.states_remain().await? {
            return Err(RemoteError::BranchLost(branch.to_owned()));
        }
        return Ok((Vec::new(), None));
    };
    remote.saw_tip(tip);
    remote
        .want_blobs(tip, vec![gitstate_core::index::INDEX_PATH.to_owned()])
        .await?;
    let cache = remote.cache.clone();
    let (files, index) = blocking(move || {
        let files = cache.list_blobs(tip)?;
        let index = cache.read_path(tip, gitstate_core::index::INDEX_PATH)?;
        Ok::<_, crate::repository::Error>((files, index))
    })
    .await?;
    Ok((remote.newest_blobs(files, states).await?, index))
}

/// Whether a read refuses a branch that is a copy of another (see the `copies` module): a
/// state's read does; a read of the access file or another file of the configuration does not
/// (on a copy it is the other branch's, and refusing it would refuse every request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Copies {
    Refused,
    Read,
}

/// What [`Beside`] asks of the other branches, owned (for the blocking pool).
enum Want {
    States,
    SeedState(String),
    StatesOr(String),
}

impl Want {
    fn of(look: Beside<'_>) -> Self {
        match look {
            Beside::States | Beside::Instead(None) | Beside::Remembered => Self::States,
            Beside::SeedState(name) => Self::SeedState(name.as_str().to_owned()),
            Beside::Instead(Some(name)) => Self::StatesOr(name.as_str().to_owned()),
        }
    }
}

/// Of the branches `tips`: those holding what `want` asks for, and those holding states.
struct Holders {
    holding: Vec<String>,
    with_states: Vec<String>,
}

fn holders(
    cache: &Cache,
    tips: Vec<(String, ObjectId)>,
    want: &Want,
) -> Result<Holders, crate::repository::Error> {
    let mut found = Holders {
        holding: Vec::new(),
        with_states: Vec::new(),
    };
    for (branch, tip) in tips {
        let states = holds_states(cache, tip)?;
        // The name read, or a near name of it (`team/app.tfstate` for the seed's
        // `team/app.json`): a slip in an address made when switching.
        let has_name = |named: &str| -> Result<bool, crate::repository::Error> {
            Ok(cache
                .list_files(tip)?
                .iter()
                .any(|path| path == named || near_name(path, named)))
        };
        let holds = match want {
            Want::States => states,
            Want::SeedState(named) => !cache.has_file(tip, INDEX_PATH)? && has_name(named)?,
            Want::StatesOr(named) => states || has_name(named)?,
        };
        if states {
            found.with_states.push(branch.clone());
        }
        if holds {
            found.holding.push(branch);
        }
    }
    Ok(found)
}

/// Whether `tip`, which the cache holds, holds states (see [`holds_states`]).
async fn tip_holds_states(remote: &Remote, tip: ObjectId) -> Result<bool, RemoteError> {
    let cache = remote.cache.clone();
    Ok(blocking(move || holds_states(&cache, tip)).await?)
}

/// Whether the tip `tip` holds states: the state index, or a `.tfstate` file anywhere
/// (terraform-backend-git's states, a repository of a version before the index).
fn holds_states(cache: &Cache, tip: ObjectId) -> Result<bool, crate::repository::Error> {
    Ok(cache.has_file(tip, INDEX_PATH)?
        || cache
            .list_files(tip)?
            .iter()
            .any(|path| path.ends_with(".tfstate")))
}
