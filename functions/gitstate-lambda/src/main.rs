//! The Lambda function: the router behind a Function URL. Wiring only.

use anyhow::Context;
use gitstate_core::config::{Runtime, Settings};
use gitstate_core::http::{BUFFERED_RESPONSE_LIMIT, ClientAddr, Limits, router};
use lambda_http::request::RequestContext;
use lambda_http::{Request, RequestExt};
use tower::ServiceBuilder;

/// The caller's address as the Function URL saw it, for throttling failed logins.
fn with_client_addr(mut request: Request) -> Request {
    let ip = match request.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(context)) => context
            .http
            .source_ip
            .as_deref()
            .and_then(|ip| ip.parse().ok()),
        _ => None,
    };
    if let Some(ip) = ip {
        request.extensions_mut().insert(ClientAddr(ip));
    }
    request
}

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    // Honours AWS_LAMBDA_LOG_LEVEL / RUST_LOG and the JSON log format Lambda sets.
    lambda_http::tracing::init_default_subscriber();
    let settings = Settings::from_env(Runtime::Lambda).context("reading GITSTATE_* settings")?;
    let (backend, access) = gitstate_git::service(&settings).context("opening the git store")?;
    let limits = Limits {
        max_body_bytes: settings.max_body_bytes,
        max_response_bytes: (!settings.response_streaming).then_some(BUFFERED_RESPONSE_LIMIT),
    };
    let app = ServiceBuilder::new()
        .map_request(with_client_addr)
        .service(router(backend, access, limits));
    if settings.response_streaming {
        lambda_http::run_with_streaming_response(app).await
    } else {
        lambda_http::run(app).await
    }
}
