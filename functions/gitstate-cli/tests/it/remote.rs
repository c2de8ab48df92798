//! The remote commands as a user meets them: they find the backend through gitstate.toml
//! (`url`, or the `listen` its `serve` uses) or `--config`, say in one line which URL they
//! could not reach, show the newest revision without `@`, and `unlock` and `remove` act on a
//! state without a Terraform directory. A real `git http-backend` behind `gitstate serve`.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use gitstate_tests::{Client, GIT_TOKEN, GIT_USER, GitServer, access_file, state_json};
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, BufReader};

const USERS: [(&str, &str, &[&str]); 3] = [
    ("alice", "alice-Pa55word-remote-suite", &["admin:*"]),
    ("wes", "wes-Pa55word-remote-suite", &["write:*"]),
    ("ria", "ria-Pa55word-remote-suite", &["read:*"]),
];

/// Variables for one run of the CLI.
type Env<'a> = Vec<(&'a str, &'a str)>;

fn password(user: &str) -> &'static str {
    USERS
        .iter()
        .find(|(name, _, _)| *name == user)
        .map(|(_, p, _)| *p)
        .expect("a test user")
}

/// `gitstate ARGS` in `dir` as `user`, with no GITSTATE_URL unless `env` sets it.
fn cli(dir: &Path, user: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(crate::GITSTATE)
        .args(args)
        .current_dir(dir)
        .env_remove("GITSTATE_URL")
        .env_remove("GITSTATE_LISTEN")
        // The test runner's backtrace setting would add anyhow's backtrace to every error.
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .env("TF_HTTP_USERNAME", user)
        .env("TF_HTTP_PASSWORD", password(user))
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("gitstate runs")
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[track_caller]
fn ok(out: Output) -> String {
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "failed: {stdout}\n{stderr}");
    stdout
}

#[track_caller]
fn fails(out: Output) -> String {
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "succeeded: {stdout}\n{stderr}");
    stderr
}

