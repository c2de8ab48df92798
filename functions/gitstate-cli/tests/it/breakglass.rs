//! `gitstate encrypt` / `gitstate decrypt` as an operator runs them in an emergency: the binary,
//! the standard AWS configuration from the environment (`AWS_ENDPOINT_URL_KMS` pointing at a
//! moto server on loopback), and Python sops 1.18 as an independent reader of the result.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn tool(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/tools/.venv/bin")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: run `bash tests/run` (it installs tests/tools/requirements.txt)",
        path.display()
    );
    path
}

struct Moto(Child, u16);

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn moto() -> Moto {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let child = Command::new(tool("moto_server"))
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("moto starts");
    let moto = Moto(child, port);
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return moto;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("moto did not start");
}

fn aws_env(cmd: &mut Command, port: u16) -> &mut Command {
    cmd.env("AWS_ENDPOINT_URL_KMS", format!("http://127.0.0.1:{port}"))
        .env("AWS_REGION", "us-east-1")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_PROFILE")
}

#[test]
fn encrypt_then_decrypt_with_the_cli_and_python_sops() {
    let moto = moto();
    // a key and alias made through the KMS API (boto3 from the same tools)
    let mut create = Command::new(tool("python"));
    create.args([
        "-c",
        "import boto3,os;c=boto3.client('kms',endpoint_url=os.environ['AWS_ENDPOINT_URL_KMS']);\
         k=c.create_key()['KeyMetadata']['Arn'];c.create_alias(AliasName='alias/cli',TargetKeyId=k)",
    ]);
    assert!(
        aws_env(&mut create, moto.1)
            .status()
            .expect("python")
            .success()
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let plain = dir.path().join("prod.tfstate");
    let text = "{\"version\":4,\"serial\":1,\"lineage\":\"x\",\"outputs\":{\"pw\":{\"value\":\"s3cr3t-pw\"}}}\n";
    std::fs::write(&plain, text).expect("write");

    let bin = crate::GITSTATE;
    let mut encrypt = Command::new(bin);
    encrypt
        .args([
            "encrypt",
            "--state",
            "env/prod.tfstate",
            "--repository",
            "https://git.example/o/s.git",
        ])
        .arg(&plain)
        .env("GITSTATE_KMS_KEY_IDS", "alias/cli");
    let sealed = aws_env(&mut encrypt, moto.1)
        .output()
        .expect("encrypt runs");
    assert!(
        sealed.status.success(),
        "{}",
        String::from_utf8_lossy(&sealed.stderr)
    );
    let sealed_text = String::from_utf8(sealed.stdout).expect("utf-8");
    assert!(sealed_text.contains("\"sops\"") && !sealed_text.contains("s3cr3t-pw"));
    let file = dir.path().join("sealed.tfstate");
    std::fs::write(&file, &sealed_text).expect("write");

    let mut decrypt = Command::new(bin);
    decrypt
        .arg("decrypt")
        .arg(&file)
        .env_remove("GITSTATE_KMS_KEY_IDS");
    let opened = aws_env(&mut decrypt, moto.1)
        .output()
        .expect("decrypt runs");
    assert!(
        opened.status.success(),
        "{}",
        String::from_utf8_lossy(&opened.stderr)
    );
    assert_eq!(opened.stdout, text.as_bytes());

    let mut sops = Command::new(tool("sops"));
    sops.args(["-d", "--input-type", "json", "--output-type", "bytes"])
        .arg(&file);
    let oracle = aws_env(&mut sops, moto.1).output().expect("sops runs");
    assert!(
        oracle.status.success(),
        "{}",
        String::from_utf8_lossy(&oracle.stderr)
    );
    // the sealed payload is the state's gzip stream: `sops -d … | gzip -d` is the state
    assert!(oracle.stdout.starts_with(&[0x1f, 0x8b]));
    let mut gzip = Command::new("gzip")
        .arg("-d")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("gzip runs");
    std::io::Write::write_all(&mut gzip.stdin.take().expect("stdin"), &oracle.stdout)
        .expect("gzip reads");
    let expanded = gzip.wait_with_output().expect("gzip ends");
    assert!(expanded.status.success());
    assert_eq!(expanded.stdout, text.as_bytes());
}
