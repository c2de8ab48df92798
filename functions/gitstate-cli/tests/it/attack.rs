//! A bounded attack on the `gitstate` binary over loopback, plain and over TLS, with its default
//! connection settings: malformed `Authorization` headers from thousands of 127/8 addresses,
//! wrong passwords for the administrator's name from many addresses and slow heads (after the
//! TLS handshake on the TLS listener), all at once (gitstate_tests::attack); meanwhile the real
//! administrator logs in for the first time from a clean address and a real `terraform apply`
//! runs. Both must succeed, and every part of the attack must be refused as designed. The
//! attack stops by itself (bounded in count and in time); the long run is the benchmark's
//! `hostile` section.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gitstate_tests::attack::{self, Plan, Progress, Target};
use gitstate_tests::hosts::TestCa;
use gitstate_tests::process::{ServeProcess, serve_env};
use gitstate_tests::{GitServer, TEST_PASSWORD, TEST_USER, init_tracing};

/// The binary's default header read timeout (GITSTATE_HEADER_TIMEOUT_SECS).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// init + apply of a one-resource configuration through `base`, as the administrator.
fn terraform_apply(work: &Path, base: &str, ca: Option<&str>) -> (bool, String) {
    std::fs::write(
        work.join("main.tf"),
        gitstate_tests::terraform_backend_block(base, "attack/app.tfstate", "")
            + "resource \"terraform_data\" \"x\" {\n  input = \"under attack\"\n}\n",
    )
    .expect("main.tf");
    std::fs::write(work.join("empty.tfrc"), "").expect("tfrc");
    let mut all = String::new();
    for args in [
        &["init", "-input=false", "-reconfigure"][..],
        &["apply", "-auto-approve", "-input=false"][..],
    ] {
        let mut command = Command::new("terraform");
        command
            .args(args)
            .current_dir(work)
            .env("TF_CLI_CONFIG_FILE", work.join("empty.tfrc"))
            .env("CHECKPOINT_DISABLE", "1")
            .env("TF_HTTP_USERNAME", TEST_USER)
            .env("TF_HTTP_PASSWORD", TEST_PASSWORD)
            .env("TF_HTTP_RETRY_MAX", "0");
        if let Some(ca) = ca {
            command.env("TF_HTTP_CLIENT_CA_CERTIFICATE_PEM", ca);
        }
        let out = command.output().expect("terraform is on PATH");
        all += &String::from_utf8_lossy(&out.stdout);
        all += &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            return (false, all);
        }
    }
    (true, all)
}

