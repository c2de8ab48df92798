//! Which state `gitstate run` serves, and that a mistake about it stops the run before Terraform
//! starts: a `state` named by a gitstate.toml above Terraform's directory (a monorepo's root
//! file, reached by `cd`, `-chdir`, `env -C` or a script's `--workdir`), and a
//! terraform-backend-git variable that disagrees with gitstate.toml (`state`, `ref`,
//! `repository`). Real terraform against the real `git http-backend`; nothing the refused runs
//! try reaches the repository.

use std::path::Path;
use std::process::Stdio;

use gitstate_tests::process::terraform;
use gitstate_tests::{GIT_TOKEN, GIT_USER, GitServer, git_output};

const NETWORK: &str = "network/prod.tfstate";
const APP: &str = "app/prod.tfstate";

fn git_in(git_dir: &Path, args: &[&str]) -> String {
    let mut all = vec!["--git-dir", git_dir.to_str().expect("utf-8")];
    all.extend_from_slice(args);
    let out = git_output(&all, None);
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Every ref of the repository and what it points at.
fn refs(git_dir: &Path) -> String {
    git_in(
        git_dir,
        &["for-each-ref", "--format=%(objectname) %(refname)"],
    )
}

/// The state at `path` on `main`, or "" when there is none.
fn stored(git_dir: &Path, path: &str) -> String {
    git_in(git_dir, &["show", &format!("main:{path}")])
}

fn write_resource(dir: &Path, name: &str) {
    std::fs::create_dir_all(dir).expect("dir");
    std::fs::write(
        dir.join("main.tf"),
        format!("resource \"terraform_data\" \"{name}\" {{\n  input = \"{name}\"\n}}\n"),
    )
    .expect("main.tf");
}

/// `gitstate ARGS…` in `dir`, with the repository's credentials and `env`, and no
/// `GITSTATE_*` or `TF_BACKEND_*` variable of the test's own environment.
async fn gitstate(dir: &Path, tfrc: &Path, args: &[&str], env: &[(&str, String)]) -> (i32, String) {
    let mut command = tokio::process::Command::new(crate::GITSTATE);
    command
        .args(args)
        .current_dir(dir)
        .env("TF_CLI_CONFIG_FILE", tfrc)
        .env("CHECKPOINT_DISABLE", "1")
        .env("TF_IN_AUTOMATION", "1")
        .env("TF_INPUT", "0")
        .env_remove("TF_HTTP_USERNAME")
        .env_remove("TF_HTTP_PASSWORD")
        .env_remove("TF_CLI_ARGS")
        .env_remove("TF_CLI_ARGS_init");
    for (var, _) in std::env::vars() {
        if var.starts_with("GITSTATE_") || var.starts_with("TF_BACKEND_") {
            command.env_remove(var);
        }
    }
    command
        .env("GITSTATE_GIT_USERNAME", GIT_USER)
        .env("GITSTATE_GIT_TOKEN", GIT_TOKEN)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = command.output().await.expect("gitstate starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

const INIT: &[&str] = &["init", "-input=false"];
const APPLY: &[&str] = &["apply", "-auto-approve", "-input=false"];

/// A monorepo whose root gitstate.toml names the repository and network's state. From the root,
/// the file's state is the one meant. Every way of running Terraform in `infra/app` below it
/// (`cd`, `-chdir`, `env -C`, a script with `--workdir`) is refused before Terraform starts,
/// naming the file and `--state`: before, each planned against network's state (GET 200), and
/// the apply replaced network's resources with app's in network's state. With `--state`, the
/// repository still comes from the root's file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_named_by_a_file_is_taken_only_in_that_files_directory() {
    let server = GitServer::start().await;
    let url = server.create_repo("mono");
    let git_dir = server.repo_dir("mono");
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("mono");
    let app = root.join("infra/app");
    let tfrc = tmp.path().join("empty.tfrc");
    std::fs::write(&tfrc, "").expect("tfrc");
    write_resource(&root, "network");
    write_resource(&app, "app");
    std::fs::write(
        root.join("gitstate.toml"),
        format!("repository = \"{url}\"\nstate = \"{NETWORK}\"\n"),
    )
    .expect("gitstate.toml");
    for args in [INIT, APPLY] {
        let all = [&["run", "--", "terraform"][..], args].concat();
        let (code, out) = gitstate(&root, &tfrc, &all, &[]).await;
        assert_eq!(code, 0, "{args:?} from the file's own directory: {out}");
        // The run says which state, repository and branch it uses, and from where.
        assert!(
            out.contains(&format!(
                "gitstate run: state {NETWORK} (`state` in gitstate.toml), repository {url} \
                 (`repository` in gitstate.toml), branch main (default)\n"
            )),
            "{out}"
        );
        assert!(!out.contains(GIT_TOKEN), "{out}");
    }
    let network = stored(&git_dir, NETWORK);
    assert!(network.contains("\"network\""), "{network}");
    let before = refs(&git_dir);

    let script = root.join("tf-app.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncd infra/app && exec {} \"$@\"\n",
            terraform().display()
        ),
    )
    .expect("script");
    std::process::Command::new("chmod")
        .args(["+x", script.to_str().expect("utf-8")])
        .status()
        .expect("chmod");
    let ways: [(&str, &Path, &[&str]); 4] = [
        ("cd", &app, &["--", "terraform"]),
        ("-chdir", &root, &["--", "terraform", "-chdir=infra/app"]),
        (
            "env -C",
            &root,
            &["--", "env", "-C", "infra/app", "terraform"],
        ),
        (
            "a script with --workdir",
            &root,
            &["--workdir", "infra/app", "--", "./tf-app.sh"],
        ),
    ];
    for (way, from, program) in ways {
        for args in [INIT, APPLY] {
            let all = [&["run"][..], program, args].concat();
            let (code, out) = gitstate(from, &tfrc, &all, &[]).await;
            assert_ne!(code, 0, "{way} {args:?} must be refused: {out}");
            let line = out
                .lines()
                .find(|l| l.contains("refusing to start the program"))
                .unwrap_or_else(|| panic!("{way} {args:?}: no refusal: {out}"));
            assert!(
                line.contains(&root.join("gitstate.toml").display().to_string())
                    && line.contains(NETWORK)
                    && line.contains("--state"),
                "{way} {args:?}: one line names the file, its state and --state: {out}"
            );
        }
        assert!(
            !app.join(".terraform").exists(),
            "{way}: Terraform ran in infra/app"
        );
        assert_eq!(refs(&git_dir), before, "{way}: the repository changed");
        assert_eq!(stored(&git_dir, NETWORK), network, "{way}");
    }

    // Named with --state, app's state is app's own; the repository comes from the root's file.
    for args in [INIT, APPLY] {
        let all = [&["run", "--state", APP, "--", "terraform"][..], args].concat();
        let (code, out) = gitstate(&app, &tfrc, &all, &[]).await;
        assert_eq!(code, 0, "{args:?} with --state: {out}");
        let file = root.join("gitstate.toml");
        assert!(
            out.contains(&format!(
                "gitstate run: state {APP} (--state), repository {url} (`repository` in {}), \
                 branch main (default)\n",
                file.display()
            )),
            "{out}"
        );
    }
    assert!(stored(&git_dir, APP).contains("\"app\""));
    assert_eq!(stored(&git_dir, NETWORK), network);
}

/// A CI job names its environment's state, branch or repository with terraform-backend-git's
/// variable; a gitstate.toml beside the code names another for local use. Before, the file won
/// silently and every job applied to the file's choice. Now each disagreement stops the run
/// before Terraform starts, naming the variable and the file's key; nothing is written anywhere.
/// A variable that agrees with the file runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_variable_that_disagrees_with_gitstate_toml_stops_the_run() {
    let server = GitServer::start().await;
    let url = server.create_repo("team");
    let other_url = server.create_repo("other");
    let (git_dir, other_dir) = (server.repo_dir("team"), server.repo_dir("other"));
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("env");
    let tfrc = tmp.path().join("empty.tfrc");
    std::fs::write(&tfrc, "").expect("tfrc");
    write_resource(&dir, "app");
    std::fs::write(
        dir.join("gitstate.toml"),
        format!("repository = \"{url}\"\nref = \"main\"\nstate = \"envs/dev.tfstate\"\n"),
    )
    .expect("gitstate.toml");
    for (var, key, value) in [
        ("TF_BACKEND_GIT_GIT_STATE", "state", "envs/prod.tfstate"),
        ("TF_BACKEND_GIT_GIT_REF", "ref", "prod"),
        (
            "TF_BACKEND_GIT_GIT_REPOSITORY",
            "repository",
            other_url.as_str(),
        ),
    ] {
        let env = [(var, value.to_owned())];
        for args in [INIT, APPLY] {
            let all = [&["run", "--", "terraform"][..], args].concat();
            let (code, out) = gitstate(&dir, &tfrc, &all, &env).await;
            assert_ne!(code, 0, "{var} {args:?} must be refused: {out}");
            assert!(
                out.contains(var)
                    && out.contains("gitstate.toml")
                    && out.contains(&format!("`{key}`")),
                "{var}: the refusal names the variable and the file's key: {out}"
            );
        }
        assert!(!dir.join(".terraform").exists(), "{var}: Terraform ran");
        assert_eq!(
            refs(&git_dir),
            "",
            "{var}: a write reached the file's repository"
        );
        assert_eq!(
            refs(&other_dir),
            "",
            "{var}: a write reached the variable's repository"
        );
    }
    // The variable agrees with the file: one state, the run goes ahead.
    let env = [("TF_BACKEND_GIT_GIT_STATE", "envs/dev.tfstate".to_owned())];
    for args in [INIT, APPLY] {
        let all = [&["run", "--", "terraform"][..], args].concat();
        let (code, out) = gitstate(&dir, &tfrc, &all, &env).await;
        assert_eq!(code, 0, "{args:?} with an agreeing variable: {out}");
    }
    assert!(stored(&git_dir, "envs/dev.tfstate").contains("\"app\""));
}
