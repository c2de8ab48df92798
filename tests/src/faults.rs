//! A fault-injecting HTTP proxy for the git server: each request, drawn from a seeded plan, is
//! passed through, answered 500/503 without reaching the server, passed through and then
//! answered 500 (the server acted, the client is told it failed), cut mid-body, stalled past the
//! client's timeout, or slowed down.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode, Uri};
use http_body_util::BodyExt;
use rand::{Rng, SeedableRng};

/// What the proxy does to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    Pass,
    /// Answer this status without forwarding.
    Refuse(u16),
    /// Forward, then answer 500 whatever the server said.
    LoseAnswer,
    /// Forward, send the headers and half the body, then drop the connection.
    CutBody,
    /// Wait this long before forwarding (past the client's timeout, it never arrives).
    Stall(Duration),
    /// Wait this long, then pass.
    Slow(Duration),
}

/// A request whose answer is lost, and held until the test has acted.
struct HeldLoss {
    /// Notified once the server has answered the request.
    forwarded: Arc<tokio::sync::Notify>,
    /// The 500 goes back once this is notified.
    release: Arc<tokio::sync::Notify>,
}

/// Requests held before they are forwarded, each with the status to answer instead (`None`:
/// forward it once released).
type HeldBefore = Arc<Mutex<VecDeque<(HeldLoss, Option<u16>)>>>;

#[derive(Clone)]
struct Proxy {
    upstream: SocketAddr,
    client: reqwest::Client,
    plan: Arc<Mutex<Plan>>,
    held: Arc<Mutex<VecDeque<HeldLoss>>>,
    before: HeldBefore,
    before_fetch: Arc<Mutex<VecDeque<HeldLoss>>>,
    enabled: Arc<AtomicBool>,
}

struct Plan {
    rng: rand::rngs::StdRng,
    /// Probability that a request meets a fault at all.
    rate: f64,
    faults: Vec<Fault>,
    seen: Vec<Fault>,
}

/// The proxy, listening on loopback in front of `upstream`.
pub struct FaultProxy {
    pub address: SocketAddr,
    plan: Arc<Mutex<Plan>>,
    held: Arc<Mutex<VecDeque<HeldLoss>>>,
    before: HeldBefore,
    before_fetch: Arc<Mutex<VecDeque<HeldLoss>>>,
    enabled: Arc<AtomicBool>,
    _task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy to `upstream` that injects one of `faults` into a share `rate` of requests, drawn
    /// from `seed`. It starts enabled.
    pub async fn start(upstream: SocketAddr, seed: u64, rate: f64, faults: Vec<Fault>) -> Self {
        let plan = Arc::new(Mutex::new(Plan {
            rng: rand::rngs::StdRng::seed_from_u64(seed),
            rate,
            faults,
            seen: Vec::new(),
        }));
        let enabled = Arc::new(AtomicBool::new(true));
        let held = Arc::new(Mutex::new(VecDeque::new()));
        let before = Arc::new(Mutex::new(VecDeque::new()));
        let before_fetch = Arc::new(Mutex::new(VecDeque::new()));
        let state = Proxy {
            upstream,
            client: reqwest::Client::new(),
            plan: plan.clone(),
            held: held.clone(),
            before: before.clone(),
            before_fetch: before_fetch.clone(),
            enabled: enabled.clone(),
        };
        let app = axum::Router::new().fallback(forward).with_state(state);
        let (address, task) = crate::serve_on_loopback(app).await;
        Self {
            address,
            plan,
            held,
            before,
            before_fetch,
            enabled,
            _task: task,
        }
    }

    /// The next request (whatever the plan and even when disabled) forwards and then loses its
    /// answer (500), answering only once the returned `release` is notified; `forwarded` is
    /// notified as soon as the server has answered it. A test acts in between.
    pub fn lose_next_answer_held(&self) -> (Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>) {
        let (release, forwarded) = (
            Arc::new(tokio::sync::Notify::new()),
            Arc::new(tokio::sync::Notify::new()),
        );
        self.held.lock().expect("held").push_back(HeldLoss {
            forwarded: forwarded.clone(),
            release: release.clone(),
        });
        (release, forwarded)
    }

    /// The next request waits before it is forwarded: `arrived` is notified when it reaches the
    /// proxy, and it passes through once `release` is notified (with `refuse`, it is answered
    /// that status instead, never reaching the server).
    pub fn hold_next_before(
        &self,
        refuse: Option<u16>,
    ) -> (Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>) {
        let (release, arrived) = (
            Arc::new(tokio::sync::Notify::new()),
            Arc::new(tokio::sync::Notify::new()),
        );
        self.before.lock().expect("before").push_back((
            HeldLoss {
                forwarded: arrived.clone(),
                release: release.clone(),
            },
            refuse,
        ));
        (release, arrived)
    }

