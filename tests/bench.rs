//! `gitstate-bench`: gitstate against the seed tool's protocol (scripted with the git CLI, as in
//! the seed's README), both on the same loopback git server that counts requests; plus history
//! length, a 5 MB state, argon2 and concurrent writers; issue 15's sections (encrypted cold read,
//! growth per rewrite, 100 concurrent Terraform applies, the Lambda cold start), applies in the
//! Lambda shape (one process per apply, issue 27) and one apply of each kind in every shape next
//! to Terraform's S3 backend (`shapes`, issue 27) in `bench/`.
//! Prints a Markdown report, section by section.
//!
//! Build the binaries into one target directory, then run this one:
//!   cargo build --release -p gitstate-cli --bin gitstate -p gitstate-lambda \
//!     -p gitstate-tests --bin gitstate-bench
//!   target/release/gitstate-bench > BENCHMARKS.md   # or a comma-separated list of sections
//! `GITSTATE_BIN` / `GITSTATE_LAMBDA_BIN` override where the `gitstate` / `gitstate-lambda`
//! binaries are looked for (default: next to this one); `GITSTATE_BENCH_SMALL=1` shrinks the
//! encrypted, growth, applies, lambda-shape, shapes and lambda sections to try them in a debug
//! build (`GITSTATE_BENCH_MOST=N` caps lambda-shape's rows at N applies). The sections
//! `encrypted`, `shapes` and `lambda` need moto (tests/tools/.venv), `shapes` and `lambda`
//! cargo-lambda (tests/tools/deploy-venv), `applies` and `shapes` terraform on PATH.
//! `GITSTATE_BENCH_BASELINE=<an older gitstate binary>` (named by
//! `GITSTATE_BENCH_BASELINE_NAME`) adds that build as a side of the `applies`, `lambda-shape`
//! and `hostile` comparisons.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gitstate_core::password::PasswordVerifier as _;
use gitstate_tests::process::{ServeProcess, serve_env};
use gitstate_tests::{
    Client, GitServer, PushMode, git, git_output, hash_of, lock_info, realistic_repo, state_json,
};

#[path = "bench/applies.rs"]
mod applies;
#[path = "bench/encrypted.rs"]
mod encrypted;
#[path = "bench/hostile.rs"]
mod hostile;
#[path = "bench/lambda.rs"]
mod lambda;
#[path = "bench/lambda_shape.rs"]
mod lambda_shape;
#[path = "bench/proxy.rs"]
mod proxy;
#[path = "bench/shapes.rs"]
mod shapes;

const WARM_RUNS: usize = 20;
const COLD_RUNS: usize = 5;
const STATE: &str = "net/prod.tfstate";

/// `full`, or `small` when `GITSTATE_BENCH_SMALL` is set (to try a section quickly in a debug
/// build).
fn scale(full: usize, small: usize) -> usize {
    if std::env::var_os("GITSTATE_BENCH_SMALL").is_some() {
        small
    } else {
        full
    }
}

fn gitstate_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("GITSTATE_BIN") {
        return PathBuf::from(path);
    }
    let me = std::env::current_exe().expect("own path");
    let path = me.with_file_name("gitstate");
    assert!(
        path.is_file(),
        "{} not found: build it with `cargo build -p gitstate-cli --bin gitstate` (same profile) \
         or set GITSTATE_BIN",
        path.display()
    );
    path
}

/// A `gitstate serve` on `url` logging warnings only, its cache and log under `dir`.
async fn quiet_server(binary: &Path, dir: &Path, url: &str) -> ServeProcess {
    ServeProcess::start(binary, dir, serve_env(url, &[("RUST_LOG", "warn")])).await
}

/// Latencies and request counts of one operation.
#[derive(Default)]
struct Sample {
    times: Vec<Duration>,
    requests: Vec<usize>,
}

impl Sample {
    fn add(&mut self, time: Duration, requests: usize) {
        self.times.push(time);
        self.requests.push(requests);
    }

    fn pct(&self, p: f64) -> Duration {
        let mut t = self.times.clone();
        t.sort();
        if t.is_empty() {
            return Duration::ZERO;
        }
        let i = ((t.len() - 1) as f64 * p).round() as usize;
        t[i]
    }

    /// Requests per operation (the median, they hardly vary).
    fn reqs(&self) -> f64 {
        let mut r = self.requests.clone();
        r.sort_unstable();
        r.get(r.len() / 2).copied().unwrap_or_default() as f64
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

/// The seed tool's protocol, run with the git CLI in a working clone, command by command as its
/// README lists them (commands the seed ignores failures of are allowed to fail).
struct Seed {
    _tmp: tempfile::TempDir,
    path: PathBuf,
}

impl Seed {
    /// An empty repository with the remote added (only to create the branch the first time).
    fn new(remote: &str) -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let seed = Self {
            path: tmp.path().to_owned(),
            _tmp: tmp,
        };
        seed.must(&["init", "-q", "-b", "main"]);
        seed.must(&["remote", "add", "origin", remote]);
        seed.must(&["config", "pull.rebase", "false"]);
        seed
    }

    /// A fresh clone, as the seed tool starts from.
    fn clone_of(remote: &str) -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("repo");
        git(
            &["clone", "-q", remote, path.to_str().expect("utf-8 path")],
            None,
        );
        let seed = Self { _tmp: tmp, path };
        seed.must(&["config", "pull.rebase", "false"]);
        seed
    }

