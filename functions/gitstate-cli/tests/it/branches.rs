//! `history`, `show` and `restore` name their branch (`--ref`) and say which one they acted on:
//! generated states on two branches of a real `git http-backend` repository, read and restored
//! through `gitstate serve` with the binary, never mixed up.

use std::collections::BTreeMap;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use gitstate_tests::{Client, GIT_TOKEN, GIT_USER, GitServer, access_file, state_json};
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, BufReader};

const PASSWORD: &str = "branches-Pa55word-for-the-suite";
const BRANCHES: [&str; 2] = ["main", "staging"];

async fn write(client: &Client, name: &str, branch: &str, state: &str) {
    let id = format!("w-{}", rand::random::<u32>());
    let lock = gitstate_tests::lock_info(&id);
    client
        .send("POST", &format!("/locks/{name}?ref={branch}"), Some(&lock))
        .await
        .expect(200);
    client
        .send(
            "POST",
            &format!("/states/{name}?ref={branch}&ID={id}"),
            Some(state),
        )
        .await
        .expect(200);
    client
        .send(
            "DELETE",
            &format!("/locks/{name}?ref={branch}"),
            Some(&lock),
        )
        .await
        .expect(200);
}

fn cli(base: &str, args: &[&str]) -> Output {
    Command::new(crate::GITSTATE)
        .args(args)
        .env("GITSTATE_URL", base)
        .env("TF_HTTP_USERNAME", "alice")
        .env("TF_HTTP_PASSWORD", PASSWORD)
        .stdin(Stdio::null())
        .output()
        .expect("gitstate runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_show_and_restore_name_their_branch() {
    let seed = std::env::var("BRANCHES_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("BRANCHES_TEST_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let server = GitServer::start().await;
    let repository = server.create_repo("branches");
    let work = tempfile::tempdir().expect("tempdir");
    let mut child = tokio::process::Command::new(crate::GITSTATE)
        .arg("serve")
        .current_dir(work.path())
        .env("GITSTATE_LISTEN", "127.0.0.1:0")
        .env("GITSTATE_REPOSITORY", &repository)
        .env("GITSTATE_GIT_USERNAME", GIT_USER)
        .env("GITSTATE_GIT_TOKEN", GIT_TOKEN)
        .env("GITSTATE_ALLOWED_REFS", "staging")
        .env(
            "GITSTATE_ACCESS",
            access_file(&[("alice", PASSWORD, &["admin:*"])]),
        )
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
    let client = Client::with_credentials(&base, Some(("alice", PASSWORD)));

    // Both branches exist before the states are written: main by a first write, staging as the
    // docs start one (an orphan commit holding the empty index: a copy of main would be refused).
    write(&client, "seed.tfstate", "main", &state_json("seed", 1)).await;
    gitstate_tests::handmade::Bare::new(&server.repo_dir("branches"), "staging").start_branch();

    // Serials tell the branches apart: main's are 10.., staging's 100...
    let mut serials: BTreeMap<(String, &str), Vec<u64>> = BTreeMap::new();
    let names: Vec<String> = (0..3).map(|i| format!("app/s{i}.tfstate")).collect();
    for name in &names {
        for (b, branch) in BRANCHES.iter().enumerate() {
            let count = rng.random_range(if b == 0 { 1 } else { 0 }..4);
            for i in 0..count {
                let serial = [10, 100][b] + i;
                write(&client, name, branch, &state_json(branch, serial)).await;
                serials
                    .entry((name.clone(), branch))
                    .or_default()
                    .push(serial);
            }
        }
    }
    let mut checked = 0;
    for name in &names {
        for asked in [None, Some("main"), Some("staging")] {
            let branch = asked.unwrap_or("main");
            let expected = serials
                .get(&(name.clone(), branch))
                .cloned()
                .unwrap_or_default();
            let other = serials
                .get(&(
                    name.clone(),
                    if branch == "main" { "staging" } else { "main" },
                ))
                .cloned()
                .unwrap_or_default();
            let mut args = vec!["history", name.as_str()];
            args.extend(asked.map(|b| ["--ref", b]).into_iter().flatten());
            let out = cli(&base, &args);
            let printed = String::from_utf8_lossy(&out.stdout).into_owned();
            let label = format!(
                "{args:?} seed {seed}: {printed}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            if expected.is_empty() {
                assert!(!out.status.success() || !printed.contains(" 10"), "{label}");
            } else {
                assert!(out.status.success(), "{label}");
                assert_eq!(
                    printed.lines().next(),
                    Some(format!("{name} on branch {branch}").as_str()),
                    "{label}"
                );
                for serial in &expected {
                    assert!(
                        printed.split_whitespace().any(|w| w == serial.to_string()),
                        "serial {serial} missing: {label}"
                    );
                }
                for serial in &other {
                    assert!(
                        !printed.split_whitespace().any(|w| w == serial.to_string()),
                        "serial {serial} of the other branch: {label}"
                    );
                }
            }
            // show: each of this branch's serials, and none of the other's.
            for serial in expected.iter().chain(&other) {
                let target = format!("{name}@{serial}");
                let mut args = vec!["show", target.as_str()];
                args.extend(asked.map(|b| ["--ref", b]).into_iter().flatten());
                let out = cli(&base, &args);
                let label = format!(
                    "{args:?} seed {seed}: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                if expected.contains(serial) {
                    assert!(out.status.success(), "{label}");
                    let state: serde_json::Value =
                        serde_json::from_slice(&out.stdout).expect("the state on stdout");
                    assert_eq!(state["serial"].as_u64(), Some(*serial), "{label}");
                    assert_eq!(state["lineage"].as_str(), Some(branch), "{label}");
                    assert!(
                        String::from_utf8_lossy(&out.stderr)
                            .contains(&format!("on branch {branch}")),
                        "{label}"
                    );
                } else {
                    assert!(!out.status.success(), "another branch's revision: {label}");
                }
                checked += 1;
            }
            checked += 1;
        }
    }
    // The console's state pages: `?ref=` shows that branch's revisions, and the page says which.
    for name in &names {
        for asked in [None, Some("staging")] {
            let branch = asked.unwrap_or("main");
            let query = asked.map(|b| format!("?ref={b}")).unwrap_or_default();
            let Some(expected) = serials.get(&(name.clone(), branch)) else {
                continue;
            };
            let page = client
                .send("GET", &format!("/ui/states/{name}{query}"), None)
                .await
                .expect(200)
                .body;
            assert!(
                page.contains(&format!("on branch <code>{branch}</code>")),
                "{name}{query} (seed {seed}): {page}"
            );
            for (b, list) in serials.iter().filter(|((n, _), _)| n == name) {
                for serial in list {
                    assert_eq!(
                        page.contains(&format!(">Serial {serial}<")),
                        b.1 == branch,
                        "serial {serial} of {} on the {branch} page (seed {seed})",
                        b.1
                    );
                }
            }
            assert!(!expected.is_empty());
            let list = client
                .send("GET", &format!("/ui/{query}"), None)
                .await
                .expect(200)
                .body;
            assert!(
                list.contains(&format!("on branch <code>{branch}</code>")),
                "{list}"
            );
            assert!(
                list.contains(&format!("/ui/states/{name}{query}\"")),
                "{list}"
            );
            checked += 2;
        }
    }
    // restore on staging: staging gets a new newest revision, main is untouched.
    let (name, first) = names
        .iter()
        .find_map(|n| {
            serials
                .get(&(n.clone(), "staging"))
                .map(|s| (n.clone(), s[0]))
        })
        .unwrap_or_else(|| {
            (names[0].clone(), 0) // no state on staging in this run
        });
    if first != 0 {
        let main_before = client.get_state(&name).await.body;
        let target = format!("{name}@{first}");
        let out = cli(&base, &["restore", &target, "--ref", "staging"]);
        let printed = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "restore: {printed}");
        assert!(
            printed.starts_with(&format!("restored {name} on branch staging from ")),
            "{printed}"
        );
        assert_eq!(client.get_state(&name).await.body, main_before);
        let staging = client
            .send("GET", &format!("/states/{name}?ref=staging"), None)
            .await
            .expect(200);
        assert_eq!(
            staging.json()["lineage"].as_str(),
            Some("staging"),
            "{printed}"
        );
        checked += 1;
    }
    eprintln!("branches: {checked} history/show/restore checks");
}
