//! `gitstate serve` and `gitstate run`: the backend assembled and served on a local listener.

use std::io::Write;

use anyhow::Context;
use gitstate_core::config::Settings;
use gitstate_core::ports::CommitMeta;
use gitstate_http::{Limits, router};

use crate::settings::SettingsArgs;
use crate::{credential, run, server};

pub async fn serve(state: &str, args: &SettingsArgs) -> anyhow::Result<()> {
    let (layered, mut settings) = args.settings()?;
    let listening = server::Listening::from_settings(&layered, settings.listen)?;
    credential::fill(&mut settings).await;
    let (backend, access) = open(&settings).await?;
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
    gitstate_http::write_backend_block(&mut out, &base, state)?;
    out.flush()?;
    drop(out);
    server::serve_until(
        listener,
        app(&settings, (backend, access)),
        &listening,
        shutdown(),
    )
    .await
}

/// `gitstate run`: the program's exit code becomes ours.
pub async fn run(state: &str, args: &SettingsArgs, program: &[String]) -> anyhow::Result<()> {
    let (layered, mut settings) = args.settings()?;
    credential::fill(&mut settings).await;
    let listening = server::Listening {
        tls: None,
        access_log: layered.flag_on("GITSTATE_ACCESS_LOG")?,
    };
    let status = run::run(settings, listening, state, program, async |settings| {
        let (backend, access) = open(&settings).await?;
        Ok(app(&settings, (backend, access)))
    })
    .await?;
    std::process::exit(run::exit_code(status));
}

type Opened = (
    std::sync::Arc<gitstate_core::service::Backend>,
    std::sync::Arc<gitstate_core::auth::Access>,
);

async fn open(settings: &Settings) -> anyhow::Result<Opened> {
    let encryption = gitstate_kms::encryption(&settings.encryption, settings.max_body_bytes).await;
    gitstate_git::service_with(settings, encryption).context("opening the git store")
}

fn app(settings: &Settings, (backend, access): Opened) -> axum::Router {
    router(
        backend,
        access,
        Limits {
            max_body_bytes: settings.max_body_bytes,
            max_response_bytes: None,
            request_deadline: settings.request_deadline,
        },
    )
}

async fn shutdown() {
    let _ = tokio::signal::ctrl_c().await;
}
