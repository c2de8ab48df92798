//! A bounded attack on a running `gitstate serve` over loopback, shared by the attack test of the
//! binary (functions/gitstate-cli/tests/it/attack.rs) and the benchmark's `hostile` section.
//!
//! Three kinds of traffic, at the same time, each connection from its own 127/8 address (the
//! client socket is bound to `127.k.y.z` before it connects, so the server sees thousands of
//! clients):
//! - a flood of requests with a malformed `Authorization` header (generated over every way a
//!   header can fail to yield credentials), one per address;
//! - wrong passwords for a known user name from a few addresses, several each;
//! - slow heads: connections that send half a request head (after the TLS handshake on a TLS
//!   listener) and then nothing, held until the server closes them or the wait runs out.
//!
//! Everything is bounded in count and in time: the run ends by itself.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rand::{Rng as _, SeedableRng as _};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// The longest any one attack request may take before it counts as unanswered.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the attack goes.
#[derive(Clone)]
pub struct Target {
    pub address: SocketAddr,
    /// `Some`: a TLS listener, trusted through this configuration.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl Target {
    pub fn plain(address: SocketAddr) -> Self {
        Self { address, tls: None }
    }

    /// A TLS listener whose certificate (for 127.0.0.1) `ca_pem` issued.
    pub fn tls(address: SocketAddr, ca_pem: &str) -> Self {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject as _;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots
                .add(cert.expect("a CA certificate"))
                .expect("CA added");
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        Self {
            address,
            tls: Some(Arc::new(config)),
        }
    }
}

/// How much of each kind, how fast.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Requests with a malformed `Authorization` header, each from its own address.
    pub malformed: usize,
    /// Wrong passwords for `user`, spread evenly over `guess_addresses` addresses.
    pub guesses: usize,
    pub guess_addresses: usize,
    pub user: String,
    /// Slow heads, each from its own address.
    pub slow: usize,
    /// Flood requests in flight at once.
    pub workers: usize,
    /// The flood is paced over this long (request `i` not before `i / n` of it);
    /// `Duration::ZERO`: as fast as the server answers.
    pub spread: Duration,
    /// How long a slow head waits for the server to close it before giving up.
    pub slow_wait: Duration,
    /// Seeds the generated headers and passwords.
    pub seed: u64,
}

/// What the attack has done so far, readable while it runs.
#[derive(Default, Debug)]
pub struct Progress {
    /// Flood requests (malformed and guesses) answered or failed so far.
    pub flood_done: AtomicUsize,
    /// Slow heads currently open (sent, not yet closed).
    pub slow_open: AtomicUsize,
}

/// What the attack saw.
#[derive(Default, Debug)]
pub struct Report {
    /// Status → count for the malformed flood; status 0: no answer (refused, reset, timed out).
    pub malformed: BTreeMap<u16, usize>,
    /// Status → count for the wrong passwords.
    pub guesses: BTreeMap<u16, usize>,
    /// Slow heads that got their half head through.
    pub slow_sent: usize,
    /// Of those, closed by the server within the wait, and after how long.
    pub slow_closed_after: Vec<Duration>,
    /// Slow heads the server answered with a status before closing (a 408, a 503 over a cap).
    pub slow_answered: BTreeMap<u16, usize>,
    /// From the first flood request to the last answer.
    pub flood_time: Duration,
}

impl Report {
    /// Flood requests answered with any status per second of the flood.
    pub fn flood_rate(&self) -> f64 {
        let answered: usize = self
            .malformed
            .iter()
            .chain(&self.guesses)
            .filter(|(status, _)| **status != 0)
            .map(|(_, n)| n)
            .sum();
        answered as f64 / self.flood_time.as_secs_f64().max(1e-9)
    }
}

/// The attacker's `i`-th address of kind `kind` (each kind its own range of 127/8; host parts 0
/// and 255 skipped).
pub fn attacker(kind: u8, i: usize) -> Ipv4Addr {
    let n = (i / 254) * 256 + i % 254 + 1;
    let second = kind as usize + (n >> 16);
    assert!(
        second < 256,
        "attacker address {i} of kind {kind} out of 127/8"
    );
    Ipv4Addr::new(127, second as u8, (n >> 8) as u8, n as u8)
}

