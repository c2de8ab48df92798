//! The Lambda binary's start-up plus its first GET of a state, from an empty cache, under
//! cargo-lambda's runtime emulator, over the repository of sealed states.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use gitstate_tests::{
    GIT_TOKEN, GIT_USER, GitServer, Moto, TEST_PASSWORD, TEST_USER, access_file, free_port,
    realistic_state,
};

use super::encrypted::{READ, sealed_repo};
use super::{COLD_RUNS, Sample, ms, scale};

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_owned()
}

pub(super) fn lambda_binary(bench: &Path) -> PathBuf {
    if let Some(path) = std::env::var_os("GITSTATE_LAMBDA_BIN") {
        return PathBuf::from(path);
    }
    let path = bench.with_file_name("gitstate-lambda");
    assert!(
        path.is_file(),
        "{} not found: build it with `cargo build -p gitstate-lambda` (same profile) or set \
         GITSTATE_LAMBDA_BIN",
        path.display()
    );
    path
}

fn cargo_lambda() -> PathBuf {
    let venv = workspace_root().join("tests/tools/deploy-venv/bin/cargo-lambda");
    if venv.is_file() {
        return venv;
    }
    PathBuf::from("cargo-lambda")
}

/// `cargo lambda watch --only-lambda-apis`: the runtime API and the Function URL front, no
/// function (each run starts the binary itself). Killed with its process group on drop.
pub(super) struct Emulator {
    pub(super) port: u16,
    child: std::process::Child,
}

