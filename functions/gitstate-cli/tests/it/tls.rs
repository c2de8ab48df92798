//! `gitstate serve --tls-cert/--tls-key [--tls-client-ca]` with a CA made by `openssl` here:
//! `curl` and Terraform trust it, client certificates are required when asked and others
//! refused; a non-loopback address without TLS needs `--insecure-listen`; the access log.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use gitstate_tests::{TEST_PASSWORD, TEST_USER, access_file};
use tokio::io::{AsyncBufReadExt, BufReader};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl is installed (Debian package openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA `name` (name.pem, name.key) and a leaf `leaf` signed by it with `extensions`.
fn ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
        ],
    );
}

fn leaf(dir: &Path, ca: &str, leaf: &str, extensions: &str) {
    std::fs::write(dir.join(format!("{leaf}.ext")), extensions).expect("ext");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{leaf}.key"),
            "-out",
            &format!("{leaf}.csr"),
            "-subj",
            &format!("/CN={leaf}"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{leaf}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &format!("{leaf}.pem"),
            "-days",
            "2",
            "-extfile",
            &format!("{leaf}.ext"),
        ],
    );
}

pub(crate) struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        ca(d, "ca");
        ca(d, "rogue");
        leaf(
            d,
            "ca",
            "server",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        );
        leaf(d, "ca", "client", "extendedKeyUsage=clientAuth\n");
        leaf(d, "rogue", "stranger", "extendedKeyUsage=clientAuth\n");
        Self { dir }
    }

    pub(crate) fn path(&self, file: &str) -> String {
        self.dir.path().join(file).display().to_string()
    }

    pub(crate) fn pem(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(file)).expect("pem")
    }
}

struct Served {
    base: String,
    _child: tokio::process::Child,
    work: tempfile::TempDir,
    stderr: PathBuf,
}

async fn serve(args: &[&str]) -> Served {
    let work = tempfile::tempdir().expect("tempdir");
    let stderr = work.path().join("serve.log");
    let mut child = tokio::process::Command::new(crate::GITSTATE)
        .arg("serve")
        .args(args)
        .current_dir(work.path())
        .env("GITSTATE_LISTEN", "127.0.0.1:0")
        .env(
            "GITSTATE_ACCESS",
            access_file(&[(TEST_USER, TEST_PASSWORD, &["admin:*"])]),
        )
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).expect("log"))
        .kill_on_drop(true)
        .spawn()
        .expect("serve starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let base = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("stdout") {
            if let Some((_, address)) = line.rsplit_once(" on ") {
                return address.trim().to_owned();
            }
        }
        panic!("serve ended before listening");
    })
    .await
    .expect("serve listens");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Served {
        base,
        _child: child,
        work,
        stderr,
    }
}

fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "20",
        ])
        .args(args)
        .output()
        .expect("curl is installed (Debian package curl)")
}

