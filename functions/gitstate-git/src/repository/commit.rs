//! Commits made in the cache: one path written or removed on a parent, the state index kept in
//! step, and the objects a remote that has the parent still needs.

use gix::ObjectId;
use gix::objs::tree::EntryKind;

use gitstate_core::ports::CommitMeta;

use super::Cache;
use super::Error;
use super::trees::subtree;

/// A commit made locally, and every object a remote that has its parent still needs.
pub struct NewCommit {
    pub id: ObjectId,
    pub objects: Vec<ObjectId>,
}

impl Cache {
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
            super::index::stage(&repo, &mut editor, base_tree, path, blob, meta, now.seconds)?;
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

impl Cache {
    /// A state commit (issue 27): a tree of the one file `content` at `path`, on `parent` (the
    /// state ref's tip, or the branch commit whose file it replaces), with `meta`'s people and
    /// message. Its objects are all new to the remote but the parent's.
    pub fn state_commit_on(
        &self,
        parent: ObjectId,
        path: &str,
        content: &[u8],
        meta: &CommitMeta,
    ) -> Result<NewCommit, Error> {
        let repo = self.repo()?;
        let mut editor = repo.edit_tree(ObjectId::empty_tree(repo.object_hash()))?;
        let blob = repo.write_blob(content)?.detach();
        editor.upsert(path, EntryKind::Blob, blob)?;
        let tree = editor
            .detach()
            .write(|tree| repo.write_object(tree).map(|id| id.detach()))?;
        let now = gix::date::Time::now_utc();
        let signature = |name: &str, email: &str| gix::actor::Signature {
            name: name.into(),
            email: email.into(),
            time: now,
        };
        let commit = gix::objs::Commit {
            tree,
            parents: std::iter::once(parent).collect(),
            author: signature(&meta.author_name, &meta.author_email),
            committer: signature(&meta.committer_name, &meta.committer_email),
            encoding: None,
            message: meta.message.as_str().into(),
            extra_headers: Vec::new(),
        };
        let id = repo.write_object(commit)?.detach();
        let mut objects = vec![id, tree];
        let components: Vec<&str> = path.split('/').collect();
        let mut dir = Some(tree);
        for component in &components[..components.len().saturating_sub(1)] {
            dir = match dir {
                Some(t) => subtree(&repo, t, component)?,
                None => None,
            };
            objects.extend(dir);
        }
        objects.push(blob);
        Ok(NewCommit { id, objects })
    }
}
