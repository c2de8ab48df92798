//! Git credentials stay with the configured repository's origin: an allowlisted repository on
//! another port gets no Authorization header, and redirects are followed only for the first ref
//! advertisement and only within the origin. A recording front (a small axum handler) sits before
//! the real `git http-backend` to see every header and to answer redirects.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use gitstate_tests::{
    Client, GIT_TOKEN, GIT_USER, GitServer, TestBackend, capture_logs, captured_logs, state_json,
};

/// One request the front saw: path and query, and the Authorization header if any.
#[derive(Debug, Clone)]
struct Seen {
    target: String,
    authorization: Option<String>,
}

/// When to answer a redirect instead of forwarding: `(method, path, query)` → `(status, Location)`.
type Rule = dyn Fn(&Method, &str, &str) -> Option<(u16, String)> + Send + Sync;

#[derive(Clone)]
struct FrontState {
    upstream: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    rule: Arc<Rule>,
    http: reqwest::Client,
}

/// A recording reverse proxy on its own loopback port (its own origin) before `upstream`.
struct Front {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl Front {
    async fn start(upstream: &str, rule: Arc<Rule>) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let state = FrontState {
            upstream: upstream.trim_end_matches('/').to_owned(),
            seen: seen.clone(),
            rule,
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("client"),
        };
        let app = axum::Router::new().fallback(forward).with_state(state);
        let (address, task) = gitstate_tests::serve_on_loopback(app).await;
        Self {
            url: format!("http://{address}"),
            seen,
            _task: task,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("log").clone()
    }
}

async fn forward(
    State(front): State<FrontState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let query = uri.query().unwrap_or_default();
    front.seen.lock().expect("log").push(Seen {
        target: uri.to_string(),
        authorization: headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    });
    if let Some((status, location)) = (front.rule)(&method, uri.path(), query) {
        return Response::builder()
            .status(status)
            .header("location", location)
            .body(Body::empty())
            .expect("redirect");
    }
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .expect("request body");
    let mut request = front
        .http
        .request(method, format!("{}{}", front.upstream, uri));
    for (name, value) in &headers {
        if name != "host" {
            request = request.header(name, value);
        }
    }
    let answer = request.body(body).send().await.expect("upstream answers");
    let mut response = Response::builder().status(answer.status().as_u16());
    for (name, value) in answer.headers() {
        response = response.header(name, value);
    }
    response
        .body(Body::from(answer.bytes().await.expect("upstream body")))
        .expect("response")
}

fn never() -> Arc<Rule> {
    Arc::new(|_: &Method, _: &str, _: &str| None)
}

/// `/?type=git&repository=…` for `repository`, as the seed tool's address format names it.
fn seed_address(repository: &str, state: &str) -> String {
    let url = reqwest::Url::parse_with_params(
        "http://x/",
        &[
            ("type", "git"),
            ("repository", repository),
            ("ref", "main"),
            ("state", state),
        ],
    )
    .expect("url");
    format!("/?{}", url.query().expect("query"))
}

fn basic_token() -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{GIT_USER}:{GIT_TOKEN}"))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowlisted_repositories_on_another_origin_get_no_token() {
    capture_logs();
    let server = GitServer::start().await;
    let primary = server.create_repo("primary");
    let sibling = server.create_repo("sibling");
    // A second git server on another port: another origin, behind a front that records headers.
    let second = GitServer::start().await;
    second.create_repo("foreign");
    let front = Front::start(&format!("http://{}", second.address), never()).await;
    let foreign = format!("{}/foreign.git", front.url);
    // Also another origin: the same host and port under another scheme is never the same origin,
    // and `localhost` is not `127.0.0.1`.
    let renamed = sibling.replace("127.0.0.1", "localhost");
    let allowed = format!("{sibling},{foreign},{renamed}");
    let backend = TestBackend::start(
        &primary,
        &[("GITSTATE_ALLOWED_REPOSITORIES", allowed.as_str())],
    )
    .await;
    let client = Client::new(&backend.url);

    // The same origin gets the token: a write and a read of the sibling work.
    let state = state_json("lineage-sibling", 1);
    let wrote = client
        .send("POST", &seed_address(&sibling, "a.tfstate"), Some(&state))
        .await;
    assert_eq!(wrote.status, 200, "{}", wrote.body);
    let read = client
        .send("GET", &seed_address(&sibling, "a.tfstate"), None)
        .await;
    assert_eq!((read.status, read.body.as_str()), (200, state.as_str()));

