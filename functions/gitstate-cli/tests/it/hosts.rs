//! A git host behind a private CA and an HTTPS proxy, reached by `gitstate serve` processes (the
//! proxy settings come from the process environment, so each configuration is its own process).

use std::path::Path;

use gitstate_tests::hosts::{ConnectProxy, ReverseProxy, TestCa};
use gitstate_tests::process::{ServeProcess, serve_env};
use gitstate_tests::{Client, GitServer, git, state_json};

const NAME: &str = "vpc/prod.tfstate";

async fn serve(root: &Path, label: &str, repository: &str, extra: &[(&str, &str)]) -> ServeProcess {
    let dir = root.join(label);
    std::fs::create_dir_all(&dir).expect("server dir");
    ServeProcess::start(
        Path::new(crate::GITSTATE),
        &dir,
        serve_env(repository, extra),
    )
    .await
}

/// What Terraform does in an apply, then a force-unlock of a lock left behind: every answer as
/// expected, the state stored with `serial`.
async fn flow(server: &ServeProcess, serial: u64) {
    let client = Client::new(&server.url);
    let id = format!("apply-{serial}");
    client
        .apply(NAME, &id, &state_json("private-ca", serial))
        .await;
    client.lock(NAME, "crashed").await.expect(200);
    client.force_unlock(NAME).await.expect(200);
}

/// An HTTPS host whose certificate comes from a CA the test makes: refused without the CA
/// setting (502, a log line naming certificate verification and the host, nothing changed);
/// with `GITSTATE_GIT_CA_FILE`, or `GITSTATE_GIT_CA_PEM` through a CONNECT proxy
/// (`HTTPS_PROXY`), the whole flow works. `SSL_CERT_FILE` stands for the system roots: a host
/// signed by it stays trusted with the CA setting, which adds to the roots rather than replacing
/// them. `NO_PROXY` sends the request around the proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_ca_and_https_proxy() {
    let server = GitServer::start().await;
    server.create_repo("ca");
    let private = TestCa::new("private");
    let system = TestCa::new("system");
    let host = ReverseProxy::tls(server.address, &private.issue("127.0.0.1")).await;
    let system_host = ReverseProxy::tls(server.address, &system.issue("127.0.0.1")).await;
    let url = host.url("ca");
    let root = tempfile::tempdir().expect("tempdir");
    let system_roots = system.pem_path().display().to_string();
    let ca_file = private.pem_path().display().to_string();

    // Without the CA: refused, and the log says why and for which host.
    let untrusting = serve(
        root.path(),
        "no-ca",
        &url,
        &[("SSL_CERT_FILE", &system_roots)],
    )
    .await;
    let refused = Client::new(&untrusting.url).lock(NAME, "nope").await;
    let log = untrusting.log_text();
    assert_eq!(refused.status, 502, "{}\n{log}", refused.body);
    let line = log
        .lines()
        .find(|l| l.contains("certificate verification failed"))
        .unwrap_or_else(|| panic!("no certificate line in the log:\n{log}"));
    assert!(
        line.contains("git host 127.0.0.1") && line.contains("GITSTATE_GIT_CA_FILE"),
        "{line}"
    );
    assert_eq!(host.passed(), 0, "no request got through the handshake");

    // With the CA file: the flow works, and a host signed by the system roots still does.
    let ca_env = [
        ("SSL_CERT_FILE", system_roots.as_str()),
        ("GITSTATE_GIT_CA_FILE", ca_file.as_str()),
    ];
    let trusting = serve(root.path(), "ca-file", &url, &ca_env).await;
    flow(&trusting, 1).await;
    assert!(host.passed() > 0);
    let via_system = serve(root.path(), "system", &system_host.url("ca"), &ca_env).await;
    flow(&via_system, 2).await;

    // The PEM text (Lambda), flattened to one line as a CloudFormation parameter may carry it,
    // through a CONNECT proxy.
    let proxy = ConnectProxy::start().await;
    let pem = private.pem().replace('\n', " ");
    let proxied = serve(
        root.path(),
        "proxied",
        &url,
        &[
            ("GITSTATE_GIT_CA_PEM", pem.as_str()),
            ("HTTPS_PROXY", proxy.url().as_str()),
        ],
    )
    .await;
    flow(&proxied, 3).await;
    let tunnels = proxy.tunnels();
    let target = format!("127.0.0.1:{}", host.address.port());
    assert!(
        !tunnels.is_empty() && tunnels.iter().all(|t| *t == target),
        "every git request went through CONNECT {target}: {tunnels:?}"
    );

    // NO_PROXY: the same process setup, straight to the host.
    let before = proxy.tunnels().len();
    let bypassing = serve(
        root.path(),
        "no-proxy",
        &url,
        &[
            ("GITSTATE_GIT_CA_PEM", pem.as_str()),
            ("HTTPS_PROXY", proxy.url().as_str()),
            ("NO_PROXY", "127.0.0.1"),
        ],
    )
    .await;
    flow(&bypassing, 4).await;
    assert_eq!(proxy.tunnels().len(), before, "NO_PROXY bypasses the proxy");

    let stored = gitstate_tests::stored_file(&server, "ca", NAME);
    assert_eq!(stored, state_json("private-ca", 4).into_bytes());
    let bare = server.repo_dir("ca");
    git(
        &[
            "--git-dir",
            bare.to_str().expect("utf-8"),
            "fsck",
            "--strict",
        ],
        None,
    );
}
