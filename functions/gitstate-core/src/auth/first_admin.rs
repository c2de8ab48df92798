//! The first administrator: for a repository without an access file, one administrator with a
//! generated token, committed once.

use std::time::Duration;

use bytes::Bytes;

use super::{Access, AccessSource};
use crate::ReadContext;
use crate::access::{ACCESS_PATH, AccessError, Grant, Role};
use crate::password::{generate_token, hash_secret};
use crate::ports::{BranchStatus, CommitMeta, StoreError};
use crate::secret::Secret;
use crate::trailers::Trailers;

impl Access {
    /// For a repository source with no access file and no bootstrap administrator: commit an
    /// access file with one administrator and return their credentials (shown once).
    pub async fn create_first_admin(
        &self,
        user: &str,
        meta: CommitMeta,
    ) -> Result<Option<Secret>, FirstAdminError> {
        if self.options.source != AccessSource::Repository || self.options.bootstrap.is_some() {
            return Ok(None);
        }
        // `serve` calls this before it serves: within no request.
        let read = ReadContext::no_request();
        let existing = self
            .store
            .read_config(&self.at, ACCESS_PATH, Duration::ZERO, &read)
            .await?;
        if existing.is_some() {
            return Ok(None);
        }
        // The file's commit would start the branch: never beside the repository's others.
        if let BranchStatus::Missing { default, others } =
            self.store.branch_status(&self.at, &read).await?
            && !others.is_empty()
        {
            return Err(FirstAdminError::NoBranch {
                branch: self.at.branch.as_str().to_owned(),
                default: default.unwrap_or_else(|| others.join(", ")),
            });
        }
        crate::access::check_user_name(user)?;
        let token = generate_token();
        let hash = hash_secret(token.as_bytes())?;
        let grant = Grant {
            role: Role::Admin,
            prefix: String::new(),
        };
        let file = access_file(user, &hash, &[grant])?;
        let meta = CommitMeta {
            message: Trailers {
                user: Some(meta.author_name.clone()),
                ..Trailers::default()
            }
            .render(&format!("access: first administrator {user}")),
            ..meta
        };
        let created = self
            .store
            .create_config(&self.at, ACCESS_PATH, Bytes::from(file), &meta)
            .await?;
        Ok(created.then(|| Secret::new(token)))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FirstAdminError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Access(#[from] AccessError),
    #[error(transparent)]
    Hash(#[from] crate::password::HashError),
    /// The branch is missing and the repository has others: its first commit would fork them.
    #[error(
        "branch {branch:?} does not exist in the repository, which has other branches ({default}): set GITSTATE_REF to the branch the states are on"
    )]
    NoBranch { branch: String, default: String },
}

/// What a new access file says first.
pub(super) const HEADER: &str = "\
# gitstate access file: users, argon2id hashes, grants (read, write, admin on a path prefix).
# Add users with `gitstate user add <name> --grant write:<prefix>/` (it commits here).

";

/// A new access file with one user: the entry as [`crate::access::entry_toml`] writes it (so any
/// name is quoted and any value escaped as TOML needs), parsed back as the policy would be before
/// anything is committed.
fn access_file(user: &str, hash: &str, grants: &[Grant]) -> Result<String, AccessError> {
    let entry = crate::access::entry_toml(&crate::access::User {
        name: user.to_owned(),
        hash: hash.to_owned(),
        grants: grants.to_vec(),
    })?;
    let text = format!("{HEADER}{entry}");
    crate::access::Policy::parse(&text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::access::Policy;

    /// Generated user names over the whole allowed alphabet (dots, `@`, dashes, digits first):
    /// the written file parses, holds exactly that user with the grants, and starts with the
    /// header.
    #[test]
    fn the_access_file_is_valid_toml_for_every_user_name() {
        let hash = hash_secret(b"token").expect("hash");
        let alphabet: Vec<char> = "ab.Z09_-@".chars().collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(0xad);
        let grants = [
            Grant {
                role: Role::Admin,
                prefix: String::new(),
            },
            Grant::parse("read:net/a.b_c-d/").expect("valid"),
        ];
        for round in 0..300 {
            let user: String = match round {
                0 => "first.last".into(),
                1 => "a@b.c".into(),
                _ => (0..rng.random_range(1..12))
                    .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                    .collect(),
            };
            crate::access::check_user_name(&user).expect("a valid name");
            let file = access_file(&user, &hash, &grants).expect("written");
            assert!(file.starts_with(HEADER), "{file}");
            let policy = Policy::parse(&file).expect("parses");
            let found = policy.user(&user).expect("the user");
            assert_eq!(found.hash, hash);
            assert_eq!(found.grants, grants);
            assert_eq!(policy.users().count(), 1, "{file}");
        }
    }
}
