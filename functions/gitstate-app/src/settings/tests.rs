//! The settings as read from variables: defaults, refusals, and secrets kept out of `Debug`.

use super::*;
use gitstate_core::auth::AccessSource;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

fn settings(runtime: Runtime, vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect();
    Settings::from_lookup(runtime, |k| map.get(k).cloned())
}

#[test]
fn local_defaults() {
    let s = settings(Runtime::Local, &[]).expect("defaults are valid");
    assert_eq!(
        (
            s.git.repository,
            s.git.branch.as_str(),
            s.limits.max_body_bytes
        ),
        (None, "main", 6 * 1024 * 1024)
    );
    assert_eq!(s.git.cache_dir, PathBuf::from(".gitstate/cache"));
    assert_eq!(s.git.lock_ref_prefix, "refs/heads/locks/");
}

#[test]
fn lambda_needs_a_repository_and_uses_tmp() {
    assert!(matches!(
        settings(Runtime::Lambda, &[]),
        Err(ConfigError::RepositoryRequired)
    ));
    let s = settings(
        Runtime::Lambda,
        &[
            ("GITSTATE_REPOSITORY", "https://h/o/r.git"),
            ("GITSTATE_GIT_TOKEN", "t0k"),
        ],
    )
    .expect("valid");
    assert_eq!(s.git.cache_dir, PathBuf::from("/tmp/gitstate"));
    for ssh in ["ssh://git@h/o/r.git", "git@h:o/r.git"] {
        let vars = [("GITSTATE_REPOSITORY", ssh)];
        assert!(settings(Runtime::Lambda, &vars).is_err(), "{ssh}");
        assert!(settings(Runtime::Local, &vars).is_ok(), "{ssh}");
    }
    assert!(
        !format!("{s:?}").contains("t0k"),
        "the token must not be printed"
    );
}

/// State refs: `always` on Lambda (group commit never batches there), `auto` locally, and what
/// is set wins on both.
#[test]
fn state_refs_default_by_runtime() {
    let lambda = [("GITSTATE_REPOSITORY", "https://h/o/r.git")];
    let read = |runtime, extra: Option<&str>| {
        let mut vars = lambda.to_vec();
        vars.extend(extra.map(|v| ("GITSTATE_STATE_REFS", v)));
        settings(runtime, &vars).expect("valid").git.state_refs
    };
    assert_eq!(read(Runtime::Lambda, None), StateRefs::Always);
    assert_eq!(read(Runtime::Local, None), StateRefs::Auto);
    for (text, mode) in [
        ("auto", StateRefs::Auto),
        ("always", StateRefs::Always),
        ("never", StateRefs::Never),
    ] {
        assert_eq!(read(Runtime::Lambda, Some(text)), mode);
        assert_eq!(read(Runtime::Local, Some(text)), mode);
    }
}

/// Folds after writes: on locally unless set off; never on Lambda, where asking for them is
/// refused by name (a frozen container would stop a fold halfway).
#[test]
fn folds_after_writes_by_runtime() {
    let repository = ("GITSTATE_REPOSITORY", "https://h/o/r.git");
    let read = |runtime, extra: Option<&str>| {
        let mut vars = vec![repository];
        vars.extend(extra.map(|v| ("GITSTATE_FOLD_AFTER_WRITES", v)));
        settings(runtime, &vars).map(|s| s.git.fold_after_writes)
    };
    assert!(read(Runtime::Local, None).expect("valid"));
    assert!(read(Runtime::Local, Some("true")).expect("valid"));
    assert!(!read(Runtime::Local, Some("false")).expect("valid"));
    assert!(!read(Runtime::Lambda, None).expect("valid"));
    assert!(!read(Runtime::Lambda, Some("false")).expect("valid"));
    let refused = read(Runtime::Lambda, Some("true")).expect_err("refused");
    assert!(
        refused.to_string().contains("GITSTATE_FOLD_AFTER_WRITES")
            && refused.to_string().contains("FoldSchedule"),
        "{refused}"
    );
    for runtime in [Runtime::Local, Runtime::Lambda] {
        let bad = read(runtime, Some("yes")).expect_err("not a flag");
        assert!(
            bad.to_string().contains("GITSTATE_FOLD_AFTER_WRITES"),
            "{bad}"
        );
    }
}

