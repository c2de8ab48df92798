//! terraform-backend-git's users, unchanged: its three modes (the wrapper `gitstate git …
//! terraform …`, its HCL file, the standalone server with its environment and `stop`), real
//! terraform against the real `git http-backend`, on a repository whose branch is `master`; its
//! lock branches taken and read the seed's way with the git CLI; its `aes` states read and
//! written as it writes them (Python's `cryptography` as the oracle).

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use gitstate_tests::process::terraform;
use gitstate_tests::{GIT_TOKEN, GIT_USER, GitServer, git, git_output};

const STATE: &str = "my/state.json";

/// A repository as the seed's users have one: a commit on `master`, its default branch.
fn seed_repo(server: &GitServer, name: &str) -> String {
    seed_repo_on(server, name, "master")
}

/// A repository with one commit on `branch`, its default branch.
fn seed_repo_on(server: &GitServer, name: &str, branch: &str) -> String {
    let url = server.create_repo(name);
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    git(
        &["init", "-q", &format!("--initial-branch={branch}")],
        Some(dir),
    );
    std::fs::write(dir.join("README.md"), "terraform states\n").expect("readme");
    git(&["add", "README.md"], Some(dir));
    git(
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "-m",
            "start",
        ],
        Some(dir),
    );
    git(
        &[
            "push",
            "-q",
            &server.url_with_credentials(name),
            &format!("{branch}:{branch}"),
        ],
        Some(dir),
    );
    git(
        &["symbolic-ref", "HEAD", &format!("refs/heads/{branch}")],
        Some(&server.repo_dir(name)),
    );
    url
}

fn git_in(git_dir: &Path, args: &[&str]) -> Output {
    let mut all = vec!["--git-dir", git_dir.to_str().expect("utf-8")];
    all.extend_from_slice(args);
    git_output(&all, None)
}

fn stored(git_dir: &Path, branch: &str, path: &str) -> Option<Vec<u8>> {
    let out = git_in(git_dir, &["show", &format!("{branch}:{path}")]);
    out.status.success().then_some(out.stdout)
}

fn serial(bytes: &[u8]) -> u64 {
    let state: serde_json::Value = serde_json::from_slice(bytes).expect("state is JSON");
    state["serial"].as_u64().expect("serial")
}

