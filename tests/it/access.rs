//! Users and grants over the real git server: the permission matrix, the access file in the
//! repository, malformed credentials, argon2 on every failure, and no secret in any log line.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use gitstate_core::access::Role;
use gitstate_core::auth::Access;
use gitstate_core::password::{Argon2id, PasswordVerifier};
use gitstate_tests::{
    Client, GIT_TOKEN, GitServer, TEST_PASSWORD, TestBackend, access_file, capture_logs,
    captured_logs, git, hash_of, lock_info, settings_for, state_json,
};

const ROOT: (&str, &str) = ("root", "root-password-0123456789");
const READER: (&str, &str) = ("reader", "reader-password-0123456789");
const WRITER: (&str, &str) = ("writer", "writer-password-0123456789");
const ADMIN: (&str, &str) = ("admin", "admin-password-0123456789");

/// Every password and hash of this file: none may appear in a log line.
fn secrets() -> Vec<String> {
    let mut all = vec![GIT_TOKEN.to_owned(), TEST_PASSWORD.to_owned()];
    for (_, password) in [ROOT, READER, WRITER, ADMIN] {
        all.push(password.to_owned());
        all.push(hash_of(password));
    }
    all
}

fn assert_no_secret_logged() {
    let logs = captured_logs();
    assert!(!logs.is_empty(), "the capture works");
    for secret in secrets() {
        assert!(!logs.contains(&secret), "a secret reached the log");
        // The base64 form of user:password is what an Authorization header carries.
        for (user, password) in [ROOT, READER, WRITER, ADMIN] {
            if secret == password {
                let basic =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                assert!(!logs.contains(&basic), "a Basic header reached the log");
            }
        }
    }
}

/// What a request does, and the role it needs on the state's prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    ReadState,
    WriteState,
    DeleteState,
    Lock,
    ReadLock,
    UnlockOwn,
    UnlockOthers,
    ForceUnlock,
}

impl Route {
    const ALL: [Route; 8] = [
        Route::ReadState,
        Route::WriteState,
        Route::DeleteState,
        Route::Lock,
        Route::ReadLock,
        Route::UnlockOwn,
        Route::UnlockOthers,
        Route::ForceUnlock,
    ];

    fn needs(self) -> Role {
        match self {
            Route::ReadState | Route::ReadLock => Role::Read,
            Route::WriteState | Route::Lock | Route::UnlockOwn => Role::Write,
            Route::DeleteState | Route::UnlockOthers | Route::ForceUnlock => Role::Admin,
        }
    }
}