#[test]
fn encryption_settings() {
    let s = settings(
        Runtime::Local,
        &[
            (
                "GITSTATE_KMS_KEY_IDS",
                " alias/a , arn:aws:kms:eu-west-1:123456789012:key/mrk-0123456789abcdef0123456789abcdef,",
            ),
            (
                "GITSTATE_KMS_PREVIOUS_KEY_IDS",
                "1234abcd-12ab-34cd-56ef-1234567890ab",
            ),
            ("GITSTATE_ENCRYPTION", "enforced"),
            ("GITSTATE_PASSPHRASE", "pw-123"),
        ],
    )
    .expect("valid");
    assert_eq!(
        s.encryption.kms_key_ids,
        [
            "alias/a",
            "arn:aws:kms:eu-west-1:123456789012:key/mrk-0123456789abcdef0123456789abcdef"
        ]
    );
    assert_eq!(
        s.encryption.previous_kms_key_ids,
        ["1234abcd-12ab-34cd-56ef-1234567890ab"]
    );
    assert!(s.encryption.enforced && s.encryption.is_configured());
    assert!(!format!("{s:?}").contains("pw-123"));
    let plain = settings(Runtime::Local, &[]).expect("valid");
    assert!(!plain.encryption.is_configured());
}

#[test]
fn refuses_bad_values() {
    for vars in [
        [("GITSTATE_REPOSITORY", "ftp://github.com/o/r.git")],
        [("GITSTATE_LOCK_REF_PREFIX", "locks/")],
        [("GITSTATE_MAX_BODY_BYTES", "-1")],
        [("GITSTATE_REF", "a..b")],
        [("GITSTATE_LISTEN", "nowhere")],
        [("GITSTATE_ENCRYPTION", "enforced")],
        [("GITSTATE_ENCRYPTION", "sometimes")],
        [("GITSTATE_REF", "locks")],
        [("GITSTATE_REF", "locks/main")],
        [("GITSTATE_ALLOWED_REFS", "locks/*")],
        [("GITSTATE_ALLOWED_REFS", "main/x")],
        [("GITSTATE_ALLOWED_REFS", "env/*/x")],
        [("GITSTATE_KMS_PREVIOUS_KEY_IDS", "alias/old")],
        [("GITSTATE_HISTORY_MAX_DEPTH", "0")],
        [("GITSTATE_GIT_MAX_RESPONSE_BYTES", "lots")],
        [("GITSTATE_GIT_WRITES_PER_PUSH", "0")],
        [("GITSTATE_GIT_WRITES_PER_PUSH", "257")],
        [("GITSTATE_GIT_AUTH", "digest")],
        [("GITSTATE_REQUIRE_ATOMIC", "yes")],
        [("GITSTATE_STATE_REFS", "sometimes")],
        [("GITSTATE_STATE_REFS", "Always")],
        [("GITSTATE_GIT_CA_PEM", "not a certificate")],
        [("GITSTATE_GIT_CA_FILE", "/nonexistent/ca.pem")],
    ] {
        assert!(settings(Runtime::Local, &vars).is_err(), "{vars:?}");
    }
    // a malformed key is a start-up error naming the setting it is in
    for var in ["GITSTATE_KMS_KEY_IDS", "GITSTATE_KMS_PREVIOUS_KEY_IDS"] {
        for bad in [
            "arn:aws:kms:us-east-1:1:key/b",
            "alias/aws/ebs",
            "tfstate",
            "alias/ok,arn:aws:kms:evil.example:123456789012:alias/x",
        ] {
            let error = settings(
                Runtime::Local,
                &[("GITSTATE_KMS_KEY_IDS", "alias/ok"), (var, bad)],
            )
            .expect_err(bad)
            .to_string();
            assert!(error.starts_with(var), "{error}");
        }
    }
}

