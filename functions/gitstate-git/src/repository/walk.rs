//! Walks of the first-parent history in the cache: where a commit stands on a tip's chain, a
//! path's revisions page by page, the newest change of several paths at once, and how a path
//! clashes with a tree. Each stops at a shallow boundary and says so.

use std::collections::{HashMap, HashSet};

use gix::ObjectId;

use gitstate_core::ports::{HistoryPage, Revision};
use gitstate_core::refs::Clash;

use super::Cache;
use super::Error;
use super::trees::{changed_paths, first_file, near_name};

/// How far a walk of the history got.
pub enum Walk {
    Done(HistoryPage),
    /// The walk reached a commit whose parent is not in the cache (a shallow boundary) after
    /// `walked` commits; fetch deeper and walk again.
    Shallow {
        walked: usize,
        /// What the walk found before the boundary.
        partial: HistoryPage,
    },
}

/// Where a commit stands on the first-parent chain of a tip, as far as the cache knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chain {
    Found,
    /// The chain is complete and the commit is not on it.
    Absent,
    /// The chain reaches `boundary`, whose parent the cache lacks, after `walked` commits.
    Shallow {
        boundary: ObjectId,
        walked: usize,
    },
}

/// Where a search for the branch commit that replays a state commit got (see
/// [`Cache::replay_of`]).
pub enum Replayed {
    /// This branch commit carries the state commit.
    At(ObjectId),
    /// The chain is complete and no commit on it carries the state commit.
    Absent,
    /// The chain reaches `boundary`, whose parent the cache lacks, after `walked` commits.
    Shallow { boundary: ObjectId, walked: usize },
}

/// Where a search of a first-parent chain ended (see [`Cache::search_chain`]).
enum Search {
    Found(ObjectId),
    Absent,
    Shallow { boundary: ObjectId, walked: usize },
}

/// Whether a commit's `message` says it carries the state commit `wanted` (its `State-commit`
/// trailer: a fold or a delete replayed that write onto the branch).
fn carries(message: &str, wanted: &str) -> bool {
    gitstate_core::trailers::state_commit_of(message).as_deref() == Some(wanted)
}

/// The id a revision is listed under: the state commit a fold or a delete replayed onto the
/// branch (its `State-commit` trailer, when that is a commit id), else the commit's own. A
/// write keeps the id it was first listed under, whether its ref was folded or deleted since.
fn listed_id(commit: ObjectId, message: &str) -> String {
    gitstate_core::trailers::state_commit_of(message)
        .filter(|id| ObjectId::from_hex(id.as_bytes()).is_ok())
        .unwrap_or_else(|| commit.to_string())
}

/// What a walk for the branch a tip's commits were made for found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marker {
    /// The newest commit that names a branch names this one.
    Named(String),
    /// No commit looked at names one (commits made by other tools only, up to a root or the
    /// depth).
    Unnamed,
    /// The cache's history ends at `boundary` (a shallow fetch) before any commit names one.
    Shallow { boundary: ObjectId },
}

impl Cache {
    /// The branch the newest of the first `depth` commits on `tip`'s first-parent line that
    /// names one was made for (its `Branch` trailer).
    pub fn branch_marker(&self, tip: ObjectId, depth: usize) -> Result<Marker, Error> {
        let repo = self.repo()?;
        let mut at = tip;
        for _ in 0..depth {
            let commit = repo.find_commit(at)?;
            let decoded = commit.decode()?;
            let message = decoded.message.to_string();
            if let Some(branch) = gitstate_core::trailers::branch_of(&message) {
                return Ok(Marker::Named(branch));
            }
            match decoded.parents().next() {
                Some(parent) if repo.has_object(parent) => at = parent,
                Some(_) => return Ok(Marker::Shallow { boundary: at }),
                None => return Ok(Marker::Unnamed),
            }
        }
        Ok(Marker::Unnamed)
    }
}

/// How far a search for the newest revisions of several paths got.
pub enum Latest {
    Done(HashMap<String, Revision>),
    /// The walk reached a shallow boundary after `walked` commits with paths still unresolved;
    /// `found` holds the paths it resolved before.
    Shallow {
        walked: usize,
        found: HashMap<String, Revision>,
    },
}

