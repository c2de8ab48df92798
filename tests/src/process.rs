//! `gitstate serve` as separate operating-system processes (each with its own cache, as separate
//! Lambda containers), for races and crashes that in-process backends cannot show.
//!
//! The tests crate cannot name another package's binary with `env!("CARGO_BIN_EXE_…")`, so the
//! tests that spawn servers live in `functions/gitstate-cli/tests/` and pass
//! `env!("CARGO_BIN_EXE_gitstate")` here; the benchmark finds `gitstate` next to its own binary.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::{GIT_TOKEN, GIT_USER, TEST_PASSWORD, TEST_USER, access_file};

/// One running `gitstate serve`.
pub struct ServeProcess {
    pub url: String,
    pub pid: u32,
    child: tokio::process::Child,
    /// Where its cache lives (kept across restarts).
    pub cache: PathBuf,
    /// Its standard error (the log), appended across restarts.
    pub log: PathBuf,
    binary: PathBuf,
    env: Vec<(String, String)>,
}

/// The real `terraform` on PATH (tests/run requires it there); a panic that says so when it is
/// missing.
pub fn terraform() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("terraform"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("terraform is not on PATH: this needs the real binary"))
}

/// The environment of a server over `repository`, with the test admin as its only user.
pub fn serve_env(repository: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("GITSTATE_REPOSITORY".into(), repository.into()),
        ("GITSTATE_GIT_USERNAME".into(), GIT_USER.into()),
        ("GITSTATE_GIT_TOKEN".into(), GIT_TOKEN.into()),
        ("GITSTATE_GIT_TIMEOUT_SECS".into(), "10".into()),
        ("GITSTATE_LISTEN".into(), "127.0.0.1:0".into()),
        (
            "GITSTATE_ACCESS".into(),
            access_file(&[(TEST_USER, TEST_PASSWORD, &["admin:*"])]),
        ),
        ("RUST_LOG".into(), "debug".into()),
        // One line per request, so every server has a log the secret checks can read (the
        // HTTP and TLS crates, which used to fill it at debug, are held at INFO).
        ("GITSTATE_ACCESS_LOG".into(), "true".into()),
    ];
    for (k, v) in extra {
        env.retain(|(key, _)| key != k);
        env.push(((*k).into(), (*v).into()));
    }
    env
}

impl ServeProcess {
    /// Start `binary serve` with `env`, its cache in `dir/cache` and its log in `dir/serve.log`.
    pub async fn start(binary: &Path, dir: &Path, env: Vec<(String, String)>) -> Self {
        let cache = dir.join("cache");
        let log = dir.join("serve.log");
        let (child, url, pid) = spawn(binary, &cache, &log, &env).await;
        Self {
            url,
            pid,
            child,
            cache,
            log,
            binary: binary.to_owned(),
            env,
        }
    }

    /// `kill -9`, and wait until the process is gone.
    pub async fn kill9(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    /// Start again on the same cache and log (after [`Self::kill9`]).
    pub async fn restart(&mut self) {
        self.kill9().await;
        let (child, url, pid) = spawn(&self.binary, &self.cache, &self.log, &self.env).await;
        (self.child, self.url, self.pid) = (child, url, pid);
    }

    /// Peak resident set size so far (`VmHWM`), in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// Everything the process has logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

async fn spawn(
    binary: &Path,
    cache: &Path,
    log: &Path,
    env: &[(String, String)],
) -> (tokio::process::Child, String, u32) {
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("open the server log");
    let mut child = tokio::process::Command::new(binary)
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("GITSTATE_CACHE_DIR", cache)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display()));
    let pid = child.id().expect("a running child has a pid");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let url = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.expect("read server stdout") {
            // `http://…`, or `https://…` on a TLS listener.
            if let Some((_, base)) = line.rsplit_once(" on ")
                && base.starts_with("http")
            {
                return base.trim().to_owned();
            }
        }
        panic!(
            "gitstate serve exited before listening; log: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        )
    })
    .await
    .expect("gitstate serve listens within 30 s");
    // Keep draining stdout so the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, url, pid)
}

/// Run `binary args…` with only `env` (and `PATH`) set, as a separate process, and wait for it:
/// e.g. `gitstate fold` on the repository a set of [`ServeProcess`]es serve.
pub async fn run_command(
    binary: &Path,
    args: &[&str],
    env: &[(String, String)],
) -> std::process::Output {
    tokio::process::Command::new(binary)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {} {args:?}: {e}", binary.display()))
}

/// Whether `binary` has the subcommand `command` (`binary command --help` succeeds): tests of a
/// feature still being built use it when it is there.
pub async fn has_command(binary: &Path, command: &str) -> bool {
    run_command(binary, &[command, "--help"], &[])
        .await
        .status
        .success()
}

/// Whether `binary` knows the setting `var` (`binary config` does not refuse it as an unknown
/// variable, as every command would).
pub async fn knows_variable(binary: &Path, var: &str, value: &str) -> bool {
    let cache = tempfile::tempdir().expect("tempdir");
    let env = [
        (
            "GITSTATE_REPOSITORY".into(),
            "http://127.0.0.1:9/x.git".into(),
        ),
        (
            "GITSTATE_CACHE_DIR".into(),
            cache.path().display().to_string(),
        ),
        (var.to_owned(), value.to_owned()),
    ];
    let out = run_command(binary, &["config"], &env).await;
    !String::from_utf8_lossy(&out.stderr).contains(&format!("unknown variable {var}"))
}
