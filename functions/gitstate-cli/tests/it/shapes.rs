//! Git requests per apply in every shape (issue 27): a `gitstate serve` process, one with KMS
//! encryption (moto), and `gitstate run -- terraform apply` with the real Terraform, each
//! against the machine's `git http-backend`. (The Lambda binary's counts are in the tests
//! crate, `lambda_watch::`, where cargo-lambda's emulator runs it.)
//!
//! The bounds are today's numbers ([`FLOOR`] where a shape reaches it, which is where issue 27
//! wants every shape). A change that takes a shape closer to the floor lowers its bounds here to
//! what it then measures.

use std::path::Path;
use std::process::Stdio;

use gitstate_tests::counting::{Apply, FLOOR, Requests, count_warm_applies};
use gitstate_tests::process::terraform;
use gitstate_tests::process::{ServeProcess, serve_env};
use gitstate_tests::{Client, GIT_TOKEN, GIT_USER, GitServer, Moto, Seen};

/// A warm `gitstate serve` as deployed by default, where a request of the same Terraform run may
/// reach another process behind the same address: the floor. The LOCK push asserts the branch at
/// the tip this process knows and shows that the state has no ref of its own (a probe that a ref
/// of that name refuses), or asserts the state's ref at its known tip, and the GETs after it (a
/// create's two) ask nothing, for the 2 s its lock commit records; any other process waits that
/// out before it writes under the lock or releases it.
const SERVE: Requests = FLOOR;

/// One `serve` in front of its clients (`GITSTATE_SINGLE_FRONT=true`): the same, for 5 s.
const SERVE_SINGLE_FRONT: Requests = FLOOR;

/// The same with KMS encryption: the write's plan knows the sealed stored state by its blob id
/// (the service remembers the version of what it wrote), so the write needs no second round.
const SERVE_KMS: Requests = FLOOR;

/// [`SERVE_SINGLE_FRONT`] with KMS encryption: the floor too.
const SERVE_KMS_SINGLE_FRONT: Requests = FLOOR;

/// A single front (see [`SERVE_SINGLE_FRONT`]).
fn single_front() -> (&'static str, String) {
    ("GITSTATE_SINGLE_FRONT", "true".to_owned())
}

/// `gitstate run -- terraform apply`, the whole command, as the first run in its working
/// directory and the repository's first LOCK: a new, cold process in front of Terraform, so on
/// top of the apply's own requests comes the wrapper's look at the repository when it starts
/// (one receive-pack advertisement, which shows the branch and the protocol record and carries
/// what the first LOCK needs to push without an advertisement of its own); the LOCK looks again
/// (nothing recorded yet) and records the lock ref prefix (one push); and the branch's tip was
/// committed by hand (no commit names its branch), so before the GET answers from what the LOCK
/// proved, the copy check lists the branches beside it (one advertisement, once per tip).
const RUN_FIRST_CREATE: usize = 7;

/// A run that follows a clean one in the same working directory within the hour (`terraform
/// init` through the wrapper is one): it takes up what that one saw (its cache keeps the
/// capabilities, the tip and that the protocol record agreed), so it makes no look of its own,
/// and its Terraform's apply goes at the floor (the wrapper is the single front of its
/// Terraform, see [`SERVE_SINGLE_FRONT`]).
const RUN: Requests = FLOOR;

const STATE: &str = "shapes/app.tfstate";

