//! Authentication: Basic credentials checked against the access policy.
//!
//! - The policy comes from the access file in the state repository (re-read when the branch tip
//!   changes, at most every `refresh`), or from a fixed text given at start-up, plus an optional
//!   bootstrap administrator. A hash that asks more memory than one check may take in this
//!   process makes the policy invalid.
//! - Every check of an unknown user runs argon2 against a dummy hash with the strongest
//!   parameters of the policy, so unknown users and wrong passwords cost the same and answer the
//!   same.
//! - A verified credential is remembered by a keyed hash of user, secret and stored hash (never
//!   the secret), so a warm process pays argon2 once per credential, across policy changes that
//!   keep the user's hash. That check comes first: a remembered credential never waits on the
//!   throttle or the argon2 limit.
//! - Failures count against the client's address (IPv6 by its /64) and against the pair of the
//!   user name and that address, never against a user name alone: past a few, the address or the
//!   pair is refused (429 + `Retry-After`) without argon2 for a while that doubles with every
//!   failure, and the same user from a clean address is still checked. A request that names no
//!   user (a malformed header) costs no argon2 and counts against its address only. See
//!   [`throttle`].
//! - argon2 runs at most `available_parallelism` at a time and within a memory budget (half of
//!   what the process has), so a flood queues behind that limit instead of taking every blocking
//!   thread and all the memory.
//! - A check, once begun, runs to the end with its permits held and its outcome recorded, even
//!   when the request is dropped meanwhile (a client that hangs up right after sending).

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::ReadContext;
use crate::access::{AccessError, Caller, Policy};
use crate::password::PasswordVerifier;
use crate::ports::{Location, StateStore, StoreError};
use crate::secret::Secret;

mod add_user;
mod basic;
mod first_admin;
mod loader;
mod throttle;
mod verified;

pub use add_user::{AddUserError, with_user};
pub use basic::{BasicError, MAX_AUTHORIZATION_BYTES, parse_basic};
pub use first_admin::FirstAdminError;
use loader::Loaded;
use throttle::Throttle;
pub use throttle::{
    AddressKey, FORGET_AFTER, FREE_ADDRESS_FAILURES, FREE_PAIR_FAILURES, MAX_ADDRESS_BLOCK,
    MAX_PAIR_BLOCK, MAX_TRACKED, retry_after_secs,
};
use verified::{Fingerprints, Verified};

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
    /// The most memory (KiB) argon2 may take in this process at once: every hash of the policy
    /// must fit, and checks running together share it. See [`crate::password::hash_memory_budget`].
    pub hash_memory_kib: u32,
}

/// A client's address as a log line shows it: the address, or `unknown`.
struct ClientAddress(Option<IpAddr>);

