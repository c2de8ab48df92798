//! `gitstate`: the local server and administration commands. It parses the command line and
//! hands each command to its module; the work is in the library crates.

mod backend_blocks;
mod client;
mod commands;
mod credential;
mod doctor;
#[cfg(test)]
mod help_tests;
mod logging;
mod run;
mod seed;
mod seed_ssh;
mod server;
mod settings;
mod startup;
mod tables;

use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use client::RemoteArgs;
use commands::{admin, fold, keys, remote, serve, users};
use settings::{SettingsFor, uses};

#[derive(Parser)]
#[command(
    name = "gitstate",
    version,
    about = "Terraform/OpenTofu state in a git repository",
    after_help = "Examples:\n  \
        gitstate serve                          # states in ./.gitstate, on 127.0.0.1:8080\n  \
        gitstate run -- terraform plan          # a backend for one run\n  \
        gitstate history network/prod.tfstate   # its revisions, newest first\n  \
        gitstate COMMAND --help                 # a command's settings and examples"
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
    #[command(after_help = "Examples:\n  \
        gitstate serve\n  \
        gitstate serve --repository https://git.example.com/infra/states.git --listen 127.0.0.1:9000\n  \
        GITSTATE_KMS_KEY_IDS=alias/states gitstate serve --state network/prod.tfstate")]
    Serve {
        /// State name used in the printed backend block [default: the `state` setting, else
        /// default.tfstate].
        #[arg(long)]
        state: Option<String>,
        #[command(flatten)]
        settings: SettingsFor<{ uses::SERVE }>,
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
        settings: SettingsFor<{ uses::RUN }>,
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
    #[command(after_help = "Examples:\n  \
        gitstate stop\n  \
        gitstate stop --address 127.0.0.1:6062")]
    Stop {
        /// Its address [default: 127.0.0.1:6061].
        #[arg(long)]
        address: Option<String>,
    },
    /// Print the effective settings and where each comes from (secrets redacted), then check them.
    #[command(after_help = "Examples:\n  \
        gitstate config\n  \
        gitstate config --config ops/gitstate.toml\n  \
        GITSTATE_REF=staging gitstate config --listen 127.0.0.1:9000")]
    Config {
        #[command(flatten)]
        settings: SettingsFor<{ uses::CONFIG }>,
    },
    /// Run in a Terraform working directory: read its http backend's settings as Terraform
    /// does, make Terraform's requests, and say for each what the backend answered, why, and
    /// what to do. Exits non-zero when anything is wrong.
    #[command(after_help = "Examples:\n  \
        cd infra/network && gitstate doctor\n  \
        gitstate doctor --chdir infra/network --lock")]
    Doctor {
        #[command(flatten)]
        args: doctor::Args,
    },
    /// Users of the access file.
    #[command(
        subcommand,
        after_help = "Examples:\n  \
        gitstate user add ci-net --grant write:network/ --grant read:*"
    )]
    User(UserCommand),
    /// Hash a secret read from standard input (argon2id), for an access file or
    /// GITSTATE_ADMIN_HASH.
    #[command(after_help = "Examples:\n  \
        printf %s \"$SECRET\" | gitstate hash-password\n  \
        export GITSTATE_ADMIN_HASH=\"$(gitstate hash-password < secret.txt)\"")]
    HashPassword,
    /// Access files.
    #[command(
        subcommand,
        after_help = "Examples:\n  \
        gitstate access check access.toml"
    )]
    Access(AccessCommand),
    /// Revisions of a state, newest first, from a running backend.
    #[command(after_help = "Examples:\n  \
        gitstate history network/prod.tfstate\n  \
        gitstate history network/prod.tfstate --page 1 --per-page 50 --ref staging\n  \
        gitstate history network/prod.tfstate --url https://states.example.com --json")]
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
    /// One revision of a state (<name>@<serial or commit id>, a commit id as any unique prefix of
    /// 7 or more hex digits); just <name>: the newest.
    #[command(after_help = "Examples:\n  \
        gitstate show network/prod.tfstate\n  \
        gitstate show network/prod.tfstate@12            # serial 12\n  \
        gitstate show network/prod.tfstate@3f9a1c2b7d04  # a revision, as history prints it")]
    Show {
        target: String,
        /// The branch [default: the backend's].
        #[arg(long = "ref", value_name = "BRANCH")]
        branch: Option<String>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Write a revision again as the newest, under the lock (admin): <name>@<serial or commit
    /// id>, a commit id as any unique prefix of 7 or more hex digits.
    #[command(after_help = "Examples:\n  \
        gitstate restore network/prod.tfstate@12\n  \
        gitstate restore network/prod.tfstate@3f9a1c2 --ref staging")]
    Restore {
        target: String,
        /// The branch [default: the backend's].
        #[arg(long = "ref", value_name = "BRANCH")]
        branch: Option<String>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Every state you may read: serial, last change, lock holder.
    #[command(after_help = "Examples:\n  \
        gitstate list\n  \
        gitstate list --filter network/ --json")]
    List {
        /// Only states whose name contains this.
        #[arg(long)]
        filter: Option<String>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Every held lock, with age and holder; flags the old ones (`gitstate unlock` releases one).
    #[command(after_help = "Examples:\n  \
        gitstate locks\n  \
        gitstate locks --older-than 30m")]
    Locks {
        /// Locks older than this are flagged STALE (90s, 30m, 2h, 1d).
        #[arg(long, default_value = "1h")]
        older_than: String,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Release a state's lock: the one with --id, or whichever is held (a force-unlock, for
    /// administrators). No Terraform directory needed.
    #[command(after_help = "Examples:\n  \
        gitstate unlock network/prod.tfstate\n  \
        gitstate unlock network/prod.tfstate --id 6a3f0f4e-2c1d-4b8e-9f00-1e2d3c4b5a69")]
    Unlock {
        name: String,
        /// Release only the lock with this ID (as `locks` or Terraform's error shows it).
        #[arg(long)]
        id: Option<String>,
        /// The branch [default: the backend's].
        #[arg(long = "ref", value_name = "BRANCH")]
        branch: Option<String>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Remove a state from its branch (administrators), under its lock. It stays in the git
    /// history: `restore` brings it back.
    #[command(after_help = "Examples:\n  \
        gitstate remove network/old.tfstate --yes\n  \
        gitstate remove network/old.tfstate --ref staging --yes")]
    Remove {
        name: String,
        /// Yes, remove it (nothing is removed without this).
        #[arg(long)]
        yes: bool,
        /// The branch [default: the backend's].
        #[arg(long = "ref", value_name = "BRANCH")]
        branch: Option<String>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Re-encrypt every state (under PREFIX) with the keys of GITSTATE_KMS_KEY_IDS, each under
    /// its lock, one commit per state; states already sealed so are left alone.
    #[command(after_help = "Examples:\n  \
        gitstate rekey --repository https://git.example.com/infra/states.git --kms-key-ids alias/states\n  \
        gitstate rekey --prefix network/")]
    Rekey {
        /// Only states whose name starts with this.
        #[arg(long, default_value = "")]
        prefix: String,
        #[command(flatten)]
        settings: SettingsFor<{ uses::REKEY }>,
    },
    /// Fold now: replay the writes kept on the states' own refs (refs/gitstate/states/*) onto
    /// the branch, one commit per write, so the branch of files is current. Serving processes
    /// and the Lambda schedule fold on their own; this is for a person who wants the branch
    /// current now (see docs/operating.md, "Unfolded writes").
    #[command(after_help = "Examples:\n  \
        gitstate fold --repository https://git.example.com/infra/states.git\n  \
        gitstate fold --ref staging --config gitstate.toml\n  \
        gitstate fold                           # the embedded repository (.gitstate/repo.git)")]
    Fold {
        #[command(flatten)]
        settings: SettingsFor<{ uses::FOLD }>,
    },
    /// Decrypt a state file (e.g. from a clone) to standard output, with the standard AWS
    /// credential chain; GITSTATE_PASSPHRASE reads the aes passphrase mode.
    #[command(after_help = "Examples:\n  \
        gitstate decrypt network/prod.tfstate > prod.json\n  \
        gitstate decrypt --age-identity-file ~/.config/age/keys.txt network/prod.tfstate")]
    Decrypt {
        file: PathBuf,
        #[command(flatten)]
        settings: SettingsFor<{ uses::DECRYPT }>,
    },
    /// Encrypt a plaintext state to standard output as gitstate stores it (sops binary mode
    /// under GITSTATE_KMS_KEY_IDS), bound to its place in the repository.
    #[command(after_help = "Examples:\n  \
        gitstate encrypt prod.json --state network/prod.tfstate \\\n    \
        --repository https://git.example.com/infra/states.git --kms-key-ids alias/states > prod.tfstate")]
    Encrypt {
        file: PathBuf,
        /// The state's path in the repository (default: FILE as given).
        #[arg(long)]
        state: Option<String>,
        #[command(flatten)]
        settings: SettingsFor<{ uses::ENCRYPT }>,
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
        settings: SettingsFor<{ uses::USER_ADD }>,
    },
}

#[derive(Subcommand)]
enum AccessCommand {
    /// Validate an access file and print who can do what.
    #[command(after_help = "Examples:\n  \
        gitstate access check access.toml")]
    Check { file: PathBuf },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let seed_form = seed::detect(&args[1.min(args.len())..]);
    // Help, a version or a mistake on the command line ends here, before anything else.
    let matches = (!seed_form).then(|| Cli::command().get_matches_from(&args));
    let cli = matches
        .as_ref()
        .map(|m| Cli::from_arg_matches(m).unwrap_or_else(|e| e.exit()));
    // terraform-backend-git's SSH_PRIVATE_KEY / StrictHostKeyChecking: a command that reaches
    // the repository through git (its settings include the git ones) runs again with the ssh
    // command they make.
    if (seed_form
        || matches
            .as_ref()
            .is_some_and(settings::uses::reaches_repository))
        && let Some(code) = seed_ssh::rerun().await?
    {
        std::process::exit(code);
    }
    let Some(cli) = cli else {
        logging::init_with(std::env::var("GITSTATE_LOG_FORMAT").ok(), "warn")?;
        return seed::main(args).await;
    };
    logging::init(&cli.command)?;
    // A misspelt GITSTATE_* variable or an empty one is an error before anything else runs.
    gitstate_app::layers::check_environment(std::env::vars(), false)?;
    match cli.command {
        remote @ (Command::History { .. }
        | Command::Show { .. }
        | Command::Restore { .. }
        | Command::List { .. }
        | Command::Locks { .. }
        | Command::Unlock { .. }
        | Command::Remove { .. }) => remote_command(remote).await,
        local => local_command(local).await,
    }
}

/// The commands that act here, with the deployment's settings.
async fn local_command(command: Command) -> anyhow::Result<()> {
    match command {
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
        Command::Rekey { prefix, settings } => keys::rekey(&prefix, &settings).await,
        Command::Fold { settings } => fold::fold(&settings).await,
        Command::Decrypt { file, settings } => keys::decrypt(&file, &settings).await,
        Command::Encrypt {
            file,
            state,
            settings,
        } => keys::encrypt(&file, state, &settings).await,
        _ => anyhow::bail!("internal: a remote command reached the local dispatch"),
    }
}

/// The commands that act through a running backend.
async fn remote_command(command: Command) -> anyhow::Result<()> {
    match command {
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
        Command::Unlock {
            name,
            id,
            branch,
            remote,
        } => admin::unlock(&name, id.as_deref(), branch.as_deref(), &remote).await,
        Command::Remove {
            name,
            yes,
            branch,
            remote,
        } => admin::remove(&name, yes, branch.as_deref(), &remote).await,
        _ => anyhow::bail!("internal: a local command reached the remote dispatch"),
    }
}
