//! The Lambda function: the router behind a Function URL. Wiring only.

use anyhow::Context;
use gitstate_core::config::{Runtime, Settings};
use std::time::{Duration, Instant, SystemTime};

use gitstate_core::http::{BUFFERED_RESPONSE_LIMIT, ClientAddr, Deadline, Limits, router};
use lambda_http::request::RequestContext;
use lambda_http::{Request, RequestExt};
use tower::ServiceBuilder;

/// Time kept back from the invocation's deadline to send the answer.
const ANSWER_MARGIN: Duration = Duration::from_secs(2);

/// The caller's address as the Function URL saw it (for throttling failed logins), and the
/// invocation's deadline (so a slow git remote gets a 504 rather than a killed invocation).
fn with_request_facts(mut request: Request) -> Request {
    let deadline = request.lambda_context_ref().map(|context| {
        let left = context
            .deadline()
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        Instant::now() + left.saturating_sub(ANSWER_MARGIN)
    });
    if let Some(deadline) = deadline {
        request.extensions_mut().insert(Deadline(deadline));
    }
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
    let mut settings =
        Settings::from_env(Runtime::Lambda).context("reading GITSTATE_* settings")?;
    if let Some(ciphertext) = settings.git_token_kms.take() {
        // Once per cold start: the token never sits in the template or the console in clear.
        let kms = gitstate_kms::Kms::from_env().await;
        settings.git_token = Some(gitstate_kms::decrypt_git_token(&kms, &ciphertext).await?);
    }
    let encryption = gitstate_kms::encryption(&settings.encryption).await;
    let (backend, access) =
        gitstate_git::service_with(&settings, encryption).context("opening the git store")?;
    let limits = Limits {
        max_body_bytes: settings.max_body_bytes,
        max_response_bytes: (!settings.response_streaming).then_some(BUFFERED_RESPONSE_LIMIT),
        request_deadline: settings.request_deadline,
    };
    let app = ServiceBuilder::new()
        .map_request(with_request_facts)
        .service(router(backend, access, limits));
    if settings.response_streaming {
        lambda_http::run_with_streaming_response(app).await
    } else {
        lambda_http::run(app).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lambda_http::Context;

    #[test]
    fn the_invocation_deadline_less_the_margin_bounds_the_request() {
        let mut context = Context::default();
        let in_ten = SystemTime::now() + Duration::from_secs(10);
        context.deadline = u64::try_from(
            in_ten
                .duration_since(SystemTime::UNIX_EPOCH)
                .expect("after 1970")
                .as_millis(),
        )
        .expect("fits");
        let request = with_request_facts(Request::default().with_lambda_context(context));
        let Deadline(at) = *request.extensions().get::<Deadline>().expect("set");
        let left = at.saturating_duration_since(Instant::now());
        assert!(
            left > Duration::from_secs(6) && left <= Duration::from_secs(8),
            "{left:?}"
        );

        // An invocation already past its deadline is cut at once rather than never.
        let request =
            with_request_facts(Request::default().with_lambda_context(Context::default()));
        let Deadline(at) = *request.extensions().get::<Deadline>().expect("set");
        assert!(at <= Instant::now());
    }
}
