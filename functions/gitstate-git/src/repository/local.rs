//! The embedded default: the "remote" is a local bare repository, updated with ref transactions
//! that have the same create-only and compare-and-swap semantics a git server gives a push.

use std::sync::{Arc, Mutex};

use gix::ObjectId;
use gix::refs::Target;
use gix::refs::transaction::{Change, LogChange, PreviousValue, RefEdit, RefLog};

use gitstate_core::refs::paths_clash;

use super::Cache;
use super::{Corruption, Error};
use crate::protocol::{Advert, Command, PushReport};
use crate::sync::lock;

pub struct LocalRefs {
    repo: Arc<Cache>,
    /// Serialises transactions of this process; other processes are held off by git's lock files.
    serial: Mutex<()>,
}

impl LocalRefs {
    pub fn new(repo: Arc<Cache>) -> Self {
        Self {
            repo,
            serial: Mutex::new(()),
        }
    }

    /// The current tips of `names` (missing refs are left out), with the capabilities a push here has.
    pub fn list(&self, names: &[String]) -> Result<Advert, Error> {
        let repo = self.repo.repo()?;
        let mut advert = Advert {
            caps: ["report-status", "delete-refs", "atomic"]
                .map(str::to_owned)
                .to_vec(),
            ..Advert::default()
        };
        for name in names {
            if let Some(mut reference) = repo.try_find_reference(name.as_str())? {
                let id = reference.peel_to_id()?.detach();
                advert.refs.insert(name.clone(), id);
            }
        }
        Ok(advert)
    }

    /// The ref `HEAD` names (e.g. `refs/heads/main`), if it is symbolic.
    pub fn head_target(&self) -> Option<String> {
        let repo = self.repo.repo().ok()?;
        let name = repo.head_name().ok()??;
        Some(name.as_bstr().to_string())
    }

    /// Every reference under `prefix` (e.g. `refs/heads/locks/`), as an advertisement.
    pub fn list_prefix(&self, prefix: &str) -> Result<Advert, Error> {
        let repo = self.repo.repo()?;
        let mut advert = Advert::default();
        let platform = repo
            .references()
            .map_err(|e| Error::Corrupt(Corruption::ListingRefs(e.to_string())))?;
        let all = platform
            .prefixed(prefix)
            .map_err(|e| Error::Corrupt(Corruption::ListingRefs(e.to_string())))?;
        for reference in all {
            let mut reference =
                reference.map_err(|e| Error::Corrupt(Corruption::Reference(e.to_string())))?;
            let name = reference.name().as_bstr().to_string();
            let id = reference.peel_to_id()?.detach();
            advert.refs.insert(name, id);
        }
        Ok(advert)
    }

    /// An existing ref that one of the refs `commands` create would clash with.
    fn in_the_way(&self, commands: &[Command]) -> Result<Option<String>, Error> {
        let created: Vec<&str> = commands
            .iter()
            .filter(|c| c.old.is_null() && !c.new.is_null())
            .map(|c| c.name.as_str())
            .collect();
        if created.is_empty() {
            return Ok(None);
        }
        let all = self.list_prefix("refs/")?;
        Ok(all
            .refs
            .into_keys()
            .find(|other| created.iter().any(|new| paths_clash(other, new))))
    }

