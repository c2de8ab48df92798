//! The real `gitstate-lambda` binary under cargo-lambda's runtime emulator (`cargo lambda watch`),
//! against a real git server on loopback: every `events/*.json` through `cargo lambda invoke
//! --data-file`, then real Terraform through the emulator's Function URL front
//! (`/lambda-url/gitstate-lambda/…`).
//!
//! cargo-lambda comes from tests/tools/deploy-venv (installed by `tests/run`) or PATH; without it
//! the test fails. The emulator serves only the Lambda APIs (`--only-lambda-apis`); the test
//! starts the function itself: the `gitstate-lambda` binary `cargo test --workspace` built beside
//! this test (for the package's own tests), with the workspace's test features. Letting watch
//! `cargo run` it instead built it again with the package's own features: about 220 crates a
//! second time, minutes of a fresh CI run.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use gitstate_tests::counting::{FLOOR, Requests, count_warm_applies};
use gitstate_tests::{GIT_TOKEN, GIT_USER, GitServer, access_file, git, init_tracing};

/// The function's name in the emulator (any name: it serves the one runtime that polls).
const FUNCTION: &str = "_";

/// Git requests per apply through a warm container: the floor, as `gitstate serve` by default,
/// whose assembly it shares. The LOCK push proves where the state's newest content is (its own
/// ref at the tip the container knows, or the branch and the ref's absence, by a probe), so the
/// GETs after it ask nothing for the 2 s its lock commit records: any other container waits that
/// out before it writes under the lock or releases it. An update goes to the state's own ref
/// (`GITSTATE_STATE_REFS=always`) in one push (the first one deletes the lock's probe first: one
/// push more, once in a state's life, before this count), a create to the branch in one push.
const LAMBDA: Requests = FLOOR;

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_owned()
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn cargo_lambda() -> PathBuf {
    let venv = workspace_root().join("tests/tools/deploy-venv/bin/cargo-lambda");
    if venv.is_file() {
        return venv;
    }
    find_on_path("cargo-lambda").unwrap_or_else(|| {
        panic!(
            "cargo-lambda is missing: `bash tests/run` installs it into tests/tools/deploy-venv \
             (tests/tools/deploy-requirements.txt)"
        )
    })
}

fn cargo() -> PathBuf {
    std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from)
}

/// A command that runs cargo (directly or through cargo-lambda) from the workspace root without
/// the variables cargo sets for this test process: build scripts such as ring's rerun when
/// `CARGO_PKG_NAME` or `CARGO_MANIFEST_DIR` change, so an inherited value would rebuild them
/// here and again in the next plain `cargo` command.
fn cargo_command(program: &Path) -> Command {
    let mut command = Command::new(program);
    command.current_dir(workspace_root()).env("CARGO", cargo());
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let set_by_cargo_for_tests = key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_BIN_")
            || key.starts_with("CARGO_MANIFEST_")
            || [
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
                "OUT_DIR",
            ]
            .contains(&key.as_ref());
        if set_by_cargo_for_tests {
            command.env_remove(key.as_ref());
        }
    }
    command
}

/// `cargo lambda watch --only-lambda-apis` on a loopback port, in its own process group, and
/// the `gitstate-lambda` binary polling it; both killed with the test, both writing one log.
struct Watch {
    port: u16,
    child: Child,
    /// Started once the emulator listens (its runtime API must answer the first poll).
    function: Option<Child>,
    log: tempfile::NamedTempFile,
}

/// The `gitstate-lambda` binary beside this test binary (`target/debug/`), as
/// `cargo test --workspace` built it.
fn function_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    let binary = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/debug/deps/it-*")
        .join("gitstate-lambda");
    assert!(
        binary.is_file(),
        "{} is missing: `cargo test --workspace` builds it (the package's tests need it)",
        binary.display()
    );
    binary
}

impl Watch {
    fn start(env: &[(&str, String)]) -> Self {
        let port = gitstate_tests::free_port();
        let log = tempfile::NamedTempFile::new().expect("log file");
        let mut command = cargo_command(&cargo_lambda());
        command
            .args(["lambda", "watch", "--only-lambda-apis", "--invoke-address"])
            .arg("127.0.0.1")
            .arg("--invoke-port")
            .arg(port.to_string())
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.reopen().expect("log"))
            .stderr(log.reopen().expect("log"));
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.spawn().expect("cargo-lambda starts");
        let mut function = Command::new(function_binary());
        function
            .env(
                "AWS_LAMBDA_RUNTIME_API",
                format!("http://127.0.0.1:{port}/.rt"),
            )
            .env("AWS_LAMBDA_FUNCTION_NAME", FUNCTION)
            .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "1024")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.reopen().expect("log"))
            .stderr(log.reopen().expect("log"));
        for (key, value) in env {
            function.env(key, value);
        }
        let mut watch = Self {
            port,
            child,
            function: None,
            log,
        };
        watch.wait_until_listening(Duration::from_secs(60));
        watch.function = Some(function.spawn().expect("the Lambda binary starts"));
        watch
    }

    fn wait_until_listening(&mut self, limit: Duration) {
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("cargo lambda watch exited ({status}):\n{}", self.output());
            }
            assert!(
                started.elapsed() < limit,
                "cargo lambda watch is not listening after {limit:?}:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/lambda-url/{FUNCTION}", self.port)
    }

    /// `cargo lambda invoke --data-file events/<name>`: the Function URL response as JSON.
    async fn invoke(&self, name: &str) -> serde_json::Value {
        let output = tokio::process::Command::new(cargo_lambda())
            .args([
                "lambda",
                "invoke",
                FUNCTION,
                "--invoke-address",
                "127.0.0.1",
            ])
            .arg("--invoke-port")
            .arg(self.port.to_string())
            .arg("--data-file")
            .arg(workspace_root().join("events").join(name))
            .args(["--output-format", "json"])
            .output()
            .await
            .expect("cargo lambda invoke runs");
        assert!(
            output.status.success(),
            "invoke {name}: {}\nwatch:\n{}",
            String::from_utf8_lossy(&output.stderr),
            self.output()
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "invoke {name} printed no JSON ({e}): {}",
                String::from_utf8_lossy(&output.stdout)
            )
        })
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // watch and what it started share the process group; the function is the test's.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(function) = &mut self.function {
            let _ = function.kill();
            let _ = function.wait();
        }
        if std::thread::panicking() {
            eprintln!("cargo lambda watch output:\n{}", self.output());
        }
    }
}

