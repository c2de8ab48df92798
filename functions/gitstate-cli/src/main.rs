//! `gitstate`: the local server and (later) administration commands. Wiring only; the work is in
//! the library crates.

use std::io::Write;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use gitstate_core::config::{Runtime, Settings};
use gitstate_core::http::{Limits, router};

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
    /// GITSTATE_REPOSITORY, states go to an embedded repository under ./.gitstate/.
    Serve {
        /// State name used in the printed backend block.
        #[arg(long, default_value = "default.tfstate")]
        state: String,
    },
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
    }
}

async fn serve(state: &str) -> anyhow::Result<()> {
    let settings = Settings::from_env(Runtime::Local).context("reading GITSTATE_* settings")?;
    let backend = gitstate_git::backend(&settings).context("opening the git store")?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("binding {}", settings.listen))?;
    let address = listener.local_addr()?;
    let storage = settings
        .repository
        .clone()
        .unwrap_or_else(|| format!("{} (embedded)", settings.local_repository.display()));
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "gitstate serving states from {storage} on http://{address}"
    )?;
    gitstate_core::http::write_backend_block(&mut out, &format!("http://{address}"), state)?;
    out.flush()?;
    drop(out);
    let app = router(
        Arc::new(backend),
        Limits {
            max_body_bytes: settings.max_body_bytes,
        },
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown())
        .await
        .context("serving")
}

async fn shutdown() {
    let _ = tokio::signal::ctrl_c().await;
}
