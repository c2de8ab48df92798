//! The router over the in-memory store: every route and method, in milliseconds.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use base64::Engine as _;
use gitstate_core::auth::{Access, AccessOptions, AccessSource};
use gitstate_core::password::PasswordVerifier;
use gitstate_core::ports::Location;
use gitstate_core::service::{Backend, Identity, Repositories};
use gitstate_core::testing::MemoryStore;
use gitstate_core::{BranchName, StateName};
use http::{HeaderMap, Method, StatusCode, header};
use http_body_util::BodyExt as _;
use rand::{Rng as _, SeedableRng as _};
use tower::ServiceExt as _;

use super::*;

pub(crate) const PRIMARY: &str = "https://git.example/org/state.git";
const STATE: &str = "team/app.tfstate";

/// Users, their grants and passwords; the password is `<user>-pw`.
const USERS: [(&str, &str); 3] = [
    ("ann", "admin:*"),
    ("wes", "write:team/"),
    ("rita", "read:*"),
];

/// One real argon2id hash per user, computed once for the whole test binary.
fn hashes() -> &'static Vec<(String, String)> {
    static HASHES: OnceLock<Vec<(String, String)>> = OnceLock::new();
    HASHES.get_or_init(|| {
        USERS
            .iter()
            .map(|(user, _)| {
                let phc = gitstate_core::password::hash_secret(format!("{user}-pw").as_bytes())
                    .expect("hash");
                ((*user).to_owned(), phc)
            })
            .collect()
    })
}

/// Verifies the passwords of [`hashes`] without running argon2 again in every test.
struct Known;

impl PasswordVerifier for Known {
    fn verify(&self, phc: &str, secret: &[u8]) -> bool {
        hashes()
            .iter()
            .any(|(user, hash)| hash == phc && secret == format!("{user}-pw").as_bytes())
    }
}

pub(crate) fn location() -> Location {
    Location {
        repository: PRIMARY.into(),
        branch: BranchName::parse("main").expect("valid"),
    }
}

pub(crate) fn access() -> Arc<Access> {
    let mut text = String::new();
    for ((user, grant), (_, hash)) in USERS.iter().zip(hashes()) {
        text.push_str(&format!(
            "[users.{user}]\nhash = \"{hash}\"\ngrants = [\"{grant}\"]\n"
        ));
    }
    let access = Access::new(
        Arc::new(MemoryStore::default()),
        location(),
        AccessOptions {
            source: AccessSource::Text(text),
            bootstrap: None,
            refresh: Duration::from_secs(10),
            hash_memory_kib: gitstate_core::password::MAX_MEMORY_KIB,
        },
        Arc::new(Known),
    )
    .expect("valid policy");
    Arc::new(access)
}

const LIMITS: Limits = Limits {
    max_body_bytes: 64 * 1024,
    max_response_bytes: None,
    request_deadline: Duration::from_secs(10),
};

/// A backend that lets writes without a lock through: these tests write states to read, route
/// and refuse them; the lock rule's answer is `writes_without_a_lock_are_428_naming_lock_address`.
fn backend() -> Arc<Backend> {
    Arc::new(strict_backend().with_unlocked_writes(true))
}

/// A backend as deployed by default: writes must hold the lock.
fn strict_backend() -> Backend {
    let repositories = Repositories {
        primary: PRIMARY.into(),
        default_branch: BranchName::parse("main").expect("valid"),
        allowed: vec![],
    };
    let committer = Identity {
        name: "gitstate".into(),
        email: "gitstate@localhost".into(),
    };
    Backend::new(Arc::new(MemoryStore::default()), repositories, committer)
}

fn app_with(limits: Limits) -> axum::Router {
    router(backend(), access(), limits)
}

pub(crate) fn app() -> axum::Router {
    app_with(LIMITS)
}

pub(crate) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

fn basic(user: &str) -> String {
    let raw = format!("{user}:{user}-pw");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    )
}

/// One request through the router; `user: None` sends no credentials.
pub(crate) async fn send(
    router: &axum::Router,
    request: http::request::Builder,
    user: Option<&str>,
    body: impl Into<Body>,
) -> Answer {
    let request = match user {
        Some(user) => request.header(header::AUTHORIZATION, basic(user)),
        None => request,
    };
    let response = router
        .clone()
        .oneshot(request.body(body.into()).expect("request"))
        .await
        .expect("infallible");
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.expect("body").to_bytes(),
    }
}

pub(crate) async fn call(
    router: &axum::Router,
    method: &str,
    uri: &str,
    user: &str,
    body: impl Into<Body>,
) -> Answer {
    let request = http::Request::builder()
        .method(Method::from_bytes(method.as_bytes()).expect("method"))
        .uri(uri);
    send(router, request, Some(user), body).await
}

fn lock_info(id: &str) -> String {
    serde_json::json!({"ID": id, "Operation": "OperationTypeApply", "Who": "ann@host"}).to_string()
}

fn state_json(serial: u64) -> String {
    serde_json::json!({"version": 4, "serial": serial, "lineage": "l-1", "resources": []})
        .to_string()
}

