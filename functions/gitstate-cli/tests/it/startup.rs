//! Start-up says what is wrong before the first request: `gitstate config` over generated
//! combinations of listener, TLS certificate (valid, expired, not yet valid) and store (hosted
//! with users, without users, unreachable; embedded present or absent) reports each problem and
//! ends with "ok" only when all hold; the listener's fix parses; `serve` on a hosted repository
//! without users says how to make the first administrator; the access policy line names where
//! users came from; `serve` and `run --new-store` with a hosted repository's credentials but no
//! repository refuse to start a new, empty store.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use gitstate_tests::{GIT_TOKEN, GIT_USER, GitServer, access_file, hash_of};
use rand::{Rng, SeedableRng};

const PASSWORD: &str = "startup-Pa55word-for-the-suite";

/// A self-signed certificate valid from `from` to `until` days from now, by Python's
/// `cryptography` (OpenSSL 3.0's command line cannot date a certificate in the past).
fn certificate(dir: &Path, name: &str, from: i64, until: i64) {
    let script = format!(
        r#"
import datetime
from cryptography import x509
from cryptography.x509.oid import NameOID
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
key = ec.generate_private_key(ec.SECP256R1())
name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
now = datetime.datetime.now(datetime.timezone.utc)
cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
    .public_key(key.public_key()).serial_number(x509.random_serial_number())
    .not_valid_before(now + datetime.timedelta(days={from}))
    .not_valid_after(now + datetime.timedelta(days={until}))
    .sign(key, hashes.SHA256()))
open("{name}.pem", "wb").write(cert.public_bytes(serialization.Encoding.PEM))
open("{name}.key", "wb").write(key.private_bytes(serialization.Encoding.PEM,
    serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
"#
    );
    let out = Command::new(gitstate_tests::tool("python"))
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listen {
    Loopback,
    Exposed,
    ExposedInsecure,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tls {
    None,
    Valid,
    Expired,
    NotYetValid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    HostedWithUsers,
    HostedNoUsers,
    Unreachable,
    EmbeddedPresent,
    EmbeddedAbsent,
}

/// `gitstate run --state team/app.tfstate -- true` in `dir`: whether the program starts.
fn run_true(dir: &Path, env: &[(&str, String)]) -> Output {
    let args = [
        "run",
        "--state",
        "team/app.tfstate",
        "--workdir",
        ".",
        "--",
        "true",
    ];
    gitstate(dir, &args, env)
}

fn gitstate(dir: &Path, args: &[&str], env: &[(&str, String)]) -> Output {
    let mut command = Command::new(crate::GITSTATE);
    command
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir)
        .env("RUST_LOG", "info")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null());
    command.output().expect("gitstate runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_reports_every_start_up_problem_and_ok_when_all_hold() {
    let seed = std::env::var("STARTUP_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("STARTUP_TEST_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let server = GitServer::start().await;
    let repository = server.create_repo("startup");
    let pki = tempfile::tempdir().expect("tempdir");
    certificate(pki.path(), "valid", -1, 300);
    certificate(pki.path(), "expired", -30, -1);
    certificate(pki.path(), "future", 2, 300);
    // The embedded store made once by `serve`'s first run is reused by the "present" cases.
    let embedded = tempfile::tempdir().expect("tempdir");
    {
        use std::io::BufRead as _;
        let port = gitstate_tests::free_port();
        let mut child = Command::new(crate::GITSTATE)
            .arg("serve")
            .current_dir(embedded.path())
            .env_remove("GITSTATE_REPOSITORY")
            .env("GITSTATE_LISTEN", format!("127.0.0.1:{port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve");
        // Its first run has made the administrator once it prints the password.
        let stdout = child.stdout.take().expect("stdout");
        let made = std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("TF_HTTP_PASSWORD="));
        let _ = child.kill();
        let _ = child.wait();
        assert!(made, "serve made no administrator");
    }
    assert!(embedded.path().join(".gitstate/repo.git").exists());

    let mut combinations = Vec::new();
    for listen in [Listen::Loopback, Listen::Exposed, Listen::ExposedInsecure] {
        for tls in [Tls::None, Tls::Valid, Tls::Expired, Tls::NotYetValid] {
            for store in [
                Store::HostedWithUsers,
                Store::HostedNoUsers,
                Store::Unreachable,
                Store::EmbeddedPresent,
                Store::EmbeddedAbsent,
            ] {
                combinations.push((listen, tls, store));
            }
        }
    }
    // Every store and every certificate once with a sound listener, then a random sample.
    let mut cases: Vec<_> = combinations
        .iter()
        .copied()
        .filter(|(l, t, _)| *l == Listen::Loopback && (*t == Tls::None || *t == Tls::Valid))
        .collect();
    cases.extend([
        (Listen::Loopback, Tls::Expired, Store::HostedWithUsers),
        (Listen::Loopback, Tls::NotYetValid, Store::HostedWithUsers),
        (Listen::Exposed, Tls::None, Store::HostedWithUsers),
        (Listen::ExposedInsecure, Tls::None, Store::HostedWithUsers),
    ]);
    for _ in 0..12 {
        cases.push(combinations[rng.random_range(0..combinations.len())]);
    }
    let empty = tempfile::tempdir().expect("tempdir");
    for (listen, tls, store) in &cases {
        let mut env: Vec<(&str, String)> = vec![(
            "GITSTATE_LISTEN",
            match listen {
                Listen::Loopback => "127.0.0.1:8080".to_owned(),
                _ => "192.0.2.1:8080".to_owned(),
            },
        )];
        if *listen == Listen::ExposedInsecure {
            env.push(("GITSTATE_INSECURE_LISTEN", "true".into()));
        }
        let cert = match tls {
            Tls::None => None,
            Tls::Valid => Some("valid"),
            Tls::Expired => Some("expired"),
            Tls::NotYetValid => Some("future"),
        };
        if let Some(cert) = cert {
            let path = |ext: &str| {
                pki.path()
                    .join(format!("{cert}.{ext}"))
                    .display()
                    .to_string()
            };
            env.push(("GITSTATE_TLS_CERT", path("pem")));
            env.push(("GITSTATE_TLS_KEY", path("key")));
        }
        let dir = match store {
            Store::EmbeddedPresent => embedded.path(),
            _ => empty.path(),
        };
        match store {
            Store::HostedWithUsers | Store::HostedNoUsers | Store::Unreachable => {
                let url = if *store == Store::Unreachable {
                    format!(
                        "http://127.0.0.1:{}/startup.git",
                        gitstate_tests::free_port()
                    )
                } else {
                    repository.clone()
                };
                env.push(("GITSTATE_REPOSITORY", url));
                env.push(("GITSTATE_GIT_USERNAME", GIT_USER.into()));
                env.push(("GITSTATE_GIT_TOKEN", GIT_TOKEN.into()));
                env.push(("GITSTATE_GIT_TIMEOUT_SECS", "3".into()));
                if *store != Store::HostedNoUsers {
                    env.push((
                        "GITSTATE_ACCESS",
                        access_file(&[("alice", PASSWORD, &["admin:*"])]),
                    ));
                }
            }
            _ => {}
        }
        let out = gitstate(dir, &["config"], &env);
        let printed = text(&out);
        let label = format!("{listen:?} {tls:?} {store:?} (seed {seed}):\n{printed}");
        let mut problems = Vec::new();
        let mut warnings = Vec::new();
        match listen {
            Listen::Exposed if cert.is_none() => problems.push("--insecure-listen (or"),
            Listen::ExposedInsecure if cert.is_none() => warnings.push("without TLS"),
            _ => {}
        }
        match tls {
            Tls::Expired => warnings.push("expired on"),
            Tls::NotYetValid => warnings.push("is not valid before"),
            Tls::Valid => {}
            Tls::None => {}
        }
        match store {
            Store::HostedNoUsers => warnings.push("gitstate hash-password"),
            Store::Unreachable => problems.push("the repository cannot be read"),
            Store::EmbeddedAbsent => warnings.push("would create a new, empty one"),
            Store::HostedWithUsers | Store::EmbeddedPresent => {}
        }
        // A finding: its first line's label, and its text up to the next finding.
        let findings = |label: &str| -> Vec<String> {
            printed
                .split(&format!("\n{label}"))
                .skip(1)
                .map(|f| {
                    f.split(['\n'])
                        .take_while(|l| !l.is_empty())
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .collect()
        };
        for problem in &problems {
            assert!(
                findings("PROBLEM").iter().any(|f| f.contains(problem)),
                "{problem:?} not reported: {label}"
            );
        }
        for warning in &warnings {
            assert!(
                findings("WARNING").iter().any(|f| f.contains(warning)),
                "{warning:?} not reported: {label}"
            );
        }
        assert_eq!(out.status.success(), problems.is_empty(), "{label}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout)
                .trim_end()
                .ends_with("\nok"),
            problems.is_empty(),
            "{label}"
        );
        if problems.is_empty() && warnings.is_empty() {
            assert!(!printed.contains("WARNING"), "{label}");
        }
        assert!(
            !empty.path().join(".gitstate/repo.git").exists(),
            "config created a store: {label}"
        );
    }
    eprintln!("startup: {} config cases", cases.len());
}

/// The fix the refusal of an exposed plain listener suggests is itself accepted.
#[test]
fn the_listeners_suggested_fix_parses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = [("GITSTATE_LISTEN", "192.0.2.1:0".to_owned())];
    let out = gitstate(dir.path(), &["serve"], &env);
    let refused = text(&out);
    assert!(!out.status.success(), "{refused}");
    let fix = refused
        .split("accept it with ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no fix in {refused}"));
    let out = gitstate(dir.path(), &["serve", fix], &env);
    let second = text(&out);
    assert!(second.contains("binding 192.0.2.1:0"), "{fix}: {second}");
    let mut env = env.to_vec();
    env.push(("GITSTATE_INSECURE_LISTEN", "true".into()));
    let out = gitstate(dir.path(), &["serve"], &env);
    assert!(text(&out).contains("binding 192.0.2.1:0"), "{}", text(&out));
}

/// `serve` on a hosted repository: no users is said with the way out; the policy line names
/// where the users came from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_says_where_users_come_from_and_how_to_make_the_first() {
    let server = GitServer::start().await;
    let repository = server.create_repo("users");
    let dir = tempfile::tempdir().expect("tempdir");
    let hosted = vec![
        ("GITSTATE_REPOSITORY", repository),
        ("GITSTATE_GIT_USERNAME", GIT_USER.to_owned()),
        ("GITSTATE_GIT_TOKEN", GIT_TOKEN.to_owned()),
    ];
    // Extra variables, and what serve must print with them.
    type Case<'a> = (Vec<(&'a str, String)>, &'a [&'a str]);
    let cases: Vec<Case> = vec![
        (
            vec![],
            &["no users, nobody can log in", "gitstate hash-password"],
        ),
        (
            vec![
                ("GITSTATE_ADMIN_USER", "root".into()),
                ("GITSTATE_ADMIN_HASH", hash_of(PASSWORD)),
            ],
            &["root from GITSTATE_ADMIN_HASH", "1 user"],
        ),
        (
            vec![(
                "GITSTATE_ACCESS",
                access_file(&[
                    ("alice", PASSWORD, &["admin:*"]),
                    ("bob", PASSWORD, &["read:*"]),
                ]),
            )],
            &["2 from GITSTATE_ACCESS / GITSTATE_ACCESS_FILE", "2 users"],
        ),
    ];
    for (extra, expected) in cases {
        let port = gitstate_tests::free_port();
        let mut env = hosted.clone();
        env.push(("GITSTATE_LISTEN", format!("127.0.0.1:{port}")));
        env.extend(extra);
        let log = dir.path().join("serve.log");
        let mut child = Command::new(crate::GITSTATE)
            .arg("serve")
            .current_dir(dir.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(std::fs::File::create(dir.path().join("serve.out")).expect("out"))
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("serve");
        let mut printed = String::new();
        for _ in 0..200 {
            printed = std::fs::read_to_string(dir.path().join("serve.out")).unwrap_or_default()
                + &std::fs::read_to_string(&log).unwrap_or_default();
            if printed.contains("backend \"http\"") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        for word in expected {
            assert!(printed.contains(word), "{word:?} missing: {printed}");
        }
        assert!(!printed.contains(PASSWORD), "{printed}");
    }
}

/// The configured branch is checked at start: generated repositories (states on `master`, as
/// terraform-backend-git keeps them, or empty) × GITSTATE_REF (master, main, a random missing
/// name) × GITSTATE_CREATE_REF, which never starts a branch beside states. `gitstate config`
/// reports what it found, `gitstate run` refuses to start the program where every request
/// would be refused, and `gitstate doctor` against a `serve` so configured names the missing
/// branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_branch_is_checked_at_start() {
    let seed = std::env::var("STARTUP_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("STARTUP_TEST_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let server = GitServer::start().await;
    let master = server.create_repo("on-master");
    gitstate_tests::commit_file(
        &server,
        "on-master",
        "team/app.tfstate",
        br#"{"version":4,"serial":3,"lineage":"l","outputs":{},"resources":[]}"#,
    );
    let bare = server.repo_dir("on-master");
    gitstate_tests::git(&["branch", "-m", "main", "master"], Some(&bare));
    gitstate_tests::git(&["symbolic-ref", "HEAD", "refs/heads/master"], Some(&bare));
    let empty = server.create_repo("empty");
    let work = tempfile::tempdir().expect("tempdir");
    let missing = format!("feature-{}", rng.random_range(100..999));
    let mut refused = 0;
    for (repository, has_states) in [(&master, true), (&empty, false)] {
        for branch in ["master", "main", missing.as_str()] {
            // terraform-backend-git's layout on gitstate's default branch is the refusal the
            // test must see every run; the other missing branches draw the setting at random.
            let create = !(has_states && branch == "main") && rng.random_bool(0.5);
            let env: Vec<(&str, String)> = vec![
                ("GITSTATE_REPOSITORY", repository.clone()),
                ("GITSTATE_GIT_USERNAME", GIT_USER.into()),
                ("GITSTATE_GIT_TOKEN", GIT_TOKEN.into()),
                ("GITSTATE_REF", branch.into()),
                ("GITSTATE_CREATE_REF", create.to_string()),
                (
                    "GITSTATE_ACCESS",
                    access_file(&[("alice", PASSWORD, &["admin:*"])]),
                ),
            ];
            let out = gitstate(work.path(), &["config"], &env);
            let printed = text(&out);
            let label =
                format!("{repository} ref {branch} create {create} (seed {seed}): {printed}");
            let exists = has_states && branch == "master";
            let problem = has_states && !exists;
            if !has_states {
                assert!(printed.contains("the repository is empty"), "{label}");
            } else if exists {
                assert!(printed.contains("branch master exists"), "{label}");
            } else {
                let line = printed
                    .lines()
                    .find(|l| l.starts_with("PROBLEM"))
                    .unwrap_or_else(|| panic!("no problem reported: {label}"));
                assert!(
                    line.contains("\"master\"") && line.contains("GITSTATE_REF"),
                    "{label}"
                );
            }
            assert_eq!(out.status.success(), !problem, "{label}");
            // run: the program starts only where requests would be served.
            let out = run_true(work.path(), &env);
            assert_eq!(
                out.status.success(),
                !problem,
                "run: {}\n{label}",
                text(&out)
            );
            if problem {
                assert!(
                    text(&out).contains("refusing to start the program"),
                    "{label}"
                );
                refused += 1;
            }
        }
    }
    assert!(refused >= 1, "seed {seed}");

    // doctor against a serve on the wrong branch: the missing branch, named.
    let port = gitstate_tests::free_port();
    let mut child = tokio::process::Command::new(crate::GITSTATE)
        .arg("serve")
        .current_dir(work.path())
        .env("GITSTATE_LISTEN", format!("127.0.0.1:{port}"))
        .env("GITSTATE_REPOSITORY", &master)
        .env("GITSTATE_GIT_USERNAME", GIT_USER)
        .env("GITSTATE_GIT_TOKEN", GIT_TOKEN)
        .env("GITSTATE_REF", "main")
        .env(
            "GITSTATE_ACCESS",
            access_file(&[("alice", PASSWORD, &["admin:*"])]),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("serve");
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let base = format!("http://127.0.0.1:{port}");
    std::fs::write(
        dir.path().join("main.tf"),
        gitstate_tests::terraform_backend_block(&base, "team/app.tfstate", ""),
    )
    .expect("main.tf");
    let out = gitstate(
        dir.path(),
        &["doctor"],
        &[
            ("TF_HTTP_USERNAME", "alice".into()),
            ("TF_HTTP_PASSWORD", PASSWORD.into()),
        ],
    );
    let printed = text(&out);
    assert!(!out.status.success(), "{printed}");
    assert!(
        printed.contains("PROBLEM [missing-branch]") && printed.contains("\"master\""),
        "{printed}"
    );
    let _ = child.kill().await;
}

/// The branch of states renamed by hand (`master` to `main`) while states' refs keep the old
/// name: `gitstate config` and `gitstate run` on the new name warn, naming the old branch and
/// the docs' procedure, as writes those refs hold that were never folded are seen by no
/// backend. Refs whose branch exists, and the configured branch's own, are not named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn states_refs_left_by_a_renamed_branch_are_named_at_start() {
    let server = GitServer::start().await;
    let url = server.create_repo("renamed");
    gitstate_tests::commit_file(
        &server,
        "renamed",
        "team/app.tfstate",
        br#"{"version":4,"serial":3,"lineage":"l","outputs":{},"resources":[]}"#,
    );
    let bare = server.repo_dir("renamed");
    let tip = gitstate_tests::git(&["rev-parse", "refs/heads/main"], Some(&bare));
    gitstate_tests::git(&["branch", "env/live", tip.trim()], Some(&bare));
    let work = tempfile::tempdir().expect("tempdir");
    let env: Vec<(&str, String)> = vec![
        ("GITSTATE_REPOSITORY", url.clone()),
        ("GITSTATE_GIT_USERNAME", GIT_USER.into()),
        ("GITSTATE_GIT_TOKEN", GIT_TOKEN.into()),
        ("GITSTATE_REF", "main".into()),
        (
            "GITSTATE_ACCESS",
            access_file(&[("alice", PASSWORD, &["admin:*"])]),
        ),
    ];
    let warned = |out: &Output| {
        text(out)
            .lines()
            .find(|l| l.contains("states' refs of"))
            .map(str::to_owned)
    };
    let before = gitstate(work.path(), &["config"], &env);
    assert_eq!(warned(&before), None, "{}", text(&before));
    for (branch, hex) in [
        ("master", "1"),
        ("master", "2"),
        ("team/old", "3"),
        ("env/live", "4"),
        ("main", "5"),
    ] {
        let name = format!("refs/gitstate/states/{branch}/{}", hex.repeat(40));
        gitstate_tests::git(&["update-ref", &name, tip.trim()], Some(&bare));
    }
    for args in [
        &["config"][..],
        &[
            "run",
            "--state",
            "team/app.tfstate",
            "--workdir",
            ".",
            "--",
            "true",
        ],
    ] {
        let out = gitstate(work.path(), args, &env);
        let line = warned(&out).unwrap_or_else(|| panic!("{args:?}: no warning: {}", text(&out)));
        assert!(
            line.contains("\"master\", \"team/old\"")
                && !line.contains("env/live")
                && !line.contains("\"main\"")
                && line.contains("Renaming the branch of states"),
            "{args:?}: {line}"
        );
        assert!(out.status.success(), "{args:?}: a warning: {}", text(&out));
    }
}

/// `gitstate run` on a host without atomic push where `GITSTATE_REQUIRE_ATOMIC=true`: its one
/// look at start-up (the one a push begins with) shows the host cannot push atomically, so the
/// program never starts; without the setting it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_refuses_to_start_on_a_host_without_the_atomic_push_it_requires() {
    let server = GitServer::start_in(gitstate_tests::PushMode::NoAtomic).await;
    let url = server.create_repo("plain");
    let work = tempfile::tempdir().expect("tempdir");
    for require in [true, false] {
        let env: Vec<(&str, String)> = vec![
            ("GITSTATE_REPOSITORY", url.clone()),
            ("GITSTATE_GIT_USERNAME", GIT_USER.into()),
            ("GITSTATE_GIT_TOKEN", GIT_TOKEN.into()),
            ("GITSTATE_REQUIRE_ATOMIC", require.to_string()),
        ];
        let out = run_true(work.path(), &env);
        let said = text(&out);
        assert_eq!(out.status.success(), !require, "require {require}: {said}");
        if require {
            assert!(
                said.contains("refusing to start the program")
                    && said.contains("GITSTATE_REQUIRE_ATOMIC"),
                "{said}"
            );
        }
    }
}