    fn run(&self, args: &[&str]) -> bool {
        git_output(args, Some(&self.path)).status.success()
    }

    fn must(&self, args: &[&str]) {
        let out = git_output(args, Some(&self.path));
        assert!(
            out.status.success(),
            "seed: git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn clean_checkout(&self) {
        self.run(&["reset", "--hard", "-q"]);
        self.run(&["checkout", "-q", "main"]);
    }

    fn write_file(&self, path: &str, content: &str) {
        let file = self.path.join(path);
        std::fs::create_dir_all(file.parent().expect("parent")).expect("dirs");
        std::fs::write(file, content).expect("write");
    }

    fn lock(&self, file: &str, lock: &str) {
        self.clean_checkout();
        self.run(&["branch", "-q", "-D", &format!("locks/{file}")]);
        self.run(&["pull", "-q", "origin", "main"]);
        self.must(&["checkout", "-q", "-b", &format!("locks/{file}")]);
        self.write_file(&format!("{file}.lock"), lock);
        self.must(&["add", &format!("{file}.lock")]);
        self.must(&["commit", "-q", "-m", &format!("Lock {file}")]);
        self.must(&["push", "-q", "origin", &format!("locks/{file}")]);
    }

    /// "Check existing lock": the lock file, if locked.
    fn check_lock(&self, file: &str) -> Option<String> {
        self.clean_checkout();
        self.run(&["branch", "-q", "-D", &format!("locks/{file}")]);
        self.must(&[
            "fetch",
            "-q",
            "--prune",
            "origin",
            "refs/heads/locks/*:refs/remotes/origin/locks/*",
        ]);
        if !self.run(&["checkout", "-q", &format!("locks/{file}")]) {
            return None;
        }
        std::fs::read_to_string(self.path.join(format!("{file}.lock"))).ok()
    }

    fn unlock(&self, file: &str) {
        assert!(self.check_lock(file).is_some(), "seed: not locked");
        self.must(&["push", "-q", "origin", "--delete", &format!("locks/{file}")]);
    }

    fn get(&self, file: &str) -> Option<String> {
        self.clean_checkout();
        self.run(&["pull", "-q", "origin", "main"]);
        std::fs::read_to_string(self.path.join(file)).ok()
    }

    fn write(&self, file: &str, state: &str) {
        assert!(self.check_lock(file).is_some(), "seed: not locked");
        self.clean_checkout();
        self.run(&["pull", "-q", "origin", "main"]);
        self.write_file(file, state);
        self.must(&["add", file]);
        self.must(&["commit", "-q", "-m", &format!("Update {file}")]);
        self.must(&["push", "-q", "origin", "main"]);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Lock,
    Get,
    Write,
    Unlock,
}

const OPS: [(Op, &str); 4] = [
    (Op::Lock, "LOCK"),
    (Op::Get, "GET"),
    (Op::Write, "write"),
    (Op::Unlock, "UNLOCK"),
];

/// Time one gitstate operation, counting the git requests it caused.
async fn gitstate_op(
    server: &GitServer,
    client: &Client,
    op: Op,
    id: &str,
    serial: u64,
) -> (Duration, usize) {
    server.take_requests();
    let started = Instant::now();
    let answer = match op {
        Op::Lock => client.lock(STATE, id).await,
        Op::Get => client.send("GET", &format!("/states/{STATE}"), None).await,
        Op::Write => {
            client
                .send(
                    "POST",
                    &format!("/states/{STATE}?ID={id}"),
                    Some(&state_json("bench", serial)),
                )
                .await
        }
        Op::Unlock => {
            client
                .send("DELETE", &format!("/locks/{STATE}"), Some(&lock_info(id)))
                .await
        }
    };
    let time = started.elapsed();
    assert_eq!(answer.status, 200, "gitstate: {}", answer.body);
    (time, server.take_requests().len())
}

fn seed_op(server: &GitServer, seed: &Seed, op: Op, id: &str, serial: u64) -> (Duration, usize) {
    server.take_requests();
    let started = Instant::now();
    match op {
        Op::Lock => seed.lock(STATE, &lock_info(id)),
        Op::Get => assert!(seed.get(STATE).is_some()),
        Op::Write => seed.write(STATE, &state_json("bench", serial)),
        Op::Unlock => seed.unlock(STATE),
    }
    let time = started.elapsed();
    (time, server.take_requests().len())
}

struct Row {
    op: &'static str,
    temp: &'static str,
    ours: Sample,
    seed: Sample,
}

async fn protocol_comparison(out: &mut String, binary: &Path) {
    let server = GitServer::start().await;
    let url = server.create_repo("cmp");
    // The seed's lock refs are gitstate's (the protocols are compatible): give it its own repo.
    server.create_repo("cmp-seed");
    let root = tempfile::tempdir().expect("tempdir");
    let mut rows: Vec<Row> = Vec::new();
    for (_, name) in OPS {
        for temp in ["warm", "cold"] {
            rows.push(Row {
                op: name,
                temp,
                ours: Sample::default(),
                seed: Sample::default(),
            });
        }
    }
    let mut cycle_ours = Sample::default();
    let mut cycle_seed = Sample::default();
    let row = |rows: &mut Vec<Row>, name: &str, temp: &str| -> usize {
        rows.iter()
            .position(|r| r.op == name && r.temp == temp)
            .expect("row")
    };
    let mut serial = 0;
    // Warm: one process / one clone, many cycles (the first cycle warms up and is not counted).
    let dir = root.path().join("warm");
    std::fs::create_dir_all(&dir).expect("dir");
    let process = quiet_server(binary, &dir, &url).await;
    let client = Client::new(&process.url);
    let seed = Seed::new(&server.url_with_credentials("cmp-seed"));
    // The seed needs the branch to exist; both then start with the state stored once.
    seed.must(&["commit", "-q", "--allow-empty", "-m", "init"]);
    seed.must(&["push", "-q", "origin", "main"]);
    for op in [Op::Lock, Op::Write, Op::Unlock] {
        gitstate_op(&server, &client, op, "gs-lock", 1).await;
        seed_op(&server, &seed, op, "seed", 1);
    }
    for run in 0..=WARM_RUNS {
        let (mut total_ours, mut total_seed) = ((Duration::ZERO, 0), (Duration::ZERO, 0));
        for (op, name) in OPS {
            serial += 1;
            let id = format!("bench-{serial}");
            let ours = gitstate_op(&server, &client, op, "gs-lock", serial).await;
            let theirs = seed_op(&server, &seed, op, &id, serial);
            total_ours = (total_ours.0 + ours.0, total_ours.1 + ours.1);
            total_seed = (total_seed.0 + theirs.0, total_seed.1 + theirs.1);
            if run > 0 {
                let i = row(&mut rows, name, "warm");
                rows[i].ours.add(ours.0, ours.1);
                rows[i].seed.add(theirs.0, theirs.1);
            }
        }
        if run > 0 {
            cycle_ours.add(total_ours.0, total_ours.1);
            cycle_seed.add(total_seed.0, total_seed.1);
        }
    }
    drop(process);
    // Cold: each operation from a fresh process with an empty cache / a fresh clone directory.
    for run in 0..COLD_RUNS {
        for (op, name) in OPS {
            serial += 1;
            // Set the stage with a warm process: lock held for write/unlock.
            if matches!(op, Op::Write | Op::Unlock) {
                assert_eq!(client_lock(binary, &url, root.path()).await, 200);
            }
            let dir = root.path().join(format!("cold-{run}-{name}"));
            std::fs::create_dir_all(&dir).expect("dir");
            let fresh = quiet_server(binary, &dir, &url).await;
            let fresh_client = Client::new(&fresh.url);
            // Authenticate once (argon2) outside the measurement.
            fresh_client
                .send("GET", "/locks/warm-up.tfstate", None)
                .await;
            let ours = gitstate_op(&server, &fresh_client, op, "gs-lock", serial).await;
            drop(fresh);
            if op == Op::Lock {
                // Leave it as found.
                let c = Client::new(&client_url(binary, &url, root.path()).await);
                c.send("DELETE", &format!("/locks/{STATE}"), None).await;
            }
            let remote = server.url_with_credentials("cmp-seed");
            if matches!(op, Op::Write | Op::Unlock) {
                Seed::clone_of(&remote).lock(STATE, &lock_info("seed-cold"));
            }
            // The seed has no cache: cold means its clone, counted in the operation.
            server.take_requests();
            let started = Instant::now();
            let fresh_seed = Seed::clone_of(&remote);
            let clone_requests = server.take_requests().len();
            let clone_time = started.elapsed();
            let theirs = seed_op(&server, &fresh_seed, op, "seed-cold", serial);
            let theirs = (theirs.0 + clone_time, theirs.1 + clone_requests);
            if matches!(op, Op::Lock | Op::Write) {
                fresh_seed.unlock(STATE);
            }
            server.take_requests();
            let i = row(&mut rows, name, "cold");
            rows[i].ours.add(ours.0, ours.1);
            rows[i].seed.add(theirs.0, theirs.1);
        }
    }
    out.push_str(
        "## gitstate vs the seed protocol (git CLI), same server\n\n\
         Requests are counted at the git server. `ratio` = seed / gitstate (higher is better for \
         gitstate). Warm: one process (one clone for the seed) after a first cycle; cold: a new \
         process with an empty cache (for the seed, which keeps no cache, a fresh `git clone` \
         included in the operation), argon2 paid before the \
         measurement.\n\n\
         | op | cache | gitstate reqs | seed reqs | gitstate p50 ms | p95 ms | seed p50 ms | p95 ms | p50 ratio |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in &rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1}x |\n",
            r.op,
            r.temp,
            r.ours.reqs(),
            r.seed.reqs(),
            ms(r.ours.pct(0.5)),
            ms(r.ours.pct(0.95)),
            ms(r.seed.pct(0.5)),
            ms(r.seed.pct(0.95)),
            r.seed.pct(0.5).as_secs_f64() / r.ours.pct(0.5).as_secs_f64().max(1e-9)
        ));
    }
    out.push_str(&format!(
        "| full apply cycle | warm | {} | {} | {} | {} | {} | {} | {:.1}x |\n\n",
        cycle_ours.reqs(),
        cycle_seed.reqs(),
        ms(cycle_ours.pct(0.5)),
        ms(cycle_ours.pct(0.95)),
        ms(cycle_seed.pct(0.5)),
        ms(cycle_seed.pct(0.95)),
        cycle_seed.pct(0.5).as_secs_f64() / cycle_ours.pct(0.5).as_secs_f64().max(1e-9)
    ));
}

