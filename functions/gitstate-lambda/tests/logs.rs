//! The real `gitstate-lambda` binary at the most verbose log levels a deployment can choose, fed
//! a Function URL event by a Runtime API served here, writing a state to the harness's real git
//! server: no Authorization value, password, git token or state content reaches its output.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use base64::Engine as _;
use gitstate_tests::{GIT_TOKEN, GIT_USER, GitServer, access_file};

const USER: &str = "terraform";
const PASSWORD: &str = "lambda-log-password-0123456789";
const STATE_SECRET: &str = "state-secret-5f1c9a2e6d0b";

/// The Runtime API's side: one event to hand out, then the answer the function posts.
#[derive(Clone)]
struct RuntimeApi {
    event: Arc<Mutex<Option<String>>>,
    answer: tokio::sync::mpsc::UnboundedSender<String>,
}

async fn next(State(api): State<RuntimeApi>) -> axum::response::Response {
    let event = api.event.lock().expect("not poisoned").take();
    let Some(event) = event else {
        // One invocation only: the function waits here until the test ends it.
        std::future::pending::<()>().await;
        unreachable!("pending never resolves");
    };
    let deadline = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        + Duration::from_secs(60);
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("lambda-runtime-aws-request-id", "req-logs-1".to_owned()),
        (
            "lambda-runtime-deadline-ms",
            deadline.as_millis().to_string(),
        ),
        (
            "lambda-runtime-invoked-function-arn",
            "arn:aws:lambda:eu-west-1:123456789012:function:gitstate".to_owned(),
        ),
        ("content-type", "application/json".to_owned()),
    ] {
        headers.insert(name, value.parse().expect("header value"));
    }
    (headers, event).into_response()
}

async fn answer(State(api): State<RuntimeApi>, body: String) -> axum::http::StatusCode {
    let _ = api.answer.send(body);
    axum::http::StatusCode::ACCEPTED
}

/// A Function URL event writing a state that holds [`STATE_SECRET`], as `USER`.
fn event() -> String {
    let mut event: serde_json::Value =
        serde_json::from_str(include_str!("../../../events/write.json")).expect("event JSON");
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    let headers = event["headers"].as_object_mut().expect("headers");
    headers.insert("authorization".into(), format!("Basic {basic}").into());
    headers.remove("content-md5");
    headers.remove("content-length");
    event["rawQueryString"] = "".into();
    event
        .as_object_mut()
        .expect("object")
        .remove("queryStringParameters");
    event["body"] = format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":1,"lineage":"l-1","outputs":{{"db":{{"value":"{STATE_SECRET}","type":"string","sensitive":true}}}},"resources":[]}}"#
    )
    .into();
    event.to_string()
}

