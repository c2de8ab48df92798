//! The views of the console and `GET /states`: every state with its last change and lock, and a
//! state's versions with what each changed. Read grant only; nothing here writes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{Backend, ServiceError, VersionInfo};
use crate::access::{Caller, Role};
use crate::changes::{Changes, Summary};
use crate::index::{IndexEntry, StateIndex};
use crate::ports::{HeldLock, Location};
use crate::trailers::{Trailers, operation_of};
use crate::{ReadContext, StateName};

/// Entries worked out for states the index does not describe, and summaries of versions, kept
/// per process (both are keyed by immutable content: a blob id, a commit id).
const MEMO_LIMIT: usize = 8192;

/// (state, content or version id) → what was worked out.
type Memoised<T> = Mutex<HashMap<(String, String), T>>;

#[derive(Default)]
pub(super) struct Memo {
    entries: Memoised<IndexEntry>,
    summaries: Memoised<Option<Arc<Summary>>>,
}

fn remember<K: std::hash::Hash + Eq, V>(map: &Mutex<HashMap<K, V>>, key: K, value: V) {
    if let Ok(mut map) = map.lock() {
        if map.len() >= MEMO_LIMIT {
            map.clear();
        }
        map.insert(key, value);
    }
}

fn recall<K: std::hash::Hash + Eq, V: Clone>(map: &Mutex<HashMap<K, V>>, key: &K) -> Option<V> {
    map.lock().ok()?.get(key).cloned()
}

/// One state of the list.
#[derive(Debug, Clone)]
pub struct StateRow {
    pub name: StateName,
    /// Its last change; `None` for a lock on a state that has no file yet.
    pub entry: Option<IndexEntry>,
    pub lock: Option<HeldLock>,
}

/// One version of a state and what it changed against the one before.
#[derive(Debug, Clone)]
pub struct VersionChanges {
    pub info: VersionInfo,
    /// `None` when either side cannot be read as a Terraform state (client-side encrypted).
    pub changes: Option<Changes>,
}

/// A resource of the current state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentResource {
    pub address: String,
    pub kind: String,
    pub mode: String,
}

/// A state's page: versions newest first, the current resources, the lock.
#[derive(Debug, Clone)]
pub struct StatePage {
    pub versions: Vec<VersionChanges>,
    pub more: bool,
    /// `None`: the state does not exist now, or cannot be read as a Terraform state.
    pub resources: Option<Vec<CurrentResource>>,
    pub lock: Option<HeldLock>,
}

impl Backend {
    /// Every state the caller may read, with its last change and its lock (one index blob and
    /// the lock refs; states the index does not describe are worked out from their history).
    #[tracing::instrument(skip(self, caller), fields(user = %caller.user))]
    pub async fn list_states(
        &self,
        caller: &Caller,
        at: &Location,
        read: &ReadContext,
    ) -> Result<Vec<StateRow>, ServiceError> {
        let listing = self.store.listing(at, read).await?;
        let mut index = listing
            .index
            .as_deref()
            .and_then(StateIndex::parse)
            .unwrap_or_default();
        let mut locks: HashMap<StateName, HeldLock> = listing
            .locks
            .into_iter()
            .filter(|(name, _)| caller.may(Role::Read, name))
            .collect();
        let mut files = Vec::new();
        let mut stale = Vec::new();
        for (name, content) in listing.files {
            if !caller.may(Role::Read, &name) {
                continue;
            }
            let indexed = index
                .states
                .get(name.as_str())
                .filter(|entry| content.as_deref() == Some(entry.content.as_str()));
            if indexed.is_none() {
                stale.push((name.clone(), content));
            }
            files.push(name);
        }
        if !stale.is_empty() {
            tracing::debug!(stale = stale.len(), "states not described by the index");
        }
        let stale_names: std::collections::HashSet<StateName> =
            stale.iter().map(|(name, _)| name.clone()).collect();
        let mut worked_out = self.work_out(at, stale, read).await?;
        let mut rows = Vec::with_capacity(files.len());
        for name in files {
            let entry = match worked_out.remove(&name) {
                Some(entry) => Some(entry),
                None if stale_names.contains(&name) => None,
                None => index.states.remove(name.as_str()),
            };
            let lock = locks.remove(&name);
            rows.push(StateRow { name, entry, lock });
        }
        rows.extend(locks.into_iter().map(|(name, lock)| StateRow {
            name,
            entry: None,
            lock: Some(lock),
        }));
        rows.sort_by(|a, b| a.name.as_str().cmp(b.name.as_str()));
        Ok(rows)
    }

