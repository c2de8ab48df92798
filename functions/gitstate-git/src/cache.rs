//! A bare repository on local disk: the cache of a remote, or the embedded repository itself.
//!
//! Blobs are read straight from the object database; there is never a worktree.

use std::path::{Path, PathBuf};
use std::sync::RwLock;

use gix::ObjectId;
use gix::objs::Kind;
use gix::objs::tree::EntryKind;

use crate::{Error, sync};
use gitstate_core::ports::{CommitMeta, HistoryPage, Revision};
use gitstate_core::refs::Clash;

mod trees;
use trees::{changed_paths, first_file, subtree};

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

/// How far a search for the newest revisions of several paths got.
pub enum Latest {
    Done(std::collections::HashMap<String, Revision>),
    /// The walk reached a shallow boundary after `walked` commits with paths still unresolved;
    /// `found` holds the paths it resolved before.
    Shallow {
        walked: usize,
        found: std::collections::HashMap<String, Revision>,
    },
}

pub struct Cache {
    dir: PathBuf,
    repo: RwLock<gix::ThreadSafeRepository>,
}

/// A commit made locally, and every object a remote that has its parent still needs.
pub struct NewCommit {
    pub id: ObjectId,
    pub objects: Vec<ObjectId>,
}

fn open_options() -> gix::open::Options {
    // Never read the user's or the system's git configuration: the cache must behave the same
    // everywhere, Lambda included.
    gix::open::Options::isolated()
}

impl Cache {
    /// Open the bare repository at `dir`, creating it if it does not exist.
    pub fn open_or_init(dir: &Path) -> Result<Self, Error> {
        let repo = Self::load(dir)?;
        Ok(Self {
            dir: dir.to_owned(),
            repo: RwLock::new(repo),
        })
    }

    fn load(dir: &Path) -> Result<gix::ThreadSafeRepository, Error> {
        if !dir.join("HEAD").is_file() {
            std::fs::create_dir_all(dir)?;
            gix::init_bare(dir)?;
        }
        Ok(gix::open_opts(dir, open_options())?.into_sync())
    }

    /// Throw the cache away and start empty: used when it was found corrupt.
    pub fn rebuild(&self) -> Result<(), Error> {
        tracing::warn!(dir = %self.dir.display(), "rebuilding the git cache");
        let mut guard = sync::write(&self.repo);
        let trash = self
            .dir
            .with_extension(format!("trash-{}", rand::random::<u32>()));
        std::fs::rename(&self.dir, &trash)?;
        let fresh = Self::load(&self.dir)?;
        *guard = fresh;
        std::fs::remove_dir_all(&trash)?;
        Ok(())
    }

    /// Open the repository afresh, so objects another handle just wrote (a new pack) are seen
    /// without relying on the object database noticing on its own.
    pub fn reload(&self) -> Result<(), Error> {
        let fresh = gix::open_opts(&self.dir, open_options())?.into_sync();
        *sync::write(&self.repo) = fresh;
        Ok(())
    }

    pub fn repo(&self) -> Result<gix::Repository, Error> {
        Ok(sync::read(&self.repo).to_thread_local())
    }

    pub fn git_dir(&self) -> &Path {
        &self.dir
    }

    pub fn has(&self, id: ObjectId) -> Result<bool, Error> {
        Ok(self.repo()?.has_object(id))
    }

    /// Whether `id` is a commit the cache holds.
    pub fn is_commit(&self, id: ObjectId) -> Result<bool, Error> {
        let repo = self.repo()?;
        Ok(repo.has_object(id) && repo.find_header(id)?.kind() == Kind::Commit)
    }

    /// The content of `path` in the tree of `commit`, or `None` if the path does not exist.
    pub fn read_path(&self, commit: ObjectId, path: &str) -> Result<Option<Vec<u8>>, Error> {
        let repo = self.repo()?;
        let tree = repo.find_commit(commit)?.tree()?;
        let Some(entry) = tree.lookup_entry_by_path(path)? else {
            return Ok(None);
        };
        if !entry.mode().is_blob() {
            return Ok(None);
        }
        let blob = entry.object()?;
        Ok(Some(blob.detach().data))
    }

    /// Of the blobs at `paths` in `commit`'s tree (which the cache holds), those it lacks: a
    /// partial fetch brings trees without their blobs.
    pub fn lacking_blobs(
        &self,
        commit: ObjectId,
        paths: &[String],
    ) -> Result<Vec<ObjectId>, Error> {
        let repo = self.repo()?;
        let mut lacking = Vec::new();
        for path in paths {
            if let Some(blob) = Self::blob_id(&repo, commit, path)?
                && !repo.has_object(blob)
                && !lacking.contains(&blob)
            {
                lacking.push(blob);
            }
        }
        Ok(lacking)
    }