/// The URL of a helper process on `url`, started on first use, that sets the stage for cold runs.
async fn client_url(binary: &Path, url: &str, root: &Path) -> String {
    static HELPER: tokio::sync::OnceCell<ServeProcess> = tokio::sync::OnceCell::const_new();
    let helper = HELPER
        .get_or_init(|| async {
            let dir = root.join("helper");
            std::fs::create_dir_all(&dir).expect("dir");
            quiet_server(binary, &dir, url).await
        })
        .await;
    helper.url.clone()
}

async fn client_lock(binary: &Path, url: &str, root: &Path) -> u16 {
    let c = Client::new(&client_url(binary, url, root).await);
    c.lock(STATE, "gs-lock").await.status
}

/// A repository of `states` states and `commits` commits, made with git fast-import.
fn big_repo(server: &GitServer, name: &str, states: usize, commits: usize) {
    server.create_repo(name);
    let dir = server.repo_dir(name);
    let mut stream = Vec::new();
    for c in 0..commits {
        let s = c % states;
        let content = state_json(&format!("lineage-{s}"), (c / states + 1) as u64);
        // About 2 KB of poorly compressible text per state, like a small real state.
        let pad: String = (0..64)
            .map(|i| {
                format!(
                    "{:016x}{:016x}",
                    hash64(c * 64 + i),
                    hash64(1_000_000 + c * 64 + i)
                )
            })
            .collect();
        let content = content.replacen(
            "\"resources\":[]",
            &format!("\"resources\":[],\"pad\":\"{pad}\""),
            1,
        );
        write!(
            stream,
            "commit refs/heads/main\ncommitter bench <b@x> {} +0000\ndata 10\nwrite {:04}\n",
            1_700_000_000 + c,
            s % 10_000
        )
        .expect("write");
        write!(
            stream,
            "M 100644 inline states/s{s:03}.tfstate\ndata {}\n{content}\n",
            content.len()
        )
        .expect("write");
    }
    gitstate_tests::fast_import(&dir, &stream, &[]);
    git(&["repack", "-adq"], Some(&dir));
}

