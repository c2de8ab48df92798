//! `gitstate user add` committing to the repository: the embedded store and a hosted one behind
//! the machine's `git http-backend`; writers that race all land, a name is never added twice,
//! the password never shows, and the new users log in to `gitstate serve`.

use std::path::Path;
use std::process::Stdio;

use gitstate_tests::process::{ServeProcess, serve_env};
use gitstate_tests::{Client, GIT_TOKEN, GIT_USER, GitServer, git, state_json};
use rand::{Rng, SeedableRng};
use tokio::io::AsyncWriteExt;

const ACCESS: &str = ".gitstate/access.toml";

/// `gitstate user add NAME ARGS…` in `dir` with `env` (nothing else from the test's
/// environment), the password (if any) on standard input: (success, stdout + stderr).
async fn user_add(
    dir: &Path,
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
    password: Option<&str>,
) -> (bool, String) {
    let mut command = tokio::process::Command::new(crate::GITSTATE);
    command
        .args(["user", "add", name])
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", dir)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if password.is_some() {
        command.arg("--password-stdin");
    }
    let mut child = command.spawn().expect("gitstate user add starts");
    let mut stdin = child.stdin.take().expect("stdin");
    if let Some(password) = password {
        stdin
            .write_all(format!("{password}\n").as_bytes())
            .await
            .expect("password sent");
    }
    drop(stdin);
    let out = child
        .wait_with_output()
        .await
        .expect("gitstate user add ends");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn password(rng: &mut impl Rng) -> String {
    (0..24)
        .map(|_| char::from(rng.random_range(b'!'..=b'~')))
        .collect()
}

/// The access file on `main` of the bare repository `bare`.
fn access_text(bare: &Path) -> String {
    git(
        &[
            "--git-dir",
            bare.to_str().expect("utf-8"),
            "show",
            &format!("main:{ACCESS}"),
        ],
        None,
    )
}

/// The embedded store: `serve` makes it (and its first administrator); users added while it
/// runs log in with their password or token, only within their grants; a second add of a name
/// is refused and changes nothing; the password is never printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_added_to_the_embedded_store_log_in() {
    let seed = rand::random::<u64>();
    eprintln!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let bare = dir.path().join(".gitstate/repo.git");
    let bare_text = bare.display().to_string();
    let store = [("GITSTATE_LOCAL_REPOSITORY", bare_text.as_str())];
    // No store yet: refused, and nothing is created.
    let (ok, said) = user_add(dir.path(), "ann", &["--grant", "read:*"], &store, None).await;
    assert!(!ok && said.contains("--print"), "{said}");
    assert!(!bare.exists());

    let server = ServeProcess::start(
        Path::new(crate::GITSTATE),
        dir.path(),
        vec![
            ("GITSTATE_LOCAL_REPOSITORY".into(), bare_text.clone()),
            ("GITSTATE_LISTEN".into(), "127.0.0.1:0".into()),
            ("GITSTATE_ACCESS_REFRESH_SECS".into(), "0".into()),
        ],
    )
    .await;
    let ann_password = password(&mut rng);
    let (ok, said) = user_add(
        dir.path(),
        "ann",
        &["--grant", "write:team/"],
        &store,
        Some(&ann_password),
    )
    .await;
    assert!(ok, "{said}");
    assert!(
        !said.contains(&ann_password),
        "the password was shown: {said}"
    );
    let (ok, said) = user_add(dir.path(), "ci.bot", &["--grant", "read:*"], &store, None).await;
    assert!(ok, "{said}");
    let token = said
        .lines()
        .find(|l| l.starts_with("gst_"))
        .expect("a generated token is shown once")
        .to_owned();

    let ann = Client::with_credentials(&server.url, Some(("ann", &ann_password)));
    ann.apply("team/app.tfstate", "a1", &state_json("users", 1))
        .await;
    ann.write("other/app.tfstate", &state_json("users", 1))
        .await
        .expect(403);
    let bot = Client::with_credentials(&server.url, Some(("ci.bot", &token)));
    bot.get_state("team/app.tfstate").await.expect(200);
    bot.write("team/app.tfstate", &state_json("users", 2))
        .await
        .expect(403);
    let wrong = Client::with_credentials(&server.url, Some(("ann", "not-the-password-at-all")));
    wrong.get_state("team/app.tfstate").await.expect(401);

    let before = access_text(&bare);
    let (ok, said) = user_add(
        dir.path(),
        "ann",
        &["--grant", "admin:*"],
        &store,
        Some(&password(&mut rng)),
    )
    .await;
    assert!(!ok && said.contains("already exists"), "{said}");
    assert_eq!(access_text(&bare), before, "a refused add changes nothing");
    // The first administrator serve made is still there, beside the two users.
    let policy = gitstate_core::access::Policy::parse(&before).expect("valid");
    let names: Vec<&str> = policy.users().map(|u| u.name.as_str()).collect();
    assert_eq!(names, ["admin", "ann", "ci.bot"]);
    assert!(!server.log_text().contains(&ann_password));
}

