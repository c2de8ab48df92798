//! Many concurrent applies in the Lambda shape: one `gitstate serve` per apply (a Lambda
//! container serves one request at a time, so no two writes ever wait in the same process and
//! group commit never applies), every git request delayed by a proxy.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gitstate_tests::faults::{Fault, FaultProxy};
use gitstate_tests::process::{ServeProcess, serve_env};
use gitstate_tests::{Client, GitServer, state_json};

use super::{Sample, scale};

/// Added to every git request (a hosted forge seen from AWS).
const DELAY: Duration = Duration::from_millis(50);

/// Concurrent applies, one row each.
const LEVELS: [usize; 6] = [1, 10, 25, 50, 100, 200];

/// A build to compare: its binary, its label, settings added to its environment.
type Build = (std::path::PathBuf, String, Vec<(String, String)>);

/// One side of the comparison: a build with its own repository and one process per apply.
struct Side {
    label: String,
    repo: String,
    /// Its processes do not fold after writes (`GITSTATE_FOLD_AFTER_WRITES=false`, as on
    /// Lambda): one `gitstate fold` after the applies stands for the template's schedule.
    scheduled: Option<ScheduledFold>,
    clients: Vec<Arc<Client>>,
    _procs: Vec<ServeProcess>,
    _proxy: FaultProxy,
}

/// State `i` of generation `generation`: generation 0 is the states every row updates again;
/// with `GITSTATE_BENCH_FIRST_UPDATES=1` each row has states of its own (see [`lambda_shape`]).
fn state(i: usize, generation: u64) -> String {
    if generation == 0 {
        format!("apps/s{i:03}.tfstate")
    } else {
        format!("apps/g{generation}/s{i:03}.tfstate")
    }
}

/// One apply on state `i` of `generation` through `client`: LOCK, GET, the write of `serial` (when `write`),
/// UNLOCK. Its wall time, or `None` when any step did not answer 200.
async fn apply(
    client: &Client,
    (i, generation): (usize, u64),
    id: &str,
    serial: u64,
    write: bool,
) -> Option<Duration> {
    let name = state(i, generation);
    let started = Instant::now();
    let ok = |status: u16, what: &str| {
        if status != 200 {
            eprintln!("{what} {name}: {status}");
        }
        status == 200
    };
    if !ok(client.lock(&name, id).await.status, "LOCK") {
        return None;
    }
    let got = client.get_state(&name).await.status;
    if got != 200 && got != 404 {
        ok(got, "GET");
        return None;
    }
    if write {
        let answer = client
            .write_locked(&name, id, &state_json(&format!("l{i}"), serial))
            .await;
        if !ok(answer.status, "write") {
            eprintln!("{}", answer.body);
            let _ = client.unlock(&name, id).await;
            return None;
        }
    }
    if !ok(client.unlock(&name, id).await.status, "UNLOCK") {
        return None;
    }
    Some(started.elapsed())
}

/// What one phase of `n` applies at once cost.
struct Phase {
    failed: usize,
    each: Sample,
    requests: usize,
    /// The requests by kind (`GET refs/upload-pack`, …), in name order.
    kinds: std::collections::BTreeMap<String, usize>,
    /// From the last answer until the branch had every write.
    lag: Duration,
    /// Processor time while the applies ran (until the last answer): the git server's
    /// processes, and the side's `gitstate serve` processes.
    cpu: (Duration, Duration),
}

