//! Hosts as they are found in the wild: without atomic push (Azure DevOps, CodeCommit), taking
//! only Bearer tokens (Bitbucket Data Center). Private CAs and proxies need their own processes
//! (the proxy comes from the environment): functions/gitstate-cli/tests/it/hosts.rs.

use gitstate_tests::hosts::{BEARER_TOKEN, ReverseProxy};
use gitstate_tests::{
    Client, GIT_TOKEN, GIT_USER, GitServer, PushMode, TestBackend, git, init_tracing, lock_info,
    state_json,
};

const NAME: &str = "net/prod.tfstate";

/// Lock, write under the lock, read back, unlock: what an apply does.
async fn apply_cycle(client: &Client, id: &str, serial: u64) {
    client.apply(NAME, id, &state_json("hosts", serial)).await;
}

/// The advertisement the test server gives in each mode: what the backend decides from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_no_atomic_server_does_not_advertise_atomic() {
    for (mode, atomic) in [(PushMode::Atomic, true), (PushMode::NoAtomic, false)] {
        let server = GitServer::start_in(mode).await;
        let url = server.create_repo("adv");
        let body = reqwest::Client::new()
            .get(format!("{url}/info/refs?service=git-receive-pack"))
            .basic_auth(GIT_USER, Some(GIT_TOKEN))
            .send()
            .await
            .expect("advertisement")
            .bytes()
            .await
            .expect("body");
        let text = String::from_utf8_lossy(&body);
        assert_eq!(text.contains(" atomic"), atomic, "{mode:?}: {text}");
    }
}

/// Without `atomic` a write under a lock is the branch's compare-and-swap alone, after the lock
/// check in the same advertisement: a write with another ID is still refused (409 + holder),
/// one without `?ID=` is 423, nothing lands; a write under a lock keeps its advertisement (the
/// floor pushes it without one only with atomic push).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_atomic_the_lock_still_guards_every_write() {
    init_tracing();
    let server = GitServer::start_in(PushMode::NoAtomic).await;
    let url = server.create_repo("guard");
    let backend = TestBackend::start(&url, &[]).await;
    let client = Client::new(&backend.url);
    apply_cycle(&client, "first-apply", 1).await;
    server.take_labels();

    client.lock(NAME, "holder").await.expect(200);
    assert_eq!(
        server.take_labels(),
        ["POST receive-pack"],
        "LOCK of a warm process: the create-only push alone (the protocol floor)"
    );
    let body = state_json("hosts", 2);
    let other = client
        .write_locked(NAME, "intruder", &body)
        .await
        .expect(409);
    assert!(other.body.contains(r#""ID":"holder""#), "{}", other.body);
    client.write(NAME, &body).await.expect(423);
    server.take_labels();
    client.write_locked(NAME, "holder", &body).await.expect(200);
    assert_eq!(
        server.take_labels(),
        ["GET refs/receive-pack", "POST receive-pack"],
        "write: advertisement and one push"
    );
    let bare = server.repo_dir("guard");
    let bare = bare.to_str().expect("utf-8");
    let serials = git(&["--git-dir", bare, "log", "--format=%s", "main"], None);
    assert_eq!(
        serials
            .lines()
            .filter(|l| l.starts_with(&format!("write {NAME}")))
            .count(),
        2,
        "the refused writes left nothing: {serials}"
    );
    client.unlock(NAME, "holder").await.expect(200);
    git(&["--git-dir", bare, "fsck", "--strict"], None);
}

/// The one difference between the modes, as docs/operating.md states it: a force-unlock landing between a
/// write's advertisement and its push. With atomic push the write does not land (the lock ref
/// changed, the push is refused as a whole, and the retry finds no lock: 409/423, nothing
/// written); without it the write lands, on top of the tip it was built on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_unlock_racing_a_write_differs_only_without_atomic() {
    init_tracing();
    for mode in [PushMode::Atomic, PushMode::NoAtomic] {
        let server = GitServer::start_in(mode).await;
        server.create_repo("race");
        let bare = server.repo_dir("race");
        let lock_ref = format!("refs/heads/locks/{NAME}");
        let armed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hook = {
            let (bare, lock_ref, armed) = (bare.clone(), lock_ref.clone(), armed.clone());
            std::sync::Arc::new(move |body: &[u8]| {
                let updates_main = String::from_utf8_lossy(body).contains(" refs/heads/main");
                if updates_main && armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    // An administrator's force-unlock, straight in the repository.
                    git(
                        &[
                            "--git-dir",
                            bare.to_str().expect("utf-8"),
                            "update-ref",
                            "-d",
                            &lock_ref,
                        ],
                        None,
                    );
                }
            })
        };
        let proxy = ReverseProxy::before_push(server.address, hook).await;
        let backend = TestBackend::start(&proxy.url("race"), &[]).await;
        let client = Client::new(&backend.url);
        apply_cycle(&client, "first", 1).await;
        client.lock(NAME, "holder").await.expect(200);
        armed.store(true, std::sync::atomic::Ordering::SeqCst);
        let write = client
            .send(
                "POST",
                &format!("/states/{NAME}?ID=holder"),
                Some(&state_json("hosts", 2)),
            )
            .await;
        let stored = gitstate_tests::stored_file(&server, "race", NAME);
        match mode {
            PushMode::Atomic => {
                assert!(matches!(write.status, 409 | 423), "{mode:?}: {write:?}");
                assert_eq!(
                    stored,
                    state_json("hosts", 1).into_bytes(),
                    "nothing written"
                );
            }
            PushMode::NoAtomic => {
                assert_eq!(write.status, 200, "{mode:?}: {}", write.body);
                assert_eq!(stored, state_json("hosts", 2).into_bytes());
            }
        }
        assert!(
            !armed.load(std::sync::atomic::Ordering::SeqCst),
            "the race happened"
        );
        git(
            &[
                "--git-dir",
                bare.to_str().expect("utf-8"),
                "fsck",
                "--strict",
            ],
            None,
        );
        let parents = git(
            &[
                "--git-dir",
                bare.to_str().expect("utf-8"),
                "rev-list",
                "--merges",
                "--count",
                "main",
            ],
            None,
        );
        assert_eq!(parents.trim(), "0", "history stays linear");
    }
}

