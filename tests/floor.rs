//! Partial fetch and the protocol floor against the real `git http-backend`: exact git requests
//! and fetched bytes of cold and warm reads, update and no-op applies and UNLOCKs, with
//! `uploadpack.allowFilter` on and off, with and without atomic push; a push on a stale tip
//! falls back to the normal path and still wins or loses as it should.

use std::io::Write;

use gitstate_tests::{Client, GitServer, Seen, TestBackend, git, realistic_state};

/// States in the seeded repository, and the one the tests read and write.
const STATES: usize = 200;
const NAME: &str = "team/s0007.tfstate";

/// A repository `name` whose `main` holds `STATES` realistic states of 60 resources (about 48 KB
/// each) under `team/`, in one commit made with git fast-import (so its ids are the same every
/// run).
fn seeded(server: &GitServer, name: &str, filter: bool) -> String {
    let url = server.create_repo(name);
    server.allow_filter(name, filter);
    let mut stream = Vec::new();
    write!(
        stream,
        "commit refs/heads/main\ncommitter seed <seed@example.com> 1700000000 +0000\ndata 5\nseed\n"
    )
    .expect("write");
    for s in 0..STATES {
        let content = realistic_state(s as u64, 60, 1);
        write!(
            stream,
            "M 100644 inline team/s{s:04}.tfstate\ndata {}\n{content}\n",
            content.len()
        )
        .expect("write");
    }
    let mut child = std::process::Command::new("git")
        .args(["fast-import", "--quiet"])
        .current_dir(server.repo_dir(name))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("fast-import");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&stream)
        .expect("feed fast-import");
    assert!(child.wait().expect("fast-import runs").success());
    // As a host keeps them: packed.
    git(&["repack", "-adq"], Some(&server.repo_dir(name)));
    url
}

/// The labels of the requests since the last look, and the bytes their answers carried.
fn seen(server: &GitServer) -> (Vec<String>, u64) {
    let requests = server.take_requests();
    (
        requests.iter().map(Seen::label).collect(),
        requests.iter().map(|r| r.bytes).sum(),
    )
}

async fn get(client: &Client, name: &str) -> String {
    let answer = client.send("GET", &format!("/states/{name}"), None).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

/// A cold read fetches the tip's trees, then the one blob it reads; a warm read of another state
/// fetches just that blob. Without `filter` the whole tip comes at depth 1, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_and_warm_reads_fetch_only_the_blobs_they_read() {
    for filter in [true, false] {
        let server = GitServer::start().await;
        let url = seeded(&server, "states", filter);
        server.take_requests();
        let backend = TestBackend::start(&url, &[]).await;
        let client = Client::new(&backend.url);

        assert_eq!(get(&client, NAME).await, realistic_state(7, 60, 1));
        let (labels, bytes) = seen(&server);
        if filter {
            assert_eq!(
                labels,
                [
                    "GET refs/upload-pack",
                    "POST upload-pack",
                    "POST upload-pack"
                ]
            );
            assert_eq!(bytes, 9_963, "advertisement, trees, one blob");
        } else {
            assert_eq!(labels, ["GET refs/upload-pack", "POST upload-pack"]);
            // Every blob of the tip; git's threaded delta search makes the last bytes vary.
            assert!(
                (800_000..900_000).contains(&bytes),
                "a whole tip is {bytes} bytes"
            );
        }
        eprintln!("filter {filter}: cold read {labels:?} {bytes} bytes");

        // Warm: another state of the same tip.
        let other = "team/s0123.tfstate";
        assert_eq!(get(&client, other).await, realistic_state(123, 60, 1));
        let (labels, bytes) = seen(&server);
        if filter {
            assert_eq!(labels, ["GET refs/upload-pack", "POST upload-pack"]);
            assert_eq!(bytes, 4_889, "advertisement, one blob");
        } else {
            assert_eq!(labels, ["GET refs/upload-pack"]);
        }
        eprintln!("filter {filter}: warm read {labels:?} {bytes} bytes");
        // Read again: nothing but the advertisement.
        get(&client, other).await;
        assert_eq!(seen(&server).0, ["GET refs/upload-pack"]);
    }
}

/// A state list and a history page in a process that fetched trees only: they read the index
/// and walk trees, fetching what they need.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_and_history_work_on_a_partial_cache() {
    let server = GitServer::start().await;
    let url = seeded(&server, "states", true);
    let backend = TestBackend::start(&url, &[]).await;
    let client = Client::new(&backend.url);
    get(&client, NAME).await;
    let list = client.send("GET", "/states", None).await;
    assert_eq!(list.status, 200, "{}", list.body);
    assert!(list.body.contains("team/s0199.tfstate"), "{}", list.body);
    let history = client.send("GET", &format!("/history/{NAME}"), None).await;
    assert_eq!(history.status, 200, "{}", history.body);
    let at = client
        .send("GET", &format!("/history/{NAME}?at=1"), None)
        .await;
    assert_eq!(
        (at.status, at.body.as_str()),
        (200, realistic_state(7, 60, 1).as_str())
    );
}
