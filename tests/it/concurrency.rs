//! Many backends with separate caches (as separate Lambda containers) against one repository,
//! on a server with atomic push and on one without (`receive.advertiseAtomic=false`).

use gitstate_tests::{Client, GitServer, PushMode, TestBackend, git, init_tracing, state_json};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_lockers_one_winner() {
    lockers_one_winner(PushMode::Atomic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_lockers_one_winner_without_atomic() {
    lockers_one_winner(PushMode::NoAtomic).await;
}

async fn lockers_one_winner(mode: PushMode) {
    init_tracing();
    let server = GitServer::start_in(mode).await;
    let url = server.create_repo("race");
    let mut backends = Vec::new();
    for _ in 0..32 {
        backends.push(TestBackend::start(&url, &[]).await);
    }
    let tasks: Vec<_> = backends
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let client = Client::new(&b.url);
            tokio::spawn(async move {
                (
                    format!("racer-{i}"),
                    client.lock("shared.tfstate", &format!("racer-{i}")).await,
                )
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("task"));
    }
    let winners: Vec<&String> = answers
        .iter()
        .filter(|(_, a)| a.status == 200)
        .map(|(id, _)| id)
        .collect();
    assert_eq!(winners.len(), 1, "exactly one winner: {answers:?}");
    let winner_id = format!(r#""ID":"{}""#, winners[0]);
    for (id, answer) in &answers {
        if id != winners[0] {
            assert_eq!(answer.status, 423, "{id}: {answer:?}");
            assert!(
                answer.body.contains(&winner_id),
                "{id} must see the winner: {}",
                answer.body
            );
        }
    }
    let refs = git(&["ls-remote", &server.url_with_credentials("race")], None);
    assert_eq!(
        refs.lines()
            .filter(|l| l.contains("refs/heads/locks/"))
            .count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_writers_lose_no_update() {
    writers_lose_no_update(PushMode::Atomic, 10).await;
}

/// Fewer rounds than the atomic variant, to keep CI time: the same races occur from the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_writers_lose_no_update_without_atomic() {
    writers_lose_no_update(PushMode::NoAtomic, 5).await;
}

async fn writers_lose_no_update(mode: PushMode, serials: u64) {
    init_tracing();
    let server = GitServer::start_in(mode).await;
    let url = server.create_repo("writers");
    let mut tasks = Vec::new();
    for w in 0..8 {
        let backend = TestBackend::start(&url, &[]).await;
        tasks.push(tokio::spawn(async move {
            let client = Client::new(&backend.url);
            let name = format!("team-{w}/app.tfstate");
            for serial in 1..=serials {
                let id = format!("w{w}-s{serial}");
                client.lock(&name, &id).await.expect(200);
                let write = client
                    .send(
                        "POST",
                        &format!("/states/{name}?ID={id}"),
                        Some(&state_json(&format!("lineage-{w}"), serial)),
                    )
                    .await;
                assert_eq!(write.status, 200, "{name} serial {serial}: {}", write.body);
                client.unlock(&name, &id).await.expect(200);
            }
            drop(backend);
        }));
    }
    for task in tasks {
        task.await.expect("writer");
    }
    let bare = server.repo_dir("writers");
    let bare = bare.to_str().expect("utf-8");
    let count = git(&["--git-dir", bare, "rev-list", "--count", "main"], None);
    assert_eq!(
        count.trim(),
        (8 * serials).to_string(),
        "every commit on main"
    );
    let merges = git(
        &["--git-dir", bare, "rev-list", "--merges", "--count", "main"],
        None,
    );
    assert_eq!(merges.trim(), "0", "history is linear");
    for w in 0..8 {
        let state = git(
            &[
                "--git-dir",
                bare,
                "show",
                &format!("main:team-{w}/app.tfstate"),
            ],
            None,
        );
        assert_eq!(state, state_json(&format!("lineage-{w}"), serials));
    }
    git(&["--git-dir", bare, "fsck", "--strict"], None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_backend_serves_concurrent_writers_on_one_cache() {
    concurrent_writers_on_one_cache(PushMode::Atomic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_backend_serves_concurrent_writers_on_one_cache_without_atomic() {
    concurrent_writers_on_one_cache(PushMode::NoAtomic).await;
}

async fn concurrent_writers_on_one_cache(mode: PushMode) {
    init_tracing();
    let server = GitServer::start_in(mode).await;
    let url = server.create_repo("shared-cache");
    let backend = TestBackend::start(&url, &[]).await;
    let tasks: Vec<_> = (0..8)
        .map(|w| {
            let client = Client::new(&backend.url);
            tokio::spawn(async move {
                for serial in 1..=5u64 {
                    let write = client
                        .send(
                            "POST",
                            &format!("/states/s{w}.tfstate"),
                            Some(&state_json("one-cache", serial)),
                        )
                        .await;
                    assert_eq!(write.status, 200, "s{w} serial {serial}: {}", write.body);
                    let read = client
                        .send("GET", &format!("/states/s{w}.tfstate"), None)
                        .await;
                    assert_eq!(read.body, state_json("one-cache", serial));
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("writer");
    }
    let bare = server.repo_dir("shared-cache");
    let count = git(
        &[
            "--git-dir",
            bare.to_str().expect("utf-8"),
            "rev-list",
            "--count",
            "main",
        ],
        None,
    );
    assert_eq!(count.trim(), "40");
}

/// The embedded default: a local bare repository updated with ref transactions, many requests
/// at once on one process.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_repository_locks_and_writes_concurrently() {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = dir.path().join("repo.git");
    let vars = std::collections::HashMap::from([
        (
            "GITSTATE_LOCAL_REPOSITORY".to_owned(),
            repo.display().to_string(),
        ),
        (
            "GITSTATE_CACHE_DIR".to_owned(),
            dir.path().join("cache").display().to_string(),
        ),
        // The writers below write without a lock.
        (
            gitstate_tests::UNLOCKED_WRITES.to_owned(),
            "true".to_owned(),
        ),
        (
            "GITSTATE_ACCESS".to_owned(),
            gitstate_tests::access_file(&[(
                gitstate_tests::TEST_USER,
                gitstate_tests::TEST_PASSWORD,
                &["admin:*"],
            )]),
        ),
    ]);
    let settings =
        gitstate_app::Settings::from_lookup(gitstate_app::Runtime::Local, |k| vars.get(k).cloned())
            .expect("settings");
    let backend = TestBackend::serve(
        gitstate_tests::app(&settings).await,
        tempfile::tempdir().expect("tempdir"),
    )
    .await;

    let lockers: Vec<_> = (0..16)
        .map(|i| {
            let client = Client::new(&backend.url);
            tokio::spawn(async move { client.lock("local.tfstate", &format!("L{i}")).await.status })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in lockers {
        statuses.push(task.await.expect("locker"));
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 423).count(),
        15,
        "{statuses:?}"
    );

    let writers: Vec<_> = (0..4)
        .map(|w| {
            let client = Client::new(&backend.url);
            tokio::spawn(async move {
                for serial in 1..=5u64 {
                    client
                        .write(&format!("w{w}.tfstate"), &state_json("local", serial))
                        .await
                        .expect(200);
                }
            })
        })
        .collect();
    for task in writers {
        task.await.expect("writer");
    }
    let repo = repo.to_str().expect("utf-8");
    assert_eq!(
        git(&["--git-dir", repo, "rev-list", "--count", "main"], None).trim(),
        "20"
    );
    assert_eq!(
        git(&["--git-dir", repo, "show", "main:w3.tfstate"], None),
        state_json("local", 5)
    );
    assert!(
        git(&["--git-dir", repo, "for-each-ref"], None).contains("refs/heads/locks/local.tfstate")
    );
    git(&["--git-dir", repo, "fsck", "--strict"], None);
}