fn body_text(response: &serde_json::Value) -> String {
    let body = response["body"].as_str().unwrap_or_default();
    if response["isBase64Encoded"] == true {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(body)
            .expect("base64 body");
        String::from_utf8_lossy(&bytes).into_owned()
    } else {
        body.to_owned()
    }
}

fn event(name: &str) -> serde_json::Value {
    let text =
        std::fs::read_to_string(workspace_root().join("events").join(name)).expect("event file");
    serde_json::from_str(&text).expect("event JSON")
}

/// The newest content of `path` on `main`: with the Lambda's `GITSTATE_STATE_REFS=always` an
/// update is on the state's own ref until a fold.
fn newest(server: &GitServer, repo: &str, path: &str) -> String {
    let stored = gitstate_tests::states::newest_stored(&server.repo_dir(repo), "main", path)
        .unwrap_or_else(|| panic!("{path} is not stored"));
    String::from_utf8_lossy(&stored).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lambda_binary_answers_every_event_and_terraform_under_cargo_lambda_watch() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("watched");
    let cache = tempfile::tempdir().expect("tempdir");
    let watch = Watch::start(&[
        ("GITSTATE_REPOSITORY", url),
        ("GITSTATE_GIT_USERNAME", GIT_USER.to_owned()),
        ("GITSTATE_GIT_TOKEN", GIT_TOKEN.to_owned()),
        ("GITSTATE_CACHE_DIR", cache.path().display().to_string()),
        ("GITSTATE_GIT_TIMEOUT_SECS", "10".to_owned()),
        // The users the event files and the smoke run authenticate as.
        (
            "GITSTATE_ACCESS",
            access_file(&[
                ("terraform", "example-password", &["admin:*"]),
                ("reader", "reader-example-password", &["read:demo/"]),
            ]),
        ),
    ]);

    // The function polls the emulator from the start.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client");
    let health = http
        .get(format!("{}/health", watch.base_url()))
        .send()
        .await
        .expect("the emulator answers");
    assert_eq!(health.status().as_u16(), 200, "{}", watch.output());

    // Every event file, in an order whose answers are known.
    let sequence = gitstate_tests::EVENT_SEQUENCE;
    let mut bodies = Vec::new();
    for (name, want) in sequence {
        let response = watch.invoke(name).await;
        let body = body_text(&response);
        assert_eq!(response["statusCode"], want, "{name}: {body}");
        bodies.push(body);
    }
    let bodies = bodies.split_off(2);
    let holder: serde_json::Value =
        serde_json::from_str(event("lock.json")["body"].as_str().expect("body")).expect("lock");
    assert!(
        bodies[1].contains(holder["ID"].as_str().expect("ID")),
        "the conflict names the holder: {}",
        bodies[1]
    );
    let sent = base64::engine::general_purpose::STANDARD
        .decode(event("write-base64.json")["body"].as_str().expect("body"))
        .expect("base64");
    assert_eq!(
        bodies[4].as_bytes(),
        sent.as_slice(),
        "GET returns the write"
    );
    assert_eq!(
        newest(&server, "watched", "demo/app.tfstate").as_bytes(),
        sent.as_slice()
    );
    // That EVENT_SEQUENCE covers every file in events/ is checked by tests/it/lambda_events.rs.

    // Real Terraform through the emulated Function URL: the post-deploy smoke script, twice.
    smoke_run(&watch.base_url(), "first").await;
    smoke_run(&watch.base_url(), "second").await;
    let state: serde_json::Value =
        serde_json::from_str(&newest(&server, "watched", "smoke/gitstate-smoke.tfstate"))
            .expect("state");
    assert_eq!(state["serial"], 2, "two applies: {state}");
    assert_eq!(
        state["resources"][0]["instances"][0]["attributes"]["input"]["value"],
        "second"
    );
    let refs = git(
        &["ls-remote", &server.url_with_credentials("watched")],
        None,
    );
    assert!(!refs.contains("locks/"), "no lock left behind: {refs}");

    // Git requests per apply when Terraform's requests reach the warm container (issue 27).
    let client = gitstate_tests::Client::with_credentials(
        &watch.base_url(),
        Some(("terraform", "example-password")),
    );
    for apply in count_warm_applies(&server, &client, "Lambda", "counted/app.tfstate").await {
        apply.assert_within("Lambda", &LAMBDA);
    }
}

/// `infra/smoke/run <url> <run id>`: terraform init + apply of infra/smoke against `url`.
async fn smoke_run(url: &str, run_id: &str) {
    let config = tempfile::NamedTempFile::new().expect("empty CLI config");
    let output = tokio::process::Command::new("bash")
        .arg(workspace_root().join("infra/smoke/run"))
        .args([url, run_id])
        .env("TF_CLI_CONFIG_FILE", config.path())
        .env("TF_HTTP_USERNAME", "terraform")
        .env("TF_HTTP_PASSWORD", "example-password")
        .kill_on_drop(true)
        .output()
        .await
        .expect("bash runs");
    assert!(
        output.status.success(),
        "infra/smoke/run {url} {run_id}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
