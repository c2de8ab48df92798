//! Where a state lives in a bare repository, read with the git CLI as an operator would (issue
//! 27's design): each state may have a ref of its own,
//! `refs/gitstate/states/<branch>/<sha1 of its path>`,
//! holding its newest content and its own chain of commits, and the branch of files is folded
//! from those refs. A state *exists* iff the branch has its file; its *newest content* is its
//! state ref's tip when the ref is there, else the branch's file. Repositories without state refs
//! (written before the redesign, or with `GITSTATE_STATE_REFS=never`) read as the branch alone.

use std::path::Path;

use sha1::{Digest, Sha1};

use crate::{git, git_output};

/// The folder of the state refs.
pub const STATE_REFS: &str = "refs/gitstate/states/";

/// The state ref of `path` (the path exactly as the branch stores the file) on `branch` (its
/// name, or its full ref name).
pub fn state_ref(branch: &str, path: &str) -> String {
    let digest = Sha1::digest(path.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let branch = branch.strip_prefix("refs/heads/").unwrap_or(branch);
    format!("{STATE_REFS}{branch}/{hex}")
}

/// The commit `reference` points at, if it exists.
pub fn ref_tip(repo: &Path, reference: &str) -> Option<String> {
    let out = git_output(
        &[
            "rev-parse",
            "--verify",
            "-q",
            &format!("{reference}^{{commit}}"),
        ],
        Some(repo),
    );
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Every state ref of the repository with its tip: `(ref, commit)`.
pub fn state_refs(repo: &Path) -> Vec<(String, String)> {
    git(
        &[
            "for-each-ref",
            "--format=%(refname) %(objectname)",
            STATE_REFS,
        ],
        Some(repo),
    )
    .lines()
    .filter_map(|l| l.split_once(' '))
    .map(|(r, id)| (r.to_owned(), id.to_owned()))
    .collect()
}

/// The blob `path` has in `commit`, if it is a file there (not missing, not a folder).
pub fn file_at(repo: &Path, commit: &str, path: &str) -> Option<Vec<u8>> {
    let out = git_output(
        &["cat-file", "blob", &format!("{commit}:{path}")],
        Some(repo),
    );
    out.status.success().then_some(out.stdout)
}

/// The commit that holds the newest content of `path` on `branch`: the state ref's tip when the
/// ref is there, else the branch's tip; `None` when the branch lacks the file (never written, or
/// deleted: a state ref left over by a delete does not make it exist).
pub fn newest_commit(repo: &Path, branch: &str, path: &str) -> Option<String> {
    let tip = ref_tip(repo, &format!("refs/heads/{branch}"))?;
    file_at(repo, &tip, path)?;
    Some(ref_tip(repo, &state_ref(branch, path)).unwrap_or(tip))
}

/// The newest content of `path` on `branch`, as every read must answer it.
pub fn newest_stored(repo: &Path, branch: &str, path: &str) -> Option<Vec<u8>> {
    file_at(repo, &newest_commit(repo, branch, path)?, path)
}

/// The commits reachable from `tip` that changed the file `path` itself (not files below it when
/// it was a folder), oldest first, each with the content it left (`None`: it removed the file).
/// From a branch after a fold, or from a state ref (whose chain continues into the branch's
/// history below its first commit), this is the state's whole history.
pub fn file_log(repo: &Path, tip: &str, path: &str) -> Vec<(String, Option<Vec<u8>>)> {
    let log = git(
        &[
            "log",
            "--reverse",
            "--no-renames",
            "--format=commit %H",
            "--name-only",
            tip,
            "--",
            path,
        ],
        Some(repo),
    );
    let mut versions = Vec::new();
    let mut commit = "";
    for line in log.lines() {
        if let Some(id) = line.strip_prefix("commit ") {
            commit = id;
        } else if line == path {
            versions.push((commit.to_owned(), file_at(repo, commit, path)));
        }
    }
    versions
}

/// The history of `path` as a read must see it: [`file_log`] from [`newest_commit`], or from the
/// branch when the branch lacks the file.
pub fn stored_history(repo: &Path, branch: &str, path: &str) -> Vec<(String, Option<Vec<u8>>)> {
    let tip = newest_commit(repo, branch, path).unwrap_or_else(|| format!("refs/heads/{branch}"));
    if ref_tip(repo, &tip).is_none() {
        return Vec::new();
    }
    file_log(repo, &tip, path)
}

/// The ID of the lock held on `path` (lock ref `refs/heads/locks/<path>`, whose commit holds the
/// LockInfo as `<path>.lock`), read straight from the repository; `None` when nobody holds it,
/// `<unreadable>` when the lock commit holds no LockInfo with an ID.
pub fn held_lock_id(repo: &Path, path: &str) -> Option<String> {
    let tip = ref_tip(repo, &format!("refs/heads/locks/{path}"))?;
    let id = file_at(repo, &tip, &format!("{path}.lock"))
        .and_then(|info| serde_json::from_slice::<serde_json::Value>(&info).ok())
        .and_then(|info| info["ID"].as_str().map(str::to_owned));
    Some(id.unwrap_or_else(|| "<unreadable>".into()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn state_ref_is_the_sha1_of_the_path() {
        // `printf a | sha1sum`
        assert_eq!(
            super::state_ref("main", "a"),
            "refs/gitstate/states/main/86f7e437faa5a7fce15d1ddcb9eaeaea377667b8"
        );
    }
}
