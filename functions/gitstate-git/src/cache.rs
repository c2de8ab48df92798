//! A bare repository on local disk: the cache of a remote, or the embedded repository itself.
//!
//! Blobs are read straight from the object database; there is never a worktree.

use std::path::{Path, PathBuf};
use std::sync::RwLock;

use gix::ObjectId;
use gix::objs::Kind;
use gix::objs::tree::EntryKind;

use crate::Error;
use gitstate_core::ports::{CommitMeta, HistoryPage, Revision};

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
        let mut guard = self
            .repo
            .write()
            .map_err(|_| Error::Corrupt("cache lock poisoned".into()))?;
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
        *self
            .repo
            .write()
            .map_err(|_| Error::Corrupt("cache lock poisoned".into()))? = fresh;
        Ok(())
    }

    pub fn repo(&self) -> Result<gix::Repository, Error> {
        let guard = self
            .repo
            .read()
            .map_err(|_| Error::Corrupt("cache lock poisoned".into()))?;
        Ok(guard.to_thread_local())
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

    /// The paths of every file in the tree of `commit`, depth first.
    pub fn list_files(&self, commit: ObjectId) -> Result<Vec<String>, Error> {
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
                    out.push(path);
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
        let tree = editor.write()?.detach();
        let now = gix::date::Time::now_utc();
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

        // The objects the remote lacks: the commit, the trees along `path` that changed, the blob.
        let mut objects = vec![id, tree];
        let components: Vec<&str> = path.split('/').collect();
        let old_root = (base_tree != ObjectId::empty_tree(repo.object_hash())).then_some(base_tree);
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
                Some(t) if Some(t) != old_dir => objects.push(t),
                _ => {}
            }
        }
        objects.extend(blob);
        Ok(NewCommit { id, objects })
    }
}

fn subtree(repo: &gix::Repository, tree: ObjectId, name: &str) -> Result<Option<ObjectId>, Error> {
    let tree = repo.find_tree(tree)?;
    Ok(tree
        .find_entry(name)
        .filter(|e| e.mode().is_tree())
        .map(|e| e.object_id()))
}