/// Every URL shape with a credential in it, for both repository settings, is a start-up
/// error that names the setting and the credential settings and never repeats the secret;
/// the user name of an SSH remote is no secret and stays accepted.
#[test]
fn urls_with_credentials_are_refused() {
    let hosts = ["h.example", "h.example:8443", "127.0.0.1:9", "[::1]:8080"];
    let users = ["u", "x-access-token", "u%40corp", "", "oauth2"];
    let secrets = ["s3cr3t-tok", "p%3Aw%40d", "ghp_s3cr3tT0ken", ""];
    for scheme in ["https", "http"] {
        for host in hosts {
            for user in users {
                for secret in secrets {
                    let userinfo = match (user, secret) {
                        ("", "") => "@".to_owned(),
                        (u, "") => format!("{u}@"),
                        (u, p) => format!("{u}:{p}@"),
                    };
                    for path in ["/o/r.git", "", "/o/r@x.git", "?x=1"] {
                        let url = format!("{scheme}://{userinfo}{host}{path}");
                        for var in ["GITSTATE_REPOSITORY", "GITSTATE_ALLOWED_REPOSITORIES"] {
                            let list = format!("https://ok.example/r.git,{url}");
                            let value = if var == "GITSTATE_REPOSITORY" {
                                &url
                            } else {
                                &list
                            };
                            let error = settings(Runtime::Local, &[(var, value)])
                                .expect_err(&url)
                                .to_string();
                            assert!(error.starts_with(var), "{error}");
                            assert!(error.contains("GITSTATE_GIT_TOKEN"), "{error}");
                            if !secret.is_empty() {
                                assert!(!error.contains(secret), "{error}");
                            }
                        }
                    }
                }
            }
        }
    }
    for ok in [
        "https://h.example/o/r.git",
        "http://127.0.0.1:8080/o/r@x.git",
        "git@h.example:o/r.git",
        "ssh://git@h.example/o/r.git",
        "ssh://git@h.example:2222/o/r.git",
    ] {
        for var in ["GITSTATE_REPOSITORY", "GITSTATE_ALLOWED_REPOSITORIES"] {
            assert!(settings(Runtime::Local, &[(var, ok)]).is_ok(), "{ok}");
        }
    }
    let error = settings(
        Runtime::Local,
        &[("GITSTATE_REPOSITORY", "ssh://git:pw-9@h.example/o/r.git")],
    )
    .expect_err("a password in an ssh URL")
    .to_string();
    assert!(!error.contains("pw-9"), "{error}");
}

#[test]
fn ref_settings_name_the_setting_at_fault() {
    let error = settings(Runtime::Local, &[("GITSTATE_REF", "locks")])
        .expect_err("clashes with the lock refs");
    assert!(error.to_string().starts_with("GITSTATE_REF:"), "{error}");
    let error = settings(Runtime::Local, &[("GITSTATE_ALLOWED_REFS", "dev,locks")])
        .expect_err("clashes with the lock refs");
    assert!(
        error.to_string().starts_with("GITSTATE_ALLOWED_REFS:"),
        "{error}"
    );
    let s = settings(
        Runtime::Local,
        &[
            ("GITSTATE_REF", "locks"),
            ("GITSTATE_LOCK_REF_PREFIX", "refs/locks/"),
            ("GITSTATE_ALLOWED_REFS", "env/*, dev"),
        ],
    )
    .expect("refs/locks/ keeps lock refs off the branches");
    assert_eq!(s.git.allowed_refs.patterns().len(), 2);
    assert!(s.ref_policy().is_ok());
}

#[test]
fn bounds_on_git_work() {
    let s = settings(Runtime::Local, &[]).expect("defaults");
    assert_eq!(
        (
            s.limits.history_max_depth,
            s.limits.git_max_response_bytes,
            s.limits.git_writes_per_push
        ),
        (10_000, 128 << 20, 32)
    );
    let s = settings(
        Runtime::Local,
        &[
            ("GITSTATE_HISTORY_MAX_DEPTH", "100"),
            ("GITSTATE_GIT_MAX_RESPONSE_BYTES", "4096"),
            ("GITSTATE_GIT_WRITES_PER_PUSH", "1"),
        ],
    )
    .expect("valid");
    assert_eq!(
        (
            s.limits.history_max_depth,
            s.limits.git_max_response_bytes,
            s.limits.git_writes_per_push
        ),
        (100, 4096, 1)
    );
}

#[test]
fn git_host_settings() {
    let s = settings(Runtime::Local, &[]).expect("defaults");
    assert_eq!(
        (s.git.auth, s.git.ca_pem, s.git.require_atomic),
        (GitAuth::Basic, None, false)
    );
    let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    let file = std::env::temp_dir().join(format!("gitstate-ca-{}.pem", std::process::id()));
    std::fs::write(&file, pem).expect("write");
    let path = file.display().to_string();
    let s = settings(
        Runtime::Local,
        &[
            ("GITSTATE_GIT_AUTH", "bearer"),
            ("GITSTATE_REQUIRE_ATOMIC", "true"),
            ("GITSTATE_GIT_CA_FILE", &path),
            ("GITSTATE_GIT_CA_PEM", pem),
        ],
    )
    .expect("valid");
    assert_eq!((s.git.auth, s.git.require_atomic), (GitAuth::Bearer, true));
    let bundle = s.git.ca_pem.expect("a bundle");
    let flat = pem.replace('\n', " ");
    let s = settings(Runtime::Local, &[("GITSTATE_GIT_CA_PEM", &flat)]).expect("valid");
    assert_eq!(s.git.ca_pem.as_deref().map(str::trim), Some(pem.trim()));
    assert_eq!(
        bundle.matches("BEGIN CERTIFICATE").count(),
        2,
        "file and text together"
    );
    let _ = std::fs::remove_file(file);
}

