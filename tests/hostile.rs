//! Hostile input: a corpus of malicious or malformed requests, each sent byte for byte over a raw
//! TCP connection (no client-side URL normalisation), must be answered 4xx with a reason, and
//! leave the remote's refs byte-identical.

use base64::Engine;
use gitstate_tests::{
    Client, GIT_TOKEN, GitServer, TEST_PASSWORD, TEST_USER, TestBackend, capture_logs,
    captured_logs, git, lock_info, state_json,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NAME: &str = "net/prod.tfstate";
const HOLDER: &str = "real-holder-id";
/// The body limit of the backend under attack (small, so oversize bodies are cheap to send).
const LIMIT: usize = 64 * 1024;
/// A sensitive output inside the stored state: it must never reach a log line.
const STATE_SECRET: &str = "hunter2-state-secret-value";

/// One hostile request.
struct Case {
    label: &'static str,
    method: &'static str,
    target: String,
    /// `None`: the test user's valid credentials; `Some(None)`: no header; `Some(Some(v))`: `v`.
    authorization: Option<Option<Vec<u8>>>,
    content_type: Option<&'static str>,
    body: Body,
}

enum Body {
    None,
    Bytes(Vec<u8>),
    /// Sent with `Transfer-Encoding: chunked` and no length.
    Chunked(Vec<u8>),
}

fn case(label: &'static str, method: &'static str, target: impl Into<String>) -> Case {
    Case {
        label,
        method,
        target: target.into(),
        authorization: None,
        content_type: None,
        body: Body::None,
    }
}

impl Case {
    fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = Body::Bytes(body.into());
        self.content_type.get_or_insert("application/json");
        self
    }

    fn chunked(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = Body::Chunked(body.into());
        self.content_type.get_or_insert("application/json");
        self
    }

    fn content_type(mut self, value: &'static str) -> Self {
        self.content_type = Some(value);
        self
    }

    fn authorization(mut self, value: Option<&[u8]>) -> Self {
        self.authorization = Some(value.map(<[u8]>::to_vec));
        self
    }
}

/// A user who may write every state but not force-unlock (that takes admin).
const WRITER: &str = "writer";
const WRITER_PASSWORD: &str = "writer-Pa55word-not-admin";

fn as_writer(case: Case) -> Case {
    let header = basic(format!("{WRITER}:{WRITER_PASSWORD}").as_bytes());
    case.authorization(Some(&header))
}

fn basic(pair: &[u8]) -> Vec<u8> {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
    .into_bytes()
}

