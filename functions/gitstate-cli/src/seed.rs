//! terraform-backend-git's command line, as its users type it:
//! `gitstate [--address A] [--access-logs] [--config F] git [--repository R] [--ref B]
//! [--state S] <program> [args…]` runs the program as `gitstate run` does; without a program
//! (or with no arguments at all) it is the seed's standalone server, with a pid file that
//! `gitstate stop` reads.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use gitstate_app::layers::seed::{SEED_LISTEN, listen_address};
use tokio::signal::unix::{SignalKind, signal};

use crate::settings::SettingsArgs;
use crate::{credential, server};

/// The seed's options before its storage type (accepted after it too).
#[derive(clap::Args, Debug, Default)]
struct BackendArgs {
    /// Where to listen [default: 127.0.0.1:6061; `:6061` is every interface].
    #[arg(long, global = true, value_name = "ADDRESS")]
    address: Option<String>,
    /// One log line per request.
    #[arg(
        long,
        global = true,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    access_logs: Option<String>,
    /// terraform-backend-git.hcl to read [default: ./terraform-backend-git.hcl if present]; a
    /// .toml file is read as gitstate.toml.
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
}

#[derive(Parser, Debug)]
#[command(
    name = "gitstate",
    about = "terraform-backend-git's command line, served by gitstate",
    after_help = "Examples:\n  \
      gitstate git --repository https://github.com/org/tf-state --state my/state.json terraform plan\n  \
      gitstate --access-logs git --state my/state.json terraform apply -auto-approve\n  \
      gitstate &            # standalone: backend blocks use http://localhost:6061/?type=git&…\n  \
      gitstate stop\n\n\
      gitstate's own commands: gitstate --help"
)]
struct SeedCli {
    #[command(flatten)]
    backend: BackendArgs,
    #[command(subcommand)]
    storage: Option<Storage>,
}

#[derive(Subcommand, Debug)]
enum Storage {
    /// States in a git repository: run PROGRAM against it, or serve it standalone without one.
    Git(GitArgs),
    /// Stop the standalone server started on --address (its pid file).
    Stop,
}

#[derive(clap::Args, Debug)]
struct GitArgs {
    /// The state repository (TF_BACKEND_GIT_GIT_REPOSITORY, git.repository).
    #[arg(long, value_name = "URL")]
    repository: Option<String>,
    /// Its branch [default: master] (TF_BACKEND_GIT_GIT_REF, git.ref).
    #[arg(long = "ref", value_name = "BRANCH")]
    git_ref: Option<String>,
    /// The state's path in it (TF_BACKEND_GIT_GIT_STATE, git.state).
    #[arg(long, value_name = "PATH")]
    state: Option<String>,
    /// The program to run and its arguments, passed as they are.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    program: Vec<String>,
}

/// Whether `args` (argv without the program name) are the seed's form: only its backend options,
/// then `git` or `stop` or nothing.
pub fn detect(args: &[OsString]) -> bool {
    let mut rest = args.iter().map(|a| a.to_string_lossy());
    while let Some(arg) = rest.next() {
        match arg.as_ref() {
            "--address" | "--config" => {
                rest.next();
            }
            a if a.starts_with("--address=")
                || a.starts_with("--config=")
                || a == "--access-logs"
                || a.starts_with("--access-logs=") => {}
            "git" | "stop" => return true,
            _ => return false,
        }
    }
    true
}