/// `serve` and `run --new-store` with a hosted repository's credentials but no repository
/// (`GITSTATE_REPOSITORY` left out of a CI job, or a `gitstate.toml` naming it in a directory the
/// job does not run under): each would start a new, empty embedded store in the working
/// directory, where Terraform, let in by an access policy from the environment (or the run's own
/// credential), would find no state, plan to create everything and keep the new state in a
/// directory the job throws away. Both refuse, naming the settings, and create nothing; without
/// those settings (the control) both start the store as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_new_store_starts_when_a_hosted_repository_was_meant() {
    let seed = std::env::var("STARTUP_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("STARTUP_TEST_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let hosted: [(&str, &str); 3] = [
        ("GITSTATE_GIT_TOKEN", GIT_TOKEN),
        ("GITSTATE_GIT_USERNAME", GIT_USER),
        ("GITSTATE_GIT_TOKEN_KMS", "AQICAHh0ZXN0"),
    ];
    for round in 0..5 {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut env = vec![
            ("GITSTATE_ADMIN_USER", "ci".to_owned()),
            ("GITSTATE_ADMIN_HASH", hash_of(PASSWORD)),
            (
                "GITSTATE_LISTEN",
                format!("127.0.0.1:{}", gitstate_tests::free_port()),
            ),
        ];
        let control = round == 0;
        let mut given = Vec::new();
        if !control {
            let (name, value) = hosted[rng.random_range(0..hosted.len())];
            env.push((name, value.to_owned()));
            given.push(name);
        }
        let out_file = dir.path().join("serve.out");
        let mut child = Command::new(crate::GITSTATE)
            .arg("serve")
            .current_dir(dir.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", dir.path())
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out_file).expect("out"))
            .stderr(std::fs::File::create(dir.path().join("serve.err")).expect("err"))
            .spawn()
            .expect("serve");
        let mut exited = None;
        let mut printed = String::new();
        for _ in 0..200 {
            printed = std::fs::read_to_string(&out_file).unwrap_or_default()
                + &std::fs::read_to_string(dir.path().join("serve.err")).unwrap_or_default();
            exited = child.try_wait().expect("wait");
            if exited.is_some() || printed.contains("backend \"http\"") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        let created = dir.path().join(".gitstate/repo.git").exists();
        let what = format!("round {round}, {given:?}, {env:?}");
        // `run --new-store` (the README's first run, copied into a job) the same way.
        let run_dir = tempfile::tempdir().expect("tempdir");
        let args = [
            "run",
            "--new-store",
            "--state",
            "team/app.tfstate",
            "--workdir",
            ".",
        ];
        let run = gitstate(run_dir.path(), &[&args[..], &["--", "true"]].concat(), &env);
        let run_created = run_dir.path().join(".gitstate/repo.git").exists();
        if control {
            assert!(created && exited.is_none(), "{what}: {printed}");
            assert!(
                run.status.success() && run_created,
                "{what}: {}",
                text(&run)
            );
            continue;
        }
        assert!(
            exited.is_some_and(|status| !status.success()),
            "{what}: serve must refuse to start: {printed}"
        );
        assert!(
            !run.status.success(),
            "{what}: run must refuse: {}",
            text(&run)
        );
        assert!(!created && !run_created, "{what}: no store is created");
        for printed in [printed, text(&run)] {
            for word in given.iter().chain(&["GITSTATE_REPOSITORY", "--repository"]) {
                assert!(
                    printed.contains(word),
                    "{what}: {word:?} is named: {printed}"
                );
            }
            assert!(!printed.contains(GIT_TOKEN), "{what}: {printed}");
        }
    }
}