/// The corpus. `repo` is the URL of the one allowed repository, `other` one on the same server
/// that is not allowed.
fn corpus(repo: &str, other: &str) -> Vec<Case> {
    let lock = || lock_info("intruder");
    let good_state = state_json("lineage-x", 99);
    let nested_arrays = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let nested_objects = format!("{}1{}", r#"{"a":"#.repeat(5_000), "}".repeat(5_000));
    let enc = |s: &str| form_encode(s);
    vec![
        // Path traversal and encoded variants.
        case("traversal", "GET", "/states/../../etc/passwd"),
        case("traversal in lock", "POST", "/locks/../../x.tfstate").body(lock()),
        case("encoded dots", "GET", "/states/%2e%2e/%2e%2e/etc/passwd"),
        case(
            "encoded dots and slash",
            "GET",
            "/states/%2E%2E%2Fetc%2Fpasswd",
        ),
        case("mixed encoding", "GET", "/states/net/..%2fprod.tfstate"),
        case("double encoding", "GET", "/states/%252e%252e/x.tfstate"),
        case("absolute", "GET", "/states//etc/passwd"),
        case("empty segment", "POST", "/states/net//prod.tfstate").body(good_state.clone()),
        case("trailing slash", "GET", "/states/net/prod.tfstate/"),
        case("backslash", "GET", "/states/..%5c..%5cwindows"),
        case("write through traversal", "POST", "/states/net/../../x").body(good_state.clone()),
        case("dot segment", "GET", "/states/net/./prod.tfstate"),
        // The repository's own files.
        case(".git", "GET", "/states/.git/config"),
        case(".git write", "POST", "/states/.git/HEAD").body(good_state.clone()),
        case("encoded .git", "GET", "/states/%2egit/config"),
        case("nested .git", "GET", "/states/a/.git/x"),
        case(".gitstate read", "GET", "/states/.gitstate/access.toml"),
        case(".gitstate write", "POST", "/states/.gitstate/access.toml").body(good_state.clone()),
        case(".gitstate lock", "POST", "/locks/.gitstate/access.toml").body(lock()),
        case(
            ".gitstate delete",
            "DELETE",
            "/states/.gitstate/access.toml",
        ),
        case(".gitattributes", "POST", "/states/.gitattributes").body(good_state.clone()),
        // Names that would inject into a ref.
        case("ref double dot", "POST", "/locks/a..b").body(lock()),
        case("reflog syntax", "POST", "/locks/a%40%7B1%7D").body(lock()),
        case("ancestry tilde", "POST", "/locks/a~1").body(lock()),
        case("caret", "POST", "/locks/a%5Ex").body(lock()),
        case("refspec colon", "POST", "/locks/a:refs/heads/main").body(lock()),
        case("space", "POST", "/locks/a%20b").body(lock()),
        case("glob", "POST", "/locks/a*b").body(lock()),
        case(
            "ref query traversal",
            "GET",
            format!("/states/{NAME}?ref=../main"),
        ),
        case(
            "ref option",
            "GET",
            format!("/states/{NAME}?ref=-upload-pack"),
        ),
        case(
            "ref double dot query",
            "POST",
            format!("/locks/{NAME}?ref=refs/heads/a..b"),
        )
        .body(lock()),
        case("ref NUL", "GET", format!("/states/{NAME}?ref=main%00x")),
        case(
            "ref colon",
            "POST",
            "/locks/y.tfstate?ref=HEAD:refs/heads/main",
        )
        .body(lock()),
        case("ref lock suffix", "POST", "/locks/y.tfstate?ref=main.lock").body(lock()),
        case("ref HEAD@", "GET", format!("/states/{NAME}?ref=%40")),
        // Names ending .lock.
        case(".lock name", "POST", "/locks/prod.lock").body(lock()),
        case(".lock nested", "GET", "/states/net/prod.lock"),
        case(".lock directory", "POST", "/states/a.lock/b.tfstate").body(good_state.clone()),
        case(
            "lock file of a state",
            "POST",
            format!("/states/{NAME}.lock"),
        )
        .body(good_state.clone()),
        // NUL and unicode tricks.
        case("NUL", "GET", "/states/a%00b"),
        case("NUL in lock", "POST", "/locks/a%00.tfstate").body(lock()),
        case("accented", "GET", "/states/%C3%A9.tfstate"),
        case("RTL override", "POST", "/locks/a%E2%80%AEb").body(lock()),
        case("fullwidth dots", "GET", "/states/%EF%BC%8E%EF%BC%8E/x"),
        case("overlong dot", "GET", "/states/a%C0%AEb"),
        case("invalid UTF-8", "GET", "/states/%FF%FE"),
        case("newline", "POST", "/locks/a%0Ab").body(lock()),
        case("truncated escape", "GET", "/states/a%2"),
        case("bad escape", "GET", "/states/a%zz"),
        case("zero-width space", "GET", "/states/x%E2%80%8B.tfstate"),
        case("long name", "GET", format!("/states/{}", "a".repeat(201))),
        // Oversize bodies.
        case(
            "oversize state",
            "POST",
            format!("/states/{NAME}?ID={HOLDER}"),
        )
        .body(vec![b' '; LIMIT + 1]),
        case(
            "oversize chunked state",
            "POST",
            format!("/states/{NAME}?ID={HOLDER}"),
        )
        .chunked(vec![b' '; LIMIT * 2]),
        case("oversize lock", "POST", "/locks/y.tfstate").body(vec![b' '; LIMIT + 1]),
        case("oversize chunked lock", "POST", "/locks/y.tfstate").chunked(vec![b'{'; LIMIT + 10]),
        // Invalid and deeply nested JSON.
        case("lock not JSON", "POST", "/locks/y.tfstate").body("not json"),
        case("lock truncated", "POST", "/locks/y.tfstate").body("{"),
        case("lock nested arrays", "POST", "/locks/y.tfstate").body(nested_arrays.clone()),
        case("lock nested objects", "POST", "/locks/y.tfstate").body(nested_objects.clone()),
        case("lock array", "POST", "/locks/y.tfstate").body("[]"),
        case("lock ID number", "POST", "/locks/y.tfstate").body(r#"{"ID":42}"#),
        case("lock ID empty", "POST", "/locks/y.tfstate").body(r#"{"ID":""}"#),
        case("lock no ID", "POST", "/locks/y.tfstate").body(r#"{"Who":"x"}"#),
        case("lock invalid UTF-8", "POST", "/locks/y.tfstate").body(b"{\"ID\":\"\xff\"}".to_vec()),
        case(
            "state not JSON",
            "POST",
            format!("/states/{NAME}?ID={HOLDER}"),
        )
        .body("not json"),
        case(
            "state truncated",
            "POST",
            format!("/states/{NAME}?ID={HOLDER}"),
        )
        .body(r#"{"version":4,"#),
        case(
            "state nested",
            "POST",
            format!("/states/{NAME}?ID={HOLDER}"),
        )
        .body(nested_arrays),
        case(
            "state nested objects",
            "POST",
            format!("/states/{NAME}?ID={HOLDER}"),
        )
        .body(nested_objects),
        case("state array", "POST", format!("/states/{NAME}?ID={HOLDER}")).body("[1,2]"),
        case("state string", "PUT", format!("/states/{NAME}?ID={HOLDER}")).body(r#""x""#),
        case("empty state", "POST", format!("/states/{NAME}?ID={HOLDER}")).body(""),
        // Wrong content types.
        case("lock text/plain", "POST", "/locks/y.tfstate")
            .content_type("text/plain")
            .body(lock()),
        case("state form", "POST", format!("/states/{NAME}?ID={HOLDER}"))
            .content_type("application/x-www-form-urlencoded")
            .body(good_state.clone()),
        case(
            "state multipart",
            "PUT",
            format!("/states/{NAME}?ID={HOLDER}"),
        )
        .content_type("multipart/form-data; boundary=x")
        .body(good_state.clone()),
        case("unlock xml", "DELETE", format!("/locks/{NAME}"))
            .content_type("application/xml")
            .body(lock_info(HOLDER)),
        // Malformed Authorization.
        case("no credentials", "POST", "/locks/y.tfstate")
            .authorization(None)
            .body(lock()),
        case("bearer", "POST", "/locks/y.tfstate")
            .authorization(Some(b"Bearer abc"))
            .body(lock()),
        case("basic without value", "GET", format!("/states/{NAME}")).authorization(Some(b"Basic")),
        case("basic not base64", "GET", format!("/states/{NAME}"))
            .authorization(Some(b"Basic !!!notbase64")),
        case("basic no colon", "GET", format!("/states/{NAME}"))
            .authorization(Some(&basic(b"nocolon"))),
        case("basic empty user", "GET", format!("/states/{NAME}"))
            .authorization(Some(&basic(b":password"))),
        case("basic empty password", "GET", format!("/states/{NAME}"))
            .authorization(Some(&basic(format!("{TEST_USER}:").as_bytes()))),
        case("basic invalid UTF-8", "GET", format!("/states/{NAME}"))
            .authorization(Some(&basic(b"\xff\xfe:\xfd"))),
        case("basic raw bytes", "GET", format!("/states/{NAME}"))
            .authorization(Some(b"Basic \xff\xfe")),
        case("basic huge", "GET", format!("/states/{NAME}"))
            .authorization(Some(format!("Basic {}", "A".repeat(10_000)).as_bytes())),
        case(
            "unknown user",
            "POST",
            format!("/states/{NAME}?ID={HOLDER}"),
        )
        .authorization(Some(&basic(b"mallory:guess")))
        .body(good_state.clone()),
        case("user with NUL", "POST", "/locks/y.tfstate")
            .authorization(Some(&basic(
                format!("{TEST_USER}\0:{TEST_PASSWORD}").as_bytes(),
            )))
            .body(lock()),
        case("password prefix", "DELETE", format!("/locks/{NAME}"))
            .authorization(Some(&basic(
                format!("eve:{}", &TEST_PASSWORD[..TEST_PASSWORD.len() - 1]).as_bytes(),
            )))
            .body(""),
        // Wrong and empty lock IDs.
        case(
            "write wrong ID",
            "POST",
            format!("/states/{NAME}?ID=not-the-holder"),
        )
        .body(good_state.clone()),
        case("write empty ID", "POST", format!("/states/{NAME}?ID=")).body(good_state.clone()),
        case("write without ID", "POST", format!("/states/{NAME}")).body(good_state.clone()),
        case(
            "write encoded ID",
            "POST",
            format!("/states/{NAME}?ID=real%2Dholder%2Did%00"),
        )
        .body(good_state.clone()),
        case("unlock wrong ID", "DELETE", format!("/locks/{NAME}")).body(lock_info("someone-else")),
        case("UNLOCK wrong ID", "UNLOCK", format!("/states/{NAME}")).body(lock_info("x")),
        // An empty ID (or no body) is a force-unlock, which only an administrator may do.
        as_writer(case("unlock empty ID", "DELETE", format!("/locks/{NAME}")).body(r#"{"ID":""}"#)),
        as_writer(case("unlock no body", "DELETE", format!("/locks/{NAME}"))),
        as_writer(case("UNLOCK blank body", "UNLOCK", format!("/states/{NAME}")).body(" \n")),
        as_writer(
            case(
                "writer wrong ID",
                "POST",
                format!("/states/{NAME}?ID=guess"),
            )
            .body(good_state.clone()),
        ),
        case("relock other ID", "LOCK", format!("/states/{NAME}")).body(lock()),
        case(
            "delete wrong ID",
            "DELETE",
            format!("/states/{NAME}?ID=nope"),
        ),
        case(
            "stale serial",
            "POST",
            format!("/states/{NAME}?ID={HOLDER}"),
        )
        .body(state_json("lineage-1", 1)),
        // Foreign repositories in the seed tool's address format.
        case(
            "seed foreign host",
            "GET",
            format!(
                "/?type=git&repository={}&ref=main&state=x.tfstate",
                enc("https://evil.example/x.git")
            ),
        ),
        case(
            "seed foreign lock",
            "LOCK",
            format!(
                "/?type=git&repository={}&ref=main&state=x.tfstate",
                enc("https://evil.example/x.git")
            ),
        )
        .body(lock()),
        case(
            "seed file URL",
            "GET",
            format!(
                "/?type=git&repository={}&state=x.tfstate",
                enc("file:///etc")
            ),
        ),
        case(
            "seed other repo on the same server",
            "POST",
            format!("/?type=git&repository={}&state=x.tfstate", enc(other)),
        )
        .body(good_state.clone()),
        case(
            "seed traversal off the repo",
            "GET",
            format!(
                "/?type=git&repository={}&state=x.tfstate",
                enc(&format!("{repo}/../other.git"))
            ),
        ),
        case(
            "seed ssh",
            "GET",
            format!(
                "/?type=git&repository={}&state=x.tfstate",
                enc("ssh://git@evil.example/x")
            ),
        ),
        case(
            "seed credentials in URL",
            "GET",
            format!(
                "/?type=git&repository={}&state=x.tfstate",
                enc(&repo.replacen("http://", "http://u:p@", 1))
            ),
        ),
        case(
            "seed type s3",
            "GET",
            "/?type=s3&repository=x&state=x.tfstate",
        ),
        case(
            "seed no state",
            "GET",
            format!("/?type=git&repository={}", enc(repo)),
        ),
        case("seed no repository", "GET", "/?type=git&state=x.tfstate"),
        case(
            "seed state traversal",
            "GET",
            format!("/?type=git&repository={}&state=../x", enc(repo)),
        ),
        case(
            "seed repository twice",
            "GET",
            format!(
                "/?type=git&repository={}&repository={}&state=x.tfstate",
                enc(repo),
                enc("https://evil.example/x.git")
            ),
        ),
        case(
            "repository on /states",
            "GET",
            format!("/states/x.tfstate?repository={}", enc(other)),
        ),
        // Huge query strings, odd routes and methods.
        case(
            "huge query",
            "GET",
            format!("/states/{NAME}?x={}", "a".repeat(5_000)),
        ),
        case(
            "many parameters",
            "GET",
            format!("/states/{NAME}?{}", "a=1&".repeat(500)),
        ),
        case(
            "ID twice",
            "POST",
            format!("/states/{NAME}?ID={HOLDER}&ID=x"),
        )
        .body(good_state),
        case("unknown route", "GET", "/admin"),
        case("PATCH", "PATCH", format!("/states/{NAME}")).body("{}"),
        case("PUT lock", "PUT", format!("/locks/{NAME}")).body(lock()),
    ]
}

fn form_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Send `case` as raw bytes and return the status and body of the answer.
async fn send_raw(address: &str, case: &Case) -> (u16, String) {
    let mut request = format!(
        "{} {} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n",
        case.method, case.target
    )
    .into_bytes();
    let valid = basic(format!("{TEST_USER}:{TEST_PASSWORD}").as_bytes());
    let authorization = match &case.authorization {
        None => Some(valid),
        Some(value) => value.clone(),
    };
    if let Some(value) = authorization {
        request.extend_from_slice(b"Authorization: ");
        request.extend_from_slice(&value);
        request.extend_from_slice(b"\r\n");
    }
    if let Some(content_type) = case.content_type {
        request.extend_from_slice(format!("Content-Type: {content_type}\r\n").as_bytes());
    }
    match &case.body {
        Body::None => request.extend_from_slice(b"Content-Length: 0\r\n\r\n"),
        Body::Bytes(bytes) => {
            request
                .extend_from_slice(format!("Content-Length: {}\r\n\r\n", bytes.len()).as_bytes());
            request.extend_from_slice(bytes);
        }
        Body::Chunked(bytes) => {
            request.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
            for chunk in bytes.chunks(8192) {
                request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                request.extend_from_slice(chunk);
                request.extend_from_slice(b"\r\n");
            }
            request.extend_from_slice(b"0\r\n\r\n");
        }
    }
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect to the backend");
    // The server may answer (413) and close before reading a large body: ignore write errors.
    let _ = stream.write_all(&request).await;
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    parse_response(&response)
}

fn parse_response(raw: &[u8]) -> (u16, String) {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(raw.len());
    let head = String::from_utf8_lossy(&raw[..end]);
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut body = raw.get(end + 4..).unwrap_or_default().to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&raw[..line_end]).trim(), 16)
            .unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = line_end + 2;
        out.extend_from_slice(&raw[start..(start + size).min(raw.len())]);
        raw = raw.get(start + size + 2..).unwrap_or_default();
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_corpus_is_refused_with_reasons_and_leaves_refs_untouched() {
    capture_logs();
    let server = GitServer::start().await;
    let url = server.create_repo("target");
    let other = server.create_repo("other");
    let limit = LIMIT.to_string();
    let access = gitstate_tests::access_file(&[
        (TEST_USER, TEST_PASSWORD, &["admin:*"]),
        (WRITER, WRITER_PASSWORD, &["write:*"]),
    ]);
    let backend = TestBackend::start(
        &url,
        &[
            ("GITSTATE_MAX_BODY_BYTES", limit.as_str()),
            ("GITSTATE_ACCESS", access.as_str()),
        ],
    )
    .await;
    let client = Client::new(&backend.url);

    // GIVEN a state at serial 5, locked by HOLDER.
    assert_eq!(client.lock(NAME, HOLDER).await.status, 200);
    let stored = format!(
        r#"{{"version":4,"serial":5,"lineage":"lineage-1","outputs":{{"db_password":{{"value":"{STATE_SECRET}","type":"string","sensitive":true}}}},"resources":[]}}"#
    );
    let path = format!("/states/{NAME}?ID={HOLDER}");
    assert_eq!(client.send("POST", &path, Some(&stored)).await.status, 200);
    let ls_remote = |repo: &str| git(&["ls-remote", &server.url_with_credentials(repo)], None);
    let (before, other_before) = (ls_remote("target"), ls_remote("other"));
    assert!(
        before.contains(&format!("refs/heads/locks/{NAME}")),
        "{before}"
    );

    // WHEN the corpus is sent.
    let address = backend.url.trim_start_matches("http://").to_owned();
    let cases = corpus(&url, &other);
    assert!(cases.len() >= 60, "corpus has {} requests", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let (status, body) = send_raw(&address, case).await;
        // THEN every answer is a 4xx with a reason in its body.
        if !(400..500).contains(&status) || body.trim().is_empty() {
            failures.push(format!(
                "{} ({} {}): {status} {:?}",
                case.label,
                case.method,
                case.target.chars().take(80).collect::<String>(),
                body.chars().take(120).collect::<String>()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} hostile requests were not a 4xx with a reason:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );

    // AND the remotes' refs are byte-identical, the state and its lock unchanged.
    assert_eq!(ls_remote("target"), before, "refs of the target changed");
    assert_eq!(
        ls_remote("other"),
        other_before,
        "refs of the other repository changed"
    );
    let got = client.send("GET", &format!("/states/{NAME}"), None).await;
    assert_eq!((got.status, got.body.as_str()), (200, stored.as_str()));
    let lock = client.send("GET", &format!("/locks/{NAME}"), None).await;
    assert_eq!(lock.status, 200);
    assert!(lock.body.contains(HOLDER), "{}", lock.body);
    // AND no secret reached the logs (trace level, every crate).
    let logs = captured_logs();
    assert!(
        logs.contains("unauthenticated request"),
        "logs were captured"
    );
    for secret in [GIT_TOKEN, TEST_PASSWORD, WRITER_PASSWORD, STATE_SECRET] {
        assert!(
            !logs.contains(secret),
            "a secret ({}…) was logged",
            &secret[..3]
        );
    }
    eprintln!(
        "hostile corpus: {} requests, all 4xx with a reason, refs unchanged",
        cases.len()
    );
}
