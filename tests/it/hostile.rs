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
    client.lock(NAME, HOLDER).await.expect(200);
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
    let lock = client.get_lock(NAME).await.expect(200);
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

/// One request of the integrity corpus: who sends it, and the status it must get.
struct Probe {
    label: String,
    method: &'static str,
    path: String,
    user: (&'static str, &'static str),
    body: Option<String>,
    content_md5: Option<String>,
    want: u16,
    /// Text the answer must contain (the state or lock in the way, the refused ref, the holder).
    names: &'static str,
}

fn probe(
    label: impl Into<String>,
    method: &'static str,
    path: impl Into<String>,
    user: (&'static str, &'static str),
    body: Option<String>,
    want: u16,
    names: &'static str,
) -> Probe {
    Probe {
        label: label.into(),
        method,
        path: path.into(),
        user,
        body,
        content_md5: None,
        want,
        names,
    }
}

/// Every ref of a bare repository and the whole tree of each: what a refused request must leave
/// byte-identical.
fn snapshot(dir: &std::path::Path) -> String {
    let refs = git(
        &["for-each-ref", "--format=%(objectname) %(refname)"],
        Some(dir),
    );
    let mut out = refs.clone();
    for line in refs.lines() {
        let (_, name) = line.split_once(' ').expect("ref line");
        out.push_str(&format!("== {name}\n"));
        out.push_str(&git(&["ls-tree", "-r", "--full-tree", name], Some(dir)));
    }
    out
}

fn md5_base64(body: &[u8]) -> String {
    use md5::Digest;
    base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(body))
}