    // Another origin: asked without credentials, so the git server refuses and the answer is 502.
    for method in ["GET", "POST"] {
        let answer = client
            .send(
                method,
                &seed_address(&foreign, "a.tfstate"),
                (method == "POST").then_some(state.as_str()),
            )
            .await;
        assert_eq!(answer.status, 502, "{method}: {}", answer.body);
    }
    let seen = front.seen();
    assert!(!seen.is_empty(), "the other origin was asked");
    assert!(
        seen.iter().all(|s| s.authorization.is_none()),
        "the other origin saw an Authorization header: {seen:?}"
    );
    let answer = client
        .send("GET", &seed_address(&renamed, "a.tfstate"), None)
        .await;
    assert_eq!(
        answer.status, 502,
        "localhost is another origin: {}",
        answer.body
    );
    assert!(
        !captured_logs().contains(GIT_TOKEN),
        "the token reached the log"
    );
    println!(
        "another origin saw {} requests, none with credentials",
        seen.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_another_origin_is_not_followed_with_the_token() {
    capture_logs();
    let server = GitServer::start().await;
    server.create_repo("repo");
    let target = format!("http://{}", server.address);
    let to_other = target.clone();
    // Every ref advertisement is sent on to the real git server: another origin.
    let front = Front::start(
        &target,
        Arc::new(move |_: &Method, path: &str, query: &str| {
            path.ends_with("/info/refs")
                .then(|| (302, format!("{to_other}/repo.git/info/refs?{query}")))
        }),
    )
    .await;
    let backend = TestBackend::start(&format!("{}/repo.git", front.url), &[]).await;
    let client = Client::new(&backend.url);
    client.get_state("a.tfstate").await.expect(502);
    assert!(
        server.take_requests().is_empty(),
        "the other origin was never asked (so never given the token)"
    );
    let logs = captured_logs();
    assert!(
        logs.contains("redirected to another origin"),
        "the log names the refusal"
    );
    assert!(!logs.contains(GIT_TOKEN));
    // The configured origin itself did get the token, once per attempt.
    assert!(
        front
            .seen()
            .iter()
            .all(|s| s.authorization.as_deref() == Some(basic_token().as_str()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_first_advertisement_is_redirected_and_only_within_the_origin() {
    let server = GitServer::start().await;
    server.create_repo("repo");
    let target = format!("http://{}", server.address);
    // /old.git's advertisement moved to /repo.git (relative Location, same origin); after
    // `later` is set, every advertisement and upload-pack of /repo.git is redirected again
    // (same origin too), which must not be followed.
    let later = Arc::new(AtomicBool::new(false));
    let rule_later = later.clone();
    let front = Front::start(
        &target,
        Arc::new(move |method: &Method, path: &str, query: &str| {
            if path == "/old.git/info/refs" {
                return Some((301, format!("/repo.git/info/refs?{query}")));
            }
            let again = rule_later.load(Ordering::SeqCst)
                && (path == "/repo.git/info/refs"
                    || (method == Method::POST && path == "/repo.git/git-upload-pack"));
            again.then(|| {
                (
                    307,
                    format!("/elsewhere.git{}?{query}", &path["/repo.git".len()..]),
                )
            })
        }),
    )
    .await;
    let cache = tempfile::tempdir().expect("tempdir");
    let settings =
        gitstate_tests::settings_for(&format!("{}/old.git", front.url), cache.path(), &[]);
    let backend = TestBackend::serve(gitstate_tests::app(&settings).await, cache).await;
    let client = Client::new(&backend.url);
    let state = state_json("lineage-redirect", 1);
    client.write("a.tfstate", &state).await.expect(200);
    let read = client.send("GET", "/states/a.tfstate", None).await;
    assert_eq!((read.status, read.body.as_str()), (200, state.as_str()));
    let seen = front.seen();
    let to_old: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.target.starts_with("/old.git"))
        .collect();
    assert_eq!(
        to_old.len(),
        1,
        "the redirect is followed once, then the new location is used: {seen:?}"
    );
    assert!(
        seen.iter()
            .all(|s| s.authorization.as_deref() == Some(basic_token().as_str())),
        "the same origin gets the token"
    );

    // A later advertisement redirected, even within the origin: 502, not followed.
    later.store(true, Ordering::SeqCst);
    let before = front.seen().len();
    client.get_state("a.tfstate").await.expect(502);
    let after: Vec<Seen> = front.seen()[before..].to_vec();
    assert!(
        !after.is_empty()
            && after
                .iter()
                .all(|s| !s.target.starts_with("/elsewhere.git")),
        "a later advertisement's redirect was not followed: {after:?}"
    );

    // A fetch redirected (a cold cache must fetch; its first advertisement is not redirected):
    // not followed either.
    let fetch_moved = Front::start(
        &target,
        Arc::new(|method: &Method, path: &str, _: &str| {
            (method == Method::POST && path.ends_with("/git-upload-pack"))
                .then(|| (307, "/elsewhere.git/git-upload-pack".to_owned()))
        }),
    )
    .await;
    let cold = TestBackend::start(&format!("{}/repo.git", fetch_moved.url), &[]).await;
    let read = Client::new(&cold.url)
        .send("GET", "/states/a.tfstate", None)
        .await;
    assert_eq!(read.status, 502, "{}", read.body);
    let seen = fetch_moved.seen();
    assert!(
        seen.iter().any(|s| s.target.ends_with("/git-upload-pack"))
            && seen.iter().all(|s| !s.target.starts_with("/elsewhere.git")),
        "the fetch's redirect was not followed: {seen:?}"
    );
}
