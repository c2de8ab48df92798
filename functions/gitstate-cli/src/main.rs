//! `gitstate`: the local server and administration commands. Wiring only; the work is in the
//! library crates.

mod client;
mod credential;
mod run;
mod server;
mod settings;

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use gitstate_core::StateName;
use gitstate_core::access::Caller;
use gitstate_core::access::{Grant, Policy, check_user_name};
use gitstate_core::password::{generate_token, hash_secret};
use gitstate_core::ports::CommitMeta;
use gitstate_core::service::Rekeyed;
use settings::SettingsArgs;

#[derive(Parser)]
#[command(
    name = "gitstate",
    version,
    about = "Terraform/OpenTofu state in a git repository"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the backend on --listen (default 127.0.0.1:8080). Without --repository, states go
    /// to an embedded repository under ./.gitstate/, and the first run creates an administrator
    /// and prints its credentials once.
    Serve {
        /// State name used in the printed backend block.
        #[arg(long, default_value = "default.tfstate")]
        state: String,
        #[command(flatten)]
        settings: SettingsArgs,
    },
    /// Run a program (terraform, tofu) against a backend on a free loopback port made for this
    /// run: it finds it through TF_HTTP_* variables. Exits with the program's exit code.
    Run {
        /// The state's path in the repository, e.g. network/prod.tfstate.
        #[arg(long)]
        state: String,
        #[command(flatten)]
        settings: SettingsArgs,
        /// The program and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "PROGRAM")]
        program: Vec<String>,
    },
    /// Print the effective settings and where each comes from (secrets redacted), then check them.
    Config {
        #[command(flatten)]
        settings: SettingsArgs,
    },
    /// Users of the access file.
    #[command(subcommand)]
    User(UserCommand),
    /// Hash a secret read from standard input (argon2id), for an access file or
    /// GITSTATE_ADMIN_HASH.
    HashPassword,
    /// Access files.
    #[command(subcommand)]
    Access(AccessCommand),
    /// Revisions of a state, newest first, from a running backend.
    History {
        name: String,
        #[arg(long, default_value_t = 0)]
        page: usize,
        #[arg(long, default_value_t = 20)]
        per_page: usize,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// One revision of a state: <name>@<serial or commit id>.
    Show {
        target: String,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Write a revision again as the newest, under the lock (admin): <name>@<serial or commit>.
    Restore {
        target: String,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Every state you may read: serial, last change, lock holder.
    List {
        /// Only states whose name contains this.
        #[arg(long)]
        filter: Option<String>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Every held lock, with age and holder; flags the old ones (never removes them).
    Locks {
        /// Locks older than this are flagged STALE (90s, 30m, 2h, 1d).
        #[arg(long, default_value = "1h")]
        older_than: String,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Re-encrypt every state (under PREFIX) with the keys of GITSTATE_KMS_KEY_IDS, each under
    /// its lock, one commit per state; states already sealed so are left alone.
    Rekey {
        #[arg(long, default_value = "")]
        prefix: String,
        #[command(flatten)]
        settings: SettingsArgs,
    },
    /// Decrypt a state file (e.g. from a clone) to standard output, with the standard AWS
    /// credential chain; GITSTATE_PASSPHRASE reads the aes passphrase mode.
    Decrypt {
        file: PathBuf,
        #[command(flatten)]
        settings: SettingsArgs,
    },
    /// Encrypt a plaintext state to standard output as gitstate stores it (sops binary mode
    /// under GITSTATE_KMS_KEY_IDS), bound to its place in the repository.
    Encrypt {
        file: PathBuf,
        /// The state's path in the repository (default: FILE as given).
        #[arg(long)]
        state: Option<String>,
        #[command(flatten)]
        settings: SettingsArgs,
    },
}

#[derive(clap::Args)]
struct RemoteArgs {
    /// The backend's base URL.
    #[arg(long, env = "GITSTATE_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    #[arg(long, env = "TF_HTTP_USERNAME")]
    user: Option<String>,
    /// Taken from TF_HTTP_PASSWORD only, never from the command line.
    #[arg(skip = std::env::var("TF_HTTP_PASSWORD").ok())]
    password: Option<String>,
    /// Print the backend's JSON instead of a table.
    #[arg(long)]
    json: bool,
}

impl RemoteArgs {
    fn remote(&self) -> anyhow::Result<client::Remote> {
        client::Remote::new(self.url.clone(), self.user.clone(), self.password.clone())
    }
}

#[derive(Subcommand)]
enum UserCommand {
    /// Make a user with a fresh random token: the access file entry goes to standard output, the
    /// token (shown once) to standard error.
    Add {
        name: String,
        /// role:prefix, e.g. write:network/ or read:* (repeatable).
        #[arg(long = "grant", required = true)]
        grants: Vec<String>,
    },
}

#[derive(Subcommand)]
enum AccessCommand {
    /// Validate an access file and print who can do what.
    Check { file: PathBuf },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(&cli.command)?;
    match cli.command {
        Command::Serve { state, settings } => serve(&state, &settings).await,
        Command::Config { settings } => settings::print(&settings),
        Command::Run {
            state,
            settings,
            program,
        } => {
            let (layered, mut settings) = settings.settings()?;
            credential::fill(&mut settings.git).await;
            let listening = server::Listening {
                tls: None,
                access_log: layered.flag_on("GITSTATE_ACCESS_LOG")?,
            };
            let status = run::run(settings, listening, &state, &program).await?;
            std::process::exit(run::exit_code(status));
        }
        Command::User(UserCommand::Add { name, grants }) => user_add(&name, &grants),
        Command::HashPassword => hash_password(),
        Command::Access(AccessCommand::Check { file }) => access_check(&file),
        Command::History {
            name,
            page,
            per_page,
            remote,
        } => {
            let answer = remote
                .remote()?
                .get(&format!("/history/{name}?page={page}&per_page={per_page}"))
                .await?;
            if remote.json {
                println!("{answer}");
                Ok(())
            } else {
                client::print_history(&answer)
            }
        }
        Command::Show { target, remote } => {
            let (name, selector) = client::split_target(&target)?;
            let answer = remote
                .remote()?
                .get(&format!("/history/{name}?at={selector}"))
                .await?;
            println!("{answer}");
            Ok(())
        }
        Command::Restore { target, remote } => {
            let (name, selector) = client::split_target(&target)?;
            let answer = remote
                .remote()?
                .post(&format!("/history/{name}?restore={selector}"))
                .await?;
            if remote.json {
                println!("{answer}");
            } else {
                let restored: serde_json::Value = serde_json::from_str(&answer)?;
                println!(
                    "restored {name} from {} as serial {}",
                    restored["from"].as_str().unwrap_or("?"),
                    restored["serial"]
                );
            }
            Ok(())
        }
        Command::List { filter, remote } => {
            let answer = remote.remote()?.get("/states").await?;
            if remote.json {
                println!("{answer}");
            } else {
                client::print_states(&answer, filter.as_deref().unwrap_or_default())?;
            }
            Ok(())
        }
        Command::Locks { older_than, remote } => {
            let stale_after = client::parse_duration(&older_than)?;
            let answer = remote.remote()?.get("/locks").await?;
            if remote.json {
                println!("{answer}");
            } else {
                client::print_locks(&answer, stale_after)?;
            }
            Ok(())
        }
        Command::Rekey { prefix, settings } => rekey(&prefix, &settings).await,
        Command::Decrypt { file, settings } => decrypt(&file, &settings).await,
        Command::Encrypt {
            file,
            state,
            settings,
        } => encrypt(&file, state, &settings).await,
    }
}

/// Logs on standard error: text (colour only at a terminal, and not under NO_COLOR) or one JSON
/// object a line (`--log-format json`); `RUST_LOG` sets the level.
/// Caps the AWS SDK and HTTP crates at INFO whatever `RUST_LOG` says: their TRACE output holds
/// whole requests, and a KMS `Encrypt` request carries a plaintext data key.
fn pinned_log_targets() -> tracing_subscriber::filter::Targets {
    use tracing_subscriber::filter::LevelFilter;
    tracing_subscriber::filter::Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_targets(
            gitstate_kms::SECRET_BEARING_LOG_TARGETS.map(|target| (target, LevelFilter::INFO)),
        )
}

fn init_logging(command: &Command) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let settings = match command {
        Command::Serve { settings, .. }
        | Command::Run { settings, .. }
        | Command::Rekey { settings, .. }
        | Command::Decrypt { settings, .. }
        | Command::Encrypt { settings, .. } => settings.layered().ok(),
        _ => None,
    };
    let format = settings.and_then(|s| s.get("GITSTATE_LOG_FORMAT"));
    // Under `run` the program's output is what matters: the backend only reports problems.
    let default_level = match command {
        Command::Run { .. } => "warn",
        _ => "info",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format.as_deref().map(str::trim) {
        None | Some("text") => builder
            .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
            .finish()
            .with(pinned_log_targets())
            .init(),
        Some("json") => builder
            .json()
            .with_ansi(false)
            .finish()
            .with(pinned_log_targets())
            .init(),
        Some(other) => bail!("GITSTATE_LOG_FORMAT: {other:?} is neither text nor json"),
    }
    Ok(())
}

async fn serve(state: &str, args: &SettingsArgs) -> anyhow::Result<()> {
    let (_, mut settings) = args.settings()?;
    let listening = server::Listening::from_settings(&settings.server)?;
    credential::fill(&mut settings.git).await;
    let listen = settings.server.listen;
    let storage = settings
        .git
        .repository
        .clone()
        .unwrap_or_else(|| format!("{} (embedded)", settings.git.local_repository.display()));
    let embedded = settings.git.repository.is_none();
    let app = gitstate_app::build(settings)
        .await
        .context("assembling the backend")?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let address = listener.local_addr()?;
    let first_admin = if embedded {
        let committer = app.backend.committer();
        let meta = CommitMeta {
            author_name: committer.name.clone(),
            author_email: committer.email.clone(),
            committer_name: committer.name.clone(),
            committer_email: committer.email.clone(),
            message: String::new(),
        };
        app.access
            .create_first_admin("admin", meta)
            .await
            .context("creating the first administrator")?
    } else {
        None
    };
    let mut out = std::io::stdout().lock();
    let base = format!("{}://{address}", listening.scheme());
    writeln!(out, "gitstate serving states from {storage} on {base}")?;
    if let Some(token) = first_admin {
        writeln!(
            out,
            "\nFirst administrator created in .gitstate/access.toml of the embedded repository.\n\
             Its password is shown only this once:\n\n  \
             export TF_HTTP_USERNAME=admin\n  export TF_HTTP_PASSWORD={}",
            token.expose()
        )?;
    }
    gitstate_core::http::write_backend_block(&mut out, &base, state)?;
    out.flush()?;
    drop(out);
    server::serve_until(listener, app.router(), &listening, shutdown()).await
}

async fn shutdown() {
    let _ = tokio::signal::ctrl_c().await;
}

fn user_add(name: &str, grants: &[String]) -> anyhow::Result<()> {
    check_user_name(name)?;
    let grants = grants
        .iter()
        .map(|g| Grant::parse(g))
        .collect::<Result<Vec<_>, _>>()?;
    let token = generate_token();
    let hash = hash_secret(token.as_bytes())?;
    let entry = access_entry(name, &hash, &grants)?;
    // The entry must be valid for the backend before anyone commits it.
    Policy::parse(&entry).context("the generated entry does not parse (a bug)")?;
    eprintln!(
        "Token for {name} (shown only this once; use it as TF_HTTP_PASSWORD):\n{}\n\n\
         Add this entry to .gitstate/access.toml on the state branch:",
        token
    );
    print!("{entry}");
    std::io::stdout().flush()?;
    Ok(())
}

/// `[users."<name>"]` with its hash and grants, serialised by the toml crate (a name with a dot,
/// `first.last`, must be quoted, never split into nested tables).
fn access_entry(name: &str, hash: &str, grants: &[Grant]) -> anyhow::Result<String> {
    let mut user = toml::Table::new();
    user.insert("hash".into(), hash.into());
    user.insert(
        "grants".into(),
        toml::Value::Array(grants.iter().map(|g| g.to_string().into()).collect()),
    );
    let mut users = toml::Table::new();
    users.insert(name.into(), user.into());
    let mut root = toml::Table::new();
    root.insert("users".into(), users.into());
    Ok(toml::to_string(&root)?)
}

fn hash_password() -> anyhow::Result<()> {
    let mut input = String::new();
    std::io::stdin()
        .take(64 * 1024)
        .read_to_string(&mut input)
        .context("reading the secret from standard input")?;
    let secret = input
        .strip_suffix('\n')
        .map(|s| s.strip_suffix('\r').unwrap_or(s))
        .unwrap_or(&input);
    if secret.is_empty() {
        bail!(
            "no secret on standard input (e.g. `printf %s \"$SECRET\" | gitstate hash-password`)"
        );
    }
    if secret.chars().count() < 16 {
        eprintln!("warning: a secret shorter than 16 characters is easy to guess");
    }
    println!("{}", hash_secret(secret.as_bytes())?);
    Ok(())
}

fn access_check(file: &std::path::Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let policy = Policy::parse(&text).with_context(|| format!("{} is invalid", file.display()))?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{}: valid, {} user(s)",
        file.display(),
        policy.users().count()
    )?;
    for user in policy.users() {
        writeln!(out, "\n{}", user.name)?;
        if user.grants.is_empty() {
            writeln!(out, "  (no grants: can authenticate, can do nothing)")?;
        }
        for grant in &user.grants {
            writeln!(out, "  {:<24} {}", grant.to_string(), grant.describe())?;
        }
    }
    Ok(())
}

async fn rekey(prefix: &str, args: &SettingsArgs) -> anyhow::Result<()> {
    let (_, settings) = args.settings()?;
    if settings.encryption.kms_key_ids.is_empty() {
        bail!("GITSTATE_KMS_KEY_IDS names no key to re-encrypt under");
    }
    let backend = gitstate_app::build(settings)
        .await
        .context("assembling the backend")?
        .backend;
    let at = backend.locate(None, None)?;
    let names = backend.store().list_states(&at, prefix).await?;
    let caller = Caller::operator("gitstate-rekey");
    let (total, mut failed) = (names.len(), 0);
    for (i, name) in names.iter().enumerate() {
        let outcome = match backend.rekey(&caller, &at, name).await {
            Ok(Rekeyed::Current) => "already current".to_owned(),
            Ok(Rekeyed::Rewritten { from }) => format!("re-encrypted (was {from})"),
            Ok(Rekeyed::Missing) => "gone".to_owned(),
            Err(error) => {
                failed += 1;
                format!("FAILED: {}", gitstate_core::http::chain(&error))
            }
        };
        eprintln!("[{}/{total}] {name}: {outcome}", i + 1);
    }
    eprintln!("rekey: {total} state(s), {failed} failed");
    if failed > 0 {
        bail!("{failed} state(s) could not be re-encrypted");
    }
    Ok(())
}

async fn decrypt(file: &std::path::Path, args: &SettingsArgs) -> anyhow::Result<()> {
    let (_, settings) = args.settings()?;
    let stored = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let kms = gitstate_kms::Kms::from_env().await;
    let sealer = gitstate_kms::SopsSealer::new(kms, &settings.encryption);
    let opened = sealer
        .envelope()
        .open(&stored, None)
        .await
        .and_then(|opened| gitstate_kms::unpack(opened, settings.limits.max_body_bytes))
        .with_context(|| format!("decrypting {}", file.display()))?;
    let mut out = std::io::stdout().lock();
    out.write_all(&opened.plaintext)?;
    out.flush()?;
    Ok(())
}

async fn encrypt(
    file: &std::path::Path,
    state: Option<String>,
    args: &SettingsArgs,
) -> anyhow::Result<()> {
    let (_, settings) = args.settings()?;
    if settings.encryption.kms_key_ids.is_empty() {
        bail!("GITSTATE_KMS_KEY_IDS names no key to encrypt under");
    }
    let name = StateName::parse(&state.unwrap_or_else(|| file.display().to_string()))
        .context("--state")?;
    let Some(repository) = settings.git.repository.clone() else {
        bail!("name the repository the state lives in: --repository or GITSTATE_REPOSITORY");
    };
    let plaintext = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let kms = gitstate_kms::Kms::from_env().await;
    let sealer = gitstate_kms::SopsSealer::new(kms, &settings.encryption);
    std::str::from_utf8(&plaintext).context("the state is not UTF-8 text")?;
    let payload = gitstate_kms::pack(&plaintext).context("compressing")?;
    let sealed = sealer
        .envelope()
        .seal(&payload, &gitstate_kms::context(&repository, &name))
        .await
        .context("encrypting")?;
    let mut out = std::io::stdout().lock();
    out.write_all(&sealed)?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdk_and_http_targets_are_capped_at_info_and_ours_are_not() {
        use tracing::Level;
        let filter = pinned_log_targets();
        for target in gitstate_kms::SECRET_BEARING_LOG_TARGETS
            .iter()
            .flat_map(|t| [t.to_string(), format!("{t}::client::orchestrator")])
        {
            assert!(filter.would_enable(&target, &Level::INFO), "{target}");
            assert!(!filter.would_enable(&target, &Level::DEBUG), "{target}");
            assert!(!filter.would_enable(&target, &Level::TRACE), "{target}");
        }
        for target in ["gitstate_git::smart", "gitstate_kms", "gitstate"] {
            assert!(filter.would_enable(target, &Level::TRACE), "{target}");
        }
    }
}