/// Run the binary for one invocation with `env`; its whole output and the answer it posted.
async fn run_once(server: &GitServer, repository: &str, env: &[(&str, &str)]) -> (String, String) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let api = RuntimeApi {
        event: Arc::new(Mutex::new(Some(event()))),
        answer: tx,
    };
    let app = axum::Router::new()
        .route("/2018-06-01/runtime/invocation/next", get(next))
        .route("/2018-06-01/runtime/invocation/{id}/response", post(answer))
        .route("/2018-06-01/runtime/invocation/{id}/error", post(answer))
        .route("/2018-06-01/runtime/init/error", post(answer))
        .with_state(api);
    let (address, serving) = gitstate_tests::serve_on_loopback(app).await;
    let cache = tempfile::tempdir().expect("tempdir");
    let output = tempfile::NamedTempFile::new().expect("output file");
    let mut command = Command::new(env!("CARGO_BIN_EXE_gitstate-lambda"));
    command
        .env_remove("RUST_LOG")
        .env_remove("AWS_LAMBDA_LOG_LEVEL")
        .env_remove("AWS_LAMBDA_LOG_FORMAT")
        .env("AWS_LAMBDA_RUNTIME_API", address.to_string())
        .env("AWS_LAMBDA_FUNCTION_NAME", "gitstate")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("GITSTATE_REPOSITORY", repository)
        .env("GITSTATE_GIT_USERNAME", GIT_USER)
        .env("GITSTATE_GIT_TOKEN", GIT_TOKEN)
        .env("GITSTATE_CACHE_DIR", cache.path())
        // The event writes a state without a lock, as only a deployment that allows it may.
        .env("GITSTATE_ALLOW_UNLOCKED_WRITES", "true")
        .env(
            "GITSTATE_ACCESS",
            access_file(&[(USER, PASSWORD, &["admin:*"])]),
        )
        .stdin(Stdio::null())
        .stdout(output.reopen().expect("reopen"))
        .stderr(output.reopen().expect("reopen"));
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("the lambda binary starts");
    let posted = tokio::time::timeout(Duration::from_secs(120), rx.recv()).await;
    let _ = child.kill();
    let _ = child.wait();
    serving.abort();
    server.quiesce().await;
    let logs = std::fs::read_to_string(output.path()).expect("output");
    let posted = posted
        .unwrap_or_else(|_| panic!("no answer within 120 s; output:\n{logs}"))
        .expect("an answer");
    (logs, posted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_log_level_prints_the_raw_event_credentials_or_state() {
    let server = GitServer::start().await;
    let repository = server.create_repo("logs");
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    let git_basic =
        base64::engine::general_purpose::STANDARD.encode(format!("{GIT_USER}:{GIT_TOKEN}"));
    // Every way a deployment can turn logging up: Lambda's own control, RUST_LOG naming the
    // runtime's targets outright, or the HTTP and AWS SDK crates' (whose TRACE holds whole
    // requests: the git one's Authorization header, a KMS one's data key), and the JSON format.
    let levels: [&[(&str, &str)]; 4] = [
        &[
            ("AWS_LAMBDA_LOG_LEVEL", "TRACE"),
            (
                "RUST_LOG",
                "hyper=trace,hyper_util=trace,h2=trace,reqwest=trace,rustls=trace,aws_smithy_runtime=trace,aws_smithy_runtime_api=trace,aws_sigv4=trace,aws_config=trace,aws_sdk_kms=trace",
            ),
        ],
        &[("AWS_LAMBDA_LOG_LEVEL", "TRACE")],
        &[(
            "RUST_LOG",
            "trace,lambda_runtime=trace,lambda_runtime::layers::api_response=trace,lambda_http=trace,lambda_runtime_api_client=trace",
        )],
        &[
            ("AWS_LAMBDA_LOG_LEVEL", "trace"),
            ("AWS_LAMBDA_LOG_FORMAT", "JSON"),
            ("RUST_LOG", "lambda_runtime::layers::api_response=trace"),
        ],
    ];
    for (i, env) in levels.iter().enumerate() {
        let (logs, posted) = run_once(&server, &repository, env).await;
        let answer: serde_json::Value = serde_json::from_str(&posted).expect("a JSON answer");
        assert_eq!(
            answer["statusCode"], 200,
            "the write went through: {posted}"
        );
        assert!(
            logs.contains("TRACE") || logs.contains("\"level\":\"TRACE\""),
            "trace level is on ({env:?}):\n{logs}"
        );
        println!("run {i} ({env:?}): {} lines of log", logs.lines().count());
        for (what, secret) in [
            ("the Basic header", basic.as_str()),
            ("the password", PASSWORD),
            ("the git token", GIT_TOKEN),
            ("the git Basic header", git_basic.as_str()),
            ("the state's content", STATE_SECRET),
            ("the raw event", "raw JSON event"),
        ] {
            assert!(
                !logs.contains(secret),
                "{what} reached the log at {env:?}:\n{}",
                logs.lines()
                    .filter(|l| l.contains(secret))
                    .take(3)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
}