async fn send_probe(base: &str, probe: &Probe) -> (u16, String) {
    let method = reqwest::Method::from_bytes(probe.method.as_bytes()).expect("method");
    let mut request = reqwest::Client::new()
        .request(method, format!("{base}{}", probe.path))
        .basic_auth(probe.user.0, Some(probe.user.1));
    if let Some(body) = &probe.body {
        request = request
            .header("content-type", "application/json")
            .body(body.clone());
    }
    if let Some(md5) = &probe.content_md5 {
        request = request.header("Content-Md5", md5.as_str());
    }
    let response = request.send().await.expect("backend answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// Send every probe; each must get its status with a one-line reason naming what is in the way,
/// and leave every ref and every tree of the repository at `dir` byte-identical. A refused ref
/// (403) must not even reach the git server.
/// `server` is `None` for the embedded repository (no git requests to count).
async fn run_probes(
    server: Option<&GitServer>,
    base: &str,
    dir: &std::path::Path,
    probes: &[Probe],
) {
    let mut failures = Vec::new();
    for probe in probes {
        let before = snapshot(dir);
        if let Some(server) = server {
            server.take_requests();
        }
        let (status, body) = send_probe(base, probe).await;
        let git_requests = server.map(GitServer::take_labels).unwrap_or_default();
        let after = snapshot(dir);
        let reason_ok = body.contains(probe.names) && body.trim().lines().count() == 1;
        let quiet = probe.want != 403 || git_requests.is_empty();
        if status != probe.want || !reason_ok || before != after || !quiet {
            failures.push(format!(
                "{} ({} {}): {status} (want {}) {:?}{}{}",
                probe.label,
                probe.method,
                probe.path,
                probe.want,
                body.trim(),
                if quiet {
                    String::new()
                } else {
                    format!(" after git requests {git_requests:?}")
                },
                if before == after {
                    String::new()
                } else {
                    format!("\n  the repository changed:\n{before}\n  ->\n{after}")
                }
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} probes failed:\n{}",
        failures.len(),
        probes.len(),
        failures.join("\n")
    );
}

const OTHER: (&str, &str) = ("other-writer", "other-Pa55word-writes-all");
const SCRATCH: (&str, &str) = ("scratch", "scratch-Pa55word-scratch-only");
const TEAM: (&str, &str) = ("team", "team-Pa55word-team-only");
const ADMIN: (&str, &str) = (TEST_USER, TEST_PASSWORD);
const WRITES_ALL: (&str, &str) = (WRITER, WRITER_PASSWORD);

fn integrity_access() -> String {
    gitstate_tests::access_file(&[
        (ADMIN.0, ADMIN.1, &["admin:*"]),
        (WRITES_ALL.0, WRITES_ALL.1, &["write:*"]),
        (OTHER.0, OTHER.1, &["write:*"]),
        (SCRATCH.0, SCRATCH.1, &["write:scratch/"]),
        (TEAM.0, TEAM.1, &["write:team/"]),
    ])
}

async fn ok(client: &Client, method: &str, path: &str, body: Option<&str>) {
    let answer = client.send(method, path, body).await;
    assert_eq!(answer.status, 200, "{method} {path}: {}", answer.body);
}

/// Issue 12 (1, 2, 3, 6) and every variant of the rules, generated as operations × shapes: refs
/// outside the allowlist or clashing with the lock refs or the branch (403), names below a state
/// or naming a folder of states for write, lock, unlock, delete and restore (409), lock refs that
/// clash (409), the holder's lock ID from another user (423), a wrong Content-MD5 (400). Each
/// leaves the remote's refs and trees byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integrity_rules_refuse_and_leave_the_remote_byte_identical() {
    let server = GitServer::start().await;
    let url = server.create_repo("integrity");
    let access = integrity_access();
    let backend = TestBackend::start(
        &url,
        &[
            ("GITSTATE_ACCESS", access.as_str()),
            ("GITSTATE_ALLOWED_REFS", "env/*"),
            // The allowlisted branches here are made by their first write.
            ("GITSTATE_CREATE_REF", "true"),
        ],
    )
    .await;
    let admin = Client::new(&backend.url);
    let writer = Client::with_credentials(&backend.url, Some(WRITES_ALL));

    // GIVEN net/prod.tfstate locked by the writer, a state `a`, two states in team/app/ (one
    // locked by the writer) and a lock on x/y.tfstate.
    writer.lock(NAME, HOLDER).await.expect(200);
    let net_path = format!("/states/{NAME}?ID={HOLDER}");
    ok(&writer, "POST", &net_path, Some(&state_json("l", 5))).await;
    ok(&admin, "POST", "/states/a", Some(&state_json("a", 1))).await;
    ok(
        &admin,
        "POST",
        "/states/team/app/dns.tfstate",
        Some(&state_json("d", 1)),
    )
    .await;
    writer
        .lock("team/app/prod.tfstate", "team-holder")
        .await
        .expect(200);
    let team_path = "/states/team/app/prod.tfstate?ID=team-holder";
    ok(&writer, "POST", team_path, Some(&state_json("p", 1))).await;
    writer.lock("x/y.tfstate", "xy-holder").await.expect(200);
    // and a lock on `scratch`, outside the grant `write:scratch/` of the user who meets it
    writer.lock("scratch", "scratch-holder").await.expect(200);

    let mut probes = Vec::new();
    let state = || Some(state_json("new", 1));
    let lock = || Some(lock_info("intruder"));
    // Refs: every route × refs under, above or beside the lock refs, below the branch, or not
    // allowlisted.
    for r in [
        "locks",
        "locks/x",
        "locks/network/prod.tfstate",
        "refs/heads/locks/a",
        "main/x",
        "dev",
        "env",
        "refs/locks/x",
    ] {
        let s = "scratch/x.tfstate";
        for (method, path, user, body) in [
            ("POST", format!("/states/{s}?ref={r}"), SCRATCH, state()),
            ("PUT", format!("/states/{s}?ref={r}"), SCRATCH, state()),
            ("GET", format!("/states/{s}?ref={r}"), SCRATCH, None),
            ("POST", format!("/locks/{s}?ref={r}"), SCRATCH, lock()),
            ("LOCK", format!("/states/{s}?ref={r}"), SCRATCH, lock()),
            ("DELETE", format!("/locks/{s}?ref={r}"), SCRATCH, lock()),
            ("GET", format!("/locks/{s}?ref={r}"), SCRATCH, None),
            ("DELETE", format!("/states/{s}?ref={r}"), ADMIN, None),
            ("GET", format!("/history/{s}?ref={r}"), SCRATCH, None),
            (
                "POST",
                format!("/history/{s}?restore=1&ref={r}"),
                ADMIN,
                None,
            ),
            ("GET", format!("/locks?ref={r}"), SCRATCH, None),
            (
                "POST",
                format!(
                    "/?type=git&repository={}&ref={r}&state={s}",
                    form_encode(&url)
                ),
                SCRATCH,
                state(),
            ),
        ] {
            probes.push(probe(
                format!("ref {r}"),
                method,
                path,
                user,
                body,
                403,
                "is not allowed",
            ));
        }
    }
    // Tree: names below a state, and folders of states × every operation that changes anything.
    for (name, in_the_way) in [
        ("a/b.tfstate", "\"a\""),
        ("a/b/c.tfstate", "\"a\""),
        ("net/prod.tfstate/x", NAME),
        ("team/app", "team/app/"),
        ("team", "team/app/"),
    ] {
        let writer = if name.starts_with("team/") {
            TEAM
        } else {
            WRITES_ALL
        };
        for (method, path, user, body) in [
            ("POST", format!("/states/{name}"), writer, state()),
            (
                "PUT",
                format!("/states/{name}?ID=intruder"),
                writer,
                state(),
            ),
            ("POST", format!("/locks/{name}"), writer, lock()),
            ("LOCK", format!("/states/{name}"), writer, lock()),
            ("DELETE", format!("/locks/{name}"), writer, lock()),
            ("UNLOCK", format!("/locks/{name}"), ADMIN, None),
            ("DELETE", format!("/states/{name}"), ADMIN, None),
            ("POST", format!("/history/{name}?restore=1"), ADMIN, None),
        ] {
            probes.push(probe(
                format!("tree {name}"),
                method,
                path,
                user,
                body,
                409,
                in_the_way,
            ));
        }
    }
    // Lock refs that clash with a held lock (no state in the way).
    for name in ["x", "x/y.tfstate/z"] {
        for (method, path) in [
            ("POST", format!("/locks/{name}")),
            ("LOCK", format!("/states/{name}")),
        ] {
            probes.push(probe(
                "lock ref clash",
                method,
                path,
                WRITES_ALL,
                lock(),
                409,
                "x/y.tfstate",
            ));
        }
    }
    // A clash with a state the caller may not read does not name it.
    for (method, path) in [
        ("POST", "/locks/scratch/x.tfstate"),
        ("LOCK", "/states/scratch/x.tfstate"),
    ] {
        probes.push(probe(
            "clash outside the grant",
            method,
            path.to_owned(),
            SCRATCH,
            lock(),
            409,
            "it clashes with a state you cannot read",
        ));
    }
    // The holder's ID from anyone else, administrators included.
    for user in [ADMIN, OTHER] {
        probes.push(probe(
            "holder's ID, LOCK",
            "POST",
            format!("/locks/{NAME}"),
            user,
            Some(lock_info(HOLDER)),
            423,
            HOLDER,
        ));
        probes.push(probe(
            "holder's ID, write",
            "POST",
            net_path.clone(),
            user,
            Some(state_json("l", 6)),
            423,
            HOLDER,
        ));
    }
    probes.push(probe(
        "holder's ID, delete",
        "DELETE",
        format!("/states/{NAME}?ID={HOLDER}"),
        ADMIN,
        None,
        423,
        HOLDER,
    ));
    // Content-MD5 that is wrong or malformed, on a write and on a lock.
    for (label, md5) in [
        ("MD5 of another body", md5_base64(b"{}")),
        ("MD5 of nothing", "1B2M2Y8AsgTpgAmY7PhCfg==".to_owned()),
        ("not base64", "not base64!".to_owned()),
        ("short digest", md5_base64(b"x")[..12].to_owned()),
        ("hex digest", "d41d8cd98f00b204e9800998ecf8427e".to_owned()),
    ] {
        let mut write = probe(
            label,
            "POST",
            net_path.clone(),
            WRITES_ALL,
            Some(state_json("l", 6)),
            400,
            "Content-MD5",
        );
        write.content_md5 = Some(md5.clone());
        probes.push(write);
        let mut lock = probe(
            label,
            "POST",
            "/locks/fresh.tfstate",
            WRITES_ALL,
            Some(lock_info("f")),
            400,
            "Content-MD5",
        );
        lock.content_md5 = Some(md5);
        probes.push(lock);
    }
    let dir = server.repo_dir("integrity");
    run_probes(Some(&server), &backend.url, &dir, &probes).await;

    // AND what the rules allow still works: the holder with the right Content-MD5, Terraform's
    // retry of its own LOCK, an allowlisted branch, a lock once the clashing one is gone.
    let body = state_json("l", 6);
    let mut write = probe(
        "holder",
        "POST",
        net_path.clone(),
        WRITES_ALL,
        Some(body.clone()),
        200,
        "",
    );
    write.content_md5 = Some(md5_base64(body.as_bytes()));
    assert_eq!(send_probe(&backend.url, &write).await.0, 200);
    writer.lock(NAME, HOLDER).await.expect(200);
    ok(
        &admin,
        "POST",
        "/states/e.tfstate?ref=env/dev",
        Some(&state_json("e", 1)),
    )
    .await;
    assert!(snapshot(&dir).contains("refs/heads/env/dev\n"));
    ok(&admin, "DELETE", "/locks/x/y.tfstate", None).await;
    writer.lock("x", "x-holder").await.expect(200);
    // A lock that exists can always be released, even once a state lies in its way.
    writer.lock("c/d.tfstate", "cd").await.expect(200);
    ok(&admin, "POST", "/states/c", Some(&state_json("c", 1))).await;
    writer.unlock("c/d.tfstate", "cd").await.expect(200);
    assert!(!snapshot(&dir).contains("refs/heads/locks/c/d.tfstate"));
    eprintln!(
        "integrity corpus: {} probes refused, repository unchanged",
        probes.len()
    );
}

/// With lock refs outside refs/heads/ (`refs/locks/`), branches named like locks may be
/// allowlisted, refs there still cannot be addressed, and lock and tree clashes are still 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integrity_rules_hold_with_lock_refs_outside_the_branches() {
    let server = GitServer::start().await;
    let url = server.create_repo("elsewhere");
    let access = integrity_access();
    let backend = TestBackend::start(
        &url,
        &[
            ("GITSTATE_ACCESS", access.as_str()),
            ("GITSTATE_LOCK_REF_PREFIX", "refs/locks/"),
            ("GITSTATE_ALLOWED_REFS", "locks/*"),
            ("GITSTATE_CREATE_REF", "true"),
        ],
    )
    .await;
    let admin = Client::new(&backend.url);
    ok(&admin, "POST", "/states/a", Some(&state_json("a", 1))).await;
    admin.lock("x/y.tfstate", "xy").await.expect(200);
    let mut probes = Vec::new();
    for r in ["refs/locks/x", "refs/locks/x/y.tfstate", "main/x", "locks"] {
        probes.push(probe(
            format!("ref {r}"),
            "POST",
            format!("/states/s.tfstate?ref={r}"),
            ADMIN,
            Some(state_json("s", 1)),
            403,
            "is not allowed",
        ));
    }
    for name in ["x", "x/y.tfstate/z"] {
        probes.push(probe(
            "lock ref clash",
            "POST",
            format!("/locks/{name}"),
            ADMIN,
            Some(lock_info("i")),
            409,
            "x/y.tfstate",
        ));
    }
    for (method, path) in [
        ("POST", "/states/a/b.tfstate"),
        ("POST", "/locks/a/b.tfstate"),
    ] {
        probes.push(probe(
            "below a",
            method,
            path,
            ADMIN,
            // A state to the state's address (a LockInfo there is a 400 of its own).
            Some(if path.starts_with("/states/") {
                state_json("b", 1)
            } else {
                lock_info("i")
            }),
            409,
            "\"a\"",
        ));
    }
    let dir = server.repo_dir("elsewhere");
    run_probes(Some(&server), &backend.url, &dir, &probes).await;
    ok(
        &admin,
        "POST",
        "/states/s.tfstate?ref=locks/x",
        Some(&state_json("s", 1)),
    )
    .await;
    admin.lock("s.tfstate", "s").await.expect(200);
    let refs = snapshot(&dir);
    assert!(
        refs.contains("refs/heads/locks/x\n") && refs.contains("refs/locks/s.tfstate\n"),
        "{refs}"
    );
}

/// A git server with one repository that holds `s.tfstate`, a backend on it, an admin client,
/// and the bare repository's directory (for hooks and checks); the server and backend live as
/// long as the value.
struct Seeded {
    server: GitServer,
    backend: TestBackend,
    admin: Client,
    dir: std::path::PathBuf,
}

async fn seeded(repo: &str, extra: &[(&str, &str)]) -> Seeded {
    let server = GitServer::start().await;
    let url = server.create_repo(repo);
    let backend = TestBackend::start(&url, extra).await;
    let admin = Client::new(&backend.url);
    ok(
        &admin,
        "POST",
        "/states/s.tfstate",
        Some(&state_json("s", 1)),
    )
    .await;
    let dir = server.repo_dir(repo);
    Seeded {
        server,
        backend,
        admin,
        dir,
    }
}

/// Issue 12 (3), the race: a lock ref that clashes appears between the LOCK's look at the refs and
/// its push. git http-backend refuses the push (`ng refs/heads/locks/race failed to update ref`;
/// the reason, "'…/race/b.tfstate' exists; cannot create '…/race'", goes to stderr only): the answer
/// is 409 naming the other lock, from a fresh look at the refs, never a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_ref_clash_created_during_the_push_is_409_not_502() {
    let Seeded {
        server: _server,
        backend: _backend,
        admin,
        dir,
    } = seeded("race", &[]).await;
    // The next push runs a hook that creates the clashing lock ref first.
    race_next_push(
        &dir,
        "git update-ref refs/heads/locks/race/b.tfstate $(git rev-parse refs/heads/main)",
    );

    let answer = admin.lock("race", "r").await.expect(409);
    assert!(answer.body.contains("race/b.tfstate"), "{}", answer.body);
    assert!(dir.join("raced").exists(), "the hook ran");
    let refs = snapshot(&dir);
    assert!(refs.contains("refs/heads/locks/race/b.tfstate\n"), "{refs}");
    assert!(!refs.contains("refs/heads/locks/race\n"), "{refs}");
}

/// Install a pre-receive hook in `dir` that runs `script` (with the repository's own object store,
/// outside the push's quarantine, as another client's push would) before the next push only.
fn race_next_push(dir: &std::path::Path, script: &str) {
    let hook = dir.join("hooks/pre-receive");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\ncat >/dev/null\n[ -e raced ] && exit 0\ntouch raced\n\
             unset GIT_QUARANTINE_PATH GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES\n{script}\n"
        ),
    )
    .expect("hook");
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
}

