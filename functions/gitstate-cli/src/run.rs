//! `gitstate run … -- terraform …`: a backend on a free loopback port for one run of a program,
//! reached through Terraform's `TF_HTTP_*` variables.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{Context, bail};
use gitstate_app::Settings;
use gitstate_app::settings::AccessSettings;
use gitstate_core::StateName;
use gitstate_core::access::check_user_name;
use gitstate_core::password::{generate_token, hash_secret};
use gitstate_core::secret::Secret;
use tokio::signal::unix::{SignalKind, signal};

/// The file added next to a configuration without a backend block, for the length of one run.
pub const TEMPORARY_BACKEND_FILE: &str = "gitstate_run_backend.tf";
const TEMPORARY_BACKEND: &str = "# Added by `gitstate run` for the length of one run; removed afterwards.\n\
                                 terraform {\n  backend \"http\" {}\n}\n";

/// What the configuration declares as its backend.
#[derive(Debug, PartialEq, Eq)]
pub enum Declared {
    None,
    Http,
    /// Another backend (`backend "s3"`, `cloud {}`), with the file that says so.
    Other {
        kind: String,
        file: PathBuf,
    },
}

/// The directory Terraform will read: `-chdir=DIR` before the subcommand, else the working one.
pub fn config_dir(args: &[String]) -> PathBuf {
    args.iter()
        .skip(1)
        .take_while(|a| a.starts_with('-'))
        .find_map(|a| {
            a.strip_prefix("-chdir=")
                .or_else(|| a.strip_prefix("--chdir="))
        })
        .map_or_else(|| PathBuf::from("."), PathBuf::from)
}

/// The backend the `.tf` / `.tf.json` files of `dir` declare (comments skipped).
pub fn declared_backend(dir: &Path) -> anyhow::Result<Declared> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            name.ends_with(".tf") || name.ends_with(".tf.json")
        })
        .collect();
    files.sort();
    let mut found = Declared::None;
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        let kinds = if file.extension().is_some_and(|e| e == "json") {
            json_backends(&text)
        } else {
            hcl_backends(&text)
        };
        for kind in kinds {
            if kind != "http" {
                return Ok(Declared::Other { kind, file });
            }
            found = Declared::Http;
        }
    }
    Ok(found)
}

/// `backend "<kind>"` and `cloud {` in HCL, outside comments and strings.
fn hcl_backends(text: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    let mut chars = text.chars().peekable();
    let mut word = String::new();
    let flush = |word: &mut String, words: &mut Vec<String>| {
        if !word.is_empty() {
            words.push(std::mem::take(word));
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '#' => {
                flush(&mut word, &mut words);
                chars.by_ref().find(|c| *c == '\n');
            }
            '/' if chars.peek() == Some(&'/') => {
                flush(&mut word, &mut words);
                chars.by_ref().find(|c| *c == '\n');
            }
            '/' if chars.peek() == Some(&'*') => {
                flush(&mut word, &mut words);
                chars.next();
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
            }
            '"' => {
                flush(&mut word, &mut words);
                let mut literal = String::from("\"");
                let mut escaped = false;
                for c in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if c == '\\' {
                        escaped = true;
                    } else if c == '"' {
                        break;
                    }
                    literal.push(c);
                }
                words.push(literal);
            }
            c if c.is_alphanumeric() || c == '_' || c == '-' => word.push(c),
            c => {
                flush(&mut word, &mut words);
                if !c.is_whitespace() {
                    words.push(c.to_string());
                }
            }
        }
    }
    flush(&mut word, &mut words);
    let mut kinds = Vec::new();
    for pair in words.windows(2) {
        match (pair[0].as_str(), pair[1].as_str()) {
            ("backend", label) if label.starts_with('"') => kinds.push(label[1..].to_owned()),
            ("cloud", "{") => kinds.push("cloud".to_owned()),
            _ => {}
        }
    }
    kinds
}

/// `{"terraform": {"backend": {"<kind>": …}}}` (or a list of terraform blocks).
fn json_backends(text: &str) -> Vec<String> {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(text) else {
        return Vec::new();
    };
    let blocks = match &value["terraform"] {
        serde_json::Value::Array(items) => items.clone(),
        other => vec![other.clone()],
    };
    let mut kinds = Vec::new();
    for block in blocks {
        if let Some(backends) = block["backend"].as_object() {
            kinds.extend(backends.keys().cloned());
        }
        if !block["cloud"].is_null() {
            kinds.push("cloud".to_owned());
        }
    }
    kinds
}

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

/// Run `program` against a fresh backend and return its exit status.
pub async fn run(
    mut settings: Settings,
    listening: crate::server::Listening,
    state: &str,
    program: &[String],
) -> anyhow::Result<ExitStatus> {
    let name = StateName::parse(state).context("--state")?;
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
    let dir = config_dir(program);
    let _temporary = match declared_backend(&dir)? {
        Declared::None => Some(add_backend_file(&dir)?),
        Declared::Http => None,
        Declared::Other { kind, file } => bail!(
            "{} declares backend {kind:?}: gitstate run serves the http backend only \
             (remove that block, or declare `backend \"http\" {{}}`)",
            file.display()
        ),
    };
    let (user, token) = run_credential(&mut settings).await?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .context("binding a loopback port")?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let scheme_base = format!("http://{}", listener.local_addr()?);
    let app = gitstate_app::build(settings)
        .await
        .context("assembling the backend")?
        .router();
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
    let status = run_program(program, &endpoints, signals).await?;
    let _ = stop.send(());
    match tokio::time::timeout(Duration::from_secs(10), server).await {
        Ok(Ok(Err(e))) => eprintln!("gitstate run: the backend failed: {e:#}"),
        Ok(Err(e)) => eprintln!("gitstate run: the backend failed: {e}"),
        Err(_) => eprintln!("gitstate run: the backend did not stop within 10 s"),
        Ok(Ok(Ok(()))) => {}
    }
    Ok(status)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_backends_outside_comments_and_strings() {
        for (text, kinds) in [
            ("terraform {\n  backend \"s3\" {\n  }\n}\n", vec!["s3"]),
            ("terraform {\n  backend \"http\" {}\n}\n", vec!["http"]),
            ("terraform{backend\"local\"{}}", vec!["local"]),
            (
                "terraform {\n  cloud {\n organization = \"x\"\n }\n}\n",
                vec!["cloud"],
            ),
            (
                "# backend \"s3\" {}\n// backend \"gcs\" {}\n/* backend \"azurerm\" {} */\n",
                vec![],
            ),
            ("locals { x = \"backend \\\"s3\\\" {}\" }\n", vec![]),
            ("resource \"terraform_data\" \"backend\" {}\n", vec![]),
            ("variable \"cloud\" {}\n", vec![]),
        ] {
            assert_eq!(hcl_backends(text), kinds, "{text}");
        }
        assert_eq!(
            json_backends(r#"{"terraform": {"backend": {"s3": {}}}}"#),
            ["s3"]
        );
        assert_eq!(
            json_backends(r#"{"terraform": [{"required_version": ">= 1"}, {"cloud": {}}]}"#),
            ["cloud"]
        );
        assert!(json_backends(r#"{"resource": {}}"#).is_empty());
    }

    #[test]
    fn chdir_is_read_before_the_subcommand_only() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            config_dir(&args(&["terraform", "-chdir=infra", "plan"])),
            PathBuf::from("infra")
        );
        assert_eq!(
            config_dir(&args(&["terraform", "plan", "-chdir=infra"])),
            PathBuf::from(".")
        );
        assert_eq!(config_dir(&args(&["tofu"])), PathBuf::from("."));
    }
}
