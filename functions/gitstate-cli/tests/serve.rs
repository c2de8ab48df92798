//! `gitstate serve` as a user runs it: the binary, the embedded default, the printed block.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

fn request(address: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("connect");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
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

#[test]
fn serve_prints_the_backend_block_and_serves_the_embedded_repository() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("free port")
        .local_addr()
        .expect("addr")
        .port();
    let address = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gitstate"))
        .arg("serve")
        .current_dir(dir.path())
        .env_remove("GITSTATE_REPOSITORY")
        .env("GITSTATE_LISTEN", &address)
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

    let lock = r#"{"ID":"cli-1","Who":"me@host","Operation":"OperationTypeApply"}"#;
    assert_eq!(
        request(&address, "POST", "/locks/default.tfstate", lock).0,
        200
    );
    assert_eq!(
        request(
            &address,
            "POST",
            "/states/default.tfstate?ID=cli-1",
            r#"{"serial":1,"lineage":"l"}"#
        )
        .0,
        200
    );
    assert_eq!(
        request(&address, "GET", "/states/default.tfstate", "").1,
        r#"{"serial":1,"lineage":"l"}"#
    );
    assert_eq!(
        request(&address, "DELETE", "/locks/default.tfstate", lock).0,
        200
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
        r#"{"serial":1,"lineage":"l"}"#
    );
}