/// The tree rule holds against a concurrent writer: a state `w` committed by someone else between
/// the write's check of the tree and its push makes the push lose its compare-and-swap, and the
/// retry, built on the new tree, refuses `w/x.tfstate` with 409 instead of replacing `w`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_in_the_way_committed_during_a_write_is_409() {
    let Seeded {
        server: _server,
        backend: _backend,
        admin,
        dir,
    } = seeded("treerace", &[]).await;
    race_next_push(
        &dir,
        "tip=$(git rev-parse refs/heads/main)\n\
         blob=$(printf '{\"serial\":1}' | git hash-object -w --stdin)\n\
         tree=$( (git ls-tree \"$tip\"; printf '100644 blob %s\\tw\\n' \"$blob\") | git mktree)\n\
         export GIT_AUTHOR_NAME=other GIT_AUTHOR_EMAIL=other@example.invalid\n\
         export GIT_COMMITTER_NAME=other GIT_COMMITTER_EMAIL=other@example.invalid\n\
         commit=$(git commit-tree \"$tree\" -p \"$tip\" -m 'write w')\n\
         git update-ref refs/heads/main \"$commit\" \"$tip\"",
    );
    let answer = admin
        .write("w/x.tfstate", &state_json("x", 1))
        .await
        .expect(409);
    assert!(answer.body.contains("\"w\""), "{}", answer.body);
    assert!(dir.join("raced").exists(), "the hook ran");
    let tree = git(&["ls-tree", "-r", "--name-only", "main"], Some(&dir));
    assert_eq!(
        tree.lines().collect::<Vec<_>>(),
        [".gitstate/index.json", "s.tfstate", "w"],
        "{tree}"
    );
}

