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

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::access::{ACCESS_PATH, AccessError, Caller, Grant, Policy, Role};
use crate::password::{PasswordVerifier, generate_token, hash_secret};
use crate::ports::{CommitMeta, Location, StateStore, StoreError, USER_TRAILER};
use crate::secret::Secret;

/// Longest `Authorization` header looked at.
pub const MAX_AUTHORIZATION_BYTES: usize = 4096;
/// Failures per user name that cost nothing extra.
pub const FREE_USER_FAILURES: u32 = 5;
/// Failures per client address that cost nothing extra: more, since several users (a CI fleet
/// behind one NAT) may share an address.
pub const FREE_ADDRESS_FAILURES: u32 = 20;
/// How long a user or address is refused after its first failure over the budget; doubling with
/// every further failure.
const FIRST_BLOCK: Duration = Duration::from_secs(1);
const MAX_BLOCK: Duration = Duration::from_secs(60);
/// A failure count is forgotten after this long without a new failure.
const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
/// Bounds on what a process remembers, so a flood cannot grow memory without end.
const MAX_TRACKED: usize = 10_000;
const MAX_VERIFIED: usize = 4_096;

/// Where the access policy comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum AccessSource {
    /// [`ACCESS_PATH`] on the configured branch of the primary repository.
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

/// Whole seconds for a `Retry-After` header: rounded up, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

/// Why a header did not yield credentials (for the debug log only; the client sees 401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BasicError {
    #[error("no Authorization header")]
    Missing,
    #[error("Authorization header longer than {MAX_AUTHORIZATION_BYTES} bytes")]
    TooLong,
    #[error("Authorization scheme is not Basic")]
    Scheme,
    #[error("Basic credentials are not valid base64")]
    Base64,
    #[error("Basic credentials are not UTF-8")]
    Utf8,
    #[error("Basic credentials have no ':' between user and password")]
    NoColon,
    #[error("Basic credentials have an empty user or password")]
    Empty,
}

/// Decode `Basic base64(user:password)`.
pub fn parse_basic(header: Option<&[u8]>) -> Result<(String, Secret), BasicError> {
    let header = header.ok_or(BasicError::Missing)?;
    if header.len() > MAX_AUTHORIZATION_BYTES {
        return Err(BasicError::TooLong);
    }
    let text = std::str::from_utf8(header).map_err(|_| BasicError::Scheme)?;
    let (scheme, encoded) = text.trim().split_once(' ').ok_or(BasicError::Scheme)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(BasicError::Scheme);
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| BasicError::Base64)?;
    let decoded = String::from_utf8(decoded).map_err(|_| BasicError::Utf8)?;
    let (user, password) = decoded.split_once(':').ok_or(BasicError::NoColon)?;
    if user.is_empty() || password.is_empty() {
        return Err(BasicError::Empty);
    }
    Ok((user.to_owned(), Secret::new(password.to_owned())))
}

/// A dummy hash with the strongest parameters among `hashes` (the policy's), so verifying an
/// unknown user costs at least as much as verifying any real one.
fn dummy_for<'a>(hashes: impl Iterator<Item = &'a str>) -> String {
    const SALT_AND_HASH: &str =
        "ZHVtbXlzYWx0ZHVtbXlzYWx0$ZHVtbXloYXNoZHVtbXloYXNoZHVtbXloYXNoZHVtbXk";
    let (m, t, p) = crate::password::strongest_params(hashes);
    format!("$argon2id$v=19$m={m},t={t},p={p}${SALT_AND_HASH}")
}

struct Loaded {
    /// The access file last read from the repository (`None`: there is none).
    file: Option<Bytes>,
    policy: Arc<Policy>,
    dummy: String,
    /// Keyed hashes of (user, secret) pairs verified under `policy`.
    verified: HashSet<[u8; 32]>,
}

struct Throttle {
    failures: HashMap<String, (u32, Instant)>,
    /// At most this many keys are tracked; when full, the least recent are evicted.
    capacity: usize,
    /// Set when an entry was evicted before it was forgotten: until then an untracked key may be
    /// one that lost its count, so it is refused (fail closed) instead of starting afresh.
    saturated_until: Option<Instant>,
}

