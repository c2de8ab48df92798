//! States' own refs (issue 27) made by hand with the git CLI's plumbing, straight in a bare
//! repository: state commits in the design's format (a tree of the one file, parent the
//! previous state commit or the branch commit the write was planned on), branch commits as a
//! writer behind the protocol's back makes them, and what the fold left (read with `git log`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Who made a commit and when, as git writes it (`"1700000000 +0130"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    pub name: String,
    pub email: String,
    pub date: String,
}

/// One write of a state: its content and the commit's people, times and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateWrite {
    pub path: String,
    pub content: Vec<u8>,
    pub author: Stamp,
    pub committer: Stamp,
    pub message: String,
}

/// A commit as `git log` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    pub id: String,
    pub author: Stamp,
    pub committer: Stamp,
    pub message: String,
}

/// A bare repository to write in (the test server's, or an embedded one).
pub struct Bare {
    pub dir: PathBuf,
    pub branch: String,
}

impl Bare {
    pub fn new(dir: &Path, branch: &str) -> Self {
        Self {
            dir: dir.to_owned(),
            branch: branch.to_owned(),
        }
    }

    /// Run git here with `env`, feeding `stdin`; its output, trimmed (the test fails if git does).
    pub fn git(&self, args: &[&str], env: &[(&str, &str)], stdin: &[u8]) -> String {
        let mut child = Command::new("git")
            .arg("--git-dir")
            .arg(&self.dir)
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "seed")
            .env("GIT_AUTHOR_EMAIL", "seed@example.invalid")
            .env("GIT_COMMITTER_NAME", "seed")
            .env("GIT_COMMITTER_EMAIL", "seed@example.invalid")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("git runs");
        std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), stdin).expect("stdin");
        let out = child.wait_with_output().expect("git");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The state ref of `path` on this branch (the one place that names it here).
    pub fn state_ref(&self, path: &str) -> String {
        crate::states::state_ref(&self.branch, path)
    }

    /// The tip of `name`, if it exists.
    pub fn tip(&self, name: &str) -> Option<String> {
        let out = Command::new("git")
            .arg("--git-dir")
            .arg(&self.dir)
            .args(["rev-parse", "--verify", "-q", name])
            .output()
            .expect("git runs");
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    fn blob(&self, content: &[u8]) -> String {
        self.git(&["hash-object", "-w", "--stdin"], &[], content)
    }

    /// A tree: `base`'s (none: empty) with `changes` (path → blob id, `None` removes).
    fn tree(&self, base: Option<&str>, changes: &[(&str, Option<&str>)]) -> String {
        let index = tempfile::NamedTempFile::new().expect("index file");
        let index_path = index.path().to_str().expect("utf-8").to_owned();
        std::fs::remove_file(&index_path).expect("fresh index");
        let env = [("GIT_INDEX_FILE", index_path.as_str())];
        match base {
            Some(base) => self.git(&["read-tree", base], &env, b""),
            None => self.git(&["read-tree", "--empty"], &env, b""),
        };
        for (path, blob) in changes {
            match blob {
                Some(blob) => self.git(
                    &[
                        "update-index",
                        "--add",
                        "--cacheinfo",
                        &format!("100644,{blob},{path}"),
                    ],
                    &env,
                    b"",
                ),
                // `--force-remove` wants a work tree; a zero mode removes the entry anywhere.
                None => self.git(
                    &["update-index", "--index-info"],
                    &env,
                    format!("0 {}\t{path}\n", "0".repeat(40)).as_bytes(),
                ),
            };
        }
        self.git(&["write-tree"], &env, b"")
    }

    fn commit(&self, tree: &str, parent: Option<&str>, write: &StateWrite) -> String {
        let mut args = vec!["commit-tree", tree];
        if let Some(parent) = parent {
            args.extend(["-p", parent]);
        }
        let env = [
            ("GIT_AUTHOR_NAME", write.author.name.as_str()),
            ("GIT_AUTHOR_EMAIL", write.author.email.as_str()),
            ("GIT_AUTHOR_DATE", write.author.date.as_str()),
            ("GIT_COMMITTER_NAME", write.committer.name.as_str()),
            ("GIT_COMMITTER_EMAIL", write.committer.email.as_str()),
            ("GIT_COMMITTER_DATE", write.committer.date.as_str()),
        ];
        args.extend(["-F", "-"]);
        self.git(&args, &env, write.message.as_bytes())
    }

    /// A write of `write.path` on its state ref, as a gitstate write would make it: the parent is
    /// the ref's tip, or the branch tip for its first. The ref moves by compare-and-swap.
    /// Returns the state commit.
    pub fn state_write(&self, write: &StateWrite) -> String {
        let name = self.state_ref(&write.path);
        let old = self.tip(&name);
        let parent = old
            .clone()
            .or_else(|| self.tip(&self.branch))
            .expect("a branch to write on");
        let blob = self.blob(&write.content);
        let tree = self.tree(None, &[(&write.path, Some(&blob))]);
        let commit = self.commit(&tree, Some(&parent), write);
        let old = old.unwrap_or_else(|| "0".repeat(40));
        self.git(&["update-ref", &name, &commit, &old], &[], b"");
        commit
    }

    /// A commit on the branch that puts `content` at `path` (`None`: removes it), as a writer
    /// that goes straight to the branch makes it. Returns the commit.
    pub fn branch_write(&self, path: &str, content: Option<&[u8]>, write: &StateWrite) -> String {
        let old = self.tip(&self.branch);
        let blob = content.map(|c| self.blob(c));
        let tree = self.tree(old.as_deref(), &[(path, blob.as_deref())]);
        let commit = self.commit(&tree, old.as_deref(), write);
        let branch = format!(
            "refs/heads/{}",
            self.branch.trim_start_matches("refs/heads/")
        );
        let old = old.unwrap_or_else(|| "0".repeat(40));
        self.git(&["update-ref", &branch, &commit, &old], &[], b"");
        commit
    }

    /// Start this branch as the docs say a new branch of states starts beside others: an orphan
    /// commit holding the empty index (a branch made from another branch of states is a copy
    /// of it, and refused). Returns the commit.
    pub fn start_branch(&self) -> String {
        let stamp = Stamp {
            name: "ops".into(),
            email: "ops@example.invalid".into(),
            date: "1700000000 +0000".into(),
        };
        let write = StateWrite {
            path: ".gitstate/index.json".into(),
            content: Vec::new(),
            author: stamp.clone(),
            committer: stamp,
            message: "start a branch of states\n".into(),
        };
        assert!(self.tip(&self.branch).is_none(), "{} exists", self.branch);
        let index = br#"{"format":1,"states":{}}"#;
        self.branch_write(".gitstate/index.json", Some(index), &write)
    }

    /// The file at `path` on the branch tip.
    pub fn file(&self, path: &str) -> Option<Vec<u8>> {
        let out = Command::new("git")
            .arg("--git-dir")
            .arg(&self.dir)
            .args(["cat-file", "blob", &format!("{}:{path}", self.branch)])
            .output()
            .expect("git runs");
        out.status.success().then_some(out.stdout)
    }

    /// The first-parent history of the branch that changed `path`, oldest first.
    pub fn log(&self, path: &str) -> Vec<Logged> {
        let out = self.git(
            &[
                "log",
                "--first-parent",
                "--reverse",
                "--date=raw",
                "--format=%H%x01%an%x01%ae%x01%ad%x01%cn%x01%ce%x01%cd%x01%B%x02",
                &self.branch,
                "--",
                path,
            ],
            &[],
            b"",
        );
        out.split('\u{2}')
            .map(|entry| entry.trim_start_matches('\n'))
            .filter(|entry| !entry.is_empty())
            .map(|entry| {
                let f: Vec<&str> = entry.splitn(8, '\u{1}').collect();
                let stamp = |i: usize| Stamp {
                    name: f[i].to_owned(),
                    email: f[i + 1].to_owned(),
                    date: f[i + 2].to_owned(),
                };
                Logged {
                    id: f[0].to_owned(),
                    author: stamp(1),
                    committer: stamp(4),
                    message: f[7].to_owned(),
                }
            })
            .collect()
    }

    /// `.gitstate/folded.json` on the branch tip.
    pub fn folded(&self) -> BTreeMap<String, String> {
        self.file(".gitstate/folded.json")
            .map(|bytes| serde_json::from_slice(&bytes).expect("folded.json is JSON"))
            .unwrap_or_default()
    }

    /// `.gitstate/index.json` on the branch tip.
    pub fn index(&self) -> serde_json::Value {
        self.file(".gitstate/index.json")
            .map(|bytes| serde_json::from_slice(&bytes).expect("index.json is JSON"))
            .unwrap_or(serde_json::Value::Null)
    }

    /// The blob id of `path` on the branch tip.
    pub fn blob_id(&self, path: &str) -> Option<String> {
        self.tip(&format!("{}:{path}", self.branch))
    }
}