/// What the tree check costs a write that loses a race: nothing. Another writer's commit lands
/// between the write's look and its push (a pre-receive hook); the retry reads the new tip's tree
/// from the cache the fetch of that tip filled, so the write takes exactly main's requests: one
/// advertisement and one push per attempt, and one fetch for the moved tip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_retry_costs_no_request_for_the_tree_check() {
    let Seeded {
        server,
        backend: _backend,
        admin,
        dir,
    } = seeded("retry", &[]).await;
    race_next_push(
        &dir,
        "tip=$(git rev-parse refs/heads/main)\n\
         blob=$(printf '{\"serial\":1}' | git hash-object -w --stdin)\n\
         tree=$( (git ls-tree \"$tip\"; printf '100644 blob %s\\tother.tfstate\\n' \"$blob\") | git mktree)\n\
         export GIT_AUTHOR_NAME=other GIT_AUTHOR_EMAIL=other@example.invalid\n\
         export GIT_COMMITTER_NAME=other GIT_COMMITTER_EMAIL=other@example.invalid\n\
         commit=$(git commit-tree \"$tree\" -p \"$tip\" -m 'write other')\n\
         git update-ref refs/heads/main \"$commit\" \"$tip\"",
    );
    server.take_requests();
    ok(
        &admin,
        "POST",
        "/states/team/x.tfstate",
        Some(&state_json("x", 1)),
    )
    .await;
    assert!(dir.join("raced").exists(), "the hook ran");
    assert_eq!(
        server.take_labels(),
        [
            "GET refs/receive-pack",
            "POST receive-pack",
            "GET refs/receive-pack",
            // (what a fetch may ask for, asked once per process, came with the branch check of
            // the process's first write, before this one)
            "POST upload-pack",
            "POST receive-pack"
        ]
    );
    let tree = git(&["ls-tree", "-r", "--name-only", "main"], Some(&dir));
    assert_eq!(
        tree.lines().collect::<Vec<_>>(),
        [
            ".gitstate/index.json",
            "other.tfstate",
            "s.tfstate",
            "team/x.tfstate"
        ],
        "{tree}"
    );
}

