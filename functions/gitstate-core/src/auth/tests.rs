use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;

use super::throttle::FIRST_BLOCK;
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
            hash_memory_kib: crate::password::MAX_MEMORY_KIB,
        },
        counter.clone(),
    )
    .expect("valid");
    let count = || counter.0.load(Ordering::SeqCst);
    assert!(matches!(
        access
            .authenticate(
                Some(&header("nobody", "x")),
                None,
                &ReadContext::no_request()
            )
            .await,
        Err(AuthError::Unauthenticated)
    ));
    assert_eq!(count(), 1, "an unknown user is verified against the dummy");
    assert!(
        access
            .authenticate(
                Some(&header("alice", "wrong")),
                None,
                &ReadContext::no_request()
            )
            .await
            .is_err()
    );
    assert_eq!(count(), 2);
    let caller = access
        .authenticate(
            Some(&header("alice", "right")),
            None,
            &ReadContext::no_request(),
        )
        .await
        .expect("right password");
    assert_eq!(caller.user, "alice");
    assert_eq!(count(), 3);
    access
        .authenticate(
            Some(&header("alice", "right")),
            None,
            &ReadContext::no_request(),
        )
        .await
        .expect("cached");
    assert_eq!(count(), 3, "a verified credential is not hashed again");
    assert!(
        access
            .authenticate(
                Some(&header("alice", "wrong")),
                None,
                &ReadContext::no_request()
            )
            .await
            .is_err()
    );
    assert_eq!(
        count(),
        4,
        "a different secret is never served from the cache"
    );
    assert!(
        access
            .authenticate(Some(b"Basic !!"), None, &ReadContext::no_request())
            .await
            .is_err()
    );
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
            hash_memory_kib: crate::password::MAX_MEMORY_KIB,
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
        .authenticate(
            Some(&header("alice", "right")),
            client,
            &ReadContext::no_request(),
        )
        .await
        .expect("verified and remembered");
    // Seeded: the same names every run, a fresh one each attempt (as a flood would send).
    let mut names = rand::rngs::StdRng::seed_from_u64(12);
    let mut throttled = 0;
    for _ in 0..100 {
        let user = format!("u{}", rand::Rng::random::<u64>(&mut names));
        match access
            .authenticate(
                Some(&header(&user, "x")),
                client,
                &ReadContext::no_request(),
            )
            .await
        {
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
            .authenticate(
                Some(&header("alice", "wrong")),
                client,
                &ReadContext::no_request()
            )
            .await,
        Err(AuthError::Throttled { .. })
    ));
    assert!(matches!(
        access
            .authenticate(Some(b"Basic !!"), client, &ReadContext::no_request())
            .await,
        Err(AuthError::Throttled { .. })
    ));
    access
        .authenticate(
            Some(&header("alice", "right")),
            client,
            &ReadContext::no_request(),
        )
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
                Some(IpAddr::from([192, 0, 2, 8])),
                &ReadContext::no_request()
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

