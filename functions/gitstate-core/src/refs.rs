//! Which branches requests may address, and which names git cannot hold side by side.
//!
//! Git stores refs and tree entries as paths: a ref (or file) `a` and a ref (or file) `a/b`
//! cannot both exist (a directory/file conflict). Every rule here is that one fact applied to
//! the branch, the lock refs and the state files.

use std::fmt;

use crate::{BranchName, NameError};

/// The lock ref prefix of the seed tool, and the default.
pub const DEFAULT_LOCK_PREFIX: &str = "refs/heads/locks/";

/// Whether `parent` is a proper path prefix of `child` (`a` of `a/b`, not of `ab`).
pub fn is_parent(parent: &str, child: &str) -> bool {
    child.len() > parent.len()
        && child.starts_with(parent)
        && child.as_bytes().get(parent.len()) == Some(&b'/')
}

/// Whether two paths (ref names, or file paths in a tree) cannot exist together: one is a
/// proper path prefix of the other.
pub fn paths_clash(a: &str, b: &str) -> bool {
    is_parent(a, b) || is_parent(b, a)
}

/// Whether the full ref `full_ref` lies under the lock namespace `prefix` (which ends in `/`) or
/// would clash with it (is the namespace itself or one of its parents).
pub fn clashes_with_lock_prefix(full_ref: &str, prefix: &str) -> bool {
    let namespace = prefix.trim_end_matches('/');
    full_ref.starts_with(prefix) || full_ref == namespace || is_parent(full_ref, namespace)
}

/// Why a name cannot be used where it is: what git already holds in its way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Clash {
    /// A proper prefix of the name is a state file (`a/b.tfstate` while `a` is a state).
    #[error("it lies below the state {0:?}")]
    BelowState(String),
    /// The name is a folder holding states (`team/app` while `team/app/prod.tfstate` exists).
    #[error("it is a folder holding the state {0:?}")]
    Folder(String),
    /// The name is not a state, but is a [`near_name`] of one (`Team/App.tfstate`, `team/app`
    /// or `team/app.tfstate.tfstate` while `team/app.tfstate` exists): a typo in a backend
    /// address, or a second state that a checkout on a case-insensitive file system (macOS,
    /// Windows) cannot hold beside the first.
    #[error(
        "it is no state, but differs only in letter case or in a .tfstate or .json ending from the state {0:?}"
    )]
    NearName(String),
    /// The name's lock ref would clash with the lock held on this state.
    #[error("its lock ref would clash with the lock held on {0:?}")]
    LockRef(String),
    /// The write would create its branch, and that ref clashes with this existing branch
    /// (`env/a/b` while `env/a` exists, or the reverse).
    #[error(
        "its branch {branch:?} cannot be created: it clashes with the existing branch {existing:?}"
    )]
    Branch { branch: String, existing: String },
    /// A state the caller may not read is in the way; its name is not told.
    #[error("it clashes with a state you cannot read")]
    Unreadable,
}

impl Clash {
    /// The clash as told to a caller: the other state is named only when `readable` says the
    /// caller may read it. A branch clash names a branch, not a state, and is kept.
    pub fn told(self, readable: impl Fn(&str) -> bool) -> Self {
        match &self {
            Self::BelowState(other)
            | Self::Folder(other)
            | Self::NearName(other)
            | Self::LockRef(other)
                if !readable(other) =>
            {
                Self::Unreadable
            }
            _ => self,
        }
    }
}

/// Whether `other` is a near name of `name`: another name that a slip in an address makes of it.
/// Both have the same folders, ignoring ASCII letter case, and the same file name, ignoring
/// ASCII letter case and any `.tfstate` or `.json` endings (`Network/Prod`, `network/prod.json`
/// and `network/prod.tfstate.tfstate` beside `network/prod.tfstate`).
pub fn near_name(name: &str, other: &str) -> bool {
    let ((folder, file), (other_folder, other_file)) =
        (folder_and_file(name), folder_and_file(other));
    name != other
        && folder.eq_ignore_ascii_case(other_folder)
        && file_stem(file).eq_ignore_ascii_case(file_stem(other_file))
}

fn folder_and_file(name: &str) -> (&str, &str) {
    name.rsplit_once('/').unwrap_or(("", name))
}

/// A file name without its `.tfstate` and `.json` endings, however many and in any case.
pub fn file_stem(file: &str) -> &str {
    let mut stem = file;
    while let Some(cut) = [".tfstate", ".json"].iter().find_map(|ending| {
        let at = stem.len().checked_sub(ending.len())?;
        let tail = stem.get(at..)?;
        tail.eq_ignore_ascii_case(ending).then(|| &stem[..at])
    }) {
        stem = cut;
    }
    stem
}

