//! Keeps the state index ([`INDEX_PATH`]) in step with every commit that writes, deletes or
//! restores a state: the entry goes into the same tree as the state itself.

use gix::ObjectId;
use gix::objs::tree::EntryKind;

use gitstate_core::StateName;
use gitstate_core::index::{INDEX_PATH, StateIndex};
use gitstate_core::ports::CommitMeta;

use super::Error;

/// Record in the tree being edited that `path` now holds `blob` (`None`: removed), as the commit
/// `meta` made at `time` leaves it. Returns the new index blob, or `None` when `path` is not a
/// state (a lock file, the access file). An unreadable or missing index starts afresh: the list
/// works out the states it does not describe.
pub fn stage(
    repo: &gix::Repository,
    editor: &mut gix::object::tree::Editor<'_>,
    base_tree: ObjectId,
    path: &str,
    blob: Option<ObjectId>,
    meta: &CommitMeta,
    time: i64,
) -> Result<Option<ObjectId>, Error> {
    if StateName::parse(path).is_err() {
        return Ok(None);
    }
    let old = if base_tree == ObjectId::empty_tree(repo.object_hash()) {
        None
    } else {
        repo.find_tree(base_tree)?
            .lookup_entry_by_path(INDEX_PATH)?
            .filter(|entry| entry.mode().is_blob())
            .map(|entry| entry.object().map(|blob| blob.detach().data))
            .transpose()?
    };
    let mut index = old
        .as_deref()
        .and_then(StateIndex::parse)
        .unwrap_or_default();
    index.record(path, blob.map(|b| b.to_string()), meta, time);
    let id = repo.write_blob(index.to_bytes())?.detach();
    editor.upsert(INDEX_PATH, EntryKind::Blob, id)?;
    Ok(Some(id))
}