/// Issue 24's attacks on `Access`: wrong passwords for `alice` from many addresses refuse each
/// address after its budget, yet `alice` with the right password from a clean address is
/// checked (once: then remembered) and let in; malformed headers from more fresh addresses than
/// the table holds cost no argon2 and never make a clean key refused; the attacker's addresses
/// stay refused after that flood (the flood's keys have fewer failures, so they go first).
#[tokio::test]
async fn a_user_under_attack_logs_in_from_a_clean_address_and_a_full_table_refuses_no_clean_key() {
    const CAPACITY: usize = 64;
    let hash = hash_secret(b"right").expect("hash");
    let text = format!("[users.alice]\nhash = \"{hash}\"\ngrants = [\"read:*\"]\n");
    let counter = Arc::new(Cheap::default());
    let mut access = access_with(text, counter.clone());
    access.throttle = Arc::new(Mutex::new(Throttle::with_capacity(CAPACITY)));
    let count = || counter.0.load(Ordering::SeqCst);
    let attackers: Vec<IpAddr> = (0..40u8).map(|n| IpAddr::from([198, 51, 100, n])).collect();
    for ip in &attackers {
        let mut failures = 0;
        loop {
            match access
                .authenticate(
                    Some(&header("alice", "guess")),
                    Some(*ip),
                    &ReadContext::no_request(),
                )
                .await
            {
                Err(AuthError::Unauthenticated) => failures += 1,
                Err(AuthError::Throttled { retry_after }) => {
                    assert!(retry_after <= FIRST_BLOCK);
                    break;
                }
                other => panic!("{:?}", other.map(|c| c.user)),
            }
        }
        assert_eq!(failures, FREE_PAIR_FAILURES, "{ip}");
    }
    let guesses = count();
    assert_eq!(guesses, attackers.len() * FREE_PAIR_FAILURES as usize);
    // Malformed headers and fresh names from fresh addresses: more keys than the table holds.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let net: u128 = 0x2001_0db8_0009_0000 << 64;
    let mut fresh = || {
        if rand::Rng::random::<bool>(&mut rng) {
            IpAddr::from([
                10,
                rand::Rng::random(&mut rng),
                rand::Rng::random(&mut rng),
                rand::Rng::random(&mut rng),
            ])
        } else {
            IpAddr::from(std::net::Ipv6Addr::from(
                net | (u128::from(rand::Rng::random::<u16>(&mut rng)) << 64),
            ))
        }
    };
    for _ in 0..(4 * CAPACITY) {
        let ip = fresh();
        assert!(matches!(
            access
                .authenticate(Some(b"Basic !!!"), Some(ip), &ReadContext::no_request())
                .await,
            Err(AuthError::Unauthenticated)
        ));
    }
    assert_eq!(count(), guesses, "malformed headers cost no argon2");
    assert!(access.throttle.lock().expect("lock").addresses.len() <= CAPACITY);
    for n in 0..(2 * CAPACITY) {
        let ip = fresh();
        assert!(
            matches!(
                access
                    .authenticate(
                        Some(&header(&format!("u{n}"), "x")),
                        Some(ip),
                        &ReadContext::no_request()
                    )
                    .await,
                Err(AuthError::Unauthenticated)
            ),
            "a clean key is checked, never refused"
        );
    }
    for ip in &attackers[..4] {
        assert!(
            matches!(
                access
                    .authenticate(
                        Some(&header("alice", "guess")),
                        Some(*ip),
                        &ReadContext::no_request()
                    )
                    .await,
                Err(AuthError::Throttled { .. })
            ),
            "{ip} is still refused after the flood"
        );
    }
    let before = count();
    let caller = access
        .authenticate(
            Some(&header("alice", "right")),
            Some(fresh()),
            &ReadContext::no_request(),
        )
        .await
        .expect("the right password from a clean address");
    assert_eq!(caller.user, "alice");
    assert_eq!(count(), before + 1);
    // Remembered: from a refused address too, without argon2.
    access
        .authenticate(
            Some(&header("alice", "right")),
            Some(attackers[0]),
            &ReadContext::no_request(),
        )
        .await
        .expect("remembered");
    assert_eq!(count(), before + 1);
}

/// A new policy that keeps a user's hash keeps the user's credential remembered; one that
/// changes the hash forgets it.
#[tokio::test]
async fn remembered_credentials_survive_a_policy_change_that_keeps_the_hash() {
    let store = Arc::new(MemoryStore::default());
    let hash = hash_secret(b"right").expect("hash");
    let file = |extra: &str, hash: &str| {
        Bytes::from(format!(
            "[users.alice]\nhash = \"{hash}\"\ngrants = [\"read:*\"]\n{extra}"
        ))
    };
    store.put_config(ACCESS_PATH, file("", &hash));
    let counter = Arc::new(Cheap::default());
    let access = Access::new(
        store.clone(),
        location(),
        AccessOptions {
            source: AccessSource::Repository,
            bootstrap: None,
            refresh: Duration::ZERO,
            hash_memory_kib: crate::password::MAX_MEMORY_KIB,
        },
        counter.clone(),
    )
    .expect("valid");
    let count = || counter.0.load(Ordering::SeqCst);
    access
        .authenticate(
            Some(&header("alice", "right")),
            None,
            &ReadContext::no_request(),
        )
        .await
        .expect("verified");
    assert_eq!(count(), 1);
    store.put_config(
        ACCESS_PATH,
        file(&format!("[users.bob]\nhash = \"{hash}\"\n"), &hash),
    );
    access
        .authenticate(
            Some(&header("alice", "right")),
            None,
            &ReadContext::no_request(),
        )
        .await
        .expect("still remembered");
    assert_eq!(count(), 1, "the same hash: no argon2");
    let rotated = hash_secret(b"right").expect("hash");
    store.put_config(ACCESS_PATH, file("", &rotated));
    access
        .authenticate(
            Some(&header("alice", "right")),
            None,
            &ReadContext::no_request(),
        )
        .await
        .expect("verified again");
    assert_eq!(count(), 2, "a new hash is checked again");
}

