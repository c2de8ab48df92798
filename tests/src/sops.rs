//! The stock Go sops 3.11 ([`crate::sops311`]) driven from tests: encrypt and decrypt files,
//! the break-glass pipe, `.sops.yaml` key groups (KMS under gitstate's context, age, OpenPGP).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gitstate_core::StateName;

use crate::sops311;

/// Run sops 3.11 with `args` on `input`; its stdout, or a panic with its stderr.
pub fn sops(args: &[&str], input: &[u8], env: &[(&str, String)]) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("input");
    std::fs::write(&file, input).expect("write");
    let out = sops311()
        .args(args)
        .arg(&file)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("sops runs");
    assert!(
        out.status.success(),
        "sops {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `sops decrypt --input-type json --output-type binary FILE | gzip -dc -f`: docs/operating.md's
/// break-glass pipe.
pub fn break_glass(stored: &[u8], env: &[(&str, String)]) -> Vec<u8> {
    let payload = sops(
        &["decrypt", "--input-type", "json", "--output-type", "binary"],
        stored,
        env,
    );
    let mut gzip = Command::new("gzip")
        .args(["-dc", "-f"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("gzip runs");
    gzip.stdin
        .take()
        .expect("stdin")
        .write_all(&payload)
        .expect("gzip reads");
    let out = gzip.wait_with_output().expect("gzip ends");
    assert!(out.status.success(), "gzip -d failed");
    out.stdout
}

/// A `.sops.yaml` with one creation rule of the given key groups (YAML text of the list) and
/// threshold, written in `dir`.
pub fn sops_config(dir: &Path, groups: &str, threshold: Option<usize>) -> PathBuf {
    let path = dir.join(".sops.yaml");
    let threshold = threshold
        .map(|t| format!("    shamir_threshold: {t}\n"))
        .unwrap_or_default();
    std::fs::write(
        &path,
        format!("creation_rules:\n  - key_groups:\n{groups}{threshold}"),
    )
    .expect("write .sops.yaml");
    path
}

/// The KMS key group of a `.sops.yaml` for `arn` under gitstate's context of a state.
pub fn kms_group(arn: &str, url: &str, name: &str) -> String {
    let context = gitstate_kms::context(url, &StateName::parse(name).expect("name"));
    let context: String = context
        .iter()
        .map(|(k, v)| format!("              {k:?}: {v:?}\n"))
        .collect();
    format!("      - kms:\n          - arn: {arn:?}\n            context:\n{context}")
}

/// `plain` (JSON) encrypted by sops 3.11 as JSON with one creation rule of `groups` and
/// `threshold` (see [`sops_config`]): tree mode, so a `{"data": …, "gitstate_binding": …}`
/// document reads as gitstate's binary mode with its binding.
pub fn sops_encrypt_json(
    groups: &str,
    threshold: Option<usize>,
    plain: &[u8],
    env: &[(&str, String)],
) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = sops_config(dir.path(), groups, threshold);
    sops(
        &[
            "--config",
            config.to_str().expect("utf-8"),
            "encrypt",
            "--input-type",
            "json",
            "--output-type",
            "json",
        ],
        plain,
        env,
    )
}

/// A gpg key made in a keyring of its own: its fingerprint and armored public and secret keys.
pub struct GpgKey {
    pub home: tempfile::TempDir,
    pub fp: String,
    pub public: PathBuf,
    pub secret: PathBuf,
}

pub fn gpg(home: &Path, args: &[&str]) -> Vec<u8> {
    gpg_with(home, "", args)
}

/// gpg in batch mode, any passphrase it asks for given on the command line (loopback pinentry).
pub fn gpg_with(home: &Path, passphrase: &str, args: &[&str]) -> Vec<u8> {
    let out = std::process::Command::new("gpg")
        .env("GNUPGHOME", home)
        .args(["--batch", "--pinentry-mode", "loopback", "--passphrase"])
        .arg(passphrase)
        .args(args)
        .output()
        .expect("gpg runs (Debian package gnupg)");
    assert!(
        out.status.success(),
        "gpg {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

pub fn gpg_key(uid: &str) -> GpgKey {
    gpg_key_as(uid, "default", "", "--export-secret-keys")
}

/// A key of `algo` (`default`: RSA-3072 with gpg 2.2; `future-default`: Ed25519 with a
/// Cv25519 subkey) protected by `passphrase` (none when empty), its secret side exported with
/// `export` (`--export-secret-keys`, or `--export-secret-subkeys`: the primary key a stub).
pub fn gpg_key_as(uid: &str, algo: &str, passphrase: &str, export: &str) -> GpgKey {
    let home = tempfile::tempdir().expect("tempdir");
    gpg_with(
        home.path(),
        passphrase,
        &["--quick-gen-key", uid, algo, "default", "never"],
    );
    let listed =
        String::from_utf8(gpg(home.path(), &["--with-colons", "--list-keys"])).expect("utf-8");
    let fp = listed
        .lines()
        .find_map(|l| l.strip_prefix("fpr:"))
        .map(|l| l.trim_matches(':').to_owned())
        .expect("a fingerprint");
    let public = home.path().join("public.asc");
    std::fs::write(&public, gpg(home.path(), &["--armor", "--export", &fp])).expect("write");
    let secret = home.path().join("secret.asc");
    std::fs::write(
        &secret,
        gpg_with(home.path(), passphrase, &["--armor", export, &fp]),
    )
    .expect("write");
    GpgKey {
        home,
        fp,
        public,
        secret,
    }
}

impl GpgKey {
    /// The environment sops 3.11 decrypts with this key in: its keyring, and for a key with a
    /// passphrase a gpg that is given it (`SOPS_GPG_EXEC`), as no one is there to type it.
    pub fn sops_env(&self, passphrase: &str) -> Vec<(&'static str, String)> {
        let mut env = vec![("GNUPGHOME", self.home.path().display().to_string())];
        if !passphrase.is_empty() {
            let file = self.home.path().join("passphrase");
            std::fs::write(&file, passphrase).expect("write");
            let exec = self.home.path().join("gpg-with-passphrase");
            std::fs::write(
                &exec,
                format!(
                    "#!/bin/sh\nexec gpg --pinentry-mode loopback --passphrase-file '{}' \"$@\"\n",
                    file.display()
                ),
            )
            .expect("write");
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&exec, std::fs::Permissions::from_mode(0o755)).expect("chmod");
            env.push(("SOPS_GPG_EXEC", exec.display().to_string()));
        }
        env
    }
}