/// The tree rule: how `name` clashes with the files `files` of a branch, if it does (a name
/// that is a file is never a near name).
pub fn tree_clash<'a>(files: impl IntoIterator<Item = &'a str>, name: &str) -> Option<Clash> {
    let mut folder: Option<&str> = None;
    let mut variant: Option<&str> = None;
    let mut exists = false;
    for file in files {
        if is_parent(file, name) {
            return Some(Clash::BelowState(file.to_owned()));
        }
        if is_parent(name, file) && folder.is_none_or(|f| file < f) {
            folder = Some(file);
        }
        exists |= file == name;
        if near_name(name, file) && variant.is_none_or(|v| file < v) {
            variant = Some(file);
        }
    }
    folder.map(|f| Clash::Folder(f.to_owned())).or_else(|| {
        variant
            .filter(|_| !exists)
            .map(|v| Clash::NearName(v.to_owned()))
    })
}

/// The lock rule: the held lock (by state name) whose ref would clash with the lock of `name`.
pub fn lock_clash<'a>(held: impl IntoIterator<Item = &'a str>, name: &str) -> Option<Clash> {
    held.into_iter()
        .filter(|other| paths_clash(other, name))
        .min()
        .map(|other| Clash::LockRef(other.to_owned()))
}

/// The branch rule: the existing branch, among the full refs `refs` (any refs; only branches can
/// clash with a branch), in the way of creating `branch`.
pub fn branch_clash<'a>(
    refs: impl IntoIterator<Item = &'a str>,
    branch: &BranchName,
) -> Option<Clash> {
    let full = branch.full_ref();
    refs.into_iter()
        .filter(|other| paths_clash(other, &full))
        .min()
        .map(|other| Clash::Branch {
            branch: branch.to_string(),
            existing: other
                .strip_prefix("refs/heads/")
                .unwrap_or(other)
                .to_owned(),
        })
}

/// One entry of `GITSTATE_ALLOWED_REFS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefPattern {
    /// Exactly this branch.
    Exact(BranchName),
    /// `prefix/*`: any branch strictly below `prefix/` (the stored text ends in `/`).
    Below(String),
}

impl RefPattern {
    fn matches(&self, branch: &BranchName) -> bool {
        match self {
            Self::Exact(exact) => exact == branch,
            Self::Below(prefix) => branch.as_str().starts_with(prefix.as_str()),
        }
    }
}

impl fmt::Display for RefPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(branch) => write!(f, "{branch}"),
            Self::Below(prefix) => write!(f, "{prefix}*"),
        }
    }
}

/// `GITSTATE_ALLOWED_REFS`: branches besides the configured one that `?ref=` may name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedRefs(Vec<RefPattern>);

/// A malformed allowlist entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("{0:?}: {1}")]
    Name(String, #[source] NameError),
    #[error("{0:?}: '*' is only allowed as a whole last segment, as in env/*")]
    Wildcard(String),
}

impl AllowedRefs {
    /// Parse a comma-separated list of branch names and `prefix/*` patterns.
    pub fn parse(text: &str) -> Result<Self, PatternError> {
        let mut patterns = Vec::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let pattern = match entry.strip_suffix("/*") {
                Some(prefix) if !prefix.contains('*') => {
                    let prefix = BranchName::parse(prefix)
                        .map_err(|e| PatternError::Name(entry.to_owned(), e))?;
                    RefPattern::Below(format!("{prefix}/"))
                }
                _ if entry.contains('*') => return Err(PatternError::Wildcard(entry.to_owned())),
                _ => RefPattern::Exact(
                    BranchName::parse(entry)
                        .map_err(|e| PatternError::Name(entry.to_owned(), e))?,
                ),
            };
            patterns.push(pattern);
        }
        Ok(Self(patterns))
    }

    pub fn patterns(&self) -> &[RefPattern] {
        &self.0
    }

    pub fn matches(&self, branch: &BranchName) -> bool {
        self.0.iter().any(|p| p.matches(branch))
    }
}

/// A configuration whose refs clash: named by the setting at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting}: {reason}")]
pub struct RefConfigError {
    pub setting: &'static str,
    pub reason: String,
}

/// A `?ref=` that may not be used. One line, for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ref {branch:?} is not allowed: {reason}")]
pub struct RefRefused {
    pub branch: String,
    pub reason: String,
}

/// The branches requests may address: the configured one, and the allowlisted ones that clash
/// neither with the lock refs nor with the configured branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefPolicy {
    branch: BranchName,
    lock_prefix: String,
    allowed: AllowedRefs,
}