/// A hash that asks more memory than a check may take here makes the policy invalid: refused
/// at start-up as a fixed text or a bootstrap hash; in the repository, logged and ignored (the
/// previous policy stays).
#[tokio::test]
async fn a_hash_over_the_memory_budget_is_an_invalid_policy() {
    let budget = crate::password::hash_memory_budget(128 << 20);
    let costly = |m: u32| {
        format!("$argon2id$v=19$m={m},t=2,p=1$c29tZXNhbHQ$RdescudvJCsgt3ub+b+dWRWJTmaaJObG")
    };
    let options = |source, bootstrap| AccessOptions {
        source,
        bootstrap,
        refresh: Duration::ZERO,
        hash_memory_kib: budget,
    };
    let text = |m: u32| format!("[users.big]\nhash = \"{}\"\n", costly(m));
    let new = |o| {
        Access::new(
            Arc::new(MemoryStore::default()),
            location(),
            o,
            Arc::new(Cheap::default()),
        )
    };
    assert!(new(options(AccessSource::Text(text(budget)), None)).is_ok());
    let refused = new(options(AccessSource::Text(text(budget + 1)), None))
        .err()
        .expect("over the budget");
    assert!(
        refused
            .to_string()
            .contains("more than one argon2 check may take"),
        "{refused}"
    );
    assert!(
        new(options(
            AccessSource::Repository,
            Some(("admin".into(), Secret::new(costly(budget + 1024))))
        ))
        .is_err()
    );
    // In the repository: the costly file is ignored and the valid one before it stays.
    let store = Arc::new(MemoryStore::default());
    let hash = hash_secret(b"right").expect("hash");
    store.put_config(
        ACCESS_PATH,
        Bytes::from(format!("[users.alice]\nhash = \"{hash}\"\n")),
    );
    let access = Access::new(
        store.clone(),
        location(),
        options(AccessSource::Repository, None),
        Arc::new(Cheap::default()),
    )
    .expect("valid");
    access
        .authenticate(
            Some(&header("alice", "right")),
            None,
            &ReadContext::no_request(),
        )
        .await
        .expect("alice");
    store.put_config(
        ACCESS_PATH,
        Bytes::from(format!(
            "[users.alice]\nhash = \"{hash}\"\n[users.big]\nhash = \"{}\"\n",
            costly(4 * budget)
        )),
    );
    access
        .authenticate(
            Some(&header("alice", "right")),
            None,
            &ReadContext::no_request(),
        )
        .await
        .expect("the previous policy stays");
    assert!(access.stored_hash("big").is_none());
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
            hash_memory_kib: crate::password::MAX_MEMORY_KIB,
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
        .authenticate(
            Some(&header("admin", token.expose())),
            None,
            &ReadContext::no_request(),
        )
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
            .authenticate(
                Some(&header("admin", token.expose())),
                None,
                &ReadContext::no_request()
            )
            .await,
        Err(AuthError::Unauthenticated)
    ));
}

/// `first.last` was written as the nested table `[users.first.last]` (a file that does not
/// parse); the serialiser quotes it, and the first administrator logs in under that name.
/// The first administrator's access file is never the first commit of a branch beside the
/// repository's others (it would fork the states): refused, naming the branch.
#[tokio::test]
async fn no_first_admin_on_a_missing_branch_beside_others() {
    use crate::ports::{StateStore, WritePlan};
    let store = Arc::new(MemoryStore::default());
    let elsewhere = Location {
        branch: crate::BranchName::parse("master").expect("valid"),
        ..location()
    };
    let meta = CommitMeta {
        author_name: "gitstate".into(),
        author_email: "gitstate@localhost".into(),
        committer_name: "gitstate".into(),
        committer_email: "gitstate@localhost".into(),
        message: String::new(),
    };
    let plan: WritePlan = {
        let meta = meta.clone();
        Arc::new(move |_, _| Ok(meta.clone()))
    };
    store
        .write_state(
            &elsewhere,
            &crate::StateName::parse("a.tfstate").expect("valid"),
            crate::ports::Change::Put(Bytes::from_static(b"{}")),
            plan,
        )
        .await
        .expect("a state on master");
    let access = Access::new(
        store.clone(),
        location(),
        AccessOptions {
            source: AccessSource::Repository,
            bootstrap: None,
            refresh: Duration::ZERO,
            hash_memory_kib: crate::password::MAX_MEMORY_KIB,
        },
        Arc::new(Argon2id),
    )
    .expect("valid");
    match access.create_first_admin("admin", meta).await {
        Err(error @ FirstAdminError::NoBranch { .. }) => {
            assert!(error.to_string().contains("GITSTATE_REF"), "{error}")
        }
        other => panic!("{other:?}"),
    }
}

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
            hash_memory_kib: crate::password::MAX_MEMORY_KIB,
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
        .read_config(
            &location(),
            ACCESS_PATH,
            Duration::ZERO,
            &ReadContext::no_request(),
        )
        .await
        .expect("read")
        .expect("written");
    let text = std::str::from_utf8(&file).expect("UTF-8");
    assert!(text.contains("[users.\"first.last\"]"), "{text}");
    let caller = access
        .authenticate(
            Some(&header("first.last", "right")),
            None,
            &ReadContext::no_request(),
        )
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

