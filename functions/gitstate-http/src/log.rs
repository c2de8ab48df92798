//! The log of what the router answered, written by a layer around it: handlers and
//! [`ApiError`](crate::ApiError) only attach an [`Outcome`] to the responses that failed.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;

/// Why a request failed, as the log should say it.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// The client's mistake or a rule's refusal (4xx): the reason the client reads too.
    Refused(String),
    /// Ours, the git remote's or the key service's (5xx): the error with all its sources.
    Failed(String),
}

/// Log one line for every refused or failed request, at INFO for 4xx and ERROR for 5xx.
pub(crate) async fn outcomes(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status().as_u16();
    match response.extensions().get::<Outcome>() {
        Some(Outcome::Failed(chain)) => tracing::error!(status, error = %chain),
        Some(Outcome::Refused(reason)) => tracing::info!(status, "{reason}"),
        None => {}
    }
    response
}