    /// The entries of states the index does not describe: their newest revisions (one walk
    /// for all), and serials from the commits' trailers or else from the content.
    async fn work_out(
        &self,
        at: &Location,
        stale: Vec<(StateName, Option<String>)>,
        read: &ReadContext,
    ) -> Result<HashMap<StateName, IndexEntry>, ServiceError> {
        let mut done = HashMap::new();
        let mut todo = Vec::new();
        for (name, content) in stale {
            let key = content.clone().map(|c| (name.to_string(), c));
            match key.as_ref().and_then(|k| recall(&self.memo.entries, k)) {
                Some(entry) => {
                    done.insert(name, entry);
                }
                None => todo.push((name, content)),
            }
        }
        if todo.is_empty() {
            return Ok(done);
        }
        let names: Vec<StateName> = todo.iter().map(|(name, _)| name.clone()).collect();
        let mut newest: HashMap<StateName, crate::ports::Revision> = self
            .store
            .last_changes(at, &names, read)
            .await?
            .into_iter()
            .collect();
        for (name, content) in todo {
            let Some(revision) = newest.remove(&name) else {
                continue;
            };
            let message = &revision.message;
            let trailers = Trailers::parse(message);
            let (mut serial, mut lineage) = (trailers.serial, trailers.lineage);
            if serial.is_none()
                && let Some(stored) = self
                    .store
                    .read_version(at, &name, &revision.version)
                    .await?
            {
                match self.open_revision(at, &name, stored).await {
                    Ok(plain) => {
                        let version = super::Version::of(&plain);
                        (serial, lineage) = (version.serial, version.lineage);
                    }
                    // Listed without a serial; reading the state itself reports the failure.
                    Err(error @ (ServiceError::Seal(_) | ServiceError::SealedWithoutKeys)) => {
                        tracing::warn!(state = %name, error = %error, "listed without a serial: its newest version does not open");
                    }
                    Err(other) => return Err(other),
                }
            }
            let entry = IndexEntry {
                content: content.clone().unwrap_or_default(),
                serial,
                lineage,
                time: revision.time,
                author: revision.author,
                operation: operation_of(message),
            };
            if let Some(content) = content {
                remember(
                    &self.memo.entries,
                    (name.to_string(), content),
                    entry.clone(),
                );
            }
            done.insert(name, entry);
        }
        Ok(done)
    }

    /// The summary of `name` as `version` left it (`None`: not a readable Terraform state).
    async fn summary(
        &self,
        at: &Location,
        name: &StateName,
        version: &VersionInfo,
    ) -> Result<Option<Arc<Summary>>, ServiceError> {
        if version.deleted {
            return Ok(Some(Arc::new(Summary::default())));
        }
        let key = (name.to_string(), version.version.clone());
        if let Some(summary) = recall(&self.memo.summaries, &key) {
            return Ok(summary);
        }
        let summary = match self.store.read_version(at, name, &version.version).await? {
            Some(stored) => match self.open_revision(at, name, stored).await {
                Ok(plain) => Summary::of(&plain).map(Arc::new),
                // That version's changes are unknown; the page still shows the others.
                Err(error @ (ServiceError::Seal(_) | ServiceError::SealedWithoutKeys)) => {
                    tracing::warn!(state = %name, version = %version.version, error = %error, "a version does not open: its changes are unknown");
                    return Ok(None);
                }
                Err(other) => return Err(other),
            },
            None => None,
        };
        remember(&self.memo.summaries, key, summary.clone());
        Ok(summary)
    }

    /// One page of a state's versions, newest first, each with what it changed; the current
    /// resources; the lock (read grant).
    #[tracing::instrument(skip(self, caller), fields(state = %name, user = %caller.user))]
    pub async fn state_page(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
        page: usize,
        per_page: usize,
        read: &ReadContext,
    ) -> Result<StatePage, ServiceError> {
        caller.require(Role::Read, name)?;
        let per_page = per_page.clamp(1, super::MAX_PAGE);
        let (versions, more) = self.history(caller, at, name, page, per_page).await?;
        if versions.is_empty() && page == 0 {
            // Neither a state nor a history: only a lock may exist.
            let lock = self.store.read_lock(at, name).await?;
            if lock.is_none() {
                return Err(ServiceError::NotFound);
            }
            return Ok(StatePage {
                versions: Vec::new(),
                more: false,
                resources: None,
                lock,
            });
        }
        // The version just older than the page, to diff the page's last one against.
        let older = if more {
            let skip_page = page.saturating_add(1).saturating_mul(per_page);
            self.history(caller, at, name, skip_page, 1)
                .await?
                .0
                .into_iter()
                .next()
        } else {
            None
        };
        let mut summaries = Vec::with_capacity(versions.len() + 1);
        for version in versions.iter().chain(&older) {
            summaries.push(self.summary(at, name, version).await?);
        }
        let mut listed = Vec::with_capacity(versions.len());
        for (i, info) in versions.into_iter().enumerate() {
            let before = summaries.get(i + 1);
            let changes = match (&summaries[i], before) {
                (Some(now), Some(Some(before))) => Some(now.changes_since(Some(before))),
                (Some(now), None) => Some(now.changes_since(None)),
                _ => None,
            };
            listed.push(VersionChanges { info, changes });
        }
        let current = match listed.first() {
            Some(newest) if page == 0 && newest.info.deleted => None,
            Some(_) if page == 0 => summaries.first().cloned().flatten(),
            _ => match self.store.read_state(at, name, read).await? {
                Some(stored) => match self.open(at, name, stored).await {
                    Ok(opened) => Summary::of(&opened.plaintext).map(Arc::new),
                    // The resources are unknown; reading the state itself reports the failure.
                    Err(ServiceError::Seal(_) | ServiceError::SealedWithoutKeys) => None,
                    Err(other) => return Err(other),
                },
                None => None,
            },
        };
        let resources = current.as_deref().map(resources_of);
        let lock = self.store.read_lock(at, name).await?;
        Ok(StatePage {
            versions: listed,
            more,
            resources,
            lock,
        })
    }
}

/// The resources a state's summary lists, as the page shows them.
fn resources_of(summary: &Summary) -> Vec<CurrentResource> {
    summary
        .resources
        .iter()
        .map(|(address, r)| CurrentResource {
            address: address.clone(),
            kind: r.kind.clone(),
            mode: r.mode.clone(),
        })
        .collect()
}
