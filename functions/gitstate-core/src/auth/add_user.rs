//! Adding a user to the access file in the repository: one commit, made as a compare-and-swap of
//! the file that was read, so a change committed meanwhile by anyone is kept (the addition is
//! made again on top of it) and a name is never added twice.

use std::time::Duration;

use bytes::Bytes;

use super::{Access, AccessSource};
use crate::ReadContext;
use crate::access::{ACCESS_PATH, AccessError, Policy, User, entry_toml};
use crate::ports::{BranchStatus, CommitMeta, StoreError};
use crate::trailers::Trailers;

/// How often the file is read again after another change won the race.
const MAX_ATTEMPTS: u32 = 10;

#[derive(Debug, thiserror::Error)]
pub enum AddUserError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Access(#[from] AccessError),
    #[error("user {0:?} already exists in {ACCESS_PATH}: pick another name")]
    Exists(String),
    #[error(
        "user {0:?} is the bootstrap administrator (GITSTATE_ADMIN_USER) of this deployment: pick another name"
    )]
    Bootstrap(String),
    /// The policy is not read from the repository.
    #[error(
        "the access policy comes from GITSTATE_ACCESS or GITSTATE_ACCESS_FILE, not from the repository: add the entry there (`gitstate user add NAME --grant … --print` prints it)"
    )]
    FixedPolicy,
    #[error("{ACCESS_PATH} in the repository is not valid ({0}): fix it before adding users")]
    Invalid(AccessError),
    #[error("{ACCESS_PATH} in the repository is not UTF-8 text: fix it before adding users")]
    NotText,
    /// The branch is missing and the repository has others: its first commit would fork them.
    #[error(
        "branch {branch:?} does not exist in the repository, which has other branches ({others}): set GITSTATE_REF to the branch the states are on"
    )]
    NoBranch { branch: String, others: String },
    #[error("{ACCESS_PATH} kept changing during {MAX_ATTEMPTS} attempts: try again")]
    Contention,
}

impl Access {
    /// Commit `user` into the access file of the repository (creating the file when there is
    /// none), unless a user of that name exists. `meta`'s message is replaced by one naming the
    /// user and their grants.
    pub async fn add_user(&self, user: &User, meta: CommitMeta) -> Result<(), AddUserError> {
        if self.options.source != AccessSource::Repository {
            return Err(AddUserError::FixedPolicy);
        }
        if self
            .options
            .bootstrap
            .as_ref()
            .is_some_and(|(name, _)| *name == user.name)
        {
            return Err(AddUserError::Bootstrap(user.name.clone()));
        }
        let grants: Vec<String> = user.grants.iter().map(ToString::to_string).collect();
        let meta = CommitMeta {
            message: Trailers {
                user: Some(meta.author_name.clone()),
                ..Trailers::default()
            }
            .render(&format!(
                "access: add user {} ({})",
                user.name,
                grants.join(", ")
            )),
            ..meta
        };
        // A command, within no request.
        let read = ReadContext::no_request();
        for _ in 0..MAX_ATTEMPTS {
            let stored = self
                .store
                .read_config(&self.at, ACCESS_PATH, Duration::ZERO, &read)
                .await?;
            let text = match &stored {
                Some(bytes) => std::str::from_utf8(bytes).map_err(|_| AddUserError::NotText)?,
                None => {
                    self.branch_may_start(&read).await?;
                    super::first_admin::HEADER
                }
            };
            let changed = with_user(text, user)?;
            if self
                .store
                .replace_config(&self.at, ACCESS_PATH, stored, Bytes::from(changed), &meta)
                .await?
            {
                return Ok(());
            }
        }
        Err(AddUserError::Contention)
    }

    /// The access file's commit would start the branch: never beside the repository's others.
    async fn branch_may_start(&self, read: &ReadContext) -> Result<(), AddUserError> {
        match self.store.branch_status(&self.at, read).await? {
            BranchStatus::Missing { others, .. } if !others.is_empty() => {
                Err(AddUserError::NoBranch {
                    branch: self.at.branch.as_str().to_owned(),
                    others: others.join(", "),
                })
            }
            _ => Ok(()),
        }
    }
}