    /// Apply `commands` in one transaction: all succeed, or none does and each is reported `ng`.
    pub fn push(&self, commands: &[Command]) -> Result<PushReport, Error> {
        let _serial = lock(&self.serial);
        let repo = self.repo.repo()?;
        let edits = commands
            .iter()
            .map(|c| -> Result<RefEdit, Error> {
                let name = c
                    .name
                    .as_str()
                    .try_into()
                    .map_err(|_| Error::RefName(c.name.clone()))?;
                let change = if c.new.is_null() {
                    Change::Delete {
                        expected: PreviousValue::MustExistAndMatch(Target::Object(c.old)),
                        log: RefLog::AndReference,
                    }
                } else {
                    Change::Update {
                        log: LogChange::default(),
                        expected: if c.old.is_null() {
                            PreviousValue::MustNotExist
                        } else {
                            PreviousValue::MustExistAndMatch(Target::Object(c.old))
                        },
                        new: Target::Object(c.new),
                    }
                };
                Ok(RefEdit {
                    change,
                    name,
                    deref: false,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let verdict = match repo.edit_references(edits) {
            Ok(_) => Ok(()),
            Err(error) => {
                // Decide from the refs, not from the error text: if any expectation no longer
                // holds, this is a lost race; otherwise something else broke.
                let names: Vec<String> = commands.iter().map(|c| c.name.clone()).collect();
                let now = self.list(&names)?;
                let raced = commands
                    .iter()
                    .any(|c| now.tip(&c.name).unwrap_or(ObjectId::null(c.old.kind())) != c.old);
                if raced {
                    Err("failed to update ref".to_owned())
                } else if let Some(other) = self.in_the_way(commands)? {
                    // A ref created next to one it clashes with (`a/b` while `a` exists): what
                    // git's receive-pack reports as a directory/file conflict. The caller looks
                    // at the refs again, as after any refused push.
                    Err(format!("directory/file conflict with {other}"))
                } else if error.is_conflict() {
                    // An expectation that failed under the ref's lock (gix's typed
                    // `ReferenceOutOfDate`, `MustNotExist`), whose ref another process put back
                    // before the look above (a fold lease taken and released): a lost race too.
                    Err("failed to update ref".to_owned())
                } else {
                    return Err(error.into());
                }
            }
        };
        Ok(PushReport {
            refs: commands
                .iter()
                .map(|c| (c.name.clone(), verdict.clone()))
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &std::path::Path, args: &[&str], stdin: &str) -> String {
        use std::io::Write;
        let mut child = std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("git runs");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("stdin");
        let out = child.wait_with_output().expect("git");
        assert!(out.status.success(), "git {args:?}");
        String::from_utf8(out.stdout)
            .expect("utf-8")
            .trim()
            .to_owned()
    }

    /// A ref created next to one it clashes with, by someone else after the caller's look (every
    /// shape: below an existing ref, above one, deeper): the push is reported refused (`ng`),
    /// as git http-backend does, so the caller looks at the refs again, never an error (500).
    #[test]
    fn a_ref_that_clashes_is_refused_not_an_error() {
        for (existing, created) in [
            ("refs/heads/env/a", "refs/heads/env/a/b"),
            ("refs/heads/env/a", "refs/heads/env/a/b/c"),
            ("refs/heads/env/c/d", "refs/heads/env/c"),
            ("refs/heads/locks/x/y.tfstate", "refs/heads/locks/x"),
        ] {
            let dir = tempfile::tempdir().expect("tempdir");
            git(dir.path(), &["init", "--bare", "-q", "."], "");
            let tree = git(dir.path(), &["mktree"], "");
            let commit = git(dir.path(), &["commit-tree", &tree, "-m", "c"], "");
            git(dir.path(), &["update-ref", existing, &commit], "");
            let refs = LocalRefs::new(Arc::new(Cache::open_or_init(dir.path()).expect("cache")));
            let id = ObjectId::from_hex(commit.as_bytes()).expect("id");
            let command = Command {
                old: ObjectId::null(id.kind()),
                new: id,
                name: created.to_owned(),
            };
            let report = refs
                .push(std::slice::from_ref(&command))
                .expect("refused, not an error");
            assert!(!report.all_ok(&[command]), "{created}");
            let why = format!("{report:?}");
            assert!(why.contains(existing), "{why}");
            let now = git(dir.path(), &["for-each-ref", "--format=%(refname)"], "");
            assert_eq!(now, existing, "{created}: nothing written");
        }
    }

    /// What [`LocalRefs::push`] relies on when another process puts a ref back between a
    /// failed edit and its look at the refs (a fold lease taken and released): gix classifies
    /// every expectation that fails under the ref's lock as a conflict, a create over an
    /// existing ref, an update or a delete from another value.
    #[test]
    fn a_failed_expectation_is_a_conflict() {
        let dir = tempfile::tempdir().expect("tempdir");
        git(dir.path(), &["init", "--bare", "-q", "."], "");
        let tree = git(dir.path(), &["mktree"], "");
        let first = git(dir.path(), &["commit-tree", &tree, "-m", "a"], "");
        let second = git(dir.path(), &["commit-tree", &tree, "-m", "b"], "");
        git(
            dir.path(),
            &["update-ref", "refs/gitstate/fold", &first],
            "",
        );
        let cache = Cache::open_or_init(dir.path()).expect("cache");
        let repo = cache.repo().expect("repo");
        let (first, second) = (
            ObjectId::from_hex(first.as_bytes()).expect("id"),
            ObjectId::from_hex(second.as_bytes()).expect("id"),
        );
        for (label, change) in [
            (
                "create",
                Change::Update {
                    log: LogChange::default(),
                    expected: PreviousValue::MustNotExist,
                    new: Target::Object(second),
                },
            ),
            (
                "update",
                Change::Update {
                    log: LogChange::default(),
                    expected: PreviousValue::MustExistAndMatch(Target::Object(second)),
                    new: Target::Object(first),
                },
            ),
            (
                "delete",
                Change::Delete {
                    expected: PreviousValue::MustExistAndMatch(Target::Object(second)),
                    log: RefLog::AndReference,
                },
            ),
        ] {
            let edit = RefEdit {
                change,
                name: "refs/gitstate/fold".try_into().expect("name"),
                deref: false,
            };
            let error = repo.edit_references([edit]).expect_err(label);
            assert!(error.is_conflict(), "{label}: {error:?}");
        }
    }
}