/// A cheap deterministic scrambler (splitmix64).
fn hash64(x: usize) -> u64 {
    let mut z = (x as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                total += dir_bytes(&p);
            } else {
                total += e.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
    }
    total
}

async fn history_length(out: &mut String, binary: &Path) {
    let server = GitServer::start().await;
    big_repo(&server, "long", 500, 10_000);
    big_repo(&server, "short", 500, 500);
    big_repo(&server, "one", 1, 1);
    let root = tempfile::tempdir().expect("tempdir");
    out.push_str(
        "## Cold GET of one state vs history length\n\n\
         A fresh process with an empty cache reads one state. Bytes = the pack in its cache after \
         the read (what was fetched).\n\n\
         | repository | git reqs | p50 ms | max ms | bytes fetched |\n|---|---:|---:|---:|---:|\n",
    );
    for (name, label, state) in [
        ("long", "500 states x 10,000 commits", "states/s007.tfstate"),
        (
            "short",
            "500 states x 500 commits (head tree only)",
            "states/s007.tfstate",
        ),
        ("one", "1 state x 1 commit", "states/s000.tfstate"),
    ] {
        let url = server.url(name);
        let mut sample = Sample::default();
        let mut bytes = 0;
        for run in 0..COLD_RUNS {
            let dir = root.path().join(format!("{name}-{run}"));
            std::fs::create_dir_all(&dir).expect("dir");
            let p = quiet_server(binary, &dir, &url).await;
            let c = Client::new(&p.url);
            c.send("GET", "/locks/warm-up.tfstate", None).await;
            server.take_requests();
            let started = Instant::now();
            let got = c.send("GET", &format!("/states/{state}"), None).await;
            let time = started.elapsed();
            assert_eq!(got.status, 200, "{name}: {}", got.body);
            sample.add(time, server.take_requests().len());
            // The cache's packs: what the fetch brought.
            bytes = std::fs::read_dir(&p.cache)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| dir_bytes(&e.path().join("objects/pack")))
                .sum::<u64>();
        }
        out.push_str(&format!(
            "| {label} | {} | {} | {} | {} |\n",
            sample.reqs(),
            ms(sample.pct(0.5)),
            ms(sample.pct(1.0)),
            bytes
        ));
    }
    out.push('\n');
}

async fn partial_fetch(out: &mut String, binary: &Path) {
    let server = GitServer::start().await;
    let root = tempfile::tempdir().expect("tempdir");
    out.push_str(
        "## Cold read of one state among many: partial fetch\n\n\
         Realistic 48 KB states (60 resources each) in one commit, packed. A fresh `gitstate \
         serve` with an empty cache reads one state; bytes = every git answer's body (the \
         advertisement, the trees, the blob). `uploadpack.allowFilter` on: trees first \
         (`filter blob:none`), then the one blob by id; off: the whole tip at depth 1.\n\n\
         | states | filter | git reqs | bytes fetched | p50 ms | max ms |\n|---:|---|---:|---:|---:|---:|\n",
    );
    for states in [200, 2_000] {
        for filter in [true, false] {
            let name = format!("r{states}-{filter}");
            realistic_repo(&server, &name, states, filter);
            let url = server.url(&name);
            let mut sample = Sample::default();
            let mut bytes = 0;
            for run in 0..COLD_RUNS {
                let dir = root.path().join(format!("{name}-{run}"));
                std::fs::create_dir_all(&dir).expect("dir");
                let p = quiet_server(binary, &dir, &url).await;
                let c = Client::new(&p.url);
                c.send("GET", "/locks/warm-up.tfstate", None).await;
                server.take_requests();
                let started = Instant::now();
                let got = c.send("GET", "/states/team/s0007.tfstate", None).await;
                let time = started.elapsed();
                assert_eq!(got.status, 200, "{name}: {}", got.body);
                let seen = server.take_requests();
                bytes = seen.iter().map(|r| r.bytes).sum::<u64>();
                sample.add(time, seen.len());
            }
            out.push_str(&format!(
                "| {states} | {} | {} | {bytes} | {} | {} |\n",
                if filter { "on" } else { "off" },
                sample.reqs(),
                ms(sample.pct(0.5)),
                ms(sample.pct(1.0)),
            ));
        }
    }
    out.push('\n');
}