async fn serve(server: &GitServer, root: &Path, extra: &[(&str, String)]) -> ServeProcess {
    let url = server.create_repo("shapes");
    let extra: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let env = serve_env(&url, &extra);
    ServeProcess::start(Path::new(crate::GITSTATE), root, env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_applies_are_at_the_floor_with_a_single_front() {
    for (shape, extra, bound) in [
        ("serve", vec![], SERVE),
        (
            "serve, single front",
            vec![single_front()],
            SERVE_SINGLE_FRONT,
        ),
    ] {
        let server = GitServer::start().await;
        let root = tempfile::tempdir().expect("tempdir");
        let process = serve(&server, root.path(), &extra).await;
        let client = Client::new(&process.url);
        for apply in count_warm_applies(&server, &client, shape, STATE).await {
            apply.assert_within(shape, &bound);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_kms_applies_are_at_the_floor() {
    let moto = Moto::start().await;
    moto.create_key("shapes").await;
    for (shape, single, bound) in [
        ("serve + KMS", false, SERVE_KMS),
        ("serve + KMS, single front", true, SERVE_KMS_SINGLE_FRONT),
    ] {
        let server = GitServer::start().await;
        let root = tempfile::tempdir().expect("tempdir");
        let mut extra = moto.env();
        extra.push(("GITSTATE_KMS_KEY_IDS", "alias/shapes".to_owned()));
        if single {
            extra.push(single_front());
        }
        let process = serve(&server, root.path(), &extra).await;
        let client = Client::new(&process.url);
        for apply in count_warm_applies(&server, &client, shape, STATE).await {
            apply.assert_within(shape, &bound);
        }
        // The state is stored sealed.
        let stored = gitstate_tests::stored_file(&server, "shapes", STATE);
        assert!(
            String::from_utf8_lossy(&stored).contains("ENC["),
            "not sealed: {}",
            String::from_utf8_lossy(&stored)
        );
    }
}

fn config(dir: &Path, input: &str) {
    let text = format!("resource \"terraform_data\" \"item\" {{\n  input = \"{input}\"\n}}\n");
    std::fs::write(dir.join("main.tf"), text).expect("main.tf");
}

/// `gitstate run --state STATE -- terraform <args>` in `dir`: its git requests.
async fn run(server: &GitServer, dir: &Path, args: &[&str]) -> Vec<String> {
    let (labels, said, ok) = run_state(server, dir, STATE, args).await;
    assert!(ok, "terraform {args:?} failed: {said}");
    labels
}

/// `gitstate run --state state -- terraform <args>` in `dir`: its git requests, what it wrote
/// (standard output and error), and whether it succeeded.
async fn run_state(
    server: &GitServer,
    dir: &Path,
    state: &str,
    args: &[&str],
) -> (Vec<String>, String, bool) {
    server.take_requests();
    let out = tokio::process::Command::new(crate::GITSTATE)
        .args(["run", "--state", state, "--"])
        .arg(terraform())
        .args(args)
        .current_dir(dir)
        .env("TF_CLI_CONFIG_FILE", dir.join("empty.tfrc"))
        .env("CHECKPOINT_DISABLE", "1")
        .env("TF_IN_AUTOMATION", "1")
        .env("TF_INPUT", "0")
        .env_remove("TF_HTTP_USERNAME")
        .env_remove("TF_HTTP_PASSWORD")
        .env("GITSTATE_REPOSITORY", server.url("shapes"))
        .env("GITSTATE_GIT_USERNAME", GIT_USER)
        .env("GITSTATE_GIT_TOKEN", GIT_TOKEN)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("gitstate run starts");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let labels = server.take_requests().iter().map(Seen::label).collect();
    (labels, said, out.status.success())
}

/// Real Terraform through the wrapper: the first apply creates the state, a changed input
/// updates it, an apply with nothing to change is a no-op, and another state is created; then
/// an update from another working directory whose only run so far was `terraform init`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_applies_are_at_the_floor_after_a_clean_run() {
    let server = GitServer::start().await;
    server.create_repo("shapes");
    // Another state is there already: the create adds a file to a branch, as most creates do.
    let other = gitstate_tests::state_json("other", 1);
    gitstate_tests::commit_file(&server, "shapes", "shapes/other.tfstate", other.as_bytes());
    let apply = ["apply", "-auto-approve", "-input=false"];
    let (first, second) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let steps = [
        (first.path(), STATE, Apply::Create, "one"),
        (first.path(), STATE, Apply::Update, "two"),
        (first.path(), STATE, Apply::NoOp, "two"),
        (first.path(), "shapes/second.tfstate", Apply::Create, "two"),
        (second.path(), STATE, Apply::Update, "three"),
    ];
    for (i, (dir, state, kind, input)) in steps.into_iter().enumerate() {
        if !dir.join("empty.tfrc").exists() {
            std::fs::write(dir.join("empty.tfrc"), "").expect("cli config");
            config(dir, input);
            run(&server, dir, &["init", "-input=false"]).await;
        }
        config(dir, input);
        let (labels, said, ok) = run_state(&server, dir, state, &apply).await;
        assert!(ok, "{kind:?} apply failed: {said}");
        let bound = if i == 0 {
            RUN_FIRST_CREATE
        } else {
            RUN.of(kind)
        };
        eprintln!("gitstate run: {kind:?} = {}: {labels:?}", labels.len());
        assert!(
            labels.len() <= bound,
            "gitstate run: a {kind:?} apply made {} git requests, the bound is {bound} (floor \
             {}): {labels:?}",
            labels.len(),
            FLOOR.of(kind)
        );
    }
    let stored: serde_json::Value =
        serde_json::from_slice(&gitstate_tests::stored_file(&server, "shapes", STATE))
            .expect("a state");
    assert_eq!(
        stored["serial"], 3,
        "the create and the updates wrote, the no-op did not"
    );
    assert_eq!(
        stored["resources"][0]["instances"][0]["attributes"]["input"]["value"],
        "three"
    );

    // A token that may only read, where the last run was clean: nothing is looked at first, so
    // a plan without a lock reads, and an apply fails on its LOCK, loudly, leaving no lock.
    let dir = first.path();
    let repo = server.repo_dir("shapes");
    let refuse = std::process::Command::new("git")
        .args(["config", "http.receivepack", "false"])
        .current_dir(&repo)
        .status()
        .expect("git config");
    assert!(refuse.success());
    let plan = ["plan", "-lock=false", "-input=false"];
    let (labels, said, ok) = run_state(&server, dir, STATE, &plan).await;
    assert!(ok, "the plan: {said}");
    assert!(
        labels.iter().all(|l| l.ends_with("upload-pack")),
        "reads only: {labels:?}"
    );
    config(dir, "four");
    let (_, said, ok) = run_state(&server, dir, STATE, &apply).await;
    eprintln!("gitstate run: an apply with a token that may only read:\n{said}");
    assert!(
        !ok && said.contains("Error"),
        "the apply did not fail: {said}"
    );
    let refs = gitstate_tests::git(&["for-each-ref", "--format=%(refname)"], Some(&repo));
    assert!(
        !refs.contains("refs/heads/locks/"),
        "a lock was left: {refs}"
    );
    // A failed run leaves nothing to take up: the next one looks, its look for pushes is
    // refused (403), it says so before Terraform starts, and looks the way reads do.
    let (labels, said, ok) = run_state(&server, dir, STATE, &plan).await;
    eprintln!("gitstate run: a plan with a token that may only read: {labels:?}\n{said}");
    assert!(ok, "the plan: {said}");
    assert!(
        said.contains("the look that pushes begin with failed") && said.contains("403"),
        "no warning that pushes may be refused: {said}"
    );
    assert_eq!(
        labels
            .iter()
            .filter(|l| *l == "GET refs/upload-pack")
            .count(),
        labels.len() - 1,
        "one refused push look, then reads: {labels:?}"
    );
}
