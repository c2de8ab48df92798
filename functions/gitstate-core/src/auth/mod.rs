//! Authentication: Basic credentials checked against the access policy.
//!
//! - The policy comes from the access file in the state repository (re-read when the branch tip
//!   changes, at most every `refresh`), or from a fixed text given at start-up, plus an optional
//!   bootstrap administrator.
//! - Every check of an unknown user runs argon2 against a dummy hash with the strongest
//!   parameters of the policy, so unknown users and wrong passwords cost the same and answer the
//!   same.
//! - A verified credential is remembered by a keyed hash of user and secret (never the secret),
//!   until the policy changes, so a warm process pays argon2 once per credential. That check comes
//!   first: a remembered credential never waits on the throttle or the argon2 limit.
//! - Failures are counted per user and per client address; past a few, the user or address is
//!   refused (429 + `Retry-After`) without argon2 for a while that doubles with every failure.
//!   IPv6 addresses count by their /64. When the table is full the least recent entries are
//!   evicted, and until those would have been forgotten anyway, a user or address the table does
//!   not hold is refused (fail closed) rather than given a fresh budget.
//! - argon2 runs at most `available_parallelism` at a time, so a flood queues behind that limit
//!   instead of taking every blocking thread and all the memory.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::access::{AccessError, Caller, Policy};
use crate::password::PasswordVerifier;
use crate::ports::{Location, StateStore, StoreError};
use crate::secret::Secret;

mod basic;
mod first_admin;
mod loader;
mod throttle;
mod verified;

pub use basic::{BasicError, MAX_AUTHORIZATION_BYTES, parse_basic};
pub use first_admin::FirstAdminError;
use loader::Loaded;
pub use throttle::{FREE_ADDRESS_FAILURES, FREE_USER_FAILURES, retry_after_secs};
use throttle::{Throttle, address_key};
use verified::Fingerprints;

/// Where the access policy comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum AccessSource {
    /// [`crate::access::ACCESS_PATH`] on the configured branch of the primary repository.
    Repository,
    /// A fixed access file (`GITSTATE_ACCESS`, or the contents of `GITSTATE_ACCESS_FILE`).
    Text(String),
}

impl std::fmt::Debug for AccessSource {
    // The text holds password hashes: keep it out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Repository => f.write_str("Repository"),
            Self::Text(text) => write!(f, "Text({} bytes)", text.len()),
        }
    }
}

#[derive(Debug, Clone)]
pub struct AccessOptions {
    pub source: AccessSource,
    /// A bootstrap administrator: user name and argon2id hash (`GITSTATE_ADMIN_HASH`).
    pub bootstrap: Option<(String, Secret)>,
    /// How long a warm process may use the branch tip it saw last before asking the remote.
    pub refresh: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No, malformed or wrong credentials; the same for unknown users and wrong passwords.
    #[error("authentication required: send the Basic credentials of a gitstate user")]
    Unauthenticated,
    /// Too many failures for this user name or client address: refused without argon2.
    #[error(
        "too many failed logins for this user name or address; retry after Retry-After seconds"
    )]
    Throttled { retry_after: Duration },
    /// The access file could not be read from the repository.
    #[error("the access policy could not be read")]
    Unavailable(#[source] StoreError),
}

/// Turns an `Authorization` header into a [`Caller`], or refuses it.
pub struct Access {
    store: Arc<dyn StateStore>,
    at: Location,
    options: AccessOptions,
    verifier: Arc<dyn PasswordVerifier>,
    /// The credential cache's keyed hashes.
    fingerprints: Fingerprints,
    loaded: Mutex<Option<Loaded>>,
    throttle: Mutex<Throttle>,
    /// At most this many argon2 verifications at once (the machine's parallelism).
    argon2_slots: tokio::sync::Semaphore,
}

fn poisoned<T>(_: T) -> AuthError {
    AuthError::Unavailable(StoreError::Corrupt("access state poisoned".into()))
}