    /// The id of the blob at `path` in `commit`'s tree.
    fn blob_id(
        repo: &gix::Repository,
        commit: ObjectId,
        path: &str,
    ) -> Result<Option<ObjectId>, Error> {
        let tree = repo.find_commit(commit)?.tree()?;
        Ok(tree
            .lookup_entry_by_path(path)?
            .filter(|e| e.mode().is_blob())
            .map(|e| e.object_id()))
    }

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
                        version: commit.to_string(),
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

    /// How `path` clashes with the tree of `commit`: a proper prefix of it is a file, or it is a
    /// folder (then the first file inside it is named). Only the trees along `path` are read.
    pub fn path_clash(&self, commit: ObjectId, path: &str) -> Result<Option<Clash>, Error> {
        let repo = self.repo()?;
        let mut tree = repo.find_commit(commit)?.tree_id()?.detach();
        let mut walked = String::new();
        let mut segments = path.split('/').peekable();
        while let Some(segment) = segments.next() {
            let Some((is_tree, oid)) = repo
                .find_tree(tree)?
                .find_entry(segment)
                .map(|e| (e.mode().is_tree(), e.object_id()))
            else {
                return Ok(None);
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
        let mut wanted: std::collections::HashSet<&str> =
            paths.iter().map(String::as_str).collect();
        let mut found = std::collections::HashMap::new();
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

    /// The paths of every file in the tree of `commit`, sorted.
    pub fn list_files(&self, commit: ObjectId) -> Result<Vec<String>, Error> {
        let mut out: Vec<String> = self
            .list_blobs(commit)?
            .into_iter()
            .map(|(path, _)| path)
            .collect();
        out.sort();
        Ok(out)
    }

    /// The paths and blob ids of every file in the tree of `commit`.
    pub fn list_blobs(&self, commit: ObjectId) -> Result<Vec<(String, ObjectId)>, Error> {
        let repo = self.repo()?;
        let root = repo.find_commit(commit)?.tree_id()?.detach();
        let mut out = Vec::new();
        let mut pending = vec![(root, String::new())];
        while let Some((id, dir)) = pending.pop() {
            let tree = repo.find_tree(id)?;
            let decoded = tree
                .decode()
                .map_err(|e| Error::Corrupt(format!("tree {id}: {e}")))?;
            for entry in &decoded.entries {
                let path = format!("{dir}{}", entry.filename);
                if entry.mode.is_tree() {
                    pending.push((entry.oid.to_owned(), format!("{path}/")));
                } else if entry.mode.is_blob() {
                    out.push((path, entry.oid.to_owned()));
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// The message of a commit and its committer time (seconds since the epoch).
    pub fn commit_summary(&self, id: ObjectId) -> Result<(String, i64), Error> {
        let repo = self.repo()?;
        let commit = repo.find_commit(id)?;
        let decoded = commit.decode()?;
        let message = decoded.message.to_string();
        let seconds = decoded.committer()?.seconds();
        Ok((message, seconds))
    }

    /// Kind and content of an object, for packing.
    pub fn object(&self, id: ObjectId) -> Result<(Kind, Vec<u8>), Error> {
        let object = self.repo()?.find_object(id)?.detach();
        Ok((object.kind, object.data))
    }

    /// Commit `content` at `path` (or its removal) on top of `parent` (or as a root commit).
    pub fn commit(
        &self,
        parent: Option<ObjectId>,
        path: &str,
        content: Option<&[u8]>,
        meta: &CommitMeta,
    ) -> Result<NewCommit, Error> {
        let repo = self.repo()?;
        let base_tree = match parent {
            Some(parent) => repo.find_commit(parent)?.tree_id()?.detach(),
            None => ObjectId::empty_tree(repo.object_hash()),
        };
        let mut editor = repo.edit_tree(base_tree)?;
        let blob = match content {
            Some(bytes) => {
                let blob = repo.write_blob(bytes)?.detach();
                editor.upsert(path, EntryKind::Blob, blob)?;
                Some(blob)
            }
            None => {
                editor.remove(path)?;
                None
            }
        };
        let now = gix::date::Time::now_utc();
        let index =
            crate::index::stage(&repo, &mut editor, base_tree, path, blob, meta, now.seconds)?;
        // Without the existence check of gix's editor: after a partial fetch the cache holds the
        // trees but not the blobs of other states, which the new tree keeps as they are.
        let tree = editor
            .detach()
            .write(|tree| repo.write_object(tree).map(|id| id.detach()))?;
        let author = gix::actor::Signature {
            name: meta.author_name.as_str().into(),
            email: meta.author_email.as_str().into(),
            time: now,
        };
        let committer = gix::actor::Signature {
            name: meta.committer_name.as_str().into(),
            email: meta.committer_email.as_str().into(),
            time: now,
        };
        let commit = gix::objs::Commit {
            tree,
            parents: parent.into_iter().collect(),
            author,
            committer,
            encoding: None,
            message: meta.message.as_str().into(),
            extra_headers: Vec::new(),
        };
        let id = repo.write_object(commit)?.detach();

        // The objects the remote lacks: the commit, the trees along `path` (and the index's)
        // that changed, the blobs.
        let mut objects = vec![id, tree];
        let old_root = (base_tree != ObjectId::empty_tree(repo.object_hash())).then_some(base_tree);
        let changed = std::iter::once((path, blob))
            .chain(index.map(|i| (gitstate_core::index::INDEX_PATH, Some(i))));
        for (path, blob) in changed {
            let components: Vec<&str> = path.split('/').collect();
            let (mut new_dir, mut old_dir) = (Some(tree), old_root);
            for component in &components[..components.len().saturating_sub(1)] {
                new_dir = match new_dir {
                    Some(t) => subtree(&repo, t, component)?,
                    None => None,
                };
                old_dir = match old_dir {
                    Some(t) => subtree(&repo, t, component)?,
                    None => None,
                };
                match new_dir {
                    Some(t) if Some(t) != old_dir && !objects.contains(&t) => objects.push(t),
                    _ => {}
                }
            }
            objects.extend(blob);
        }
        Ok(NewCommit { id, objects })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use gitstate_core::index::{INDEX_PATH, StateIndex};

    fn meta(serial: usize) -> CommitMeta {
        CommitMeta {
            author_name: format!("user{}", serial % 3),
            author_email: "u@x".into(),
            committer_name: "gitstate".into(),
            committer_email: "g@x".into(),
            message: format!("write x\n\nSerial: {serial}\nUser: u\n"),
        }
    }

    /// Random histories of writes and deletes in nested folders (and files that are not states):
    /// the one-walk search finds, for every path, the commit the per-path history finds, and
    /// the index written along describes exactly the states at the tip.
    #[test]
    fn last_changes_and_the_index_agree_with_the_history() {
        let paths = [
            "a.tfstate",
            "net/a.tfstate",
            "net/b.tfstate",
            "net/deep/er/c.tfstate",
            "app/a.tfstate",
            "README.md",
            "x.tfstate.lock",
        ];
        for seed in 0..8u64 {
            let dir = tempfile::tempdir().expect("tempdir");
            let cache = Cache::open_or_init(&dir.path().join("r.git")).expect("repository");
            let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            let mut next = |n: u64| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 33) % n
            };
            let mut tip: Option<ObjectId> = None;
            let mut present: HashMap<&str, bool> = HashMap::new();
            for serial in 1..=40 {
                let path = paths[next(paths.len() as u64) as usize];
                let delete = present.get(path).copied().unwrap_or(false) && next(4) == 0;
                let content = format!("{{\"serial\":{serial}}}");
                let made = cache
                    .commit(
                        tip,
                        path,
                        (!delete).then_some(content.as_bytes()),
                        &meta(serial),
                    )
                    .expect("commit");
                present.insert(path, !delete);
                tip = Some(made.id);
            }
            let tip = tip.expect("commits");
            let wanted: Vec<String> = paths.iter().map(|p| (*p).to_owned()).collect();
            let Latest::Done(found) = cache.last_changes(tip, &wanted).expect("walk") else {
                panic!("a full history is never shallow");
            };
            for path in &wanted {
                let Walk::Done(page) = cache.history(tip, path, 0, 1).expect("history") else {
                    panic!("not shallow");
                };
                assert_eq!(
                    found.get(path),
                    page.revisions.first(),
                    "seed {seed}, {path}"
                );
            }
            let index = cache
                .read_path(tip, INDEX_PATH)
                .expect("read")
                .and_then(|b| StateIndex::parse(&b))
                .unwrap_or_default();
            let files: HashMap<String, ObjectId> =
                cache.list_blobs(tip).expect("files").into_iter().collect();
            let states: Vec<&String> = files
                .keys()
                .filter(|p| gitstate_core::StateName::parse(p).is_ok())
                .filter(|p| !p.starts_with(".gitstate/"))
                .collect();
            assert_eq!(index.states.len(), states.len(), "seed {seed}");
            for path in states {
                let entry = &index.states[path.as_str()];
                assert_eq!(
                    entry.content,
                    files[path].to_string(),
                    "seed {seed}, {path}"
                );
                let newest = &found[path.as_str()];
                assert_eq!(
                    (entry.time, entry.author.as_str()),
                    (newest.time, newest.author.as_str())
                );
            }
        }
    }
}
