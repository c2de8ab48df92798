//! Serving the router on a bound listener until a shutdown signal: plain HTTP, or TLS (rustls)
//! with optional client certificates; the listener rules; the access log.
//!
//! Connections are bounded so that slow or numerous clients cannot hold the server: hyper's
//! header read timer closes a connection that has not sent a whole request head in time (just
//! opened, or idle between requests); tower-http's body timeout ends a request whose body
//! stalls, and a stalled answer ([`stall`]) closes a connection whose client stopped reading; at
//! most so many connections are open, in total and per client address, and one over
//! either cap is answered 503 (plain) or closed (TLS) at once, never queued. A trusted reverse
//! proxy ([`proxy`]) counts under the total cap only, and its requests under their clients'
//! addresses.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::extract::ConnectInfo;
use base64::Engine;
use gitstate_app::settings::{ConnectionSettings, ServerSettings};
use gitstate_core::auth::AddressKey;
use gitstate_http::ClientAddr;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tower::ServiceExt;

mod proxy;
mod stall;
pub use proxy::Proxies;
use stall::Stalled;

/// How long a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connections still open at shutdown may finish their requests.
const DRAIN: Duration = Duration::from_secs(10);
/// Descriptors kept for everything but client connections (git, the cache, logs).
const SPARE_DESCRIPTORS: u64 = 128;
/// Connections over a cap being answered 503 at once; past this many they are closed unanswered.
const REFUSALS_AT_ONCE: usize = 64;
/// How long a connection over a cap may take to send the request head its 503 answers.
const REFUSAL_HEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// The listener's TLS and exposure settings.
pub struct Listening {
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub access_log: bool,
    pub connections: ConnectionSettings,
    pub proxies: Proxies,
}

