//! `gitstate serve` as a user runs it: the binary, the embedded default, the printed block.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

use gitstate_core::password::PasswordVerifier as _;

fn request(
    address: &str,
    authorization: &str,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("connect");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nAuthorization: {authorization}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read");
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// `gitstate serve` on the embedded default in `dir`, and what it printed up to the backend block.
fn start_serve(
    dir: &std::path::Path,
    env: &[(&str, &str)],
) -> (std::process::Child, String, String) {
    let port = gitstate_tests::free_port();
    let address = format!("127.0.0.1:{port}");
    let mut child = Command::new(crate::GITSTATE)
        .arg("serve")
        .current_dir(dir)
        .env_remove("GITSTATE_REPOSITORY")
        .env("GITSTATE_LISTEN", &address)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("gitstate serve starts");
    let mut printed = String::new();
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    for line in lines.by_ref() {
        let line = line.expect("line");
        printed.push_str(&line);
        printed.push('\n');
        if line == "}" {
            break;
        }
    }
    (child, address, printed)
}

#[test]
fn serve_prints_the_backend_block_and_serves_the_embedded_repository() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, address, printed) = start_serve(dir.path(), &[]);
    assert!(
        printed.contains(r#"lock_method    = "POST""#)
            && printed.contains(r#"unlock_method  = "DELETE""#),
        "{printed}"
    );
    assert!(
        printed.contains(&format!(
            "address        = \"http://{address}/states/default.tfstate\""
        )),
        "{printed}"
    );

    // The first run made an administrator and printed its password once.
    let password = printed
        .lines()
        .find_map(|l| l.trim().strip_prefix("export TF_HTTP_PASSWORD="))
        .unwrap_or_else(|| panic!("no password printed: {printed}"))
        .to_owned();
    assert!(
        printed.contains("export TF_HTTP_USERNAME=admin"),
        "{printed}"
    );
    let basic = |user: &str, password: &str| {
        use base64::Engine as _;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
    };
    let auth = basic("admin", &password);
    assert_eq!(
        request(
            &address,
            &basic("admin", "wrong"),
            "GET",
            "/states/default.tfstate",
            ""
        )
        .0,
        401
    );

    let lock = r#"{"ID":"cli-1","Who":"me@host","Operation":"OperationTypeApply"}"#;
    assert_eq!(
        request(&address, &auth, "POST", "/locks/default.tfstate", lock).0,
        200
    );
    assert_eq!(
        request(
            &address,
            &auth,
            "POST",
            "/states/default.tfstate?ID=cli-1",
            r#"{"serial":1,"lineage":"l"}"#
        )
        .0,
        200
    );
    assert_eq!(
        request(&address, &auth, "GET", "/states/default.tfstate", "").1,
        r#"{"serial":1,"lineage":"l"}"#
    );
    // The remote commands, against this server, as an operator runs them.
    let cli = |args: &[&str]| {
        let out = Command::new(crate::GITSTATE)
            .args(args)
            .env("GITSTATE_URL", format!("http://{address}"))
            .env("TF_HTTP_USERNAME", "admin")
            .env("TF_HTTP_PASSWORD", &password)
            .output()
            .expect("gitstate runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, locks, _) = cli(&["locks"]);
    assert!(
        ok && locks.contains("default.tfstate") && locks.contains("cli-1"),
        "{locks}"
    );
    assert!(
        locks.contains("admin") && !locks.contains("STALE"),
        "{locks}"
    );
    let (ok, stale, _) = cli(&["locks", "--older-than", "0s"]);
    assert!(ok && stale.contains("STALE"), "{stale}");
    assert_eq!(
        request(&address, &auth, "DELETE", "/locks/default.tfstate", lock).0,
        200
    );
    // A write that holds no lock is refused (428) and changes nothing; under a lock it lands.
    let unlocked = request(
        &address,
        &auth,
        "POST",
        "/states/default.tfstate",
        r#"{"serial":2,"lineage":"l"}"#,
    );
    assert!(
        unlocked.0 == 428 && unlocked.1.contains("lock_address"),
        "{unlocked:?}"
    );
    let second = r#"{"ID":"cli-2","Who":"me@host","Operation":"OperationTypeApply"}"#;
    assert_eq!(
        request(&address, &auth, "POST", "/locks/default.tfstate", second).0,
        200
    );
    assert_eq!(
        request(
            &address,
            &auth,
            "POST",
            "/states/default.tfstate?ID=cli-2",
            r#"{"serial":2,"lineage":"l"}"#
        )
        .0,
        200
    );
    assert_eq!(
        request(&address, &auth, "DELETE", "/locks/default.tfstate", second).0,
        200
    );
    let (ok, history, _) = cli(&["history", "default.tfstate"]);
    assert!(ok, "{history}");
    assert_eq!(
        history.lines().next(),
        Some("default.tfstate on branch main"),
        "{history}"
    );
    let rows: Vec<&str> = history.lines().skip(2).collect();
    assert_eq!(rows.len(), 2, "{history}");
    assert!(rows[0].contains(" 2  admin"), "{history}");
    let (ok, shown, _) = cli(&["show", "default.tfstate@1"]);
    assert!(
        ok && shown.trim() == r#"{"serial":1,"lineage":"l"}"#,
        "{shown}"
    );
    let (ok, restored, _) = cli(&["restore", "default.tfstate@1"]);
    assert!(ok && restored.contains("as serial 3"), "{restored}");
    // Without `@`: the newest revision, the one Terraform reads.
    let (ok, newest, _) = cli(&["show", "default.tfstate"]);
    assert!(ok, "{newest}");
    assert_eq!(
        request(&address, &auth, "GET", "/states/default.tfstate", "").1,
        r#"{"lineage":"l","serial":3}"#
    );
    assert_eq!(newest.trim(), r#"{"lineage":"l","serial":3}"#);
    // The list, from the index the writes kept, as a table and as JSON.
    let (ok, listed, _) = cli(&["list"]);
    let row = listed.lines().nth(1).unwrap_or_default();
    assert!(
        ok && row.starts_with("default.tfstate")
            && row.contains("      3  ")
            && row.contains("admin"),
        "{listed}"
    );
    let (ok, json, _) = cli(&["list", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert!(ok);
    assert_eq!(json[0]["state"], "default.tfstate");
    assert_eq!(json[0]["serial"], 3);
    assert_eq!(json[0]["operation"], "OperationTypeRestore");
    let (ok, none, _) = cli(&["list", "--filter", "nothing-like-it"]);
    assert!(ok && none.trim() == "no states", "{none}");
    // The console, on the same server (the embedded repository).
    let (status, page) = request(&address, &auth, "GET", "/ui/", "");
    assert_eq!(status, 200);
    assert!(
        page.contains("<a href=\"/ui/states/default.tfstate\">default.tfstate</a>"),
        "{page}"
    );
    let (status, page) = request(&address, &auth, "GET", "/ui/states/default.tfstate", "");
    assert_eq!(status, 200);
    assert!(
        page.contains("Serial 3") && page.contains("Serial 1"),
        "{page}"
    );
    child.kill().expect("stop");
    let _ = child.wait();

    assert!(
        dir.path().join(".gitstate/repo.git/HEAD").is_file(),
        "the embedded repository is under ./.gitstate/"
    );
    let show = Command::new("git")
        .args([
            "--git-dir",
            ".gitstate/repo.git",
            "show",
            "main:default.tfstate",
        ])
        .current_dir(dir.path())
        .output()
        .expect("git");
    assert_eq!(
        String::from_utf8_lossy(&show.stdout),
        r#"{"lineage":"l","serial":3}"#
    );
}

#[test]
fn user_tools_make_entries_the_backend_accepts() {
    let bin = crate::GITSTATE;
    let add = Command::new(bin)
        .args([
            "user",
            "add",
            "--print",
            "ci-net",
            "--grant",
            "write:network/",
            "--grant",
            "read:*",
        ])
        .output()
        .expect("user add runs");
    assert!(add.status.success(), "{add:?}");
    let entry = String::from_utf8(add.stdout).expect("utf-8");
    let told = String::from_utf8(add.stderr).expect("utf-8");
    let token = told
        .lines()
        .find(|l| l.starts_with("gst_"))
        .expect("the token is shown once on stderr");
    assert!(
        !entry.contains(token),
        "the token never goes into the entry"
    );
    assert!(
        entry.contains(r#"grants = ["write:network/", "read:*"]"#),
        "{entry}"
    );
    assert!(entry.contains("$argon2id$v=19$m=19456,t=2,p=1$"), "{entry}");

    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("access.toml");
    std::fs::write(&file, &entry).expect("write");
    let check = Command::new(bin)
        .args(["access", "check"])
        .arg(&file)
        .output()
        .expect("access check runs");
    let listing = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{check:?}");
    assert!(
        listing.contains("1 user(s)") && listing.contains("ci-net"),
        "{listing}"
    );
    assert!(listing.contains("states under network/"), "{listing}");

    std::fs::write(&file, "[users.bob]\nhash = \"plain-text-password\"\n").expect("write");
    let bad = Command::new(bin)
        .args(["access", "check"])
        .arg(&file)
        .output()
        .expect("access check runs");
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("PHC"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );

    let mut hash = Command::new(bin)
        .arg("hash-password")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("hash-password runs");
    hash.stdin
        .take()
        .expect("stdin")
        .write_all(b"a-long-enough-secret-value\n")
        .expect("send secret");
    let out = hash.wait_with_output().expect("done");
    assert!(out.status.success(), "{out:?}");
    let phc = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        gitstate_core::password::Argon2id.verify(phc.trim(), b"a-long-enough-secret-value"),
        "{phc}"
    );
}

/// Peak resident memory of a process, from /proc (Linux).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// A 20 MB state written and read through the local server: correct both ways. The peak RSS is
/// printed for the record (a figure, not an assertion).
#[test]
fn a_20_mb_state_round_trips_through_the_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, address, printed) = start_serve(
        dir.path(),
        &[
            ("GITSTATE_MAX_BODY_BYTES", "67108864"),
            // The figure is the body's: the write need not be locked.
            ("GITSTATE_ALLOW_UNLOCKED_WRITES", "true"),
        ],
    );
    let password = printed
        .lines()
        .find_map(|l| l.trim().strip_prefix("export TF_HTTP_PASSWORD="))
        .expect("password")
        .to_owned();
    let auth = {
        use base64::Engine as _;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("admin:{password}"))
        )
    };
    let idle = peak_rss_kib(child.id());
    let chunk = "y".repeat(1000);
    let resources: Vec<String> = (0..20_000)
        .map(|i| {
            format!(r#"{{"name":"r{i}","instances":[{{"attributes":{{"output":"{chunk}"}}}}]}}"#)
        })
        .collect();
    let state = format!(
        r#"{{"version":4,"serial":1,"lineage":"big","resources":[{}]}}"#,
        resources.join(",")
    );
    assert_eq!(
        request(&address, &auth, "POST", "/states/big.tfstate", &state).0,
        200
    );
    let (status, body) = request(&address, &auth, "GET", "/states/big.tfstate", "");
    assert_eq!(status, 200);
    assert!(body == state, "the state comes back byte for byte");
    let peak = peak_rss_kib(child.id());
    println!(
        "20 MB state through gitstate serve: {} bytes; peak RSS {} KiB idle, {} KiB after write+read ({:.2}x the state)",
        state.len(),
        idle,
        peak,
        (peak * 1024) as f64 / state.len() as f64
    );
    child.kill().expect("stop");
    let _ = child.wait();
}

/// Issue 24, connection hygiene on the binary: connections that send half a request head are
/// closed after the header timeout (they hold nothing after it); one over the per-address cap is
/// answered 503 with `Retry-After` at once, while another address is served; once the slow ones
/// are gone the address is served again.
#[test]
fn slow_headers_are_closed_and_connections_over_the_cap_answered_503() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, address, _) = start_serve(
        dir.path(),
        &[
            ("GITSTATE_HEADER_TIMEOUT_SECS", "1"),
            ("GITSTATE_MAX_CONNECTIONS_PER_ADDRESS", "8"),
        ],
    );
    let health = |stream: &mut TcpStream| -> String {
        write!(
            stream,
            "GET /health HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
        )
        .expect("send");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer
    };
    let mut slow: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut stream = TcpStream::connect(&address).expect("connect");
            write!(stream, "GET /health HTTP/1.1\r\nHost: {address}\r\n").expect("half a head");
            stream
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let over = health(&mut TcpStream::connect(&address).expect("connect"));
    assert!(over.starts_with("HTTP/1.1 503"), "{over}");
    assert!(
        over.to_ascii_lowercase().contains("retry-after: 1"),
        "{over}"
    );
    // Another address of 127/8 is not affected by the cap of 127.0.0.1.
    let answer = health(&mut connect_from([127, 0, 0, 2], &address));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The slow connections are closed by the server (end of stream, perhaps after a 408).
    for stream in &mut slow {
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .expect("timeout");
        let mut rest = Vec::new();
        stream
            .read_to_end(&mut rest)
            .expect("the server closes a connection that never finished its head");
    }
    let answer = health(&mut TcpStream::connect(&address).expect("connect"));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    child.kill().expect("kill");
    let _ = child.wait();
}

/// A blocking connection to `address` from the loopback address `from` (any of 127/8).
fn connect_from(from: [u8; 4], address: &str) -> TcpStream {
    let to: std::net::SocketAddr = address.parse().expect("address");
    let stream = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            socket
                .bind((from, 0).into())
                .unwrap_or_else(|e| panic!("bind {from:?}: {e}"));
            let stream = socket.connect(to).await.expect("connect");
            stream.into_std().expect("std")
        });
    stream.set_nonblocking(false).expect("blocking");
    stream
}

