//! What a fold does in the cache: read a state commit (a tree of one file), and replay it onto
//! a branch commit as the branch commit its write would have been.

use std::collections::HashSet;

use gix::ObjectId;
use gix::objs::tree::EntryKind;

use gitstate_core::fold::{FOLDED_PATH, FoldRecord};
use gitstate_core::ports::CommitMeta;

use super::{Cache, NewCommit};
use super::{Corruption, Error};

/// A state commit: one file at `path`, and who wrote it when, as the write made it.
#[derive(Debug, Clone)]
pub struct StateCommit {
    pub id: ObjectId,
    pub parent: Option<ObjectId>,
    pub path: String,
    pub blob: ObjectId,
    pub author: gix::actor::Signature,
    pub committer: gix::actor::Signature,
    pub message: String,
}

impl StateCommit {
    /// The committer time, seconds since the epoch: the order folds replay writes in.
    pub fn time(&self) -> i64 {
        self.committer.time.seconds
    }
}

fn corrupt(id: ObjectId, what: impl std::fmt::Display) -> Error {
    Error::Corrupt(Corruption::Commit {
        id,
        why: what.to_string(),
    })
}

impl Cache {
    /// `id` as a state commit: `None` when its tree is not exactly one file (a branch commit).
    pub fn state_commit(&self, id: ObjectId) -> Result<Option<StateCommit>, Error> {
        let files = self.list_blobs(id)?;
        let [(path, blob)] = files.as_slice() else {
            return Ok(None);
        };
        let repo = self.repo()?;
        let commit = repo.find_commit(id)?;
        let decoded = commit.decode()?;
        let author = decoded.author()?.to_owned().map_err(|e| corrupt(id, e))?;
        let committer = decoded
            .committer()?
            .to_owned()
            .map_err(|e| corrupt(id, e))?;
        Ok(Some(StateCommit {
            id,
            parent: decoded.parents().next(),
            path: path.clone(),
            blob: *blob,
            author,
            committer,
            message: decoded.message.to_string(),
        }))
    }

    /// The commits `wants` reach that `hidden` do not (the whole history is here).
    pub fn beyond(
        &self,
        wants: Vec<ObjectId>,
        hidden: Vec<ObjectId>,
    ) -> Result<HashSet<ObjectId>, Error> {
        let repo = self.repo()?;
        let walk = repo
            .rev_walk(wants)
            .with_hidden(hidden)
            .all()
            .map_err(|e| Error::Corrupt(Corruption::Walk(e.to_string())))?;
        let mut out = HashSet::new();
        for info in walk {
            let info = info.map_err(|e| Error::Corrupt(Corruption::Walk(e.to_string())))?;
            out.insert(info.id);
        }
        Ok(out)
    }

    /// A commit of the empty tree, without parents, saying `message` (a fold lease).
    pub fn orphan(&self, message: &str) -> Result<NewCommit, Error> {
        let repo = self.repo()?;
        let tree = repo.write_object(gix::objs::Tree::empty())?.detach();
        let signature = gix::actor::Signature {
            name: "gitstate".into(),
            email: "gitstate@localhost".into(),
            time: gix::date::Time::now_utc(),
        };
        let commit = gix::objs::Commit {
            tree,
            parents: Default::default(),
            author: signature.clone(),
            committer: signature,
            encoding: None,
            message: message.into(),
            extra_headers: Vec::new(),
        };
        let id = repo.write_object(commit)?.detach();
        Ok(NewCommit {
            id,
            objects: vec![id, tree],
        })
    }

    /// The id of the blob at `path` in `commit`'s tree (which the cache holds).
    pub fn blob_at(&self, commit: ObjectId, path: &str) -> Result<Option<ObjectId>, Error> {
        Self::blob_id(&self.repo()?, commit, path)
    }

    /// Replay `state` on the branch commit `head`: its file, the index entry and `record` (which
    /// must already name `state`) in one commit with the write's author, committer, times and
    /// message, plus the trailer `State-commit: <id>`. The blob is the state commit's, so only
    /// the commit, trees, the index and the record are new.
    pub fn replay(
        &self,
        head: ObjectId,
        state: &StateCommit,
        record: &FoldRecord,
    ) -> Result<NewCommit, Error> {
        let repo = self.repo()?;
        let base_tree = repo.find_commit(head)?.tree_id()?.detach();
        let mut editor = repo.edit_tree(base_tree)?;
        editor.upsert(&state.path, EntryKind::Blob, state.blob)?;
        let meta = CommitMeta {
            author_name: state.author.name.to_string(),
            author_email: state.author.email.to_string(),
            committer_name: state.committer.name.to_string(),
            committer_email: state.committer.email.to_string(),
            message: gitstate_core::trailers::with_state_commit(
                &state.message,
                &state.id.to_string(),
            ),
        };
        let index = super::index::stage(
            &repo,
            &mut editor,
            base_tree,
            &state.path,
            Some(state.blob),
            &meta,
            state.time(),
        )?;
        let folded = repo.write_blob(record.to_bytes())?.detach();
        editor.upsert(FOLDED_PATH, EntryKind::Blob, folded)?;
        let tree = editor
            .detach()
            .write(|tree| repo.write_object(tree).map(|id| id.detach()))?;
        let commit = gix::objs::Commit {
            tree,
            parents: std::iter::once(head).collect(),
            author: state.author.clone(),
            committer: state.committer.clone(),
            encoding: None,
            message: meta.message.as_str().into(),
            extra_headers: Vec::new(),
        };
        let id = repo.write_object(commit)?.detach();
        // The state's blob is on the remote already (its state ref holds it).
        let mut objects = vec![id, tree, folded];
        objects.extend(index);
        self.changed_trees(tree, base_tree, &mut objects)?;
        Ok(NewCommit { id, objects })
    }

    /// Every tree below `new` that `old` does not have, added to `objects`: what a remote that
    /// has `old` lacks of `new`'s trees.
    fn changed_trees(
        &self,
        new: ObjectId,
        old: ObjectId,
        objects: &mut Vec<ObjectId>,
    ) -> Result<(), Error> {
        let repo = self.repo()?;
        let mut pending = vec![(new, Some(old))];
        while let Some((new, old)) = pending.pop() {
            if Some(new) == old {
                continue;
            }
            if !objects.contains(&new) {
                objects.push(new);
            }
            let old_tree = match old {
                Some(old) => Some(repo.find_tree(old)?),
                None => None,
            };
            let tree = repo.find_tree(new)?;
            let decoded = tree.decode().map_err(|e| corrupt(new, e))?;
            for entry in decoded.entries.iter().filter(|e| e.mode.is_tree()) {
                let before = match &old_tree {
                    Some(old) => old
                        .find_entry(entry.filename.as_ref() as &[u8])
                        .filter(|e| e.mode().is_tree())
                        .map(|e| e.object_id()),
                    None => None,
                };
                if before != Some(entry.oid.to_owned()) {
                    pending.push((entry.oid.to_owned(), before));
                }
            }
        }
        Ok(())
    }
}
