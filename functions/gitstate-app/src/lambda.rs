//! The Lambda function's adapter: its logging set-up, with the runtime, SDK and HTTP crates
//! capped, and the facts of a Function URL request the router needs (client address, the
//! invocation's deadline, https).

use std::time::{Duration, Instant, SystemTime};

use gitstate_http::{ClientAddr, Deadline, SCHEME_HEADER};
use lambda_http::request::RequestContext;
use lambda_http::tracing::subscriber::filter::{EnvFilter, LevelFilter, Targets};
use lambda_http::tracing::subscriber::{Layer as _, layer::SubscriberExt as _};
use lambda_http::{Request, RequestExt};

/// Time kept back from the invocation's deadline to send the answer.
const ANSWER_MARGIN: Duration = Duration::from_secs(2);
/// Lambda's longest timeout.
const LONGEST_INVOCATION: Duration = Duration::from_secs(15 * 60);

/// Targets of the Lambda runtime crates and the most they may log, whatever level the deployment
/// chooses: `lambda_runtime` logs the raw invocation event at TRACE ("raw JSON event received from
/// Lambda", `layers/api_response.rs` in 1.5), which holds the Authorization header and the state.
/// Prefix match, so `lambda_runtime::layers::api_response` is covered. The AWS SDK and HTTP
/// crates ([`gitstate_kms::SECRET_BEARING_LOG_TARGETS`]) are capped the same way.
const PINNED_TARGETS: [(&str, LevelFilter); 3] = [
    ("lambda_runtime", LevelFilter::INFO),
    ("lambda_runtime_api_client", LevelFilter::INFO),
    ("lambda_http", LevelFilter::INFO),
];

/// The filter that caps [`PINNED_TARGETS`] and the SDK's targets; it is combined with the
/// configured one, so no `RUST_LOG` directive, however specific, can raise them.
fn pinned() -> Targets {
    Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_targets(PINNED_TARGETS)
        .with_targets(
            gitstate_kms::SECRET_BEARING_LOG_TARGETS.map(|target| (target, LevelFilter::INFO)),
        )
}

/// `lambda_http::tracing::init_default_subscriber`'s set-up (level from `AWS_LAMBDA_LOG_LEVEL`,
/// else `RUST_LOG`, else INFO, refined by `RUST_LOG`'s directives; `AWS_LAMBDA_LOG_FORMAT=JSON`),
/// with [`pinned`] on top.
pub fn init_logging() {
    let var = |name| std::env::var(name).ok();
    let level = var("AWS_LAMBDA_LOG_LEVEL")
        .or_else(|| var("RUST_LOG"))
        .and_then(|level| level.parse::<LevelFilter>().ok())
        .unwrap_or(LevelFilter::INFO);
    // The level applies to every target, and RUST_LOG's directives refine it.
    let configured = EnvFilter::builder()
        .parse_lossy(format!("{level},{}", var("RUST_LOG").unwrap_or_default()));
    let json = var("AWS_LAMBDA_LOG_FORMAT").is_some_and(|f| f.eq_ignore_ascii_case("json"));
    let format = log_format(json, std::io::stdout);
    let subscriber = lambda_http::tracing::subscriber::registry()
        .with(format.with_filter(configured).with_filter(pinned()));
    if lambda_http::tracing::subscriber::util::SubscriberInitExt::try_init(subscriber).is_err() {
        eprintln!("a tracing subscriber was already set");
    }
    // Once per cold start, and only at TRACE: why the capped crates say nothing more.
    lambda_http::tracing::trace!(
        "logging at TRACE; the Lambda runtime, AWS SDK and HTTP crates stay at INFO"
    );
}

/// The function's log line format, JSON when Lambda's log format is (the template sets JSON),
/// written to `writer`: the failed-login metric filter of template.yaml matches these lines, and
/// a test writes through this same layer to hold the pattern to them.
pub fn log_format<S, W>(
    json: bool,
    writer: W,
) -> Box<dyn lambda_http::tracing::subscriber::Layer<S> + Send + Sync>
where
    S: lambda_http::tracing::Subscriber
        + for<'a> lambda_http::tracing::subscriber::registry::LookupSpan<'a>,
    W: for<'w> lambda_http::tracing::subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let format = lambda_http::tracing::subscriber::fmt::layer()
        .with_target(false)
        .without_time()
        .with_writer(writer);
    if json {
        format.json().boxed()
    } else {
        format.boxed()
    }
}

/// How long this invocation may still work, from the deadline the runtime API gave: `None` when
/// that deadline makes no sense for a real invocation (passed, missing, or further away than any
/// Lambda timeout, as emulators send), so the configured request deadline alone applies.
fn time_left(deadline: SystemTime, now: SystemTime) -> Option<Duration> {
    let left = deadline.duration_since(now).ok()?;
    (left > ANSWER_MARGIN && left <= LONGEST_INVOCATION).then(|| left - ANSWER_MARGIN)
}

