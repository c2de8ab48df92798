//! `gitstate`: the local server and administration commands. It parses the command line and
//! hands each command to its module; the work is in the library crates.

mod client;
mod commands;
mod credential;
mod doctor;
mod logging;
mod run;
mod seed;
mod server;
mod settings;
mod startup;
mod tables;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use client::RemoteArgs;
use commands::{keys, remote, serve, users};
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
        /// State name used in the printed backend block [default: the `state` setting, else
        /// default.tfstate].
        #[arg(long)]
        state: Option<String>,
        #[command(flatten)]
        settings: SettingsArgs,
    },
    /// Run a program (terraform, tofu) against a backend on a free loopback port made for this
    /// run: it finds it through TF_HTTP_* variables. Exits with the program's exit code.
    #[command(after_help = "Examples:\n  \
        gitstate run --state network/prod.tfstate -- terraform plan\n  \
        gitstate run --state network/prod.tfstate terraform apply -auto-approve\n  \
        gitstate run -- tofu init     # the state from gitstate.toml's `state`")]
    Run {
        /// The state's path in the repository, e.g. network/prod.tfstate [default: the `state`
        /// setting].
        #[arg(long)]
        state: Option<String>,
        /// Terraform's working directory, for a program the run cannot see into (a script,
        /// make): its backend is checked there. Not needed for terraform, tofu, or env, sh -c,
        /// timeout, nice, nohup and time in front of them.
        #[arg(long, value_name = "DIR")]
        workdir: Option<PathBuf>,
        /// Start a new, empty embedded store when none is found here or above (otherwise
        /// refused: Terraform would see no state).
        #[arg(long)]
        new_store: bool,
        #[command(flatten)]
        settings: SettingsArgs,
        /// The program and its arguments (after `--`, or from the first word that is not one of
        /// these options).
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            required = true,
            value_name = "PROGRAM"
        )]
        program: Vec<String>,
    },
    /// Stop the standalone server (terraform-backend-git's `stop`) listening on --address.
    Stop {
        /// Its address [default: 127.0.0.1:6061].
        #[arg(long)]
        address: Option<String>,
    },
    /// Print the effective settings and where each comes from (secrets redacted), then check them.
    Config {
        #[command(flatten)]
        settings: SettingsArgs,
    },
    /// Run in a Terraform working directory: read its http backend's settings as Terraform
    /// does, make Terraform's requests, and say for each what the backend answered, why, and
    /// what to do. Exits non-zero when anything is wrong.
    Doctor {
        #[command(flatten)]
        args: doctor::Args,
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
        /// The branch [default: the backend's].
        #[arg(long = "ref", value_name = "BRANCH")]
        branch: Option<String>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// One revision of a state: <name>@<serial or commit id>.
    Show {
        target: String,
        /// The branch [default: the backend's].
        #[arg(long = "ref", value_name = "BRANCH")]
        branch: Option<String>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Write a revision again as the newest, under the lock (admin): <name>@<serial or commit>.
    Restore {
        target: String,
        /// The branch [default: the backend's].
        #[arg(long = "ref", value_name = "BRANCH")]
        branch: Option<String>,
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

#[derive(Subcommand)]
enum UserCommand {
    /// Add a user to .gitstate/access.toml in the repository (the embedded one found here or
    /// above, or --repository) in one commit: a name already there is refused, and a change
    /// committed meanwhile is kept. The password is hashed with argon2id and never shown: a
    /// fresh random token (printed once to standard error), or --password-stdin.
    #[command(after_help = "Examples:\n  \
        gitstate user add ci-net --grant write:network/ --grant read:*\n  \
        read -rs PW; printf %s \"$PW\" | gitstate user add ann --grant admin:* --password-stdin\n  \
        gitstate user add ci --grant write:app/ --repository https://git.example.com/infra/state.git\n  \
        gitstate user add ci --grant read:* --print    # print an entry for an access file")]
    Add {
        name: String,
        /// role:prefix, e.g. write:network/ or read:* (repeatable).
        #[arg(long = "grant", required = true)]
        grants: Vec<String>,
        /// Read the user's password from standard input (never from the command line) instead
        /// of generating a token.
        #[arg(long)]
        password_stdin: bool,
        /// Commit nothing: print the access file entry to standard output.
        #[arg(long)]
        print: bool,
        #[command(flatten)]
        settings: SettingsArgs,
    },
}

#[derive(Subcommand)]
enum AccessCommand {
    /// Validate an access file and print who can do what.
    Check { file: PathBuf },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if seed::detect(&args[1.min(args.len())..]) {
        logging::init_with(std::env::var("GITSTATE_LOG_FORMAT").ok(), "warn")?;
        return seed::main(args).await;
    }
    let cli = Cli::parse_from(args);
    logging::init(&cli.command)?;
    // A misspelt GITSTATE_* variable or an empty one is an error before anything else runs.
    gitstate_app::layers::check_environment(std::env::vars(), false)?;
    match cli.command {
        Command::Serve { state, settings } => serve::serve(state.as_deref(), &settings).await,
        Command::Config { settings } => settings::print(&settings).await,
        Command::Run {
            state,
            workdir,
            new_store,
            settings,
            program,
        } => {
            serve::run(
                state.as_deref(),
                &settings,
                &program,
                workdir.as_deref(),
                new_store,
            )
            .await
        }
        Command::Doctor { args } => doctor::doctor(&args).await,
        Command::Stop { address } => seed::stop_at(address.as_deref()),
        Command::User(UserCommand::Add {
            name,
            grants,
            password_stdin,
            print,
            settings,
        }) => {
            users::user_add(&users::AddUser {
                name: &name,
                grants: &grants,
                password_stdin,
                print,
                settings: &settings,
            })
            .await
        }
        Command::HashPassword => users::hash_password(),
        Command::Access(AccessCommand::Check { file }) => users::access_check(&file),
        Command::History {
            name,
            page,
            per_page,
            branch,
            remote,
        } => remote::history(&name, page, per_page, branch.as_deref(), &remote).await,
        Command::Show {
            target,
            branch,
            remote,
        } => remote::show(&target, branch.as_deref(), &remote).await,
        Command::Restore {
            target,
            branch,
            remote,
        } => remote::restore(&target, branch.as_deref(), &remote).await,
        Command::List { filter, remote } => remote::list(filter.as_deref(), &remote).await,
        Command::Locks { older_than, remote } => remote::locks(&older_than, &remote).await,
        Command::Rekey { prefix, settings } => keys::rekey(&prefix, &settings).await,
        Command::Decrypt { file, settings } => keys::decrypt(&file, &settings).await,
        Command::Encrypt {
            file,
            state,
            settings,
        } => keys::encrypt(&file, state, &settings).await,
    }
}