fn code(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// init + apply of a one-resource configuration through `base`; `env` adds TF_HTTP_* settings.
fn terraform(work: &Path, base: &str, env: &[(&str, String)]) -> (bool, String) {
    std::fs::write(
        work.join("main.tf"),
        gitstate_tests::terraform_backend_block(base, "tls/app.tfstate", "")
            + "resource \"terraform_data\" \"x\" {\n  input = \"tls\"\n}\n",
    )
    .expect("main.tf");
    std::fs::write(work.join("empty.tfrc"), "").expect("tfrc");
    let mut all = String::new();
    for args in [
        &["init", "-input=false", "-reconfigure"][..],
        &["apply", "-auto-approve", "-input=false"][..],
    ] {
        let out = Command::new("terraform")
            .args(args)
            .current_dir(work)
            .env("TF_CLI_CONFIG_FILE", work.join("empty.tfrc"))
            .env("CHECKPOINT_DISABLE", "1")
            .env("TF_HTTP_USERNAME", TEST_USER)
            .env("TF_HTTP_PASSWORD", TEST_PASSWORD)
            .env("TF_HTTP_RETRY_MAX", "0")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .expect("terraform is on PATH");
        all += &String::from_utf8_lossy(&out.stdout);
        all += &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            return (false, all);
        }
    }
    (true, all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_the_test_ca_for_curl_and_terraform() {
    let pki = Pki::new();
    let served = serve(&[
        "--tls-cert",
        &pki.path("server.pem"),
        "--tls-key",
        &pki.path("server.key"),
        "--access-log",
    ])
    .await;
    assert!(
        served.base.starts_with("https://127.0.0.1:"),
        "{}",
        served.base
    );
    let health = format!("{}/health", served.base);
    let out = curl(&["--cacert", &pki.path("ca.pem"), &health]);
    assert_eq!(
        code(&out),
        "200",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Not trusted without the CA; a CA that did not issue it does not help.
    for trust in [&[][..], &["--cacert", &pki.path("rogue.pem")][..]] {
        let out = curl(&[trust, &[health.as_str()][..]].concat());
        assert_eq!(out.status.code(), Some(60), "certificate refused: {out:?}");
    }
    // Plain HTTP to the TLS port gets no answer.
    let plain = health.replacen("https://", "http://", 1);
    assert_ne!(code(&curl(&[&plain])), "200");

    let work = tempfile::tempdir().expect("tempdir");
    let (ok, out) = terraform(work.path(), &served.base, &[]);
    assert!(!ok, "Terraform must not trust an unknown CA: {out}");
    assert!(out.contains("certificate"), "{out}");
    let (ok, out) = terraform(
        work.path(),
        &served.base,
        &[("TF_HTTP_CLIENT_CA_CERTIFICATE_PEM", pki.pem("ca.pem"))],
    );
    assert!(ok, "{out}");
    let state = curl(&[
        "--cacert",
        &pki.path("ca.pem"),
        "-u",
        &format!("{TEST_USER}:{TEST_PASSWORD}"),
        &format!("{}/states/tls/app.tfstate", served.base),
    ]);
    assert_eq!(code(&state), "200");

    // The access log: one line per request with method, path, status, user, duration; never
    // the password.
    let log = std::fs::read_to_string(&served.stderr).expect("log");
    let line = log
        .lines()
        .find(|l| l.contains("gitstate::access") && l.contains("/states/tls/app.tfstate"))
        .unwrap_or_else(|| panic!("no access log line in {log}"));
    for field in [
        "method=",
        "path=",
        "status=",
        &format!("user={TEST_USER}"),
        "duration_ms=",
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    assert!(!log.contains(TEST_PASSWORD), "the password is in the log");
    assert!(
        !log.contains('\u{1b}'),
        "ANSI escape codes in a log that is a file"
    );
    drop(served);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_required_and_others_refused() {
    let pki = Pki::new();
    let served = serve(&[
        "--tls-cert",
        &pki.path("server.pem"),
        "--tls-key",
        &pki.path("server.key"),
        "--tls-client-ca",
        &pki.path("ca.pem"),
    ])
    .await;
    let health = format!("{}/health", served.base);
    let ca = pki.path("ca.pem");
    let out = curl(&[
        "--cacert",
        &ca,
        "--cert",
        &pki.path("client.pem"),
        "--key",
        &pki.path("client.key"),
        &health,
    ]);
    assert_eq!(
        code(&out),
        "200",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for who in [
        vec![],
        vec!["--cert", "stranger.pem", "--key", "stranger.key"],
        // The server's own certificate is not a client certificate.
        vec!["--cert", "server.pem", "--key", "server.key"],
    ] {
        let who: Vec<String> = who
            .iter()
            .map(|a| {
                if a.ends_with(".pem") || a.ends_with(".key") {
                    pki.path(a)
                } else {
                    (*a).to_owned()
                }
            })
            .collect();
        let mut args: Vec<&str> = vec!["--cacert", &ca];
        args.extend(who.iter().map(String::as_str));
        args.push(&health);
        let out = curl(&args);
        assert_ne!(code(&out), "200", "{who:?} must be refused");
        assert!(!out.status.success(), "{who:?}");
    }

    let work = tempfile::tempdir().expect("tempdir");
    let trust = ("TF_HTTP_CLIENT_CA_CERTIFICATE_PEM", pki.pem("ca.pem"));
    let (ok, out) = terraform(work.path(), &served.base, std::slice::from_ref(&trust));
    assert!(
        !ok,
        "Terraform without a client certificate is refused: {out}"
    );
    let (ok, out) = terraform(
        work.path(),
        &served.base,
        &[
            trust,
            ("TF_HTTP_CLIENT_CERTIFICATE_PEM", pki.pem("client.pem")),
            ("TF_HTTP_CLIENT_PRIVATE_KEY_PEM", pki.pem("client.key")),
        ],
    );
    assert!(ok, "{out}");
    drop(served.work);
}

/// A non-loopback address without TLS is refused before anything is bound; with
/// `--insecure-listen` it is tried with a warning (192.0.2.1 is TEST-NET-1: the bind itself fails,
/// so nothing ever listens beyond loopback here). Mismatched TLS flags are refused.
#[test]
fn non_loopback_needs_tls_or_insecure_listen() {
    let work = tempfile::tempdir().expect("tempdir");
    let run = |args: &[&str]| {
        let out = Command::new(crate::GITSTATE)
            .arg("serve")
            .args(args)
            .current_dir(work.path())
            .env_remove("GITSTATE_LISTEN")
            .output()
            .expect("gitstate runs");
        assert!(!out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    for listen in ["192.0.2.1:0", "0.0.0.0:0", "[::]:0"] {
        let err = run(&["--listen", listen]);
        assert!(err.contains("is not a loopback address"), "{err}");
        assert!(!work.path().join(".gitstate").exists(), "nothing created");
    }
    let err = run(&["--listen", "192.0.2.1:0", "--insecure-listen"]);
    assert!(err.contains("without TLS (--insecure-listen)"), "{err}");
    assert!(err.contains("binding 192.0.2.1:0"), "{err}");
    assert!(
        !err.contains('\u{1b}'),
        "no colour when stderr is not a terminal"
    );
    let err = run(&["--tls-cert", "x.pem"]);
    assert!(err.contains("go together"), "{err}");
    let err = run(&["--tls-cert", "x.pem", "--tls-key", "x.key"]);
    assert!(err.contains("x.pem"), "{err}");
}

/// `--log-format json`: every line of the log is one JSON object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs() {
    let served = serve(&["--log-format", "json", "--access-log"]).await;
    let out = curl(&[&format!("{}/health", served.base)]);
    assert_eq!(code(&out), "200");
    let out = curl(&[
        "-u",
        "nobody:wrong-password",
        &format!("{}/states/x.tfstate", served.base),
    ]);
    assert_eq!(code(&out), "401");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = std::fs::read_to_string(&served.stderr).expect("log");
    let mut access = 0;
    for line in log.lines() {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if value["target"] == "gitstate::access" {
            access += 1;
            assert!(value["fields"]["status"].is_u64(), "{line}");
        }
    }
    assert_eq!(access, 2, "{log}");
    assert!(!log.contains("wrong-password"));
    let bad = Command::new(crate::GITSTATE)
        .args(["serve", "--log-format", "xml"])
        .current_dir(served.work.path())
        .output()
        .expect("runs");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("neither text nor json"));
}

/// A console form post's same-origin check against the scheme the listener really serves:
/// `https://host` only over TLS, `http://host` only on a plain listener, whatever
/// `X-Forwarded-Proto` the client sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_origin_check_uses_the_listeners_scheme() {
    let pki = Pki::new();
    let tls = serve(&[
        "--tls-cert",
        &pki.path("server.pem"),
        "--tls-key",
        &pki.path("server.key"),
    ])
    .await;
    let plain = serve(&[]).await;
    let post = |base: &str, origin_scheme: &str, claimed: &str| {
        let host = base.split_once("://").expect("a URL").1.to_owned();
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "20", "-w", "\n%{http_code}"])
            .args(["--cacert", &pki.path("ca.pem")])
            .args(["-u", &format!("{TEST_USER}:{TEST_PASSWORD}")])
            .args(["-H", &format!("Origin: {origin_scheme}://{host}")])
            .args(["-H", &format!("X-Forwarded-Proto: {claimed}")])
            .args(["--data", "token=x&lock=l&confirm=yes"])
            .arg(format!("{base}/ui/unlock/app.tfstate"))
            .output()
            .expect("curl is installed (Debian package curl)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for (served, scheme) in [(&tls, "https"), (&plain, "http")] {
        for origin_scheme in ["http", "https"] {
            for claimed in ["http", "https"] {
                let answer = post(&served.base, origin_scheme, claimed);
                assert!(answer.ends_with("\n403"), "{answer}");
                let why = if origin_scheme == scheme {
                    "form token"
                } else {
                    "cross-site"
                };
                assert!(
                    answer.contains(why),
                    "{scheme} listener, Origin {origin_scheme}, claimed {claimed}: {answer}"
                );
            }
        }
    }
}
