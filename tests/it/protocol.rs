//! The HTTP protocol and the git branch-lock protocol against a real smart-HTTP git server.

use gitstate_tests::{
    Client, GitServer, TestBackend, git, git_output, init_tracing, lock_info, state_json,
};

const NAME: &str = "net/prod.tfstate";

fn ls_remote(server: &GitServer, repo: &str) -> String {
    git(&["ls-remote", &server.url_with_credentials(repo)], None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_cycle_counts_git_requests_and_leaves_an_audit_trail() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("state");
    let backend = TestBackend::start(&url, &[("GITSTATE_COMMITTER_NAME", "ci-bot")]).await;
    let client = Client::new(&backend.url);
    let path = format!("/states/{NAME}");

    // GIVEN an empty repository, WHEN reading, THEN 404 after one advertisement.
    client.get_state(NAME).await.expect(404);
    assert_eq!(server.take_labels(), ["GET refs/upload-pack"]);

    // LOCK: advertisement + create-only push = 2 requests; the repository's first LOCK also
    // records the lock ref prefix (one more push, once per repository).
    client.lock(NAME, "lock-1").await.expect(200);
    assert_eq!(
        server.take_labels(),
        [
            "GET refs/receive-pack",
            "POST receive-pack",
            "POST receive-pack"
        ]
    );
    assert!(ls_remote(&server, "state").contains(&format!("refs/heads/locks/{NAME}")));
    server.take_requests(); // the git CLI's own requests

    // Write with the lock: advertisement + push (atomic with the unchanged lock ref).
    let first = state_json("lin-1", 1);
    client
        .write_locked(NAME, "lock-1", &first)
        .await
        .expect(200);
    let write = server.take_labels();
    assert!(write.len() <= 5, "write took {write:?}");
    assert_eq!(write, ["GET refs/receive-pack", "POST receive-pack"]);

    // Warm GET of a tip this process pushed: one request.
    assert_eq!(client.get_state(NAME).await.expect(200).body, first);
    assert_eq!(server.take_labels(), ["GET refs/upload-pack"]);

    let second = state_json("lin-1", 2);
    assert_eq!(
        client
            .send("PUT", &format!("{path}?ID=lock-1"), Some(&second))
            .await
            .status,
        200
    );
    server.take_labels();

    // UNLOCK of the lock this process made: the conditional delete alone (the protocol floor).
    client.unlock(NAME, "lock-1").await.expect(200);
    assert_eq!(server.take_labels(), ["POST receive-pack"]);
    assert!(!ls_remote(&server, "state").contains("locks/"));
    server.take_requests(); // the git CLI's own requests

    // A cold backend (new cache) fetches once, then serves warm GETs with one request each.
    let cold = TestBackend::start(&url, &[]).await;
    let cold_client = Client::new(&cold.url);
    assert_eq!(cold_client.get_state(NAME).await.expect(200).body, second);
    assert_eq!(
        server.take_labels(),
        ["GET refs/upload-pack", "POST upload-pack"]
    );
    assert_eq!(cold_client.get_state(NAME).await.expect(200).body, second);
    assert_eq!(server.take_labels(), ["GET refs/upload-pack"]);

    // UNLOCK in a fresh process: the receive-pack advertisement gives the lock's tip and the push
    // capabilities, one fetch brings the lock commit to compare its ID, then the delete: 3.
    client.lock(NAME, "lock-2").await.expect(200);
    server.take_requests();
    let fresh = TestBackend::start(&url, &[]).await;
    Client::new(&fresh.url)
        .unlock(NAME, "lock-2")
        .await
        .expect(200);
    assert_eq!(
        server.take_labels(),
        [
            "GET refs/receive-pack",
            "POST upload-pack",
            "POST receive-pack"
        ]
    );
    server.take_requests(); // the git CLI's own requests

    // The repository, seen by the git CLI: the state, the history, the authors.
    let bare = server.repo_dir("state");
    let bare = bare.to_str().expect("utf-8");
    assert_eq!(
        git(&["--git-dir", bare, "show", &format!("main:{NAME}")], None),
        second
    );
    let log = git(
        &["--git-dir", bare, "log", "--format=%an|%cn|%s", "main"],
        None,
    );
    assert_eq!(
        log.lines().collect::<Vec<_>>(),
        [
            format!("tester|ci-bot|write {NAME} (serial 2)"),
            format!("tester|ci-bot|write {NAME} (serial 1)")
        ]
    );
    let body = git(
        &["--git-dir", bare, "log", "-1", "--format=%B", "main"],
        None,
    );
    assert!(
        body.contains("Lock-ID: lock-1") && body.contains("Who: tester@host"),
        "{body}"
    );
    git(&["--git-dir", bare, "fsck", "--strict"], None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_write_rules_over_git() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("state");
    let backend = TestBackend::start(&url, &[]).await;
    let c = Client::new(&backend.url);
    let path = format!("/states/{NAME}");

    c.lock(NAME, "A").await.expect(200);
    let conflict = c.lock(NAME, "B").await.expect(423);
    assert!(
        conflict.body.contains(r#""ID":"A""#),
        "holder's LockInfo: {}",
        conflict.body
    );
    assert_eq!(
        c.lock(NAME, "A").await.status,
        200,
        "re-lock with the same ID is idempotent"
    );
    assert_eq!(
        c.send("LOCK", &path, Some(&lock_info("C"))).await.status,
        423,
        "LOCK verb on /states"
    );

    let s1 = state_json("L", 1);
    let wrong = c.write_locked(NAME, "B", &s1).await.expect(409);
    assert!(wrong.body.contains(r#""ID":"A""#));
    // A write without ID while locked.
    c.write(NAME, &s1).await.expect(423);
    c.write_locked(NAME, "A", &s1).await.expect(200);
    c.write_locked(NAME, "A", &state_json("L", 5))
        .await
        .expect(200);
    let stale = c
        .write_locked(NAME, "A", &state_json("L", 4))
        .await
        .expect(409);
    assert!(stale.body.contains("stale"), "{}", stale.body);

    assert_eq!(
        c.send("UNLOCK", &path, Some(&lock_info("B"))).await.status,
        409
    );
    let held = c.get_lock(NAME).await.expect(200);
    assert!(held.body.contains(r#""ID":"A""#));
    assert_eq!(held.lock().id, "A");
    assert_eq!(
        c.send("UNLOCK", &path, Some("")).await.status,
        200,
        "Terraform's force-unlock"
    );
    c.get_lock(NAME).await.expect(409);
    // Unlocking what is not locked.
    c.unlock(NAME, "A").await.expect(200);

    // Unlocked write with an ID whose lock is gone: refused.
    c.write_locked(NAME, "A", &state_json("L", 6))
        .await
        .expect(409);
    // -lock=false: accepted.
    c.write(NAME, &state_json("L", 6)).await.expect(200);
    // Terraform re-encodes and sorts the query: decode it properly.
    c.lock(NAME, "id with space/+").await.expect(200);
    let encoded = format!("{path}?ID=id%20with%20space%2F%2B&ref=main");
    assert_eq!(
        c.send("POST", &encoded, Some(&state_json("L", 7)))
            .await
            .status,
        200
    );
    c.unlock(NAME, "id with space/+").await.expect(200);

    c.delete_state(NAME, None).await.expect(200);
    c.get_state(NAME).await.expect(404);
    c.delete_state(NAME, None).await.expect(404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interoperates_with_the_seed_tools_lock_branches() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("state");
    let backend = TestBackend::start(&url, &[]).await;
    let c = Client::new(&backend.url);
    let file = "app.tfstate";
    c.write(file, &state_json("S", 1)).await.expect(200);

    // The seed recipe, run with the git CLI: clone, branch locks/<file>, commit <file>.lock, push.
    let work = tempfile::tempdir().expect("tempdir");
    let clone = work.path().join("clone");
    git(
        &[
            "clone",
            "-q",
            &server.url_with_credentials("state"),
            clone.to_str().expect("utf-8"),
        ],
        None,
    );
    git(
        &["checkout", "-q", "-b", &format!("locks/{file}")],
        Some(&clone),
    );
    std::fs::write(clone.join(format!("{file}.lock")), lock_info("seed-lock"))
        .expect("write lock file");
    git(&["add", "."], Some(&clone));
    git(
        &["commit", "-q", "-m", &format!("Lock {file}")],
        Some(&clone),
    );

    // WHEN gitstate holds the lock, THEN the seed recipe's push is rejected.
    c.lock(file, "gitstate-lock").await.expect(200);
    let push = git_output(
        &["push", "-q", "origin", &format!("locks/{file}")],
        Some(&clone),
    );
    assert!(!push.status.success(), "the seed tool must see the lock");

    // WHEN the seed recipe holds the lock, THEN gitstate answers 423 with its LockInfo.
    c.unlock(file, "gitstate-lock").await.expect(200);
    git(
        &["push", "-q", "origin", &format!("locks/{file}")],
        Some(&clone),
    );
    let refused = c.lock(file, "gitstate-2").await.expect(423);
    assert!(
        refused.body.contains(r#""ID":"seed-lock""#),
        "{}",
        refused.body
    );
    assert_eq!(refused.lock().id, "seed-lock");
    c.write(file, &state_json("S", 2)).await.expect(423);
    // The seed tool's unlock (delete the branch) frees it for gitstate.
    git(
        &["push", "-q", "origin", "--delete", &format!("locks/{file}")],
        Some(&clone),
    );
    c.lock(file, "gitstate-2").await.expect(200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_address_format_and_allowlist() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("state");
    let other = server.create_repo("other");
    let backend = TestBackend::start(&url, &[("GITSTATE_ALLOWED_REPOSITORIES", &other)]).await;
    let c = Client::new(&backend.url);
    let address = |repo: &str| {
        format!(
            "/?type=git&repository={}&ref=main&state=team%2Fa.json",
            repo.replace(':', "%3A").replace('/', "%2F")
        )
    };

    assert_eq!(
        c.send("LOCK", &address(&other), Some(&lock_info("X")))
            .await
            .status,
        200
    );
    // Terraform appends ?ID= and sorts the parameters.
    let write = format!(
        "/?ID=X&ref=main&repository={}&state=team%2Fa.json&type=git",
        other.replace(':', "%3A").replace('/', "%2F")
    );
    assert_eq!(
        c.send("POST", &write, Some(&state_json("Q", 1)))
            .await
            .status,
        200
    );
    assert_eq!(
        c.send("GET", &address(&other), None).await.body,
        state_json("Q", 1)
    );
    assert_eq!(
        c.send("UNLOCK", &address(&other), Some(&lock_info("X")))
            .await
            .status,
        200
    );
    let other_dir = server.repo_dir("other");
    assert_eq!(
        git(
            &[
                "--git-dir",
                other_dir.to_str().expect("utf-8"),
                "show",
                "main:team/a.json"
            ],
            None
        ),
        state_json("Q", 1)
    );

    // A repository that is not configured is refused before any git request is made.
    server.take_requests();
    let foreign = c
        .send("GET", &address("https://evil.example/x.git"), None)
        .await;
    assert_eq!(foreign.status, 403);
    assert!(foreign.body.contains("allowlist"));
    assert_eq!(
        c.send(
            "LOCK",
            &address(&server.url("unlisted")),
            Some(&lock_info("Y"))
        )
        .await
        .status,
        403
    );
    assert!(
        server.take_requests().is_empty(),
        "nothing may be fetched for a foreign repository"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_4xx_and_changes_nothing() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("state");
    let backend = TestBackend::start(&url, &[("GITSTATE_MAX_BODY_BYTES", "2048")]).await;
    let c = Client::new(&backend.url);
    c.write("ok.tfstate", &state_json("B", 1)).await.expect(200);
    let before = ls_remote(&server, "state");

    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(4096));
    let cases: Vec<(&str, String, Option<String>, u16)> = vec![
        ("GET", "/states/".into(), None, 400),
        ("GET", "/states/a//b".into(), None, 400),
        ("GET", "/states/a/".into(), None, 400),
        ("GET", "/states/a%20b".into(), None, 400),
        ("GET", "/states/.git/config".into(), None, 400),
        (
            "POST",
            "/states/.gitstate/access.toml".into(),
            Some(state_json("B", 1)),
            400,
        ),
        // The client resolves a literal `..` itself; the server sees /etc/passwd.
        ("GET", "/states/a/../../etc/passwd".into(), None, 400),
        ("GET", "/states/..%2fx".into(), None, 400),
        ("GET", "/states/a%2F..%2F..%2Fx".into(), None, 400),
        ("POST", "/locks/x.lock".into(), Some(lock_info("Z")), 400),
        ("GET", format!("/states/{}", "a".repeat(201)), None, 400),
        ("GET", "/states/caf%C3%A9".into(), None, 400),
        ("GET", "/states/%ff".into(), None, 400),
        ("POST", "/states/ok.tfstate".into(), Some(big), 413),
        (
            "POST",
            "/states/ok.tfstate".into(),
            Some("{not json".into()),
            400,
        ),
        (
            "POST",
            "/states/ok.tfstate".into(),
            Some("[1,2]".into()),
            400,
        ),
        ("POST", "/locks/ok.tfstate".into(), Some("{}".into()), 400),
        (
            "POST",
            "/locks/ok.tfstate".into(),
            Some(r#"{"ID":""}"#.into()),
            400,
        ),
        ("PATCH", "/states/ok.tfstate".into(), Some("{}".into()), 405),
        ("PROPFIND", "/locks/ok.tfstate".into(), None, 405),
        ("GET", "/nowhere".into(), None, 400),
        ("GET", "/?type=svn&repository=x&state=a".into(), None, 400),
        ("GET", "/states/ok.tfstate?ref=a..b".into(), None, 400),
        ("GET", "/states/ok.tfstate?ID=1&ID=2".into(), None, 400),
        (
            "GET",
            format!("/states/ok.tfstate?x={}", "q".repeat(5000)),
            None,
            414,
        ),
    ];
    for (method, path, body, want) in cases {
        let answer = c.send(method, &path, body.as_deref()).await;
        assert_eq!(answer.status, want, "{method} {path}: {}", answer.body);
        assert!(
            !answer.body.trim().is_empty() && !answer.body.trim().contains('\n'),
            "one-line reason: {:?}",
            answer.body
        );
    }
    assert_eq!(
        ls_remote(&server, "state"),
        before,
        "refs must be untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_cache_is_rebuilt_not_served() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("state");
    let backend = TestBackend::start(&url, &[]).await;
    let c = Client::new(&backend.url);
    let state = state_json("C", 1);
    c.write("c.tfstate", &state).await.expect(200);
    // Destroy every object in the cache behind the backend's back.
    for entry in walk(backend.cache.path()) {
        if entry.components().any(|c| c.as_os_str() == "objects") && entry.is_file() {
            std::fs::write(&entry, b"garbage").expect("corrupt");
        }
    }
    let got = c.send("GET", "/states/c.tfstate", None).await;
    assert_eq!((got.status, got.body), (200, state));
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}