fn basic(user: &str, password: &str) -> Vec<u8> {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn permission_matrix_over_every_role_route_and_prefix() {
    capture_logs();
    let server = GitServer::start().await;
    let url = server.create_repo("matrix");
    let users: [(&str, &str, &[&str]); 4] = [
        (ROOT.0, ROOT.1, &["admin:*"]),
        (READER.0, READER.1, &["read:team/"]),
        (WRITER.0, WRITER.1, &["write:team/"]),
        (ADMIN.0, ADMIN.1, &["admin:team/"]),
    ];
    let access = access_file(&users);
    let backend = TestBackend::start(&url, &[("GITSTATE_ACCESS", &access)]).await;
    // A second backend on the same repository where every user is an administrator: it sets up
    // locks that belong to a user who may no longer be allowed to take them.
    let everyone_admin = access_file(&[
        (ROOT.0, ROOT.1, &["admin:*"]),
        (READER.0, READER.1, &["admin:*"]),
        (WRITER.0, WRITER.1, &["admin:*"]),
        (ADMIN.0, ADMIN.1, &["admin:*"]),
    ]);
    let setup_backend = TestBackend::start(&url, &[("GITSTATE_ACCESS", &everyone_admin)]).await;
    let root = Client::with_credentials(&backend.url, Some(ROOT));

    let roles = [
        (Some(READER), Some(Role::Read)),
        (Some(WRITER), Some(Role::Write)),
        (Some(ADMIN), Some(Role::Admin)),
        (None, None),
    ];
    let mut cases = 0;
    let mut failures = Vec::new();
    for (n, route) in Route::ALL.into_iter().enumerate() {
        for (m, (credentials, role)) in roles.into_iter().enumerate() {
            for inside in [true, false] {
                cases += 1;
                let prefix = if inside { "team" } else { "other" };
                let name = format!("{prefix}/case-{n}-{m}.tfstate");
                // GIVEN a state, and for the lock routes a lock, held by root or by the user.
                root.write(&name, &state_json("L", 1)).await.expect(200);
                let lock_id = format!("lock-{n}-{m}");
                match route {
                    Route::ReadLock | Route::UnlockOthers | Route::ForceUnlock => {
                        root.lock(&name, &lock_id).await.expect(200);
                    }
                    Route::UnlockOwn => {
                        let owner = credentials.unwrap_or(ROOT);
                        let setup = Client::with_credentials(&setup_backend.url, Some(owner));
                        setup.lock(&name, &lock_id).await.expect(200);
                    }
                    _ => {}
                }
                let refs_before = git(&["ls-remote", &server.url_with_credentials("matrix")], None);

                // WHEN the user makes the request
                let client = Client::with_credentials(&backend.url, credentials);
                let answer = match route {
                    Route::ReadState => client.send("GET", &format!("/states/{name}"), None).await,
                    Route::WriteState => {
                        client
                            .send(
                                "POST",
                                &format!("/states/{name}"),
                                Some(&state_json("L", 2)),
                            )
                            .await
                    }
                    Route::DeleteState => {
                        client
                            .send("DELETE", &format!("/states/{name}"), None)
                            .await
                    }
                    Route::Lock => client.lock(&name, &lock_id).await,
                    Route::ReadLock => client.send("GET", &format!("/locks/{name}"), None).await,
                    Route::UnlockOwn | Route::UnlockOthers => {
                        client
                            .send(
                                "DELETE",
                                &format!("/locks/{name}"),
                                Some(&lock_info(&lock_id)),
                            )
                            .await
                    }
                    Route::ForceUnlock => {
                        client
                            .send("DELETE", &format!("/locks/{name}"), Some(""))
                            .await
                    }
                };

                // THEN the status follows from the role, the prefix and the route alone
                let allowed = role.is_some_and(|r| r >= route.needs() && inside);
                let expected = match role {
                    None => 401,
                    Some(_) if allowed => 200,
                    Some(_) => 403,
                };
                if answer.status != expected {
                    failures.push(format!(
                        "{route:?} as {:?} on {name}: {} (want {expected}) {}",
                        credentials.map(|c| c.0),
                        answer.status,
                        answer.body.trim()
                    ));
                }
                // A 403 names a grant the user lacks (the first one the request needs).
                let effective = role.filter(|_| inside);
                let names_missing = Role::ALL.iter().any(|r| {
                    Some(*r) > effective
                        && *r <= route.needs()
                        && answer.body.contains(&format!("needs the {r} grant"))
                });
                if expected == 403 && !names_missing {
                    failures.push(format!(
                        "{route:?}: 403 does not name the grant: {}",
                        answer.body
                    ));
                }
                if !allowed {
                    let refs_after =
                        git(&["ls-remote", &server.url_with_credentials("matrix")], None);
                    if refs_after != refs_before {
                        failures.push(format!(
                            "{route:?} on {name}: a refused request changed refs"
                        ));
                    }
                }
            }
        }
    }
    assert_eq!(cases, 64);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_no_secret_logged();
}

struct Counting {
    calls: AtomicUsize,
}

impl PasswordVerifier for Counting {
    fn verify(&self, phc: &str, secret: &[u8]) -> bool {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Argon2id.verify(phc, secret)
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_users_and_wrong_passwords_both_pay_argon2_and_look_the_same() {
    capture_logs();
    let server = GitServer::start().await;
    let url = server.create_repo("timing");
    let cache = tempfile::tempdir().expect("tempdir");
    // Several users, so the per-user slow-down never kicks in during the measurement.
    let users: Vec<(String, String)> = (0..9)
        .map(|i| (format!("user{i}"), format!("password-{i}-0123456789")))
        .collect();
    let listed: Vec<(&str, &str, &[&str])> = users
        .iter()
        .map(|(u, p)| (u.as_str(), p.as_str(), &["read:*"][..]))
        .collect();
    let settings = settings_for(
        &url,
        cache.path(),
        &[("GITSTATE_ACCESS", &access_file(&listed))],
    );
    let backend = gitstate_app::build(settings.clone())
        .await
        .expect("backend")
        .backend;
    let verifier = Arc::new(Counting {
        calls: AtomicUsize::new(0),
    });
    let access = Access::new(
        backend.store().clone(),
        backend.locate(None, None).expect("primary"),
        settings.access.options(),
        verifier.clone(),
    )
    .expect("access");
    let router = gitstate_http::router(
        backend,
        Arc::new(access),
        gitstate_http::Limits {
            max_body_bytes: 1 << 20,
            max_response_bytes: None,
            request_deadline: std::time::Duration::from_secs(50),
        },
    );
    let served = TestBackend::serve(router, cache).await;
    let client = Client::with_credentials(&served.url, None);

    let (mut unknown, mut wrong) = (Vec::new(), Vec::new());
    let mut answers = std::collections::BTreeSet::new();
    for (i, (user, _)) in users.iter().enumerate() {
        let started = Instant::now();
        let (status, headers, body) = client
            .send_with_authorization(
                "GET",
                "/states/a.tfstate",
                Some(&basic(&format!("nobody{i}"), "x")),
            )
            .await;
        unknown.push(started.elapsed());
        answers.insert((status, headers.get("www-authenticate").cloned(), body));
        let started = Instant::now();
        let (status, headers, body) = client
            .send_with_authorization("GET", "/states/a.tfstate", Some(&basic(user, "not-it")))
            .await;
        wrong.push(started.elapsed());
        answers.insert((status, headers.get("www-authenticate").cloned(), body));
    }
    assert_eq!(
        verifier.calls.load(Ordering::SeqCst),
        2 * users.len(),
        "every failure, unknown user or wrong password, ran argon2"
    );
    assert_eq!(
        answers.len(),
        1,
        "both failures answer identically: {answers:?}"
    );
    let (status, challenge, _) = answers.into_iter().next().expect("one answer");
    assert_eq!(status, 401);
    assert_eq!(
        challenge.as_ref().and_then(|v| v.to_str().ok()),
        Some("Basic realm=\"gitstate\", charset=\"UTF-8\"")
    );

    // A right password is hashed once, then served from the credential cache.
    let (user, password) = &users[0];
    let before = verifier.calls.load(Ordering::SeqCst);
    let mut warm = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let (status, _, _) = client
            .send_with_authorization("GET", "/states/a.tfstate", Some(&basic(user, password)))
            .await;
        warm.push(started.elapsed());
        assert_eq!(status, 404, "authenticated; the state does not exist");
    }
    assert_eq!(verifier.calls.load(Ordering::SeqCst), before + 1);
    println!(
        "argon2 timing (median of {}): unknown user {:?}, wrong password {:?}; right password first {:?}, cached {:?}",
        users.len(),
        median(unknown),
        median(wrong),
        warm[0],
        median(warm[1..].to_vec())
    );
    assert_no_secret_logged();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_authorization_headers_are_401_never_500() {
    capture_logs();
    let server = GitServer::start().await;
    let url = server.create_repo("malformed");
    let backend = TestBackend::start(&url, &[]).await;
    let client = Client::with_credentials(&backend.url, None);
    let huge = format!("Basic {}", "A".repeat(10_000));
    let cases: Vec<Vec<u8>> = vec![
        b"Bearer abc".to_vec(),
        b"Basic".to_vec(),
        b"Basic !!!notbase64".to_vec(),
        b"Basic bm9jb2xvbg==".to_vec(),
        b"Basic OnBhc3N3b3Jk".to_vec(),
        b"Basic dXNlcjo=".to_vec(),
        b"Basic /w==".to_vec(),
        b"Basic \xff\xfe".to_vec(),
        b"basic dGVzdGVyOnh4eA==".to_vec(),
        huge.into_bytes(),
    ];
    for header in &cases {
        let (status, headers, _) = client
            .send_with_authorization("GET", "/states/x.tfstate", Some(header))
            .await;
        assert_eq!(status, 401, "{:?}", String::from_utf8_lossy(header));
        assert!(headers.contains_key("www-authenticate"));
    }
    let (status, _, _) = client
        .send_with_authorization("GET", "/states/x.tfstate", None)
        .await;
    assert_eq!(status, 401);
    let (status, _, body) = client.send_with_authorization("GET", "/health", None).await;
    assert_eq!(
        (status, body.as_str()),
        (200, "ok\n"),
        "health needs no credentials"
    );
}

/// Commit `content` as `.gitstate/access.toml` on main with the git CLI, as a team would.
fn commit_access_file(server: &GitServer, repo: &str, content: &str) {
    let work = tempfile::tempdir().expect("tempdir");
    let clone = work.path().join("clone");
    let clone_str = clone.to_str().expect("utf-8");
    git(
        &["clone", "-q", &server.url_with_credentials(repo), clone_str],
        None,
    );
    std::fs::create_dir_all(clone.join(".gitstate")).expect("mkdir");
    std::fs::write(clone.join(".gitstate/access.toml"), content).expect("write");
    git(&["add", "."], Some(&clone));
    git(
        &["commit", "-q", "-m", "access: change users"],
        Some(&clone),
    );
    git(&["push", "-q", "origin", "HEAD:main"], Some(&clone));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_file_lives_in_the_repository_and_changes_by_commit() {
    capture_logs();
    let server = GitServer::start().await;
    let url = server.create_repo("inrepo");
    commit_access_file(
        &server,
        "inrepo",
        &access_file(&[(WRITER.0, WRITER.1, &["write:team/"])]),
    );
    let bootstrap_hash = hash_of(ROOT.1);
    let backend = TestBackend::start(
        &url,
        &[
            ("GITSTATE_ACCESS_REFRESH_SECS", "0"),
            ("GITSTATE_ADMIN_USER", ROOT.0),
            ("GITSTATE_ADMIN_HASH", &bootstrap_hash),
        ],
    )
    .await;
    let writer = Client::with_credentials(&backend.url, Some(WRITER));
    let root = Client::with_credentials(&backend.url, Some(ROOT));
    let reader = Client::with_credentials(&backend.url, Some(READER));

    // The file's user and the bootstrap administrator both work; others do not.
    writer
        .write("team/a.tfstate", &state_json("L", 1))
        .await
        .expect(200);
    root.get_state("team/a.tfstate").await.expect(200);
    reader.get_state("team/a.tfstate").await.expect(401);

    // The access file cannot be written through the state API.
    for path in [
        "/states/.gitstate/access.toml",
        "/states/%2Egitstate/access.toml",
    ] {
        let answer = root.send("POST", path, Some("{}")).await;
        assert_eq!(answer.status, 400, "{path}: {}", answer.body);
    }

    // A commit adds the reader and removes the writer: the next request sees it.
    commit_access_file(
        &server,
        "inrepo",
        &access_file(&[(READER.0, READER.1, &["read:*"])]),
    );
    reader.get_state("team/a.tfstate").await.expect(200);
    writer.get_state("team/a.tfstate").await.expect(401);

    // An invalid file keeps the previous policy rather than locking everyone out.
    commit_access_file(&server, "inrepo", "[users.bob]\nhash = \"plaintext\"\n");
    reader.get_state("team/a.tfstate").await.expect(200);
    assert!(captured_logs().contains(".gitstate/access.toml is invalid"));

    // Commits are authored as the user.
    let bare = server.repo_dir("inrepo");
    let log = git(
        &[
            "--git-dir",
            bare.to_str().expect("utf-8"),
            "log",
            "--format=%an",
            "main",
            "--",
            "team/a.tfstate",
        ],
        None,
    );
    assert_eq!(log.trim(), WRITER.0);
    assert_no_secret_logged();
}

/// A verifier that holds every argon2 call until the gate opens, counting calls and how many run
/// at once: evidence of the concurrency limit without timing.
struct Gated {
    open: std::sync::atomic::AtomicBool,
    calls: AtomicUsize,
    running: AtomicUsize,
    most_at_once: AtomicUsize,
}

impl PasswordVerifier for Gated {
    fn verify(&self, phc: &str, secret: &[u8]) -> bool {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_at_once.fetch_max(now, Ordering::SeqCst);
        while !self.open.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(2));
        }
        let ok = Argon2id.verify(phc, secret);
        self.running.fetch_sub(1, Ordering::SeqCst);
        ok
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_random_users_from_one_address_is_429_without_argon2_and_cached_logins_pass() {
    use rand::{Rng, SeedableRng};
    capture_logs();
    let server = GitServer::start().await;
    let url = server.create_repo("flood");
    let cache = tempfile::tempdir().expect("tempdir");
    let settings = settings_for(
        &url,
        cache.path(),
        &[(
            "GITSTATE_ACCESS",
            &access_file(&[(READER.0, READER.1, &["read:*"])]),
        )],
    );
    let backend = gitstate_app::build(settings.clone())
        .await
        .expect("backend")
        .backend;
    let verifier = Arc::new(Gated {
        open: true.into(),
        calls: AtomicUsize::new(0),
        running: AtomicUsize::new(0),
        most_at_once: AtomicUsize::new(0),
    });
    let access = Access::new(
        backend.store().clone(),
        backend.locate(None, None).expect("primary"),
        settings.access.options(),
        verifier.clone(),
    )
    .expect("access");
    let router = gitstate_http::router(
        backend,
        Arc::new(access),
        gitstate_http::Limits {
            max_body_bytes: 1 << 20,
            max_response_bytes: None,
            request_deadline: Duration::from_secs(120),
        },
    );
    // Served with the peer address, as `gitstate serve` does: every request comes from 127.0.0.1.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let _server = tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            router.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await;
    });
    let client = Arc::new(Client::with_credentials(&format!("http://{address}"), None));
    let valid = basic(READER.0, READER.1);
    let (status, _, _) = client
        .send_with_authorization("GET", "/states/a.tfstate", Some(&valid))
        .await;
    assert_eq!(status, 404, "verified once, now remembered");
    assert_eq!(verifier.calls.load(Ordering::SeqCst), 1);

    // Close the gate: the flood's first attempts hold every argon2 slot, the rest queue.
    verifier.open.store(false, Ordering::SeqCst);
    let slots = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let flood_size = 300;
    let mut names = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let mut flood = Vec::new();
    for _ in 0..flood_size {
        let client = client.clone();
        let header = basic(&format!("u{:016x}", names.random::<u64>()), "guess");
        flood.push(tokio::spawn(async move {
            client
                .send_with_authorization("GET", "/states/a.tfstate", Some(&header))
                .await
        }));
    }
    let waiting = Instant::now();
    while verifier.running.load(Ordering::SeqCst) < slots {
        assert!(
            waiting.elapsed() < Duration::from_secs(60),
            "the flood reaches argon2"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Every slot is taken and the gate is shut: a remembered credential must not need one.
    let (status, _, _) = client
        .send_with_authorization("GET", "/states/a.tfstate", Some(&valid))
        .await;
    assert_eq!(
        status, 404,
        "a remembered credential is served during the flood"
    );
    assert_eq!(verifier.running.load(Ordering::SeqCst), slots);
    verifier.open.store(true, Ordering::SeqCst);

    let (mut refused, mut failed) = (0, 0);
    let mut bodies = std::collections::BTreeSet::new();
    for answer in flood {
        let (status, headers, body) = answer.await.expect("request task");
        match status {
            429 => {
                let wait: u64 = headers
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .expect("a 429 says when to retry, in seconds");
                assert!((1..=60).contains(&wait), "{wait}");
                refused += 1;
            }
            401 => failed += 1,
            other => panic!("unexpected {other}: {body}"),
        }
        bodies.insert((status, without_digits(&body)));
    }
    let argon2_runs = verifier.calls.load(Ordering::SeqCst) - 1;
    println!(
        "flood of {flood_size} from one address, {slots} argon2 slots: {failed} x 401 (argon2 ran {argon2_runs} times, at most {} at once), {refused} x 429 without argon2",
        verifier.most_at_once.load(Ordering::SeqCst)
    );
    assert_eq!(failed, argon2_runs, "every 401 ran argon2 once, no 429 did");
    let budget = gitstate_core::auth::FREE_ADDRESS_FAILURES as usize;
    assert!(
        argon2_runs <= budget + slots,
        "argon2 ran {argon2_runs} times for a budget of {budget} and {slots} slots"
    );
    assert_eq!(refused, flood_size - argon2_runs);
    assert!(verifier.most_at_once.load(Ordering::SeqCst) <= slots);
    assert_eq!(bodies.len(), 2, "one 401 and one 429 answer: {bodies:?}");

    // A known user with the wrong password gets the same 429 as the random names.
    let (status, _, body) = client
        .send_with_authorization("GET", "/states/a.tfstate", Some(&basic(READER.0, "wrong")))
        .await;
    assert_eq!(status, 429);
    assert!(
        bodies.contains(&(429, without_digits(&body))),
        "the known user's 429 reads as the random names' (but for the wait): {body}"
    );
    assert_eq!(verifier.calls.load(Ordering::SeqCst), argon2_runs + 1);
    assert_no_secret_logged();
}

/// An answer's text with its numbers taken out: a 429 names its wait in seconds, which may differ
/// by a second between two answers that are otherwise the same.
fn without_digits(body: &str) -> String {
    body.chars().filter(|c| !c.is_ascii_digit()).collect()
}
