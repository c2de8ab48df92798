//! An in-memory store with the same semantics as the git store, for tests of the rules and the
//! router that need no git server.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;

use crate::ports::{
    Acquire, Beside, BranchStatus, Change, CommitMeta, HeldLock, HistoryPage, Location, Refusal,
    Release, Revision, StateStore, StoreError, WritePlan, Written, user_from_message,
};
use crate::refs::{Clash, branch_clash, lock_clash, tree_clash};
use crate::{LockInfo, ReadContext, StateName};

type Key = (Location, StateName);
/// Locks are per repository, as the git store's lock refs are: not per branch.
type LockKey = (String, StateName);

/// Makes the id of the n-th revision (from 1).
pub type VersionIds = std::sync::Arc<dyn Fn(u64) -> String + Send + Sync>;

#[derive(Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    /// The repository's default branch (a git remote's `HEAD`), named when a branch is missing.
    head: Option<String>,
    /// Revision ids; unset, the counter in decimal.
    ids: Option<VersionIds>,
}

#[derive(Default)]
struct Inner {
    states: HashMap<Key, Bytes>,
    locks: HashMap<LockKey, HeldLock>,
    /// Every committed revision of each state, oldest first, with the content it left.
    revisions: HashMap<Key, Vec<(Revision, Option<Bytes>)>>,
    /// Configuration files by path (one repository's worth: tests use one location).
    configs: HashMap<String, Bytes>,
    /// Every commit message, oldest first, standing in for the repository history.
    log: Vec<CommitMeta>,
    counter: u64,
}

impl MemoryStore {
    /// A store whose repositories' `HEAD` names `branch`, as a git server's would.
    pub fn with_default_branch(branch: &str) -> Self {
        Self {
            head: Some(branch.to_owned()),
            ..Self::default()
        }
    }

    /// A store whose n-th revision has the id `ids(n)` (commit-like ids for prefix tests).
    pub fn with_version_ids(ids: VersionIds) -> Self {
        Self {
            ids: Some(ids),
            ..Self::default()
        }
    }

    fn version_id(&self, n: u64) -> String {
        self.ids
            .as_ref()
            .map_or_else(|| n.to_string(), |ids| ids(n))
    }

    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> Result<T, StoreError> {
        let mut inner = self
            .inner
            .lock()
            .map_err(|_| StoreError::Corrupt("memory store poisoned".into()))?;
        Ok(f(&mut inner))
    }

    /// Replace a configuration file, as a commit pushed by someone else would.
    pub fn put_config(&self, path: &str, content: Bytes) {
        let _ = self.with(|i| i.configs.insert(path.to_owned(), content));
    }

    /// The commit messages written so far.
    pub fn history(&self) -> Vec<CommitMeta> {
        self.with(|i| i.log.clone()).unwrap_or_default()
    }
}

fn key(at: &Location, name: &StateName) -> Key {
    (at.clone(), name.clone())
}

fn lock_key(at: &Location, name: &StateName) -> LockKey {
    (at.repository.clone(), name.clone())
}

impl Inner {
    /// The git store's tree rule over the states of one location.
    fn tree_clash(&self, at: &Location, name: &StateName) -> Option<Clash> {
        let files = self
            .states
            .keys()
            .filter(|(l, _)| l == at)
            .map(|(_, n)| n.as_str());
        tree_clash(files, name.as_str())
    }

    /// The git store's branch rule: a write that would create its branch next to an existing
    /// branch of the same repository that it clashes with.
    fn branch_clash(&self, at: &Location) -> Option<Clash> {
        let branches: Vec<String> = self
            .revisions
            .keys()
            .filter(|(l, _)| l.repository == at.repository)
            .map(|(l, _)| l.branch.full_ref())
            .collect();
        let exists = branches.contains(&at.branch.full_ref());
        if exists {
            return None;
        }
        branch_clash(branches.iter().map(String::as_str), &at.branch)
    }

    /// The git store's lock ref rule: lock refs of one repository share one namespace.
    fn lock_clash(&self, at: &Location, name: &StateName) -> Option<Clash> {
        let held = self
            .locks
            .keys()
            .filter(|(repository, _)| *repository == at.repository)
            .map(|(_, n)| n.as_str());
        lock_clash(held, name.as_str())
    }
}