/// The caller's address as the Function URL saw it (for throttling failed logins), and the
/// invocation's deadline (so a slow git remote gets a 504 rather than a killed invocation).
pub fn with_request_facts(mut request: Request) -> Request {
    let left = request.lambda_context_ref().and_then(|context| {
        let left = time_left(context.deadline(), SystemTime::now());
        if left.is_none() {
            lambda_http::tracing::debug!(
                deadline_ms = context.deadline,
                "ignoring an implausible invocation deadline; GITSTATE_REQUEST_DEADLINE_SECS applies"
            );
        }
        left
    });
    if let Some(left) = left {
        request
            .extensions_mut()
            .insert(Deadline(Instant::now() + left));
    }
    let ip = match request.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(context)) => context
            .http
            .source_ip
            .as_deref()
            .and_then(|ip| ip.parse().ok()),
        _ => None,
    };
    if let Some(ip) = ip {
        request.extensions_mut().insert(ClientAddr(ip));
    }
    // Function URLs answer only https.
    request.headers_mut().insert(
        SCHEME_HEADER,
        lambda_http::http::HeaderValue::from_static("https"),
    );
    request
}

#[cfg(test)]
mod tests {
    use super::*;
    use lambda_http::Context;

    fn context_with_deadline(deadline: SystemTime) -> Context {
        let mut context = Context::default();
        context.deadline = u64::try_from(
            deadline
                .duration_since(SystemTime::UNIX_EPOCH)
                .expect("after 1970")
                .as_millis(),
        )
        .expect("fits");
        context
    }

    #[test]
    fn the_runtime_targets_are_capped_at_info_and_others_follow_the_configured_level() {
        use lambda_http::tracing::Level;
        let filter = pinned();
        for target in [
            "lambda_runtime",
            "lambda_runtime::layers::api_response",
            "lambda_runtime_api_client::body",
            "lambda_http::request",
            "aws_smithy_runtime::client::orchestrator",
            "aws_smithy_runtime::client::http::body::minimum_throughput",
            "aws_smithy_runtime_api::client::interceptors::context",
            "aws_sigv4::http_request::sign",
            "aws_config::imds",
            "aws_sdk_kms::operation::encrypt",
            "hyper::proto::h1::io",
            "hyper_util::client::legacy::pool",
            "h2::codec::framed_write",
            "reqwest::connect",
            "rustls::client::hs",
        ] {
            assert!(filter.would_enable(target, &Level::INFO), "{target}");
            assert!(!filter.would_enable(target, &Level::DEBUG), "{target}");
            assert!(!filter.would_enable(target, &Level::TRACE), "{target}");
        }
        for target in [
            "gitstate_git::transport::http",
            "gitstate_kms",
            "gitstate_core::auth",
        ] {
            assert!(filter.would_enable(target, &Level::TRACE), "{target}");
        }
    }

    #[test]
    fn the_invocation_deadline_less_the_margin_bounds_the_request() {
        let in_ten = SystemTime::now() + Duration::from_secs(10);
        let request = with_request_facts(
            Request::default().with_lambda_context(context_with_deadline(in_ten)),
        );
        let Deadline(at) = *request.extensions().get::<Deadline>().expect("set");
        let left = at.saturating_duration_since(Instant::now());
        assert!(
            left > Duration::from_secs(6) && left <= Duration::from_secs(8),
            "{left:?}"
        );
    }

    #[test]
    fn every_request_is_marked_https_whatever_the_client_claims() {
        for claimed in [None, Some("http"), Some("https"), Some("ftp")] {
            let mut request = Request::default();
            if let Some(claimed) = claimed {
                request.headers_mut().insert(
                    SCHEME_HEADER,
                    lambda_http::http::HeaderValue::from_static(claimed),
                );
            }
            let request = with_request_facts(request);
            let marked: Vec<_> = request.headers().get_all(SCHEME_HEADER).iter().collect();
            assert_eq!(marked, ["https"], "{claimed:?}");
        }
    }

    #[test]
    fn deadlines_no_real_invocation_has_are_ignored() {
        let now = SystemTime::now();
        for deadline in [
            SystemTime::UNIX_EPOCH,             // missing (the runtime sent 0)
            now - Duration::from_secs(30),      // passed, or another clock
            now + Duration::from_secs(1),       // inside the answer margin
            now + Duration::from_secs(16 * 60), // beyond any Lambda timeout
        ] {
            let request = with_request_facts(
                Request::default().with_lambda_context(context_with_deadline(deadline)),
            );
            assert!(
                request.extensions().get::<Deadline>().is_none(),
                "{deadline:?}"
            );
        }
        assert_eq!(
            time_left(now + Duration::from_secs(60), now),
            Some(Duration::from_secs(58))
        );
    }
}
