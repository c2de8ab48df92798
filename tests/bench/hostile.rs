//! Issue 24's section: `gitstate serve` under the attack mix of gitstate_tests::attack
//! (malformed `Authorization` headers from thousands of 127/8 addresses, wrong passwords for the
//! administrator's name, slow heads), side by side with the same process idle, for this build
//! and, when `GITSTATE_BENCH_BASELINE` names one, an older build.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gitstate_tests::attack::{self, Plan, Progress, Target};
use gitstate_tests::process::{ServeProcess, serve_env};
use gitstate_tests::{GitServer, TEST_PASSWORD, TEST_USER, access_file, state_json};

use crate::{Sample, ms, scale};

/// A second user, who logs in for the first time while the attack runs.
const LATECOMER: (&str, &str) = ("ops", "ops-Pa55word-first-login-under-attack");
const LEGIT_IDLE: usize = 200;

/// One side's figures.
struct Side {
    name: String,
    idle: Sample,
    idle_rss: u64,
    attacked: Sample,
    refused: usize,
    latecomer: String,
    report: attack::Report,
    plan: Plan,
    rss: u64,
}

pub async fn hostile(out: &mut String, binary: &Path) {
    let mut builds = vec![(binary.to_owned(), "this build".to_owned())];
    if let Some(baseline) = std::env::var_os("GITSTATE_BENCH_BASELINE") {
        let name =
            std::env::var("GITSTATE_BENCH_BASELINE_NAME").unwrap_or_else(|_| "baseline".into());
        builds.push((PathBuf::from(baseline), name));
    }
    let plan = Plan {
        malformed: scale(12_000, 2_000),
        guesses: scale(500, 200),
        guess_addresses: 50,
        user: TEST_USER.to_owned(),
        slow: scale(500, 200),
        workers: 64,
        spread: Duration::ZERO,
        slow_wait: Duration::from_secs(15),
        seed: 24,
    };
    let mut sides = Vec::new();
    for (build, name) in builds {
        sides.push(side(&build, name, plan.clone()).await);
    }
    out.push_str(&format!(
        "## Under attack (issue 24)\n\n\
         One `gitstate serve` per build, default settings, over the loopback git server. Idle: \
         the administrator (credential already checked once) reads a state {LEGIT_IDLE} times. \
         Attack, all at once, each connection from its own 127/8 address: {} requests with a \
         malformed `Authorization` header (one per address), {} wrong passwords for the \
         administrator's name from {} addresses, {} slow heads (half a request head, then \
         nothing); {} flood requests in flight. Meanwhile the administrator reads the state in \
         a loop from 127.0.0.1 (never failed), and when 90 % of the flood is done a second user \
         logs in for the first time. Attack req/s: flood answers (any status) per second. Slow \
         heads closed: by the server within {} s. Peak RSS: `VmHWM` of the serving process \
         after the phase.\n\n\
         | build | phase | attack req/s | legit requests | legit refused | legit p50 ms | p99 ms | \
         first login under attack | malformed answers | guess answers | slow heads closed | peak RSS KiB |\n\
         |---|---|---:|---:|---:|---:|---:|---|---|---|---:|---:|\n",
        plan.malformed,
        plan.guesses,
        plan.guess_addresses,
        plan.slow,
        plan.workers,
        plan.slow_wait.as_secs(),
    ));
    for s in &sides {
        out.push_str(&format!(
            "| {} | idle | - | {} | 0 | {} | {} | - | - | - | - | {} |\n",
            s.name,
            s.idle.times.len(),
            ms(s.idle.pct(0.5)),
            ms(s.idle.pct(0.99)),
            s.idle_rss,
        ));
        out.push_str(&format!(
            "| {} | attack | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} of {} ({}) | {} |\n",
            s.name,
            s.report.flood_rate(),
            s.attacked.times.len(),
            s.refused,
            ms(s.attacked.pct(0.5)),
            ms(s.attacked.pct(0.99)),
            s.latecomer,
            tally(&s.report.malformed),
            tally(&s.report.guesses),
            s.report.slow_closed_after.len(),
            s.plan.slow,
            match (
                s.report.slow_closed_after.iter().min(),
                s.report.slow_closed_after.iter().max()
            ) {
                (Some(a), Some(b)) =>
                    format!("after {:.1}-{:.1} s", a.as_secs_f64(), b.as_secs_f64()),
                _ => "none".to_owned(),
            },
            s.rss,
        ));
    }
    out.push('\n');
}