#[async_trait]
impl StateStore for MemoryStore {
    async fn read_state(
        &self,
        at: &Location,
        name: &StateName,
        _: &ReadContext,
    ) -> Result<Option<Bytes>, StoreError> {
        self.with(|i| i.states.get(&key(at, name)).cloned())
    }

    async fn clash(&self, at: &Location, name: &StateName) -> Result<Option<Clash>, StoreError> {
        self.with(|i| i.tree_clash(at, name))
    }

    /// Every branch written through the store holds states (the git store's index stays): none
    /// holds a state by name only, and a branch written to holds states of its own.
    async fn branches_with_states(
        &self,
        at: &Location,
        look: Beside<'_>,
        _: &ReadContext,
    ) -> Result<Vec<String>, StoreError> {
        self.with(|i| {
            let others = i
                .revisions
                .keys()
                .filter(|(l, _)| l.repository == at.repository);
            let mut holding: Vec<String> = match look {
                Beside::SeedState(_) => Vec::new(),
                Beside::States => others
                    .filter(|(l, _)| l.branch != at.branch)
                    .map(|(l, _)| l.branch.full_ref())
                    .collect(),
                Beside::Instead(_) | Beside::Remembered
                    if i.revisions.keys().any(|(l, _)| l == at) =>
                {
                    Vec::new()
                }
                Beside::Instead(_) | Beside::Remembered => others
                    .filter(|(l, _)| l.branch != at.branch)
                    .map(|(l, _)| l.branch.full_ref())
                    .collect(),
            };
            holding.sort();
            holding.dedup();
            holding
        })
    }

    async fn branch_status(
        &self,
        at: &Location,
        _: &ReadContext,
    ) -> Result<BranchStatus, StoreError> {
        self.with(|i| {
            let mut branches: Vec<String> = i
                .revisions
                .keys()
                .filter(|(l, _)| l.repository == at.repository)
                .map(|(l, _)| l.branch.full_ref())
                .collect();
            branches.sort();
            branches.dedup();
            if branches.contains(&at.branch.full_ref()) {
                BranchStatus::Exists
            } else {
                let default = self
                    .head
                    .clone()
                    .filter(|head| branches.contains(&format!("refs/heads/{head}")));
                BranchStatus::Missing {
                    default,
                    others: branches,
                }
            }
        })
    }

    async fn read_lock(
        &self,
        at: &Location,
        name: &StateName,
    ) -> Result<Option<HeldLock>, StoreError> {
        self.with(|i| i.locks.get(&lock_key(at, name)).cloned())
    }

    async fn acquire_lock(
        &self,
        at: &Location,
        name: &StateName,
        lock: &LockInfo,
        meta: &CommitMeta,
    ) -> Result<Acquire, StoreError> {
        self.with(|i| {
            if let Some(held) = i.locks.get(&lock_key(at, name)) {
                return Acquire::Held(held.clone());
            }
            if let Some(clash) = i.lock_clash(at, name).or_else(|| i.tree_clash(at, name)) {
                return Acquire::Clash(clash);
            }
            i.counter += 1;
            let held = HeldLock {
                info: lock.clone(),
                token: i.counter.to_string(),
                owner: user_from_message(&meta.message),
                created: Some(0),
            };
            i.locks.insert(lock_key(at, name), held);
            i.log.push(meta.clone());
            Acquire::Acquired
        })
    }

    async fn release_lock(
        &self,
        at: &Location,
        name: &StateName,
        held: &HeldLock,
    ) -> Result<Release, StoreError> {
        self.with(|i| match i.locks.get(&lock_key(at, name)) {
            Some(current) if current == held => {
                i.locks.remove(&lock_key(at, name));
                Release::Released
            }
            _ => Release::Changed,
        })
    }

