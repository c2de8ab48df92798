//! One apply of each kind (create, update, no-op) in every shape gitstate runs in (`serve`,
//! `serve` with KMS, `gitstate run`, the Lambda binary under cargo-lambda's emulator), next to
//! Terraform's S3 backend with `use_lockfile` on moto's S3 and the seed's recipe with the git
//! CLI, at +0 ms and +50 ms per request to the remote.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use gitstate_tests::counting::{Apply, count_apply};
use gitstate_tests::process::terraform;
use gitstate_tests::process::{ServeProcess, serve_env};
use gitstate_tests::{
    Client, GIT_TOKEN, GIT_USER, GitServer, Moto, TEST_PASSWORD, TEST_USER, terraform_backend_block,
};

use super::lambda::{Emulator, lambda_binary, spawn_function};
use super::proxy::{CountingProxy, Passed};
use super::{Sample, Seed, scale};

/// Added to every request to the remote: none, and a hosted forge (or S3) seen from afar.
const DELAYS: [u64; 2] = [0, 50];

/// Lambda's memory in template.yaml's default, for the GB-seconds.
const LAMBDA_GB: f64 = 1.0;

fn kind_name(kind: Apply) -> &'static str {
    match kind {
        Apply::Create => "create",
        Apply::Update => "update",
        Apply::NoOp => "no-op",
    }
}

/// The input the configuration's resource gets: a create and an update change it, a no-op not.
fn input(kind: Apply) -> &'static str {
    match kind {
        Apply::Create => "one",
        Apply::Update | Apply::NoOp => "two",
    }
}

const RESOURCE: &str = r#"
variable "input" {
  type = string
}
resource "terraform_data" "item" {
  input = var.input
}
"#;

/// What one row gathered at one delay.
#[derive(Default)]
struct Tally {
    sample: Sample,
    /// Requests by label, over all runs.
    labels: BTreeMap<String, usize>,
    /// KMS requests, Lambda invocations and the seconds they ran, run by run.
    kms: Vec<usize>,
    invocations: Vec<usize>,
    billed: Vec<Duration>,
}

/// The median of `values` (0 for none).
fn median<T: Copy + Ord + Default>(values: &[T]) -> T {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}

impl Tally {
    fn add(&mut self, time: Duration, labels: Vec<String>) {
        self.sample.add(time, labels.len());
        for label in labels {
            *self.labels.entry(label).or_default() += 1;
        }
    }

    fn runs(&self) -> f64 {
        self.sample.times.len().max(1) as f64
    }

    fn of_which(&self) -> String {
        let parts: Vec<String> = self
            .labels
            .iter()
            .map(|(l, n)| {
                let per_run = format!("{:.1}", *n as f64 / self.runs());
                format!("{l} {}", per_run.trim_end_matches(".0"))
            })
            .collect();
        parts.join(", ")
    }
}