/// `GITSTATE_REQUIRE_ATOMIC=true`: a host without atomic push is refused with a 502 naming the
/// setting, before anything is pushed; a host with it serves as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_atomic_refuses_hosts_without_it() {
    init_tracing();
    for mode in [PushMode::NoAtomic, PushMode::Atomic] {
        let server = GitServer::start_in(mode).await;
        let url = server.create_repo("strict");
        let backend = TestBackend::start(&url, &[("GITSTATE_REQUIRE_ATOMIC", "true")]).await;
        let client = Client::new(&backend.url);
        if mode == PushMode::Atomic {
            apply_cycle(&client, "strict-apply", 1).await;
            continue;
        }
        let body = state_json("hosts", 1);
        for (method, path, body) in [
            ("POST", format!("/locks/{NAME}"), lock_info("strict")),
            ("POST", format!("/states/{NAME}"), body.clone()),
            ("DELETE", format!("/locks/{NAME}"), lock_info("strict")),
        ] {
            let answer = client.send(method, &path, Some(&body)).await;
            assert_eq!(answer.status, 502, "{method} {path}: {}", answer.body);
            assert!(
                answer.body.contains("GITSTATE_REQUIRE_ATOMIC") && answer.body.lines().count() == 1,
                "{}",
                answer.body
            );
        }
        assert!(
            !server
                .take_labels()
                .iter()
                .any(|l| l == "POST receive-pack"),
            "nothing was pushed"
        );
        let refs = git(&["ls-remote", &server.url_with_credentials("strict")], None);
        assert!(refs.is_empty(), "no ref created: {refs}");
    }
}