async fn attacked(tls: bool) {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("state");
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = tls.then(|| TestCa::new("attack"));
    let mut extra = vec![("RUST_LOG", "warn".to_owned())];
    if let Some(ca) = &ca {
        let (cert, key) = ca.issue("127.0.0.1").write_to(dir.path());
        extra.push(("GITSTATE_TLS_CERT", cert.display().to_string()));
        extra.push(("GITSTATE_TLS_KEY", key.display().to_string()));
    }
    let extra: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let served = ServeProcess::start(
        Path::new(crate::GITSTATE),
        dir.path(),
        serve_env(&url, &extra),
    )
    .await;
    let address = served
        .url
        .rsplit_once("://")
        .and_then(|(_, a)| a.parse().ok())
        .expect("the listener's address");
    let target = match &ca {
        None => Target::plain(address),
        Some(ca) => Target::tls(address, &ca.pem()),
    };
    let plan = Plan {
        // Each TLS request pays a handshake: fewer of them.
        malformed: if tls { 600 } else { 2_000 },
        guesses: 200,
        guess_addresses: 20,
        user: TEST_USER.to_owned(),
        slow: 200,
        workers: 32,
        spread: Duration::from_secs(6),
        slow_wait: HEADER_TIMEOUT + Duration::from_secs(15),
        seed: 24,
    };
    let progress = Arc::new(Progress::default());
    let attack = {
        let (target, plan, progress) = (target.clone(), plan.clone(), progress.clone());
        tokio::spawn(async move { attack::run(&target, &plan, progress).await })
    };
    assert!(
        attack::slow_heads_open(&progress, plan.slow, Duration::from_secs(20)).await,
        "only {} of {} slow heads got through",
        progress.slow_open.load(Ordering::Relaxed),
        plan.slow
    );

    // A real terraform apply from 127.0.0.1 (no failures), started as the flood starts.
    let flood_before = progress.flood_done.load(Ordering::Relaxed);
    let work = tempfile::tempdir().expect("tempdir");
    let (base, ca_pem) = (served.url.clone(), ca.as_ref().map(TestCa::pem));
    let work_path = work.path().to_owned();
    let terraform =
        tokio::task::spawn_blocking(move || terraform_apply(&work_path, &base, ca_pem.as_deref()));

    // Meanwhile the administrator, never seen before by this process, from the same address.
    let mut http = reqwest::Client::builder().timeout(Duration::from_secs(30));
    if let Some(ca) = &ca {
        http = http
            .add_root_certificate(reqwest::Certificate::from_pem(ca.pem().as_bytes()).expect("CA"));
    }
    let http = http.build().expect("client");
    let flood_at_login = progress.flood_done.load(Ordering::Relaxed);
    let slow_at_login = progress.slow_open.load(Ordering::Relaxed);
    let started = Instant::now();
    let login = http
        .get(format!("{}/states", served.url))
        .basic_auth(TEST_USER, Some(TEST_PASSWORD))
        .send()
        .await
        .expect("the administrator's request is answered");
    let login_time = started.elapsed();
    assert_eq!(login.status(), 200, "the administrator is let in");
    assert!(
        flood_at_login < plan.malformed + plan.guesses && slow_at_login == plan.slow,
        "the login ran during the attack ({flood_at_login} flood requests done, \
         {slow_at_login} slow heads open)"
    );

    let (applied, output) = terraform.await.expect("terraform ran");
    let flood_during = progress.flood_done.load(Ordering::Relaxed) - flood_before;
    assert!(applied, "terraform apply under attack: {output}");
    assert!(flood_during > 0, "the flood went on while terraform ran");

    let report = attack.await.expect("the attack ends by itself");
    let (earliest, latest) = (
        report
            .slow_closed_after
            .iter()
            .min()
            .copied()
            .unwrap_or_default(),
        report
            .slow_closed_after
            .iter()
            .max()
            .copied()
            .unwrap_or_default(),
    );
    eprintln!(
        "attack ({}): malformed {:?}, guesses {:?}, {} slow heads sent, {} closed by the server \
         after {earliest:.1?}..{latest:.1?} (answers {:?}); flood {:.0} req/s over {:.1?}; \
         login {:.0} ms; {flood_during} flood requests during terraform; peak RSS {:?} KiB",
        if tls { "TLS" } else { "plain" },
        report.malformed,
        report.guesses,
        report.slow_sent,
        report.slow_closed_after.len(),
        report.slow_answered,
        report.flood_rate(),
        report.flood_time,
        login_time.as_secs_f64() * 1000.0,
        served.peak_rss_kib()
    );
    // Each malformed header came from its own address: refused 401, never 429 (no table fails
    // closed), never unanswered (no cap reached).
    assert_eq!(
        report.malformed.keys().copied().collect::<Vec<_>>(),
        [401],
        "malformed: {:?}",
        report.malformed
    );
    assert_eq!(report.malformed.values().sum::<usize>(), plan.malformed);
    // Wrong passwords: refused, then throttled per (name, address); never let in.
    assert!(
        report
            .guesses
            .keys()
            .all(|status| [401, 429].contains(status)),
        "guesses: {:?}",
        report.guesses
    );
    assert!(
        report.guesses.get(&429).copied().unwrap_or(0) >= plan.guess_addresses,
        "the guessing addresses are throttled: {:?}",
        report.guesses
    );
    // Slow heads: all held open until the header timeout, then closed by the server.
    assert_eq!(report.slow_sent, plan.slow);
    assert_eq!(
        report.slow_closed_after.len(),
        plan.slow,
        "every slow head closed by the server within {:?}",
        plan.slow_wait
    );
    assert!(
        earliest >= HEADER_TIMEOUT / 2 && latest <= HEADER_TIMEOUT + Duration::from_secs(10),
        "slow heads closed between {earliest:?} and {latest:?}"
    );
    assert!(
        report.slow_answered.keys().all(|s| *s == 408),
        "{:?}",
        report.slow_answered
    );

    // The state terraform wrote is in the repository, and the server still answers.
    let state = http
        .get(format!("{}/states/attack/app.tfstate", served.url))
        .basic_auth(TEST_USER, Some(TEST_PASSWORD))
        .send()
        .await
        .expect("answered");
    assert_eq!(state.status(), 200);
    let body = state.text().await.expect("body");
    assert!(body.contains("under attack"), "{body}");
    let log = served.log_text();
    assert!(!log.contains(TEST_PASSWORD), "the password is in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_listener_serves_the_administrator_and_terraform_through_the_attack() {
    attacked(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_listener_serves_the_administrator_and_terraform_through_the_attack() {
    attacked(true).await;
}
