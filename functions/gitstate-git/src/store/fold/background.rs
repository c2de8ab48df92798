//! Folds in the background of a serving process (`gitstate serve`, `gitstate run`): a push that
//! wrote a state ref marks its remote unfolded, and the write that made it starts a fold task
//! unless one runs; a task folds until no write came meanwhile, one task at a time per remote.
//! [`GitStore::finish_folds`] waits for them (the wrapper, before it exits).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gitstate_core::ports::Location;

use super::Folder;
use crate::store::GitStore;
use crate::store::remote::Remote;
use crate::sync::lock;

impl GitStore {
    /// After a write: when it wrote a state ref and this process folds in the background, make
    /// sure a fold task runs (see the module doc).
    pub(in crate::store) fn fold_after_write(&self, at: &Location) {
        if !self.options.fold_after_writes {
            return;
        }
        let Ok(remote) = self.remote(at) else {
            return;
        };
        if !remote.folds.unfolded.load(Ordering::SeqCst)
            || remote.folds.folding.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let (branch, lease_age) = (at.branch.full_ref(), self.options.fold_lease_age);
        tokio::spawn(fold_while_unfolded(remote, branch, lease_age));
    }

    /// Wait until no background fold of this process runs.
    pub(in crate::store) async fn finish_folds(&self) {
        let remotes: Vec<Arc<Remote>> = lock(&self.remotes).values().cloned().collect();
        for remote in remotes {
            while remote.folds.folding.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// How often a background fold that found the lease held looks again.
const MAX_BUSY_LOOKS: u32 = 6;

/// Fold until no write came during the last fold; then let go (and look once more at the flag,
/// for a write that came as this task let go).
async fn fold_while_unfolded(remote: Arc<Remote>, branch: String, lease_age: Duration) {
    let mut busy = 0u32;
    loop {
        while remote.folds.unfolded.swap(false, Ordering::SeqCst) {
            let mut folder = Folder {
                remote: remote.clone(),
                branch: branch.clone(),
                lease_age,
                lease: None,
                sent: None,
            };
            let outcome = folder.rounds().await;
            folder.let_go().await;
            match outcome {
                // Another fold holds the lease: it looks again when it lets go, but it may fold
                // another branch, or its holder may have died. Look again later (1, 2, 4 … 32 s:
                // past the default lease age), then leave it to the next write.
                Ok(Some(report)) if report.busy && busy < MAX_BUSY_LOOKS => {
                    tracing::debug!("another fold holds the lease; looking again later");
                    remote.folds.unfolded.store(true, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(1 << busy)).await;
                    busy += 1;
                }
                Ok(Some(_)) => busy = 0,
                Ok(None) => tracing::warn!(
                    "a background fold ran out of rounds; the next write folds again"
                ),
                Err(error) => tracing::warn!(
                    error = %gitstate_core::report::chain(&error),
                    "a background fold failed; the next write folds again"
                ),
            }
        }
        remote.folds.folding.store(false, Ordering::SeqCst);
        if !remote.folds.unfolded.load(Ordering::SeqCst)
            || remote.folds.folding.swap(true, Ordering::SeqCst)
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::{Command as Process, Stdio};

    use gix::ObjectId;

    use gitstate_core::BranchName;
    use gitstate_core::ports::Location;

    use crate::protocol::Command;
    use crate::settings::{GitAuth, GitSettings, StateRefs};
    use crate::store::known::state_ref;
    use crate::store::{GitStore, null};

    fn git(dir: &Path, args: &[&str], env: &[(&str, &str)], stdin: &str) -> String {
        let mut child = Process::new("git")
            .arg("--git-dir")
            .arg(dir)
            .args(args)
            .envs(env.iter().copied())
            .env("GIT_AUTHOR_NAME", "ann")
            .env("GIT_AUTHOR_EMAIL", "ann@example.invalid")
            .env("GIT_COMMITTER_NAME", "gitstate")
            .env("GIT_COMMITTER_EMAIL", "gitstate@example.invalid")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("git runs");
        std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), stdin.as_bytes())
            .expect("stdin");
        let out = child.wait_with_output().expect("git");
        assert!(out.status.success(), "git {args:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// A commit of `content` at `path`, alone in its tree, on `parent`.
    fn commit(dir: &Path, path: &str, content: &str, parent: Option<&str>) -> String {
        let blob = git(dir, &["hash-object", "-w", "--stdin"], &[], content);
        let index = dir.join(format!("index-{}", rand::random::<u32>()));
        let index = index.to_str().expect("utf-8");
        let env = [("GIT_INDEX_FILE", index)];
        let entry = format!("100644,{blob},{path}");
        git(
            dir,
            &["update-index", "--add", "--cacheinfo", &entry],
            &env,
            "",
        );
        let tree = git(dir, &["write-tree"], &env, "");
        let mut args = vec!["commit-tree", tree.as_str(), "-m", "write"];
        if let Some(parent) = parent {
            args.extend(["-p", parent]);
        }
        git(dir, &args, &[], "")
    }

    /// A push of this process that writes a state ref, in a store that folds after writes:
    /// the write starts a fold task, and once it is done the branch carries the write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_state_ref_this_process_wrote_is_folded_in_the_background() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = dir.path().join("repo.git");
        git(
            &repo,
            &["init", "--bare", "-q", "--initial-branch=main"],
            &[],
            "",
        );
        let created = commit(&repo, "a.tfstate", "{}\n", None);
        git(&repo, &["update-ref", "refs/heads/main", &created], &[], "");
        let (store, id) = GitStore::new(&GitSettings {
            repository: None,
            local_repository: repo.clone(),
            cache_dir: dir.path().join("cache"),
            lock_ref_prefix: "refs/heads/locks/".into(),
            username: None,
            token: None,
            auth: GitAuth::Basic,
            ca_pem: None,
            require_atomic: false,
            timeout: std::time::Duration::from_secs(10),
            max_response_bytes: 1 << 20,
            max_history_depth: 100,
            writes_per_push: 1,
            fold_lease_age: std::time::Duration::from_secs(60),
            fold_after_writes: true,
            state_refs: StateRefs::Always,
            proof_window: std::time::Duration::ZERO,
        })
        .expect("store");
        let at = Location {
            repository: id,
            branch: BranchName::parse("main").expect("branch"),
        };
        let write = commit(&repo, "a.tfstate", "{\"serial\":2}\n", Some(&created));
        let remote = store.remote(&at).expect("remote");
        let command = Command {
            old: null(),
            new: ObjectId::from_hex(write.as_bytes()).expect("id"),
            name: state_ref("refs/heads/main", "a.tfstate"),
        };
        let report = remote
            .push(vec![command.clone()], Vec::new())
            .await
            .expect("push");
        assert!(report.all_ok(&[command]));
        store.fold_after_write(&at);
        store.finish_folds().await;
        let record = git(&repo, &["show", "main:.gitstate/folded.json"], &[], "");
        assert!(record.contains(&write), "{record}");
        let file = git(&repo, &["show", "main:a.tfstate"], &[], "");
        assert_eq!(file, "{\"serial\":2}");
        // Nothing new was written: a second write-less call starts nothing.
        store.fold_after_write(&at);
        store.finish_folds().await;
        let log = git(&repo, &["rev-list", "--count", "main"], &[], "");
        assert_eq!(log, "2", "one replay, once");
    }
}