impl Emulator {
    pub(super) async fn start() -> Self {
        let port = free_port();
        let mut command = std::process::Command::new(cargo_lambda());
        command
            .args([
                "lambda",
                "watch",
                "--only-lambda-apis",
                "-A",
                "127.0.0.1",
                "-P",
            ])
            .arg(port.to_string())
            .current_dir(workspace_root())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.spawn().expect("cargo-lambda starts");
        let emulator = Self { port, child };
        for _ in 0..600 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return emulator;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("cargo lambda watch is not listening on {port}");
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

/// The Lambda binary as `emulator`'s function, as deployed but for its settings: the
/// repository with the test git credentials, `cache` for its /tmp, the test user as admin, then
/// `env`. Its log goes beside the cache (`cache.log`).
pub(super) fn spawn_function<K, V>(
    binary: &Path,
    emulator: &Emulator,
    repository: &str,
    cache: &Path,
    env: impl IntoIterator<Item = (K, V)>,
) -> tokio::process::Child
where
    K: AsRef<std::ffi::OsStr>,
    V: AsRef<std::ffi::OsStr>,
{
    let access = access_file(&[(TEST_USER, TEST_PASSWORD, &["admin:*"])]);
    std::fs::create_dir_all(cache).expect("cache dir");
    let log = std::fs::File::create(cache.with_extension("log")).expect("log file");
    tokio::process::Command::new(binary)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env(
            "AWS_LAMBDA_RUNTIME_API",
            format!("http://127.0.0.1:{}/.rt", emulator.port),
        )
        .env("AWS_LAMBDA_FUNCTION_NAME", "_")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "1024")
        .env("GITSTATE_REPOSITORY", repository)
        .env("GITSTATE_GIT_USERNAME", GIT_USER)
        .env("GITSTATE_GIT_TOKEN", GIT_TOKEN)
        .env("GITSTATE_CACHE_DIR", cache)
        .env("GITSTATE_ACCESS", access)
        .env("RUST_LOG", "warn")
        .envs(env)
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("the Lambda binary starts")
}

/// One cold start: the GET is queued in the emulator first, then the binary starts with an
/// empty cache; the time runs from its start to the answer. `None` (the binary's log printed)
/// when no right answer came within 30 s.
async fn cold_start(
    emulator: &Emulator,
    binary: &Path,
    url: &str,
    moto: &Moto,
    cache: &Path,
) -> Option<Duration> {
    let request = reqwest::Client::new()
        .get(format!(
            "http://127.0.0.1:{}/lambda-url/_/states/{READ}",
            emulator.port
        ))
        .basic_auth(TEST_USER, Some(TEST_PASSWORD))
        .timeout(Duration::from_secs(30))
        .send();
    let answer = tokio::spawn(async move {
        let r = request.await.map_err(|e| e.to_string())?;
        let status = r.status().as_u16();
        Ok::<_, String>((status, r.text().await.unwrap_or_default(), Instant::now()))
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log_path = cache.with_extension("log");
    let started = Instant::now();
    let mut env = moto.env();
    env.push(("GITSTATE_KMS_KEY_IDS", "alias/bench".into()));
    let mut function = spawn_function(binary, emulator, url, cache, env);
    let answer = answer.await.expect("request task");
    let _ = function.start_kill();
    let _ = function.wait().await;
    match answer {
        Ok((200, body, at)) if body == realistic_state(7, 60, 1) => Some(at - started),
        other => {
            let shown = other.map(|(status, body, _)| format!("{status}: {body}"));
            eprintln!(
                "Lambda cold GET failed ({shown:?}); the binary's log:\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
            None
        }
    }
}

/// Start-up plus first cold GET of one state among the sealed ones, filter on and off
/// alternating run by run.
pub async fn lambda_cold_start(out: &mut String, bench: &Path, binary: &Path) {
    let states = scale(200, 20);
    let lambda = lambda_binary(bench);
    let moto = Moto::start().await;
    moto.create_key("bench").await;
    let git_server = GitServer::start().await;
    sealed_repo(&git_server, "sealed", states, binary, &moto).await;
    let url = git_server.url("sealed");
    let root = tempfile::tempdir().expect("tempdir");
    let mut rows = [
        (true, Sample::default(), 0u64, 0usize),
        (false, Sample::default(), 0, 0),
    ];
    for run in 0..COLD_RUNS {
        for (filter, sample, bytes, failed) in &mut rows {
            git_server.allow_filter("sealed", *filter);
            let cache = root.path().join(format!("{filter}-{run}"));
            // A new emulator each attempt: one whose last function was killed while it waited
            // for the next invocation may hand the next request to that dead waiter. A run
            // without the right answer is tried again (at most twice) and counted.
            let mut time = None;
            for _ in 0..3 {
                let emulator = Emulator::start().await;
                git_server.take_requests();
                time = cold_start(&emulator, &lambda, &url, &moto, &cache).await;
                if time.is_some() {
                    break;
                }
                *failed += 1;
                let _ = std::fs::remove_dir_all(&cache);
            }
            let Some(time) = time else {
                continue;
            };
            let seen = git_server.take_requests();
            sample.add(time, seen.len());
            *bytes = seen.iter().map(|r| r.bytes).sum();
        }
    }
    let size = std::fs::metadata(&lambda).map(|m| m.len()).unwrap_or(0);
    out.push_str(&format!(
        "## Lambda binary: start-up plus first cold GET ({states} encrypted states)\n\n\
         `gitstate-lambda` ({size} bytes) under `cargo lambda watch \
         --only-lambda-apis` (a new emulator each run): a Function URL `GET /states/{READ}` is queued in the emulator, \
         then the binary starts with an empty cache (`/tmp` of a new container); time = its \
         start to the answer, which includes loading the AWS configuration, argon2 for the \
         first credential, the git requests and the KMS `Decrypt`. Same sealed repository as \
         above, built again; filter on and off alternate run by run ({COLD_RUNS} runs \
         each).\n\n\
         | filter | failed attempts | git reqs | bytes fetched | p50 ms | max ms |\n\
         |---|---:|---:|---:|---:|---:|\n"
    ));
    for (filter, sample, bytes, failed) in &rows {
        out.push_str(&format!(
            "| {} | {failed} | {} | {bytes} | {} | {} |\n",
            if *filter { "on" } else { "off" },
            sample.reqs(),
            ms(sample.pct(0.5)),
            ms(sample.pct(1.0)),
        ));
    }
    out.push('\n');
}
