//! Serving the router on a bound listener until a shutdown signal.

use std::future::Future;
use std::net::SocketAddr;

use anyhow::Context;

pub async fn serve_until(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
    .context("serving")
}
