//! A branch of states copied under another name (`git push origin prod:refs/heads/staging`, a
//! new branch made from it in the host's web page, a force-push of one onto the other) served
//! the other branch's states as its own with 200: a plan on the copy would act on the
//! original's resources. Now every read and write there is a 400 naming both branches, while
//! the original serves as before, and a branch renamed (the original name gone, or taken again
//! by an unrelated branch) is not a copy.

use gitstate_tests::handmade::Bare;
use gitstate_tests::{Client, GitServer, TestBackend, init_tracing, state_json};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom as _;
use rand::{Rng as _, SeedableRng as _};

const ORIGINALS: [&str; 3] = ["prod", "states", "env/prod"];
const COPIES: [&str; 3] = ["staging", "main", "env/staging"];
const NAMES: [&str; 3] = ["app.tfstate", "net/vpc.tfstate", "Team/DB.tfstate"];

/// How the copy came to be, besides the plain copy of the tip.
#[derive(Debug, Clone, Copy)]
enum After {
    /// Nothing: the two branches have one tip.
    Nothing,
    /// A person committed a file of their own on the copy (the tip names no branch).
    HandCommit,
    /// The original took a write since (the two tips differ; the lineages do not).
    OriginalWrote,
}

fn env<'a>(branch: &'a str, refs: &'a str) -> [(&'static str, &'a str); 3] {
    [
        ("GITSTATE_REF", branch),
        ("GITSTATE_CREATE_REF", "true"),
        ("GITSTATE_STATE_REFS", refs),
    ]
}

/// Wait until the branch's file of `path` holds `serial` (a process folds its state refs in the
/// background after its writes).
async fn folded(bare: &Bare, path: &str, serial: u64) {
    for _ in 0..200 {
        let file = bare.git(&["show", &format!("{}:{path}", bare.branch)], &[], b"");
        if file.contains(&format!("\"serial\":{serial}")) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!(
        "{path} was never folded into {} at serial {serial}",
        bare.branch
    );
}

/// Generated: the original branch, the copy's name, the states, the state refs setting and what
/// happened after the copy. A process on the copy that served it before (its own state, then
/// the copy forced over it) and a fresh one answer every read and write with a 400 naming both
/// branches, and push nothing; the original serves on. Once the original is deleted (a rename),
/// or its name is taken again by an unrelated branch, the copy is that branch's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_of_a_branch_of_states_never_serves_them_as_its_own() {
    init_tracing();
    let server = GitServer::start().await;
    let mut rng = StdRng::seed_from_u64(crate::misconfigured::seed("copies"));
    for case in 0..6 {
        let repo = format!("copies-{case}");
        let url = server.create_repo(&repo);
        let dir = server.repo_dir(&repo);
        let original = ORIGINALS[case % ORIGINALS.len()];
        let copy = *COPIES.choose(&mut rng).expect("some");
        let refs = ["auto", "always"][case % 2];
        let after =
            [After::Nothing, After::HandCommit, After::OriginalWrote][rng.random_range(0..3)];
        let names: Vec<&str> = NAMES[..rng.random_range(1..=NAMES.len())].to_vec();
        let context = format!("case {case}: {original} copied to {copy}, {refs}, then {after:?}");

        let writer = TestBackend::start(&url, &env(original, refs)).await;
        let kept = Client::new(&writer.url);
        let orig = Bare::new(&dir, original);
        for name in &names {
            kept.apply(name, "W", &state_json(&format!("lineage-{name}"), 3))
                .await;
            folded(&orig, name, 3).await;
        }
        // A process that served the copy's name as a branch of its own first (started from an
        // orphan commit holding the empty index, as the docs say).
        let copied = Bare::new(&dir, copy);
        copied.start_branch();
        let before = TestBackend::start(&url, &env(copy, refs)).await;
        let warm = Client::new(&before.url);
        warm.apply("own.tfstate", "O", &state_json("own", 1)).await;
        let tip = orig.tip(original).expect("the original");
        copied.git(
            &["update-ref", &format!("refs/heads/{copy}"), &tip],
            &[],
            b"",
        );
        match after {
            After::Nothing => {}
            After::HandCommit => {
                let write = crate::races::by_hand("README.md");
                copied.branch_write("README.md", Some(b"staging\n"), &write);
            }
            After::OriginalWrote => {
                kept.apply(
                    names[0],
                    "W",
                    &state_json(&format!("lineage-{}", names[0]), 4),
                )
                .await;
                folded(&orig, names[0], 4).await;
            }
        }
        let fresh = TestBackend::start(&url, &env(copy, refs)).await;
        let cold = Client::new(&fresh.url);
        let at_copy = copied.tip(copy);
        for (who, client) in [("warm", &warm), ("fresh", &cold)] {
            for name in &names {
                let answer = client.get_state(name).await;
                assert_eq!(
                    answer.status, 400,
                    "{context}: {who} GET {name}: {}",
                    answer.body
                );
                assert!(
                    answer.body.contains(&format!("\"{copy}\""))
                        && answer.body.contains(&format!("\"{original}\""))
                        && answer.body.contains("copy")
                        && !answer.body.trim().contains('\n'),
                    "{context}: one line naming both branches: {}",
                    answer.body
                );
            }
            // Nor are they listed, or their histories shown, as the copy's.
            let name = names[0];
            for path in ["/states".to_owned(), format!("/history/{name}")] {
                let answer = client.send("GET", &path, None).await;
                assert_eq!(
                    answer.status, 400,
                    "{context}: {who} GET {path}: {}",
                    answer.body
                );
            }
            client.lock(name, who).await.expect(200);
            let write = client
                .write_locked(name, who, &state_json(&format!("lineage-{name}"), 9))
                .await;
            assert_eq!(
                write.status, 400,
                "{context}: {who} write {name}: {}",
                write.body
            );
            client.unlock(name, who).await.expect(200);
        }
        assert_eq!(
            copied.tip(copy),
            at_copy,
            "{context}: the copy is untouched"
        );
        // The original serves on, in a fresh process too.
        let other = TestBackend::start(&url, &env(original, refs)).await;
        for client in [&kept, &Client::new(&other.url)] {
            let answer = client.get_state(names[0]).await;
            assert_eq!(
                answer.status, 200,
                "{context}: the original: {}",
                answer.body
            );
        }
        drop((writer, other));

        // Renamed: the original is deleted, then its name is taken by an unrelated branch.
        orig.git(
            &["update-ref", "-d", &format!("refs/heads/{original}")],
            &[],
            b"",
        );
        for state_ref in names.iter().map(|name| orig.state_ref(name)) {
            orig.git(&["update-ref", "-d", &state_ref], &[], b"");
        }
        orig.start_branch();
        let retaken = TestBackend::start(&url, &env(original, refs)).await;
        Client::new(&retaken.url)
            .apply(names[0], "N", &state_json("unrelated", 1))
            .await;
        let renamed = TestBackend::start(&url, &env(copy, refs)).await;
        for client in [&cold, &Client::new(&renamed.url)] {
            let answer = client.get_state(names[0]).await;
            assert_eq!(answer.status, 200, "{context}: renamed: {}", answer.body);
            assert!(
                answer.body.contains("lineage-"),
                "{context}: {}",
                answer.body
            );
        }
        let lineage = format!("lineage-{}", names[0]);
        cold.apply(names[0], "R", &state_json(&lineage, 10)).await;
        drop((before, fresh, retaken, renamed));
    }
}