fn branches(git_dir: &Path) -> String {
    let out = git_in(
        git_dir,
        &["for-each-ref", "--format=%(refname)", "refs/heads/"],
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn workdir(sleep: u32, input: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(dir.path(), sleep, input);
    std::fs::write(dir.path().join("empty.tfrc"), "").expect("cli config");
    dir
}

fn write_config(dir: &Path, sleep: u32, input: &str) {
    std::fs::write(
        dir.join("main.tf"),
        format!(
            "resource \"terraform_data\" \"x\" {{\n  input = \"{input}\"\n  \
             triggers_replace = \"{input}\"\n  \
             provisioner \"local-exec\" {{\n    command = \"sleep {sleep}\"\n  }}\n}}\n"
        ),
    )
    .expect("main.tf");
}

/// `gitstate ARGS…` in `work` with the seed's environment `env` and nothing of gitstate's.
fn gitstate(work: &Path, args: &[&str], env: &[(&str, String)]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(crate::GITSTATE);
    command
        .args(args)
        .current_dir(work)
        .env("TF_CLI_CONFIG_FILE", work.join("empty.tfrc"))
        .env("CHECKPOINT_DISABLE", "1")
        .env("TF_IN_AUTOMATION", "1")
        .env("TF_INPUT", "0")
        .env_remove("TF_HTTP_USERNAME")
        .env_remove("TF_HTTP_PASSWORD")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (var, _) in std::env::vars() {
        if var.starts_with("GITSTATE_") || var.starts_with("TF_BACKEND_") {
            command.env_remove(var);
        }
    }
    command
}

async fn output(mut command: tokio::process::Command) -> (i32, String) {
    let out = command.output().await.expect("gitstate starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// The seed's git credentials: `GIT_USERNAME` and `GIT_PASSWORD`.
fn seed_git_env() -> Vec<(&'static str, String)> {
    vec![
        ("GIT_USERNAME", GIT_USER.into()),
        ("GIT_PASSWORD", GIT_TOKEN.into()),
    ]
}

/// The wrapper as the seed's README writes it, then its HCL mode, then `gitstate run` without
/// `--` reading the state from gitstate.toml: every state lands on `master` (the seed's
/// default), no `main` appears, and the apply-plan cycle is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrapper_and_hcl_modes_with_the_seeds_defaults() {
    let server = GitServer::start().await;
    let url = seed_repo(&server, "seed");
    let git_dir = server.repo_dir("seed");
    let tf = terraform();
    let tf = tf.to_str().expect("utf-8");
    let work = workdir(0, "one");
    let dir = work.path();
    let wrapper = |args: &[&str]| {
        let mut all = vec![
            "--access-logs",
            "git",
            "--repository",
            url.as_str(),
            "--state",
            STATE,
            tf,
        ];
        all.extend_from_slice(args);
        gitstate(dir, &all, &seed_git_env())
    };
    let (code, out) = output(wrapper(&["init", "-input=false"])).await;
    assert_eq!(code, 0, "init: {out}");
    let (code, out) = output(wrapper(&["apply", "-auto-approve"])).await;
    assert_eq!(code, 0, "apply: {out}");
    assert_eq!(
        stored(&git_dir, "master", STATE).map(|s| serial(&s)),
        Some(1),
        "{out}"
    );
    assert_eq!(branches(&git_dir), "refs/heads/master", "no other branch");
    let (code, out) = output(wrapper(&["plan", "-detailed-exitcode"])).await;
    assert_eq!(code, 0, "plan without changes: {out}");

    // The HCL file next to the code names repository, branch and state; the wrapper names none.
    std::fs::write(
        dir.join("terraform-backend-git.hcl"),
        format!("git.repository = \"{url}\"\ngit.ref = \"master\"\ngit.state = \"{STATE}\"\n"),
    )
    .expect("hcl");
    write_config(dir, 0, "two");
    let (code, out) = output(gitstate(
        dir,
        &["git", tf, "apply", "-auto-approve"],
        &seed_git_env(),
    ))
    .await;
    assert_eq!(code, 0, "apply through the HCL file: {out}");
    assert_eq!(
        stored(&git_dir, "master", STATE).map(|s| serial(&s)),
        Some(2)
    );
    // The seed's variables, mixed with the file: TF_BACKEND_GIT_GIT_STATE names another state.
    let mut env = seed_git_env();
    env.push(("TF_BACKEND_GIT_GIT_STATE", "other/state.json".into()));
    let other = workdir(0, "three");
    std::fs::copy(
        dir.join("terraform-backend-git.hcl"),
        other.path().join("terraform-backend-git.hcl"),
    )
    .expect("copy");
    let (code, out) = output(gitstate(other.path(), &["git", tf, "init"], &env)).await;
    assert_eq!(code, 0, "init: {out}");
    let (code, out) = output(gitstate(
        other.path(),
        &["git", tf, "apply", "-auto-approve"],
        &env,
    ))
    .await;
    assert_eq!(code, 0, "apply: {out}");
    assert_eq!(
        stored(&git_dir, "master", "other/state.json").map(|s| serial(&s)),
        Some(1)
    );

    // gitstate's own form, without `--`, the state from gitstate.toml's `state`, the rest from
    // the seed's file: `config` says where each came from.
    std::fs::write(dir.join("gitstate.toml"), format!("state = \"{STATE}\"\n")).expect("toml");
    let (code, out) = output(gitstate(dir, &["config"], &seed_git_env())).await;
    assert_eq!(code, 0, "config: {out}");
    let row = |key: &str| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(key))
            .unwrap_or_else(|| panic!("no {key} row: {out}"))
            .to_owned()
    };
    assert!(row("state").contains("gitstate.toml"), "{out}");
    assert!(
        row("repository").contains("terraform-backend-git.hcl"),
        "{out}"
    );
    assert!(row("git_username").contains("GIT_USERNAME"), "{out}");
    assert!(row("git_token").contains("GIT_PASSWORD"), "{out}");
    assert!(!out.contains(GIT_TOKEN), "the token is never shown: {out}");
    let (code, out) = output(gitstate(
        dir,
        &["run", tf, "plan", "-detailed-exitcode"],
        &seed_git_env(),
    ))
    .await;
    assert_eq!(code, 0, "run without `--`: {out}");
    assert_eq!(branches(&git_dir), "refs/heads/master", "no other branch");
}

/// A lock taken the seed's way (a `locks/<state>` branch holding `<state>.lock`, pushed with the
/// git CLI) stops gitstate's Terraform with that lock's ID; deleting the branch (the seed's
/// unlock) frees it. The other way: while gitstate's Terraform holds the lock, the seed's check
/// finds its branch and LockInfo, and the seed's lock push is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_branches_are_honoured_both_ways() {
    let server = GitServer::start().await;
    let url = seed_repo(&server, "locks");
    let remote = server.url_with_credentials("locks");
    let git_dir = server.repo_dir("locks");
    let tf = terraform();
    let tf = tf.to_str().expect("utf-8");
    let work = workdir(0, "one");
    let dir = work.path();
    let wrapper = |args: &[&str]| {
        let mut all = vec!["git", "--repository", url.as_str(), "--state", STATE, tf];
        all.extend_from_slice(args);
        gitstate(dir, &all, &seed_git_env())
    };
    let (code, out) = output(wrapper(&["init", "-input=false"])).await;
    assert_eq!(code, 0, "init: {out}");

    // The seed's Lock routine, step by step with the git CLI.
    let clone_dir = tempfile::tempdir().expect("tempdir");
    let clone = clone_dir.path().join("c");
    let clone_str = clone.to_str().expect("utf-8");
    git(
        &["clone", "-q", "--branch", "master", &remote, clone_str],
        None,
    );
    let lock_branch = format!("locks/{STATE}");
    git(&["checkout", "-q", "-b", &lock_branch], Some(&clone));
    let seed_id = "6f1a1f9e-seed-lock";
    std::fs::create_dir_all(clone.join("my")).expect("dir");
    std::fs::write(
        clone.join(format!("{STATE}.lock")),
        gitstate_tests::lock_info(seed_id),
    )
    .expect("lock file");
    git(&["add", &format!("{STATE}.lock")], Some(&clone));
    git(
        &[
            "-c",
            "user.name=seed",
            "-c",
            "user.email=s@s",
            "commit",
            "-q",
            "-m",
            &format!("Lock {STATE}"),
        ],
        Some(&clone),
    );
    git(&["push", "-q", "origin", &lock_branch], Some(&clone));

    let (code, out) = output(wrapper(&["apply", "-auto-approve", "-lock-timeout=0s"])).await;
    assert_ne!(code, 0, "apply under the seed's lock: {out}");
    assert!(out.contains("Error acquiring the state lock"), "{out}");
    assert!(out.contains(seed_id), "the seed's lock ID is named: {out}");
    assert_eq!(stored(&git_dir, "master", STATE), None, "nothing written");
    // The seed's Unlock: delete the branch.
    git(
        &["push", "-q", "origin", "--delete", &lock_branch],
        Some(&clone),
    );
    let (code, out) = output(wrapper(&["apply", "-auto-approve"])).await;
    assert_eq!(code, 0, "apply once unlocked: {out}");

    // gitstate's Terraform holds the lock during a slow apply.
    write_config(dir, 30, "slow");
    let mut slow = wrapper(&["apply", "-auto-approve"])
        .spawn()
        .expect("slow apply");
    let deadline = Instant::now() + Duration::from_secs(20);
    let info = loop {
        // The seed's "Check existing Lock": fetch locks/*, read <state>.lock.
        let fetched = git_output(
            &[
                "fetch",
                "-q",
                "origin",
                "+refs/heads/locks/*:refs/remotes/origin/locks/*",
            ],
            Some(&clone),
        );
        assert!(fetched.status.success());
        let shown = git_output(
            &[
                "show",
                &format!("refs/remotes/origin/{lock_branch}:{STATE}.lock"),
            ],
            Some(&clone),
        );
        if shown.status.success() {
            break serde_json::from_slice::<serde_json::Value>(&shown.stdout).expect("LockInfo");
        }
        if Instant::now() > deadline {
            let _ = slow.start_kill();
            let out = slow.wait_with_output().await.expect("wait");
            panic!(
                "gitstate's lock branch never appeared: {shown:?}\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(info["Operation"], "OperationTypeApply", "{info}");
    // The seed's Lock now fails: its push of a new locks/<state> branch is refused.
    git(&["checkout", "-q", "master"], Some(&clone));
    git(&["branch", "-q", "-D", &lock_branch], Some(&clone));
    git(&["checkout", "-q", "-b", &lock_branch], Some(&clone));
    std::fs::create_dir_all(clone.join("my")).expect("dir");
    std::fs::write(
        clone.join(format!("{STATE}.lock")),
        gitstate_tests::lock_info("seed-second"),
    )
    .expect("lock file");
    git(&["add", &format!("{STATE}.lock")], Some(&clone));
    git(
        &[
            "-c",
            "user.name=seed",
            "-c",
            "user.email=s@s",
            "commit",
            "-q",
            "-m",
            "Lock",
        ],
        Some(&clone),
    );
    let pushed = git_output(&["push", "-q", "origin", &lock_branch], Some(&clone));
    assert!(
        !pushed.status.success(),
        "the seed's lock push is refused while gitstate holds the lock: {pushed:?} {}",
        String::from_utf8_lossy(&git_in(&git_dir, &["for-each-ref", "refs/heads/"]).stdout)
    );
    let out = tokio::time::timeout(Duration::from_secs(90), slow.wait_with_output())
        .await
        .expect("the slow apply ends")
        .expect("wait");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        stored(&git_dir, "master", STATE).map(|s| serial(&s)),
        Some(2)
    );
    let locks = git_in(&git_dir, &["for-each-ref", "refs/heads/locks/"]);
    assert!(locks.stdout.is_empty(), "the lock branch is gone");
}

/// Python's AES-GCM as the seed writes it: key = md5(passphrase) in hex, nonce ‖ ciphertext.
fn python_aes(mode: &str, passphrase: &str, input: &[u8]) -> Vec<u8> {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/tools/.venv/bin/python");
    let script = r#"
import hashlib, os, sys
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
mode, passphrase = sys.argv[1], sys.argv[2]
key = hashlib.md5(passphrase.encode()).hexdigest().encode()
data = sys.stdin.buffer.read()
if mode == "seal":
    nonce = os.urandom(12)
    sys.stdout.buffer.write(nonce + AESGCM(key).encrypt(nonce, data, None))
else:
    sys.stdout.buffer.write(AESGCM(key).decrypt(data[:12], data[12:], None))
"#;
    let mut child = std::process::Command::new(&python)
        .args(["-c", script, mode, passphrase])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (tests/run installs it)", python.display()));
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input)
        .expect("write");
    let out = child.wait_with_output().expect("python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The standalone mode with the seed's environment: `gitstate &` on TF_BACKEND_GIT_ADDRESS,
/// Basic auth from TF_BACKEND_GIT_HTTP_USERNAME/PASSWORD, a backend block in the seed's address
/// format (locks on the same URL, Terraform's LOCK/UNLOCK methods), an `aes` state written by
/// the seed read, and written back in `aes`; then `gitstate stop` ends it and its pid file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_mode_with_the_seeds_environment_and_aes_states() {
    let server = GitServer::start().await;
    let url = seed_repo(&server, "alone");
    let git_dir = server.repo_dir("alone");
    let passphrase = "seed passphrase";
    // A state the seed wrote in aes mode, on master.
    let tf = terraform();
    let prior = workdir(0, "one");
    let (code, out) = output(gitstate(
        prior.path(),
        &[
            "git",
            "--repository",
            &url,
            "--state",
            STATE,
            tf.to_str().expect("utf-8"),
            "init",
        ],
        &seed_git_env(),
    ))
    .await;
    assert_eq!(code, 0, "{out}");
    let (code, out) = output(gitstate(
        prior.path(),
        &[
            "git",
            "--repository",
            &url,
            "--state",
            STATE,
            tf.to_str().expect("utf-8"),
            "apply",
            "-auto-approve",
        ],
        &seed_git_env(),
    ))
    .await;
    assert_eq!(code, 0, "{out}");
    let plain = stored(&git_dir, "master", STATE).expect("state");
    let sealed = python_aes("seal", passphrase, &plain);
    let work_clone = tempfile::tempdir().expect("tempdir");
    let clone = work_clone.path().join("c");
    git(
        &[
            "clone",
            "-q",
            &server.url_with_credentials("alone"),
            clone.to_str().expect("utf-8"),
        ],
        None,
    );
    std::fs::write(clone.join(STATE), &sealed).expect("sealed");
    git(&["add", STATE], Some(&clone));
    git(
        &[
            "-c",
            "user.name=s",
            "-c",
            "user.email=s@s",
            "commit",
            "-q",
            "-m",
            "aes",
        ],
        Some(&clone),
    );
    git(&["push", "-q", "origin", "master"], Some(&clone));

    let port = gitstate_tests::free_port();
    let mut env = seed_git_env();
    env.extend([
        ("TF_BACKEND_GIT_ADDRESS", format!("127.0.0.1:{port}")),
        ("TF_BACKEND_GIT_GIT_REPOSITORY", url.clone()),
        ("TF_BACKEND_GIT_HTTP_USERNAME", "ci".into()),
        ("TF_BACKEND_GIT_HTTP_PASSWORD", "ci-password".into()),
        ("TF_BACKEND_HTTP_ENCRYPTION_PROVIDER", "aes".into()),
        ("TF_BACKEND_HTTP_ENCRYPTION_PASSPHRASE", passphrase.into()),
    ]);
    let work = prior;
    let dir = work.path();
    let mut standalone = gitstate(dir, &[], &env).spawn().expect("standalone starts");
    let base = format!("http://localhost:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while reqwest::get(format!("{base}/health")).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the standalone server never answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let address = format!("{base}/?type=git&repository={url}&ref=master&state={STATE}");
    std::fs::write(
        dir.join("backend.tf"),
        format!(
            "terraform {{\n  backend \"http\" {{\n    address = \"{address}\"\n    \
             lock_address = \"{address}\"\n    unlock_address = \"{address}\"\n    \
             username = \"ci\"\n    password = \"ci-password\"\n  }}\n}}\n"
        ),
    )
    .expect("backend.tf");
    let plain_tf = |args: &[&str]| {
        let mut command = tokio::process::Command::new(&tf);
        command
            .args(args)
            .current_dir(dir)
            .env("TF_CLI_CONFIG_FILE", dir.join("empty.tfrc"))
            .env("CHECKPOINT_DISABLE", "1")
            .env("TF_IN_AUTOMATION", "1")
            .env("TF_INPUT", "0")
            .env_remove("TF_HTTP_USERNAME")
            .env_remove("TF_HTTP_PASSWORD")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    };
    let (code, out) = output(plain_tf(&["init", "-reconfigure", "-input=false"])).await;
    assert_eq!(code, 0, "init: {out}");
    // The aes state is read: nothing to change.
    let (code, out) = output(plain_tf(&["plan", "-detailed-exitcode"])).await;
    assert_eq!(code, 0, "plan reads the seed's aes state: {out}");
    write_config(dir, 0, "two");
    let (code, out) = output(plain_tf(&["apply", "-auto-approve"])).await;
    assert_eq!(code, 0, "apply: {out}");
    let written = stored(&git_dir, "master", STATE).expect("state");
    assert!(
        serde_json::from_slice::<serde_json::Value>(&written).is_err(),
        "the write stays encrypted, as the seed wrote it"
    );
    let opened = python_aes("open", passphrase, &written);
    assert_eq!(serial(&opened), 2, "the seed opens gitstate's write");
    let locks = git_in(&git_dir, &["for-each-ref", "refs/heads/locks/"]);
    assert!(locks.stdout.is_empty(), "no lock left");
    // A wrong password is refused.
    let refused = reqwest::Client::new()
        .get(&address)
        .basic_auth("ci", Some("wrong"))
        .send()
        .await
        .expect("answer");
    assert_eq!(refused.status(), 401);

    // A pid file naming a process that is not gitstate (its pid reused) stops nothing.
    let pid_file = std::env::temp_dir().join(format!("gitstate-standalone-{port}.pid"));
    let real_pid = std::fs::read_to_string(&pid_file).expect("pid file");
    let mut other = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("sleep");
    std::fs::write(&pid_file, other.id().to_string()).expect("pid file");
    let (code, out) = output(gitstate(dir, &["stop"], &env)).await;
    assert_ne!(
        code, 0,
        "stop signalled a process that is not gitstate: {out}"
    );
    assert!(
        other.try_wait().expect("sleep").is_none(),
        "the other process was signalled"
    );
    let _ = other.kill();
    let _ = other.wait();
    std::fs::write(&pid_file, real_pid).expect("pid file");

    let (code, out) = output(gitstate(dir, &["stop"], &env)).await;
    assert_eq!(code, 0, "stop: {out}");
    let status = tokio::time::timeout(Duration::from_secs(20), standalone.wait())
        .await
        .expect("the server ends after stop")
        .expect("wait");
    assert!(status.success(), "a clean exit on SIGTERM: {status:?}");
    assert!(
        !std::env::temp_dir()
            .join(format!("gitstate-standalone-{port}.pid"))
            .exists(),
        "the pid file is gone"
    );
    let (code, out) = output(gitstate(dir, &["stop"], &env)).await;
    assert_ne!(code, 0, "nothing left to stop: {out}");
    assert!(out.contains("no standalone server"), "{out}");
}

/// Replace `path` on `master` of the server's repository `name` with `content`, as a git user
/// would (clone, commit, push).
fn commit_file(server: &GitServer, name: &str, path: &str, content: &[u8]) {
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    git(
        &[
            "clone",
            "-q",
            "--branch",
            "master",
            &server.url_with_credentials(name),
            ".",
        ],
        Some(dir),
    );
    let file = dir.join(path);
    std::fs::create_dir_all(file.parent().expect("a folder")).expect("folders");
    std::fs::write(&file, content).expect("write");
    git(&["add", path], Some(dir));
    let commit = [
        "-c",
        "user.name=seed",
        "-c",
        "user.email=s@s",
        "commit",
        "-q",
        "-m",
        "seed",
    ];
    git(&commit, Some(dir));
    git(&["push", "-q", "origin", "master"], Some(dir));
}

/// A sops state as the seed writes it with `TF_BACKEND_HTTP_ENCRYPTION_PROVIDER=sops`: a KMS
/// key of `TF_BACKEND_HTTP_SOPS_AWS_KMS_ARNS` under the encryption context of
/// `TF_BACKEND_HTTP_SOPS_AWS_KMS_CONTEXT`, JSON tree mode (made here by the stock sops 3.11 with
/// that key and context, moto as KMS). Through the wrapper with the seed's variables, terraform
/// reads it in place (a plan without changes), writes the next state under the same key and
/// context (sops 3.11 opens it: serial 2), and reads that again; the same variables naming
/// another context fail loudly instead of planning against no state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sops_states_the_seed_wrote_are_read_under_its_kms_context() {
    let server = GitServer::start().await;
    let url = seed_repo(&server, "sops");
    let git_dir = server.repo_dir("sops");
    let moto = gitstate_tests::Moto::start().await;
    let arn = moto.create_key("seed-sops").await;
    let tf = terraform();
    let tf = tf.to_str().expect("utf-8");
    let work = workdir(0, "one");
    let dir = work.path();
    let wrapper = |args: &[&str], env: &[(&str, String)]| {
        let mut all = vec!["git", "--repository", url.as_str(), "--state", STATE, tf];
        all.extend_from_slice(args);
        gitstate(dir, &all, env)
    };
    let plain_env = seed_git_env();
    for args in [&["init", "-input=false"][..], &["apply", "-auto-approve"]] {
        let (code, out) = output(wrapper(args, &plain_env)).await;
        assert_eq!(code, 0, "{args:?}: {out}");
    }
    let plain = stored(&git_dir, "master", STATE).expect("the plain state");
    let groups = format!(
        "      - kms:\n          - arn: {arn:?}\n            context:\n              \
         team: \"infra\"\n              env: \"prod\"\n"
    );
    let sealed = gitstate_tests::sops::sops_encrypt_json(&groups, None, &plain, &moto.env());
    assert!(!String::from_utf8_lossy(&sealed).contains("terraform_data"));
    commit_file(&server, "sops", STATE, &sealed);

    let sops_env = |context: &str| {
        let mut env = seed_git_env();
        env.extend(moto.env());
        env.extend([
            ("TF_BACKEND_HTTP_ENCRYPTION_PROVIDER", "sops".to_owned()),
            ("TF_BACKEND_HTTP_SOPS_AWS_KMS_ARNS", arn.clone()),
            ("TF_BACKEND_HTTP_SOPS_AWS_KMS_CONTEXT", context.to_owned()),
        ]);
        env
    };
    let seed = sops_env("team=infra,env=prod");
    let (code, out) = output(wrapper(&["plan", "-detailed-exitcode"], &seed)).await;
    assert_eq!(code, 0, "the seed's sops state read in place: {out}");

    write_config(dir, 0, "two");
    let (code, out) = output(wrapper(&["apply", "-auto-approve"], &seed)).await;
    assert_eq!(code, 0, "apply over the seed's sops state: {out}");
    let written = stored(&git_dir, "master", STATE).expect("written");
    let doc: serde_json::Value = serde_json::from_slice(&written).expect("a sops file");
    let kms = &doc["sops"]["kms"][0];
    assert_eq!(kms["arn"], arn.as_str());
    assert_eq!(
        kms["context"],
        serde_json::json!({"team": "infra", "env": "prod"}),
        "written under the seed's context"
    );
    let opened = gitstate_tests::sops::break_glass(&written, &moto.env());
    assert_eq!(serial(&opened), 2);
    let (code, out) = output(wrapper(&["plan", "-detailed-exitcode"], &seed)).await;
    assert_eq!(code, 0, "read back under the seed's context: {out}");

    let other = sops_env("team=infra,env=dev");
    let (code, out) = output(wrapper(&["plan", "-detailed-exitcode"], &other)).await;
    assert_eq!(
        code, 1,
        "another context fails, never a plan from nothing: {out}"
    );
    assert_eq!(stored(&git_dir, "master", STATE), Some(written));
}

/// The seed's interface on a repository whose branch is `main`, not the seed's default `master`:
/// every mode fails loudly, naming `main`, and no `master` branch is created (the rule of the
/// missing branch holds where the seed's defaults apply).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_master_default_on_a_main_repository_fails_loudly() {
    let server = GitServer::start().await;
    let url = seed_repo_on(&server, "mainline", "main");
    let git_dir = server.repo_dir("mainline");
    let tf = terraform();
    let tf = tf.to_str().expect("utf-8");
    let work = workdir(0, "one");
    let dir = work.path();
    let wrapper = ["git", "--repository", url.as_str(), "--state", STATE, tf];
    for args in [
        &["init", "-input=false"][..],
        &["apply", "-auto-approve"][..],
    ] {
        let all: Vec<&str> = wrapper.iter().chain(args).copied().collect();
        let (code, out) = output(gitstate(dir, &all, &seed_git_env())).await;
        assert_ne!(code, 0, "{args:?} on a repository without master: {out}");
        assert!(
            out.contains("master") && out.contains("main"),
            "{args:?}: the error names the missing branch and the default one: {out}"
        );
        assert_eq!(
            branches(&git_dir),
            "refs/heads/main",
            "no branch created: {out}"
        );
    }
    // The HCL mode, the same repository.
    std::fs::write(
        dir.join("terraform-backend-git.hcl"),
        format!("git.repository = \"{url}\"\ngit.state = \"{STATE}\"\n"),
    )
    .expect("hcl");
    let (code, out) = output(gitstate(dir, &["git", tf, "plan"], &seed_git_env())).await;
    assert_ne!(code, 0, "HCL mode on a repository without master: {out}");
    assert!(out.contains("main"), "{out}");
    assert_eq!(
        branches(&git_dir),
        "refs/heads/main",
        "no branch created: {out}"
    );
}
