//! Validated names: state paths inside the repository and branch names.
//!
//! A state name doubles as part of a git ref (`<lock prefix><name>`), so its rules are the
//! intersection of "a safe relative path" and "a valid ref name".

use std::fmt;

/// Longest state name accepted, in bytes.
pub const MAX_NAME_BYTES: usize = 200;

/// Why a name was refused. Each variant is one rule, worded for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("the name is empty")]
    Empty,
    #[error("the name is longer than {MAX_NAME_BYTES} bytes")]
    TooLong,
    #[error("the name has an empty path segment (leading, trailing or doubled '/')")]
    EmptySegment,
    #[error("segment {0:?} has a character outside [A-Za-z0-9._-]")]
    BadCharacter(String),
    #[error("segment {0:?} starts with '.'")]
    LeadingDot(String),
    #[error("segment {0:?} ends with '.' (git refuses such ref names)")]
    TrailingDot(String),
    #[error("segment {0:?} ends with '.lock'")]
    LockSuffix(String),
    #[error("the name contains '..'")]
    DoubleDot,
    #[error("segment {0:?} starts with '-'")]
    LeadingDash(String),
}

fn check_path(name: &str, max: usize) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > max {
        return Err(NameError::TooLong);
    }
    if name.contains("..") {
        return Err(NameError::DoubleDot);
    }
    for segment in name.split('/') {
        if segment.is_empty() {
            return Err(NameError::EmptySegment);
        }
        if !segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(NameError::BadCharacter(printable(segment)));
        }
        if segment.starts_with('.') {
            return Err(NameError::LeadingDot(segment.to_owned()));
        }
        if segment.ends_with(".lock") {
            return Err(NameError::LockSuffix(segment.to_owned()));
        }
        // git refuses a ref ending in '.'; a folder ending in '.' is refused too, so a name
        // is never valid only as a folder of another (and Windows drops trailing dots).
        if segment.ends_with('.') {
            return Err(NameError::TrailingDot(segment.to_owned()));
        }
    }
    // The rest of git's ref rules (`git check-ref-format`) cannot be broken with the characters
    // above: no '@' (so neither "@" nor "@{"), no control, space, '~^:?*[\\', no '//'.
    Ok(())
}

