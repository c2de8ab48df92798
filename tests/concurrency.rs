//! Many backends with separate caches (as separate Lambda containers) against one repository.

use gitstate_tests::{Client, GitServer, TestBackend, git, init_tracing, lock_info, state_json};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_lockers_one_winner() {
    init_tracing();
    let server = GitServer::start().await;
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
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("writers");
    let mut tasks = Vec::new();
    for w in 0..8 {
        let backend = TestBackend::start(&url, &[]).await;
        tasks.push(tokio::spawn(async move {
            let client = Client::new(&backend.url);
            let name = format!("team-{w}/app.tfstate");
            for serial in 1..=10u64 {
                let id = format!("w{w}-s{serial}");
                assert_eq!(client.lock(&name, &id).await.status, 200);
                let write = client
                    .send(
                        "POST",
                        &format!("/states/{name}?ID={id}"),
                        Some(&state_json(&format!("lineage-{w}"), serial)),
                    )
                    .await;
                assert_eq!(write.status, 200, "{name} serial {serial}: {}", write.body);
                assert_eq!(
                    client
                        .send("DELETE", &format!("/locks/{name}"), Some(&lock_info(&id)))
                        .await
                        .status,
                    200
                );
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
    assert_eq!(count.trim(), "80", "all 80 commits on main");
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
        assert_eq!(state, state_json(&format!("lineage-{w}"), 10));
    }
    git(&["--git-dir", bare, "fsck", "--strict"], None);
}