impl Cache {
    /// Whether `commit` is on the first-parent chain from `tip`, walking no further than the cache.
    pub fn find_on_chain(&self, tip: ObjectId, commit: ObjectId) -> Result<Chain, Error> {
        let repo = self.repo()?;
        let mut at = tip;
        let mut walked = 0usize;
        loop {
            if at == commit {
                return Ok(Chain::Found);
            }
            walked += 1;
            match repo.find_commit(at)?.parent_ids().next() {
                Some(parent) if !repo.has_object(parent) => {
                    return Ok(Chain::Shallow {
                        boundary: at,
                        walked,
                    });
                }
                Some(parent) => at = parent.detach(),
                None => return Ok(Chain::Absent),
            }
        }
    }

    /// Whether `commit`, pushed on top of `base`, landed on the first-parent chain from `tip`:
    /// the chain holds it, or a commit whose `State-commit` trailer names it (a fold or a delete
    /// carried it there from its state's ref). The walk stops there, at `base` (below which it
    /// cannot sit), at the root, or where the cache ends.
    pub fn landed_on_chain(
        &self,
        tip: ObjectId,
        commit: ObjectId,
        base: Option<ObjectId>,
    ) -> Result<Chain, Error> {
        let wanted = commit.to_string();
        let found = self.search_chain(tip, |at, message| {
            if at == commit || carries(message, &wanted) {
                Some(true)
            } else {
                (Some(at) == base).then_some(false)
            }
        })?;
        Ok(match found {
            Search::Found(_) => Chain::Found,
            Search::Absent => Chain::Absent,
            Search::Shallow { boundary, walked } => Chain::Shallow { boundary, walked },
        })
    }

    /// The commit on the first-parent chain of `tip` whose `State-commit` trailer names
    /// `state_commit`: where a fold or a delete replayed that write onto the branch.
    pub fn replay_of(&self, tip: ObjectId, state_commit: ObjectId) -> Result<Replayed, Error> {
        let wanted = state_commit.to_string();
        let found =
            self.search_chain(tip, |_, message| carries(message, &wanted).then_some(true))?;
        Ok(match found {
            Search::Found(at) => Replayed::At(at),
            Search::Absent => Replayed::Absent,
            Search::Shallow { boundary, walked } => Replayed::Shallow { boundary, walked },
        })
    }

    /// Walk the first-parent chain from `tip`, asking `judge` of each commit (its id and
    /// message): `Some(true)` ends the walk there, found; `Some(false)` ends it, not found;
    /// `None` goes on to the parent. The root ends it too, and so does the cache's end.
    fn search_chain(
        &self,
        tip: ObjectId,
        mut judge: impl FnMut(ObjectId, &str) -> Option<bool>,
    ) -> Result<Search, Error> {
        let repo = self.repo()?;
        let mut at = tip;
        let mut walked = 0usize;
        loop {
            let commit = repo.find_commit(at)?;
            let message = commit.decode()?.message.to_string();
            match judge(at, &message) {
                Some(true) => return Ok(Search::Found(at)),
                Some(false) => return Ok(Search::Absent),
                None => {}
            }
            walked += 1;
            match commit.parent_ids().next() {
                Some(parent) if !repo.has_object(parent) => {
                    return Ok(Search::Shallow {
                        boundary: at,
                        walked,
                    });
                }
                Some(parent) => at = parent.detach(),
                None => return Ok(Search::Absent),
            }
        }
    }

    /// Walk the first-parent chain from `tip` and list the commits that changed `path`.
    pub fn history(
        &self,
        tip: ObjectId,
        path: &str,
        skip: usize,
        limit: usize,
    ) -> Result<Walk, Error> {
        let repo = self.repo()?;
        let mut page = HistoryPage::default();
        let mut seen = 0usize;
        let mut walked = 0usize;
        let mut commit = tip;
        let mut blob = Self::blob_id(&repo, commit, path)?;
        loop {
            walked += 1;
            let parent = repo
                .find_commit(commit)?
                .parent_ids()
                .next()
                .map(|p| p.detach());
            let parent_blob = match parent {
                Some(parent) if !repo.has_object(parent) => {
                    return Ok(Walk::Shallow {
                        walked,
                        partial: page,
                    });
                }
                Some(parent) => Self::blob_id(&repo, parent, path)?,
                None => None,
            };
            if parent_blob != blob {
                if seen >= skip {
                    if page.revisions.len() == limit {
                        page.more = true;
                        return Ok(Walk::Done(page));
                    }
                    let found = repo.find_commit(commit)?;
                    let decoded = found.decode()?;
                    page.revisions.push(Revision {
                        version: listed_id(commit, &decoded.message.to_string()),
                        time: decoded.committer()?.seconds(),
                        author: decoded.author()?.name.to_string(),
                        message: decoded.message.to_string(),
                        deleted: blob.is_none(),
                    });
                }
                seen += 1;
            }
            match parent {
                Some(parent) => {
                    commit = parent;
                    blob = parent_blob;
                }
                None => return Ok(Walk::Done(page)),
            }
        }
    }