/// Processor time (user and system) in `/proc/<pid>/stat`: the process's own (`own`), or
/// that of its children it has waited for (the git server's `git http-backend` and what they
/// ran, for the bench process).
fn cpu_of(pid: &str, own: bool) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15, cutime and cstime 16 and 17 (1-based, counting the
    // pid and the name); in clock ticks of 1/100 s (Linux's USER_HZ).
    let at = if own { 11 } else { 13 };
    let ticks = fields.get(at).copied().unwrap_or(0) + fields.get(at + 1).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// The side's serve processes' processor time, and the git server's so far.
fn cpu_now(side: &Side) -> (Duration, Duration) {
    let serve = side
        ._procs
        .iter()
        .map(|p| cpu_of(&p.pid.to_string(), true))
        .sum();
    (cpu_of("self", false), serve)
}

/// The ref that takes state `path`'s writes on branch `main` in a build with state refs:
/// `refs/gitstate/states/main/<sha1 of the path, lowercase hex>`.
fn state_ref(path: &str) -> String {
    use sha1::Digest as _;
    let digest = sha1::Sha1::digest(path.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("refs/gitstate/states/main/{hex}")
}

/// How many of the states `0..n` the branch does not have as their newest content yet: a state
/// ref whose file differs from the branch's (a write not folded). A build without state refs
/// has none.
fn unfolded(git: &GitServer, repo: &str, n: usize, generation: u64) -> usize {
    use std::io::Write as _;
    let mut query = String::new();
    for i in 0..n {
        let path = state(i, generation);
        query.push_str(&format!("{}:{path}\nmain:{path}\n", state_ref(&path)));
    }
    let mut child = std::process::Command::new("git")
        .args(["cat-file", "--batch-check=%(objectname)"])
        .current_dir(git.repo_dir(repo))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("git cat-file");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(query.as_bytes())
        .expect("query");
    let out = child.wait_with_output().expect("git cat-file");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .filter(|pair| !pair[0].ends_with("missing") && pair.get(1) != Some(&pair[0]))
        .count()
}

/// The scheduled fold of a side whose processes do not fold: the command, its warm cache.
struct ScheduledFold {
    binary: std::path::PathBuf,
    url: String,
    cache: std::path::PathBuf,
}

impl ScheduledFold {
    /// One `gitstate fold`, as the template's schedule runs it; again while another holds the
    /// lease. Whether it folded.
    async fn run(&self) -> bool {
        for _ in 0..20 {
            let out = tokio::process::Command::new(&self.binary)
                .args(["fold", "--repository", &self.url])
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .env("HOME", &self.cache)
                .env("GITSTATE_GIT_USERNAME", gitstate_tests::GIT_USER)
                .env("GITSTATE_GIT_TOKEN", gitstate_tests::GIT_TOKEN)
                .env("GITSTATE_CACHE_DIR", &self.cache)
                .env("RUST_LOG", "warn")
                .output()
                .await
                .expect("gitstate fold runs");
            if out.status.success() {
                return true;
            }
            eprintln!(
                "gitstate fold: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        false
    }
}

async fn phase(
    git: &GitServer,
    side: &Side,
    (n, generation): (usize, u64),
    serial: u64,
    write: bool,
) -> Phase {
    git.take_requests();
    let cpu_before = cpu_now(side);
    let results = all_at_once(
        side,
        (0..n).map(|i| (i, generation)),
        |i| format!("{}-{serial}-{i}", side.repo),
        serial,
        write,
    )
    .await;
    // Writes kept on refs of their own are folded into the branch after they are answered: the
    // phase ends (and its requests are counted) once the branch has every state's newest
    // content. The time from the last answer until then is the branch's lag.
    let done = Instant::now();
    let cpu_after = cpu_now(side);
    let cpu = (
        cpu_after.0.saturating_sub(cpu_before.0),
        cpu_after.1.saturating_sub(cpu_before.1),
    );
    if let Some(fold) = &side.scheduled
        && write
    {
        assert!(fold.run().await, "the scheduled fold of {}", side.label);
    }
    until_folded(git, &side.repo, (n, generation), done).await;
    let lag = done.elapsed();
    let taken = git.take_requests();
    // `GITSTATE_BENCH_WARM_READS=1`: after a phase, every process reads its state once (not
    // counted), so the next phase's GETs find the tip they know, whatever the fold moved: an
    // update phase and a no-op phase then differ by the write alone.
    if std::env::var_os("GITSTATE_BENCH_WARM_READS").is_some() {
        let reads: Vec<_> = (0..side.clients.len())
            .map(|i| {
                let client = side.clients[i].clone();
                tokio::spawn(async move { client.get_state(&state(i, generation)).await.status })
            })
            .collect();
        for read in reads {
            assert_eq!(read.await.expect("warm read"), 200, "a warm read");
        }
        git.take_requests();
    }
    let mut kinds = std::collections::BTreeMap::new();
    for request in &taken {
        *kinds.entry(request.label()).or_default() += 1;
    }
    let mut each = Sample::default();
    for t in results.iter().flatten() {
        each.add(*t, 0);
    }
    Phase {
        failed: results.iter().filter(|r| r.is_none()).count(),
        each,
        requests: taken.len(),
        kinds,
        lag,
        cpu,
    }
}

/// The applies on `states`, each through its own process, all started at once; their results
/// in order.
async fn all_at_once(
    side: &Side,
    states: impl Iterator<Item = (usize, u64)>,
    id: impl Fn(usize) -> String,
    serial: u64,
    write: bool,
) -> Vec<Option<Duration>> {
    let handles: Vec<_> = states
        .map(|state| {
            let (client, id) = (side.clients[state.0].clone(), id(state.0));
            tokio::spawn(async move { apply(&client, state, &id, serial, write).await })
        })
        .collect();
    let mut results = Vec::with_capacity(handles.len());
    for handle in handles {
        results.push(handle.await.expect("apply task"));
    }
    results
}

/// States `0..n` of `generation` created, ten at a time, each by its own process (which is then
/// warm); then, when `update`, each updated once the same way (its writes move onto its own ref)
/// and folded. Nothing of it is counted.
async fn prepare(git: &GitServer, side: &Side, n: usize, generation: u64, update: bool) {
    let serials: &[u64] = if update { &[1, 2] } else { &[1] };
    for &serial in serials {
        for chunk in (0..n).collect::<Vec<_>>().chunks(10) {
            let results = all_at_once(
                side,
                chunk.iter().map(|&i| (i, generation)),
                |i| format!("{}-prepare-{generation}-{serial}-{i}", side.repo),
                serial,
                true,
            )
            .await;
            assert!(results.iter().all(Option::is_some), "preparing the states");
        }
    }
    if let Some(fold) = &side.scheduled {
        assert!(fold.run().await, "the scheduled fold of {}", side.label);
    }
    until_folded(git, &side.repo, (n, generation), Instant::now()).await;
    git.take_requests();
}

/// Wait until the branch has every write to states `0..n` of `generation` (at most 120 s from
/// `since`).
async fn until_folded(git: &GitServer, repo: &str, (n, generation): (usize, u64), since: Instant) {
    while unfolded(git, repo, n, generation) > 0 && since.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Processor time per apply of an update phase and a no-op phase, in milliseconds.
fn per_apply(update: Duration, noop: Duration, n: usize) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0 / n as f64;
    format!("{:.0} / {:.0}", ms(update), ms(noop))
}

/// `1 … 200` concurrent applies in the Lambda shape at +50 ms per git request: update applies
/// (LOCK, GET, write, UNLOCK) next to no-op applies (LOCK, GET, UNLOCK, which share no
/// compare-and-swap point) in the same run; this build, and the baseline build when
/// `GITSTATE_BENCH_BASELINE` names one, in turns.
pub async fn lambda_shape(out: &mut String, binary: &std::path::Path) {
    // `GITSTATE_BENCH_MOST=N`: rows up to N concurrent applies only, to keep a run short.
    let most = std::env::var("GITSTATE_BENCH_MOST")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| scale(*LEVELS.last().unwrap_or(&1), 25));
    let levels: Vec<usize> = LEVELS.iter().copied().filter(|n| *n <= most).collect();
    let git = GitServer::start().await;
    let mut root = tempfile::tempdir().expect("tempdir");
    // `GITSTATE_BENCH_KEEP=1`: the processes' caches and logs are kept (their folder printed).
    if std::env::var_os("GITSTATE_BENCH_KEEP").is_some() {
        root.disable_cleanup(true);
        eprintln!(
            "lambda-shape: processes' caches and logs in {}",
            root.path().display()
        );
    }
    let mut builds: Vec<Build> = Vec::new();
    // `NAME=VALUE[,NAME=VALUE…]` from `var`.
    let pairs_of = |var: &str| -> Vec<(String, String)> {
        std::env::var(var)
            .unwrap_or_default()
            .split(',')
            .filter_map(|s| s.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    };
    if let Some(baseline) = std::env::var_os("GITSTATE_BENCH_BASELINE") {
        let name =
            std::env::var("GITSTATE_BENCH_BASELINE_NAME").unwrap_or_else(|_| "baseline".into());
        // `GITSTATE_BENCH_BASELINE_ENV=NAME=VALUE[,…]`: the baseline with those settings.
        builds.push((
            baseline.into(),
            name,
            pairs_of("GITSTATE_BENCH_BASELINE_ENV"),
        ));
    }
    // `GITSTATE_BENCH_SIDE_ONLY=1` leaves this build with its defaults out (fewer processes on
    // a small machine) when `GITSTATE_BENCH_SIDE_ENV` adds it with a setting.
    if std::env::var_os("GITSTATE_BENCH_SIDE_ONLY").is_none()
        || std::env::var_os("GITSTATE_BENCH_SIDE_ENV").is_none()
    {
        builds.push((binary.to_owned(), "this build".into(), Vec::new()));
    }
    // `GITSTATE_BENCH_SIDE_ENV=NAME=VALUE[,NAME=VALUE…]`: this build once more, with those
    // settings.
    if let Ok(settings) = std::env::var("GITSTATE_BENCH_SIDE_ENV") {
        let pairs = pairs_of("GITSTATE_BENCH_SIDE_ENV");
        builds.push((binary.to_owned(), format!("this build, {settings}"), pairs));
    }
    let mut sides = Vec::new();
    for (index, (bin, label, extra)) in builds.into_iter().enumerate() {
        let repo = format!("lambda-{index}");
        git.create_repo(&repo);
        // `GITSTATE_BENCH_GIT_CONFIG=KEY=VALUE[,KEY=VALUE…]`: the served repository's settings
        // changed from the tests' server (another host's housekeeping).
        if let Ok(config) = std::env::var("GITSTATE_BENCH_GIT_CONFIG") {
            for (key, value) in config.split(',').filter_map(|s| s.split_once('=')) {
                gitstate_tests::git(&["config", key, value], Some(&git.repo_dir(&repo)));
            }
        }
        let proxy = FaultProxy::start(git.address, 1, 1.0, vec![Fault::Slow(DELAY)]).await;
        let url = proxy.url(&repo);
        let mut procs = Vec::with_capacity(most);
        for p in 0..most {
            let dir = root.path().join(format!("{repo}-{p:03}"));
            std::fs::create_dir_all(&dir).expect("dir");
            let mut settings = vec![("RUST_LOG", "warn"), ("GITSTATE_ACCESS_LOG", "false")];
            settings.extend(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            let env = serve_env(&url, &settings);
            procs.push(ServeProcess::start(&bin, &dir, env).await);
        }
        let clients = procs
            .iter()
            .map(|p| Arc::new(Client::new(&p.url)))
            .collect();
        let scheduled = extra
            .iter()
            .any(|(k, v)| k == "GITSTATE_FOLD_AFTER_WRITES" && v == "false")
            .then(|| ScheduledFold {
                binary: bin.clone(),
                url: url.clone(),
                cache: root.path().join(format!("{repo}-fold-cache")),
            });
        sides.push(Side {
            label,
            repo,
            scheduled,
            clients,
            _procs: procs,
            _proxy: proxy,
        });
    }
    // `GITSTATE_BENCH_FIRST_UPDATES=1`: every row's update applies are their states' first
    // (each row has states of its own, created on the branch just before it and not counted),
    // so each moves its state onto a ref of its own. Otherwise every state is created and
    // updated once before the rows, which then measure updates of states already on their refs.
    let first_updates = std::env::var_os("GITSTATE_BENCH_FIRST_UPDATES").is_some();
    if !first_updates {
        for side in &sides {
            prepare(&git, side, most, 0, true).await;
        }
    }
    out.push_str(&format!(
        "## Concurrent applies in the Lambda shape, +{} ms per git request\n\n\
         One `gitstate serve` per apply (a Lambda container serves one request at a time, so \
         no two writes wait in the same process and group commit never applies), each apply on \
         its own state: an update apply is LOCK, GET, POST `?ID=`, UNLOCK; a no-op apply LOCK, \
         GET, UNLOCK (they share no compare-and-swap point). All applies of a row start at once; \
         every process is warm (it created its state and updated it once before, so a row's \
         updates are of states whose writes are on their own ref; with \
         `GITSTATE_BENCH_FIRST_UPDATES=1` each row has new states, created on the branch just \
         before it, so every update is its state's first and moves it onto its own ref). Git \
         requests counted at the \
         server, divided by the applies, until the branch has every write (a build that keeps \
         writes on refs of their own, `refs/gitstate/states/…`, folds them into the branch \
         later: branch lag = from the last answer until the branch's file of every state is \
         its state ref's; a build whose processes do not fold, `GITSTATE_FOLD_AFTER_WRITES=false` \
         as on Lambda, gets one `gitstate fold` after the applies, as the template's schedule \
         would run it, and its requests are counted too; the last column splits an update apply's \
         requests by kind, the fold's share included); times per apply. Processor time per apply, \
         from the start of a row's applies until the last answer (the scheduled fold not \
         included): the git server's (`git http-backend` and every git process it ran, the \
         auto gc included) and the side's `gitstate serve` processes'. Each \
         build has its own repository and processes; the builds take turns row by row. \
         `GITSTATE_BENCH_SIDE_ENV=NAME=VALUE` adds this build once more with that setting.\n\n\
         | applies | gitstate | failed | git reqs per apply | p50 s | p95 s | max s | no-op reqs | no-op p95 s | p95 / no-op p95 | git server CPU ms per apply, update / no-op | gitstate CPU ms per apply, update / no-op | branch lag s | update reqs per apply, by kind |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
        DELAY.as_millis()
    ));
    for (serial, &n) in (3..).zip(levels.iter()) {
        for side in &sides {
            let generation = if first_updates {
                prepare(&git, side, n, serial, false).await;
                serial
            } else {
                0
            };
            let update = phase(&git, side, (n, generation), serial, true).await;
            let noop = phase(&git, side, (n, generation), serial, false).await;
            let (p95, base) = (update.each.pct(0.95), noop.each.pct(0.95));
            out.push_str(&format!(
                "| {n} | {} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.1} | {:.2} | {:.2} | {} | {} | {:.2} | {} |\n",
                side.label,
                update.failed,
                update.requests as f64 / n as f64,
                update.each.pct(0.5).as_secs_f64(),
                p95.as_secs_f64(),
                update.each.pct(1.0).as_secs_f64(),
                noop.requests as f64 / n as f64,
                base.as_secs_f64(),
                p95.as_secs_f64() / base.as_secs_f64().max(f64::EPSILON),
                per_apply(update.cpu.0, noop.cpu.0, n),
                per_apply(update.cpu.1, noop.cpu.1, n),
                update.lag.as_secs_f64(),
                update
                    .kinds
                    .iter()
                    .map(|(kind, count)| format!("{kind} {:.2}", *count as f64 / n as f64))
                    .collect::<Vec<_>>()
                    .join(", "),
            ));
        }
    }
    out.push('\n');
}
