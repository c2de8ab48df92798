//! Serving the router on a bound listener until a shutdown signal: plain HTTP, or TLS (rustls)
//! with optional client certificates; the listener rules; the access log.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::extract::ConnectInfo;
use base64::Engine;
use gitstate_app::settings::ServerSettings;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tower::ServiceExt;

/// How long a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connections still open at shutdown may finish their requests.
const DRAIN: Duration = Duration::from_secs(10);

/// The listener's TLS and exposure settings.
pub struct Listening {
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub access_log: bool,
}

impl Listening {
    /// `--tls-cert`/`--tls-key`/`--tls-client-ca`, and the rule that a non-loopback address
    /// without TLS needs `--insecure-listen` (and gets a warning).
    pub fn from_settings(server: &ServerSettings) -> anyhow::Result<Self> {
        let address = server.listen;
        let (cert, key) = (&server.tls.cert, &server.tls.key);
        let client_ca = &server.tls.client_ca;
        let tls = match (cert, key) {
            (Some(cert), Some(key)) => Some(tls_config(cert, key, client_ca.as_deref())?),
            (None, None) if client_ca.is_some() => {
                bail!("--tls-client-ca needs --tls-cert and --tls-key")
            }
            (None, None) => None,
            _ => bail!("--tls-cert and --tls-key go together"),
        };
        if tls.is_none() && !address.ip().is_loopback() {
            if !server.insecure_listen {
                bail!(
                    "{address} is not a loopback address: without TLS, passwords would cross the \
                     network in clear. Give --tls-cert and --tls-key, or --insecure-listen true"
                );
            }
            tracing::warn!(
                "listening on {address} without TLS (--insecure-listen): Basic credentials and \
                 states cross the network in clear"
            );
        }
        Ok(Self {
            tls,
            access_log: server.access_log,
        })
    }

    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }
}

/// A rustls server configuration from PEM files; with `client_ca`, clients must present a
/// certificate issued by it.
pub fn tls_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let read_certs = |path: &Path| -> anyhow::Result<Vec<CertificateDer<'static>>> {
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
            .with_context(|| format!("reading certificates from {}", path.display()))?;
        if certs.is_empty() {
            bail!("{} holds no PEM certificate", path.display());
        }
        Ok(certs)
    };
    let chain = read_certs(cert)?;
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading the private key from {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in read_certs(path)? {
                roots
                    .add(ca)
                    .with_context(|| format!("a CA certificate of {}", path.display()))?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .context("the client certificate verifier")?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .context("the certificate does not match the key")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

pub async fn serve_until(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    listening: &Listening,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = if listening.access_log {
        app.layer(axum::middleware::from_fn(access_log))
    } else {
        app
    };
    match &listening.tls {
        None => axum::serve(
            listener,
            app.layer(axum::middleware::map_request(|request| async {
                with_scheme(request, "http")
            }))
            .into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(shutdown)
        .await
        .context("serving"),
        Some(tls) => serve_tls(listener, app, tls.clone(), shutdown).await,
    }
}

/// Mark the request with the scheme of the listener, replacing whatever the client claimed.
fn with_scheme<B>(mut request: http::Request<B>, scheme: &'static str) -> http::Request<B> {
    request.headers_mut().insert(
        gitstate_http::SCHEME_HEADER,
        http::HeaderValue::from_static(scheme),
    );
    request
}

async fn serve_tls(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let (acceptor, app, watcher) = (acceptor.clone(), app.clone(), graceful.watcher());
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::info!("TLS handshake with {peer} refused: {e}");
                    return;
                }
                Err(_) => {
                    tracing::info!("TLS handshake with {peer} timed out");
                    return;
                }
            };
            let service = hyper::service::service_fn(
                move |mut request: hyper::Request<hyper::body::Incoming>| {
                    request.extensions_mut().insert(ConnectInfo(peer));
                    app.clone().oneshot(with_scheme(request, "https"))
                },
            );
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            if let Err(e) = watcher.watch(connection).await {
                tracing::debug!("connection from {peer}: {e}");
            }
        });
    }
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "connections still open {} s after shutdown",
            DRAIN.as_secs()
        );
    }
    Ok(())
}

/// One line per request: method, path (no query: it may name a repository URL), status, the
/// user the request claims (never the password, never a body) and the duration.
async fn access_log(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let user = basic_user(request.headers()).unwrap_or_else(|| "-".to_owned());
    let response = next.run(request).await;
    tracing::info!(
        target: "gitstate::access",
        method = %method,
        path = %path,
        status = response.status().as_u16(),
        user = %user,
        duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        "request"
    );
    response
}

/// The user name of a Basic `Authorization` header, if it is one.
fn basic_user(headers: &http::HeaderMap) -> Option<String> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, _) = text.split_once(':')?;
    Some(user.chars().filter(|c| !c.is_control()).take(128).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_user_never_yields_the_password() {
        let header = |value: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(
                http::header::AUTHORIZATION,
                http::HeaderValue::from_str(value).expect("header"),
            );
            headers
        };
        let encode = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        assert_eq!(
            basic_user(&header(&format!(
                "Basic {}",
                encode("alice:pw:with:colons")
            ))),
            Some("alice".into())
        );
        assert_eq!(
            basic_user(&header(&format!("Basic {}", encode("nopassword")))),
            None
        );
        assert_eq!(basic_user(&header("Bearer abc")), None);
        assert_eq!(basic_user(&header("Basic !!!")), None);
        assert_eq!(basic_user(&http::HeaderMap::new()), None);
    }
}
