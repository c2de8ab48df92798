//! The access loader: the policy from the access file in the repository (re-read when it
//! changed) or from a fixed text, with the bootstrap administrator added.

use std::sync::Arc;

use bytes::Bytes;

use super::{Access, AccessSource, AuthError, poisoned};
use crate::ReadContext;
use crate::access::{ACCESS_PATH, AccessError, Policy};

/// A dummy hash with the strongest parameters among `hashes` (the policy's), so verifying an
/// unknown user costs at least as much as verifying any real one.
fn dummy_for<'a>(hashes: impl Iterator<Item = &'a str>) -> String {
    const SALT_AND_HASH: &str =
        "ZHVtbXlzYWx0ZHVtbXlzYWx0$ZHVtbXloYXNoZHVtbXloYXNoZHVtbXloYXNoZHVtbXk";
    let (m, t, p) = crate::password::strongest_params(hashes);
    format!("$argon2id$v=19$m={m},t={t},p={p}${SALT_AND_HASH}")
}

/// The users whose hashes are cheaper to check than the dummy an unknown name is checked
/// against (parameters below the policy's strongest): how long a failed login takes tells their
/// names from unknown ones.
fn cheaper_than_unknown(policy: &Policy) -> Vec<&str> {
    let strongest = crate::password::strongest_params(policy.users().map(|u| u.hash.as_str()));
    policy
        .users()
        .filter(|u| {
            crate::password::strongest_params(std::iter::once(u.hash.as_str())) != strongest
        })
        .map(|u| u.name.as_str())
        .collect()
}

pub(super) struct Loaded {
    /// The access file last read from the repository (`None`: there is none).
    file: Option<Bytes>,
    pub(super) policy: Arc<Policy>,
    dummy: String,
}

impl Access {
    /// Add the bootstrap administrator to a parsed policy, and refuse it if a hash asks more
    /// memory than a check may take in this process.
    pub(super) fn complete(&self, policy: Policy) -> Result<Policy, AccessError> {
        let policy = match &self.options.bootstrap {
            Some((user, hash)) => policy.with_bootstrap(user, hash.expose())?,
            None => policy,
        };
        policy.within_memory(self.options.hash_memory_kib)
    }

    pub(super) fn install(&self, file: Option<Bytes>, policy: Policy) -> (Arc<Policy>, String) {
        let dummy = dummy_for(policy.users().map(|u| u.hash.as_str()));
        let policy = Arc::new(policy);
        if let Ok(mut loaded) = self.loaded.lock() {
            *loaded = Some(Loaded {
                file,
                policy: policy.clone(),
                dummy: dummy.clone(),
            });
        }
        (policy, dummy)
    }

    /// The current policy: for the repository source, re-read (under `read`) when the file
    /// changed.
    pub(super) async fn policy(
        &self,
        read: &ReadContext,
    ) -> Result<(Arc<Policy>, String), AuthError> {
        if self.options.source != AccessSource::Repository {
            let loaded = self.loaded.lock().map_err(poisoned)?;
            return match loaded.as_ref() {
                Some(l) => Ok((l.policy.clone(), l.dummy.clone())),
                None => Err(poisoned(())),
            };
        }
        let file = self
            .store
            .read_config(&self.at, ACCESS_PATH, self.options.refresh, read)
            .await
            .map_err(AuthError::Unavailable)?;
        {
            let loaded = self.loaded.lock().map_err(poisoned)?;
            if let Some(l) = loaded.as_ref().filter(|l| l.file == file) {
                return Ok((l.policy.clone(), l.dummy.clone()));
            }
        }
        let parsed = match &file {
            None => Ok(Policy::default()),
            Some(bytes) => std::str::from_utf8(bytes)
                .map_err(|_| AccessError::Syntax("the file is not UTF-8".into()))
                .and_then(Policy::parse),
        }
        .and_then(|p| self.complete(p));
        let policy = match parsed {
            Ok(policy) => {
                self.log_loaded(&policy, file.is_some());
                policy
            }
            Err(error) => {
                // Keep serving with what was valid before; a new process has only the
                // bootstrap administrator until the file is fixed.
                tracing::error!(%error, "{ACCESS_PATH} is invalid; keeping the previous policy");
                let previous = self
                    .loaded
                    .lock()
                    .map_err(poisoned)?
                    .as_ref()
                    .map(|l| (*l.policy).clone());
                match previous {
                    Some(policy) => policy,
                    None => self.complete(Policy::default()).map_err(|_| poisoned(()))?,
                }
            }
        };
        let (installed, dummy) = self.install(file, policy);
        if installed.is_empty() {
            tracing::warn!(
                "no users: add {ACCESS_PATH} to the repository or set GITSTATE_ADMIN_HASH"
            );
        }
        Ok((installed, dummy))
    }

