//! `gitstate encrypt` / `gitstate decrypt` as an operator runs them in an emergency: the binary,
//! the standard AWS configuration from the environment (`AWS_ENDPOINT_URL_KMS` pointing at a
//! moto server on loopback), and the stock Go sops 3.11 as an independent reader of the result.

use std::process::Command;

use gitstate_tests::Moto;

/// The standard AWS settings of an operator's shell, pointing at `moto`.
fn aws_env<'a>(cmd: &'a mut Command, moto: &Moto) -> &'a mut Command {
    cmd.envs(moto.env()).env_remove("AWS_PROFILE")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypt_then_decrypt_with_the_cli_and_sops311() {
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

    // the stock sops 3.11, piped into gzip as docs/operating.md says
    let oracle = gitstate_tests::sops::break_glass(sealed_text.as_bytes(), &moto.env());
    assert_eq!(oracle, text.as_bytes());
}

/// OpenPGP alone, as an operator without KMS has it: `gitstate encrypt` seals for a fingerprint
/// with the armored public key only; `gitstate decrypt` opens with the passphrase-protected
/// secret key (made by `gpg --quick-gen-key` with a passphrase) and the passphrase, and not
/// without it; sops 3.11 opens the file through gpg to the same state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypt_then_decrypt_with_openpgp_alone() {
    use gitstate_tests::sops::{break_glass, gpg_key_as};
    let moto = Moto::start().await;
    let passphrase = "operator passphrase ✓";
    let key = gpg_key_as(
        "operator <operator@example.invalid>",
        "future-default",
        passphrase,
        "--export-secret-keys",
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
        .env("GITSTATE_PGP_FINGERPRINTS", &key.fp)
        .env("GITSTATE_PGP_PUBLIC_KEYS_FILE", &key.public);
    let sealed = aws_env(&mut encrypt, &moto).output().expect("encrypt runs");
    assert!(
        sealed.status.success(),
        "{}",
        String::from_utf8_lossy(&sealed.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&sealed.stdout).expect("json");
    assert_eq!(doc["sops"]["pgp"][0]["fp"], key.fp.as_str());
    assert!(doc["sops"].get("kms").is_none() && doc["gitstate_binding"].is_string());
    let file = dir.path().join("sealed.tfstate");
    std::fs::write(&file, &sealed.stdout).expect("write");

    let decrypt = |with_passphrase: bool| {
        let mut decrypt = Command::new(bin);
        decrypt
            .arg("decrypt")
            .arg(&file)
            .env("GITSTATE_PGP_SECRET_KEYS_FILE", &key.secret);
        if with_passphrase {
            decrypt.env("GITSTATE_PGP_PASSPHRASE", passphrase);
        }
        aws_env(&mut decrypt, &moto).output().expect("decrypt runs")
    };
    let opened = decrypt(true);
    assert!(
        opened.status.success(),
        "{}",
        String::from_utf8_lossy(&opened.stderr)
    );
    assert_eq!(opened.stdout, text.as_bytes());
    let refused = decrypt(false);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && refused.stdout.is_empty());
    assert!(
        stderr.contains(&key.fp) && stderr.contains("GITSTATE_PGP_PASSPHRASE"),
        "{stderr}"
    );
    assert!(break_glass(&sealed.stdout, &key.sops_env(passphrase)) == text.as_bytes());
}