#[tokio::test]
async fn health_needs_no_credentials_and_only_reads() {
    let router = app();
    let get = http::Request::builder().uri("/health");
    let answer = send(&router, get, None, Body::empty()).await;
    assert_eq!(
        (answer.status, answer.text().as_str()),
        (StatusCode::OK, "ok\n")
    );
    let head = http::Request::builder().method("HEAD").uri("/health");
    assert_eq!(
        send(&router, head, None, Body::empty()).await.status,
        StatusCode::OK
    );
    for method in ["POST", "PUT", "DELETE", "LOCK"] {
        let request = http::Request::builder().method(method).uri("/health");
        let answer = send(&router, request, None, Body::empty()).await;
        assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED, "{method}");
        assert_eq!(answer.header("allow"), Some("GET"));
    }
    let doubled = http::Request::builder().uri("/health?a=1&a=2");
    assert_eq!(
        send(&router, doubled, None, Body::empty()).await.status,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn every_other_route_needs_credentials() {
    let router = app();
    for (method, uri) in [
        ("GET", "/states/team/app.tfstate"),
        ("POST", "/states/team/app.tfstate"),
        ("LOCK", "/locks/team/app.tfstate"),
        ("GET", "/history/team/app.tfstate"),
        ("GET", "/states"),
        ("GET", "/locks"),
        ("GET", "/ui/"),
        ("GET", "/nowhere"),
    ] {
        let request = http::Request::builder().method(method).uri(uri);
        let answer = send(&router, request, None, Body::empty()).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{method} {uri}");
        assert!(
            answer
                .header("www-authenticate")
                .is_some_and(|v| v.starts_with("Basic"))
        );
    }
    // A wrong password and an unknown user are the same 401 (repeated, they are throttled).
    for credentials in ["YW5uOm5vcGU=", "bm9ib2R5OnB3"] {
        let wrong = http::Request::builder()
            .uri("/states")
            .header(header::AUTHORIZATION, format!("Basic {credentials}"));
        let answer = send(&router, wrong, None, Body::empty()).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{credentials}");
    }
}

/// The whole life of a state through `/states/`: lock, write with the ID, read, list, unlock,
/// delete.
#[tokio::test]
async fn a_state_is_locked_written_read_listed_unlocked_and_deleted() {
    let router = app();
    let uri = format!("/states/{STATE}");
    assert_eq!(
        call(&router, "GET", &uri, "ann", "").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(&router, "LOCK", &uri, "wes", lock_info("L1"))
            .await
            .status,
        StatusCode::OK
    );
    let written = call(
        &router,
        "POST",
        &format!("{uri}?ID=L1"),
        "wes",
        state_json(1),
    )
    .await;
    assert_eq!(written.status, StatusCode::OK, "{}", written.text());
    let read = call(&router, "GET", &uri, "rita", "").await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.header("content-type"), Some("application/json"));
    assert_eq!(read.json()["serial"], 1);
    // Another holder's ID is refused with the holder's LockInfo, as Terraform expects.
    let clash = call(&router, "LOCK", &uri, "ann", lock_info("L2")).await;
    assert_eq!(clash.status, StatusCode::LOCKED);
    assert_eq!(clash.json()["ID"], "L1");
    let listed = call(&router, "GET", "/states", "rita", "").await.json();
    assert_eq!(listed[0]["state"], STATE);
    assert_eq!(listed[0]["serial"], 1);
    assert_eq!(listed[0]["lineage"], "l-1");
    assert_eq!(listed[0]["author"], "wes");
    assert_eq!(listed[0]["lock"]["id"], "L1");
    assert_eq!(listed[0]["lock"]["user"], "wes");
    let locks = call(&router, "GET", "/locks", "rita", "").await.json();
    assert_eq!(locks[0]["state"], STATE);
    assert_eq!(locks[0]["who"], "ann@host");
    assert!(locks[0]["age_seconds"].as_i64().is_some_and(|age| age >= 0));
    assert_eq!(
        call(&router, "UNLOCK", &uri, "wes", lock_info("L1"))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        call(&router, "DELETE", &uri, "wes", "").await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(&router, "DELETE", &uri, "ann", "").await.status,
        StatusCode::OK
    );
    assert_eq!(
        call(&router, "GET", &uri, "ann", "").await.status,
        StatusCode::NOT_FOUND
    );
    // PUT writes like POST.
    assert_eq!(
        call(&router, "PUT", &uri, "wes", state_json(2))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        call(&router, "GET", &uri, "wes", "").await.json()["serial"],
        2
    );
}

