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