/// What the LOCK's tree check costs in git requests: nothing when the branch tip is cached (the
/// LOCK at the floor, one push: the first LOCK's push asserted the tip it checked), one shallow
/// fetch when it is not (3, plus the upload-pack advertisement that tells a process once what a
/// fetch may ask for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_requests_with_the_tree_check() {
    let server = GitServer::start().await;
    let url = server.create_repo("count");
    let writer = TestBackend::start(&url, &[]).await;
    ok(
        &Client::new(&writer.url),
        "POST",
        "/states/s.tfstate",
        Some(&state_json("s", 1)),
    )
    .await;
    let fresh = TestBackend::start(&url, &[]).await;
    let client = Client::new(&fresh.url);
    server.take_requests();
    client.lock("a.tfstate", "1").await.expect(200);
    let cold = server.take_labels();
    assert_eq!(
        cold,
        [
            "GET refs/receive-pack",
            "GET refs/upload-pack",
            "POST upload-pack",
            "POST receive-pack",
            // the repository's first LOCK also records the lock ref prefix, once
            "POST receive-pack"
        ]
    );
    client.lock("b.tfstate", "2").await.expect(200);
    let warm = server.take_labels();
    assert_eq!(warm, ["POST receive-pack"]);
    eprintln!(
        "LOCK: cold cache {} requests, warm {}",
        cold.len(),
        warm.len()
    );
}