impl Default for Throttle {
    fn default() -> Self {
        Self::with_capacity(MAX_TRACKED)
    }
}

/// The throttle key of a client address: IPv6 by its /64 (one host holds a whole /64), IPv4 and
/// IPv4-mapped IPv6 by the address.
fn address_key(ip: IpAddr) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => format!("addr\0{v4}"),
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !u128::from(u64::MAX);
            format!("addr\0{}/64", std::net::Ipv6Addr::from(prefix))
        }
    }
}

impl Throttle {
    fn with_capacity(capacity: usize) -> Self {
        Self {
            failures: HashMap::new(),
            capacity: capacity.max(8),
            saturated_until: None,
        }
    }

    fn count(&mut self, key: &str) -> Option<(u32, Instant)> {
        match self.failures.get(key) {
            Some((_, last)) if last.elapsed() > FORGET_AFTER => {
                self.failures.remove(key);
                None
            }
            Some(&(n, last)) => Some((n, last)),
            None => None,
        }
    }

    /// How much longer the worst of `keys` is refused (`None`: not refused). Keys are
    /// `user\0<name>` or `addr\0<ip>`; each has its own failure budget. While the table is
    /// saturated, a key it does not hold is refused.
    fn blocked(&mut self, keys: &[String]) -> Option<Duration> {
        let saturated = self
            .saturated_until
            .and_then(|until| until.checked_duration_since(Instant::now()))
            .filter(|d| !d.is_zero());
        if saturated.is_none() {
            self.saturated_until = None;
        }
        keys.iter()
            .filter_map(|key| {
                let free = if key.starts_with("addr\0") {
                    FREE_ADDRESS_FAILURES
                } else {
                    FREE_USER_FAILURES
                };
                let Some((n, last)) = self.count(key) else {
                    return saturated.map(|d| d.min(MAX_BLOCK));
                };
                let over = n.checked_sub(free)?;
                let block = FIRST_BLOCK
                    .saturating_mul(1u32 << over.min(10))
                    .min(MAX_BLOCK);
                block.checked_sub(last.elapsed()).filter(|d| !d.is_zero())
            })
            .max()
    }

    fn failed(&mut self, keys: &[String]) {
        for key in keys {
            if !self.failures.contains_key(key) && self.failures.len() >= self.capacity {
                self.make_room();
            }
            let entry = self
                .failures
                .entry(key.clone())
                .or_insert((0, Instant::now()));
            *entry = (entry.0.saturating_add(1), Instant::now());
        }
    }

    /// Forget what is due; if the table is still full, evict the least recent eighth and stay
    /// saturated until the evicted entries would have been forgotten anyway.
    fn make_room(&mut self) {
        self.failures
            .retain(|_, (_, last)| last.elapsed() <= FORGET_AFTER);
        if self.failures.len() < self.capacity {
            return;
        }
        let mut by_age: Vec<(Instant, String)> = self
            .failures
            .iter()
            .map(|(key, &(_, last))| (last, key.clone()))
            .collect();
        let evict = (self.capacity / 8).max(1);
        by_age.select_nth_unstable_by_key(evict - 1, |(last, _)| *last);
        let mut newest_evicted = None;
        for (last, key) in by_age.into_iter().take(evict) {
            self.failures.remove(&key);
            newest_evicted = newest_evicted.max(Some(last));
        }
        if let Some(last) = newest_evicted {
            let until = last + FORGET_AFTER;
            self.saturated_until = self.saturated_until.max(Some(until));
            tracing::warn!(
                tracked = self.failures.len(),
                "login throttle table saturated: refusing untracked users and addresses"
            );
        }
    }

    fn succeeded(&mut self, key: &str) {
        self.failures.remove(key);
    }
}

/// Turns an `Authorization` header into a [`Caller`], or refuses it.
pub struct Access {
    store: Arc<dyn StateStore>,
    at: Location,
    options: AccessOptions,
    verifier: Arc<dyn PasswordVerifier>,
    /// Key of the credential cache's hashes; random per process.
    key: [u8; 32],
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
            key: rand::random(),
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

    /// Add the bootstrap administrator to a parsed policy.
    fn complete(&self, policy: Policy) -> Result<Policy, AccessError> {
        match &self.options.bootstrap {
            Some((user, hash)) => policy.with_bootstrap(user, hash.expose()),
            None => Ok(policy),
        }
    }