impl RefPolicy {
    /// Check a configuration: the configured branch and every allowlist entry must be usable.
    /// `lock_prefix` must start with `refs/` and end with `/` (the settings check that).
    pub fn new(
        branch: BranchName,
        lock_prefix: &str,
        allowed: AllowedRefs,
    ) -> Result<Self, RefConfigError> {
        if clashes_with_lock_prefix(&branch.full_ref(), lock_prefix) {
            return Err(RefConfigError {
                setting: "GITSTATE_REF",
                reason: format!(
                    "branch {branch:?} clashes with the lock refs under {lock_prefix} (GITSTATE_LOCK_REF_PREFIX)"
                ),
            });
        }
        for pattern in allowed.patterns() {
            let (full, everything) = match pattern {
                RefPattern::Exact(exact) => (exact.full_ref(), true),
                RefPattern::Below(prefix) => (format!("refs/heads/{prefix}"), false),
            };
            // A pattern is refused when every branch it matches would be refused.
            let under_locks = if everything {
                clashes_with_lock_prefix(&full, lock_prefix)
            } else {
                full.starts_with(lock_prefix)
            };
            let configured = branch.full_ref();
            let on_branch = if everything {
                paths_clash(&full, &configured)
            } else {
                full.trim_end_matches('/') == configured
                    || full.starts_with(&format!("{configured}/"))
            };
            let reason = if under_locks {
                format!("{pattern} clashes with the lock refs under {lock_prefix}")
            } else if on_branch {
                format!("{pattern} clashes with the configured branch {branch:?} (GITSTATE_REF)")
            } else {
                continue;
            };
            return Err(RefConfigError {
                setting: "GITSTATE_ALLOWED_REFS",
                reason,
            });
        }
        Ok(Self {
            branch,
            lock_prefix: lock_prefix.to_owned(),
            allowed,
        })
    }

    /// Only the configured branch, locks under the default prefix (for tests and defaults).
    pub fn only(branch: BranchName) -> Self {
        Self {
            branch,
            lock_prefix: DEFAULT_LOCK_PREFIX.to_owned(),
            allowed: AllowedRefs::default(),
        }
    }

    pub fn branch(&self) -> &BranchName {
        &self.branch
    }