/// The access file `text` with `user`'s entry appended (its other lines, comments included, kept
/// as they are), checked to parse to the same users plus exactly this one.
pub fn with_user(text: &str, user: &User) -> Result<String, AddUserError> {
    let before = Policy::parse(text).map_err(AddUserError::Invalid)?;
    if before.user(&user.name).is_some() {
        return Err(AddUserError::Exists(user.name.clone()));
    }
    let entry = entry_toml(user)?;
    let separator = match text {
        "" => "",
        t if t.ends_with("\n\n") => "",
        t if t.ends_with('\n') => "\n",
        _ => "\n\n",
    };
    let changed = format!("{text}{separator}{entry}");
    let after = Policy::parse(&changed).map_err(AddUserError::Invalid)?;
    let added = after.user(&user.name) == Some(user);
    let kept = before.users().all(|u| after.user(&u.name) == Some(u));
    if !added || !kept || after.users().count() != before.users().count() + 1 {
        // An entry appended to a file whose last table is not `[users.*]` would land inside it.
        return Err(AddUserError::Invalid(AccessError::Syntax(
            "the new entry would not be read as written; end the file with a [users.NAME] table"
                .into(),
        )));
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::BranchName;
    use crate::access::{Grant, Role};
    use crate::auth::AccessOptions;
    use crate::password::hash_secret;
    use crate::ports::{Location, StateStore};
    use crate::testing::MemoryStore;

    fn user(name: &str, hash: &str, grants: &[&str]) -> User {
        User {
            name: name.to_owned(),
            hash: hash.to_owned(),
            grants: grants
                .iter()
                .map(|g| Grant::parse(g).expect("grant"))
                .collect(),
        }
    }

    fn meta() -> CommitMeta {
        CommitMeta {
            author_name: "op".into(),
            author_email: "op@example.invalid".into(),
            committer_name: "gitstate".into(),
            committer_email: "gitstate@example.invalid".into(),
            message: String::new(),
        }
    }

    fn access(store: Arc<MemoryStore>, bootstrap: Option<&str>) -> Access {
        let at = Location {
            repository: "repo".into(),
            branch: BranchName::parse("main").expect("branch"),
        };
        let options = AccessOptions {
            source: AccessSource::Repository,
            bootstrap: bootstrap.map(|name| {
                (
                    name.to_owned(),
                    crate::secret::Secret::new(hash_secret(b"boot").expect("hash")),
                )
            }),
            refresh: Duration::ZERO,
            hash_memory_kib: 1 << 20,
        };
        Access::new(store, at, options, Arc::new(crate::password::Argon2id)).expect("access")
    }

    /// Generated files (comments, blank lines, quoted names, grants in any order, with or
    /// without a final newline) gain exactly the new user and keep every other one; a name
    /// already there is refused.
    #[test]
    fn an_added_entry_keeps_every_other_user() {
        let hash = hash_secret(b"token").expect("hash");
        let alphabet: Vec<char> = "ab.Z09_-@".chars().collect();
        let roles = ["read", "write", "admin"];
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x25);
        let name = |rng: &mut rand::rngs::StdRng| -> String {
            (0..rng.random_range(1..10))
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect()
        };
        for _ in 0..300 {
            let mut text = String::new();
            let mut users = Vec::new();
            for _ in 0..rng.random_range(0..4) {
                let u = name(&mut rng);
                if users.contains(&u) {
                    continue;
                }
                if rng.random_bool(0.5) {
                    text.push_str("# a comment\n\n");
                }
                let grant = format!("{}:net/", roles[rng.random_range(0..3)]);
                text.push_str(&entry_toml(&user(&u, &hash, &[&grant])).expect("entry"));
                users.push(u);
            }
            if rng.random_bool(0.3) {
                text = text.trim_end().to_owned();
            }
            let new = name(&mut rng);
            let added = user(&new, &hash, &["write:a/", "read:*"]);
            match with_user(&text, &added) {
                Ok(changed) => {
                    assert!(!users.contains(&new), "{new} added twice");
                    assert!(changed.starts_with(&text), "{changed}");
                    let policy = Policy::parse(&changed).expect("parses");
                    assert_eq!(policy.user(&new), Some(&added));
                    assert_eq!(policy.users().count(), users.len() + 1);
                }
                Err(AddUserError::Exists(n)) => assert!(users.contains(&n), "{n}"),
                Err(e) => panic!("{e}\n{text}"),
            }
        }
    }

    #[test]
    fn a_file_ending_in_another_table_is_refused() {
        let hash = hash_secret(b"token").expect("hash");
        let text = format!(
            "{}[other]\nx = 1\n",
            entry_toml(&user("a", &hash, &[])).expect("e")
        );
        // `deny_unknown_fields` already refuses such a file; either way nothing is written.
        assert!(with_user(&text, &user("b", &hash, &["read:*"])).is_err());
    }

    /// A compare-and-swap against a file that changed since it was read writes nothing;
    /// additions one after another all end up in the file; a name there, or the bootstrap
    /// administrator's, is refused.
    #[tokio::test]
    async fn additions_are_all_kept_and_duplicates_refused() {
        let store = Arc::new(MemoryStore::default());
        let hash = hash_secret(b"token").expect("hash");
        let names: Vec<String> = (0..12).map(|i| format!("user{i}")).collect();
        for n in &names {
            access(store.clone(), Some("boot"))
                .add_user(&user(n, &hash, &["write:net/"]), meta())
                .await
                .expect("added");
        }
        let at = access(store.clone(), None).at.clone();
        let stored = store
            .read_config(&at, ACCESS_PATH, Duration::ZERO, &ReadContext::no_request())
            .await
            .expect("read")
            .expect("file");
        let text = String::from_utf8(stored.to_vec()).expect("utf-8");
        assert!(text.starts_with(super::super::first_admin::HEADER));
        let policy = Policy::parse(&text).expect("parses");
        for n in &names {
            assert!(policy.user(n).is_some(), "{n} lost:\n{text}");
        }
        let stale = Bytes::from(super::super::first_admin::HEADER);
        let replaced = store
            .replace_config(&at, ACCESS_PATH, Some(stale), Bytes::from("x"), &meta())
            .await
            .expect("store");
        assert!(!replaced, "a stale compare-and-swap must write nothing");
        let again = access(store.clone(), None)
            .add_user(&user("user3", &hash, &["read:*"]), meta())
            .await;
        assert!(matches!(again, Err(AddUserError::Exists(_))), "{again:?}");
        let boot = access(store.clone(), Some("boot"))
            .add_user(&user("boot", &hash, &["read:*"]), meta())
            .await;
        assert!(matches!(boot, Err(AddUserError::Bootstrap(_))), "{boot:?}");
        assert_eq!(
            Role::Write,
            policy.user("user0").expect("user").grants[0].role
        );
    }
}
