//! `gitstate run … -- terraform …`: a backend on a free loopback port for one run of a program,
//! reached through Terraform's `TF_HTTP_*` variables.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{Context, bail};
use gitstate_app::Settings;
use gitstate_app::layers::seed::ssh::SEED_SSH_ORIGIN;
use gitstate_app::settings::AccessSettings;
use gitstate_core::StateName;
use gitstate_core::access::check_user_name;
use gitstate_core::password::{generate_token, hash_secret};
use gitstate_core::secret::Secret;
use tokio::signal::unix::{SignalKind, signal};

mod backend_check;
mod chosen;

pub use backend_check::{GENERATED as TEMPORARY_BACKEND, GENERATED_FILE as TEMPORARY_BACKEND_FILE};
pub use chosen::Chosen;

/// Removes the temporary backend file when dropped, if this run created it.
struct TemporaryFile(Option<PathBuf>);

impl Drop for TemporaryFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take()
            && let Err(e) = std::fs::remove_file(&path)
        {
            eprintln!("gitstate run: could not remove {}: {e}", path.display());
        }
    }
}

fn add_backend_file(dir: &Path) -> anyhow::Result<TemporaryFile> {
    let path = dir.join(TEMPORARY_BACKEND_FILE);
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(mut file) => {
            use std::io::Write;
            let guard = TemporaryFile(Some(path.clone()));
            file.write_all(TEMPORARY_BACKEND.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
            Ok(guard)
        }
        // Another run in this directory added it (or one killed by SIGKILL left it): it is the
        // same block, and its owner removes it.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(TemporaryFile(None)),
        Err(e) => Err(e).with_context(|| format!("creating {}", path.display())),
    }
}

/// The user this run's credential belongs to: the login name when it is a valid user name.
fn run_user() -> String {
    std::env::var("USER")
        .ok()
        .map(|u| format!("{u}-run"))
        .filter(|u| check_user_name(u).is_ok())
        .unwrap_or_else(|| "gitstate-run".to_owned())
}

/// How long what a clean run saw of the repository stands in for the next run's look.
const RESUME_WITHIN: Duration = Duration::from_secs(3600);

/// How long the wrapper waits for its background folds before it exits.
const FOLD_WAIT: Duration = Duration::from_secs(60);

/// Run `program` against a fresh backend and return its exit status.
pub async fn run(
    mut settings: Settings,
    listening: crate::server::Listening,
    chosen: &Chosen,
    program: &[String],
    workdir: Option<&Path>,
) -> anyhow::Result<ExitStatus> {
    let name = StateName::parse(&chosen.state).context("--state")?;
    if program.is_empty() {
        bail!(
            "name the program to run after `--`, e.g. gitstate run --state x.tfstate -- terraform plan"
        );
    }
    // Installed before the backend file exists, so an early Ctrl-C cannot leave it behind.
    let signals = Signals {
        interrupt: signal(SignalKind::interrupt())?,
        terminate: signal(SignalKind::terminate())?,
        hangup: signal(SignalKind::hangup())?,
    };
    // Terraform runs on this run's backend, or not at all.
    let proof = backend_check::prove(program, workdir, &|name| std::env::var(name).ok())
        .context("gitstate run: refusing to start the program")?;
    // The state a file names is that directory's, wherever the file was found.
    chosen.check_dir(&proof.dir)?;
    let _temporary = if proof.add_file {
        Some(add_backend_file(&proof.dir)?)
    } else {
        None
    };
    let (user, token) = run_credential(&mut settings).await?;
    // This process serves one Terraform, on a port of its own: every request of the run
    // reaches it, so the GET after a LOCK may rest on what the LOCK push proved.
    settings.git.single_front = true;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .context("binding a loopback port")?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let scheme_base = format!("http://{}", listener.local_addr()?);
    let branch = settings.git.branch.to_string();
    let app = gitstate_app::build(settings)
        .await
        .context("assembling the backend")?;
    let backend = app.backend.clone();
    let at = backend
        .locate(None, None)
        .context("gitstate run: refusing to start the program")?;
    let clean = look_or_resume(&app, &at, &branch).await?;
    // Which store, branch and state this run uses, and why: said before the program starts.
    eprintln!("{}", chosen.start_line);
    let app = app.router();
    let server = tokio::spawn(async move {
        crate::server::serve_until(listener, app, &listening, async {
            let _ = stopped.await;
        })
        .await
    });
    let endpoints = Endpoints {
        base: &scheme_base,
        name: &name,
        user: &user,
        token: &token,
    };
    let status = run_program(program, &endpoints, signals).await;
    if status.is_err()
        && let Err(e) = backend.keep_session(&at, false).await
    {
        tracing::debug!(error = %gitstate_core::report::chain(&e), "the last run's note was not removed");
    }
    let status = status?;
    let _ = stop.send(());

    match tokio::time::timeout(Duration::from_secs(10), server).await {
        Ok(Ok(Err(e))) => eprintln!("gitstate run: the backend failed: {e:#}"),
        Ok(Err(e)) => eprintln!("gitstate run: the backend failed: {e}"),
        Err(_) => eprintln!("gitstate run: the backend did not stop within 10 s"),
        Ok(Ok(Ok(()))) => {}
    }
    // A failed program or a warning at the start: the next run looks, and says what it finds.
    finish(&backend, &at, clean && status.success()).await;
    Ok(status)
}