/// The address ranges of the three kinds.
const MALFORMED: u8 = 16;
const GUESSES: u8 = 200;
const SLOW: u8 = 220;

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// A connection to `target` from `from` (after the TLS handshake on a TLS target).
async fn connect(target: &Target, from: Ipv4Addr) -> std::io::Result<Box<dyn Stream>> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from.into(), 0))?;
    let tcp = socket.connect(target.address).await?;
    match &target.tls {
        None => Ok(Box::new(tcp)),
        Some(config) => {
            let name = rustls::pki_types::ServerName::IpAddress(target.address.ip().into());
            let tls = tokio_rustls::TlsConnector::from(config.clone())
                .connect(name, tcp)
                .await?;
            Ok(Box::new(tls))
        }
    }
}

/// One request from `from`; its status, or 0 if none came.
async fn send(target: &Target, from: Ipv4Addr, authorization: &[u8]) -> u16 {
    let exchange = async {
        let mut stream = connect(target, from).await.ok()?;
        let mut request = format!(
            "GET /states/attack/target.tfstate HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
             Authorization: ",
            target.address
        )
        .into_bytes();
        request.extend_from_slice(authorization);
        request.extend_from_slice(b"\r\n\r\n");
        stream.write_all(&request).await.ok()?;
        let mut answer = Vec::new();
        // A TLS peer that closes without close_notify ends in an error: what came is enough.
        let _ = stream.read_to_end(&mut answer).await;
        status_of(&answer)
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .ok()
        .flatten()
        .unwrap_or(0)
}

fn status_of(answer: &[u8]) -> Option<u16> {
    let line = answer.split(|b| *b == b'\n').next()?;
    let text = std::str::from_utf8(line).ok()?;
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// A header from each way one fails to yield credentials (picked by `rng`).
pub fn malformed_header(rng: &mut impl rand::Rng) -> Vec<u8> {
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let word = |rng: &mut dyn rand::RngCore, len: usize| -> String {
        (0..len)
            .map(|_| char::from(b'a' + (rng.next_u32() % 26) as u8))
            .collect()
    };
    match rng.random_range(0..8) {
        // Not base64.
        0 => format!("Basic {}!!!", word(rng, 3)).into_bytes(),
        // No colon between user and password.
        1 => format!("Basic {}", b64(word(rng, 12).as_bytes())).into_bytes(),
        // Not UTF-8 once decoded.
        2 => {
            let mut raw = word(rng, 5).into_bytes();
            raw.extend_from_slice(&[b':', 0xff, 0xfe]);
            format!("Basic {}", b64(&raw)).into_bytes()
        }
        // An empty user or password.
        3 => format!("Basic {}", b64(format!(":{}", word(rng, 8)).as_bytes())).into_bytes(),
        4 => format!("Basic {}", b64(format!("{}:", word(rng, 8)).as_bytes())).into_bytes(),
        // Another scheme.
        5 => format!("Bearer {}", word(rng, 40)).into_bytes(),
        // No scheme at all.
        6 => word(rng, 20).into_bytes(),
        // Longer than any header is looked at.
        _ => format!("Basic {}", "A".repeat(5_000)).into_bytes(),
    }
}

/// Basic credentials for `user` with `password`.
pub fn basic(user: &str, password: &str) -> Vec<u8> {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
    .into_bytes()
}

/// Run `plan` against `target` until every request is answered and every slow head is closed
/// (or its wait ran out).
pub async fn run(target: &Target, plan: &Plan, progress: Arc<Progress>) -> Report {
    let slow = tokio::spawn(slow_heads(target.clone(), plan.clone(), progress.clone()));
    // The flood starts once the slow heads hold their places.
    slow_heads_open(&progress, plan.slow, Duration::from_secs(30)).await;
    let started = Instant::now();
    // The flood: malformed first in the order, the guesses interleaved evenly among them.
    let total = plan.malformed + plan.guesses;
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..plan.workers.max(1) {
        let (target, plan, next, progress) =
            (target.clone(), plan.clone(), next.clone(), progress.clone());
        workers.spawn(async move {
            let mut seen: Vec<(bool, u16)> = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break seen;
                }
                if !plan.spread.is_zero() {
                    let due = started + plan.spread.mul_f64(i as f64 / total as f64);
                    tokio::time::sleep_until(due.into()).await;
                }
                let mut rng = rand::rngs::StdRng::seed_from_u64(plan.seed ^ ((i as u64) << 8));
                // Guess g is request i when i * guesses / total crosses g.
                let is_guess = plan.guesses > 0
                    && (i * plan.guesses / total) != ((i + 1) * plan.guesses / total);
                let status = if is_guess {
                    let g = (i + 1) * plan.guesses / total - 1;
                    let from = attacker(GUESSES, g % plan.guess_addresses.max(1));
                    let password = format!("guess-{}", rng.random::<u64>());
                    send(&target, from, &basic(&plan.user, &password)).await
                } else {
                    let m = i - (i * plan.guesses / total);
                    send(&target, attacker(MALFORMED, m), &malformed_header(&mut rng)).await
                };
                progress.flood_done.fetch_add(1, Ordering::Relaxed);
                seen.push((is_guess, status));
            }
        });
    }
    let mut report = Report::default();
    while let Some(seen) = workers.join_next().await {
        for (is_guess, status) in seen.expect("a flood worker") {
            let tally = if is_guess {
                &mut report.guesses
            } else {
                &mut report.malformed
            };
            *tally.entry(status).or_default() += 1;
        }
    }
    report.flood_time = started.elapsed();
    let (sent, closed_after, answered) = slow.await.expect("the slow heads");
    report.slow_sent = sent;
    report.slow_closed_after = closed_after;
    report.slow_answered = answered;
    report
}

