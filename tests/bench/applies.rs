//! Many concurrent Terraform applies on distinct states through a few backends, with a delay
//! added to every git request by a proxy (the round trip to a hosted remote).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gitstate_tests::faults::{Fault, FaultProxy};
use gitstate_tests::process::ServeProcess;
use gitstate_tests::process::terraform;
use gitstate_tests::{GitServer, TEST_PASSWORD, TEST_USER, terraform_backend_block};

use gitstate_tests::process::serve_env;

use super::{join_all, scale};

/// Added to every git request.
const DELAY: Duration = Duration::from_millis(100);

const RESOURCES: &str = r#"
variable "round" {
  type    = number
  default = 1
}
resource "terraform_data" "item" {
  for_each = toset(["alpha", "beta", "gamma"])
  input    = "${each.key}-${var.round}"
}
"#;

/// `terraform version`'s first line.
fn version(bin: &Path) -> String {
    let out = std::process::Command::new(bin)
        .arg("version")
        .env("CHECKPOINT_DISABLE", "1")
        .output()
        .expect("terraform version");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next().unwrap_or_default().trim().to_owned()
}

/// Run `terraform args` in `dir`; its success.
async fn run(bin: &Path, dir: &Path, config: &Path, args: &[&str]) -> bool {
    let out = tokio::process::Command::new(bin)
        .args(args)
        .current_dir(dir)
        .env("TF_CLI_CONFIG_FILE", config)
        .env("CHECKPOINT_DISABLE", "1")
        .env("TF_HTTP_USERNAME", TEST_USER)
        .env("TF_HTTP_PASSWORD", TEST_PASSWORD)
        .env("TF_IN_AUTOMATION", "1")
        .env("TF_INPUT", "0")
        .kill_on_drop(true)
        .output()
        .await
        .expect("terraform runs");
    if !out.status.success() {
        eprintln!(
            "terraform {args:?} in {} failed:\n{}{}",
            dir.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out.status.success()
}

/// What one phase (all inits, or all applies at once) cost.
struct Phase {
    ok: usize,
    total: Duration,
    /// Each run's wall time.
    each: super::Sample,
    /// Git requests by label (`POST receive-pack`, …), over all runs.
    labels: Vec<(String, usize)>,
    requests: usize,
    /// Commits the phase added to `main` (landed writes).
    commits: usize,
}

/// Commits on `main` of the repository `dir`.
fn commits(dir: &Path) -> usize {
    let n = gitstate_tests::git_output(&["rev-list", "--count", "main"], Some(dir));
    String::from_utf8_lossy(&n.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// One phase: every directory's `terraform args` at once.
async fn phase(
    git: &GitServer,
    repo: &str,
    bin: &Path,
    dirs: &[PathBuf],
    config: &Path,
    args: &[&str],
) -> Phase {
    git.take_requests();
    let before = commits(&git.repo_dir(repo));
    let times = std::sync::Mutex::new(Vec::new());
    let started = Instant::now();
    let results = join_all(dirs.iter().map(|dir| {
        let times = &times;
        async move {
            let began = Instant::now();
            let ok = run(bin, dir, config, args).await;
            times.lock().expect("times").push(began.elapsed());
            u16::from(ok)
        }
    }))
    .await;
    let total = started.elapsed();
    let seen = git.take_requests();
    let mut labels: Vec<(String, usize)> = Vec::new();
    for label in seen.iter().map(gitstate_tests::Seen::label) {
        match labels.iter_mut().find(|(l, _)| *l == label) {
            Some((_, n)) => *n += 1,
            None => labels.push((label, 1)),
        }
    }
    labels.sort();
    let mut each = super::Sample::default();
    for t in times.into_inner().expect("times") {
        each.add(t, 0);
    }
    Phase {
        ok: results.iter().filter(|r| **r == 1).count(),
        total,
        each,
        labels,
        requests: seen.len(),
        commits: commits(&git.repo_dir(repo)) - before,
    }
}

/// One side of the comparison: its own repository, backends and working directories.
struct Side {
    /// What the table calls it.
    label: String,
    repo: String,
    dirs: Vec<PathBuf>,
    _procs: Vec<ServeProcess>,
    _proxy: FaultProxy,
}

impl Side {
    async fn start(
        git: &GitServer,
        (binary, label): (&Path, String),
        root: &Path,
        (applies, backends): (usize, usize),
        (index, writes_per_push): (usize, usize),
    ) -> Self {
        let repo = format!("applies-{index}");
        git.create_repo(&repo);
        let proxy = FaultProxy::start(git.address, 1, 1.0, vec![Fault::Slow(DELAY)]).await;
        let url = proxy.url(&repo);
        let per_push = writes_per_push.to_string();
        let mut procs: Vec<ServeProcess> = Vec::new();
        for b in 0..backends {
            let dir = root.join(format!("{repo}-backend-{b}"));
            std::fs::create_dir_all(&dir).expect("dir");
            let env = serve_env(
                &url,
                &[
                    ("RUST_LOG", "warn"),
                    ("GITSTATE_GIT_WRITES_PER_PUSH", per_push.as_str()),
                ],
            );
            procs.push(ServeProcess::start(binary, &dir, env).await);
        }
        let dirs: Vec<PathBuf> = (0..applies)
            .map(|i| {
                let dir = root.join(format!("{repo}-ws-{i:03}"));
                std::fs::create_dir_all(&dir).expect("dir");
                let base = &procs[i % backends].url;
                let block = terraform_backend_block(base, &format!("apps/a{i:03}.tfstate"), "");
                std::fs::write(dir.join("main.tf"), format!("{block}{RESOURCES}")).expect("config");
                dir
            })
            .collect();
        Self {
            label,
            repo,
            dirs,
            _procs: procs,
            _proxy: proxy,
        }
    }
}

/// `applies` concurrent Terraform applies, each on its own state, spread over `backends`
/// `gitstate serve` processes, every git request delayed by [`DELAY`]: with one write per push
/// (`GITSTATE_GIT_WRITES_PER_PUSH=1`), with the default, and with a baseline build when
/// `GITSTATE_BENCH_BASELINE` names one; phase by phase in turns so all see the same machine.
pub async fn concurrent_applies(out: &mut String, binary: &Path) {
    let (applies, backends) = (scale(100, 8), scale(8, 2));
    let bin = terraform();
    let git = GitServer::start().await;
    let root = tempfile::tempdir().expect("tempdir");
    let config = root.path().join("empty.tfrc");
    std::fs::write(&config, "").expect("cli config");
    let mut plan: Vec<(PathBuf, String, usize)> = Vec::new();
    if let Some(baseline) = std::env::var_os("GITSTATE_BENCH_BASELINE") {
        let name =
            std::env::var("GITSTATE_BENCH_BASELINE_NAME").unwrap_or_else(|_| "baseline".into());
        plan.push((PathBuf::from(baseline), name, 1));
    }
    plan.push((binary.to_owned(), "one write per push".into(), 1));
    plan.push((binary.to_owned(), "default (32 per push)".into(), 32));
    let mut sides = Vec::new();
    for (index, (bin, label, writes_per_push)) in plan.into_iter().enumerate() {
        let side = Side::start(
            &git,
            (&bin, label),
            root.path(),
            (applies, backends),
            (index, writes_per_push),
        )
        .await;
        sides.push(side);
    }
    let phases: [(&str, Vec<&str>); 4] = [
        ("`terraform init`", vec!["init", "-no-color"]),
        (
            "first apply (creates the state)",
            vec!["apply", "-auto-approve", "-no-color"],
        ),
        (
            "update apply (changes the resources)",
            vec!["apply", "-auto-approve", "-no-color", "-var", "round=2"],
        ),
        (
            "no-op apply",
            vec!["apply", "-auto-approve", "-no-color", "-var", "round=2"],
        ),
    ];
    let mut rows = Vec::new();
    for (label, args) in &phases {
        for side in &sides {
            let p = phase(&git, &side.repo, &bin, &side.dirs, &config, args).await;
            rows.push((*label, side.label.clone(), p));
        }
    }
    out.push_str(&format!(
        "## {applies} concurrent Terraform applies through {backends} backends, +{} ms per git \
         request\n\n\
         {applies} working directories, each with its own state (`apps/aNNN.tfstate`, three \
         `terraform_data` resources), spread round-robin over {backends} `gitstate serve` \
         processes; a proxy adds {} ms to every git request. Each phase starts all \
         {applies} Terraform processes at once ({}); git requests are counted at the \
         server and divided by {applies}; commits = those the phase added to the branch (writes \
         that landed), per run. Each side has its own repository, backends and working \
         directories; the sides take turns phase by phase, so all see the same machine: \
         the baseline build when `GITSTATE_BENCH_BASELINE` names one (each write races on its \
         own), this build with one write per push (`GITSTATE_GIT_WRITES_PER_PUSH=1`: a \
         process's writes queue and leave one at a time), and this build's default (waiting \
         writes leave together, up to 32 in one push).\n\n\
         | phase | gitstate | succeeded | total s | per run p50 s | max s | commits per run | git reqs per run | of which |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---|\n",
        DELAY.as_millis(),
        DELAY.as_millis(),
        version(&bin),
    ));
    for (label, side, p) in rows {
        let per = |n: usize| n as f64 / applies as f64;
        let of_which: Vec<String> = p
            .labels
            .iter()
            .map(|(l, n)| format!("{l} {:.1}", per(*n)))
            .collect();
        out.push_str(&format!(
            "| {label} | {side} | {}/{applies} | {:.1} | {:.1} | {:.1} | {:.2} | {:.1} | {} |\n",
            p.ok,
            p.total.as_secs_f64(),
            p.each.pct(0.5).as_secs_f64(),
            p.each.pct(1.0).as_secs_f64(),
            per(p.commits),
            per(p.requests),
            of_which.join(", ")
        ));
    }
    out.push('\n');
}
