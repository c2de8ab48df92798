//! `gitstate`: the local server and administration commands. Wiring only; the work is in the
//! library crates.

mod client;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use gitstate_core::StateName;
use gitstate_core::access::Caller;
use gitstate_core::access::{Grant, Policy, check_user_name};
use gitstate_core::config::{Runtime, Settings};
use gitstate_core::http::{Limits, router};
use gitstate_core::password::{generate_token, hash_secret};
use gitstate_core::ports::CommitMeta;
use gitstate_core::service::Rekeyed;

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
    /// Serve the backend on GITSTATE_LISTEN (default 127.0.0.1:8080). Without
    /// GITSTATE_REPOSITORY, states go to an embedded repository under ./.gitstate/, and the first
    /// run creates an administrator and prints its credentials once.
    Serve {
        /// State name used in the printed backend block.
        #[arg(long, default_value = "default.tfstate")]
        state: String,
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
    },
    /// Decrypt a state file (e.g. from a clone) to standard output, with the standard AWS
    /// credential chain; GITSTATE_PASSPHRASE reads the aes passphrase mode.
    Decrypt { file: PathBuf },
    /// Encrypt a plaintext state to standard output as gitstate stores it (sops binary mode
    /// under GITSTATE_KMS_KEY_IDS), bound to its place in the repository.
    Encrypt {
        file: PathBuf,
        /// The state's path in the repository (default: FILE as given).
        #[arg(long)]
        state: Option<String>,
        /// The repository (default: GITSTATE_REPOSITORY).
        #[arg(long)]
        repository: Option<String>,
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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Serve { state } => serve(&state).await,
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
        Command::Rekey { prefix } => rekey(&prefix).await,
        Command::Decrypt { file } => decrypt(&file).await,
        Command::Encrypt {
            file,
            state,
            repository,
        } => encrypt(&file, state, repository).await,
    }
}

async fn serve(state: &str) -> anyhow::Result<()> {
    let settings = Settings::from_env(Runtime::Local).context("reading GITSTATE_* settings")?;
    let encryption = gitstate_kms::encryption(&settings.encryption, settings.max_body_bytes).await;
    let (backend, access) =
        gitstate_git::service_with(&settings, encryption).context("opening the git store")?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("binding {}", settings.listen))?;
    let address = listener.local_addr()?;
    let storage = settings
        .repository
        .clone()
        .unwrap_or_else(|| format!("{} (embedded)", settings.local_repository.display()));
    let first_admin = match settings.repository {
        Some(_) => None,
        None => {
            let committer = backend.committer();
            let meta = CommitMeta {
                author_name: committer.name.clone(),
                author_email: committer.email.clone(),
                committer_name: committer.name.clone(),
                committer_email: committer.email.clone(),
                message: String::new(),
            };
            access
                .create_first_admin("admin", meta)
                .await
                .context("creating the first administrator")?
        }
    };
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "gitstate serving states from {storage} on http://{address}"
    )?;
    if let Some(token) = first_admin {
        writeln!(
            out,
            "\nFirst administrator created in .gitstate/access.toml of the embedded repository.\n\
             Its password is shown only this once:\n\n  \
             export TF_HTTP_USERNAME=admin\n  export TF_HTTP_PASSWORD={}",
            token.expose()
        )?;
    }
    gitstate_core::http::write_backend_block(&mut out, &format!("http://{address}"), state)?;
    out.flush()?;
    drop(out);
    let app = router(
        backend,
        access,
        Limits {
            max_body_bytes: settings.max_body_bytes,
            max_response_bytes: None,
            request_deadline: settings.request_deadline,
        },
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown())
    .await
    .context("serving")
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
    let listed: Vec<String> = grants.iter().map(|g| format!("\"{g}\"")).collect();
    let entry = format!(
        "[users.{name}]\nhash = \"{hash}\"\ngrants = [{}]\n",
        listed.join(", ")
    );
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

async fn rekey(prefix: &str) -> anyhow::Result<()> {
    let settings = Settings::from_env(Runtime::Local).context("reading GITSTATE_* settings")?;
    if settings.encryption.kms_key_ids.is_empty() {
        bail!("GITSTATE_KMS_KEY_IDS names no key to re-encrypt under");
    }
    let encryption = gitstate_kms::encryption(&settings.encryption, settings.max_body_bytes).await;
    let (backend, _) =
        gitstate_git::service_with(&settings, encryption).context("opening the git store")?;
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

async fn decrypt(file: &std::path::Path) -> anyhow::Result<()> {
    let settings = Settings::from_env(Runtime::Local).context("reading GITSTATE_* settings")?;
    let stored = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let kms = gitstate_kms::Kms::from_env().await;
    let sealer = gitstate_kms::SopsSealer::new(kms, &settings.encryption);
    let opened = sealer
        .envelope()
        .open(&stored, None)
        .await
        .and_then(|opened| gitstate_kms::unpack(opened, settings.max_body_bytes))
        .with_context(|| format!("decrypting {}", file.display()))?;
    let mut out = std::io::stdout().lock();
    out.write_all(&opened.plaintext)?;
    out.flush()?;
    Ok(())
}

async fn encrypt(
    file: &std::path::Path,
    state: Option<String>,
    repository: Option<String>,
) -> anyhow::Result<()> {
    let settings = Settings::from_env(Runtime::Local).context("reading GITSTATE_* settings")?;
    if settings.encryption.kms_key_ids.is_empty() {
        bail!("GITSTATE_KMS_KEY_IDS names no key to encrypt under");
    }
    let name = StateName::parse(&state.unwrap_or_else(|| file.display().to_string()))
        .context("--state")?;
    let Some(repository) = repository.or(settings.repository.clone()) else {
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
