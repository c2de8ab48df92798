//! `GITSTATE_REF` naming a branch that exists but keeps no states (a code branch, a redeploy's
//! default of `main`) while the states are on another branch: every read there was 404, and
//! Terraform planned to create every resource anew (then wrote a second state on the wrong
//! branch). Now such a read is a 400 naming the branches that hold the state, and "no state"
//! stays where the branch keeps states or the name is nowhere.

use gitstate_tests::handmade::Bare;
use gitstate_tests::{Client, GitServer, TestBackend, init_tracing, state_json};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom as _;
use rand::{Rng as _, SeedableRng as _};

use crate::terraform::{Cli, terraform_binary, transcript};

/// What the configured branch holds: never a state of its own.
const STATELESS: [(&str, &str); 3] = [
    ("README.md", "infrastructure code\n"),
    ("modules/vpc/main.tf", "variable \"cidr\" {}\n"),
    (".gitkeep", ""),
];

/// Where the states are kept, and the names they have there.
const ELSEWHERE: [&str; 4] = ["states", "terraform-state", "env/prod", "master"];
const NAMES: [&str; 4] = [
    "prod.tfstate",
    "network/vpc.tfstate",
    "team/app.json",
    "Team/DB.tfstate",
];

/// A name the read may use for `path`: the same, or a near name (letter case, `.json` or
/// `.tfstate` endings), as a slip when switching addresses makes it.
fn spelling(rng: &mut StdRng, path: &str) -> String {
    let (folder, file) = path.rsplit_once('/').unwrap_or(("", path));
    let stem = gitstate_core::refs::file_stem(file);
    let file = match rng.random_range(0..4) {
        0 => return path.to_owned(),
        1 => format!("{stem}.tfstate"),
        2 => format!("{stem}.json"),
        _ => file.to_uppercase(),
    };
    let name = match folder {
        "" => file,
        folder => format!("{folder}/{file}"),
    };
    if name != path {
        assert!(gitstate_core::refs::near_name(&name, path), "{name} {path}");
    }
    name
}

fn stamp(path: &str) -> gitstate_tests::handmade::StateWrite {
    crate::races::by_hand(path)
}

/// Generated repositories: the configured branch holds other files only (one to three of
/// `STATELESS`), a state is kept on another branch, written through gitstate (with its index)
/// or by hand (the seed's way, no index), and read by its name or a near one. Every read is a
/// 400 naming that branch, in the process that wrote nothing and in a fresh one, and pushes
/// nothing. So are a read of a name no branch has and a write, where that branch holds states
/// (the index, a `.tfstate` file; the seed's `.json` states count by name only). Once the
/// configured branch keeps a state of its own (the documented empty index, or a `.tfstate`
/// file), the name kept elsewhere is a new state there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_without_states_never_reads_another_branchs_state_as_no_state() {
    init_tracing();
    let server = GitServer::start().await;
    let mut rng = StdRng::seed_from_u64(crate::misconfigured::seed("wrong-branch"));
    for case in 0..8 {
        let repo = format!("wrong-{case}");
        let url = server.create_repo(&repo);
        let dir = server.repo_dir(&repo);
        let configured = ["main", "develop"][case % 2];
        let code = Bare::new(&dir, configured);
        for (path, text) in STATELESS.iter().take(rng.random_range(1..=3)) {
            code.branch_write(path, Some(text.as_bytes()), &stamp(path));
        }
        let elsewhere = *ELSEWHERE.choose(&mut rng).expect("some");
        let path = *NAMES.choose(&mut rng).expect("some");
        let by_gitstate = rng.random_bool(0.5);
        if by_gitstate {
            let env = [("GITSTATE_REF", elsewhere), ("GITSTATE_CREATE_REF", "true")];
            let writer = TestBackend::start(&url, &env).await;
            Client::new(&writer.url)
                .apply(path, "L", &state_json("kept", 3))
                .await;
        } else {
            let mut write = stamp(path);
            write.message = "Update state\n".into();
            Bare::new(&dir, elsewhere).branch_write(
                path,
                Some(state_json("seed", 3).as_bytes()),
                &write,
            );
        }
        let how = if by_gitstate { "gitstate" } else { "hand" };
        let env = [("GITSTATE_REF", configured)];
        let (first, second) = (
            TestBackend::start(&url, &env).await,
            TestBackend::start(&url, &env).await,
        );
        let (warm, fresh) = (Client::new(&first.url), Client::new(&second.url));
        // A branch "holds states" with gitstate's index or a `.tfstate` file; the seed's
        // `.json` states count by their names only.
        let holds = by_gitstate || path.ends_with(".tfstate");
        let unrelated = warm.get_state("nowhere/else.tfstate").await;
        assert_eq!(
            unrelated.status,
            if holds { 400 } else { 404 },
            "case {case}: a name no branch has, {elsewhere} holding states: {holds}: {}",
            unrelated.body
        );
        let before = code.tip(configured);
        for (who, client) in [("warm", &warm), ("fresh", &fresh)] {
            let name = spelling(&mut rng, path);
            let answer = client.get_state(&name).await;
            let context = format!(
                "case {case}: {name} read on {configured}, {path} kept on {elsewhere} by {how}, {who} process"
            );
            assert_eq!(answer.status, 400, "{context}: {}", answer.body);
            assert!(
                answer.body.contains(&format!("\"{elsewhere}\""))
                    && answer.body.contains("GITSTATE_REF")
                    && !answer.body.trim().contains('\n'),
                "{context}: one line naming the branch and the setting: {}",
                answer.body
            );
        }
        // A write there (a first apply whose read went to another process, `state push`)
        // is refused too while other branches hold states: the first state would turn the
        // check off and hide theirs from every later read.
        let fresh_name = "new/stack.tfstate";
        fresh.lock(fresh_name, "W").await.expect(200);
        let write = fresh
            .write_locked(fresh_name, "W", &state_json("stray", 1))
            .await;
        assert_eq!(
            write.status,
            if holds { 400 } else { 200 },
            "case {case}: a first write on {configured}: {}",
            write.body
        );
        fresh.unlock(fresh_name, "W").await.expect(200);
        if holds {
            assert_eq!(code.tip(configured), before, "case {case}: nothing pushed");
        }

        // The branch starts keeping states: then a name it lacks is a new state there.
        if rng.random_bool(0.5) {
            code.branch_write(
                ".gitstate/index.json",
                Some(br#"{"format":1,"states":{}}"#),
                &stamp(".gitstate/index.json"),
            );
        } else {
            code.branch_write(
                "other/kept.tfstate",
                Some(state_json("other", 1).as_bytes()),
                &stamp("other/kept.tfstate"),
            );
        }
        warm.get_state(path).await.expect(404);
        warm.apply(path, "N", &state_json("new", 1)).await;
        let read = warm.get_state(path).await.expect(200);
        assert!(read.body.contains("\"new\""), "case {case}: {}", read.body);
    }
}