async fn large_state(out: &mut String, binary: &Path) {
    let server = GitServer::start().await;
    let url = server.create_repo("large");
    let root = tempfile::tempdir().expect("tempdir");
    let p = quiet_server(binary, root.path(), &url).await;
    let c = Client::new(&p.url);
    let filler: String = (0..5 * 1024 * 1024 / 64)
        .map(|i| format!("{i:0>63}\n"))
        .collect();
    let state = |serial: u64| {
        format!(
            r#"{{"version":4,"serial":{serial},"lineage":"big","outputs":{{}},"resources":[],"pad":{}}}"#,
            serde_json::to_string(&filler).expect("json")
        )
    };
    let rss_before = p.peak_rss_kib().unwrap_or_default();
    let (mut writes, mut gets) = (Sample::default(), Sample::default());
    assert_eq!(c.lock("big.tfstate", "big").await.status, 200);
    for serial in 1..=6u64 {
        let body = state(serial);
        server.take_requests();
        let started = Instant::now();
        let w = c
            .send("POST", "/states/big.tfstate?ID=big", Some(&body))
            .await;
        writes.add(started.elapsed(), server.take_requests().len());
        assert_eq!(w.status, 200, "{}", w.body);
        let started = Instant::now();
        let g = c.send("GET", "/states/big.tfstate", None).await;
        gets.add(started.elapsed(), server.take_requests().len());
        assert_eq!(g.body.len(), body.len());
    }
    // A cold read of it, from another process.
    let dir = root.path().join("cold");
    std::fs::create_dir_all(&dir).expect("dir");
    let cold = quiet_server(binary, &dir, &url).await;
    let cc = Client::new(&cold.url);
    cc.send("GET", "/locks/warm-up.tfstate", None).await;
    let started = Instant::now();
    let g = cc.send("GET", "/states/big.tfstate", None).await;
    let cold_get = started.elapsed();
    assert_eq!(g.status, 200);
    out.push_str(&format!(
        "## A 5 MB state\n\n\
         | operation | git reqs | p50 ms | max ms |\n|---|---:|---:|---:|\n\
         | write (locked, 6 serials) | {} | {} | {} |\n\
         | GET after own write (warm) | {} | {} | {} |\n\
         | GET cold (new process) | - | {} | - |\n\n\
         Peak RSS (VmHWM) of the `gitstate serve` process: {} KiB before, {} KiB after six 5 MB \
         writes and reads; the cold reader: {} KiB.\n\n",
        writes.reqs(),
        ms(writes.pct(0.5)),
        ms(writes.pct(1.0)),
        gets.reqs(),
        ms(gets.pct(0.5)),
        ms(gets.pct(1.0)),
        ms(cold_get),
        rss_before,
        p.peak_rss_kib().unwrap_or_default(),
        cold.peak_rss_kib().unwrap_or_default(),
    ));
}

async fn argon2_cost(out: &mut String, binary: &Path) {
    let hash = hash_of(gitstate_tests::TEST_PASSWORD);
    let started = Instant::now();
    for _ in 0..5 {
        assert!(
            gitstate_core::password::Argon2id
                .verify(&hash, gitstate_tests::TEST_PASSWORD.as_bytes())
        );
    }
    let direct = started.elapsed() / 5;
    let server = GitServer::start().await;
    let url = server.create_repo("argon");
    let mut first = Sample::default();
    let mut warm = Sample::default();
    for _ in 0..COLD_RUNS {
        let root = tempfile::tempdir().expect("tempdir");
        let p = quiet_server(binary, root.path(), &url).await;
        let c = Client::new(&p.url);
        c.send("GET", "/health", None).await;
        let started = Instant::now();
        c.send("GET", "/locks/x.tfstate", None).await;
        first.add(started.elapsed(), 0);
        for _ in 0..5 {
            let started = Instant::now();
            c.send("GET", "/locks/x.tfstate", None).await;
            warm.add(started.elapsed(), 0);
        }
    }
    out.push_str(&format!(
        "## argon2id\n\n\
         One verification in this process: {} ms. A request that needs it (`GET /locks/x`, 409, \
         one advertisement), first in a fresh process: p50 {} ms; the same request with the \
         credential remembered: p50 {} ms.\n\n",
        ms(direct),
        ms(first.pct(0.5)),
        ms(warm.pct(0.5)),
    ));
}

