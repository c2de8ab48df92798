//! `gitstate encrypt` / `gitstate decrypt` as an operator runs them in an emergency: the binary,
//! the standard AWS configuration from the environment (`AWS_ENDPOINT_URL_KMS` pointing at a
//! moto server on loopback), and Python sops 1.18 as an independent reader of the result.

use std::process::{Command, Stdio};

use gitstate_tests::{Moto, tool};

/// The standard AWS settings of an operator's shell, pointing at `moto`.
fn aws_env<'a>(cmd: &'a mut Command, moto: &Moto) -> &'a mut Command {
    cmd.envs(moto.env()).env_remove("AWS_PROFILE")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypt_then_decrypt_with_the_cli_and_python_sops() {
    let moto = Moto::start().await;
    // a key with the alias the operator names
    moto.create_key("cli").await;

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
    let sealed = aws_env(&mut encrypt, &moto).output().expect("encrypt runs");
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
    let opened = aws_env(&mut decrypt, &moto).output().expect("decrypt runs");
    assert!(
        opened.status.success(),
        "{}",
        String::from_utf8_lossy(&opened.stderr)
    );
    assert_eq!(opened.stdout, text.as_bytes());

    let mut sops = Command::new(tool("sops"));
    sops.args(["-d", "--input-type", "json", "--output-type", "bytes"])
        .arg(&file);
    let oracle = aws_env(&mut sops, &moto).output().expect("sops runs");
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