/// Rows in the table's order: (kind, shape) → one tally per delay.
type Rows = Vec<((Apply, &'static str), [Tally; 2])>;

fn tally<'a>(rows: &'a mut Rows, kind: Apply, shape: &'static str, delay: usize) -> &'a mut Tally {
    let at = match rows.iter().position(|(key, _)| *key == (kind, shape)) {
        Some(at) => at,
        None => {
            rows.push(((kind, shape), Default::default()));
            rows.len() - 1
        }
    };
    &mut rows[at].1[delay]
}

fn git_labels(git: &GitServer) -> Vec<String> {
    git.take_requests()
        .iter()
        .map(gitstate_tests::Seen::label)
        .collect()
}

/// An S3 request's label: its method, what it touched (the state, the lock file, the bucket)
/// and its status unless a success.
fn s3_label(passed: &Passed) -> String {
    let path = passed.path.split('?').next().unwrap_or_default();
    let what = if path.ends_with(".tflock") {
        "lock"
    } else if path.ends_with(".tfstate") {
        "state"
    } else {
        "bucket"
    };
    match passed.status {
        200..=299 => format!("{} {what}", passed.method),
        status => format!("{} {what} {status}", passed.method),
    }
}

/// `program args` in `dir` with Terraform's settings for automation and `env` (the backend's
/// credentials unless `wrapped`: the wrapper gives Terraform its own); its wall time. Panics,
/// with the output, when it fails: a figure of a failed apply would be meaningless.
async fn timed(
    program: &Path,
    args: &[&str],
    dir: &Path,
    (env, wrapped): (&[(String, String)], bool),
) -> Duration {
    let mut command = tokio::process::Command::new(program);
    if wrapped {
        command
            .env_remove("TF_HTTP_USERNAME")
            .env_remove("TF_HTTP_PASSWORD");
        // The wrapper refuses settings it does not know, such as the bench's own.
        for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("GITSTATE_")) {
            command.env_remove(key);
        }
    } else {
        command
            .env("TF_HTTP_USERNAME", TEST_USER)
            .env("TF_HTTP_PASSWORD", TEST_PASSWORD);
    }
    let started = Instant::now();
    let out = command
        .args(args)
        .current_dir(dir)
        .env("TF_CLI_CONFIG_FILE", dir.join("empty.tfrc"))
        .env("CHECKPOINT_DISABLE", "1")
        .env("TF_IN_AUTOMATION", "1")
        .env("TF_INPUT", "0")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("the command starts");
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "{} {args:?} in {}: {}{}",
        program.display(),
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

/// How Terraform reaches a shape's backend.
enum Drive {
    /// A `backend` block in the configuration (HTTP to gitstate, or S3).
    Block(String),
    /// `gitstate run --state STATE -- terraform …` with this environment.
    Wrapper(PathBuf, Vec<(String, String)>),
}

/// The Lambda binary as a warm container: it polls the emulator's runtime API for invocations,
/// one at a time, until dropped.
struct Container {
    _emulator: Emulator,
    _function: tokio::process::Child,
    /// The Function URL's front, through a counting proxy (its delay is the caller's round trip).
    front: CountingProxy,
}

impl Container {
    async fn start(
        (binary, repository): (&Path, &str),
        cache: &Path,
        env: Vec<(&str, String)>,
        delay: Duration,
    ) -> Self {
        let emulator = Emulator::start().await;
        let function = spawn_function(binary, &emulator, repository, cache, env);
        let front = CountingProxy::start(([127, 0, 0, 1], emulator.port).into(), delay).await;
        Self {
            _emulator: emulator,
            _function: function,
            front,
        }
    }

    fn url(&self) -> String {
        format!("{}/lambda-url/_", self.front.url())
    }
}

/// A quiet `gitstate serve` on `url` with `extra` settings, its cache and log in `dir`.
async fn serve_in(binary: &Path, dir: &Path, url: &str, extra: &[(&str, &str)]) -> ServeProcess {
    std::fs::create_dir_all(dir).expect("dir");
    let mut settings = vec![("RUST_LOG", "warn"), ("GITSTATE_ACCESS_LOG", "false")];
    settings.extend_from_slice(extra);
    ServeProcess::start(binary, dir, serve_env(url, &settings)).await
}

/// Everything one delay needs: the proxies, the backends of every shape, the seed's clone.
struct World {
    _git_proxy: CountingProxy,
    s3: CountingProxy,
    kms: CountingProxy,
    serve: ServeProcess,
    serve_kms: ServeProcess,
    /// `serve` and `serve + KMS` as single fronts (`GITSTATE_SINGLE_FRONT=true`).
    single: ServeProcess,
    single_kms: ServeProcess,
    lambda: Container,
    seed: Seed,
    run_env: Vec<(String, String)>,
    bucket: String,
    root: PathBuf,
}

impl World {
    async fn start(
        git: &GitServer,
        moto: &Moto,
        (binary, lambda): (&Path, &Path),
        root: &Path,
        delay: u64,
    ) -> Self {
        let wait = Duration::from_millis(delay);
        // The seed's git CLI needs the server's answers whole (a 401's challenge included).
        let git_proxy = CountingProxy::start(git.address, wait).await;
        let moto_address = moto
            .endpoint
            .trim_start_matches("http://")
            .parse()
            .expect("moto's address");
        let s3 = CountingProxy::start(moto_address, wait).await;
        let kms = CountingProxy::start(moto_address, Duration::ZERO).await;
        let root = root.join(format!("d{delay}"));
        let repo = |shape: &str| {
            let name = format!("{shape}-{delay}");
            git.create_repo(&name);
            format!("{}/{name}.git", git_proxy.url())
        };
        let mut kms_env: Vec<(String, String)> = moto
            .env()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        kms_env.retain(|(k, _)| k != "AWS_ENDPOINT_URL_KMS");
        kms_env.push(("AWS_ENDPOINT_URL_KMS".into(), kms.url()));
        kms_env.push(("GITSTATE_KMS_KEY_IDS".into(), "alias/shapes".into()));
        let serve = serve_in(binary, &root.join("serve"), &repo("serve"), &[]).await;
        let kms_settings: Vec<(&str, &str)> = kms_env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let serve_kms = serve_in(binary, &root.join("kms"), &repo("kms"), &kms_settings).await;
        let front = [("GITSTATE_SINGLE_FRONT", "true")];
        let single = serve_in(binary, &root.join("single"), &repo("single"), &front).await;
        let mut single_kms_settings = kms_settings.clone();
        single_kms_settings.extend(front);
        let single_kms = serve_in(
            binary,
            &root.join("single-kms"),
            &repo("single-kms"),
            &single_kms_settings,
        )
        .await;
        let lambda_env: Vec<(&str, String)> = kms_env
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        let lambda_repo = repo("lambda");
        let lambda = Container::start(
            (lambda, lambda_repo.as_str()),
            &root.join("lambda"),
            lambda_env,
            wait,
        )
        .await;
        let seed_repo = format!("seed-{delay}");
        git.create_repo(&seed_repo);
        let seed = Seed::new(&format!(
            "http://{GIT_USER}:{GIT_TOKEN}@{}/{seed_repo}.git",
            git_proxy.address
        ));
        seed.must(&["commit", "-q", "--allow-empty", "-m", "init"]);
        seed.must(&["push", "-q", "origin", "main"]);
        let run_env = vec![
            ("GITSTATE_REPOSITORY".into(), repo("run")),
            ("GITSTATE_GIT_USERNAME".into(), GIT_USER.into()),
            ("GITSTATE_GIT_TOKEN".into(), GIT_TOKEN.into()),
            ("RUST_LOG".into(), "warn".into()),
        ];
        let bucket = format!("shapes-{delay}");
        let made = reqwest::Client::new()
            .put(format!("{}/{bucket}", moto.endpoint))
            .send()
            .await
            .expect("moto answers");
        assert!(made.status().is_success(), "bucket {bucket}: {made:?}");
        Self {
            _git_proxy: git_proxy,
            s3,
            kms,
            serve,
            serve_kms,
            single,
            single_kms,
            lambda,
            seed,
            run_env,
            bucket,
            root,
        }
    }

    /// The S3 backend block for `key`, path style, through the counting proxy.
    fn s3_block(&self, key: &str) -> String {
        format!(
            r#"terraform {{
  backend "s3" {{
    bucket                      = "{}"
    key                         = "{key}"
    region                      = "us-east-1"
    use_lockfile                = true
    use_path_style              = true
    endpoints                   = {{ s3 = "{}" }}
    access_key                  = "testing"
    secret_key                  = "testing"
    skip_credentials_validation = true
    skip_requesting_account_id  = true
    skip_metadata_api_check     = true
    skip_region_validation      = true
  }}
}}
"#,
            self.bucket,
            self.s3.url()
        )
    }

    /// How Terraform reaches `shape`'s backend for `state`.
    fn drive(&self, shape: &str, state: &str, gitstate: &Path) -> Drive {
        match shape {
            "serve" => Drive::Block(terraform_backend_block(&self.serve.url, state, "")),
            "serve + KMS" => Drive::Block(terraform_backend_block(&self.serve_kms.url, state, "")),
            "serve, single front" => {
                Drive::Block(terraform_backend_block(&self.single.url, state, ""))
            }
            "serve + KMS, single front" => {
                Drive::Block(terraform_backend_block(&self.single_kms.url, state, ""))
            }
            "Lambda + KMS" => Drive::Block(terraform_backend_block(&self.lambda.url(), state, "")),
            "S3, use_lockfile" => Drive::Block(self.s3_block(state)),
            _ => Drive::Wrapper(gitstate.to_owned(), self.run_env.clone()),
        }
    }

    /// Forget what every counter saw so far.
    fn reset(&self, git: &GitServer) {
        git.take_requests();
        self.s3.take();
        self.kms.take();
        self.lambda.front.take();
    }
}

