use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;

use super::throttle::{FIRST_BLOCK, MAX_BLOCK};
use super::*;
use crate::BranchName;
use crate::access::{ACCESS_PATH, Role};
use crate::password::{Argon2id, hash_secret};
use crate::ports::CommitMeta;
use crate::testing::MemoryStore;
use rand::SeedableRng as _;
use std::sync::atomic::{AtomicUsize, Ordering};

fn header(user: &str, password: &str) -> Vec<u8> {
    let raw = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {raw}").into_bytes()
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

/// `first.last` was written as the nested table `[users.first.last]` (a file that does not
/// parse); the serialiser quotes it, and the first administrator logs in under that name.
#[tokio::test]
async fn a_first_admin_with_a_dotted_name_can_log_in() {
    let store = Arc::new(MemoryStore::default());
    let access = Access::new(
        store.clone(),
        location(),
        AccessOptions {
            source: AccessSource::Repository,
            bootstrap: None,
            refresh: Duration::ZERO,
        },
        Arc::new(Cheap::default()),
    )
    .expect("valid");
    let meta = CommitMeta {
        author_name: "gitstate".into(),
        author_email: "gitstate@localhost".into(),
        committer_name: "gitstate".into(),
        committer_email: "gitstate@localhost".into(),
        message: String::new(),
    };
    access
        .create_first_admin("first.last", meta)
        .await
        .expect("created")
        .expect("a token");
    let file = store
        .read_config(&location(), ACCESS_PATH, Duration::ZERO)
        .await
        .expect("read")
        .expect("written");
    let text = std::str::from_utf8(&file).expect("UTF-8");
    assert!(text.contains("[users.\"first.last\"]"), "{text}");
    let caller = access
        .authenticate(Some(&header("first.last", "right")), None)
        .await
        .expect("the first admin logs in");
    assert!(caller.may(
        Role::Admin,
        &crate::StateName::parse("a.tfstate").expect("valid")
    ));
    let log = store.history();
    assert_eq!(
        crate::trailers::Trailers::parse(&log[log.len() - 1].message)
            .user
            .as_deref(),
        Some("gitstate")
    );
}