#[test]
fn access_sources() {
    let s = settings(Runtime::Local, &[]).expect("defaults");
    assert_eq!(s.access.options().source, AccessSource::Repository);
    assert_eq!(s.access.refresh, Duration::from_secs(10));
    let dir = std::env::temp_dir().join(format!("gitstate-access-{}", std::process::id()));
    std::fs::write(&dir, "[users]\n").expect("write");
    let path = dir.display().to_string();
    let s = settings(
        Runtime::Local,
        &[
            ("GITSTATE_ACCESS_FILE", &path),
            ("GITSTATE_ADMIN_HASH", "$argon2id$…"),
            ("GITSTATE_ACCESS_REFRESH_SECS", "0"),
        ],
    )
    .expect("valid");
    assert_eq!(
        s.access.options().source,
        AccessSource::Text("[users]\n".into())
    );
    assert_eq!(s.access.refresh, Duration::ZERO);
    let (user, hash) = s.access.bootstrap.clone().expect("bootstrap");
    assert_eq!((user.as_str(), hash.expose()), ("admin", "$argon2id$…"));
    assert!(
        !format!("{s:?}").contains("argon2id"),
        "hashes stay out of Debug"
    );
    let _ = std::fs::remove_file(&dir);
    assert!(matches!(
        settings(
            Runtime::Local,
            &[("GITSTATE_ACCESS", "x"), ("GITSTATE_ACCESS_FILE", "y")]
        ),
        Err(ConfigError::TwoAccessSources)
    ));
    assert!(
        settings(
            Runtime::Local,
            &[("GITSTATE_ACCESS_FILE", "/nonexistent/x")]
        )
        .is_err()
    );
}

/// Every secret the settings hold.
fn secrets(s: &Settings) -> Vec<&gitstate_core::secret::Secret> {
    let mut all: Vec<_> = [
        &s.git.token,
        &s.git.token_kms,
        &s.encryption.passphrase,
        &s.encryption.age_identity_kms,
        &s.encryption.pgp_secret_keys_kms,
        &s.encryption.pgp_passphrase,
        &s.access.text,
    ]
    .into_iter()
    .flatten()
    .collect();
    all.extend(s.access.bootstrap.as_ref().map(|(_, hash)| hash));
    all.extend(s.access.bootstrap_kms.as_ref().map(|(_, sealed)| sealed));
    all.extend(s.encryption.age_identity.as_ref().map(|(_, text)| text));
    all.extend(s.encryption.pgp_secret_keys.as_ref().map(|(_, text)| text));
    all
}

/// For every secret setting of [`crate::layers::SETTINGS`]: the value is held as a `Secret`, and
/// neither the settings' `Debug` (plain or pretty), the secret's `Debug` and `Display`, nor the
/// layered view and its report ever show it.
#[test]
fn no_secret_setting_is_ever_printed() {
    use crate::layers::{Layered, SETTINGS};
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let specs: Vec<_> = SETTINGS.iter().filter(|spec| spec.secret).collect();
    assert!(specs.len() >= 5, "{specs:?}");
    for spec in specs {
        let value = format!("hidden-{}-{:x}", spec.key(), rng.random::<u64>());
        let s = settings(Runtime::Local, &[(spec.var, &value)]).expect(spec.var);
        let held: Vec<_> = secrets(&s)
            .into_iter()
            .filter(|secret| secret.expose() == value)
            .collect();
        assert_eq!(held.len(), 1, "{} is not held as a Secret", spec.var);
        let layered = Layered::build(
            |_| None,
            |var| (var == spec.var).then(|| value.clone()),
            None,
        )
        .expect("layers");
        let shown = format!(
            "{s:?} {s:#?} {} {:?} {layered:?} {:?}",
            held[0],
            held[0],
            layered.report()
        );
        assert!(!shown.contains(&value), "{} printed: {shown}", spec.var);
    }
}

/// An age recipient (made once with `age-keygen`; its identity was thrown away).
const AGE_RECIPIENT: &str = "age1xpw8qa545nj2jl6umc0ua74tctx7ysmvqzlgv8wh72zql8937vvsc5u7af";