/// `GITSTATE_REF` names a branch that exists but keeps no states (here `main`, holding code),
/// while `states` keeps them: `gitstate config` and `gitstate run` warn at start, naming
/// `states` and both ways out. A branch that keeps states, or a repository with no other
/// branch of states, gets no such warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_without_states_beside_states_is_named_at_start() {
    let server = GitServer::start().await;
    let url = server.create_repo("code");
    gitstate_tests::commit_file(&server, "code", "main.tf", b"# code\n");
    let bare = server.repo_dir("code");
    let work = tempfile::tempdir().expect("tempdir");
    let env = |branch: &str| -> Vec<(&str, String)> {
        vec![
            ("GITSTATE_REPOSITORY", url.clone()),
            ("GITSTATE_GIT_USERNAME", GIT_USER.into()),
            ("GITSTATE_GIT_TOKEN", GIT_TOKEN.into()),
            ("GITSTATE_REF", branch.into()),
            (
                "GITSTATE_ACCESS",
                access_file(&[("alice", PASSWORD, &["admin:*"])]),
            ),
        ]
    };
    let warned = |out: &Output| {
        text(out)
            .lines()
            .find(|l| l.contains("holds no states"))
            .map(str::to_owned)
    };
    let alone = gitstate(work.path(), &["config"], &env("main"));
    assert_eq!(warned(&alone), None, "no other branch: {}", text(&alone));
    // `states` keeps a state: a commit on top of main's holding a .tfstate file.
    let handmade = gitstate_tests::handmade::Bare::new(&bare, "states");
    let tip = gitstate_tests::git(&["rev-parse", "refs/heads/main"], Some(&bare));
    gitstate_tests::git(&["branch", "states", tip.trim()], Some(&bare));
    let mut write = gitstate_tests::handmade::StateWrite {
        path: "prod.tfstate".into(),
        content: Vec::new(),
        author: gitstate_tests::handmade::Stamp {
            name: "ann".into(),
            email: "ann@example.invalid".into(),
            date: "1700000000 +0000".into(),
        },
        committer: gitstate_tests::handmade::Stamp {
            name: "ann".into(),
            email: "ann@example.invalid".into(),
            date: "1700000000 +0000".into(),
        },
        message: "prod\n".into(),
    };
    write.content =
        br#"{"version":4,"serial":3,"lineage":"l","outputs":{},"resources":[]}"#.to_vec();
    handmade.branch_write("prod.tfstate", Some(&write.content.clone()), &write);
    for args in [
        &["config"][..],
        &[
            "run",
            "--state",
            "prod.tfstate",
            "--workdir",
            ".",
            "--",
            "true",
        ],
    ] {
        let out = gitstate(work.path(), args, &env("main"));
        let line = warned(&out).unwrap_or_else(|| panic!("{args:?}: no warning: {}", text(&out)));
        assert!(
            line.contains("states") && line.contains("GITSTATE_REF") && line.contains("index.json"),
            "{args:?}: {line}"
        );
    }
    let right = gitstate(work.path(), &["config"], &env("states"));
    assert_eq!(
        warned(&right),
        None,
        "the branch of states: {}",
        text(&right)
    );
}