/// `/locks/<name>`: POST and LOCK take, GET shows with the holder's headers, DELETE and UNLOCK
/// release.
#[tokio::test]
async fn the_lock_route_takes_shows_and_releases() {
    let router = app();
    let uri = format!("/locks/{STATE}");
    assert_eq!(
        call(&router, "GET", &uri, "rita", "").await.status,
        StatusCode::CONFLICT
    );
    for (take, release) in [("POST", "DELETE"), ("LOCK", "UNLOCK"), ("POST", "UNLOCK")] {
        let taken = call(&router, take, &uri, "wes", lock_info("L9")).await;
        assert_eq!(taken.status, StatusCode::OK, "{take}: {}", taken.text());
        let shown = call(&router, "GET", &uri, "rita", "").await;
        assert_eq!(shown.status, StatusCode::OK);
        assert_eq!(shown.json()["ID"], "L9");
        assert_eq!(shown.header(LOCK_USER_HEADER), Some("wes"));
        assert!(shown.header(LOCK_CREATED_HEADER).is_some());
        assert!(
            shown
                .header(LOCK_AGE_HEADER)
                .is_some_and(|a| a.parse::<i64>().is_ok())
        );
        // Reading is not writing: a reader can neither take nor release.
        let refused = call(&router, release, &uri, "rita", lock_info("L9")).await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{release}");
        let wrong = call(&router, release, &uri, "wes", lock_info("other")).await;
        assert_eq!(wrong.status, StatusCode::CONFLICT, "{release}");
        assert_eq!(wrong.json()["ID"], "L9");
        let released = call(&router, release, &uri, "wes", lock_info("L9")).await;
        assert_eq!(released.status, StatusCode::OK, "{release}");
        assert_eq!(
            call(&router, "GET", &uri, "rita", "").await.status,
            StatusCode::CONFLICT
        );
    }
    let bad = call(&router, "POST", &uri, "wes", "{\"no\": \"id\"}").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

/// `/history/<name>`: pages newest first, one version by serial or commit, restore on top.
#[tokio::test]
async fn history_pages_versions_and_restores() {
    let router = app();
    let state = format!("/states/{STATE}");
    for serial in 1..=5 {
        let written = call(&router, "POST", &state, "wes", state_json(serial)).await;
        assert_eq!(written.status, StatusCode::OK);
    }
    let history = format!("/history/{STATE}");
    let first = call(&router, "GET", &format!("{history}?per_page=2"), "rita", "").await;
    let page = first.json();
    assert_eq!(page["state"], STATE);
    assert_eq!(page["page"], 0);
    assert_eq!(page["next_page"], 1);
    let versions = page["versions"].as_array().expect("versions");
    assert_eq!(versions.len(), 2);
    assert_eq!(versions[0]["serial"], 5);
    let last = call(
        &router,
        "GET",
        &format!("{history}?page=2&per_page=2"),
        "rita",
        "",
    )
    .await;
    assert_eq!(last.json()["next_page"], serde_json::Value::Null);
    let commit = versions[1]["version"].as_str().expect("version").to_owned();
    let by_commit = call(
        &router,
        "GET",
        &format!("{history}?at={commit}"),
        "rita",
        "",
    )
    .await;
    assert_eq!(by_commit.json()["serial"], 4);
    assert_eq!(by_commit.header("gitstate-version"), Some(commit.as_str()));
    let by_serial = call(&router, "GET", &format!("{history}?at=2"), "rita", "").await;
    assert_eq!(by_serial.json()["serial"], 2);
    for (query, status) in [
        ("?at=99", StatusCode::BAD_REQUEST),
        ("?at=nope", StatusCode::BAD_REQUEST),
        ("?page=x", StatusCode::BAD_REQUEST),
        ("?per_page=-1", StatusCode::BAD_REQUEST),
    ] {
        let answer = call(&router, "GET", &format!("{history}{query}"), "rita", "").await;
        assert_eq!(answer.status, status, "{query}: {}", answer.text());
    }
    let unnamed = call(&router, "POST", &history, "ann", "").await;
    assert_eq!(unnamed.status, StatusCode::BAD_REQUEST);
    let by_writer = call(&router, "POST", &format!("{history}?restore=2"), "wes", "").await;
    assert_eq!(by_writer.status, StatusCode::FORBIDDEN);
    let restored = call(&router, "POST", &format!("{history}?restore=2"), "ann", "").await;
    assert_eq!(restored.status, StatusCode::OK, "{}", restored.text());
    assert!(restored.json().is_object());
    let now = call(&router, "GET", &state, "rita", "").await.json();
    assert_eq!(
        (now["serial"].as_u64(), now["lineage"].as_str()),
        (Some(6), Some("l-1"))
    );
}

/// The seed tool's address format reaches the same state as `/states/`.
#[tokio::test]
async fn the_seed_address_format_is_the_state_route() {
    let router = app();
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("type", "git")
        .append_pair("repository", PRIMARY)
        .append_pair("state", STATE)
        .finish();
    let seed = format!("/?{query}");
    assert_eq!(
        call(&router, "POST", &seed, "wes", state_json(3))
            .await
            .status,
        StatusCode::OK
    );
    let read = call(&router, "GET", &format!("/states/{STATE}"), "rita", "").await;
    assert_eq!(read.json()["serial"], 3);
    assert_eq!(
        call(&router, "GET", &seed, "rita", "").await.json()["serial"],
        3
    );
    let other = seed.replace("type=git", "type=svn");
    assert_eq!(
        call(&router, "GET", &other, "rita", "").await.status,
        StatusCode::BAD_REQUEST
    );
    let elsewhere = format!("/?type=git&repository=https%3A%2F%2Fevil.example%2Fr&state={STATE}");
    let answer = call(&router, "GET", &elsewhere, "rita", "").await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    // git's SSH spellings: a user name is no credential (403: not served here), a password is
    // (400), and an unescaped `+`, read as a space, is a 400 saying how to write it.
    for scheme in ["ssh", "git%2Bssh", "ssh%2Bgit"] {
        let user = format!("/?type=git&repository={scheme}://git@h.example/r&state={STATE}");
        let answer = call(&router, "GET", &user, "rita", "").await;
        assert_eq!(
            answer.status,
            StatusCode::FORBIDDEN,
            "{scheme}: {}",
            answer.text()
        );
        let password = user.replace("git@", "git:pw-7@");
        let answer = call(&router, "GET", &password, "rita", "").await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{scheme}");
        assert!(answer.text().contains("password"), "{}", answer.text());
        assert!(!answer.text().contains("pw-7"), "{}", answer.text());
    }
    for raw in [
        "git+ssh://git@h.example/r",
        "ssh+git://h.example/r",
        "x%20y",
    ] {
        let address = format!("/?type=git&repository={raw}&state={STATE}");
        let answer = call(&router, "GET", &address, "rita", "").await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{raw}");
        assert!(answer.text().contains("git%2Bssh://"), "{}", answer.text());
    }
    assert_eq!(
        call(&router, "GET", "/", "rita", "").await.status,
        StatusCode::BAD_REQUEST
    );
}

/// Every route answers 405 with its `Allow` list to every method it does not take, standard
/// or made up, before changing anything.
#[tokio::test]
async fn methods_a_route_does_not_take_are_405_with_allow() {
    let router = app();
    let routes: [(&str, &[&str], &str); 6] = [
        (
            "/states/team/app.tfstate",
            &["GET", "POST", "PUT", "DELETE", "LOCK", "UNLOCK"],
            "GET, POST, PUT, DELETE, LOCK, UNLOCK",
        ),
        (
            "/locks/team/app.tfstate",
            &["GET", "POST", "DELETE", "LOCK", "UNLOCK"],
            "GET, POST, DELETE, LOCK, UNLOCK",
        ),
        ("/history/team/app.tfstate", &["GET", "POST"], "GET, POST"),
        ("/states", &["GET", "HEAD"], "GET"),
        ("/locks", &["GET"], "GET"),
        ("/ui/", &["GET", "HEAD"], "GET"),
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let mut methods: Vec<String> = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "LOCK", "UNLOCK", "PATCH", "OPTIONS", "TRACE",
    ]
    .map(str::to_owned)
    .to_vec();
    methods.extend((0..20).map(|_| {
        let len = rng.random_range(3..9);
        (0..len)
            .map(|_| rng.random_range(b'A'..=b'Z') as char)
            .collect()
    }));
    for (uri, takes, allow) in routes {
        for method in methods.iter().filter(|m| !takes.contains(&m.as_str())) {
            let answer = call(&router, method, uri, "ann", "").await;
            assert_eq!(
                answer.status,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {uri}"
            );
            assert_eq!(answer.header("allow"), Some(allow), "{method} {uri}");
            // axum sends no body to HEAD.
            if method != "HEAD" {
                assert!(answer.text().contains(method.as_str()), "{}", answer.text());
            }
        }
    }
    let listed = call(&router, "GET", "/states", "ann", "").await;
    assert_eq!(listed.json(), serde_json::json!([]), "nothing was written");
}

/// Generated addresses of every route, with random characters of the path (route words
/// included) percent-encoded: each answers exactly as its plain spelling does (status, headers,
/// body), since the path is decoded once before the table routes it; the answers carry
/// `Content-Length`, and an empty name is refused as a name, not as an unknown route.
#[tokio::test]
async fn encoded_addresses_answer_as_their_plain_spelling() {
    let router = app();
    call(
        &router,
        "POST",
        &format!("/states/{STATE}"),
        "ann",
        state_json(1),
    )
    .await;
    let plain = [
        format!("/states/{STATE}"),
        format!("/locks/{STATE}"),
        format!("/history/{STATE}"),
        format!("/history/{STATE}?at=1"),
        "/states".to_owned(),
        "/locks?ref=main".to_owned(),
        "/states/x?a=1&a=2".to_owned(),
        "/states/.git/x".to_owned(),
        "/nowhere/x".to_owned(),
        format!("/ui/states/{STATE}"),
        "/ui/".to_owned(),
        "/ui/nothing".to_owned(),
        "/health".to_owned(),
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(26);
    let mut sent = 0;
    for _ in 0..300 {
        let address = &plain[rng.random_range(0..plain.len())];
        let (path, query) = address.split_once('?').unwrap_or((address, ""));
        let mut encoded = String::new();
        for (i, c) in path.char_indices() {
            // The leading `/` stays: a path begins with it.
            if i > 0 && rng.random_bool(0.3) {
                encoded.push_str(&format!("%{:02X}", c as u32));
            } else {
                encoded.push(c);
            }
        }
        if !query.is_empty() {
            encoded = format!("{encoded}?{query}");
        }
        let method = ["GET", "LOCK", "PATCH"][rng.random_range(0..3)];
        let user = ["ann", "rita"][rng.random_range(0..2)];
        let html = rng.random_bool(0.3);
        let request = |uri: &str| {
            let request = http::Request::builder()
                .method(Method::from_bytes(method.as_bytes()).expect("method"))
                .uri(uri);
            if html {
                request.header(header::ACCEPT, "text/html")
            } else {
                request
            }
        };
        let want = send(&router, request(address), Some(user), "").await;
        let got = send(&router, request(&encoded), Some(user), "").await;
        let what = format!("{method} {encoded} as {user}");
        assert_eq!(got.status, want.status, "{what}: {}", got.text());
        assert_eq!(got.text(), want.text(), "{what}");
        for (name, value) in &want.headers {
            if name != "gitstate-lock-age" {
                assert_eq!(got.headers.get(name), Some(value), "{what}: {name}");
            }
        }
        assert!(got.header("content-length").is_some(), "{what}");
        sent += 1;
    }
    assert_eq!(sent, 300);
    for prefix in [
        "/states/",
        "/locks/",
        "/history/",
        "/ui/states/",
        "/ui/unlock/",
    ] {
        let answer = call(&router, "GET", prefix, "ann", "").await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{prefix}");
        assert!(
            answer.text().contains("name is empty"),
            "{prefix}: {}",
            answer.text()
        );
    }
}

/// Every request's target is parsed once, whatever it addresses and however it ends: served,
/// refused for its name or query after authentication, unauthenticated, or past no route.
#[tokio::test(flavor = "current_thread")]
async fn the_target_is_parsed_once_per_request() {
    let router = app();
    let parses = || crate::request::PARSES.with(std::cell::Cell::get);
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let paths = [
        format!("/states/{STATE}"),
        format!("/locks/{STATE}"),
        format!("/history/{STATE}?page=x"),
        "/states/..".to_owned(),
        "/states/a%zz".to_owned(),
        "/states".to_owned(),
        "/locks?x=1".to_owned(),
        "/health".to_owned(),
        "/?type=git".to_owned(),
        "/nowhere".to_owned(),
        "/ui/".to_owned(),
        format!("/ui/states/{STATE}"),
        "/ui/unlock/x".to_owned(),
    ];
    for _ in 0..200 {
        let path = &paths[rng.random_range(0..paths.len())];
        let method = ["GET", "POST", "LOCK", "DELETE"][rng.random_range(0..4)];
        let user = [None, Some("ann"), Some("rita")][rng.random_range(0..3)];
        let request = http::Request::builder()
            .method(Method::from_bytes(method.as_bytes()).expect("method"))
            .uri(path.as_str());
        let before = parses();
        let answer = send(&router, request, user, lock_info("L1")).await;
        assert_eq!(
            parses() - before,
            1,
            "{method} {path} as {user:?}: {} {}",
            answer.status,
            answer.text()
        );
    }
}

#[tokio::test]
async fn unknown_paths_and_bad_names_are_refused() {
    let router = app();
    for (uri, status) in [
        ("/nowhere", StatusCode::BAD_REQUEST),
        ("/state/x", StatusCode::BAD_REQUEST),
        ("/states/", StatusCode::BAD_REQUEST),
        ("/locks/", StatusCode::BAD_REQUEST),
        ("/states/../x", StatusCode::BAD_REQUEST),
        ("/states/a//b", StatusCode::BAD_REQUEST),
        ("/states/%2e%2e/x", StatusCode::BAD_REQUEST),
        ("/states/a%zz", StatusCode::BAD_REQUEST),
        ("/states/a%", StatusCode::BAD_REQUEST),
        ("/states/a%ff", StatusCode::BAD_REQUEST),
        ("/history/.hidden", StatusCode::BAD_REQUEST),
        ("/states/x?ref=..", StatusCode::BAD_REQUEST),
        ("/states/x?ref=other", StatusCode::FORBIDDEN),
        ("/states/x?a=1&a=2", StatusCode::BAD_REQUEST),
    ] {
        let answer = call(&router, "GET", uri, "ann", "").await;
        assert_eq!(answer.status, status, "{uri}: {}", answer.text());
        assert_eq!(answer.text().lines().count(), 1, "{uri}: one line");
    }
    let long = format!("/states/x?q={}", "a".repeat(MAX_QUERY_BYTES));
    assert_eq!(
        call(&router, "GET", &long, "ann", "").await.status,
        StatusCode::URI_TOO_LONG
    );
    // Percent-escapes decode to the name they spell.
    assert_eq!(
        call(
            &router,
            "POST",
            "/states/team%2Fapp.tfstate",
            "wes",
            state_json(1)
        )
        .await
        .status,
        StatusCode::OK
    );
    let read = call(&router, "GET", &format!("/states/{STATE}"), "wes", "").await;
    assert_eq!(read.json()["serial"], 1);
}

/// Writes are checked before anything changes: size, media type, Content-MD5, JSON.
#[tokio::test]
async fn bodies_are_checked_before_anything_changes() {
    let router = app_with(Limits {
        max_body_bytes: 100,
        ..LIMITS
    });
    let uri = format!("/states/{STATE}");
    let post = |headers: &[(&str, &str)]| {
        let mut request = http::Request::builder().method("POST").uri(&uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request
    };
    let body = state_json(1);
    let digest = {
        use md5::Digest as _;
        base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(body.as_bytes()))
    };
    let other = base64::engine::general_purpose::STANDARD.encode([0u8; 16]);
    type Case<'a> = (&'a [(&'a str, &'a str)], String, StatusCode);
    let cases: [Case<'_>; 7] = [
        (&[], "x".repeat(101), StatusCode::PAYLOAD_TOO_LARGE),
        (
            &[("content-length", "101")],
            "x".repeat(101),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
        (
            &[("content-type", "text/plain")],
            body.clone(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            &[("content-md5", &other)],
            body.clone(),
            StatusCode::BAD_REQUEST,
        ),
        (
            &[("content-md5", "bm9wZQ==")],
            body.clone(),
            StatusCode::BAD_REQUEST,
        ),
        (&[], "{not json".into(), StatusCode::BAD_REQUEST),
        (&[], "[1, 2]".into(), StatusCode::BAD_REQUEST),
    ];
    for (headers, sent, status) in cases {
        let answer = send(&router, post(headers), Some("wes"), sent).await;
        assert_eq!(answer.status, status, "{headers:?}: {}", answer.text());
        let read = call(&router, "GET", &uri, "wes", "").await;
        assert_eq!(
            read.status,
            StatusCode::NOT_FOUND,
            "{headers:?} changed nothing"
        );
    }
    let typed = [
        ("content-type", "application/json; charset=utf-8"),
        ("content-md5", digest.as_str()),
    ];
    let answer = send(&router, post(&typed), Some("wes"), body).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
}

/// A caller without the write grant on a state is refused before the body of a request that
/// would change it is read: a body declared over the limit (which would be 413 once read) and
/// one whose stream fails (400 once read) are both 403, for every method that carries a body,
/// on the state's, the lock's, the seed address's and the history's routes; a writer on
/// another prefix likewise. The same requests from a writer of the state reach the body.
#[tokio::test]
async fn callers_who_may_not_write_are_refused_before_the_body_is_read() {
    let router = app_with(Limits {
        max_body_bytes: 100,
        ..LIMITS
    });
    let seed = format!("/?type=git&repository={PRIMARY}&state={STATE}");
    let addresses = [
        (
            format!("/states/{STATE}"),
            &["POST", "PUT", "DELETE", "LOCK", "UNLOCK"][..],
        ),
        (
            format!("/locks/{STATE}"),
            &["POST", "DELETE", "LOCK", "UNLOCK"][..],
        ),
        (seed, &["POST", "LOCK", "UNLOCK"][..]),
        (format!("/history/{STATE}?restore=1"), &["POST"][..]),
    ];
    let failing = || {
        let (sender, body) = http_body_util::channel::Channel::<Bytes, std::io::Error>::new(1);
        sender.abort(std::io::Error::other("the client went away"));
        Body::new(body)
    };
    let mut cases = 0;
    for (uri, methods) in &addresses {
        for method in *methods {
            let request = || {
                http::Request::builder()
                    .method(Method::from_bytes(method.as_bytes()).expect("method"))
                    .uri(uri)
            };
            let oversized = || request().header(header::CONTENT_LENGTH, "1000");
            for user in ["rita", "wes"] {
                let (expected, also) = match user {
                    // rita may only read; wes may write under team/, which STATE is.
                    "rita" => (StatusCode::FORBIDDEN, StatusCode::FORBIDDEN),
                    _ => (StatusCode::PAYLOAD_TOO_LARGE, StatusCode::BAD_REQUEST),
                };
                let answer = send(&router, oversized(), Some(user), "x".repeat(1000)).await;
                assert_eq!(
                    answer.status,
                    expected,
                    "{user} {method} {uri}: {}",
                    answer.text()
                );
                let answer = send(&router, request(), Some(user), failing()).await;
                assert_eq!(
                    answer.status,
                    also,
                    "{user} {method} {uri}: {}",
                    answer.text()
                );
                cases += 1;
            }
        }
        // A writer of another prefix, on this state.
        let other = "/states/other/app.tfstate";
        let answer = call(&router, "POST", other, "wes", "x".repeat(1000)).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.text());
    }
    assert_eq!(cases, 26);
}

/// What is accepted can be read back: generated states around a buffered Function URL's limit,
/// rich in what JSON escapes, are either written and then read (state and revision) byte for
/// byte, or refused at the write with the 413 a read would give, saying how to read them.
#[tokio::test]
async fn a_write_is_accepted_only_if_its_read_back_fits() {
    let limit = 4096;
    let router = app_with(Limits {
        max_response_bytes: Some(limit),
        ..LIMITS
    });
    let uri = format!("/states/{STATE}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(2306);
    let (mut accepted, mut refused) = (0, 0);
    for serial in 1..=60u64 {
        let pad: String = (0..rng.random_range(0..2200))
            .map(|_| ['"', '\\', '\n', '\u{1}', 'a', '\t'][rng.random_range(0..6)])
            .collect();
        let state = serde_json::json!({"version": 4, "serial": serial, "lineage": "l", "pad": pad})
            .to_string();
        let wrote = call(&router, "POST", &uri, "wes", state.clone()).await;
        let fits = serde_json::to_string(&state).expect("json").len() + ENVELOPE_OVERHEAD <= limit;
        if wrote.status == StatusCode::OK {
            assert!(fits, "accepted what cannot be read back");
            accepted += 1;
            let read = call(&router, "GET", &uri, "wes", "").await;
            assert_eq!(read.status, StatusCode::OK, "{}", read.text());
            assert_eq!(read.text(), state);
            let at = call(
                &router,
                "GET",
                &format!("/history/{STATE}?at={serial}"),
                "wes",
                "",
            )
            .await;
            assert_eq!(at.status, StatusCode::OK, "{}", at.text());
        } else {
            assert!(!fits, "refused what fits: {}", wrote.text());
            assert_eq!(wrote.status, StatusCode::PAYLOAD_TOO_LARGE);
            assert!(wrote.text().contains("RESPONSE_STREAM"), "{}", wrote.text());
            refused += 1;
        }
    }
    assert!(
        accepted > 5 && refused > 5,
        "{accepted} accepted, {refused} refused"
    );
}

/// The envelope estimate is serde_json's own escaping, byte for byte, on generated strings rich
/// in what it escapes.
#[test]
fn the_envelope_estimate_is_serde_jsons_escaping() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(2307);
    for _ in 0..5000 {
        let text: String = (0..rng.random_range(0..64))
            .map(|_| match rng.random_range(0..4) {
                0 => char::from(rng.random_range(0u8..0x20)),
                1 => ['"', '\\', '/', '\u{7f}', '\u{2028}'][rng.random_range(0..5)],
                2 => rng.random::<char>(),
                _ => rng.random_range('a'..='z'),
            })
            .collect();
        let json = serde_json::to_string(&text).expect("serialises");
        assert_eq!(escaped_len(text.as_bytes()), json.len(), "{text:?}");
    }
}

/// A request meant for the lock never touches the state: a LockInfo written to the state's
/// address (`lock_method = "POST"` with `lock_address` = the state's address) and a DELETE of the
/// state with a body (`unlock_method = "DELETE"`) are 400 naming lock_address, and the state is
/// what it was.
#[tokio::test]
async fn lock_requests_sent_to_a_state_are_refused() {
    let router = app();
    let uri = format!("/states/{STATE}");
    let state = serde_json::json!({"version": 4, "serial": 1, "lineage": "l"}).to_string();
    assert_eq!(
        call(&router, "POST", &uri, "ann", state.clone())
            .await
            .status,
        StatusCode::OK
    );
    let info = r#"{"ID":"abc","Operation":"OperationTypePlan","Info":"","Who":"x@y","Version":"1.11.4","Created":"2026-01-01T00:00:00Z","Path":""}"#;
    for (method, body) in [
        ("POST", info),
        ("PUT", info),
        ("DELETE", info),
        ("DELETE", "{}"),
    ] {
        let answer = call(&router, method, &uri, "ann", body.to_owned()).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{method}: {}",
            answer.text()
        );
        assert!(answer.text().contains("lock_address"), "{}", answer.text());
    }
    assert_eq!(call(&router, "GET", &uri, "ann", "").await.text(), state);
}

/// By default a write (POST, PUT) or a DELETE that holds no lock is 428 with a one-line reason
/// naming lock_address and unlock_address, and changes nothing; with the lock it goes through.
#[tokio::test]
async fn writes_without_a_lock_are_428_naming_lock_address() {
    let router = router(Arc::new(strict_backend()), access(), LIMITS);
    let uri = format!("/states/{STATE}");
    let lock = format!("/locks/{STATE}");
    for method in ["POST", "PUT"] {
        let answer = call(&router, method, &uri, "ann", state_json(1)).await;
        assert_eq!(answer.status, StatusCode::PRECONDITION_REQUIRED, "{method}");
        let text = answer.text();
        assert!(
            text.contains("lock_address") && text.contains("unlock_address"),
            "{text}"
        );
        assert!(
            text.ends_with('\n') && text.lines().count() == 1,
            "{text:?}"
        );
    }
    assert_eq!(
        call(&router, "GET", &uri, "ann", "").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(&router, "LOCK", &lock, "ann", lock_info("L"))
            .await
            .status,
        StatusCode::OK
    );
    let written = call(
        &router,
        "POST",
        &format!("{uri}?ID=L"),
        "ann",
        state_json(1),
    )
    .await;
    assert_eq!(written.status, StatusCode::OK, "{}", written.text());
    assert_eq!(
        call(&router, "UNLOCK", &lock, "ann", lock_info("L"))
            .await
            .status,
        StatusCode::OK
    );
    let delete = call(&router, "DELETE", &uri, "ann", "").await;
    assert_eq!(delete.status, StatusCode::PRECONDITION_REQUIRED);
    assert_eq!(
        call(&router, "GET", &uri, "ann", "").await.json()["serial"],
        1
    );
}

/// A request still waiting at its deadline (here: for a body that never comes) is a 504 with
/// Retry-After, by the transport's [`Deadline`] or by [`Limits::request_deadline`], whichever
/// comes first; nothing is written.
#[tokio::test]
async fn a_request_past_its_deadline_is_504() {
    let slow = Limits {
        request_deadline: Duration::from_millis(300),
        ..LIMITS
    };
    let router = app_with(slow);
    let uri = format!("/states/{STATE}");
    for deadline in [Some(Duration::from_millis(20)), Some(Duration::ZERO), None] {
        let (_sender, body) = http_body_util::channel::Channel::<Bytes, std::io::Error>::new(1);
        let mut request = http::Request::builder().method("POST").uri(&uri);
        if let Some(after) = deadline {
            request = request.extension(Deadline(std::time::Instant::now() + after));
        }
        let started = std::time::Instant::now();
        let answer = send(&router, request, Some("wes"), Body::new(body)).await;
        let took = started.elapsed();
        assert_eq!(answer.status, StatusCode::GATEWAY_TIMEOUT, "{deadline:?}");
        assert_eq!(answer.header("retry-after"), Some("1"));
        assert!(
            answer.text().contains("retrying is safe"),
            "{}",
            answer.text()
        );
        let limit = deadline.unwrap_or(slow.request_deadline);
        assert!(
            took >= limit && took < limit + Duration::from_secs(2),
            "{took:?}"
        );
    }
    assert_eq!(
        call(&router, "GET", &uri, "wes", "").await.status,
        StatusCode::NOT_FOUND
    );
}

/// The console: redirect, pages with their security headers, the style sheet, and the
/// admin forms guarded by origin, token and confirmation.
#[tokio::test]
async fn the_console_serves_pages_and_guards_its_forms() {
    let router = app();
    let bare = call(&router, "GET", "/ui", "rita", "").await;
    assert_eq!(bare.status, StatusCode::PERMANENT_REDIRECT);
    assert_eq!(bare.header("location"), Some("/ui/"));
    let uri = format!("/states/{STATE}");
    assert_eq!(
        call(&router, "LOCK", &uri, "wes", lock_info("L1"))
            .await
            .status,
        StatusCode::OK
    );
    let write = format!("{uri}?ID=L1");
    assert_eq!(
        call(&router, "POST", &write, "wes", state_json(1))
            .await
            .status,
        StatusCode::OK
    );
    let list = call(&router, "GET", "/ui/?q=APP", "rita", "").await;
    assert_eq!(list.status, StatusCode::OK);
    assert!(
        list.header("content-security-policy")
            .is_some_and(|v| v.contains("default-src 'none'"))
    );
    assert_eq!(list.header("cache-control"), Some("no-store"));
    assert!(list.text().contains(STATE), "{}", list.text());
    let filtered = call(&router, "GET", "/ui/?q=nothing-matches", "rita", "").await;
    assert!(!filtered.text().contains(STATE));
    let css = call(&router, "GET", "/ui/style.css", "rita", "").await;
    assert_eq!(css.header("content-type"), Some("text/css; charset=utf-8"));
    let page = call(&router, "GET", &format!("/ui/states/{STATE}"), "ann", "").await;
    assert_eq!(page.status, StatusCode::OK);
    let html = page.text();
    assert!(html.contains("L1") && html.contains("wes"), "{html}");
    // A missing state's page: 404 to a browser, 400 to a client that is not (Terraform).
    let missing = call(&router, "GET", "/ui/states/none.tfstate", "ann", "").await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert!(
        missing.text().contains("/states/<name>"),
        "{}",
        missing.text()
    );
    let browser = http::Request::builder()
        .uri("/ui/states/none.tfstate")
        .header(header::ACCEPT, "text/html,application/xhtml+xml");
    let page = send(&router, browser, Some("ann"), Body::empty()).await;
    assert_eq!(page.status, StatusCode::NOT_FOUND);
    assert_eq!(
        call(&router, "GET", "/ui/elsewhere", "ann", "")
            .await
            .status,
        StatusCode::BAD_REQUEST
    );

    let token = console::form_token(
        &App {
            backend: backend(),
            access: access(),
            limits: LIMITS,
        },
        &gitstate_core::access::Caller::new("ann", vec![]),
    )
    .expect("ann has a hash");
    let unlock = format!("/ui/unlock/{STATE}");
    let form = |token: &str, confirm: &str| format!("token={token}&confirm={confirm}&lock=L1");
    let post = |origin: &str| {
        http::Request::builder()
            .method("POST")
            .uri(&unlock)
            .header("host", "console.example")
            .header(SCHEME_HEADER, "https")
            .header("origin", origin)
    };
    let same = "https://console.example";
    for (request, sent, user, status) in [
        (
            post("https://evil.example"),
            form(&token, "yes"),
            "ann",
            StatusCode::FORBIDDEN,
        ),
        (
            post("http://console.example"),
            form(&token, "yes"),
            "ann",
            StatusCode::FORBIDDEN,
        ),
        (
            post(same),
            form("forged", "yes"),
            "ann",
            StatusCode::FORBIDDEN,
        ),
        (
            post(same),
            form(&token, "no"),
            "ann",
            StatusCode::BAD_REQUEST,
        ),
        (
            post(same),
            form(&token, "yes"),
            "wes",
            StatusCode::FORBIDDEN,
        ),
    ] {
        let answer = send(&router, request, Some(user), sent.clone()).await;
        assert_eq!(answer.status, status, "{sent}: {}", answer.text());
        let held = call(&router, "GET", &format!("/locks/{STATE}"), "rita", "").await;
        assert_eq!(
            held.status,
            StatusCode::OK,
            "{sent}: the lock is still held"
        );
    }
    assert_eq!(
        call(&router, "GET", &unlock, "ann", "").await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
    let done = send(&router, post(same), Some("ann"), form(&token, "yes")).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.text());
    assert_eq!(
        done.header("location"),
        Some(format!("/ui/states/{STATE}?done=unlocked").as_str())
    );
    let held = call(&router, "GET", &format!("/locks/{STATE}"), "rita", "").await;
    assert_eq!(held.status, StatusCode::CONFLICT, "released");
}

/// The HCL block points Terraform at this router's routes and lock methods.
#[test]
fn the_backend_block_names_the_routes() {
    let mut out = Vec::new();
    write_backend_block(&mut out, "http://127.0.0.1:8080/", "team/app.tfstate").expect("write");
    let text = String::from_utf8(out).expect("utf-8");
    assert!(text.contains(r#"address        = "http://127.0.0.1:8080/states/team/app.tfstate""#));
    assert!(text.contains(r#"lock_address   = "http://127.0.0.1:8080/locks/team/app.tfstate""#));
    assert!(text.contains(r#"lock_method    = "POST""#));
    assert!(text.contains(r#"unlock_method  = "DELETE""#));
    let _ = StateName::parse("team/app.tfstate").expect("the example is a valid name");
}

/// Every answer under `/ui` (pages, redirects, and each kind of error: a refused name echoed
/// back, no or unknown credentials, no grant, cross-site, not found) and of the API carries the
/// security headers: they come from one layer around the whole router.
#[tokio::test]
async fn every_answer_carries_the_security_headers() {
    let router = app();
    let names = [
        STATE.to_owned(),
        "other/x.tfstate".to_owned(),
        "%2e%2e/%2e%2e/etc/passwd".to_owned(),
        "a/%3Cscript%3Ealert(1)%3C/script%3E".to_owned(),
        "x".repeat(300),
        "team/.git/config".to_owned(),
    ];
    let targets = |name: &str| {
        [
            format!("/ui/states/{name}"),
            format!("/ui/{name}"),
            format!("/states/{name}"),
            format!("/locks/{name}"),
        ]
    };
    let mut statuses = std::collections::BTreeSet::new();
    let mut answers = 0;
    for name in &names {
        for uri in targets(name)
            .iter()
            .map(String::as_str)
            .chain(["/ui", "/ui/"])
        {
            for user in [None, Some("nobody"), Some("rita"), Some("wes")] {
                for (method, origin) in [
                    ("GET", None),
                    ("POST", Some("http://evil.example")),
                    ("POST", None),
                ] {
                    let mut request = http::Request::builder()
                        .method(method)
                        .uri(uri)
                        .header(header::HOST, "127.0.0.1:8080");
                    if let Some(origin) = origin {
                        request = request.header(header::ORIGIN, origin);
                    }
                    let answer = send(&router, request, user, "").await;
                    let context = format!("{method} {uri} as {user:?} from {origin:?}");
                    assert!(
                        answer
                            .header("content-security-policy")
                            .is_some_and(|v| v.contains("frame-ancestors 'none'")),
                        "{context}: {:?}",
                        answer.headers
                    );
                    assert_eq!(answer.header("x-frame-options"), Some("DENY"), "{context}");
                    assert_eq!(
                        answer.header("x-content-type-options"),
                        Some("nosniff"),
                        "{context}"
                    );
                    assert!(answer.header("referrer-policy").is_some(), "{context}");
                    statuses.insert(answer.status.as_u16());
                    answers += 1;
                }
            }
        }
    }
    assert_eq!(answers, names.len() * 6 * 4 * 3);
    for status in [200, 308, 400, 401, 403, 404] {
        assert!(statuses.contains(&status), "no {status} among {statuses:?}");
    }
}