    /// Whether `?ref=<branch>` may be used.
    pub fn check(&self, branch: &BranchName) -> Result<(), RefRefused> {
        if *branch == self.branch {
            return Ok(());
        }
        let full = branch.full_ref();
        let refuse = |reason: String| {
            Err(RefRefused {
                branch: branch.to_string(),
                reason,
            })
        };
        if clashes_with_lock_prefix(&full, &self.lock_prefix) {
            return refuse(format!(
                "it is, or clashes with, the lock refs under {}",
                self.lock_prefix
            ));
        }
        if paths_clash(&full, &self.branch.full_ref()) {
            return refuse(format!(
                "it clashes with the configured branch {:?}",
                self.branch.as_str()
            ));
        }
        if !self.allowed.matches(branch) {
            return refuse(format!(
                "only {:?} and the branches of GITSTATE_ALLOWED_REFS may be used",
                self.branch.as_str()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn branch(name: &str) -> BranchName {
        BranchName::parse(name).expect("valid branch")
    }

    /// Every slip of a generated name is a near name of it, and of nothing unrelated: a name
    /// whose file or folders differ beyond case and endings is not.
    #[test]
    fn a_name_is_near_its_slips_and_nothing_else() {
        let mut rng = StdRng::seed_from_u64(61);
        let endings = [
            "",
            ".tfstate",
            ".json",
            ".TFSTATE",
            ".tfstate.tfstate",
            ".json.tfstate",
        ];
        for _ in 0..2000 {
            let folder = random_path(&mut rng);
            let stem = ["app", "x", "prod.v2", ".tfstate"][rng.random_range(0..4)];
            let name = format!(
                "{folder}/{stem}{}",
                endings[rng.random_range(0..endings.len())]
            );
            let case = |text: &str, rng: &mut StdRng| -> String {
                text.chars()
                    .map(|c| match rng.random_bool(0.3) {
                        true => c.to_ascii_uppercase(),
                        false => c,
                    })
                    .collect()
            };
            let ending = endings[rng.random_range(0..endings.len())];
            let slip = format!(
                "{}/{}{ending}",
                case(&folder, &mut rng),
                case(stem, &mut rng)
            );
            assert_eq!(near_name(&name, &slip), name != slip, "{name} / {slip}");
            assert_eq!(
                near_name(&slip, &name),
                name != slip,
                "symmetric: {name} / {slip}"
            );
            let elsewhere = format!("{folder}x/{stem}{ending}");
            assert!(!near_name(&name, &elsewhere), "{name} / {elsewhere}");
            let other_file = format!("{folder}/{stem}s{ending}");
            assert!(!near_name(&name, &other_file), "{name} / {other_file}");
            let deeper = format!("{folder}/{stem}/{stem}{ending}");
            assert!(!near_name(&name, &deeper), "{name} / {deeper}");
        }
        assert_eq!(file_stem("prod.tfstate.json.TFSTATE"), "prod");
        assert_eq!(file_stem("prod.tfstates"), "prod.tfstates");
        assert_eq!(file_stem("é.json"), "é");
    }

    /// A random path over a tiny alphabet, so that prefixes and clashes are frequent.
    fn random_path(rng: &mut StdRng) -> String {
        let segments = rng.random_range(1..=3);
        (0..segments)
            .map(|_| ["a", "b", "locks", "main", "ma"][rng.random_range(0..5)])
            .collect::<Vec<_>>()
            .join("/")
    }

    #[test]
    fn parent_and_clash() {
        assert!(is_parent("a", "a/b"));
        assert!(!is_parent("a", "ab"));
        assert!(!is_parent("a", "a"));
        assert!(paths_clash("a/b", "a"));
        assert!(!paths_clash("a/b", "a/c"));
        for (full, prefix, want) in [
            ("refs/heads/locks/x", "refs/heads/locks/", true),
            ("refs/heads/locks", "refs/heads/locks/", true),
            ("refs/heads/locksmith", "refs/heads/locks/", false),
            ("refs/heads/locks", "refs/locks/", false),
            ("refs/heads/a", "refs/heads/a/b/", true),
        ] {
            assert_eq!(
                clashes_with_lock_prefix(full, prefix),
                want,
                "{full} {prefix}"
            );
        }
    }

    #[test]
    fn allowlist_syntax() {
        let allowed = AllowedRefs::parse(" dev , env/* ,").expect("valid");
        assert_eq!(allowed.patterns().len(), 2);
        assert!(allowed.matches(&branch("env/prod")));
        assert!(allowed.matches(&branch("env/a/b")));
        assert!(!allowed.matches(&branch("env")));
        assert!(!allowed.matches(&branch("environment")));
        assert!(allowed.matches(&branch("dev")));
        assert!(!allowed.matches(&branch("dev/x")));
        for bad in ["*", "a*", "env/*/x", "a..b/*", "/*", "x/**"] {
            assert!(AllowedRefs::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn configurations_that_clash_are_refused() {
        let none = AllowedRefs::default;
        assert!(RefPolicy::new(branch("locks"), DEFAULT_LOCK_PREFIX, none()).is_err());
        assert!(RefPolicy::new(branch("locks/x"), DEFAULT_LOCK_PREFIX, none()).is_err());
        assert!(RefPolicy::new(branch("locks"), "refs/locks/", none()).is_ok());
        for entry in ["locks", "locks/*", "locks/a/*", "main/x", "main/*"] {
            let allowed = AllowedRefs::parse(entry).expect("syntax");
            let error =
                RefPolicy::new(branch("main"), DEFAULT_LOCK_PREFIX, allowed).expect_err(entry);
            assert_eq!(error.setting, "GITSTATE_ALLOWED_REFS", "{entry}");
        }
        let error = RefPolicy::new(
            branch("ma/in"),
            DEFAULT_LOCK_PREFIX,
            AllowedRefs::parse("ma").expect("syntax"),
        )
        .expect_err("parent of the branch");
        assert!(error.to_string().contains("configured branch"), "{error}");
        // Partly clashing patterns are allowed; their clashing members are refused per request.
        let policy = RefPolicy::new(
            branch("env/main"),
            "refs/heads/env/locks/",
            AllowedRefs::parse("env/*").expect("syntax"),
        )
        .expect("partial clash is fine");
        assert!(policy.check(&branch("env/prod")).is_ok());
        assert!(policy.check(&branch("env/locks/a")).is_err());
        assert!(policy.check(&branch("env/locks")).is_err());
        assert!(policy.check(&branch("env/main/x")).is_err());
    }

    /// Seeded random branches, prefixes and allowlists: whatever is accepted is the configured
    /// branch or allowlisted, never clashes with the lock namespace or the configured branch.
    #[test]
    fn accepted_refs_never_clash_generated() {
        let mut rng = StdRng::seed_from_u64(12);
        let mut accepted = 0;
        for _ in 0..20_000 {
            let configured = branch(&random_path(&mut rng));
            let lock_prefix = if rng.random_bool(0.5) {
                format!("refs/heads/{}/", random_path(&mut rng))
            } else {
                format!("refs/{}/", random_path(&mut rng))
            };
            let entries: Vec<String> = (0..rng.random_range(0..3))
                .map(|_| {
                    let path = random_path(&mut rng);
                    if rng.random_bool(0.5) {
                        format!("{path}/*")
                    } else {
                        path
                    }
                })
                .collect();
            let allowed = AllowedRefs::parse(&entries.join(",")).expect("generated syntax");
            let Ok(policy) = RefPolicy::new(configured.clone(), &lock_prefix, allowed.clone())
            else {
                continue;
            };
            let asked = branch(&random_path(&mut rng));
            let full = asked.full_ref();
            match policy.check(&asked) {
                Ok(()) => {
                    accepted += 1;
                    assert!(
                        !clashes_with_lock_prefix(&full, &lock_prefix),
                        "{asked} {lock_prefix}"
                    );
                    assert!(asked == configured || allowed.matches(&asked), "{asked}");
                    assert!(
                        !paths_clash(&full, &configured.full_ref()),
                        "{asked} {configured}"
                    );
                }
                Err(refused) => {
                    assert_ne!(asked, configured);
                    assert!(!refused.to_string().contains('\n'));
                }
            }
        }
        assert!(
            accepted > 500,
            "only {accepted} accepted: the generator is too narrow"
        );
    }

    /// The tree and lock rules against a brute-force reading of "one is a path prefix of the other".
    #[test]
    fn tree_and_lock_clashes_generated() {
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..5_000 {
            let mut files: Vec<String> = Vec::new();
            for _ in 0..rng.random_range(0..5) {
                let file = random_path(&mut rng);
                // Keep the tree valid: no file is the parent of another.
                if files.iter().all(|f| !paths_clash(f, &file)) {
                    files.push(file);
                }
            }
            let name = random_path(&mut rng);
            let found = tree_clash(files.iter().map(String::as_str), &name);
            let below = files.iter().find(|f| is_parent(f, &name));
            let inside = files.iter().filter(|f| is_parent(&name, f)).min();
            match (&found, below, inside) {
                (Some(Clash::BelowState(s)), Some(b), _) => assert_eq!(s, b),
                (Some(Clash::Folder(s)), None, Some(i)) => assert_eq!(s, i),
                (None, None, None) => {}
                other => panic!("{files:?} {name}: {other:?}"),
            }
            let lock = lock_clash(files.iter().map(String::as_str), &name);
            assert_eq!(lock.is_some(), below.is_some() || inside.is_some());
        }
    }

    /// Seeded random sets of existing refs (branches, lock refs, tags) and a branch to create:
    /// a clash is reported exactly when git would refuse the new ref for a directory/file
    /// conflict, and names an existing branch in the way.
    #[test]
    fn branch_clashes_generated() {
        let mut rng = StdRng::seed_from_u64(21);
        let mut clashes = 0;
        for _ in 0..5_000 {
            let mut refs: Vec<String> = Vec::new();
            for _ in 0..rng.random_range(0..6) {
                let namespace = ["refs/heads/", "refs/heads/", "refs/tags/", "refs/locks/"]
                    [rng.random_range(0..4)];
                let full = format!("{namespace}{}", random_path(&mut rng));
                // Keep the ref store valid: git holds no two refs that clash.
                if refs.iter().all(|r| !paths_clash(r, &full) && *r != full) {
                    refs.push(full);
                }
            }
            let new = branch(&random_path(&mut rng));
            let full = new.full_ref();
            let found = branch_clash(refs.iter().map(String::as_str), &new);
            let in_way: Vec<&String> = refs.iter().filter(|r| paths_clash(r, &full)).collect();
            match found {
                Some(Clash::Branch { branch, existing }) => {
                    clashes += 1;
                    assert_eq!(branch, new.as_str());
                    let existing_ref = format!("refs/heads/{existing}");
                    assert!(
                        in_way.contains(&&existing_ref),
                        "{refs:?} {new}: {existing}"
                    );
                    assert!(
                        !Clash::Branch { branch, existing }
                            .to_string()
                            .contains('\n')
                    );
                }
                None => assert!(in_way.is_empty(), "{refs:?} {new}: missed {in_way:?}"),
                other => panic!("{other:?}"),
            }
        }
        assert!(
            clashes > 500,
            "only {clashes} clashes: the generator is too narrow"
        );
    }
}
