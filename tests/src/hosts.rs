//! What stands between gitstate and a git host in the wild, on loopback: a reverse proxy that
//! accepts only a Bearer token (Bitbucket Data Center), one serving HTTPS with a certificate from
//! a private CA made by the test (openssl), and a CONNECT proxy (a corporate or VPC egress proxy).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use base64::Engine;
use http::{HeaderMap, Method, StatusCode, Uri};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{GIT_TOKEN, GIT_USER};

/// The only token the Bearer proxy accepts.
pub const BEARER_TOKEN: &str = "bbdc-project-token-0123456789";

#[derive(Clone)]
struct Forward {
    upstream: SocketAddr,
    client: reqwest::Client,
    /// `Some(token)`: only `Authorization: Bearer <token>` passes (and is turned into the
    /// upstream's Basic credentials); `None`: headers pass as they are.
    bearer: Option<&'static str>,
    /// Capabilities taken out of every ref advertisement, and what clients asked for.
    strip: Option<Arc<Strip>>,
    /// Run on every push's body before it is forwarded (what another client does meanwhile).
    before_push: Option<PushHook>,
    refused: Arc<AtomicUsize>,
    passed: Arc<AtomicUsize>,
}

/// Called with the body of each push before the proxy forwards it.
pub type PushHook = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// What a [`ReverseProxy::stripping`] proxy hides and saw.
pub struct Strip {
    caps: Vec<String>,
    /// Per upload-pack or receive-pack request: the service and the capabilities asked for.
    requested: Mutex<Vec<(String, Vec<String>)>>,
}

/// A reverse proxy to the test git server, plain HTTP or HTTPS.
pub struct ReverseProxy {
    pub address: SocketAddr,
    scheme: &'static str,
    host: &'static str,
    refused: Arc<AtomicUsize>,
    passed: Arc<AtomicUsize>,
    strip: Option<Arc<Strip>>,
    _task: tokio::task::JoinHandle<()>,
}

impl ReverseProxy {
    /// Plain HTTP, removing `caps` from every ref advertisement (as a host that does not offer
    /// them) and recording the capabilities each request asks for.
    pub async fn stripping(upstream: SocketAddr, caps: &[&str]) -> Self {
        let (mut state, refused, passed) = forward_state(upstream, None);
        let strip = Arc::new(Strip {
            caps: caps.iter().map(|c| (*c).to_owned()).collect(),
            requested: Mutex::default(),
        });
        state.strip = Some(strip.clone());
        let app = axum::Router::new().fallback(forward).with_state(state);
        let (address, task) = crate::serve_on_loopback(app).await;
        Self {
            address,
            scheme: "http",
            host: "127.0.0.1",
            refused,
            passed,
            strip: Some(strip),
            _task: task,
        }
    }

    /// Plain HTTP, running `hook` on each push's body before forwarding it: another client's
    /// change landing between a backend's advertisement and its push.
    pub async fn before_push(upstream: SocketAddr, hook: PushHook) -> Self {
        let (mut state, refused, passed) = forward_state(upstream, None);
        state.before_push = Some(hook);
        let app = axum::Router::new().fallback(forward).with_state(state);
        let (address, task) = crate::serve_on_loopback(app).await;
        Self {
            address,
            scheme: "http",
            host: "127.0.0.1",
            refused,
            passed,
            strip: None,
            _task: task,
        }
    }

    /// (service, capabilities) of every upload-pack and receive-pack request so far.
    pub fn requested(&self) -> Vec<(String, Vec<String>)> {
        self.strip
            .as_ref()
            .map(|s| s.requested.lock().expect("requested").clone())
            .unwrap_or_default()
    }

    /// Plain HTTP, letting through only `Authorization: Bearer BEARER_TOKEN`.
    pub async fn bearer_only(upstream: SocketAddr) -> Self {
        let (state, refused, passed) = forward_state(upstream, Some(BEARER_TOKEN));
        let app = axum::Router::new().fallback(forward).with_state(state);
        let (address, task) = crate::serve_on_loopback(app).await;
        Self {
            address,
            scheme: "http",
            host: "127.0.0.1",
            refused,
            passed,
            strip: None,
            _task: task,
        }
    }

    /// HTTPS with `identity`'s certificate, passing requests through unchanged.
    pub async fn tls(upstream: SocketAddr, identity: &ServerIdentity) -> Self {
        let (state, refused, passed) = forward_state(upstream, None);
        let app = axum::Router::new().fallback(forward).with_state(state);
        let config = identity.server_config();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, app) = (acceptor.clone(), app.clone());
                tokio::spawn(async move {
                    // A client that refuses our certificate ends the handshake: nothing to serve.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |request| {
                        tower::ServiceExt::oneshot(app.clone(), request)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            address,
            scheme: "https",
            host: identity.host,
            refused,
            passed,
            strip: None,
            _task: task,
        }
    }