/// A copy made where no commit names a branch (states written by hand or by a version before
/// the trailer, the seed's `.tfstate` files): another branch at the very tip, keeping states,
/// is refused on both sides, since neither can be told for the copy; once one is deleted (or
/// the tips part) the other serves. A branch made from one that keeps no states (the empty
/// index and a README: a new environment made in the host's web page) is no copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_of_unnamed_commits_is_refused_and_a_copy_of_no_states_is_not() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("unnamed");
    let dir = server.repo_dir("unnamed");
    let prod = Bare::new(&dir, "prod");
    let mut write = crate::races::by_hand("app.tfstate");
    write.message = "Update state\n".into();
    prod.branch_write(
        "app.tfstate",
        Some(state_json("seed", 4).as_bytes()),
        &write,
    );
    let tip = prod.tip("prod").expect("prod");
    prod.git(&["update-ref", "refs/heads/staging", &tip], &[], b"");
    let env = |branch| [("GITSTATE_REF", branch)];
    for branch in ["staging", "prod"] {
        let backend = TestBackend::start(&url, &env(branch)).await;
        let client = Client::new(&backend.url);
        let answer = client.get_state("app.tfstate").await;
        assert_eq!(answer.status, 400, "{branch}: {}", answer.body);
        assert!(
            answer.body.contains("\"staging\"") && answer.body.contains("\"prod\""),
            "{branch}: {}",
            answer.body
        );
        for path in ["/states", "/history/app.tfstate"] {
            let answer = client.send("GET", path, None).await;
            assert_eq!(answer.status, 400, "{branch}: GET {path}: {}", answer.body);
        }
    }
    prod.git(&["update-ref", "-d", "refs/heads/prod"], &[], b"");
    let staging = TestBackend::start(&url, &env("staging")).await;
    let client = Client::new(&staging.url);
    let answer = client.get_state("app.tfstate").await;
    assert_eq!(answer.status, 200, "the copy alone: {}", answer.body);
    client
        .apply("app.tfstate", "S", &state_json("seed", 5))
        .await;

    // No states: the empty index and a README, and a branch made from it.
    let url = server.create_repo("nothing");
    let dir = server.repo_dir("nothing");
    let main = Bare::new(&dir, "main");
    main.start_branch();
    let readme = crate::races::by_hand("README.md");
    main.branch_write("README.md", Some(b"states\n"), &readme);
    let tip = main.tip("main").expect("main");
    main.git(&["update-ref", "refs/heads/env/new", &tip], &[], b"");
    let fresh = TestBackend::start(&url, &env("env/new")).await;
    let client = Client::new(&fresh.url);
    let answer = client.get_state("app.tfstate").await;
    assert_eq!(answer.status, 404, "a copy of no states: {}", answer.body);
    client
        .apply("app.tfstate", "N", &state_json("new", 1))
        .await;
}
