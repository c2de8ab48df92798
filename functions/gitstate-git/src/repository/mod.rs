//! A bare repository on local disk: the cache of a remote, or the embedded repository itself.
//!
//! Blobs are read straight from the object database; there is never a worktree.

use std::path::{Path, PathBuf};
use std::sync::RwLock;

use gix::ObjectId;
use gix::objs::Kind;

use crate::sync;

mod commit;
mod error;
pub mod index;
pub mod local;
pub mod pack;
mod replay;
mod trees;
mod walk;

pub use commit::NewCommit;
pub use error::{Corruption, Error};
pub use replay::StateCommit;
pub use walk::{Chain, Latest, Marker, Replayed, Walk};

pub struct Cache {
    dir: PathBuf,
    repo: RwLock<gix::ThreadSafeRepository>,
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

    /// The content of `path` in the tree of `commit`, or `None` if the path does not exist (or
    /// is a folder). A symbolic link or a submodule there is an error.
    pub fn read_path(&self, commit: ObjectId, path: &str) -> Result<Option<Vec<u8>>, Error> {
        let repo = self.repo()?;
        let tree = repo.find_commit(commit)?.tree()?;
        let Some(entry) = tree.lookup_entry_by_path(path)? else {
            return Ok(None);
        };
        let mode = entry.mode();
        if mode.is_tree() {
            return Ok(None);
        }
        if !mode.is_blob() {
            let what = if mode.is_link() {
                "symbolic link"
            } else {
                "submodule"
            };
            return Err(Error::Corrupt(Corruption::NotAFile {
                path: path.to_owned(),
                what,
            }));
        }
        let blob = entry.object()?;
        Ok(Some(blob.detach().data))
    }

    /// The fold record in the tree of `commit` (none there: an empty one). An unreadable record
    /// is corrupt, never empty: folding from an empty record would replay every write.
    pub fn fold_record(&self, commit: ObjectId) -> Result<gitstate_core::fold::FoldRecord, Error> {
        match self.read_path(commit, gitstate_core::fold::FOLDED_PATH)? {
            None => Ok(gitstate_core::fold::FoldRecord::default()),
            Some(bytes) => gitstate_core::fold::FoldRecord::parse(&bytes)
                .map_err(|e| Error::Corrupt(Corruption::FoldRecord(e.to_string()))),
        }
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

    /// Whether `commit`'s tree has a file at `path` (its trees suffice, not its blobs).
    pub fn has_file(&self, commit: ObjectId, path: &str) -> Result<bool, Error> {
        Ok(Self::blob_id(&self.repo()?, commit, path)?.is_some())
    }

    /// The id of the blob at `path` in `commit`'s tree.
    pub(crate) fn blob_id(
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
            for entry in trees::entries(&repo, id)? {
                let path = format!("{dir}{}", entry.name);
                if entry.tree {
                    pending.push((entry.oid, format!("{path}/")));
                } else if entry.blob {
                    out.push((path, entry.oid));
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// Whether a tree of `commit` (its root or one below it) is missing from the cache.
    pub fn lacks_trees(&self, commit: ObjectId) -> Result<bool, Error> {
        let repo = self.repo()?;
        let mut pending = vec![repo.find_commit(commit)?.tree_id()?.detach()];
        while let Some(id) = pending.pop() {
            if !repo.has_object(id) {
                return Ok(true);
            }
            let below = trees::entries(&repo, id)?.into_iter().filter(|e| e.tree);
            pending.extend(below.map(|entry| entry.oid));
        }
        Ok(false)
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
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use gitstate_core::index::{INDEX_PATH, StateIndex};
    use gitstate_core::ports::CommitMeta;

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