/// Shapes Terraform drives, in the table's order.
const TERRAFORM_SHAPES: [&str; 7] = [
    "serve",
    "serve + KMS",
    "serve, single front",
    "serve + KMS, single front",
    "`gitstate run`",
    "Lambda + KMS",
    "S3, use_lockfile",
];

/// One working directory of `shape` on its own state: `terraform init`, then an apply of each
/// kind, each counted into `rows`.
async fn terraform_applies(
    git: &GitServer,
    world: &World,
    rows: &mut Rows,
    (shape, delay_index): (&'static str, usize),
    gitstate: &Path,
    run: usize,
) {
    let tf = terraform();
    let state = format!("apps/r{run}.tfstate");
    let dir = world
        .root
        .join(format!("tf-{}-{run}", shape.replace(['`', ' ', ','], "")));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("empty.tfrc"), "").expect("cli config");
    let drive = world.drive(shape, &state, gitstate);
    let (program, mut prefix, env): (PathBuf, Vec<String>, Vec<(String, String)>) = match drive {
        Drive::Block(block) => {
            std::fs::write(dir.join("main.tf"), format!("{block}{RESOURCE}")).expect("main.tf");
            (tf.clone(), Vec::new(), Vec::new())
        }
        Drive::Wrapper(bin, env) => {
            std::fs::write(dir.join("main.tf"), RESOURCE).expect("main.tf");
            let prefix = ["run", "--state", &state, "--"].map(String::from).to_vec();
            (bin, prefix, env)
        }
    };
    let wrapped = program != tf;
    if wrapped {
        prefix.push(tf.display().to_string());
    }
    let args = |rest: &[&str]| -> Vec<String> {
        prefix
            .iter()
            .cloned()
            .chain(rest.iter().map(|s| (*s).to_owned()))
            .collect()
    };
    let init = args(&["init", "-no-color"]);
    let init: Vec<&str> = init.iter().map(String::as_str).collect();
    timed(&program, &init, &dir, (&env, wrapped)).await;
    for kind in Apply::ALL {
        let var = format!("input={}", input(kind));
        let apply = args(&["apply", "-auto-approve", "-no-color", "-var", &var]);
        let apply: Vec<&str> = apply.iter().map(String::as_str).collect();
        world.reset(git);
        let took = timed(&program, &apply, &dir, (&env, wrapped)).await;
        let labels = if shape.starts_with("S3") {
            world.s3.take().iter().map(s3_label).collect()
        } else {
            git_labels(git)
        };
        let kms = world.kms.take().len();
        let front = world.lambda.front.take();
        let row = tally(rows, kind, shape, delay_index);
        row.add(took, labels);
        row.kms.push(kms);
        row.invocations.push(front.len());
        row.billed.push(front.iter().map(|p| p.took).sum());
    }
}