impl std::fmt::Display for ClientAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(address) => address.fmt(f),
            None => f.write_str("unknown"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No, malformed or wrong credentials; the same for unknown users and wrong passwords.
    #[error("authentication required: send the Basic credentials of a gitstate user")]
    Unauthenticated,
    /// Too many failures from this client address, or for this user name from it: refused
    /// without argon2.
    #[error(
        "too many failed logins from this address; retry after {} s (Retry-After)",
        retry_after_secs(*retry_after)
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
    /// The credential cache's and the throttle's keyed hashes.
    fingerprints: Fingerprints,
    loaded: Mutex<Option<Loaded>>,
    /// The credentials argon2 accepted.
    verified: Arc<Mutex<Verified>>,
    throttle: Arc<Mutex<Throttle>>,
    /// At most this many argon2 verifications at once (the machine's parallelism).
    argon2_slots: Arc<tokio::sync::Semaphore>,
    /// The memory budget of the verifications running, in MiB (`memory_mib` in all).
    argon2_memory: Arc<tokio::sync::Semaphore>,
    memory_mib: u32,
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
        let memory_mib = mib(options.hash_memory_kib);
        let access = Self {
            store,
            at,
            options,
            verifier,
            fingerprints: Fingerprints::new(),
            loaded: Mutex::new(None),
            verified: Arc::default(),
            throttle: Arc::default(),
            argon2_slots: Arc::new(tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            )),
            argon2_memory: Arc::new(tokio::sync::Semaphore::new(memory_mib as usize)),
            memory_mib,
        };
        if let AccessSource::Text(text) = &access.options.source {
            let policy = access.complete(Policy::parse(text)?)?;
            access.log_loaded(&policy, true);
            access.install(None, policy);
        } else {
            // Fail early on a bad bootstrap hash.
            access.complete(Policy::default())?;
        }
        Ok(access)
    }

    /// Check the request's credentials. `client` is the caller's address, when known; `read`
    /// the request's context, under which the access file is read from the repository.
    pub async fn authenticate(
        &self,
        header: Option<&[u8]>,
        client: Option<IpAddr>,
        read: &ReadContext,
    ) -> Result<Caller, AuthError> {
        let address = client.map(AddressKey::of);
        let (user, secret) = match parse_basic(header) {
            Ok(credentials) => credentials,
            Err(why) => {
                tracing::info!(client = %ClientAddress(client), "unauthenticated request: {why}");
                // No user named: no argon2, and only the address counts (a browser's first
                // request, with no header at all, counts nothing).
                if why != BasicError::Missing {
                    self.refuse_if_throttled(address, None, "", client)?;
                    self.failed(address, None);
                }
                return Err(AuthError::Unauthenticated);
            }
        };
        let (policy, dummy) = self.policy(read).await?;
        let known = policy.user(&user);
        let hash = known.map_or(dummy, |u| u.hash.clone());
        let fingerprint = self.fingerprints.of(&user, &secret, &hash);
        // A credential verified before answers at once, whatever the throttle and the argon2
        // queue say: a flood of bad logins cannot lock out a working client.
        if let Some(found) = known
            && self
                .verified
                .lock()
                .map_err(poisoned)?
                .contains(&fingerprint)
        {
            return Ok(Caller::new(user, found.grants.clone()));
        }
        let pair = self.fingerprints.pair(&user, address);
        self.refuse_if_throttled(address, Some(&pair), &user, client)?;
        let slot = self
            .argon2_slots
            .clone()
            .acquire_owned()
            .await
            .map_err(poisoned)?;
        let memory = self
            .argon2_memory
            .clone()
            .acquire_many_owned(
                crate::password::memory_kib(&hash)
                    .map_or(1, mib)
                    .min(self.memory_mib),
            )
            .await
            .map_err(poisoned)?;
        // Checked again with the slot held: failures that finished while this one queued count.
        self.refuse_if_throttled(address, Some(&pair), &user, client)?;
        let check = Check {
            verifier: self.verifier.clone(),
            hash,
            secret,
            known: known.is_some(),
            fingerprint,
            verified: self.verified.clone(),
            throttle: self.throttle.clone(),
            address,
            pair,
            user: printable(&user),
            client,
            span: tracing::Span::current(),
            dispatch: tracing::dispatcher::get_default(Clone::clone),
        };
        // The check and its bookkeeping run to the end on their own thread with the permits
        // held, even if this request is dropped meanwhile (its client gone, its deadline):
        // otherwise a client that hangs up after sending would have its failures never counted
        // and its argon2 run outside the limits.
        let verified = tokio::task::spawn_blocking(move || check.run(slot, memory))
            .await
            .unwrap_or(false);
        match known {
            Some(found) if verified => Ok(Caller::new(user, found.grants.clone())),
            _ => Err(AuthError::Unauthenticated),
        }
    }

    /// The stored argon2 hash of `user` under the policy last loaded (server side only): the key
    /// of the console's form tokens, the same in every process and changed with the password.
    pub fn stored_hash(&self, user: &str) -> Option<Secret> {
        let loaded = self.loaded.lock().ok()?;
        let found = loaded.as_ref()?.policy.user(user)?;
        Some(Secret::new(found.hash.clone()))
    }

    /// 429 for an address or a (user name, address) pair over its failure budget; the same
    /// whether the user exists.
    fn refuse_if_throttled(
        &self,
        address: Option<AddressKey>,
        pair: Option<&throttle::PairKey>,
        user: &str,
        client: Option<IpAddr>,
    ) -> Result<(), AuthError> {
        match self
            .throttle
            .lock()
            .map_err(poisoned)?
            .blocked(address, pair)
        {
            Some(retry_after) => {
                tracing::warn!(user = %printable(user), client = %ClientAddress(client), retry_after_secs = retry_after_secs(retry_after), "refusing repeated failures");
                Err(AuthError::Throttled { retry_after })
            }
            None => Ok(()),
        }
    }

    fn failed(&self, address: Option<AddressKey>, pair: Option<throttle::PairKey>) {
        if let Ok(mut throttle) = self.throttle.lock() {
            throttle.failed(address, pair);
        }
    }
}

/// One argon2 check and what it leaves behind: a verified credential remembered and its pair's
/// failures cleared, or a failure counted against the address and the pair.
struct Check {
    verifier: Arc<dyn PasswordVerifier>,
    hash: String,
    secret: Secret,
    /// Whether the user is in the policy (else `hash` is the dummy).
    known: bool,
    fingerprint: verified::Fingerprint,
    verified: Arc<Mutex<Verified>>,
    throttle: Arc<Mutex<Throttle>>,
    address: Option<AddressKey>,
    pair: throttle::PairKey,
    /// The user name as log lines show it.
    user: String,
    client: Option<IpAddr>,
    /// The request's span and subscriber, for the log line written on the blocking thread.
    span: tracing::Span,
    dispatch: tracing::Dispatch,
}

impl Check {
    /// Verify, holding the argon2 permits until done, and record the outcome.
    fn run(
        self,
        _slot: tokio::sync::OwnedSemaphorePermit,
        _memory: tokio::sync::OwnedSemaphorePermit,
    ) -> bool {
        let dispatch = self.dispatch.clone();
        tracing::dispatcher::with_default(&dispatch, || {
            let _entered = self.span.enter();
            let verified = self
                .verifier
                .verify(&self.hash, self.secret.expose().as_bytes())
                && self.known;
            if verified {
                if let Ok(mut remembered) = self.verified.lock() {
                    remembered.remember(self.fingerprint);
                }
                if let Ok(mut throttle) = self.throttle.lock() {
                    throttle.succeeded(&self.pair);
                }
            } else {
                tracing::warn!(user = %self.user, client = %ClientAddress(self.client), "authentication failed");
                if let Ok(mut throttle) = self.throttle.lock() {
                    throttle.failed(self.address, Some(self.pair));
                }
            }
            verified
        })
    }
}

/// Whole MiB of `kib`, rounded up, at least 1.
fn mib(kib: u32) -> u32 {
    kib.div_ceil(1024).max(1)
}

#[cfg(test)]
mod tests;