    /// The revision `commit` is of the file at `path` (which it changed).
    pub fn revision(&self, commit: ObjectId, path: &str) -> Result<Revision, Error> {
        let repo = self.repo()?;
        let found = repo.find_commit(commit)?;
        let decoded = found.decode()?;
        Ok(Revision {
            version: listed_id(commit, &decoded.message.to_string()),
            time: decoded.committer()?.seconds(),
            author: decoded.author()?.name.to_string(),
            message: decoded.message.to_string(),
            deleted: Self::blob_id(&repo, commit, path)?.is_none(),
        })
    }

    /// How `path` clashes with the tree of `commit`: a proper prefix of it is a file, or it is a
    /// folder (then the first file inside it is named), or, when it is not a file, a file's path
    /// is a near name of it. Only the trees along `path` are read (and, when it is
    /// missing, those whose names match its folders ignoring case).
    pub fn path_clash(&self, commit: ObjectId, path: &str) -> Result<Option<Clash>, Error> {
        let repo = self.repo()?;
        let root = repo.find_commit(commit)?.tree_id()?.detach();
        let mut tree = root;
        let mut walked = String::new();
        let mut segments = path.split('/').peekable();
        while let Some(segment) = segments.next() {
            let Some((is_tree, oid)) = repo
                .find_tree(tree)?
                .find_entry(segment)
                .map(|e| (e.mode().is_tree(), e.object_id()))
            else {
                let all: Vec<&str> = path.split('/').collect();
                return Ok(near_name(&repo, root, "", &all)?.map(Clash::NearName));
            };
            walked.push_str(segment);
            let last = segments.peek().is_none();
            match (is_tree, last) {
                (true, false) => tree = oid,
                (true, true) => {
                    return Ok(first_file(&repo, oid, &walked)?.map(Clash::Folder));
                }
                (false, false) => return Ok(Some(Clash::BelowState(walked))),
                (false, true) => return Ok(None),
            }
            walked.push('/');
        }
        Ok(None)
    }

    /// The newest commit on the first-parent chain from `tip` that changed each of `paths`: one
    /// walk for all of them, descending only into subtrees that differ.
    pub fn last_changes(&self, tip: ObjectId, paths: &[String]) -> Result<Latest, Error> {
        let repo = self.repo()?;
        let mut wanted: HashSet<&str> = paths.iter().map(String::as_str).collect();
        let mut found = HashMap::new();
        let mut commit = tip;
        let mut walked = 0usize;
        while !wanted.is_empty() {
            walked += 1;
            let decoded_commit = repo.find_commit(commit)?;
            let tree = decoded_commit.tree_id()?.detach();
            let parent = decoded_commit.parent_ids().next().map(|p| p.detach());
            let parent_tree = match parent {
                Some(parent) if !repo.has_object(parent) => {
                    return Ok(Latest::Shallow { walked, found });
                }
                Some(parent) => Some(repo.find_commit(parent)?.tree_id()?.detach()),
                None => None,
            };
            let mut changed = Vec::new();
            changed_paths(&repo, Some(tree), parent_tree, "", &mut changed)?;
            let hits: Vec<String> = changed
                .into_iter()
                .filter(|p| wanted.contains(p.as_str()))
                .collect();
            if !hits.is_empty() {
                let decoded = decoded_commit.decode()?;
                let revision = Revision {
                    version: commit.to_string(),
                    time: decoded.committer()?.seconds(),
                    author: decoded.author()?.name.to_string(),
                    message: decoded.message.to_string(),
                    deleted: false,
                };
                for path in hits {
                    wanted.remove(path.as_str());
                    let blob = Self::blob_id(&repo, commit, &path)?;
                    found.insert(
                        path,
                        Revision {
                            deleted: blob.is_none(),
                            ..revision.clone()
                        },
                    );
                }
            }
            match parent {
                Some(parent) => commit = parent,
                None => break,
            }
        }
        Ok(Latest::Done(found))
    }
}
