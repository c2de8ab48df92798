//! Every Function URL payload in `events/`, replayed through `lambda_http`'s own request
//! deserialisation into the router, against a real git server.

use std::path::PathBuf;

use base64::Engine;
use gitstate_tests::{GitServer, access_file, app, git, init_tracing, settings_for};
use http_body_util::BodyExt;
use tower::ServiceExt;

fn events_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("events")
}

fn load(name: &str) -> (lambda_http::Request, serde_json::Value) {
    let text = std::fs::read_to_string(events_dir().join(name)).expect("event file");
    let request =
        lambda_http::request::from_str(&text).expect("a Function URL event lambda_http accepts");
    (request, serde_json::from_str(&text).expect("json"))
}

async fn replay(router: &axum::Router, name: &str) -> (u16, String) {
    let (request, _) = load(name);
    let response = router
        .clone()
        .oneshot(request)
        .await
        .expect("router answers");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_file_replays_through_lambda_http() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("lambda");
    let cache = tempfile::tempdir().expect("tempdir");
    // The users the event files authenticate as.
    let access = access_file(&[
        ("terraform", "example-password", &["admin:demo/"]),
        ("reader", "reader-example-password", &["read:demo/"]),
    ]);
    let router = app(&settings_for(
        &url,
        cache.path(),
        &[("GITSTATE_ACCESS", &access)],
    ))
    .await;

    let sequence = gitstate_tests::EVENT_SEQUENCE;
    let mut answers = Vec::new();
    for (name, want) in sequence {
        let (status, body) = replay(&router, name).await;
        assert_eq!(status, want, "{name}: {body}");
        answers.push((name, body));
    }
    let answers = answers.split_off(2);

    // The conflict names the holder from lock.json.
    let (_, lock_event) = load("lock.json");
    let holder: serde_json::Value =
        serde_json::from_str(lock_event["body"].as_str().expect("body")).expect("lock info");
    assert!(
        answers[1].1.contains(holder["ID"].as_str().expect("ID")),
        "{}",
        answers[1].1
    );

    // GET returns exactly what the base64-encoded write carried.
    let (_, write_event) = load("write-base64.json");
    assert_eq!(write_event["isBase64Encoded"], true);
    let sent = base64::engine::general_purpose::STANDARD
        .decode(write_event["body"].as_str().expect("body"))
        .expect("base64");
    assert_eq!(answers[4].1.as_bytes(), sent.as_slice());

    // Force-unlock left no lock behind; the state is on main.
    let refs = git(&["ls-remote", &server.url_with_credentials("lambda")], None);
    assert!(!refs.contains("locks/"), "{refs}");
    // (Its newest content: with the Lambda's `GITSTATE_STATE_REFS=always` an update is on the
    // state's own ref until a fold.)
    let bare = server.repo_dir("lambda");
    assert_eq!(
        gitstate_tests::states::newest_stored(&bare, "main", "demo/app.tfstate").as_deref(),
        Some(sent.as_slice())
    );

    // Every event file is part of the sequence.
    let mut files: Vec<String> = std::fs::read_dir(events_dir())
        .expect("events/")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    files.sort();
    let mut replayed: Vec<String> = sequence.iter().map(|(n, _)| (*n).to_owned()).collect();
    replayed.sort();
    replayed.dedup();
    assert_eq!(files, replayed, "every file in events/ is replayed");
}
