//! `gitstate serve` and `gitstate run`: the backend assembled and served on a local listener.

use std::io::Write;

use anyhow::Context;
use gitstate_core::ports::CommitMeta;

use crate::settings::SettingsArgs;
use crate::startup::{self, Found};
use crate::{credential, run, server};

pub async fn serve(state: Option<&str>, args: &SettingsArgs) -> anyhow::Result<()> {
    let (layered, mut settings) = args.settings()?;
    let state = state
        .map(str::to_owned)
        .or_else(|| layered.get("GITSTATE_STATE"))
        .unwrap_or_else(|| "default.tfstate".to_owned());
    let state = state.as_str();
    let listening = server::Listening::from_settings(&settings.server)?;
    credential::fill(&mut settings.git).await;
    let listen = settings.server.listen;
    let storage = settings
        .git
        .repository
        .clone()
        .unwrap_or_else(|| format!("{} (embedded)", settings.git.local_repository.display()));
    let embedded = settings.git.repository.is_none();
    let new_store = startup::new_store_checked(&settings)?;
    let branch = settings.git.branch.to_string();
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
    // A hosted repository is read now: unreachable, or without users, is said before the
    // first request rather than as every request's 401.
    let found = if embedded {
        None
    } else {
        Some(startup::users(&app, &storage).await)
    };
    let branch = startup::ref_status(&app, &branch, false).await;
    let mut out = std::io::stdout().lock();
    let base = format!("{}://{address}", listening.scheme());
    writeln!(out, "gitstate serving states from {storage} on {base}")?;
    if let Some(warning) = &new_store {
        writeln!(out, "\nWARNING: {warning}; starting a new, empty one.\n")?;
        tracing::warn!("{warning}; starting a new, empty one");
    }
    for found in found.iter().chain(&branch) {
        match found {
            Found::Ok(what) => writeln!(out, "{what}")?,
            Found::Warning(what) | Found::Problem(what) => writeln!(out, "\nWARNING: {what}\n")?,
        }
    }
    if let Some(token) = first_admin {
        writeln!(
            out,
            "\nFirst administrator created in .gitstate/access.toml of the embedded repository.\n\
             Its password is shown only this once:\n\n  \
             export TF_HTTP_USERNAME=admin\n  export TF_HTTP_PASSWORD={}",
            token.expose()
        )?;
    }
    gitstate_http::write_backend_block(&mut out, &base, state)?;
    out.flush()?;
    drop(out);
    server::serve_until(listener, app.router(), &listening, shutdown()).await?;
    // A fold started by the last writes finishes before the process goes (bounded: a stop is
    // a stop).
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        app.backend.store().finish_folds(),
    )
    .await;
    Ok(())
}

/// `gitstate run`: the program's exit code becomes ours. The state is `--state`, else the
/// `state` setting (gitstate.toml, terraform-backend-git's `git.state` or its variable; from a
/// file found above Terraform's directory, refused: [`run::Chosen`]).
pub async fn run(
    state: Option<&str>,
    args: &SettingsArgs,
    program: &[String],
    workdir: Option<&std::path::Path>,
    new_store: bool,
) -> anyhow::Result<()> {
    let (layered, mut settings) = args.settings()?;
    let chosen = run::Chosen::new(state, &layered, &settings, args.named_file())?;
    if let Some(warning) = startup::new_store_checked(&settings)? {
        if !new_store {
            anyhow::bail!("gitstate run: {warning}. To start a new store here, pass --new-store");
        }
        eprintln!("gitstate run: {warning}; starting a new, empty one (--new-store)");
    }
    credential::fill(&mut settings.git).await;
    let listening = server::Listening {
        tls: None,
        access_log: layered.flag_on("GITSTATE_ACCESS_LOG")?,
        connections: settings.server.connections,
        // The wrapper's server is for the Terraform it starts, on loopback: no proxy.
        proxies: server::Proxies::default(),
    };
    let status = run::run(settings, listening, &chosen, program, workdir).await?;
    std::process::exit(run::exit_code(status));
}

async fn shutdown() {
    let _ = tokio::signal::ctrl_c().await;
}