    /// The URL of repository `name` through the proxy.
    pub fn url(&self, name: &str) -> String {
        format!(
            "{}://{}:{}/{name}.git",
            self.scheme,
            self.host,
            self.address.port()
        )
    }

    /// Requests turned away for their credentials.
    pub fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }

    /// Requests forwarded to the git server.
    pub fn passed(&self) -> usize {
        self.passed.load(Ordering::SeqCst)
    }
}

fn forward_state(
    upstream: SocketAddr,
    bearer: Option<&'static str>,
) -> (Forward, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let refused = Arc::new(AtomicUsize::new(0));
    let passed = Arc::new(AtomicUsize::new(0));
    let state = Forward {
        upstream,
        client: reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client"),
        bearer,
        strip: None,
        before_push: None,
        refused: refused.clone(),
        passed: passed.clone(),
    };
    (state, refused, passed)
}

async fn forward(
    State(state): State<Forward>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let authorization = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if let Some(token) = state.bearer
        && authorization != format!("Bearer {token}")
    {
        state.refused.fetch_add(1, Ordering::SeqCst);
        return Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header("WWW-Authenticate", "Bearer realm=\"git\"")
            .body(Body::from("a Bearer token is required\n"))
            .expect("static response");
    }
    state.passed.fetch_add(1, Ordering::SeqCst);
    let input = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    if let Some(strip) = &state.strip {
        record_capabilities(strip, uri.path(), &input);
    }
    if let Some(hook) = &state.before_push
        && uri.path().ends_with("/git-receive-pack")
    {
        hook(&input);
    }
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or_default();
    let mut request = state
        .client
        .request(method, format!("http://{}{path}", state.upstream))
        .body(input);
    for (name, value) in &headers {
        let replaced = state.bearer.is_some() && name == http::header::AUTHORIZATION;
        if name != http::header::HOST && name != http::header::CONTENT_LENGTH && !replaced {
            request = request.header(name, value);
        }
    }
    if state.bearer.is_some() {
        let basic =
            base64::engine::general_purpose::STANDARD.encode(format!("{GIT_USER}:{GIT_TOKEN}"));
        request = request.header(http::header::AUTHORIZATION, format!("Basic {basic}"));
    }
    let Ok(upstream) = request.send().await else {
        return Response::builder()
            .status(StatusCode::BAD_GATEWAY)
            .body(Body::from("upstream unreachable\n"))
            .expect("static response");
    };
    let mut builder = Response::builder().status(upstream.status());
    if let Some(value) = upstream.headers().get(http::header::CONTENT_TYPE) {
        builder = builder.header(http::header::CONTENT_TYPE, value.clone());
    }
    let bytes = upstream.bytes().await.unwrap_or_default();
    let bytes = match &state.strip {
        Some(strip) if uri.path().ends_with("/info/refs") => {
            bytes::Bytes::from(strip_advertisement(&bytes, &strip.caps))
        }
        _ => bytes,
    };
    builder.body(Body::from(bytes)).expect("response")
}

/// The capabilities on the first pkt-line of an upload-pack (`want <id> caps…`) or receive-pack
/// (`<old> <new> <ref>\0caps…`) request.
fn record_capabilities(strip: &Strip, path: &str, body: &[u8]) {
    let service = if path.ends_with("/git-upload-pack") {
        "upload-pack"
    } else if path.ends_with("/git-receive-pack") {
        "receive-pack"
    } else {
        return;
    };
    let Ok(Some(line)) = gitstate_git::protocol::pkt::Reader::new(body).next_line() else {
        return;
    };
    let line = String::from_utf8_lossy(line).into_owned();
    let caps: Vec<String> = match line.split_once('\0') {
        Some((_, caps)) => caps.split(' ').map(str::to_owned).collect(),
        None => line.split(' ').skip(2).map(str::to_owned).collect(),
    };
    strip
        .requested
        .lock()
        .expect("requested")
        .push((service.to_owned(), caps));
}