/// `401: 11990, 429: 10` (status 0: no answer).
fn tally(counts: &std::collections::BTreeMap<u16, usize>) -> String {
    counts
        .iter()
        .map(|(status, n)| format!("{status}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

async fn side(binary: &Path, name: String, plan: Plan) -> Side {
    let server = GitServer::start().await;
    let url = server.create_repo("hostile");
    let dir = tempfile::tempdir().expect("tempdir");
    let access = access_file(&[
        (TEST_USER, TEST_PASSWORD, &["admin:*"]),
        (LATECOMER.0, LATECOMER.1, &["read:*"]),
    ]);
    let served = ServeProcess::start(
        binary,
        dir.path(),
        serve_env(
            &url,
            &[
                ("RUST_LOG", "error"),
                ("GITSTATE_ACCESS_LOG", "false"),
                ("GITSTATE_ACCESS", &access),
            ],
        ),
    )
    .await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let read = || {
        http.get(format!("{}/states/bench.tfstate", served.url))
            .basic_auth(TEST_USER, Some(TEST_PASSWORD))
            .send()
    };
    let write = http
        .post(format!("{}/states/bench.tfstate", served.url))
        .basic_auth(TEST_USER, Some(TEST_PASSWORD))
        .body(state_json("hostile", 1))
        .send()
        .await
        .expect("written");
    assert_eq!(write.status(), 200, "{name}: the first write");
    let mut idle = Sample::default();
    for _ in 0..LEGIT_IDLE {
        let started = Instant::now();
        let answer = read().await.expect("answered");
        idle.add(started.elapsed(), 0);
        assert_eq!(answer.status(), 200, "{name}: idle read");
    }
    let idle_rss = served.peak_rss_kib().unwrap_or_default();

    let address = served
        .url
        .rsplit_once("://")
        .and_then(|(_, a)| a.parse().ok())
        .expect("the listener's address");
    let progress = Arc::new(Progress::default());
    let attack = {
        let (plan, progress) = (plan.clone(), progress.clone());
        tokio::spawn(async move { attack::run(&Target::plain(address), &plan, progress).await })
    };
    attack::slow_heads_open(&progress, plan.slow, Duration::from_secs(30)).await;
    let total = plan.malformed + plan.guesses;
    let (mut attacked, mut refused, mut latecomer) = (Sample::default(), 0, None);
    while progress.flood_done.load(Ordering::Relaxed) < total && !attack.is_finished() {
        let started = Instant::now();
        let status = read().await.map(|r| r.status().as_u16()).unwrap_or(0);
        attacked.add(started.elapsed(), 0);
        if status != 200 {
            refused += 1;
        }
        if latecomer.is_none() && progress.flood_done.load(Ordering::Relaxed) * 10 >= total * 9 {
            let started = Instant::now();
            let answer = http
                .get(format!("{}/states/bench.tfstate", served.url))
                .basic_auth(LATECOMER.0, Some(LATECOMER.1))
                .send()
                .await;
            latecomer = Some(format!(
                "{} in {} ms",
                answer.map(|r| r.status().as_u16()).unwrap_or(0),
                ms(started.elapsed())
            ));
        }
    }
    let report = attack.await.expect("the attack ends by itself");
    let rss = served.peak_rss_kib().unwrap_or_default();
    Side {
        name,
        idle,
        idle_rss,
        attacked,
        refused,
        latecomer: latecomer.unwrap_or_else(|| "not reached".to_owned()),
        report,
        plan,
        rss,
    }
}