/// `gitstate serve` in `dir`, which holds a gitstate.toml naming the repository and `listen`.
async fn serve(dir: &Path, repository: &str) -> (tokio::process::Child, String) {
    let port = gitstate_tests::free_port();
    std::fs::write(
        dir.join("gitstate.toml"),
        format!("repository = {repository:?}\nlisten = \"127.0.0.1:{port}\"\n"),
    )
    .expect("gitstate.toml");
    let mut child = tokio::process::Command::new(crate::GITSTATE)
        .arg("serve")
        .current_dir(dir)
        .env_remove("GITSTATE_LISTEN")
        .env_remove("GITSTATE_REPOSITORY")
        .env("GITSTATE_GIT_USERNAME", GIT_USER)
        .env("GITSTATE_GIT_TOKEN", GIT_TOKEN)
        .env("GITSTATE_ACCESS", access_file(&USERS))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("serve starts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let base = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("stdout") {
            if let Some((_, address)) = line.rsplit_once(" on ") {
                return address.trim().to_owned();
            }
        }
        panic!("serve ended before listening");
    })
    .await
    .expect("serve listens");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    assert_eq!(base, format!("http://127.0.0.1:{port}"));
    (child, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_commands_find_the_backend_and_act_without_terraform() {
    let seed = std::env::var("REMOTE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("REMOTE_TEST_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let server = GitServer::start().await;
    let repository = server.create_repo("remote");
    let work = tempfile::tempdir().expect("tempdir");
    let (_child, base) = serve(work.path(), &repository).await;
    let admin = Client::with_credentials(&base, Some(("alice", password("alice"))));
    let writer = Client::with_credentials(&base, Some(("wes", password("wes"))));

    // States with a few revisions each.
    let names: Vec<String> = (0..3).map(|i| format!("team/s{i}.tfstate")).collect();
    for name in &names {
        for serial in 1..=rng.random_range(2..7u64) {
            let id = format!("w-{}", rng.random::<u32>());
            admin.apply(name, &id, &state_json("l", serial)).await;
        }
    }

    // Where the URL comes from: gitstate.toml's `listen` in the working directory, `url` of a
    // file named by --config, the flag, the variable.
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let other_toml = elsewhere.path().join("remote.toml");
    std::fs::write(&other_toml, format!("url = {base:?}\n")).expect("toml");
    let serve_toml = work.path().join("gitstate.toml");
    let ways: Vec<(&Path, Vec<String>, Env)> = vec![
        (work.path(), vec![], vec![]),
        (
            elsewhere.path(),
            vec!["--config".into(), serve_toml.display().to_string()],
            vec![],
        ),
        (
            elsewhere.path(),
            vec!["--config".into(), other_toml.display().to_string()],
            vec![],
        ),
        (elsewhere.path(), vec!["--url".into(), base.clone()], vec![]),
        (
            elsewhere.path(),
            vec![],
            vec![("GITSTATE_URL", base.as_str())],
        ),
    ];
    for (dir, extra, env) in &ways {
        let mut args = vec!["list"];
        args.extend(extra.iter().map(String::as_str));
        let listed = ok(cli(dir, "ria", &args, env));
        for name in &names {
            assert!(listed.contains(name.as_str()), "{args:?}: {listed}");
        }
    }

    // A backend that is not there: one line naming the URL tried, where it came from, and how
    // to set it, for each way of naming it.
    let port = gitstate_tests::free_port();
    let dead = format!("http://127.0.0.1:{port}");
    let dead_toml = elsewhere.path().join("dead.toml");
    std::fs::write(&dead_toml, format!("url = {dead:?}\n")).expect("toml");
    let listen_toml = elsewhere.path().join("listen.toml");
    std::fs::write(&listen_toml, format!("listen = \"0.0.0.0:{port}\"\n")).expect("toml");
    let dead_ways: Vec<(Vec<String>, Env, String)> = vec![
        (vec!["--url".into(), dead.clone()], vec![], "--url".into()),
        (
            vec![],
            vec![("GITSTATE_URL", dead.as_str())],
            "GITSTATE_URL".into(),
        ),
        (
            vec!["--config".into(), dead_toml.display().to_string()],
            vec![],
            format!("`url` in {}", dead_toml.display()),
        ),
        (
            vec!["--config".into(), listen_toml.display().to_string()],
            vec![],
            format!("`listen` in {}", listen_toml.display()),
        ),
    ];
    for command in [
        vec!["list"],
        vec!["locks"],
        vec!["history", "a.tfstate"],
        vec!["show", "a.tfstate@3"],
        vec!["unlock", "a.tfstate"],
    ] {
        for (extra, env, origin) in &dead_ways {
            let mut args = command.clone();
            args.extend(extra.iter().map(String::as_str));
            let error = fails(cli(elsewhere.path(), "ria", &args, env));
            let lines: Vec<&str> = error.lines().filter(|l| !l.trim().is_empty()).collect();
            assert_eq!(lines.len(), 1, "{args:?}: not one line: {error}");
            for part in [
                dead.as_str(),
                origin.as_str(),
                "GITSTATE_URL",
                "--url",
                "gitstate.toml",
            ] {
                assert!(error.contains(part), "{args:?}: {part:?} missing: {error}");
            }
            assert!(
                error.to_lowercase().contains("connection refused"),
                "{args:?}: {error}"
            );
        }
    }

    // `show NAME` is the newest revision, as Terraform reads it.
    for name in &names {
        let shown = ok(cli(work.path(), "ria", &["show", name], &[]));
        let current = admin.get_state(name).await.expect(200).body;
        assert_eq!(shown.trim_end(), current.trim_end(), "{name}");
    }

    // Version ids: the 12 digits `history` prints, and any prefix of 7 to 40 digits of the
    // whole ids, name their revision in `show`, `?at=` and `?restore=`; fewer than 7 and
    // unknown ones are a 400 that says so.
    let mut prefixes = 0;
    for name in &names {
        let printed = ok(cli(work.path(), "ria", &["history", name], &[]));
        let versions = admin
            .history(name, "per_page=100")
            .await
            .expect(200)
            .history()
            .versions;
        let short: Vec<&str> = printed
            .lines()
            .skip(2)
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(short.len(), versions.len(), "{printed}");
        for (id, version) in short.iter().zip(&versions) {
            assert_eq!(id.len(), 12, "{printed}");
            assert!(version.version.starts_with(id), "{printed}");
            let long = &version.version[..rng.random_range(7..=40)];
            let at = admin
                .history(name, &format!("at={}", version.version))
                .await
                .expect(200)
                .body;
            for prefix in [*id, long] {
                let shown = ok(cli(
                    work.path(),
                    "ria",
                    &["show", &format!("{name}@{prefix}")],
                    &[],
                ));
                assert_eq!(shown.trim_end(), at.trim_end(), "{name}@{prefix}");
                let by_api = admin
                    .history(name, &format!("at={prefix}"))
                    .await
                    .expect(200)
                    .body;
                assert_eq!(by_api, at, "?at={prefix}");
                prefixes += 1;
            }
            let short = &version.version[..rng.random_range(1..7)];
            let refused = admin.history(name, &format!("at={short}")).await;
            // Six digits or fewer that are all decimal are a serial; hex letters are refused.
            if short.bytes().any(|b| b.is_ascii_alphabetic()) {
                let refused = refused.expect(400);
                assert!(refused.body.contains("7 or more"), "{}", refused.body);
            }
        }
        let absent = "fffffff0000000";
        if !versions.iter().any(|v| v.version.starts_with(absent)) {
            let refused = admin
                .history(name, &format!("at={absent}"))
                .await
                .expect(400);
            assert!(refused.body.contains(absent), "{}", refused.body);
            let error = fails(cli(
                work.path(),
                "ria",
                &["show", &format!("{name}@{absent}")],
                &[],
            ));
            assert!(error.contains("400") && error.contains(absent), "{error}");
        }
    }
    // A restore by a history prefix.
    let name = names[2].as_str();
    let versions = admin.history(name, "").await.expect(200).history().versions;
    let oldest = versions.last().expect("a revision");
    let id12 = &oldest.version[..12];
    let said = ok(cli(
        work.path(),
        "alice",
        &["restore", &format!("{name}@{id12}")],
        &[],
    ));
    assert!(said.contains(&oldest.version), "{said}");
    eprintln!("{prefixes} version prefixes read back");

    // unlock: a holder's lock, released by the administrator without a Terraform directory.
    let name = names[0].as_str();
    ok(cli(work.path(), "alice", &["unlock", name], &[]))
        .contains("no lock held")
        .then_some(())
        .expect("says none is held");
    for round in 0..4 {
        let id = format!("held-{round}-{}", rng.random::<u32>());
        writer.lock(name, &id).await.expect(200);
        // A wrong ID, or a writer forcing someone's lock, releases nothing.
        fails(cli(
            work.path(),
            "alice",
            &["unlock", name, "--id", "not-it"],
            &[],
        ));
        fails(cli(work.path(), "ria", &["unlock", name], &[]));
        assert_eq!(admin.get_lock(name).await.expect(200).lock().id, id);
        let args: Vec<&str> = if round % 2 == 0 {
            vec!["unlock", name]
        } else {
            vec!["unlock", name, "--id", &id]
        };
        let said = ok(cli(work.path(), "alice", &args, &[]));
        assert!(said.contains(&id) && said.contains("released"), "{said}");
        admin.get_lock(name).await.expect(409);
    }

    // remove: needs --yes, refuses a held lock and a non-administrator, leaves no lock behind,
    // and what it removed comes back with restore.
    let name = names[1].as_str();
    let before = admin.get_state(name).await.expect(200).body;
    let error = fails(cli(work.path(), "alice", &["remove", name], &[]));
    assert!(error.contains("--yes"), "{error}");
    writer.lock(name, "busy").await.expect(200);
    let error = fails(cli(work.path(), "alice", &["remove", name, "--yes"], &[]));
    assert!(error.contains("gitstate unlock"), "{error}");
    writer.unlock(name, "busy").await.expect(200);
    for user in ["wes", "ria"] {
        fails(cli(work.path(), user, &["remove", name, "--yes"], &[]));
        admin.get_lock(name).await.expect(409);
    }
    assert_eq!(admin.get_state(name).await.expect(200).body, before);
    let said = ok(cli(work.path(), "alice", &["remove", name, "--yes"], &[]));
    assert!(
        said.contains("git history") && said.contains("restore"),
        "{said}"
    );
    admin.get_state(name).await.expect(404);
    admin.get_lock(name).await.expect(409);
    let error = fails(cli(work.path(), "ria", &["show", name], &[]));
    assert!(error.contains("removed"), "{error}");
    let error = fails(cli(work.path(), "alice", &["remove", name, "--yes"], &[]));
    assert!(error.contains("no state"), "{error}");
    let serial = gitstate_tests::serial_of(&before);
    ok(cli(
        work.path(),
        "alice",
        &["restore", &format!("{name}@{serial}")],
        &[],
    ));
    let back = admin.get_state(name).await.expect(200).body;
    assert_eq!(gitstate_tests::serial_of(&back), serial + 1);
}