/// The apply of each kind as its HTTP requests (the counting harness: LOCK, GET, the write,
/// UNLOCK) straight to a gitstate shape, no Terraform.
async fn http_applies(
    git: &GitServer,
    world: &World,
    rows: &mut Rows,
    delay_index: usize,
    run: usize,
) {
    let backends = [
        ("serve, HTTP steps", world.serve.url.clone()),
        ("serve + KMS, HTTP steps", world.serve_kms.url.clone()),
        ("Lambda + KMS, HTTP steps", world.lambda.url()),
    ];
    for (shape, url) in backends {
        let client = Client::new(&url);
        let state = format!("http/r{run}.tfstate");
        for (serial, kind) in (1..).zip(Apply::ALL) {
            world.reset(git);
            let id = format!("h{run}-{serial}");
            let started = Instant::now();
            let counted = count_apply(git, &client, &state, &id, kind, serial).await;
            let took = started.elapsed();
            let labels = counted.steps.into_iter().flat_map(|(_, l)| l).collect();
            let kms = world.kms.take().len();
            let row = tally(rows, kind, shape, delay_index);
            row.add(took, labels);
            row.kms.push(kms);
        }
    }
}

/// The seed's recipe with the git CLI: LOCK, GET, the write, UNLOCK as its README runs them.
fn seed_applies(git: &GitServer, world: &World, rows: &mut Rows, delay_index: usize, run: usize) {
    let file = format!("apps/r{run}.tfstate");
    for (serial, kind) in (1..).zip(Apply::ALL) {
        git.take_requests();
        let started = Instant::now();
        world.seed.lock(&file, &gitstate_tests::lock_info("seed"));
        let found = world.seed.get(&file);
        assert_eq!(found.is_some(), kind != Apply::Create, "seed GET {file}");
        if kind != Apply::NoOp {
            let state = gitstate_tests::state_json("seed", serial);
            world.seed.write(&file, &state);
        }
        world.seed.unlock(&file);
        let took = started.elapsed();
        tally(rows, kind, "seed's recipe (git CLI)", delay_index).add(took, git_labels(git));
    }
}