    /// The next fetch (a POST to `git-upload-pack`) waits before it is forwarded, whatever other
    /// requests pass meanwhile: `arrived` is notified when it reaches the proxy, and it passes
    /// through once `release` is notified.
    pub fn hold_next_fetch(&self) -> (Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>) {
        let (release, arrived) = (
            Arc::new(tokio::sync::Notify::new()),
            Arc::new(tokio::sync::Notify::new()),
        );
        self.before_fetch
            .lock()
            .expect("before fetch")
            .push_back(HeldLoss {
                forwarded: arrived.clone(),
                release: release.clone(),
            });
        (release, arrived)
    }

    /// The URL of repository `name` through the proxy.
    pub fn url(&self, name: &str) -> String {
        format!("http://{}/{name}.git", self.address)
    }

    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::SeqCst);
    }

    /// Every fault injected so far (passes excluded).
    pub fn injected(&self) -> Vec<Fault> {
        self.plan.lock().expect("plan").seen.clone()
    }
}

fn choose(state: &Proxy) -> Fault {
    if !state.enabled.load(Ordering::SeqCst) {
        return Fault::Pass;
    }
    let mut guard = state.plan.lock().expect("plan");
    let plan = &mut *guard;
    if plan.faults.is_empty() || !plan.rng.random_bool(plan.rate) {
        return Fault::Pass;
    }
    let index = plan.rng.random_range(0..plan.faults.len());
    let fault = plan.faults[index];
    plan.seen.push(fault);
    fault
}

async fn forward(
    State(state): State<Proxy>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if method == Method::POST && uri.path().ends_with("/git-upload-pack") {
        let held = state.before_fetch.lock().expect("before fetch").pop_front();
        if let Some(held) = held {
            held.forwarded.notify_one();
            held.release.notified().await;
        }
    }
    let before = state.before.lock().expect("before").pop_front();
    if let Some((before, refuse)) = before {
        before.forwarded.notify_one();
        before.release.notified().await;
        if let Some(status) = refuse {
            return Response::builder()
                .status(status)
                .body(Body::from("injected failure\n"))
                .expect("static response");
        }
    }
    let held = state.held.lock().expect("held").pop_front();
    let fault = match held {
        Some(_) => Fault::LoseAnswer,
        None => choose(&state),
    };
    match fault {
        Fault::Refuse(status) => {
            return Response::builder()
                .status(status)
                .body(Body::from("injected failure\n"))
                .expect("static response");
        }
        Fault::Stall(wait) | Fault::Slow(wait) => tokio::time::sleep(wait).await,
        Fault::Pass | Fault::LoseAnswer | Fault::CutBody => {}
    }
    let input = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or_default();
    let mut request = state
        .client
        .request(method, format!("http://{}{path}", state.upstream))
        .body(input);
    for (name, value) in &headers {
        if name != http::header::HOST && name != http::header::CONTENT_LENGTH {
            request = request.header(name, value);
        }
    }
    let Ok(upstream) = request.send().await else {
        return Response::builder()
            .status(StatusCode::BAD_GATEWAY)
            .body(Body::from("upstream unreachable\n"))
            .expect("static response");
    };
    let status = upstream.status();
    let content_type = upstream.headers().get(http::header::CONTENT_TYPE).cloned();
    let bytes = upstream.bytes().await.unwrap_or_default();
    if let Some(held) = held {
        held.forwarded.notify_one();
        held.release.notified().await;
    }
    if fault == Fault::LoseAnswer {
        return Response::builder()
            .status(500)
            .body(Body::from("injected failure after the server acted\n"))
            .expect("static response");
    }
    let mut builder = Response::builder().status(status);
    if let Some(value) = content_type {
        builder = builder.header(http::header::CONTENT_TYPE, value);
    }
    if fault == Fault::CutBody {
        // Promise the whole body, deliver half, then fail the stream: the connection is cut.
        let (mut sender, channel) =
            http_body_util::channel::Channel::<Bytes, std::io::Error>::new(2);
        let half = bytes.slice(..bytes.len() / 2);
        tokio::spawn(async move {
            let _ = sender.send_data(half).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
            sender.abort(std::io::Error::other("injected cut"));
        });
        return builder
            .header(http::header::CONTENT_LENGTH, bytes.len())
            .body(Body::new(channel))
            .expect("cut response");
    }
    builder.body(Body::from(bytes)).expect("response")
}