/// One whole answer (head and `Content-Length` body) read from a connection that stays open.
fn read_one_answer(reader: &mut BufReader<&TcpStream>) -> String {
    let mut head = String::new();
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("a line of the head");
        assert!(!line.is_empty(), "closed inside the head: {head}");
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().expect("content length");
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).expect("the body");
    head + &String::from_utf8_lossy(&body)
}

/// Issue 24, the other limits of the binary's connections: a request whose body stalls is ended
/// after the body timeout and writes nothing; a kept-alive connection left idle after a whole
/// request is closed after the header timeout; connections from several addresses that reach
/// the total cap make one more from yet another address wait for a 503, until they go.
#[test]
fn stalled_bodies_idle_connections_and_the_total_cap() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, address, printed) = start_serve(
        dir.path(),
        &[
            ("GITSTATE_BODY_TIMEOUT_SECS", "1"),
            ("GITSTATE_HEADER_TIMEOUT_SECS", "3"),
            ("GITSTATE_MAX_CONNECTIONS", "4"),
            ("GITSTATE_MAX_CONNECTIONS_PER_ADDRESS", "8"),
            // A whole body would be written at once: only the stall keeps it out.
            ("GITSTATE_ALLOW_UNLOCKED_WRITES", "true"),
        ],
    );
    let password = printed
        .lines()
        .find_map(|l| l.trim().strip_prefix("export TF_HTTP_PASSWORD="))
        .expect("password")
        .to_owned();
    let auth = {
        use base64::Engine as _;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("admin:{password}"))
        )
    };
    let repository = dir.path().join(".gitstate/repo.git");
    let refs = || {
        gitstate_tests::git(
            &[
                "--git-dir",
                repository.to_str().expect("utf-8 path"),
                "for-each-ref",
            ],
            None,
        )
    };
    // The administrator's credential is verified once, so the stalled request below waits on
    // its body, not on argon2.
    assert_eq!(
        request(&address, &auth, "GET", "/states/stalled.tfstate", "").0,
        404
    );
    let before = refs();

    // A body that stops half-way: ended after about the body timeout, answered 4xx or closed.
    let state = r#"{"version":4,"serial":1,"lineage":"stalled","resources":[]}"#;
    let mut stalled = TcpStream::connect(&address).expect("connect");
    stalled
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        stalled,
        "POST /states/stalled.tfstate HTTP/1.1\r\nHost: {address}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
        state.len(),
        &state[..state.len() / 2]
    )
    .expect("half a body");
    let sent = Instant::now();
    let mut answer = String::new();
    stalled
        .read_to_string(&mut answer)
        .expect("the server ends a stalled body within 10 s");
    let waited = sent.elapsed();
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 4"),
        "{answer}"
    );
    assert!(
        waited >= Duration::from_millis(900),
        "ended after {waited:?}, before the body timeout: {answer}"
    );
    println!(
        "stalled body ended after {waited:?}: {:?}",
        answer.lines().next()
    );
    assert_eq!(refs(), before, "a stalled body changes nothing");
    assert_eq!(
        request(&address, &auth, "GET", "/states/stalled.tfstate", "").0,
        404
    );
    // Control: the same request with its whole body is written.
    assert_eq!(
        request(&address, &auth, "POST", "/states/stalled.tfstate", state).0,
        200
    );
    assert_ne!(refs(), before, "a whole body is written");

    // A kept-alive connection: one whole request answered, then idle until the server closes it.
    let idle = TcpStream::connect(&address).expect("connect");
    idle.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    write!(&idle, "GET /health HTTP/1.1\r\nHost: {address}\r\n\r\n").expect("send");
    let mut reader = BufReader::new(&idle);
    let first = read_one_answer(&mut reader);
    let answered = Instant::now();
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(
        !first.to_ascii_lowercase().contains("connection: close"),
        "{first}"
    );
    let mut rest = Vec::new();
    reader
        .read_to_end(&mut rest)
        .expect("the server closes an idle kept-alive connection within 15 s");
    let idled = answered.elapsed();
    assert!(
        idled >= Duration::from_millis(2500),
        "closed after {idled:?}, before the header timeout"
    );
    println!("idle kept-alive connection closed after {idled:?}");
    drop(reader);
    drop(idle);

    // The total cap (4), reached by four addresses each far below its own cap (8).
    let holders: Vec<TcpStream> = (1..=4)
        .map(|i| connect_from([127, 0, 7, i], &address))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut over = connect_from([127, 0, 8, 1], &address);
    write!(
        over,
        "GET /health HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut answer = String::new();
    let _ = over.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    drop(holders);
    // Once they go, a new connection from another address is served (the server may take a
    // moment to see them close).
    let deadline = Instant::now() + Duration::from_secs(10);
    let served = loop {
        let mut again = connect_from([127, 0, 8, 2], &address);
        write!(
            again,
            "GET /health HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
        )
        .expect("send");
        let mut answer = String::new();
        let _ = again.read_to_string(&mut answer);
        if answer.starts_with("HTTP/1.1 200") || Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    child.kill().expect("kill");
    let _ = child.wait();
}

/// A connection from 127.0.0.1 whose receive window is as small as the system allows, so that
/// answers the client does not read soon fill it and the server's own send buffer.
fn connect_small_window(address: &str) -> TcpStream {
    let to: std::net::SocketAddr = address.parse().expect("address");
    let stream = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            socket.set_recv_buffer_size(4096).expect("receive buffer");
            socket
                .connect(to)
                .await
                .expect("connect")
                .into_std()
                .expect("std")
        });
    stream.set_nonblocking(false).expect("blocking");
    stream
}