#[test]
fn age_groups_and_the_seed_variables() {
    // comments alone hold no identity; a bad one is an error that never shows it
    assert!(gitstate_sops::AgeKeys::parse("# a comment\n\n").is_err());
    let bad = gitstate_sops::AgeKeys::parse("# keys\nAGE-SECRET-KEY-1NOTAKEY").expect_err("bad");
    assert!(!bad.to_string().contains("NOTAKEY") && bad.to_string().contains("line 2"));
    let s = settings(
        Runtime::Local,
        &[
            ("GITSTATE_AGE_RECIPIENTS", AGE_RECIPIENT),
            ("GITSTATE_KMS_KEY_IDS", "alias/tfstate"),
            ("GITSTATE_SOPS_SHAMIR_THRESHOLD", "2"),
            ("GITSTATE_ENCRYPTION", "enforced"),
        ],
    )
    .expect("valid");
    assert_eq!(s.encryption.age_recipients, [AGE_RECIPIENT]);
    assert_eq!(s.encryption.shamir_threshold, Some(2));
    // the seed's variables map onto the same settings; gitstate's own win
    let seed = settings(
        Runtime::Local,
        &[
            ("TF_BACKEND_HTTP_SOPS_AGE_RECIPIENTS", AGE_RECIPIENT),
            ("TF_BACKEND_HTTP_SOPS_SHAMIR_THRESHOLD", "1"),
        ],
    )
    .expect("valid");
    assert_eq!(seed.encryption.age_recipients, [AGE_RECIPIENT]);
    assert_eq!(seed.encryption.shamir_threshold, Some(1));
    let both = settings(
        Runtime::Local,
        &[
            ("TF_BACKEND_HTTP_SOPS_SHAMIR_THRESHOLD", "3"),
            ("GITSTATE_SOPS_SHAMIR_THRESHOLD", "1"),
            ("GITSTATE_AGE_RECIPIENTS", AGE_RECIPIENT),
        ],
    )
    .expect("gitstate's own variable wins");
    assert_eq!(both.encryption.shamir_threshold, Some(1));
    // mistakes are errors naming the variable
    for (vars, var) in [
        (
            vec![("GITSTATE_AGE_RECIPIENTS", "age1nope")],
            "GITSTATE_AGE_RECIPIENTS",
        ),
        (
            vec![(
                "TF_BACKEND_HTTP_SOPS_PGP_FP",
                "FBC7B9E2A4F9289AC0C1D4843D16CEE4A27381B",
            )],
            "TF_BACKEND_HTTP_SOPS_PGP_FP",
        ),
        (
            vec![
                ("GITSTATE_AGE_RECIPIENTS", AGE_RECIPIENT),
                ("GITSTATE_SOPS_SHAMIR_THRESHOLD", "2"),
            ],
            "GITSTATE_SOPS_SHAMIR_THRESHOLD",
        ),
        (
            vec![("GITSTATE_SOPS_SHAMIR_THRESHOLD", "0")],
            "GITSTATE_SOPS_SHAMIR_THRESHOLD",
        ),
        (
            vec![
                ("GITSTATE_AGE_IDENTITY", "x"),
                ("GITSTATE_AGE_IDENTITY_KMS", "eA=="),
            ],
            "GITSTATE_AGE_IDENTITY_KMS",
        ),
        (
            vec![("SOPS_AGE_KEY_FILE", "/nonexistent/keys.txt")],
            "SOPS_AGE_KEY_FILE",
        ),
        (
            vec![
                ("GITSTATE_PGP_SECRET_KEYS", "x"),
                ("GITSTATE_PGP_SECRET_KEYS_KMS", "eA=="),
            ],
            "GITSTATE_PGP_SECRET_KEYS_KMS",
        ),
        (
            vec![
                ("GITSTATE_PGP_SECRET_KEYS_FILE", "/nonexistent/secret.asc"),
                ("GITSTATE_PGP_SECRET_KEYS_KMS", "eA=="),
            ],
            "GITSTATE_PGP_SECRET_KEYS_KMS",
        ),
        (
            vec![
                ("GITSTATE_PGP_PASSPHRASE", "x"),
                ("GITSTATE_PGP_PASSPHRASE_FILE", "/nonexistent/p"),
            ],
            "GITSTATE_PGP_PASSPHRASE_FILE",
        ),
        (
            vec![("GITSTATE_PGP_PASSPHRASE_FILE", "/nonexistent/p")],
            "GITSTATE_PGP_PASSPHRASE_FILE",
        ),
    ] {
        match settings(Runtime::Local, &vars) {
            Err(ConfigError::Invalid { var: got, reason }) => {
                assert_eq!(got, var, "{vars:?}");
                assert!(
                    !reason.contains("NOTAKEY"),
                    "a key is never printed: {reason}"
                );
            }
            other => panic!("{vars:?}: {other:?}"),
        }
    }
    // enforced needs some key to seal with
    assert!(matches!(
        settings(Runtime::Local, &[("GITSTATE_ENCRYPTION", "enforced")]),
        Err(ConfigError::EnforcedWithoutKeys)
    ));
}

