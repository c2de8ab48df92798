//! The Lambda function: the router behind a Function URL. Wiring only.

use anyhow::Context;
use gitstate_app::lambda::{init_logging, with_request_facts};
use gitstate_app::{Runtime, Settings};
use tower::ServiceBuilder;

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
    let service = ServiceBuilder::new()
        .map_request(with_request_facts)
        .service(app.router());
    if streaming {
        lambda_http::run_with_streaming_response(service).await
    } else {
        lambda_http::run(service).await
    }
}
