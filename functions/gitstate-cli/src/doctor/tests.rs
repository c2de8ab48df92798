use super::config::{Args, read};
use super::rules::{check, guessed_address};
use super::*;

fn env_of(vars: &[(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |name: &str| {
        vars.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| (*v).to_owned())
    }
}

fn codes(findings: &[Finding]) -> Vec<&'static str> {
    findings
        .iter()
        .filter(|f| f.level == Level::Problem)
        .map(|f| f.code)
        .collect()
}

#[test]
fn sources_in_terraforms_order_and_heredocs() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("main.tf"),
        "terraform {\n  backend \"http\" {\n    address = \"http://127.0.0.1:1/states/a.tfstate\"\n    \
         username = \"block\"\n    client_ca_certificate_pem = <<-EOT\n      -----BEGIN X-----\n      \
         abc\n      EOT\n  }\n}\n",
    )
    .expect("main.tf");
    std::fs::write(dir.path().join("b.hcl"), "username = \"file\"\n").expect("b.hcl");
    let env = env_of(&[
        ("TF_HTTP_USERNAME", "env"),
        ("TF_HTTP_PASSWORD", "pw"),
        ("TF_HTTP_LOCK_ADDRESS", "http://127.0.0.1:1/locks/a.tfstate"),
    ]);
    let args = Args::for_tests(dir.path(), &["b.hcl"]);
    let (backend, _) = read(dir.path(), &args, &env).expect("reads");
    let backend = backend.expect("an http backend");
    // -backend-config beats the block, which beats the environment.
    assert_eq!(backend.get("username"), Some("file"));
    assert_eq!(backend.from("username"), "-backend-config b.hcl:1");
    assert_eq!(backend.get("password"), Some("pw"));
    assert_eq!(backend.from("password"), "env TF_HTTP_PASSWORD");
    assert_eq!(backend.get("lock_method"), Some("LOCK"));
    assert_eq!(
        backend.get("client_ca_certificate_pem"),
        Some("-----BEGIN X-----\nabc\n")
    );
    assert_eq!(codes(&check(&backend)), ["no-unlock-address"]);
    let args = Args::for_tests(dir.path(), &["username=pair", "unlock_address=x"]);
    let (backend, _) = read(dir.path(), &args, &env).expect("reads");
    let backend = backend.expect("an http backend");
    assert_eq!(backend.get("username"), Some("pair"));
    assert_eq!(codes(&check(&backend)), ["lock-mismatch"]);
}

#[test]
fn overrides_replace_and_other_backends_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("main.tf"),
        "terraform {\n  backend \"http\" {}\n}\n",
    )
    .expect("main.tf");
    std::fs::write(
        dir.path().join("x_override.tf.json"),
        r#"{"terraform": {"backend": {"s3": {"bucket": "b"}}}}"#,
    )
    .expect("override");
    let (backend, findings) =
        read(dir.path(), &Args::for_tests(dir.path(), &[]), &env_of(&[])).expect("reads");
    assert!(backend.is_none());
    assert_eq!(codes(&findings), ["other-backend"]);
    assert!(
        findings
            .iter()
            .any(|f| f.what.contains("x_override.tf.json:1")),
        "{findings:?}"
    );
    std::fs::remove_file(dir.path().join("x_override.tf.json")).expect("rm");
    std::fs::write(dir.path().join("main.tf"), "resource \"x\" \"y\" {}\n").expect("main.tf");
    let (backend, findings) =
        read(dir.path(), &Args::for_tests(dir.path(), &[]), &env_of(&[])).expect("reads");
    assert!(backend.is_none());
    assert_eq!(codes(&findings), ["no-backend"]);
}

#[test]
fn addresses_that_name_no_state_get_a_guess() {
    let guess = |a: &str| guessed_address(&reqwest::Url::parse(a).expect("url"));
    assert_eq!(
        guess("http://h:1/state/team/a.tfstate"),
        "http://h:1/states/team/a.tfstate"
    );
    assert_eq!(guess("http://h:1/a.tfstate"), "http://h:1/states/a.tfstate");
    assert_eq!(
        guess("http://h:1/states"),
        "http://h:1/states/<name>.tfstate"
    );
    assert_eq!(
        guess("http://h:1/?type=git&state=x/y.tfstate"),
        "http://h:1/states/x/y.tfstate"
    );
}

/// The seed format's `repository=`: each of git's SSH spellings (with `+` escaped) and https
/// pass; an unescaped `+`, a scheme gitstate does not serve and an SSH password are
/// `repository-url`, whose text never repeats the password.
#[test]
fn the_seed_formats_repository_is_one_gitstate_serves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        ("https://h.example/o/r.git", true),
        ("ssh://git@h.example:2222/o/r.git", true),
        ("git%2Bssh://git@h.example/~alice/r.git", true),
        ("ssh%2Bgit://git@%5B::1%5D:22/o/r.git", true),
        ("git@h.example:o/r.git", true),
        ("git+ssh://git@h.example/o/r.git", false),
        ("ssh+git://h.example/o/r.git", false),
        ("git://h.example/o/r.git", false),
        ("file:///srv/r.git", false),
        ("/srv/r.git", false),
        ("git%2Bssh://git:pw-31@h.example/o/r.git", false),
    ];
    for (repository, served) in cases {
        let address = format!("http://127.0.0.1:1/?type=git&repository={repository}&state=a.json");
        std::fs::write(
            dir.path().join("main.tf"),
            format!(
                "terraform {{\n  backend \"http\" {{\n    address = \"{address}\"\n    \
                 lock_address = \"{address}\"\n    unlock_address = \"{address}\"\n  }}\n}}\n"
            ),
        )
        .expect("main.tf");
        let args = Args::for_tests(dir.path(), &[]);
        let (backend, _) = read(dir.path(), &args, &env_of(&[])).expect("reads");
        let findings = check(&backend.expect("an http backend"));
        let flagged: Vec<&Finding> = findings
            .iter()
            .filter(|f| f.code == "repository-url")
            .collect();
        assert_eq!(flagged.is_empty(), served, "{repository}: {flagged:?}");
        for finding in flagged {
            assert!(!finding.what.contains("pw-31"), "{}", finding.what);
            assert!(
                finding.fix.as_deref().is_some_and(|f| f.contains("%2B")),
                "{finding:?}"
            );
        }
    }
}