/// Names from clients go into log lines: printable and short.
fn printable(s: &str) -> String {
    s.chars()
        .take(64)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

impl Access {
    /// `at` is where the access file lives: the primary repository on the configured branch.
    /// A fixed source that does not parse is refused here, at start-up.
    pub fn new(
        store: Arc<dyn StateStore>,
        at: Location,
        options: AccessOptions,
        verifier: Arc<dyn PasswordVerifier>,
    ) -> Result<Self, AccessError> {
        let access = Self {
            store,
            at,
            options,
            verifier,
            fingerprints: Fingerprints::new(),
            loaded: Mutex::new(None),
            throttle: Mutex::default(),
            argon2_slots: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            ),
        };
        if let AccessSource::Text(text) = &access.options.source {
            let policy = access.complete(Policy::parse(text)?)?;
            access.install(None, policy);
        } else {
            // Fail early on a bad bootstrap hash.
            access.complete(Policy::default())?;
        }
        Ok(access)
    }

    /// Check the request's credentials. `client` is the caller's address, when known.
    pub async fn authenticate(
        &self,
        header: Option<&[u8]>,
        client: Option<IpAddr>,
    ) -> Result<Caller, AuthError> {
        let address_key = client.map(address_key);
        let (user, secret) = match parse_basic(header) {
            Ok(credentials) => credentials,
            Err(why) => {
                tracing::info!(client = ?client, "unauthenticated request: {why}");
                if why != BasicError::Missing {
                    let keys: Vec<String> = address_key.into_iter().collect();
                    self.refuse_if_throttled(&keys, "", client)?;
                    self.failed(keys);
                }
                return Err(AuthError::Unauthenticated);
            }
        };
        let keys: Vec<String> = std::iter::once(format!("user\0{user}"))
            .chain(address_key)
            .collect();
        let (policy, dummy) = self.policy().await?;
        let fingerprint = self.fingerprints.of(&user, &secret);
        let known = policy.user(&user);
        // A credential verified before answers at once, whatever the throttle and the argon2
        // queue say: a flood of bad logins cannot lock out a working client.
        if let Some(found) = known {
            let loaded = self.loaded.lock().map_err(poisoned)?;
            let cached = loaded.as_ref().is_some_and(|l| {
                Arc::ptr_eq(&l.policy, &policy) && l.verified.contains(&fingerprint)
            });
            if cached {
                return Ok(Caller::new(user, found.grants.clone()));
            }
        }
        self.refuse_if_throttled(&keys, &user, client)?;
        let _slot = self.argon2_slots.acquire().await.map_err(poisoned)?;
        // Checked again with the slot held: failures that finished while this one queued count.
        self.refuse_if_throttled(&keys, &user, client)?;
        let hash = known.map_or(dummy, |u| u.hash.clone());
        let verifier = self.verifier.clone();
        let verified =
            tokio::task::spawn_blocking(move || verifier.verify(&hash, secret.expose().as_bytes()))
                .await
                .unwrap_or(false);
        match known {
            Some(found) if verified => {
                if let Ok(mut loaded) = self.loaded.lock()
                    && let Some(l) = loaded.as_mut().filter(|l| Arc::ptr_eq(&l.policy, &policy))
                {
                    l.verified.remember(fingerprint);
                }
                if let Ok(mut throttle) = self.throttle.lock() {
                    throttle.succeeded(&keys[0]);
                }
                Ok(Caller::new(user, found.grants.clone()))
            }
            _ => {
                tracing::warn!(user = %printable(&user), client = ?client, "authentication failed");
                self.failed(keys);
                Err(AuthError::Unauthenticated)
            }
        }
    }

    /// The stored argon2 hash of `user` under the policy last loaded (server side only): the key
    /// of the console's form tokens, the same in every process and changed with the password.
    pub fn stored_hash(&self, user: &str) -> Option<Secret> {
        let loaded = self.loaded.lock().ok()?;
        let found = loaded.as_ref()?.policy.user(user)?;
        Some(Secret::new(found.hash.clone()))
    }

    /// 429 for a user name or address over its failure budget; the same whether the user exists.
    fn refuse_if_throttled(
        &self,
        keys: &[String],
        user: &str,
        client: Option<IpAddr>,
    ) -> Result<(), AuthError> {
        match self.throttle.lock().map_err(poisoned)?.blocked(keys) {
            Some(retry_after) => {
                tracing::warn!(user = %printable(user), client = ?client, retry_after_ms = retry_after.as_millis() as u64, "refusing repeated failures");
                Err(AuthError::Throttled { retry_after })
            }
            None => Ok(()),
        }
    }

    fn failed(&self, keys: Vec<String>) {
        if let Ok(mut throttle) = self.throttle.lock() {
            throttle.failed(&keys);
        }
    }
}

#[cfg(test)]
mod tests;