/// A slow read on the binary: a client without credentials pipelines many `GET /health` (free
/// for it, and no failed login) and never reads the answers, so the server's writes stall; it
/// sends no head the header timeout could catch. Such connections must not hold their places
/// under the caps for ever: the server closes a connection whose answer has not moved for the
/// body timeout, and the address is served again.
#[test]
fn a_client_that_stops_reading_its_answers_is_closed() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, address, _) = start_serve(
        dir.path(),
        &[
            ("GITSTATE_HEADER_TIMEOUT_SECS", "1"),
            ("GITSTATE_BODY_TIMEOUT_SECS", "1"),
            ("GITSTATE_MAX_CONNECTIONS_PER_ADDRESS", "2"),
        ],
    );
    let health = |stream: &mut TcpStream| -> String {
        write!(
            stream,
            "GET /health HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
        )
        .expect("send");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer
    };
    let requests = format!("GET /health HTTP/1.1\r\nHost: {address}\r\n\r\n").repeat(20_000);
    let readers: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut stream = connect_small_window(&address);
            stream
                .set_write_timeout(Some(Duration::from_secs(3)))
                .expect("timeout");
            // The server stops reading once its answers stall: the rest may not go.
            let _ = stream.write_all(requests.as_bytes());
            stream
        })
        .collect();
    // They hold the address's two places.
    let over = health(&mut TcpStream::connect(&address).expect("connect"));
    assert!(over.starts_with("HTTP/1.1 503"), "{over}");
    // Far past both timeouts the server has closed them, and the address is served again.
    let deadline = Instant::now() + Duration::from_secs(20);
    let served = loop {
        let answer = health(&mut TcpStream::connect(&address).expect("connect"));
        if answer.starts_with("HTTP/1.1 200") || Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        served.starts_with("HTTP/1.1 200"),
        "connections that stopped reading still hold the address's places: {served}"
    );
    for mut stream in readers {
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let mut rest = Vec::new();
        match stream.read_to_end(&mut rest) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("the server keeps a connection that stopped reading: {e}"),
        }
    }
    child.kill().expect("kill");
    let _ = child.wait();
}