    fn install(&self, file: Option<Bytes>, policy: Policy) -> (Arc<Policy>, String) {
        let dummy = dummy_for(policy.users().map(|u| u.hash.as_str()));
        let policy = Arc::new(policy);
        if let Ok(mut loaded) = self.loaded.lock() {
            *loaded = Some(Loaded {
                file,
                policy: policy.clone(),
                dummy: dummy.clone(),
                verified: HashSet::new(),
            });
        }
        (policy, dummy)
    }

    /// The current policy: for the repository source, re-read when the file changed.
    async fn policy(&self) -> Result<(Arc<Policy>, String), AuthError> {
        if self.options.source != AccessSource::Repository {
            let loaded = self.loaded.lock().map_err(poisoned)?;
            return match loaded.as_ref() {
                Some(l) => Ok((l.policy.clone(), l.dummy.clone())),
                None => Err(poisoned(())),
            };
        }
        let file = self
            .store
            .read_config(&self.at, ACCESS_PATH, self.options.refresh)
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
                tracing::info!(
                    users = policy.users().count(),
                    "access policy loaded from {ACCESS_PATH}"
                );
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

    fn fingerprint(&self, user: &str, secret: &Secret) -> [u8; 32] {
        // HMAC accepts keys of any length; this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        mac.update(user.as_bytes());
        mac.update(&[0]);
        mac.update(secret.expose().as_bytes());
        mac.finalize().into_bytes().into()
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
        let fingerprint = self.fingerprint(&user, &secret);
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
                    if l.verified.len() >= MAX_VERIFIED {
                        l.verified.clear();
                    }
                    l.verified.insert(fingerprint);
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
        let existing = self
            .store
            .read_config(&self.at, ACCESS_PATH, Duration::ZERO)
            .await?;
        if existing.is_some() {
            return Ok(None);
        }
        crate::access::check_user_name(user)?;
        let token = generate_token();
        let hash = hash_secret(token.as_bytes())?;
        let grant = Grant {
            role: Role::Admin,
            prefix: String::new(),
        };
        let file = format!(
            "# gitstate access file: users, argon2id hashes, grants (read, write, admin on a path prefix).\n\
             # Add users with `gitstate user add <name> --grant write:<prefix>/`.\n\n\
             [users.{user}]\nhash = \"{hash}\"\ngrants = [\"{grant}\"]\n"
        );
        let meta = CommitMeta {
            message: format!(
                "access: first administrator {user}\n\n{USER_TRAILER}{}\n",
                meta.author_name
            ),
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BranchName;
    use crate::password::{Argon2id, hash_secret};
    use crate::testing::MemoryStore;
    use rand::SeedableRng as _;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn header(user: &str, password: &str) -> Vec<u8> {
        let raw = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        format!("Basic {raw}").into_bytes()
    }

    #[test]
    fn basic_header_parsing() {
        assert_eq!(
            parse_basic(Some(&header("alice", "pw:with:colons")))
                .map(|(u, s)| (u, s.expose().to_owned())),
            Ok(("alice".into(), "pw:with:colons".into()))
        );
        assert_eq!(parse_basic(None), Err(BasicError::Missing));
        assert_eq!(parse_basic(Some(b"Bearer abc")), Err(BasicError::Scheme));
        assert_eq!(parse_basic(Some(b"Basic !!!")), Err(BasicError::Base64));
        assert_eq!(parse_basic(Some(b"Basic /w==")), Err(BasicError::Utf8));
        assert_eq!(
            parse_basic(Some(b"Basic bm9jb2xvbg==")),
            Err(BasicError::NoColon)
        );
        assert_eq!(parse_basic(Some(b"Basic OnB3")), Err(BasicError::Empty));
        assert_eq!(parse_basic(Some(b"Basic")), Err(BasicError::Scheme));
        assert_eq!(
            parse_basic(Some(&vec![b'a'; MAX_AUTHORIZATION_BYTES + 1])),
            Err(BasicError::TooLong)
        );
        assert_eq!(parse_basic(Some(b"\xff\xfe")), Err(BasicError::Scheme));
    }

    #[derive(Default)]
    struct Counting(AtomicUsize);
    impl PasswordVerifier for Counting {
        fn verify(&self, phc: &str, secret: &[u8]) -> bool {
            self.0.fetch_add(1, Ordering::SeqCst);
            Argon2id.verify(phc, secret)
        }
    }

    fn location() -> Location {
        Location {
            repository: "r".into(),
            branch: BranchName::parse("main").expect("valid"),
        }
    }

    #[tokio::test]
    async fn unknown_users_and_wrong_passwords_both_run_argon2_and_successes_are_cached() {
        let hash = hash_secret(b"right").expect("hash");
        let text = format!("[users.alice]\nhash = \"{hash}\"\ngrants = [\"read:*\"]\n");
        let counter = Arc::new(Counting::default());
        let access = Access::new(
            Arc::new(MemoryStore::default()),
            location(),
            AccessOptions {
                source: AccessSource::Text(text),
                bootstrap: None,
                refresh: Duration::from_secs(10),
            },
            counter.clone(),
        )
        .expect("valid");
        let count = || counter.0.load(Ordering::SeqCst);
        assert!(matches!(
            access
                .authenticate(Some(&header("nobody", "x")), None)
                .await,
            Err(AuthError::Unauthenticated)
        ));
        assert_eq!(count(), 1, "an unknown user is verified against the dummy");
        assert!(
            access
                .authenticate(Some(&header("alice", "wrong")), None)
                .await
                .is_err()
        );
        assert_eq!(count(), 2);
        let caller = access
            .authenticate(Some(&header("alice", "right")), None)
            .await
            .expect("right password");
        assert_eq!(caller.user, "alice");
        assert_eq!(count(), 3);
        access
            .authenticate(Some(&header("alice", "right")), None)
            .await
            .expect("cached");
        assert_eq!(count(), 3, "a verified credential is not hashed again");
        assert!(
            access
                .authenticate(Some(&header("alice", "wrong")), None)
                .await
                .is_err()
        );
        assert_eq!(
            count(),
            4,
            "a different secret is never served from the cache"
        );
        assert!(access.authenticate(Some(b"Basic !!"), None).await.is_err());
        assert_eq!(count(), 4, "malformed headers are refused before argon2");
    }

    #[test]
    fn failures_over_the_budget_block_for_a_doubling_while() {
        let mut throttle = Throttle::default();
        let user = vec!["user\0x".to_owned()];
        for _ in 0..FREE_USER_FAILURES {
            assert_eq!(throttle.blocked(&user), None);
            throttle.failed(&user);
        }
        let first = throttle.blocked(&user).expect("blocked");
        assert!(first <= FIRST_BLOCK && first > FIRST_BLOCK / 2, "{first:?}");
        throttle.failed(&user);
        assert!(throttle.blocked(&user).expect("blocked") > FIRST_BLOCK);
        for _ in 0..20 {
            throttle.failed(&user);
        }
        assert!(throttle.blocked(&user).expect("blocked") <= MAX_BLOCK);
        throttle.succeeded(&user[0]);
        assert_eq!(throttle.blocked(&user), None);
        // An address has a larger budget than a user name.
        let address = vec!["addr\x00127.0.0.1".to_owned()];
        for _ in 0..FREE_ADDRESS_FAILURES {
            assert_eq!(throttle.blocked(&address), None);
            throttle.failed(&address);
        }
        assert!(throttle.blocked(&address).is_some());
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }

    fn access_with(text: String, verifier: Arc<dyn PasswordVerifier>) -> Access {
        Access::new(
            Arc::new(MemoryStore::default()),
            location(),
            AccessOptions {
                source: AccessSource::Text(text),
                bootstrap: None,
                refresh: Duration::from_secs(10),
            },
            verifier,
        )
        .expect("valid")
    }

    #[tokio::test]
    async fn throttled_names_and_addresses_are_429_without_argon2_but_cached_credentials_pass() {
        let hash = hash_secret(b"right").expect("hash");
        let text = format!("[users.alice]\nhash = \"{hash}\"\ngrants = [\"read:*\"]\n");
        let counter = Arc::new(Counting::default());
        let access = access_with(text, counter.clone());
        let count = || counter.0.load(Ordering::SeqCst);
        let client = Some(IpAddr::from([192, 0, 2, 7]));
        access
            .authenticate(Some(&header("alice", "right")), client)
            .await
            .expect("verified and remembered");
        // Seeded: the same names every run, a fresh one each attempt (as a flood would send).
        let mut names = rand::rngs::StdRng::seed_from_u64(12);
        let mut throttled = 0;
        for _ in 0..100 {
            let user = format!("u{}", rand::Rng::random::<u64>(&mut names));
            match access.authenticate(Some(&header(&user, "x")), client).await {
                Err(AuthError::Throttled { retry_after }) => {
                    assert!(retry_after <= FIRST_BLOCK);
                    throttled += 1;
                }
                Err(AuthError::Unauthenticated) => {}
                other => panic!("{:?}", other.map(|c| c.user)),
            }
        }
        assert_eq!(count(), 1 + FREE_ADDRESS_FAILURES as usize);
        assert_eq!(throttled, 100 - FREE_ADDRESS_FAILURES as usize);
        // A known user with a wrong password answers the same 429 as an unknown one.
        assert!(matches!(
            access
                .authenticate(Some(&header("alice", "wrong")), client)
                .await,
            Err(AuthError::Throttled { .. })
        ));
        assert!(matches!(
            access.authenticate(Some(b"Basic !!"), client).await,
            Err(AuthError::Throttled { .. })
        ));
        access
            .authenticate(Some(&header("alice", "right")), client)
            .await
            .expect("a remembered credential passes the throttled address");
        assert_eq!(
            count(),
            1 + FREE_ADDRESS_FAILURES as usize,
            "no argon2 since"
        );
        // Another address and user are not affected.
        assert!(matches!(
            access
                .authenticate(
                    Some(&header("bob", "x")),
                    Some(IpAddr::from([192, 0, 2, 8]))
                )
                .await,
            Err(AuthError::Unauthenticated)
        ));
    }

    /// Counts verifications and accepts the secret `right`, without argon2's cost.
    #[derive(Default)]
    struct Cheap(AtomicUsize);
    impl PasswordVerifier for Cheap {
        fn verify(&self, _phc: &str, secret: &[u8]) -> bool {
            self.0.fetch_add(1, Ordering::SeqCst);
            secret == b"right"
        }
    }

    #[test]
    fn ipv6_addresses_are_keyed_by_their_64_and_mapped_ipv4_by_the_address() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(64);
        let net: u128 = 0x2001_0db8_0001_0002 << 64;
        for _ in 0..200 {
            let a = net | u128::from(rand::Rng::random::<u64>(&mut rng));
            let b = net | u128::from(rand::Rng::random::<u64>(&mut rng));
            assert_eq!(
                address_key(IpAddr::from(std::net::Ipv6Addr::from(a))),
                address_key(IpAddr::from(std::net::Ipv6Addr::from(b)))
            );
            let other = a ^ (1 << (64 + rand::Rng::random_range(&mut rng, 0..64)));
            assert_ne!(
                address_key(IpAddr::from(std::net::Ipv6Addr::from(a))),
                address_key(IpAddr::from(std::net::Ipv6Addr::from(other)))
            );
            let v4 = std::net::Ipv4Addr::from(rand::Rng::random::<u32>(&mut rng));
            assert_eq!(
                address_key(IpAddr::from(v4)),
                address_key(IpAddr::from(v4.to_ipv6_mapped()))
            );
        }
    }

    #[tokio::test]
    async fn a_full_throttle_table_evicts_then_fails_closed_but_cached_credentials_pass() {
        const CAPACITY: usize = 64;
        let hash = hash_secret(b"right").expect("hash");
        let text = format!("[users.alice]\nhash = \"{hash}\"\ngrants = [\"read:*\"]\n");
        let counter = Arc::new(Cheap::default());
        let mut access = access_with(text, counter.clone());
        access.throttle = Mutex::new(Throttle::with_capacity(CAPACITY));
        let count = || counter.0.load(Ordering::SeqCst);
        access
            .authenticate(Some(&header("alice", "right")), None)
            .await
            .expect("verified and remembered");
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let net: u128 = 0x2001_0db8_0009_0009 << 64;
        let fresh = |rng: &mut rand::rngs::StdRng| {
            let user = format!("u{}", rand::Rng::random::<u64>(rng));
            let ip = if rand::Rng::random::<bool>(rng) {
                IpAddr::from(rand::Rng::random::<[u8; 4]>(rng))
            } else {
                IpAddr::from(std::net::Ipv6Addr::from(
                    net | u128::from(rand::Rng::random::<u64>(rng)),
                ))
            };
            (user, ip)
        };
        // A user name throttled before the flood, from several addresses.
        for n in 0..=FREE_USER_FAILURES as u8 {
            let ip = IpAddr::from([198, 51, 100, n]);
            let _ = access
                .authenticate(Some(&header("victim", "x")), Some(ip))
                .await;
        }
        // The flood: fresh names and addresses (random IPv4, random hosts of one IPv6 /64).
        let before = count();
        let mut answered = 0;
        for _ in 0..(4 * CAPACITY) {
            let (user, ip) = fresh(&mut rng);
            match access
                .authenticate(Some(&header(&user, "x")), Some(ip))
                .await
            {
                Err(AuthError::Unauthenticated) => answered += 1,
                Err(AuthError::Throttled { retry_after }) => assert!(retry_after <= MAX_BLOCK),
                other => panic!("{:?}", other.map(|c| c.user)),
            }
        }
        assert_eq!(
            count() - before,
            answered,
            "argon2 ran only for answered attempts"
        );
        assert!(
            answered <= CAPACITY + FREE_ADDRESS_FAILURES as usize,
            "{answered} fresh keys ran argon2 with a table of {CAPACITY}"
        );
        // Saturated: no new key escapes, and argon2 never runs for them.
        let saturated = count();
        for _ in 0..(4 * CAPACITY) {
            let (user, ip) = fresh(&mut rng);
            let user = if rand::Rng::random::<bool>(&mut rng) {
                "alice".to_owned()
            } else {
                user
            };
            assert!(matches!(
                access
                    .authenticate(Some(&header(&user, "x")), Some(ip))
                    .await,
                Err(AuthError::Throttled { .. })
            ));
        }
        assert!(
            matches!(
                access
                    .authenticate(
                        Some(&header("victim", "x")),
                        Some(IpAddr::from([203, 0, 113, 9]))
                    )
                    .await,
                Err(AuthError::Throttled { .. })
            ),
            "a throttled name stays throttled after the flood evicted it"
        );
        assert_eq!(count(), saturated, "no argon2 for throttled attempts");
        let (_, ip) = fresh(&mut rng);
        access
            .authenticate(Some(&header("alice", "right")), Some(ip))
            .await
            .expect("a remembered credential passes a saturated throttle");
        assert_eq!(count(), saturated);
    }

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

    #[tokio::test]
    async fn repository_policy_is_reloaded_and_first_admin_created_once() {
        let store = Arc::new(MemoryStore::default());
        let access = Access::new(
            store.clone(),
            location(),
            AccessOptions {
                source: AccessSource::Repository,
                bootstrap: None,
                refresh: Duration::ZERO,
            },
            Arc::new(Argon2id),
        )
        .expect("valid");
        let meta = CommitMeta {
            author_name: "gitstate".into(),
            author_email: "gitstate@localhost".into(),
            committer_name: "gitstate".into(),
            committer_email: "gitstate@localhost".into(),
            message: String::new(),
        };
        let token = access
            .create_first_admin("admin", meta.clone())
            .await
            .expect("created")
            .expect("a token");
        assert!(
            access
                .create_first_admin("admin", meta)
                .await
                .expect("no-op")
                .is_none(),
            "only once"
        );
        let caller = access
            .authenticate(Some(&header("admin", token.expose())), None)
            .await
            .expect("first admin works");
        assert!(caller.may(
            Role::Admin,
            &crate::StateName::parse("a.tfstate").expect("valid")
        ));
        // Replacing the file drops the admin and the cached credential with it.
        store.put_config(ACCESS_PATH, Bytes::from_static(b"[users]\n"));
        assert!(matches!(
            access
                .authenticate(Some(&header("admin", token.expose())), None)
                .await,
            Err(AuthError::Unauthenticated)
        ));
    }
}