/// Run the seed's form.
pub async fn main(args: Vec<OsString>) -> anyhow::Result<()> {
    let cli = SeedCli::parse_from(args);
    let mut flags: Vec<(&'static str, String)> = Vec::new();
    if let Some(address) = &cli.backend.address {
        flags.push(("GITSTATE_LISTEN", listen_address(address)));
    }
    if let Some(on) = &cli.backend.access_logs {
        flags.push(("GITSTATE_ACCESS_LOG", on.clone()));
    }
    let git = match cli.storage {
        Some(Storage::Stop) => {
            let settings = SettingsArgs::seed(cli.backend.config, flags);
            return stop(&settings);
        }
        Some(Storage::Git(git)) => Some(git),
        None => None,
    };
    let mut program = Vec::new();
    if let Some(git) = git {
        for (var, value) in [
            ("GITSTATE_REPOSITORY", git.repository),
            ("GITSTATE_REF", git.git_ref),
            ("GITSTATE_STATE", git.state),
        ] {
            if let Some(value) = value {
                flags.push((var, value));
            }
        }
        program = git.program;
    }
    let settings = SettingsArgs::seed(cli.backend.config, flags);
    if program.is_empty() {
        standalone(&settings).await
    } else {
        crate::commands::serve::run(None, &settings, &program, None, false).await
    }
}

/// The pid file of the standalone server listening on `port`.
fn pid_file(port: u16) -> PathBuf {
    std::env::temp_dir().join(format!("gitstate-standalone-{port}.pid"))
}

/// The port the settings listen on.
fn port(settings: &SettingsArgs) -> anyhow::Result<u16> {
    let listen = settings
        .layered()?
        .get("GITSTATE_LISTEN")
        .unwrap_or_else(|| SEED_LISTEN.to_owned());
    let address: std::net::SocketAddr = listen
        .parse()
        .with_context(|| format!("{listen:?} is not an address like 127.0.0.1:6061"))?;
    Ok(address.port())
}

/// A pid file's process, if it still runs.
fn running(path: &Path) -> Option<rustix::process::Pid> {
    let text = std::fs::read_to_string(path).ok()?;
    let pid = rustix::process::Pid::from_raw(text.trim().parse().ok()?)?;
    rustix::process::test_kill_process(pid).ok()?;
    runs_gitstate(pid).then_some(pid)
}

/// Whether `pid` runs a gitstate binary, not a process that took the pid of one that ended
/// (the pid file is in the shared temporary directory). Where `/proc` does not tell, yes.
fn runs_gitstate(pid: rustix::process::Pid) -> bool {
    let name = |path: &Path| {
        path.file_name().map(|n| {
            n.to_string_lossy()
                .trim_end_matches(" (deleted)")
                .to_owned()
        })
    };
    let exe = Path::new("/proc")
        .join(pid.as_raw_nonzero().to_string())
        .join("exe");
    match (std::fs::read_link(exe), std::env::current_exe()) {
        (Ok(theirs), Ok(ours)) => name(&theirs) == name(&ours),
        _ => !Path::new("/proc/self/exe").exists(),
    }
}

/// Removes the pid file when the server stops.
struct PidFile(PathBuf);

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The seed's standalone mode: serve until SIGTERM (`gitstate stop`) or Ctrl-C, with a pid file.
async fn standalone(args: &SettingsArgs) -> anyhow::Result<()> {
    let (layered, mut settings) = args.settings()?;
    let Some(repository) = settings.git.repository.clone() else {
        bail!(
            "the standalone server serves the repository your backend blocks name: give it with \
             --repository (after `git`), TF_BACKEND_GIT_GIT_REPOSITORY, git.repository in \
             terraform-backend-git.hcl or GITSTATE_REPOSITORY; further ones with \
             GITSTATE_ALLOWED_REPOSITORIES (requests naming any other are refused)"
        );
    };
    let listening = server::Listening::from_settings(&settings.server)?;
    credential::fill(&mut settings.git).await;
    let listen = settings.server.listen;
    let no_users = settings.access.text.is_none() && settings.access.bootstrap.is_none();
    let branch = settings.git.branch.as_str().to_owned();
    let path = pid_file(listen.port());
    if let Some(pid) = running(&path) {
        bail!(
            "a standalone server already runs on port {} (pid {}, {}): `gitstate stop` ends it",
            listen.port(),
            pid.as_raw_nonzero(),
            path.display()
        );
    }
    let mut terminate = signal(SignalKind::terminate())?;
    let app = gitstate_app::build(settings)
        .await
        .context("assembling the backend")?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let address = listener.local_addr()?;
    std::fs::write(&path, format!("{}\n", std::process::id()))
        .with_context(|| format!("writing {}", path.display()))?;
    let _pid = PidFile(path.clone());
    let base = format!("{}://{address}", listening.scheme());
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "gitstate (terraform-backend-git standalone mode) serving {} on {base}, branch {branch}\n\
         pid file {}; `gitstate stop` ends it",
        gitstate_app::layers::redact_userinfo(&repository),
        path.display()
    )?;
    if let Some(state) = layered.get("GITSTATE_STATE") {
        write_seed_block(&mut out, &base, &repository, &branch, &state)?;
    }
    out.flush()?;
    drop(out);
    if no_users {
        tracing::warn!(
            "no user is configured here (TF_BACKEND_GIT_HTTP_USERNAME/PASSWORD, GITSTATE_ACCESS…): \
             only users of the repository's .gitstate/access.toml can sign in"
        );
    }
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
    };
    server::serve_until(listener, app.router(), &listening, shutdown).await
}

/// The seed's backend block for a state: every address in its format, locks on the same URL.
fn write_seed_block(
    out: &mut impl Write,
    base: &str,
    repository: &str,
    branch: &str,
    state: &str,
) -> std::io::Result<()> {
    let address = format!(
        "{base}/?type=git&repository={}&ref={}&state={}",
        query_value(&gitstate_app::layers::redact_userinfo(repository)),
        query_value(branch),
        query_value(state)
    );
    writeln!(
        out,
        "\nterraform {{\n  backend \"http\" {{\n    address        = \"{address}\"\n    \
         lock_address   = \"{address}\"\n    unlock_address = \"{address}\"\n  }}\n}}"
    )
}