/// `gitstate serve` behind a reverse proxy (the docs suggest one in front of a `serve` that
/// untrusted networks reach, and the container image may run behind a TLS proxy): every request
/// comes from the proxy's address, so without `GITSTATE_TRUSTED_PROXIES` the login throttle's
/// keys (the address, and the user name from the address) were the same for every client, and a
/// stranger's five wrong passwords for `admin` refused the real administrator's first login
/// through the proxy. With the proxy trusted, each request counts under the address the proxy
/// appended to `X-Forwarded-For`; what the stranger writes further left (here the
/// administrator's own address) is not believed. Without the setting the header is ignored
/// altogether: a stranger cannot escape the throttle by naming new addresses. The proxy is played
/// by requests from 127.0.0.1.
#[test]
fn behind_a_trusted_proxy_a_strangers_failures_do_not_lock_out_a_user() {
    use base64::Engine as _;
    for trusted in [true, false] {
        let dir = tempfile::tempdir().expect("tempdir");
        let env: &[(&str, &str)] = if trusted {
            &[("GITSTATE_TRUSTED_PROXIES", "127.0.0.0/8,::1")]
        } else {
            &[]
        };
        let (mut child, address, printed) = start_serve(dir.path(), env);
        let password = printed
            .lines()
            .find_map(|l| l.trim().strip_prefix("export TF_HTTP_PASSWORD="))
            .expect("password")
            .to_owned();
        let basic = |secret: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("admin:{secret}"))
            )
        };
        let through_proxy = |forwarded: &str, authorization: &str| -> u16 {
            let mut stream = TcpStream::connect(&address).expect("connect");
            write!(
                stream,
                "GET /states/proxied.tfstate HTTP/1.1\r\nHost: {address}\r\nX-Forwarded-For: {forwarded}\r\nAuthorization: {authorization}\r\nConnection: close\r\n\r\n"
            )
            .expect("send");
            let mut answer = String::new();
            stream.read_to_string(&mut answer).expect("read");
            answer
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .expect("status line")
        };
        // The stranger (198.51.100.7, as the proxy appends it) claims the administrator's
        // address on the left, and, without a trusted proxy, a new address each time.
        for guess in 0..6 {
            let forwarded = if trusted {
                "203.0.113.9, 198.51.100.7".to_owned()
            } else {
                format!("192.0.2.{guess}")
            };
            let status = through_proxy(&forwarded, &basic(&format!("guess-{guess}")));
            assert!(status == 401 || status == 429, "guess {guess}: {status}");
        }
        let first_login = through_proxy("203.0.113.9", &basic(&password));
        let want = if trusted { 404 } else { 429 };
        assert_eq!(
            first_login, want,
            "the administrator's first login from another client, proxy trusted: {trusted}"
        );
        child.kill().expect("kill");
        let _ = child.wait();
    }
}