/// Open `plan.slow` connections, each sending half a head, and wait for the server to close them.
async fn slow_heads(
    target: Target,
    plan: Plan,
    progress: Arc<Progress>,
) -> (usize, Vec<Duration>, BTreeMap<u16, usize>) {
    let mut held = tokio::task::JoinSet::new();
    for i in 0..plan.slow {
        let (target, progress) = (target.clone(), progress.clone());
        let wait = plan.slow_wait;
        held.spawn(async move {
            let mut stream = connect(&target, attacker(SLOW, i)).await.ok()?;
            let half = format!(
                "GET /health HTTP/1.1\r\nHost: {}\r\nAuthorization: Basic ",
                target.address
            );
            stream.write_all(half.as_bytes()).await.ok()?;
            stream.flush().await.ok()?;
            let sent = Instant::now();
            progress.slow_open.fetch_add(1, Ordering::Relaxed);
            let mut answer = Vec::new();
            let closed = tokio::time::timeout(wait, async {
                let mut buf = [0u8; 1024];
                loop {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => answer.extend_from_slice(&buf[..n]),
                    }
                }
            })
            .await
            .is_ok();
            progress.slow_open.fetch_sub(1, Ordering::Relaxed);
            Some((closed.then(|| sent.elapsed()), status_of(&answer)))
        });
        // Opened in quick succession, not all in one instant.
        if i % 50 == 49 {
            tokio::task::yield_now().await;
        }
    }
    let (mut sent, mut closed_after, mut answered) = (0, Vec::new(), BTreeMap::new());
    while let Some(outcome) = held.join_next().await {
        if let Some((closed, status)) = outcome.expect("a slow head") {
            sent += 1;
            closed_after.extend(closed);
            if let Some(status) = status {
                *answered.entry(status).or_default() += 1;
            }
        }
    }
    (sent, closed_after, answered)
}

/// Wait until `n` slow heads are open (or `within` passes); whether they are.
pub async fn slow_heads_open(progress: &Progress, n: usize, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while progress.slow_open.load(Ordering::Relaxed) < n {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attacker_addresses_are_distinct_and_in_their_range() {
        let mut seen = std::collections::HashSet::new();
        for kind in [MALFORMED, GUESSES, SLOW] {
            for i in 0..20_000 {
                let a = attacker(kind, i);
                assert!(a.is_loopback() && a.octets()[3] != 0 && a.octets()[3] != 255);
                assert!(a != Ipv4Addr::LOCALHOST);
                assert!(seen.insert(a), "{a} twice");
            }
        }
    }
}