/// Before the program starts: the branch and the protocol record are checked, so that a run
/// that would be refused on its first request does not start Terraform. A run that follows a
/// clean one in the same working directory within the hour takes up what that one saw instead
/// (its cache keeps it): its first LOCK goes without a look, and the requests check the same
/// rules themselves (a 4xx naming the problem), as in a long-running process. `true`: nothing
/// to warn about, so this run may leave a note for the next.
async fn look_or_resume(
    app: &gitstate_app::App,
    at: &gitstate_core::ports::Location,
    branch: &str,
) -> anyhow::Result<bool> {
    match app.backend.resume_session(at, RESUME_WITHIN).await {
        Ok(true) => return Ok(true),
        Ok(false) => {}
        Err(e) => {
            tracing::debug!(error = %gitstate_core::report::chain(&e), "the last run's note was not taken up");
        }
    }
    let mut clean = true;
    for found in crate::startup::ref_status(app, branch, true).await {
        match found {
            crate::startup::Found::Problem(problem) => {
                bail!("gitstate run: refusing to start the program: {problem}")
            }
            crate::startup::Found::Warning(warning) => {
                clean = false;
                eprintln!("gitstate run: {warning}");
            }
            crate::startup::Found::Ok(_) => {}
        }
    }
    Ok(clean)
}

/// After the program: the writes it made are on the branch before the wrapper exits (issue
/// 27), and the note for the next run is kept (`keep`) or forgotten.
async fn finish(
    backend: &gitstate_core::service::Backend,
    at: &gitstate_core::ports::Location,
    keep: bool,
) {
    if tokio::time::timeout(FOLD_WAIT, backend.store().finish_folds())
        .await
        .is_err()
    {
        eprintln!(
            "gitstate run: a fold of this run's writes onto the branch did not end within {} s; the next fold carries them (`gitstate fold`)",
            FOLD_WAIT.as_secs()
        );
    }
    if let Err(e) = backend.keep_session(at, keep).await {
        tracing::debug!(error = %gitstate_core::report::chain(&e), "this run's note for the next was not kept");
    }
}

/// This run's own user and token; the settings' access becomes that user alone.
async fn run_credential(settings: &mut Settings) -> anyhow::Result<(String, String)> {
    let token = generate_token();
    let user = run_user();
    let hash =
        tokio::task::spawn_blocking(move || hash_secret(token.as_bytes()).map(|h| (token, h)))
            .await
            .context("hashing the run's credential")?;
    let (token, hash) = hash?;
    settings.access = AccessSettings {
        // Only this run's credential is served: the caller already holds the repository itself.
        text: Some(Secret::new("[users]\n".into())),
        bootstrap: Some((user.clone(), Secret::new(hash))),
        bootstrap_kms: None,
        refresh: settings.access.refresh,
        hash_memory_kib: settings.access.hash_memory_kib,
    };
    Ok((user, token))
}

/// The signals forwarded to the program while it runs.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

/// Where the program finds the backend, and as whom.
struct Endpoints<'a> {
    base: &'a str,
    name: &'a StateName,
    user: &'a str,
    token: &'a str,
}

/// Start `program` with Terraform's `TF_HTTP_*` variables set to `endpoints`, pass signals on,
/// and wait for it.
async fn run_program(
    program: &[String],
    endpoints: &Endpoints<'_>,
    mut signals: Signals,
) -> anyhow::Result<ExitStatus> {
    let Endpoints {
        base,
        name,
        user,
        token,
    } = endpoints;
    let executable = program.first().context("no program to run")?;
    let mut command = tokio::process::Command::new(executable);
    command
        .args(&program[1..])
        .env("TF_HTTP_ADDRESS", format!("{base}/states/{name}"))
        .env("TF_HTTP_LOCK_ADDRESS", format!("{base}/locks/{name}"))
        .env("TF_HTTP_UNLOCK_ADDRESS", format!("{base}/locks/{name}"))
        .env("TF_HTTP_LOCK_METHOD", "POST")
        .env("TF_HTTP_UNLOCK_METHOD", "DELETE")
        .env("TF_HTTP_USERNAME", user)
        .env("TF_HTTP_PASSWORD", token);
    if std::env::var_os(SEED_SSH_ORIGIN).is_some() {
        // This process was started again with an ssh command made from the seed's variables
        // (seed_ssh.rs): it is gitstate's own, with a key file that goes when gitstate does.
        // Terraform's own git fetches (modules) keep the user's ssh settings.
        command
            .env_remove("GIT_SSH_COMMAND")
            .env_remove(SEED_SSH_ORIGIN);
    }
    // At a terminal, Ctrl-C reaches the whole foreground group, the program included: forwarding
    // it too would be a second interrupt (Terraform then exits at once, lock held). Elsewhere the
    // program gets its own group and every signal from this process, exactly once.
    let interactive = std::io::stdin().is_terminal();
    if !interactive {
        command.process_group(0);
    }
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {executable}"))?;
    let pid = child.id().context("the program has no process id")?;
    loop {
        let forward = tokio::select! {
            status = child.wait() => return status.context("waiting for the program"),
            _ = signals.interrupt.recv() => (!interactive).then_some(rustix::process::Signal::INT),
            _ = signals.terminate.recv() => Some(rustix::process::Signal::TERM),
            _ = signals.hangup.recv() => Some(rustix::process::Signal::HUP),
        };
        if let (Some(signal), Some(pid)) = (
            forward,
            rustix::process::Pid::from_raw(i32::try_from(pid).unwrap_or(0)),
        ) {
            let _ = rustix::process::kill_process(pid, signal);
        }
    }
}

/// The exit code to pass on: the program's, or 128 + the signal that ended it.
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}