/// A backend over the embedded repository `<dir>/repo.git` (created on first use).
async fn embedded_backend(dir: &std::path::Path, extra: &[(&str, &str)]) -> TestBackend {
    let mut vars = std::collections::HashMap::from([
        (
            "GITSTATE_LOCAL_REPOSITORY".to_owned(),
            dir.join("repo.git").display().to_string(),
        ),
        (
            "GITSTATE_CACHE_DIR".to_owned(),
            dir.join("cache").display().to_string(),
        ),
        (
            gitstate_tests::UNLOCKED_WRITES.to_owned(),
            "true".to_owned(),
        ),
    ]);
    for (key, value) in extra {
        vars.insert((*key).to_owned(), (*value).to_owned());
    }
    let settings =
        gitstate_app::Settings::from_lookup(gitstate_app::Runtime::Local, |k| vars.get(k).cloned())
            .expect("settings");
    TestBackend::serve(
        gitstate_tests::app(&settings).await,
        tempfile::tempdir().expect("tempdir"),
    )
    .await
}

/// Two allowlisted branches that clash (`env/a` and `env/a/b` with `env/*` allowed): a write that
/// would create the second is 409 naming the existing one, decided before any push, against git
/// http-backend and the embedded repository alike. Generated as shapes (child, grandchild,
/// parent of an existing branch) × every request that creates a branch; each leaves every ref
/// and tree byte-identical. A branch beside them is still created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_that_clashes_with_an_existing_branch_is_409() {
    let access = integrity_access();
    let extra = [
        ("GITSTATE_ACCESS", access.as_str()),
        ("GITSTATE_ALLOWED_REFS", "env/*"),
        // The allowlisted branches here are made by their first write.
        ("GITSTATE_CREATE_REF", "true"),
    ];
    let server = GitServer::start().await;
    let url = server.create_repo("branches");
    let hosted = TestBackend::start(&url, &extra).await;
    let local = tempfile::tempdir().expect("tempdir");
    let embedded = embedded_backend(local.path(), &extra).await;
    let local_repo = local.path().join("repo.git");
    let local_id = std::fs::canonicalize(&local_repo)
        .expect("embedded repository")
        .display()
        .to_string();
    for (backend, dir, server, repository) in [
        (
            &hosted,
            server.repo_dir("branches"),
            Some(&server),
            url.clone(),
        ),
        (&embedded, local_repo, None, local_id),
    ] {
        let admin = Client::new(&backend.url);
        for existing in ["env/a", "env/c/d"] {
            let path = format!("/states/s.tfstate?ref={existing}");
            ok(&admin, "POST", &path, Some(&state_json("s", 1))).await;
        }
        let mut probes = Vec::new();
        for (branch, in_the_way) in [
            ("env/a/b", "existing branch \"env/a\""),
            ("env/a/b/c", "existing branch \"env/a\""),
            ("env/c", "existing branch \"env/c/d\""),
        ] {
            for (method, path) in [
                ("POST", format!("/states/n.tfstate?ref={branch}")),
                ("PUT", format!("/states/n/m.tfstate?ref={branch}")),
                (
                    "POST",
                    format!(
                        "/?type=git&repository={}&ref={branch}&state=n.tfstate",
                        form_encode(&repository)
                    ),
                ),
            ] {
                probes.push(probe(
                    format!("branch {branch}"),
                    method,
                    path,
                    ADMIN,
                    Some(state_json("n", 1)),
                    409,
                    in_the_way,
                ));
            }
        }
        run_probes(server, &backend.url, &dir, &probes).await;
        ok(
            &admin,
            "POST",
            "/states/n.tfstate?ref=env/e",
            Some(&state_json("n", 1)),
        )
        .await;
        let refs = snapshot(&dir);
        assert!(refs.contains("refs/heads/env/e\n"), "{refs}");
    }
}