/// The warm apply cycle on a server with atomic push and on one without it
/// (`receive.advertiseAtomic=false`, as Azure DevOps and CodeCommit).
async fn push_modes(out: &mut String, binary: &Path) {
    out.push_str(&format!(
        "## Hosts with and without atomic push (warm, {WARM_RUNS} cycles)\n\n\
         The same warm apply cycle as above, gitstate only, on a server advertising `atomic` and \
         on one with `receive.advertiseAtomic=false`: a write under a lock is then the branch's \
         compare-and-swap alone, after the lock check in the same advertisement. The two \
         alternate cycle by cycle, so both see the same machine load.\n\n\
         | op | atomic reqs | p50 ms | p95 ms | without atomic reqs | p50 ms | p95 ms |\n\
         |---|---:|---:|---:|---:|---:|---:|\n"
    ));
    let root = tempfile::tempdir().expect("tempdir");
    let mut setups = Vec::new();
    for mode in [PushMode::Atomic, PushMode::NoAtomic] {
        let server = GitServer::start_in(mode).await;
        let url = server.create_repo("modes");
        let dir = root.path().join(format!("{mode:?}"));
        std::fs::create_dir_all(&dir).expect("dir");
        let process = quiet_server(binary, &dir, &url).await;
        let client = Client::new(&process.url);
        for op in [Op::Lock, Op::Write, Op::Unlock] {
            gitstate_op(&server, &client, op, "modes", 1).await;
        }
        let samples: Vec<Sample> = (0..=OPS.len()).map(|_| Sample::default()).collect();
        setups.push((server, process, client, samples));
    }
    for run in 0..=WARM_RUNS {
        for (server, _, client, samples) in &mut setups {
            let mut cycle = (Duration::ZERO, 0);
            for (i, (op, _)) in OPS.iter().enumerate() {
                let serial = (run * OPS.len() + i + 2) as u64;
                let (time, reqs) = gitstate_op(server, client, *op, "modes", serial).await;
                cycle = (cycle.0 + time, cycle.1 + reqs);
                if run > 0 {
                    samples[i].add(time, reqs);
                }
            }
            if run > 0 {
                samples[OPS.len()].add(cycle.0, cycle.1);
            }
        }
    }
    let names = OPS
        .iter()
        .map(|(_, name)| *name)
        .chain(["full apply cycle"]);
    for (i, name) in names.enumerate() {
        let (a, n) = (&setups[0].3[i], &setups[1].3[i]);
        out.push_str(&format!(
            "| {name} | {} | {} | {} | {} | {} | {} |\n",
            a.reqs(),
            ms(a.pct(0.5)),
            ms(a.pct(0.95)),
            n.reqs(),
            ms(n.pct(0.5)),
            ms(n.pct(0.95)),
        ));
    }
    out.push('\n');
}

/// Added to every git request by a proxy in front of the server, to stand in for the round trip
/// to a hosted remote.
const REMOTE_RTT: Duration = Duration::from_millis(40);

async fn concurrent_writers(out: &mut String, binary: &Path) {
    const ROUNDS: u64 = 10;
    out.push_str(&format!(
        "## 8 writers to distinct states (8 processes, {ROUNDS} rounds)\n\n\
         Each process writes its own state (no lock), so every push is a compare-and-swap on the \
         one branch. First on loopback (the 2-core machine runs the git server too), then with \
         {} ms added to every git request by a proxy, as the round trip to a hosted remote.\n\n\
         | remote | mode | total ms | per write ms | git reqs per write | concurrent / sequential |\n\
         |---|---|---:|---:|---:|---:|\n",
        REMOTE_RTT.as_millis()
    ));
    for rtt in [None, Some(REMOTE_RTT)] {
        let server = GitServer::start().await;
        server.create_repo("writers");
        let proxy = match rtt {
            Some(rtt) => Some(
                gitstate_tests::faults::FaultProxy::start(
                    server.address,
                    1,
                    1.0,
                    vec![gitstate_tests::faults::Fault::Slow(rtt)],
                )
                .await,
            ),
            None => None,
        };
        let url = match &proxy {
            Some(proxy) => proxy.url("writers"),
            None => format!("http://{}/writers.git", server.address),
        };
        let root = tempfile::tempdir().expect("tempdir");
        let mut procs = Vec::new();
        for i in 0..8 {
            let dir = root.path().join(format!("w{i}"));
            std::fs::create_dir_all(&dir).expect("dir");
            procs.push(quiet_server(binary, &dir, &url).await);
        }
        let clients: Vec<Client> = procs.iter().map(|p| Client::new(&p.url)).collect();
        for (i, c) in clients.iter().enumerate() {
            let w = c
                .send(
                    "POST",
                    &format!("/states/w{i}.tfstate"),
                    Some(&state_json("w", 1)),
                )
                .await;
            assert_eq!(w.status, 200, "{}", w.body);
        }
        server.take_requests();
        let started = Instant::now();
        for round in 0..ROUNDS {
            for (i, c) in clients.iter().enumerate() {
                let w = c
                    .send(
                        "POST",
                        &format!("/states/w{i}.tfstate"),
                        Some(&state_json("w", 2 + round)),
                    )
                    .await;
                assert_eq!(w.status, 200);
            }
        }
        let sequential = started.elapsed();
        let sequential_reqs = server.take_requests().len();
        let started = Instant::now();
        for round in 0..ROUNDS {
            let results = join_all(clients.iter().enumerate().map(|(i, c)| {
                let body = state_json("w", 100 + round);
                let path = format!("/states/w{i}.tfstate");
                async move { c.send("POST", &path, Some(&body)).await.status }
            }))
            .await;
            assert!(results.iter().all(|s| *s == 200), "{results:?}");
        }
        let concurrent = started.elapsed();
        let concurrent_reqs = server.take_requests().len();
        let pushes = 8 * ROUNDS as usize;
        let remote = match rtt {
            Some(rtt) => format!("+{} ms per request", rtt.as_millis()),
            None => "loopback".to_owned(),
        };
        out.push_str(&format!(
            "| {remote} | one writer at a time (8 x {ROUNDS}) | {} | {} | {:.2} | |\n\
             | {remote} | 8 concurrent ({ROUNDS} rounds) | {} | {} | {:.2} | {:.2} |\n",
            ms(sequential),
            ms(sequential / pushes as u32),
            sequential_reqs as f64 / pushes as f64,
            ms(concurrent),
            ms(concurrent / pushes as u32),
            concurrent_reqs as f64 / pushes as f64,
            concurrent.as_secs_f64() / sequential.as_secs_f64(),
        ));
    }
    out.push_str(
        "\nExtra requests under concurrency are compare-and-swap retries on the moved branch.\n\n",
    );
}