    async fn write_state(
        &self,
        at: &Location,
        name: &StateName,
        change: Change,
        plan: WritePlan,
    ) -> Result<Written, StoreError> {
        self.with(|i| {
            let k = key(at, name);
            // As git finds them: the branch the write would create, the tree, then the plan.
            if let Some(clash) = i.branch_clash(at).or_else(|| i.tree_clash(at, name)) {
                return Written::Refused(Refusal::Clash(clash));
            }
            let stored = i.states.get(&k).map(|b| crate::ports::Stored {
                content: b.as_ref(),
                id: None,
            });
            let meta = match plan(i.locks.get(&lock_key(at, name)), stored) {
                Ok(meta) => meta,
                Err(refusal) => return Written::Refused(refusal),
            };
            let content = match change {
                Change::Put(bytes) if i.states.get(&k) == Some(&bytes) => {
                    return Written::Unchanged;
                }
                Change::Put(bytes) => {
                    i.states.insert(k.clone(), bytes.clone());
                    Some(bytes)
                }
                Change::Delete => {
                    i.states.remove(&k);
                    None
                }
            };
            i.counter += 1;
            let version = self.version_id(i.counter);
            let revision = Revision {
                version: version.clone(),
                time: i64::try_from(i.counter).unwrap_or(i64::MAX),
                author: meta.author_name.clone(),
                message: meta.message.clone(),
                deleted: content.is_none(),
            };
            i.revisions.entry(k).or_default().push((revision, content));
            i.log.push(meta);
            Written::Committed {
                version,
                content: None,
            }
        })
    }

    async fn list_states(&self, at: &Location, prefix: &str) -> Result<Vec<StateName>, StoreError> {
        self.with(|i| {
            let mut names: Vec<StateName> = i
                .states
                .keys()
                .filter(|(l, n)| l == at && n.as_str().starts_with(prefix))
                .map(|(_, n)| n.clone())
                .collect();
            names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
            names
        })
    }

    async fn read_config(
        &self,
        _at: &Location,
        path: &str,
        _fresh_within: std::time::Duration,
        _: &ReadContext,
    ) -> Result<Option<Bytes>, StoreError> {
        self.with(|i| i.configs.get(path).cloned())
    }

    async fn create_config(
        &self,
        _at: &Location,
        path: &str,
        content: Bytes,
        meta: &CommitMeta,
    ) -> Result<bool, StoreError> {
        self.with(|i| {
            if i.configs.contains_key(path) {
                return false;
            }
            i.configs.insert(path.to_owned(), content);
            i.log.push(meta.clone());
            true
        })
    }

    async fn replace_config(
        &self,
        _at: &Location,
        path: &str,
        expected: Option<Bytes>,
        content: Bytes,
        meta: &CommitMeta,
    ) -> Result<bool, StoreError> {
        self.with(|i| {
            if i.configs.get(path) != expected.as_ref() {
                return false;
            }
            i.configs.insert(path.to_owned(), content);
            i.log.push(meta.clone());
            true
        })
    }

    async fn history(
        &self,
        at: &Location,
        name: &StateName,
        skip: usize,
        limit: usize,
    ) -> Result<HistoryPage, StoreError> {
        self.with(|i| {
            let all = i.revisions.get(&key(at, name)).cloned().unwrap_or_default();
            let newest_first: Vec<Revision> = all.into_iter().rev().map(|(r, _)| r).collect();
            let revisions: Vec<Revision> = newest_first
                .iter()
                .skip(skip)
                .take(limit)
                .cloned()
                .collect();
            HistoryPage {
                more: newest_first.len() > skip.saturating_add(revisions.len()),
                revisions,
            }
        })
    }

    async fn read_version(
        &self,
        at: &Location,
        name: &StateName,
        version: &str,
    ) -> Result<Option<Bytes>, StoreError> {
        self.with(|i| {
            i.revisions
                .get(&key(at, name))
                .and_then(|all| all.iter().find(|(r, _)| r.version == version))
                .and_then(|(_, content)| content.clone())
        })
    }

    async fn list_locks(&self, at: &Location) -> Result<Vec<(StateName, HeldLock)>, StoreError> {
        self.with(|i| {
            let mut locks: Vec<(StateName, HeldLock)> = i
                .locks
                .iter()
                .filter(|((repository, _), _)| *repository == at.repository)
                .map(|((_, name), held)| (name.clone(), held.clone()))
                .collect();
            locks.sort_by(|a, b| a.0.cmp(&b.0));
            locks
        })
    }
}