/// `value` as a query reads it back: `+` (as in `git+ssh://`) would be a space, `&` and `#` would
/// end it, `%` would start an escape.
fn query_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '%' | '+' | '&' | '#' | '"' | '\\' => out.push_str(&format!("%{:02X}", c as u32)),
            c if c.is_whitespace() || c.is_control() => {
                let mut bytes = [0; 4];
                for b in c.encode_utf8(&mut bytes).bytes() {
                    out.push_str(&format!("%{b:02X}"));
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// `gitstate stop [--address A]` (gitstate's own form).
pub fn stop_at(address: Option<&str>) -> anyhow::Result<()> {
    let flags = address
        .map(|a| vec![("GITSTATE_LISTEN", listen_address(a))])
        .unwrap_or_default();
    stop(&SettingsArgs::seed(None, flags))
}

/// `gitstate stop`: SIGTERM to the standalone server of this address's port, and wait for it.
pub fn stop(args: &SettingsArgs) -> anyhow::Result<()> {
    let port = port(args)?;
    let path = pid_file(port);
    let Some(pid) = running(&path) else {
        let _ = std::fs::remove_file(&path);
        bail!(
            "no standalone server runs on port {port} (no live process in {}); give --address \
             if it listens elsewhere",
            path.display()
        );
    };
    rustix::process::kill_process(pid, rustix::process::Signal::TERM)
        .with_context(|| format!("signalling pid {}", pid.as_raw_nonzero()))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while rustix::process::test_kill_process(pid).is_ok() && path.exists() {
        if std::time::Instant::now() > deadline {
            bail!(
                "pid {} did not stop within 15 s of SIGTERM",
                pid.as_raw_nonzero()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "stopped the standalone server on port {port} (pid {})",
        pid.as_raw_nonzero()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_seed_form_is_its_options_then_git_stop_or_nothing() {
        for seed in [
            &[][..],
            &["git", "--state", "x", "terraform", "plan"],
            &["--access-logs", "git", "terraform"],
            &["--address", ":6062", "--config=x.hcl", "git"],
            &["--access-logs=true", "stop"],
            &["--address=:1"],
        ] {
            assert!(detect(&args(seed)), "{seed:?}");
        }
        for own in [
            &["run", "--state", "x", "terraform"][..],
            &["serve"],
            &["--help"],
            &["--version"],
            &["--access-logs", "serve"],
            &["config"],
        ] {
            assert!(!detect(&args(own)), "{own:?}");
        }
    }

    /// The seed block's address gives back the repository, branch and state as written, for
    /// git's SSH spellings and every character a query would read otherwise.
    #[test]
    fn the_seed_block_carries_the_repository_as_it_is() {
        let repositories = [
            "git+ssh://git@h.example/o/r.git",
            "ssh+git://git@[::1]:2222/~alice/r.git",
            "ssh://h.example/o/r%20x.git",
            "git@h.example:o/r&x#y.git",
            "https://h.example/o/r.git",
        ];
        for repository in repositories {
            for (branch, state) in [("master", "a/b.tfstate"), ("env/x+y", "s p&q#r%.json")] {
                let mut out = Vec::new();
                write_seed_block(&mut out, "http://127.0.0.1:6061", repository, branch, state)
                    .expect("written");
                let text = String::from_utf8(out).expect("utf-8");
                let line = text
                    .lines()
                    .find(|l| l.trim_start().starts_with("address"))
                    .expect("an address");
                let address = line.split('"').nth(1).expect("quoted");
                let url = reqwest::Url::parse(address).expect(address);
                let pairs: Vec<(String, String)> = url.query_pairs().into_owned().collect();
                let get = |key: &str| {
                    pairs
                        .iter()
                        .find(|(k, _)| k == key)
                        .map(|(_, v)| v.as_str())
                };
                assert_eq!(get("repository"), Some(repository), "{address}");
                assert_eq!(get("ref"), Some(branch), "{address}");
                assert_eq!(get("state"), Some(state), "{address}");
                assert_eq!(text.matches(address).count(), 3, "{text}");
            }
        }
    }

    #[test]
    fn program_arguments_pass_as_they_are() {
        let cli = SeedCli::try_parse_from(args(&[
            "gitstate",
            "--access-logs",
            "git",
            "--state",
            "my/state.json",
            "terraform",
            "-chdir=x",
            "plan",
            "--state",
            "-detailed-exitcode",
        ]))
        .expect("parses");
        assert_eq!(cli.backend.access_logs.as_deref(), Some("true"));
        let Some(Storage::Git(git)) = cli.storage else {
            panic!("git")
        };
        assert_eq!(git.state.as_deref(), Some("my/state.json"));
        assert_eq!(
            git.program,
            [
                "terraform",
                "-chdir=x",
                "plan",
                "--state",
                "-detailed-exitcode"
            ]
        );
    }
}