/// A hosted repository behind `git http-backend`, empty at first: a generated number of
/// `user add` processes started at once (each reads the file before the others commit) all
/// land, one commit each, with nothing lost; then `serve` over that repository lets every one
/// of them in with their own password, and nobody with another's. With the policy fixed by
/// GITSTATE_ACCESS, the add is refused and points at `--print`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_adds_to_a_hosted_repository_all_land() {
    let seed = rand::random::<u64>();
    eprintln!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let git_server = GitServer::start().await;
    let url = git_server.create_repo("people");
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    let cache = cache.display().to_string();
    let env = [
        ("GITSTATE_GIT_USERNAME", GIT_USER),
        ("GITSTATE_GIT_TOKEN", GIT_TOKEN),
        ("GITSTATE_CACHE_DIR", cache.as_str()),
    ];
    let users: Vec<(String, String)> = (0..rng.random_range(3..7))
        .map(|i| {
            (
                format!("u{i}.{}", rng.random_range(0..1000)),
                password(&mut rng),
            )
        })
        .collect();
    let adds: Vec<_> = users
        .iter()
        .map(|(name, password)| {
            let work = dir.path().join(name);
            std::fs::create_dir_all(&work).expect("dir");
            let cache = work.join("cache").display().to_string();
            let (name, password, url) = (name.clone(), password.clone(), url.clone());
            tokio::spawn(async move {
                let env = [
                    ("GITSTATE_GIT_USERNAME", GIT_USER),
                    ("GITSTATE_GIT_TOKEN", GIT_TOKEN),
                    ("GITSTATE_CACHE_DIR", cache.as_str()),
                ];
                let args = ["--grant", "write:team/", "--repository", url.as_str()];
                user_add(&work, &name, &args, &env, Some(&password)).await
            })
        })
        .collect();
    for (add, (name, password)) in adds.into_iter().zip(&users) {
        let (ok, said) = add.await.expect("the add ran");
        assert!(ok, "{name}: {said}");
        assert!(!said.contains(password.as_str()), "{name}'s password shown");
    }
    let bare = git_server.repo_dir("people");
    let text = access_text(&bare);
    let policy = gitstate_core::access::Policy::parse(&text).expect("valid");
    assert_eq!(policy.users().count(), users.len(), "{text}");
    let log = git(
        &[
            "--git-dir",
            bare.to_str().expect("utf-8"),
            "log",
            "--format=%s",
            "main",
        ],
        None,
    );
    assert_eq!(
        log.lines().count(),
        users.len(),
        "one commit per user:\n{log}"
    );

    // A repeated name is refused by the hosted repository's file too.
    let (name, _) = &users[0];
    let (ok, said) = user_add(
        dir.path(),
        name,
        &["--grant", "read:*", "--repository", &url],
        &env,
        Some("another-password-long-enough"),
    )
    .await;
    assert!(!ok && said.contains("already exists"), "{said}");

    let mut serve_vars = serve_env(&url, &[("GITSTATE_ACCESS_REFRESH_SECS", "0")]);
    serve_vars.retain(|(k, _)| k != "GITSTATE_ACCESS");
    std::fs::create_dir_all(dir.path().join("serve")).expect("dir");
    let server = ServeProcess::start(
        Path::new(crate::GITSTATE),
        &dir.path().join("serve"),
        serve_vars,
    )
    .await;
    for (i, (name, password)) in users.iter().enumerate() {
        let client = Client::with_credentials(&server.url, Some((name, password)));
        client
            .apply(
                "team/app.tfstate",
                name,
                &state_json("hosted", i as u64 + 1),
            )
            .await;
        let (other, _) = &users[(i + 1) % users.len()];
        let impostor = Client::with_credentials(&server.url, Some((other, password)));
        impostor.get_state("team/app.tfstate").await.expect(401);
    }

    let fixed = gitstate_tests::access_file(&[("x", "x-password-long-enough", &["read:*"])]);
    let mut fixed_env = env.to_vec();
    fixed_env.push(("GITSTATE_ACCESS", &fixed));
    let (ok, said) = user_add(
        dir.path(),
        "late",
        &["--grant", "read:*", "--repository", &url],
        &fixed_env,
        None,
    )
    .await;
    assert!(
        !ok && said.contains("GITSTATE_ACCESS") && said.contains("--print"),
        "{said}"
    );
    assert_eq!(access_text(&bare), text, "nothing committed");
}
