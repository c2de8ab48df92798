//! The log of what the router answered, written by a layer around it: handlers and
//! [`ApiError`](crate::ApiError) only attach an [`Outcome`] to the responses that failed.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument as _;

/// Why a request failed, as the log should say it.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// The client's mistake or a rule's refusal (4xx): the reason the client reads too.
    Refused(String),
    /// Ours, the git remote's or the key service's (5xx): the error with all its sources.
    Failed(String),
}

/// Log one line for every refused or failed request, at INFO for 4xx and ERROR for 5xx. Every
/// line logged while a request is served (here, in the service, in the store) is within a span
/// naming its method and path (never the query: it may carry a repository URL).
pub(crate) async fn outcomes(request: Request, next: Next) -> Response {
    let span = tracing::info_span!(
        "request",
        method = %request.method(),
        path = %request.uri().path()
    );
    async move {
        let response = next.run(request).await;
        let status = response.status().as_u16();
        match response.extensions().get::<Outcome>() {
            Some(Outcome::Failed(chain)) => tracing::error!(status, error = %chain),
            Some(Outcome::Refused(reason)) => tracing::info!(status, "{reason}"),
            None => {}
        }
        response
    }
    .instrument(span)
    .await
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use axum::Router;
    use axum::body::Body;
    use axum::response::IntoResponse as _;
    use gitstate_core::ports::StoreError;
    use gitstate_core::service::ServiceError;
    use tower::ServiceExt as _;

    use crate::ApiError;

    /// Every line the subscriber writes, for one test.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("not poisoned").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A failed request is logged once, by the layer, at ERROR with the whole chain; a refused one
    /// at INFO with its reason; an answered one not at all.
    #[tokio::test]
    async fn the_layer_logs_each_outcome_once() {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let router = Router::new()
            .route("/ok", axum::routing::get(|| async { "fine" }))
            .route(
                "/broken",
                axum::routing::get(|| async {
                    let cause = std::io::Error::other("pack index unreadable");
                    ApiError::Service(ServiceError::Store(StoreError::Internal(Box::new(cause))))
                        .into_response()
                }),
            )
            .route(
                "/refused",
                axum::routing::get(|| async { ApiError::QueryTooLong.into_response() }),
            )
            .layer(axum::middleware::from_fn(super::outcomes));
        for path in ["/ok", "/broken", "/refused"] {
            let request = http::Request::get(path)
                .body(Body::empty())
                .expect("request");
            router.clone().oneshot(request).await.expect("infallible");
        }
        let text = String::from_utf8(lines.0.lock().expect("not poisoned").clone()).expect("utf-8");
        let logged: Vec<&str> = text.lines().collect();
        assert_eq!(logged.len(), 2, "{text}");
        assert!(logged[0].contains("ERROR"), "{text}");
        assert!(logged[0].contains("status=500"), "{text}");
        assert!(
            logged.iter().all(|line| line.contains("method=GET")),
            "{text}"
        );
        assert!(logged[0].contains("path=/broken"), "{text}");
        assert!(
            logged[0].contains("internal storage failure: pack index unreadable"),
            "{text}"
        );
        assert!(
            logged[1].contains("INFO") && logged[1].contains("status=414"),
            "{text}"
        );
        assert!(logged[1].contains("query string is longer than"), "{text}");
    }
}