/// Hosts offer different capabilities: behind a proxy that removes a seeded random subset of the
/// optional ones from every advertisement (as a host without them), every request asks only for
/// what was advertised, and apply cycles from two processes (so fetches of a moved branch happen)
/// all succeed. Without `side-band-64k` the pack comes raw, without `shallow` the whole history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_ask_only_for_advertised_capabilities() {
    use rand::{Rng, SeedableRng};
    init_tracing();
    const OPTIONAL: [&str; 11] = [
        "side-band-64k",
        "side-band",
        "ofs-delta",
        "shallow",
        "no-progress",
        "atomic",
        "quiet",
        "push-options",
        "report-status-v2",
        "thin-pack",
        "include-tag",
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(14);
    for round in 0..4 {
        let hidden: Vec<&str> = OPTIONAL
            .iter()
            .copied()
            .filter(|_| rng.random_bool(0.5))
            .collect();
        let server = GitServer::start().await;
        server.create_repo("caps");
        let proxy = ReverseProxy::stripping(server.address, &hidden).await;
        let url = proxy.url("caps");
        let (one, two) = (
            TestBackend::start(&url, &[]).await,
            TestBackend::start(&url, &[]).await,
        );
        let (one, two) = (Client::new(&one.url), Client::new(&two.url));
        for serial in 1..=3 {
            // Terraform reads the state before it locks (plan), then applies.
            one.send("GET", &format!("/states/{NAME}"), None).await;
            apply_cycle(&one, &format!("one-{serial}"), serial).await;
            let other = two
                .send(
                    "POST",
                    &format!("/states/other-{serial}.tfstate"),
                    Some(&state_json("other", 1)),
                )
                .await;
            assert_eq!(other.status, 200, "round {round}: {}", other.body);
        }
        let requested = proxy.requested();
        assert!(
            requested.iter().any(|(s, _)| s == "upload-pack")
                && requested.iter().any(|(s, _)| s == "receive-pack"),
            "{requested:?}"
        );
        for (service, caps) in &requested {
            for cap in caps {
                let name = cap.split('=').next().unwrap_or_default();
                assert!(
                    !hidden.contains(&name),
                    "round {round}: {service} asked for {cap}, hidden: {hidden:?}"
                );
            }
        }
        let bare = server.repo_dir("caps");
        git(
            &[
                "--git-dir",
                bare.to_str().expect("utf-8"),
                "fsck",
                "--strict",
            ],
            None,
        );
        eprintln!(
            "round {round}: hidden {hidden:?}, {} requests checked",
            requested.len()
        );
    }
}

/// A host that takes only `Authorization: Bearer` (Bitbucket Data Center project and repository
/// tokens): `GITSTATE_GIT_AUTH=bearer` works through the whole cycle; Basic with the same token
/// is a 502 and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_reach_a_host_that_takes_only_bearer() {
    init_tracing();
    let server = GitServer::start().await;
    server.create_repo("bbdc");
    let proxy = ReverseProxy::bearer_only(server.address).await;
    let url = proxy.url("bbdc");

    let basic = TestBackend::start(&url, &[("GITSTATE_GIT_TOKEN", BEARER_TOKEN)]).await;
    let refused = Client::new(&basic.url).lock(NAME, "basic").await;
    assert_eq!(refused.status, 502, "{}", refused.body);
    assert!(proxy.refused() > 0 && proxy.passed() == 0);

    let bearer = TestBackend::start(
        &url,
        &[
            ("GITSTATE_GIT_TOKEN", BEARER_TOKEN),
            ("GITSTATE_GIT_AUTH", "bearer"),
        ],
    )
    .await;
    let refused_before = proxy.refused();
    let client = Client::new(&bearer.url);
    for (serial, id) in ["first", "second"].iter().enumerate() {
        apply_cycle(&client, id, serial as u64 + 1).await;
    }
    assert_eq!(
        proxy.refused(),
        refused_before,
        "every request carried Bearer"
    );
    assert!(proxy.passed() >= 8, "{} requests passed", proxy.passed());
    let stored = gitstate_tests::stored_file(&server, "bbdc", NAME);
    assert_eq!(stored, state_json("hosts", 2).into_bytes());
}