async fn join_all<F: std::future::Future<Output = u16>>(
    futures: impl Iterator<Item = F>,
) -> Vec<u16> {
    let handles: Vec<_> = futures.collect();
    let mut pinned: Vec<std::pin::Pin<Box<F>>> = handles.into_iter().map(Box::pin).collect();
    let mut results = vec![None; pinned.len()];
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in pinned.iter_mut().enumerate() {
            if results[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => results[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    results.into_iter().map(|r| r.unwrap_or_default()).collect()
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or_default().trim().to_owned())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_owned())
        })
        .and_then(|k| k.parse::<u64>().ok())
        .unwrap_or(0);
    let git_version = git(&["--version"], None);
    format!(
        "{cpu}, {cores} cores (a shared virtual machine), {} GiB RAM; {}; \
         git http-backend as CGI behind an in-process axum front on 127.0.0.1; gitstate {} \
         profile.",
        mem / 1024 / 1024,
        git_version.trim(),
        if cfg!(debug_assertions) {
            "dev (opt-level 0, dependencies opt-level 1)"
        } else {
            "release"
        }
    )
}

/// A state of `resources` resources whose attributes change with `serial`, a few at a time.
fn versioned_state(serial: u64, resources: usize) -> String {
    let resources: Vec<String> = (0..resources)
        .filter(|r| !(*r as u64 + serial).is_multiple_of(17))
        .map(|r| {
            let value = if (r as u64) % 10 == serial % 10 { serial } else { 0 };
            format!(
                r#"{{"mode":"managed","type":"null_resource","name":"r{r}","instances":[{{"attributes":{{"id":"{value}"}}}}]}}"#
            )
        })
        .collect();
    format!(
        r#"{{"version":4,"serial":{serial},"lineage":"lin-big","outputs":{{"o{}":{{"value":"{serial}"}}}},"resources":[{}]}}"#,
        serial % 3,
        resources.join(",")
    )
}

/// Lists a second apart: a list trusts an advertisement younger than that.
const APART: Duration = Duration::from_millis(1050);

/// Time `runs` GETs of `path` (after one to warm up), with the git requests each made.
async fn warm_gets(
    server: &GitServer,
    client: &Client,
    path: &str,
    runs: usize,
    spacing: Duration,
) -> Sample {
    let mut sample = Sample::default();
    let warm = client.send("GET", path, None).await;
    assert_eq!(warm.status, 200, "{path}: {}", warm.body);
    for _ in 0..runs {
        tokio::time::sleep(spacing).await;
        server.take_requests();
        let started = Instant::now();
        let got = client.send("GET", path, None).await;
        let time = started.elapsed();
        assert_eq!(got.status, 200, "{path}: {}", got.body);
        sample.add(time, server.take_requests().len());
    }
    sample
}

