//! The Lambda function: the router behind a Function URL. Wiring only.

use std::sync::Arc;

use anyhow::Context;
use gitstate_core::config::{Runtime, Settings};
use gitstate_core::http::{Limits, router};

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    // Honours AWS_LAMBDA_LOG_LEVEL / RUST_LOG and the JSON log format Lambda sets.
    lambda_http::tracing::init_default_subscriber();
    let settings = Settings::from_env(Runtime::Lambda).context("reading GITSTATE_* settings")?;
    let backend = gitstate_git::backend(&settings).context("opening the git store")?;
    let limits = Limits {
        max_body_bytes: settings.max_body_bytes,
    };
    lambda_http::run(router(Arc::new(backend), limits)).await
}
