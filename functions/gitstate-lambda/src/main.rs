//! The Lambda function: the router behind a Function URL, and the fold schedule. Wiring only.

use anyhow::Context;
use gitstate_app::lambda::init_logging;
use gitstate_app::{Runtime, Settings};

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    // Honours AWS_LAMBDA_LOG_LEVEL / RUST_LOG and the JSON log format Lambda sets, except that the
    // runtime's own targets never log below INFO.
    init_logging();
    // A misspelt GITSTATE_* variable fails the start rather than meaning "default"; empty ones
    // are the template's unset parameters.
    gitstate_app::layers::check_environment(std::env::vars(), true)
        .context("reading GITSTATE_* settings")?;
    let settings = Settings::from_env(Runtime::Lambda).context("reading GITSTATE_* settings")?;
    let streaming = settings.server.response_streaming;
    let app = gitstate_app::build(settings)
        .await
        .context("assembling the backend")?;
    // Function URL requests and the fold schedule (template.yaml), one runtime loop.
    gitstate_app::invocation::run(app, streaming).await
}