/// Warm every gitstate process: argon2 for the credential, the first fetch of the branch.
async fn warm(git: &GitServer, world: &World) {
    for url in [
        world.serve.url.clone(),
        world.serve_kms.url.clone(),
        world.lambda.url(),
    ] {
        let client = Client::new(&url);
        count_apply(git, &client, "warm/up.tfstate", "w1", Apply::Create, 1).await;
        count_apply(git, &client, "warm/up.tfstate", "w2", Apply::Update, 2).await;
    }
}

pub async fn shapes(out: &mut String, binary: &Path) {
    let runs = scale(3, 1);
    let bench = std::env::current_exe().expect("own path");
    let lambda = lambda_binary(&bench);
    let git = GitServer::start().await;
    let moto = Moto::start().await;
    moto.create_key("shapes").await;
    let root = tempfile::tempdir().expect("tempdir");
    let mut worlds = Vec::new();
    for delay in DELAYS {
        let world = World::start(&git, &moto, (binary, &lambda), root.path(), delay).await;
        warm(&git, &world).await;
        worlds.push(world);
    }
    let mut rows: Rows = Vec::new();
    // Every shape and delay in turns, run by run, so all see the same machine.
    for run in 0..runs {
        for (d, world) in worlds.iter().enumerate() {
            for shape in TERRAFORM_SHAPES {
                terraform_applies(&git, world, &mut rows, (shape, d), binary, run).await;
            }
            http_applies(&git, world, &mut rows, d, run).await;
            seed_applies(&git, world, &mut rows, d, run);
        }
    }
    rows.sort_by_key(|((kind, _), _)| Apply::ALL.iter().position(|k| k == kind));
    report(out, &rows, runs);
}