/// An allowlisted `?ref=` is an environment, whose states share names with the others' by
/// design: a branch of one that keeps no states yet reads "no state", and its first apply
/// creates the state there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_environment_branch_without_states_is_still_a_create() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("environments");
    let dir = server.repo_dir("environments");
    let env = [("GITSTATE_ALLOWED_REFS", "env/*")];
    let backend = TestBackend::start(&url, &env).await;
    let client = Client::new(&backend.url);
    client
        .apply("app.tfstate", "L", &state_json("main", 2))
        .await;
    Bare::new(&dir, "env/test").branch_write("README.md", Some(b"test\n"), &stamp("README.md"));
    let answer = client
        .send("GET", "/states/app.tfstate?ref=env/test", None)
        .await;
    assert_eq!(answer.status, 404, "{}", answer.body);
}

/// Terraform itself, pointed at a backend whose `GITSTATE_REF` names a code branch while the
/// state is on `states`: `terraform init`, which reads the state, fails showing the status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terraform_fails_on_a_branch_without_states() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("infra");
    let dir = server.repo_dir("infra");
    let writer = TestBackend::start(
        &url,
        &[("GITSTATE_REF", "states"), ("GITSTATE_CREATE_REF", "true")],
    )
    .await;
    let resources = r#"{"version":4,"terraform_version":"1.11.4","serial":4,"lineage":"kept","outputs":{},"resources":[]}"#;
    Client::new(&writer.url)
        .apply("prod.tfstate", "L", resources)
        .await;
    Bare::new(&dir, "main").branch_write("main.tf", Some(b"# code\n"), &stamp("main.tf"));
    let backend = TestBackend::start(&url, &[("GITSTATE_REF", "main")]).await;
    let work = tempfile::tempdir().expect("tempdir");
    let base = &backend.url;
    let config = format!(
        r#"terraform {{
  backend "http" {{
    address        = "{base}/states/prod.tfstate"
    lock_address   = "{base}/locks/prod.tfstate"
    unlock_address = "{base}/locks/prod.tfstate"
    lock_method    = "POST"
    unlock_method  = "DELETE"
    retry_max      = 0
  }}
}}
resource "terraform_data" "a" {{
  input = "x"
}}
"#
    );
    std::fs::write(work.path().join("main.tf"), config).expect("main.tf");
    let cli = Cli::new(terraform_binary());
    let out = cli
        .run(work.path(), &["init", "-no-color", "-input=false"])
        .await;
    let text = transcript(&out);
    assert!(!out.status.success(), "init must fail:\n{text}");
    assert!(text.contains("400"), "the status is shown:\n{text}");
}