/// The race: a branch that clashes is created by someone else between the write's look at the
/// refs and its push (a pre-receive hook). git http-backend refuses the push; the retry looks at
/// the refs again and answers 409 naming that branch, never a 502, and nothing of the write
/// lands. Both shapes: the new branch below the one created meanwhile, and above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_clash_created_during_the_push_is_409_not_502() {
    for (creating, racing) in [("env/r", "env/r/x"), ("env/q/x", "env/q")] {
        let Seeded {
            server: _server,
            backend: _backend,
            admin,
            dir,
        } = seeded(
            "race",
            &[
                ("GITSTATE_ALLOWED_REFS", "env/*"),
                ("GITSTATE_CREATE_REF", "true"),
            ],
        )
        .await;
        race_next_push(
            &dir,
            &format!("git update-ref refs/heads/{racing} $(git rev-parse refs/heads/main)"),
        );
        let answer = admin
            .send(
                "POST",
                &format!("/states/n.tfstate?ref={creating}"),
                Some(&state_json("n", 1)),
            )
            .await;
        assert_eq!(answer.status, 409, "{creating}: {}", answer.body);
        assert!(
            answer
                .body
                .contains(&format!("existing branch \"{racing}\"")),
            "{}",
            answer.body
        );
        assert!(dir.join("raced").exists(), "the hook ran");
        let refs = snapshot(&dir);
        assert!(refs.contains(&format!("refs/heads/{racing}\n")), "{refs}");
        assert!(
            !refs.contains(&format!("refs/heads/{creating}\n")),
            "{refs}"
        );
        assert!(!refs.contains("n.tfstate"), "{refs}");
    }
}