/// The advertisement with `caps` removed from its capability list (the first ref line).
fn strip_advertisement(body: &[u8], caps: &[String]) -> Vec<u8> {
    use gitstate_git::protocol::pkt::{Frame, Reader, flush, write};
    let mut reader = Reader::new(body);
    let mut out = Vec::new();
    let mut first_ref = true;
    let mut flushes = 0;
    while let Ok(Some(frame)) = reader.next_frame() {
        match frame {
            Frame::Flush => {
                flushes += 1;
                flush(&mut out);
            }
            Frame::Data(line) if flushes == 1 && first_ref => {
                first_ref = false;
                let text = String::from_utf8_lossy(line);
                let Some((head, list)) = text.trim_end_matches('\n').split_once('\0') else {
                    write(&mut out, line);
                    continue;
                };
                let kept: Vec<&str> = list
                    .split(' ')
                    .filter(|c| !caps.iter().any(|s| c.split('=').next() == Some(s.as_str())))
                    .collect();
                write(&mut out, format!("{head}\0{}\n", kept.join(" ")).as_bytes());
            }
            Frame::Data(line) => write(&mut out, line),
            Frame::Special => {}
        }
    }
    out
}

/// A private certificate authority made with the openssl CLI, as an operator would.
pub struct TestCa {
    dir: tempfile::TempDir,
    name: String,
}

/// A server certificate and key signed by a [`TestCa`], for `host`.
pub struct ServerIdentity {
    pub host: &'static str,
    cert: Vec<u8>,
    key: Vec<u8>,
}

fn openssl(args: &[&str], dir: &Path) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let subject = format!("/CN={name} test CA");
        openssl(
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                &subject,
            ],
            dir.path(),
        );
        Self {
            dir,
            name: name.to_owned(),
        }
    }

    /// The CA certificate (PEM), what `GITSTATE_GIT_CA_FILE` points at.
    pub fn pem_path(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    pub fn pem(&self) -> String {
        std::fs::read_to_string(self.pem_path()).expect("CA PEM")
    }

    /// A certificate for `127.0.0.1` (and `localhost`) signed by this CA.
    pub fn issue(&self, host: &'static str) -> ServerIdentity {
        let dir = self.dir.path();
        let stem = format!("{}-server", self.name);
        openssl(
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                &format!("{stem}.key"),
                "-out",
                &format!("{stem}.csr"),
                "-subj",
                &format!("/CN={host}"),
            ],
            dir,
        );
        std::fs::write(
            dir.join(format!("{stem}.ext")),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        )
        .expect("extensions");
        openssl(
            &[
                "x509",
                "-req",
                "-in",
                &format!("{stem}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &format!("{stem}.pem"),
                "-extfile",
                &format!("{stem}.ext"),
            ],
            dir,
        );
        ServerIdentity {
            host,
            cert: std::fs::read(dir.join(format!("{stem}.pem"))).expect("cert"),
            key: std::fs::read(dir.join(format!("{stem}.key"))).expect("key"),
        }
    }
}

impl ServerIdentity {
    /// The certificate chain and key as PEM files in `dir` (for `--tls-cert`/`--tls-key`).
    pub fn write_to(&self, dir: &Path) -> (PathBuf, PathBuf) {
        let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
        std::fs::write(&cert, &self.cert).expect("certificate written");
        std::fs::write(&key, &self.key).expect("key written");
        (cert, key)
    }

    fn server_config(&self) -> rustls::ServerConfig {
        use rustls::pki_types::pem::PemObject;
        let certs: Vec<_> = rustls::pki_types::CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<_, _>>()
            .expect("server certificate");
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(&self.key).expect("server key");
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server config")
    }
}

/// An HTTP CONNECT proxy: it records every tunnel asked for (`host:port`) and splices bytes.
pub struct ConnectProxy {
    pub address: SocketAddr,
    tunnels: Arc<Mutex<Vec<String>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl ConnectProxy {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let tunnels = Arc::new(Mutex::new(Vec::new()));
        let seen = tunnels.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(tunnel(client, seen.clone()));
            }
        });
        Self {
            address,
            tunnels,
            _task: task,
        }
    }

    /// `http://127.0.0.1:<port>`, for `HTTPS_PROXY`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// The targets of every CONNECT so far.
    pub fn tunnels(&self) -> Vec<String> {
        self.tunnels.lock().expect("tunnels").clone()
    }
}

async fn tunnel(mut client: tokio::net::TcpStream, seen: Arc<Mutex<Vec<String>>>) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
        match client.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut words = head.split_whitespace();
    let (Some("CONNECT"), Some(target)) = (words.next(), words.next()) else {
        let _ = client
            .write_all(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n")
            .await;
        return;
    };
    seen.lock().expect("tunnels").push(target.to_owned());
    let Ok(mut upstream) = tokio::net::TcpStream::connect(target).await else {
        let _ = client
            .write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
            .await;
        return;
    };
    if client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}