/// The state list and the console: 500 states written through gitstate (so with the index), a
/// state of 100 versions, and 500 states written by another tool (no index).
async fn console(out: &mut String, binary: &Path) {
    let server = GitServer::start().await;
    let url = server.create_repo("console");
    let root = tempfile::tempdir().expect("tempdir");
    let dir = |name: &str| {
        let dir = root.path().join(name);
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    };
    let p = quiet_server(binary, &dir("a"), &url).await;
    let c = Client::new(&p.url);
    let started = Instant::now();
    for i in 0..500 {
        let name = format!("/states/team-{:02}/s{i:03}.tfstate", i % 25);
        let body = state_json(&format!("lin-{i}"), 1);
        assert_eq!(c.send("PUT", &name, Some(&body)).await.status, 200);
    }
    let writes = started.elapsed();
    for serial in 1..=100 {
        let body = versioned_state(serial, 40);
        let got = c
            .send("PUT", "/states/big/history.tfstate", Some(&body))
            .await;
        assert_eq!(got.status, 200, "{}", got.body);
    }
    for i in 0..5 {
        c.lock(&format!("team-00/s{:03}.tfstate", i * 25), &format!("l{i}"))
            .await;
    }
    let list = warm_gets(&server, &c, "/states", WARM_RUNS, APART).await;
    let page = warm_gets(&server, &c, "/ui/", WARM_RUNS, APART).await;
    let state = warm_gets(
        &server,
        &c,
        "/ui/states/big/history.tfstate?per_page=100",
        WARM_RUNS,
        Duration::ZERO,
    )
    .await;
    let first = warm_gets(
        &server,
        &c,
        "/ui/states/big/history.tfstate",
        WARM_RUNS,
        Duration::ZERO,
    )
    .await;

    // A cold process: its first list (the access policy is given by the deployment here).
    let mut cold = Sample::default();
    for run in 0..COLD_RUNS {
        let q = quiet_server(binary, &dir(&format!("cold-{run}")), &url).await;
        let qc = Client::new(&q.url);
        server.take_requests();
        let started = Instant::now();
        let got = qc.send("GET", "/states", None).await;
        cold.add(started.elapsed(), server.take_requests().len());
        assert_eq!(got.status, 200);
    }

    // 500 states committed by another tool: no index, every entry worked out once.
    big_repo(&server, "foreign", 500, 500);
    let foreign_url = server.url("foreign");
    let f = quiet_server(binary, &dir("foreign"), &foreign_url).await;
    let fc = Client::new(&f.url);
    server.take_requests();
    let started = Instant::now();
    assert_eq!(fc.send("GET", "/states", None).await.status, 200);
    let foreign_first = (started.elapsed(), server.take_requests().len());
    let foreign = warm_gets(&server, &fc, "/states", WARM_RUNS, APART).await;

    let verdict = |d: Duration, target_ms: f64| {
        if d.as_secs_f64() * 1000.0 <= target_ms {
            "met"
        } else {
            "MISSED"
        }
    };
    out.push_str(&format!(
        "## The state list and the console\n\n\
         500 states written through `gitstate serve` ({:.1} s, index kept in the same commits), \
         5 of them locked, and one state with 100 versions of 40 resources; {WARM_RUNS} warm \
         runs each through `gitstate serve` (git requests per run in the second column; list \
         requests a second apart, so each makes its ref advertisement).\n\n\
         | request | git reqs | p50 ms | p95 ms | target |\n|---|---:|---:|---:|---|\n\
         | `GET /states`, 505 states, warm | {} | {} | {} | ≤ 100 ms: {} |\n\
         | `GET /ui/` (the list page), warm | {} | {} | {} | |\n\
         | `GET /ui/states/…?per_page=100` (100 versions with diffs), warm | {} | {} | {} | ≤ 200 ms: {} |\n\
         | `GET /ui/states/…` (first 20 versions), warm | {} | {} | {} | |\n\
         | `GET /states`, cold process, first request ({COLD_RUNS} runs) | {} | {} | {} | ≤ 3 requests: {} |\n\
         | `GET /states`, 500 states by another tool (no index), cold | {} | {} | | |\n\
         | `GET /states`, 500 states by another tool, warm | {} | {} | {} | |\n\n",
        writes.as_secs_f64(),
        list.reqs(), ms(list.pct(0.5)), ms(list.pct(0.95)), verdict(list.pct(0.5), 100.0),
        page.reqs(), ms(page.pct(0.5)), ms(page.pct(0.95)),
        state.reqs(), ms(state.pct(0.5)), ms(state.pct(0.95)), verdict(state.pct(0.5), 200.0),
        first.reqs(), ms(first.pct(0.5)), ms(first.pct(0.95)),
        cold.reqs(), ms(cold.pct(0.5)), ms(cold.pct(0.95)),
        if cold.requests.iter().all(|r| *r <= 3) { "met" } else { "MISSED" },
        foreign_first.1, ms(foreign_first.0),
        foreign.reqs(), ms(foreign.pct(0.5)), ms(foreign.pct(0.95)),
    ));
}

#[tokio::main]
async fn main() {
    let binary = gitstate_binary();
    let mut out = String::from("# Benchmarks\n\n");
    out.push_str(&format!("Machine: {}\n\n", machine()));
    let sections = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    let want = |s: &str| sections == "all" || sections.split(',').any(|x| x == s);
    if want("protocol") {
        protocol_comparison(&mut out, &binary).await;
        flush(&mut out);
    }
    if want("partial") {
        partial_fetch(&mut out, &binary).await;
        flush(&mut out);
    }
    if want("history") {
        history_length(&mut out, &binary).await;
        flush(&mut out);
    }
    if want("large") {
        large_state(&mut out, &binary).await;
        flush(&mut out);
    }
    if want("argon2") {
        argon2_cost(&mut out, &binary).await;
        flush(&mut out);
    }
    if want("writers") {
        concurrent_writers(&mut out, &binary).await;
        flush(&mut out);
    }
    if want("console") {
        console(&mut out, &binary).await;
        flush(&mut out);
    }
    if want("modes") {
        push_modes(&mut out, &binary).await;
        flush(&mut out);
    }
    if want("encrypted") {
        encrypted::cold_read_encrypted(&mut out, &binary).await;
        flush(&mut out);
    }
    if want("growth") {
        encrypted::growth(&mut out, &binary).await;
        flush(&mut out);
    }
    if want("applies") {
        applies::concurrent_applies(&mut out, &binary).await;
        flush(&mut out);
    }
    if want("hostile") {
        hostile::hostile(&mut out, &binary).await;
        flush(&mut out);
    }
    if want("lambda-shape") {
        lambda_shape::lambda_shape(&mut out, &binary).await;
        flush(&mut out);
    }
    if want("shapes") {
        shapes::shapes(&mut out, &binary).await;
        flush(&mut out);
    }
    if want("lambda") {
        let bench = std::env::current_exe().expect("own path");
        lambda::lambda_cold_start(&mut out, &bench, &binary).await;
        flush(&mut out);
    }
    flush(&mut out);
}

/// Print what the sections so far wrote (a later section's failure keeps the earlier ones).
fn flush(out: &mut String) {
    print!("{out}");
    let _ = std::io::stdout().flush();
    out.clear();
}