fn report(out: &mut String, rows: &Rows, runs: usize) {
    out.push_str(&format!(
        "## One apply of each kind in every shape, +0 and +50 ms per request\n\n\
         Each row is one shape, each apply kind on a state of its own: a create (the first \
         apply, the state is new), an update (a changed input) and a no-op (nothing to change), \
         {runs} runs each, the median shown. Shapes driven by Terraform ({}, one \
         `terraform_data` resource; `terraform init` before, not counted) run `terraform apply \
         -auto-approve`: \"serve\" through one warm `gitstate serve`, \"serve + KMS\" the same \
         sealing every state with a KMS key of moto's, \", single front\" each of them with \
         `GITSTATE_SINGLE_FRONT=true` (the GETs after a LOCK answered from what the LOCK push \
         proved), \"`gitstate run`\" as `gitstate run \
         --state … -- terraform apply` (a new wrapper process each apply, its cache in the \
         working directory), \"Lambda + KMS\" the release `gitstate-lambda` as one warm \
         container under `cargo lambda watch --only-lambda-apis`, sealing with KMS as deployed \
         (its Function URL through a proxy that adds the same delay: the caller's round trip), \
         and \"S3, use_lockfile\" Terraform's S3 backend with `use_lockfile = true`, path style, \
         against moto's S3 through a counting proxy that adds the delay. Rows \"HTTP steps\" \
         send the apply's requests straight to the backend (LOCK, GET, the write under the \
         lock, UNLOCK, as Terraform sends them: the counting harness of the request-counting \
         tests) with no Terraform process, so their time is the backend's alone. The seed's \
         recipe is the seed tool's command sequence with the git CLI in one working clone (the \
         protocol section's). Requests = round trips to the remote per apply: git requests \
         counted at the git server (for gitstate and the seed), S3 requests counted at the \
         proxy (for S3); the delay is added to each of them by a proxy (+0: the proxy alone), \
         as for a remote across a network. KMS requests go to moto on loopback without delay \
         and are counted apart. Wall time: the whole `terraform apply` (Terraform's own work \
         included), or the steps' sum for the HTTP steps and the seed.\n\n\
         | apply | shape | reqs +0 ms | wall s +0 ms | reqs +50 ms | wall s +50 ms | KMS reqs | requests at +0 ms, by kind |\n\
         |---|---|---:|---:|---:|---:|---:|---|\n",
        version(),
    ));
    for ((kind, shape), [zero, fifty]) in rows {
        let kms = if shape.contains("KMS") {
            median(&zero.kms).to_string()
        } else {
            String::new()
        };
        out.push_str(&format!(
            "| {} | {shape} | {} | {:.2} | {} | {:.2} | {kms} | {} |\n",
            kind_name(*kind),
            zero.sample.reqs(),
            zero.sample.pct(0.5).as_secs_f64(),
            fifty.sample.reqs(),
            fifty.sample.pct(0.5).as_secs_f64(),
            zero.of_which(),
        ));
    }
    out.push_str(
        "\nThe Lambda container's cost per apply (Terraform-driven, medians over the runs): \
         invocations (requests through its Function URL) and the seconds they ran (from \
         the request reaching the emulator to the answer leaving it; Lambda bills this \
         duration), at 1 GB (template.yaml's default memory).\n\n\
         | apply | delay | invocations | billed s | GB-s | KMS reqs |\n\
         |---|---:|---:|---:|---:|---:|\n",
    );
    for ((kind, shape), tallies) in rows {
        if *shape != "Lambda + KMS" {
            continue;
        }
        for (delay, t) in DELAYS.iter().zip(tallies) {
            let billed = median(&t.billed).as_secs_f64();
            out.push_str(&format!(
                "| {} | +{delay} ms | {} | {billed:.3} | {:.3} | {} |\n",
                kind_name(*kind),
                median(&t.invocations),
                billed * LAMBDA_GB,
                median(&t.kms),
            ));
        }
    }
    out.push('\n');
}

fn version() -> String {
    let out = std::process::Command::new(terraform())
        .arg("version")
        .env("CHECKPOINT_DISABLE", "1")
        .output()
        .expect("terraform version");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next().unwrap_or_default().trim().to_owned()
}