/// A writer with a narrow grant (`write:team/`) sends a LOCK whose LockInfo carries a megabyte
/// (Terraform's is a few hundred bytes). The lock commit would hold it byte for byte, and every
/// list of every user (`GET /states`, `GET /locks`, the console) fetches every lock commit
/// whatever the caller may read: some such locks would make each cold process's list fetch
/// them all, past the git answer cap (a 502 for everyone). The LOCK is refused (400 naming the
/// limit, nothing pushed), and a cold administrator's list fetches a few kilobytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_lock_info_is_refused_and_lists_stay_small() {
    use rand::{Rng, SeedableRng};
    let server = GitServer::start().await;
    let url = server.create_repo("big-locks");
    let access = integrity_access();
    let extra = [("GITSTATE_ACCESS", access.as_str())];
    let backend = TestBackend::start(&url, &extra).await;
    let team = Client::with_credentials(&backend.url, Some(TEAM));
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x10c4);
    let noise: String = (0..1 << 20)
        .map(|_| char::from(b"0123456789abcdef"[rng.random_range(0..16)]))
        .collect();
    let body = serde_json::json!({
        "ID": "big-1", "Operation": "OperationTypeApply", "Info": noise,
        "Who": "team@host", "Version": "1.11.4", "Created": "2026-12-07T00:00:00Z", "Path": "",
    })
    .to_string();
    let dir = server.repo_dir("big-locks");
    let before = snapshot(&dir);
    let answer = team
        .send("LOCK", "/states/team/x.tfstate", Some(&body))
        .await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(answer.body.contains("lock info"), "{}", answer.body);
    assert_eq!(snapshot(&dir), before, "a refused LOCK pushes nothing");
    // Terraform's own LockInfo still locks.
    team.lock("team/x.tfstate", "small-1").await.expect(200);

    let cold = TestBackend::start(&url, &extra).await;
    server.take_requests();
    Client::new(&cold.url)
        .send("GET", "/states", None)
        .await
        .expect(200);
    let fetched: u64 = server.take_requests().iter().map(|seen| seen.bytes).sum();
    assert!(
        fetched < 64 * 1024,
        "a cold list fetched {fetched} bytes from the remote"
    );
}
