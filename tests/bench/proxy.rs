//! A loopback HTTP proxy that counts what passes: every request is held for a fixed delay, then
//! forwarded with its headers, and the whole answer (status, headers, body) comes back. It
//! stands in front of moto's S3 and KMS and of the Lambda emulator's Function URL, whose
//! clients (Terraform's S3 backend, the AWS SDK, Terraform's HTTP backend) need their answers'
//! headers; the git server counts its own requests.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use http::{HeaderMap, Method, StatusCode, Uri, header};
use http_body_util::BodyExt;

/// One request that passed: `METHOD /path?query`, its answer's status, and how long the
/// upstream took to answer it (the delay not included).
#[derive(Debug, Clone)]
pub struct Passed {
    pub method: String,
    pub path: String,
    pub status: u16,
    pub took: Duration,
}

#[derive(Clone)]
struct Shared {
    upstream: SocketAddr,
    delay: Duration,
    client: reqwest::Client,
    seen: Arc<Mutex<Vec<Passed>>>,
}

pub struct CountingProxy {
    pub address: SocketAddr,
    seen: Arc<Mutex<Vec<Passed>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl CountingProxy {
    pub async fn start(upstream: SocketAddr, delay: Duration) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let shared = Shared {
            upstream,
            delay,
            client: reqwest::Client::new(),
            seen: seen.clone(),
        };
        let app = axum::Router::new().fallback(forward).with_state(shared);
        let (address, task) = gitstate_tests::serve_on_loopback(app).await;
        Self {
            address,
            seen,
            _task: task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// What passed since the last call.
    pub fn take(&self) -> Vec<Passed> {
        std::mem::take(&mut *self.seen.lock().expect("seen"))
    }
}

/// Headers that belong to one connection, not to the message.
fn hop_by_hop(name: &header::HeaderName) -> bool {
    [
        header::HOST,
        header::CONNECTION,
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::TE,
        header::TRAILER,
    ]
    .contains(name)
        || name.as_str() == "keep-alive"
}

async fn forward(
    State(shared): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    tokio::time::sleep(shared.delay).await;
    let input = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut request = shared
        .client
        .request(method.clone(), format!("http://{}{path}", shared.upstream))
        .body(input);
    for (name, value) in headers.iter().filter(|(name, _)| !hop_by_hop(name)) {
        request = request.header(name, value);
    }
    let started = Instant::now();
    let answer = request.send().await;
    let (status, builder, bytes) = match answer {
        Ok(upstream) => {
            let status = upstream.status();
            let mut builder = Response::builder().status(status);
            let length = upstream.headers().get(header::CONTENT_LENGTH).cloned();
            for (name, value) in upstream.headers().iter().filter(|(n, _)| !hop_by_hop(n)) {
                builder = builder.header(name, value);
            }
            // A HEAD answer's length is the object's, with no body to measure it by.
            if let (true, Some(length)) = (method == Method::HEAD, length) {
                builder = builder.header(header::CONTENT_LENGTH, length);
            }
            (status, builder, upstream.bytes().await.unwrap_or_default())
        }
        Err(_) => (
            StatusCode::BAD_GATEWAY,
            Response::builder().status(StatusCode::BAD_GATEWAY),
            bytes::Bytes::from_static(b"upstream unreachable\n"),
        ),
    };
    shared.seen.lock().expect("seen").push(Passed {
        method: method.to_string(),
        path: path.to_owned(),
        status: status.as_u16(),
        took: started.elapsed(),
    });
    if method == Method::HEAD {
        return builder.body(Body::empty()).expect("response");
    }
    builder.body(Body::from(bytes)).expect("response")
}
