//! Reading trees of the cache: the first file below a folder, the paths two trees differ in,
//! a subtree by name.

use gitstate_core::refs::file_stem;
use gix::ObjectId;

use super::{Corruption, Error};

/// One entry of a tree, owned.
pub(super) struct Entry {
    pub(super) name: String,
    pub(super) tree: bool,
    /// A plain file (not a tree, a symbolic link or a submodule).
    pub(super) blob: bool,
    pub(super) oid: ObjectId,
}

/// The entries of the tree `id`, in tree order (a tree that does not decode is corrupt).
pub(super) fn entries(repo: &gix::Repository, id: ObjectId) -> Result<Vec<Entry>, Error> {
    let tree = repo.find_tree(id)?;
    let decoded = tree.decode().map_err(|e| {
        Error::Corrupt(Corruption::Tree {
            id: tree.id,
            why: e.to_string(),
        })
    })?;
    Ok(decoded
        .entries
        .iter()
        .map(|entry| Entry {
            name: entry.filename.to_string(),
            tree: entry.mode.is_tree(),
            blob: entry.mode.is_blob(),
            oid: entry.oid.to_owned(),
        })
        .collect())
}

/// The first file (in tree order) below the folder `tree` at `dir`.
pub(super) fn first_file(
    repo: &gix::Repository,
    tree: ObjectId,
    dir: &str,
) -> Result<Option<String>, Error> {
    for entry in entries(repo, tree)? {
        let path = format!("{dir}/{}", entry.name);
        if !entry.tree {
            return Ok(Some(path));
        }
        if let Some(found) = first_file(repo, entry.oid, &path)? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// A file below `tree` (at `dir`) whose path is a near name of `segments` (see
/// [`gitstate_core::refs::near_name`]), if there is one (the first in tree order). Only folders
/// matching a segment, ignoring ASCII case, are read.
pub(super) fn near_name(
    repo: &gix::Repository,
    tree: ObjectId,
    dir: &str,
    segments: &[&str],
) -> Result<Option<String>, Error> {
    let Some((segment, rest)) = segments.split_first() else {
        return Ok(None);
    };
    for entry in entries(repo, tree)? {
        let near = match rest.is_empty() {
            true => file_stem(&entry.name).eq_ignore_ascii_case(file_stem(segment)),
            false => entry.name.eq_ignore_ascii_case(segment),
        };
        if !near {
            continue;
        }
        let path = if dir.is_empty() {
            entry.name
        } else {
            format!("{dir}/{}", entry.name)
        };
        match (entry.tree, rest.is_empty()) {
            (false, true) => return Ok(Some(path)),
            (true, false) => {
                if let Some(found) = near_name(repo, entry.oid, &path, rest)? {
                    return Ok(Some(found));
                }
            }
            _ => {}
        }
    }
    Ok(None)
}

/// The blob paths that differ between two trees (either may be absent), below `prefix`.
pub(super) fn changed_paths(
    repo: &gix::Repository,
    new: Option<ObjectId>,
    old: Option<ObjectId>,
    prefix: &str,
    out: &mut Vec<String>,
) -> Result<(), Error> {
    if new == old {
        return Ok(());
    }
    let entries = |id: Option<ObjectId>| -> Result<Vec<(String, ObjectId, bool)>, Error> {
        let Some(id) = id else {
            return Ok(Vec::new());
        };
        let tree = repo.find_tree(id)?;
        let decoded = tree.decode().map_err(|e| {
            Error::Corrupt(Corruption::Tree {
                id,
                why: e.to_string(),
            })
        })?;
        Ok(decoded
            .entries
            .iter()
            .filter(|e| e.mode.is_tree() || e.mode.is_blob())
            .map(|e| (e.filename.to_string(), e.oid.to_owned(), e.mode.is_tree()))
            .collect())
    };
    let (new, old) = (entries(new)?, entries(old)?);
    let old_by_name: std::collections::HashMap<&str, (ObjectId, bool)> = old
        .iter()
        .map(|(n, id, t)| (n.as_str(), (*id, *t)))
        .collect();
    let new_names: std::collections::HashSet<&str> =
        new.iter().map(|(n, _, _)| n.as_str()).collect();
    for (name, id, is_tree) in &new {
        let path = format!("{prefix}{name}");
        let before = old_by_name.get(name.as_str()).copied();
        match (is_tree, before) {
            (_, Some((old_id, _))) if old_id == *id => {}
            (true, before) => {
                let old_tree = before.filter(|(_, t)| *t).map(|(id, _)| id);
                changed_paths(repo, Some(*id), old_tree, &format!("{path}/"), out)?;
            }
            (false, _) => out.push(path),
        }
    }
    for (name, id, is_tree) in &old {
        if !new_names.contains(name.as_str()) {
            let path = format!("{prefix}{name}");
            if *is_tree {
                changed_paths(repo, None, Some(*id), &format!("{path}/"), out)?;
            } else {
                out.push(path);
            }
        }
    }
    Ok(())
}

pub(super) fn subtree(
    repo: &gix::Repository,
    tree: ObjectId,
    name: &str,
) -> Result<Option<ObjectId>, Error> {
    let tree = repo.find_tree(tree)?;
    Ok(tree
        .find_entry(name)
        .filter(|e| e.mode().is_tree())
        .map(|e| e.object_id()))
}