/// Issue 23's log wording: a throttled refusal says its wait in seconds (rounded up, as
/// `Retry-After`), and a client address shows as the address, not `Some(…)`.
#[test]
fn throttled_reasons_and_addresses_read_well() {
    let throttled = AuthError::Throttled {
        retry_after: Duration::from_millis(2_500),
    };
    assert!(
        throttled.to_string().contains("retry after 3 s"),
        "{throttled}"
    );
    let address = IpAddr::from([192, 0, 2, 7]);
    assert_eq!(super::ClientAddress(Some(address)).to_string(), "192.0.2.7");
    assert_eq!(super::ClientAddress(None).to_string(), "unknown");
}

/// Accepts nothing, each check taking `pause_ms`; counts the checks started, finished and under
/// way, and the most under way at once.
#[derive(Default)]
struct Slow {
    pause_ms: std::sync::atomic::AtomicU64,
    started: AtomicUsize,
    finished: AtomicUsize,
    running: AtomicUsize,
    most: AtomicUsize,
}

impl PasswordVerifier for Slow {
    fn verify(&self, _phc: &str, _secret: &[u8]) -> bool {
        self.started.fetch_add(1, Ordering::SeqCst);
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(self.pause_ms.load(Ordering::SeqCst)));
        self.running.fetch_sub(1, Ordering::SeqCst);
        self.finished.fetch_add(1, Ordering::SeqCst);
        false
    }
}

impl Slow {
    /// Wait (at most 20 s) until `counter` reaches `n`.
    async fn until(&self, counter: &AtomicUsize, n: usize) {
        for _ in 0..2000 {
            if counter.load(Ordering::SeqCst) >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("only {} of {n}", counter.load(Ordering::SeqCst));
    }
}

/// Requests dropped while their argon2 check runs, as when a client hangs up right after
/// sending (hyper then drops the request) or a deadline passes. The check goes on on its
/// blocking thread whatever happens to the request; it must keep its argon2 slot until it ends
/// (else clients that hang up run any number of checks at once, past the limits on threads and
/// memory), and its failure must count (else they are never throttled: measured on `serve`, 40
/// such requests from one address and the next was still 401, not 429).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_dropped_during_their_check_keep_the_limit_and_count_their_failures() {
    let hash = hash_secret(b"right").expect("hash");
    let text = format!("[users.alice]\nhash = \"{hash}\"\ngrants = [\"read:*\"]\n");
    let slow = Arc::new(Slow::default());
    let access = access_with(text, slow.clone());
    let slots = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let read = ReadContext::no_request();
    // Dropped once its check has started, or after 200 ms in the queue.
    let drop_once_checking = |user: String, client: IpAddr| {
        let (access, slow, read) = (&access, slow.clone(), read.clone());
        async move {
            let before = slow.started.load(Ordering::SeqCst);
            let attempt = async {
                access
                    .authenticate(Some(&header(&user, "wrong")), Some(client), &read)
                    .await
            };
            let started = slow.until(&slow.started, before + 1);
            let _ = tokio::time::timeout(Duration::from_millis(200), async {
                tokio::select! {
                    outcome = attempt => panic!("answered before it was dropped: {outcome:?}"),
                    () = started => {}
                }
            })
            .await;
        }
    };

    // More dropped requests than there are slots, each check lasting well past the others.
    slow.pause_ms.store(1500, Ordering::SeqCst);
    for i in 0..slots + 3 {
        drop_once_checking(format!("u{i}"), IpAddr::from([192, 0, 2, 1])).await;
    }
    let begun = slow.started.load(Ordering::SeqCst);
    slow.until(&slow.finished, begun).await;
    let most = slow.most.load(Ordering::SeqCst);
    assert!(
        most <= slots,
        "{most} checks ran at once, past the {slots} slots"
    );

    // One name from another address: each dropped request's failure counts, so after the
    // pair's budget the next is refused without a check.
    slow.pause_ms.store(100, Ordering::SeqCst);
    let client = IpAddr::from([192, 0, 2, 2]);
    for _ in 0..FREE_PAIR_FAILURES {
        let before = slow.finished.load(Ordering::SeqCst);
        drop_once_checking("alice".into(), client).await;
        slow.until(&slow.finished, before + 1).await;
    }
    let checks = slow.started.load(Ordering::SeqCst);
    let next = access
        .authenticate(Some(&header("alice", "wrong")), Some(client), &read)
        .await;
    assert!(
        matches!(next, Err(AuthError::Throttled { .. })),
        "after {FREE_PAIR_FAILURES} dropped failures: {next:?}"
    );
    assert_eq!(
        slow.started.load(Ordering::SeqCst),
        checks,
        "refused without a check"
    );
}