    /// The "access policy loaded" line: how many users, and where each kind came from (the
    /// access file or text, `GITSTATE_ADMIN_HASH`), or that there are none.
    pub(super) fn log_loaded(&self, policy: &Policy, file_found: bool) {
        let bootstrap = self
            .options
            .bootstrap
            .as_ref()
            .map(|(user, _)| user.as_str());
        let users = policy.users().count();
        let from_file = policy
            .users()
            .filter(|u| Some(u.name.as_str()) != bootstrap)
            .count();
        let file = match (&self.options.source, file_found) {
            (AccessSource::Text(_), _) => "GITSTATE_ACCESS / GITSTATE_ACCESS_FILE".to_owned(),
            (AccessSource::Repository, true) => format!("{ACCESS_PATH} in the repository"),
            (AccessSource::Repository, false) => {
                format!("{ACCESS_PATH} (not in the repository)")
            }
        };
        let mut from = vec![format!("{from_file} from {file}")];
        if let Some(user) = bootstrap {
            from.push(format!("{user} from GITSTATE_ADMIN_HASH"));
        }
        tracing::info!(
            users,
            "access policy loaded: {}{}",
            from.join(", "),
            if users == 0 {
                ": no users, nobody can log in"
            } else {
                ""
            }
        );
        let cheaper = cheaper_than_unknown(policy);
        if !cheaper.is_empty() {
            tracing::warn!(
                users = %cheaper.join(", "),
                "these users' hashes have weaker argon2 parameters than the policy's strongest, \
                 against which unknown names are checked: a wrong password for them is answered \
                 sooner, which tells their names exist; hash every user's secret with the same \
                 parameters (gitstate user add, gitstate hash-password)"
            );
        }
    }

    /// How many users the current policy has (read from the repository when it lives there):
    /// `serve` says at start when there are none, `gitstate config` reports it (never within a
    /// request).
    pub async fn user_count(&self) -> Result<usize, AuthError> {
        let read = ReadContext::no_request();
        Ok(self.policy(&read).await?.0.users().count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dummy_hash_has_the_strongest_parameters_of_the_policy() {
        let weak = "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHQ$RdescudvJCsgt3ub+b+dWRWJTmaaJObG";
        let strong = "$argon2id$v=19$m=65536,t=3,p=1$c29tZXNhbHQ$RdescudvJCsgt3ub+b+dWRWJTmaaJObG";
        let dummy = dummy_for([weak, strong, weak].into_iter());
        assert!(
            dummy.starts_with("$argon2id$v=19$m=65536,t=3,p=1$"),
            "{dummy}"
        );
        crate::password::check_phc(&dummy).expect("a well-formed hash argon2 really runs");
    }

    /// Users whose hashes are weaker than the strongest are named (a failed login's time tells
    /// them from unknown names); a policy whose hashes share their parameters names nobody.
    #[test]
    fn users_cheaper_to_check_than_an_unknown_name_are_named() {
        let weak = "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHQ$RdescudvJCsgt3ub+b+dWRWJTmaaJObG";
        let strong = "$argon2id$v=19$m=65536,t=3,p=1$c29tZXNhbHQ$RdescudvJCsgt3ub+b+dWRWJTmaaJObG";
        let more_lanes =
            "$argon2id$v=19$m=65536,t=3,p=2$c29tZXNhbHQ$RdescudvJCsgt3ub+b+dWRWJTmaaJObG";
        let policy = |users: &[(&str, &str)]| {
            let text: String = users
                .iter()
                .map(|(name, hash)| format!("[users.{name}]\nhash = \"{hash}\"\n"))
                .collect();
            Policy::parse(&text).expect("a valid policy")
        };
        let uniform = policy(&[("a", weak), ("b", weak)]);
        assert!(cheaper_than_unknown(&uniform).is_empty());
        let mixed = policy(&[("a", weak), ("b", strong), ("c", weak)]);
        assert_eq!(cheaper_than_unknown(&mixed), ["a", "c"]);
        let lanes = policy(&[("a", strong), ("b", more_lanes)]);
        assert_eq!(cheaper_than_unknown(&lanes), ["a"]);
        assert!(cheaper_than_unknown(&Policy::default()).is_empty());
    }
}