#[test]
fn pgp_public_keys_as_text_or_a_file_never_both() {
    const FP: &str = "0123456789ABCDEF0123456789ABCDEF01234567";
    let armored =
        "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nxjMEZ\n-----END PGP PUBLIC KEY BLOCK-----\n";
    let dir = std::env::temp_dir().join(format!("gitstate-pgp-public-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("public.asc");
    std::fs::write(&file, armored).expect("write");
    let file = file.to_str().expect("utf-8 path");
    // the text variant (Lambda: no file of one's own) and the file variant read the same keys
    for var in ["GITSTATE_PGP_PUBLIC_KEYS", "GITSTATE_PGP_PUBLIC_KEYS_FILE"] {
        let value = if var.ends_with("_FILE") {
            file
        } else {
            armored
        };
        let s = settings(
            Runtime::Local,
            &[("GITSTATE_PGP_FINGERPRINTS", FP), (var, value)],
        )
        .unwrap_or_else(|e| panic!("{var}: {e}"));
        assert_eq!(s.encryption.pgp_fingerprints, [FP], "{var}");
        assert_eq!(
            s.encryption.pgp_public_keys.as_deref().map(str::trim),
            Some(armored.trim()),
            "{var}"
        );
    }
    // both at once: an error naming the second, whatever order the values
    match settings(
        Runtime::Local,
        &[
            ("GITSTATE_PGP_PUBLIC_KEYS_FILE", file),
            ("GITSTATE_PGP_PUBLIC_KEYS", armored),
        ],
    ) {
        Err(ConfigError::Invalid { var, reason }) => {
            assert_eq!(var, "GITSTATE_PGP_PUBLIC_KEYS_FILE");
            assert!(
                reason.contains("GITSTATE_PGP_PUBLIC_KEYS is set too"),
                "{reason}"
            );
        }
        other => panic!("both public key settings: {other:?}"),
    }
    // fingerprints with neither: refused, naming both ways to give the keys
    match settings(Runtime::Local, &[("GITSTATE_PGP_FINGERPRINTS", FP)]) {
        Err(ConfigError::Invalid { reason, .. }) => {
            assert!(reason.contains("GITSTATE_PGP_PUBLIC_KEYS"), "{reason}");
        }
        other => panic!("fingerprints without public keys: {other:?}"),
    }
    // an empty text is unset, as for every setting
    assert!(
        settings(Runtime::Local, &[("GITSTATE_PGP_PUBLIC_KEYS", "  ")])
            .expect("valid")
            .encryption
            .pgp_public_keys
            .is_none()
    );
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// A Curve25519 public key made by `gpg --quick-gen-key … future-default` (gpg 2.2.40), exported
/// with `gpg --armor --export`.
const PGP_PUBLIC_FIXTURE: &str = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\
\n\
mDMEawYt3hYJKwYBBAHaRw8BAQdAdPYo1L0ldVdhSS6ZEv0DYELAw5clynyGYqDF\n\
zVD1HNy0KmdpdHN0YXRlIGZpeHR1cmUgPGZpeHR1cmVAZXhhbXBsZS5pbnZhbGlk\n\
PoiQBBMWCAA4FiEE/pypxBCJbtiFmVUskn2e50D5OEMFAmsGLd4CGwMFCwkIBwIG\n\
FQoJCAsCBBYCAwECHgECF4AACgkQkn2e50D5OEM2gwD+N9giBNfLlDxZlBvfXnNq\n\
2LANWES09zDbB+BgpL0Q2h4A/RIdrZEckfIkmrGe/bG1qhJrop92xoQY+MRBe5Ge\n\
sBcJuDgEawYt3hIKKwYBBAGXVQEFAQEHQH2206xeJngi5n0wh/4J1NOfaMwCta0J\n\
menaBou6blNnAwEIB4h4BBgWCAAgFiEE/pypxBCJbtiFmVUskn2e50D5OEMFAmsG\n\
Ld4CGwwACgkQkn2e50D5OENs4wEAr4XGAPMTDDXvVAsrTgLEyVqwMPnLd0skZZHK\n\
kgDWKocBANL9SZx63jhC6yhi27paVnP68QYVLoSdevQba6OL90YF\n\
=jDiZ\n\
-----END PGP PUBLIC KEY BLOCK-----\n\
";
const PGP_FIXTURE_FP: &str = "FE9CA9C410896ED88599552C927D9EE740F93843";

#[test]
fn pgp_public_keys_flattened_to_one_line_still_parse() {
    // as the key is given (lines), flattened to spaces (a CloudFormation parameter on one line),
    // with CRLF, and twice over (a file of two keys, one after the other)
    let flat = PGP_PUBLIC_FIXTURE
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let two = format!("{PGP_PUBLIC_FIXTURE}{PGP_PUBLIC_FIXTURE}");
    for (what, text) in [
        ("as exported", PGP_PUBLIC_FIXTURE.to_owned()),
        ("flattened", flat.clone()),
        ("flattened, padded", format!("  {flat}  ")),
        ("crlf", PGP_PUBLIC_FIXTURE.replace('\n', "\r\n")),
        ("two keys", two),
    ] {
        let s = settings(
            Runtime::Local,
            &[
                ("GITSTATE_PGP_FINGERPRINTS", PGP_FIXTURE_FP),
                ("GITSTATE_PGP_PUBLIC_KEYS", text.as_str()),
            ],
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        let public = s.encryption.pgp_public_keys.expect("public keys");
        let keys = gitstate_sops::PgpKeys::parse(&public, "", None)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(keys.has_public(PGP_FIXTURE_FP), "{what}");
    }
    // a body cut short still fails loudly when parsed, never as no key
    let cut = PGP_PUBLIC_FIXTURE.replacen("mDMEaw", "", 1);
    let flat_cut = cut.split_whitespace().collect::<Vec<_>>().join(" ");
    let public = super::encryption::unflatten_armor(&flat_cut);
    assert!(gitstate_sops::PgpKeys::parse(&public, "", None).is_err());
}

/// terraform-backend-git's KMS keys and context: generated contexts (any number of pairs,
/// values with spaces, `=` and unicode) read back exactly as the fixed context of states;
/// gitstate's own keys win and keep the location's context; malformed pairs are refused.
#[test]
fn the_seeds_kms_keys_and_context() {
    use rand::{Rng, SeedableRng};
    let arn = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab";
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5e1d);
    let alphabet: Vec<char> = "abZ09_-:/. =é".chars().collect();
    for _ in 0..200 {
        let mut want = std::collections::BTreeMap::new();
        for i in 0..rng.random_range(0..5) {
            let value: String = (0..rng.random_range(0..8))
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            want.insert(format!("k{i}"), value.trim().to_owned());
        }
        let text: Vec<String> = want.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let text = text.join(",");
        let s = settings(
            Runtime::Local,
            &[
                ("TF_BACKEND_HTTP_SOPS_AWS_KMS_ARNS", arn),
                ("TF_BACKEND_HTTP_SOPS_AWS_KMS_CONTEXT", &text),
            ],
        )
        .expect("valid");
        assert_eq!(s.encryption.kms_key_ids, [arn]);
        assert_eq!(s.encryption.fixed_context, Some(want), "{text:?}");
    }
    let own = settings(
        Runtime::Local,
        &[
            ("TF_BACKEND_HTTP_SOPS_AWS_KMS_ARNS", arn),
            ("TF_BACKEND_HTTP_SOPS_AWS_KMS_CONTEXT", "a=b"),
            ("GITSTATE_KMS_KEY_IDS", "alias/own"),
        ],
    )
    .expect("valid");
    assert_eq!(own.encryption.kms_key_ids, ["alias/own"]);
    assert_eq!(own.encryption.fixed_context, None);
    for bad in ["novalue", "=v", "a=1,a=2"] {
        let refused = settings(
            Runtime::Local,
            &[
                ("TF_BACKEND_HTTP_SOPS_AWS_KMS_ARNS", arn),
                ("TF_BACKEND_HTTP_SOPS_AWS_KMS_CONTEXT", bad),
            ],
        );
        assert!(
            matches!(&refused, Err(e) if e.to_string().contains("TF_BACKEND_HTTP_SOPS_AWS_KMS_CONTEXT")),
            "{bad}"
        );
    }
}

/// terraform-backend-git's sops mode never ends in plaintext or in fewer readers: every subset
/// of its key variables × its provider values either seals with a key gitstate serves or is
/// refused, naming the variable to change.
#[test]
fn the_seeds_sops_mode_needs_a_key_gitstate_seals_with() {
    let arn = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab";
    let keys = [
        ("TF_BACKEND_HTTP_SOPS_AWS_KMS_ARNS", arn),
        ("TF_BACKEND_HTTP_SOPS_AGE_RECIPIENTS", AGE_RECIPIENT),
        ("GITSTATE_KMS_KEY_IDS", "alias/own"),
        (
            "TF_BACKEND_HTTP_SOPS_GCP_KMS_KEYS",
            "projects/p/locations/l/keyRings/r/cryptoKeys/k",
        ),
        (
            "TF_BACKEND_HTTP_SOPS_HC_VAULT_URIS",
            "https://127.0.0.1:8200/v1/sops/keys/k",
        ),
    ];
    for provider in [None, Some("aes"), Some("sops")] {
        for mask in 0u32..(1 << keys.len()) {
            let mut env: Vec<(&str, &str)> = keys
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, kv)| *kv)
                .collect();
            if let Some(provider) = provider {
                env.push(("TF_BACKEND_HTTP_ENCRYPTION_PROVIDER", provider));
            }
            let served = mask & 0b00111 != 0;
            let unserved = keys[3..]
                .iter()
                .enumerate()
                .find(|(i, _)| mask & (1 << (i + 3)) != 0)
                .map(|(_, (var, _))| *var);
            let got = settings(Runtime::Local, &env);
            let case = format!("{provider:?} {env:?}");
            match (unserved, provider == Some("sops") && !served) {
                (Some(var), _) => assert!(
                    matches!(&got, Err(e) if e.to_string().contains(var)),
                    "{case}: {:?}",
                    got.err()
                ),
                (None, true) => assert!(
                    matches!(&got, Err(e) if e.to_string().contains("TF_BACKEND_HTTP_ENCRYPTION_PROVIDER")
                        && e.to_string().contains("plaintext")),
                    "{case}: {:?}",
                    got.err()
                ),
                (None, false) => {
                    let s = got.unwrap_or_else(|e| panic!("{case}: {e}"));
                    assert_eq!(
                        !s.encryption.kms_key_ids.is_empty()
                            || !s.encryption.age_recipients.is_empty(),
                        served,
                        "{case}"
                    );
                }
            }
        }
    }
}

/// `GITSTATE_LOCK_PROOF_MS` over a range of values: every whole number of milliseconds from 0 to
/// 5000 is taken as set (with or without `GITSTATE_SINGLE_FRONT`), anything else is refused
/// naming the variable; unset, the window is 5 s for a single front and 2 s elsewhere.
#[test]
fn lock_proof_window_is_bounded_and_refused_loudly() {
    let read = |value: Option<&str>, single: bool| {
        let mut vars = vec![(
            "GITSTATE_SINGLE_FRONT",
            if single { "true" } else { "false" },
        )];
        vars.extend(value.map(|v| ("GITSTATE_LOCK_PROOF_MS", v)));
        settings(Runtime::Local, &vars).map(|s| s.git.proof_window())
    };
    assert_eq!(read(None, false).ok(), Some(Duration::from_secs(2)));
    assert_eq!(read(None, true).ok(), Some(Duration::from_secs(5)));
    // (Blank is unset, and values are trimmed, as for every setting.)
    assert_eq!(read(Some(" "), false).ok(), Some(Duration::from_secs(2)));
    assert_eq!(
        read(Some(" 7 "), false).ok(),
        Some(Duration::from_millis(7))
    );
    let mut accepted: Vec<String> = (0..=5000).step_by(7).map(|n| n.to_string()).collect();
    accepted.extend(["0", "5000", "0042"].map(str::to_owned));
    for value in &accepted {
        let want = Duration::from_millis(value.parse().expect("a number"));
        for single in [false, true] {
            assert_eq!(read(Some(value), single).ok(), Some(want), "{value}");
        }
    }
    let mut refused: Vec<String> = (5001..6000).step_by(97).map(|n| n.to_string()).collect();
    refused.extend(["-1", "1.5", "2s", "true", "0x10", "99999999999999999999"].map(str::to_owned));
    for value in &refused {
        match read(Some(value), false) {
            Err(error) => assert!(
                error.to_string().contains("GITSTATE_LOCK_PROOF_MS"),
                "{value:?}: {error}"
            ),
            Ok(window) => panic!("{value:?} taken as {window:?}"),
        }
    }
}