/// Keeps error messages one line and free of control characters.
fn printable(s: &str) -> String {
    s.chars()
        .take(64)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// The path of one state file in the repository, e.g. `network/prod.tfstate`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateName(String);

impl StateName {
    pub fn parse(name: &str) -> Result<Self, NameError> {
        check_path(name, MAX_NAME_BYTES)?;
        Ok(Self(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Path of the lock file inside a lock commit, as the seed protocol names it.
    pub fn lock_file(&self) -> String {
        format!("{}.lock", self.0)
    }

    /// Whether this state lives in the reserved configuration folder of the repository.
    pub fn is_reserved(&self) -> bool {
        // `.gitstate/` cannot be named (leading dot), but keep the check explicit for the day the
        // rules loosen.
        self.0.starts_with(".gitstate/")
    }
}

impl fmt::Display for StateName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// terraform-backend-git's branch when neither its settings nor its address name one.
pub const SEED_BRANCH: &str = "master";

/// A branch of the state repository (`main`, `env/prod`), without `refs/heads/`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BranchName(String);

impl BranchName {
    pub fn parse(name: &str) -> Result<Self, NameError> {
        let name = name.strip_prefix("refs/heads/").unwrap_or(name);
        check_path(name, MAX_NAME_BYTES)?;
        if let Some(segment) = name.split('/').find(|s| s.starts_with('-')) {
            return Err(NameError::LeadingDash(segment.to_owned()));
        }
        Ok(Self(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn full_ref(&self) -> String {
        format!("refs/heads/{}", self.0)
    }
}

impl fmt::Display for BranchName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_nested_paths() {
        for ok in [
            "prod.tfstate",
            "network/prod.tfstate",
            "a/b/c_d-e.json",
            "x",
        ] {
            assert_eq!(
                StateName::parse(ok).map(|n| n.to_string()),
                Ok(ok.to_owned())
            );
        }
    }

    #[test]
    fn every_rule_refuses() {
        let long = "a".repeat(MAX_NAME_BYTES + 1);
        let cases: &[(&str, NameError)] = &[
            ("", NameError::Empty),
            (&long, NameError::TooLong),
            ("a//b", NameError::EmptySegment),
            ("/a", NameError::EmptySegment),
            ("a/", NameError::EmptySegment),
            ("a b", NameError::BadCharacter("a b".into())),
            ("a\u{0}b", NameError::BadCharacter("a?b".into())),
            ("é.tfstate", NameError::BadCharacter("é.tfstate".into())),
            ("a:b", NameError::BadCharacter("a:b".into())),
            (".git/config", NameError::LeadingDot(".git".into())),
            (
                ".gitstate/access.toml",
                NameError::LeadingDot(".gitstate".into()),
            ),
            ("a/prod.lock", NameError::LockSuffix("prod.lock".into())),
            ("a/../b", NameError::DoubleDot),
            ("a..b", NameError::DoubleDot),
            ("prod.", NameError::TrailingDot("prod.".into())),
            ("a./b", NameError::TrailingDot("a.".into())),
            ("a/b.tfstate.", NameError::TrailingDot("b.tfstate.".into())),
        ];
        for (input, want) in cases {
            assert_eq!(
                StateName::parse(input).as_ref(),
                Err(want),
                "input {input:?}"
            );
        }
    }

    /// Every name `StateName::parse` accepts makes a ref the real git accepts
    /// (`refs/heads/locks/<name>`), and every branch `BranchName::parse` accepts is one too:
    /// a few thousand generated names, checked by one `git update-ref --stdin`, whose `verify`
    /// runs git's ref-name check on each (and changes nothing; each transaction is aborted).
    #[test]
    fn accepted_names_are_git_ref_names() {
        use rand::{Rng, SeedableRng};
        use std::io::Write;
        use std::process::{Command, Stdio};

        const PIECES: &[&str] = &[
            "a", "Z", "0", ".", ".", "..", "-", "_", "/", "lock", ".lock", "tfstate", "@", "{",
            "~", " ",
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x6e61_6d65);
        let mut refs = std::collections::BTreeSet::new();
        let mut trailing_dots = 0;
        while refs.len() < 4000 {
            let len = rng.random_range(1..8);
            let name: String = (0..len)
                .map(|_| PIECES[rng.random_range(0..PIECES.len())])
                .collect();
            if name.ends_with('.') {
                trailing_dots += 1;
            }
            if let Ok(state) = StateName::parse(&name) {
                refs.insert(format!("refs/heads/locks/{state}"));
            }
            if let Ok(branch) = BranchName::parse(&name) {
                refs.insert(branch.full_ref());
            }
        }
        assert!(trailing_dots > 100, "the generator makes trailing dots");
        let dir = std::env::temp_dir().join(format!("gitstate-refnames-{}", std::process::id()));
        let init = Command::new("git")
            .args(["init", "-q", "--bare"])
            .arg(&dir)
            .status()
            .expect("git runs");
        assert!(init.success());
        let mut child = Command::new("git")
            .arg("--git-dir")
            .arg(&dir)
            .args(["update-ref", "--stdin"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("git runs");
        let mut input = String::new();
        for r in &refs {
            // One transaction each: names that are folders of others (`a`, `a/b`) are fine
            // here, as the lock refs of different states never share a transaction.
            input.push_str(&format!("start\nverify {r} {}\nabort\n", "0".repeat(40)));
        }
        // git stops at the first refused name; the status and its message tell which.
        let _ = child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes());
        let out = child.wait_with_output().expect("git ends");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            out.status.success(),
            "git refuses an accepted name: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn exactly_max_bytes_is_fine() {
        assert!(StateName::parse(&"a".repeat(MAX_NAME_BYTES)).is_ok());
    }

    #[test]
    fn branches_strip_prefix_and_refuse_dash() {
        assert_eq!(
            BranchName::parse("refs/heads/main").map(|b| b.full_ref()),
            Ok("refs/heads/main".into())
        );
        assert_eq!(
            BranchName::parse("-x"),
            Err(NameError::LeadingDash("-x".into()))
        );
    }
}
