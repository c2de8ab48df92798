//! What the Lambda function is invoked for: a request through its Function URL, or the fold
//! schedule (template.yaml, `FoldSchedule`: EventBridge every minute, input
//! `{"gitstate": "fold"}`), which replays the writes kept on the states' own refs onto the
//! branch. One runtime loop serves both, over the one assembly ([`crate::App`]).

use lambda_http::lambda_runtime::{self, FunctionResponse};
use lambda_http::request::LambdaRequest;
use lambda_http::tower::ServiceBuilder;
use lambda_http::{Adapter, LambdaEvent, Service, StreamAdapter, service_fn};
use serde_json::value::RawValue;

use gitstate_core::service::Backend;

use crate::App;
use crate::lambda::with_request_facts;

/// One invocation's ask.
pub enum Invocation {
    /// The schedule: fold.
    Fold,
    /// A request through the Function URL.
    Url(Box<LambdaRequest>),
}

/// Why an invocation's payload is neither.
#[derive(Debug, thiserror::Error)]
#[error("the invocation is neither a Function URL request nor the fold schedule: {0}")]
pub struct UnknownInvocation(serde_json::Error);

/// What `payload` asks: the schedule's input (or EventBridge's own scheduled event), else a
/// Function URL request.
pub fn invocation(payload: &str) -> Result<Invocation, UnknownInvocation> {
    match serde_json::from_str::<LambdaRequest>(payload) {
        Ok(request) => Ok(Invocation::Url(Box::new(request))),
        Err(error) => {
            let value: serde_json::Value =
                serde_json::from_str(payload).map_err(UnknownInvocation)?;
            let marked = value.get("gitstate").and_then(|v| v.as_str()) == Some("fold");
            let scheduled = value.get("source").and_then(|v| v.as_str()) == Some("aws.events")
                && value.get("detail-type").and_then(|v| v.as_str()) == Some("Scheduled Event");
            if marked || scheduled {
                Ok(Invocation::Fold)
            } else {
                Err(UnknownInvocation(error))
            }
        }
    }
}

/// The scheduled fold of the primary location: what it did, as the invocation's answer.
pub async fn scheduled_fold(backend: &Backend) -> Result<serde_json::Value, lambda_http::Error> {
    let at = backend.locate(None, None)?;
    let report = backend.store().fold(&at).await?;
    for name in &report.refused {
        lambda_http::tracing::warn!(state = %name, "not folded: its file on the branch is not what the last fold left (docs/operating.md, \"Unfolded writes\")");
    }
    lambda_http::tracing::info!(
        writes = report.writes,
        states = report.states,
        busy = report.busy,
        "scheduled fold"
    );
    Ok(serde_json::json!({
        "writes": report.writes,
        "states": report.states,
        "refused": report.refused,
        "busy": report.busy,
    }))
}

/// Serve invocations until the runtime stops: Function URL requests through the router (its
/// answer streamed when `streaming`), the schedule through [`scheduled_fold`].
pub async fn run(app: App, streaming: bool) -> Result<(), lambda_http::Error> {
    let backend = app.backend.clone();
    let router = ServiceBuilder::new()
        .map_request(with_request_facts)
        .service(app.router());
    if streaming {
        lambda_runtime::run(service_fn(move |event: LambdaEvent<Box<RawValue>>| {
            let (backend, router) = (backend.clone(), router.clone());
            async move {
                match invocation(event.payload.get())? {
                    Invocation::Fold => Ok::<_, lambda_http::Error>(
                        FunctionResponse::BufferedResponse(scheduled_fold(&backend).await?),
                    ),
                    Invocation::Url(request) => {
                        let answer = StreamAdapter::from(router)
                            .call(LambdaEvent::new(*request, event.context))
                            .await?;
                        Ok(FunctionResponse::StreamingResponse(answer))
                    }
                }
            }
        }))
        .await
    } else {
        lambda_runtime::run(service_fn(move |event: LambdaEvent<Box<RawValue>>| {
            let (backend, router) = (backend.clone(), router.clone());
            async move {
                match invocation(event.payload.get())? {
                    Invocation::Fold => scheduled_fold(&backend).await,
                    Invocation::Url(request) => {
                        let answer = Adapter::from(router)
                            .call(LambdaEvent::new(*request, event.context))
                            .await?;
                        Ok(serde_json::to_value(answer)?)
                    }
                }
            }
        }))
        .await
    }
}