impl Listening {
    /// `--tls-cert`/`--tls-key`/`--tls-client-ca`, and the rule that a non-loopback address
    /// without TLS needs `--insecure-listen` (and gets a warning).
    pub fn from_settings(server: &ServerSettings) -> anyhow::Result<Self> {
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
        match crate::startup::listener(server) {
            crate::startup::Found::Problem(problem) => bail!("{problem}"),
            crate::startup::Found::Warning(warning) => tracing::warn!("{warning}"),
            crate::startup::Found::Ok(_) => {}
        }
        Ok(Self {
            tls,
            access_log: server.access_log,
            connections: server.connections,
            proxies: Proxies::new(&server.trusted_proxies),
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
    match crate::startup::certificate_dates(&chain, cert, std::time::SystemTime::now()) {
        crate::startup::Found::Ok(_) => {}
        crate::startup::Found::Warning(warning) | crate::startup::Found::Problem(warning) => {
            tracing::warn!("{warning}");
        }
    }
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
    let limits = listening.connections;
    let app = app.layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
        limits.body_timeout,
    ));
    let scheme = listening.scheme();
    let acceptor = listening.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    let gate = Arc::new(Gate::new(limits));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
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
        let proxies = listening.proxies.clone();
        let Some(ticket) = gate.admit(peer.ip(), proxies.trusts(peer.ip())) else {
            refuse(tcp, peer, acceptor.is_some(), &gate);
            continue;
        };
        let (acceptor, app, watcher, http) = (
            acceptor.clone(),
            app.clone(),
            graceful.watcher(),
            http.clone(),
        );
        tokio::spawn(async move {
            let _ticket = ticket;
            // A client that stops reading its answers is held to the body's timeout too.
            let tcp = Stalled::new(tcp, limits.body_timeout);
            let served = Served {
                peer,
                scheme,
                proxies,
            };
            connection(tcp, served, acceptor, app, watcher, http).await;
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

/// Who a connection is from, and how its requests are marked.
struct Served {
    peer: SocketAddr,
    scheme: &'static str,
    proxies: Proxies,
}

/// One admitted connection, served until it closes or the server drains.
async fn connection(
    tcp: Stalled<tokio::net::TcpStream>,
    served: Served,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    app: axum::Router,
    watcher: hyper_util::server::graceful::Watcher,
    http: hyper::server::conn::http1::Builder,
) {
    let Served {
        peer,
        scheme,
        proxies,
    } = served;
    let service =
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            let client = proxies.client(peer.ip(), request.headers());
            request.extensions_mut().insert(ConnectInfo(peer));
            request.extensions_mut().insert(ClientAddr(client));
            app.clone().oneshot(with_scheme(request, scheme))
        });
    let result = match acceptor {
        None => {
            let connection = http.serve_connection(hyper_util::rt::TokioIo::new(tcp), service);
            watcher.watch(connection).await
        }
        Some(acceptor) => {
            let Some(stream) = handshake(&acceptor, tcp, peer).await else {
                return;
            };
            let connection = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            watcher.watch(connection).await
        }
    };
    if let Err(e) = result {
        tracing::debug!("connection from {peer}: {e}");
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

async fn handshake(
    acceptor: &tokio_rustls::TlsAcceptor,
    tcp: Stalled<tokio::net::TcpStream>,
    peer: SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<Stalled<tokio::net::TcpStream>>> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            tracing::info!("TLS handshake with {peer} refused: {e}");
            None
        }
        Err(_) => {
            tracing::info!("TLS handshake with {peer} timed out");
            None
        }
    }
}

/// A connection over a cap: on a plain listener, answered 503 with `Retry-After` and closed
/// (while few such answers are under way); over TLS, or past those few, closed at once.
fn refuse(tcp: tokio::net::TcpStream, peer: SocketAddr, tls: bool, gate: &Gate) {
    tracing::warn!("too many connections: refusing {peer}");
    let Some(permit) = (!tls)
        .then(|| gate.refusals.clone().try_acquire_owned().ok())
        .flatten()
    else {
        return;
    };
    tokio::spawn(async move {
        let _permit = permit;
        let service =
            hyper::service::service_fn(|_: hyper::Request<hyper::body::Incoming>| async {
                http::Response::builder()
                    .status(http::StatusCode::SERVICE_UNAVAILABLE)
                    .header(http::header::RETRY_AFTER, "1")
                    .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
                    .body(http_body_util::Full::new(bytes::Bytes::from_static(
                        b"too many connections open; retry in a second\n",
                    )))
            });
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(REFUSAL_HEADER_TIMEOUT)
            .keep_alive(false);
        let _ = http
            .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
            .await;
    });
}

/// The caps on open connections, in total and per client address (IPv6: its /64).
struct Gate {
    total: Arc<tokio::sync::Semaphore>,
    per_address: Arc<Mutex<HashMap<AddressKey, usize>>>,
    max_per_address: usize,
    refusals: Arc<tokio::sync::Semaphore>,
}

/// An admitted connection's place under the caps, given back when it closes.
struct Ticket {
    _total: tokio::sync::OwnedSemaphorePermit,
    address: AddressKey,
    per_address: Arc<Mutex<HashMap<AddressKey, usize>>>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Ok(mut open) = self.per_address.lock()
            && let Some(n) = open.get_mut(&self.address)
        {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.address);
            }
        }
    }
}

impl Gate {
    fn new(limits: ConnectionSettings) -> Self {
        let total = limits.max_connections.min(descriptor_room()).max(1);
        if total < limits.max_connections {
            tracing::info!(
                "at most {total} connections at once: the open-file limit leaves no room for more"
            );
        }
        Self {
            total: Arc::new(tokio::sync::Semaphore::new(total)),
            per_address: Arc::default(),
            max_per_address: limits.max_per_address.max(1),
            refusals: Arc::new(tokio::sync::Semaphore::new(REFUSALS_AT_ONCE)),
        }
    }

    /// A place for a connection from `ip`, if neither cap is reached (a trusted `proxy` is
    /// under the total cap only: it carries many clients).
    fn admit(&self, ip: IpAddr, proxy: bool) -> Option<Ticket> {
        let address = AddressKey::of(ip);
        let mut open = self.per_address.lock().ok()?;
        if !proxy
            && open
                .get(&address)
                .is_some_and(|n| *n >= self.max_per_address)
        {
            return None;
        }
        let total = self.total.clone().try_acquire_owned().ok()?;
        *open.entry(address).or_insert(0) += 1;
        Some(Ticket {
            _total: total,
            address,
            per_address: self.per_address.clone(),
        })
    }
}

/// How many client connections the open-file limit leaves room for.
fn descriptor_room() -> usize {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    limit.map_or(usize::MAX, |n| {
        usize::try_from(n.saturating_sub(SPARE_DESCRIPTORS)).unwrap_or(usize::MAX)
    })
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
