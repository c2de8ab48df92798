//! The requests Terraform makes, made once each (no retries), and what their answers mean.

use reqwest::{Method, StatusCode, Url};

use super::rules::guessed_address;
use super::{Backend, Finding, TIMEOUT};

/// Which of Terraform's requests an answer is to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Lock,
    Unlock,
}

/// What came back: status, `Retry-After`, the body; or why nothing did.
type Answer = Result<(StatusCode, Option<String>, String), reqwest::Error>;

/// The read (GET of the address), and with `lock` the lock and its release.
pub async fn run(backend: &Backend, lock: bool) -> Vec<Finding> {
    let Some(address) = backend.get("address").and_then(|a| Url::parse(a).ok()) else {
        return Vec::new();
    };
    let client = match client(backend) {
        Ok(client) => client,
        Err(e) => {
            return vec![Finding::problem(
                "tls",
                format!("the TLS settings cannot be used: {e:#}"),
                "client_ca_certificate_pem, client_certificate_pem and client_private_key_pem \
                 take PEM text (the file's content, not its path)"
                    .to_owned(),
            )];
        }
    };
    let read = send(&client, backend, Method::GET, &address, None).await;
    let mut findings = vec![judge(Op::Read, "GET", &address, &read, backend)];
    let reached = matches!(read, Ok((status, _, _)) if matches!(status.as_u16(), 200 | 204 | 404));
    if reached && let Some(branch) = branch(&client, backend, &address).await {
        let chosen = if address.query_pairs().any(|(key, _)| key == "ref") {
            "the address's ?ref="
        } else {
            "the backend's GITSTATE_REF; add ?ref=BRANCH to the address to choose another"
        };
        findings.push(Finding::note(
            "branch",
            format!("this state is read and written on branch {branch} ({chosen})"),
        ));
    }
    if lock && reached {
        findings.extend(lock_and_release(&client, backend).await);
    }
    findings
}

/// The lock (with a LockInfo of the doctor's own) and, when taken, its release.
async fn lock_and_release(client: &reqwest::Client, backend: &Backend) -> Vec<Finding> {
    let mut findings = Vec::new();
    let (Some(lock_address), Some(unlock_address)) = (
        backend.get("lock_address").and_then(|a| Url::parse(a).ok()),
        backend
            .get("unlock_address")
            .and_then(|a| Url::parse(a).ok()),
    ) else {
        return findings;
    };
    let method = |key: &str, default: &str| {
        Method::from_bytes(backend.get(key).unwrap_or(default).as_bytes()).unwrap_or(Method::POST)
    };
    let (lock_method, unlock_method) = (
        method("lock_method", "LOCK"),
        method("unlock_method", "UNLOCK"),
    );
    let info = lock_info();
    let taken = send(
        client,
        backend,
        lock_method.clone(),
        &lock_address,
        Some(info.clone()),
    )
    .await;
    findings.push(judge(
        Op::Lock,
        lock_method.as_str(),
        &lock_address,
        &taken,
        backend,
    ));
    if matches!(taken, Ok((StatusCode::OK, _, _))) {
        let released = send(
            client,
            backend,
            unlock_method.clone(),
            &unlock_address,
            Some(info),
        )
        .await;
        findings.push(judge(
            Op::Unlock,
            unlock_method.as_str(),
            &unlock_address,
            &released,
            backend,
        ));
    }
    findings
}

/// A client with the backend's TLS settings, as Terraform builds it.
fn client(backend: &Backend) -> anyhow::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .connect_timeout(TIMEOUT);
    if let Some(ca) = backend.get("client_ca_certificate_pem") {
        // Terraform replaces the system's roots with these.
        builder = builder.tls_built_in_root_certs(false);
        for cert in reqwest::Certificate::from_pem_bundle(ca.as_bytes())? {
            builder = builder.add_root_certificate(cert);
        }
    }
    if backend.get("skip_cert_verification") == Some("true") {
        builder = builder.danger_accept_invalid_certs(true);
    }
    if let (Some(cert), Some(key)) = (
        backend.get("client_certificate_pem"),
        backend.get("client_private_key_pem"),
    ) {
        builder = builder.identity(reqwest::Identity::from_pem(
            format!("{cert}\n{key}").as_bytes(),
        )?);
    }
    Ok(builder.build()?)
}

async fn send(
    client: &reqwest::Client,
    backend: &Backend,
    method: Method,
    url: &Url,
    body: Option<String>,
) -> Answer {
    let mut request = client.request(method, url.clone());
    // Terraform sends Basic credentials only when a username is set.
    if let Some(user) = backend.get("username") {
        request = request.basic_auth(user, backend.get("password"));
    }
    if let Some(body) = body {
        request = request
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
    }
    let response = request.send().await?;
    let status = response.status();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response.text().await?;
    Ok((status, retry_after, body))
}

/// The branch the backend serves this state from, as its history route names it
/// (`gitstate-branch`); `None` for an address that is not `…/states/<name>` or an answer without it.
async fn branch(client: &reqwest::Client, backend: &Backend, address: &Url) -> Option<String> {
    let path = address.path();
    let at = path.find("/states/")?;
    let mut history = address.clone();
    history.set_path(&format!(
        "{}/history/{}",
        &path[..at],
        &path[at + "/states/".len()..]
    ));
    history.query_pairs_mut().append_pair("per_page", "1");
    let mut request = client.get(history);
    if let Some(user) = backend.get("username") {
        request = request.basic_auth(user, backend.get("password"));
    }
    let response = request.send().await.ok()?;
    let value = response.headers().get(gitstate_http::BRANCH_HEADER)?;
    value.to_str().ok().map(str::to_owned)
}

/// A LockInfo as Terraform sends it, marked as the doctor's.
fn lock_info() -> String {
    let id = format!(
        "gitstate-doctor-{}-{}",
        std::process::id(),
        jiff::Timestamp::now().as_nanosecond()
    );
    let who = format!(
        "{}@{}",
        std::env::var("USER").unwrap_or_else(|_| "gitstate".to_owned()),
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "localhost".to_owned())
    );
    serde_json::json!({
        "ID": id,
        "Operation": "OperationTypePlan",
        "Info": "gitstate doctor --lock: taken and released at once",
        "Who": who,
        "Version": "",
        "Created": jiff::Timestamp::now().to_string(),
        "Path": "",
    })
    .to_string()
}

/// The backend's one-line reason, at most 300 characters.
fn reason(body: &str) -> String {
    let line = body.lines().next().unwrap_or_default().trim();
    let mut reason: String = line.chars().take(300).collect();
    if reason.is_empty() {
        reason = "(no reason given)".to_owned();
    }
    reason
}

fn judge(op: Op, method: &str, url: &Url, answer: &Answer, backend: &Backend) -> Finding {
    let what = format!("{method} {url}");
    let (status, retry_after, body) = match answer {
        Ok(answer) => answer,
        Err(error) => return transport(&what, url, error),
    };
    let code = status.as_u16();
    let why = reason(body);
    let answered = format!("{what} answered {code}");
    match (op, code) {
        (Op::Read, 200) if body.trim().is_empty() => Finding::note(
            "no-state",
            format!("{answered} with an empty body: Terraform reads it as \"no state yet\""),
        ),
        (Op::Read, 200) => read_state(&answered, body),
        (Op::Read, 204 | 404) => Finding::note(
            "no-state",
            format!(
                "{answered} ({why}): Terraform reads this as \"no state yet\" and plans to create \
                 everything. Right for a new state; if you expected one, check the name and the \
                 branch (`gitstate list`)"
            ),
        ),
        (Op::Lock, 200) => Finding::ok("lock", format!("{answered}: lock taken")),
        (Op::Unlock, 200) => Finding::ok("unlock", format!("{answered}: lock released")),
        (Op::Lock, 409 | 423) => locked(&answered, body),
        (_, 401) => credentials(&answered, &why, backend),
        (_, 403) => forbidden(&answered, &why),
        _ => refused(op, url, *status, retry_after.as_deref(), &answered, &why),
    }
}

/// A 200 to the read: a state, or something else at that address.
fn read_state(answered: &str, body: &str) -> Finding {
    let serial = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["serial"].as_u64());
    match serial {
        Some(serial) => Finding::ok("read", format!("{answered}: a state, serial {serial}")),
        None => Finding::problem(
            "not-a-state",
            format!("{answered}, but the body is not a Terraform state: is this gitstate?"),
            "point address at gitstate's /states/<name>".to_owned(),
        ),
    }
}

/// The lock is held: by whom, and how to free it.
fn locked(answered: &str, body: &str) -> Finding {
    let holder: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let field = |k: &str| holder[k].as_str().unwrap_or("?").to_owned();
    Finding::problem(
        "locked",
        format!(
            "{answered}: the state is locked by {} since {} (lock ID {}, {})",
            field("Who"),
            field("Created"),
            field("ID"),
            field("Operation")
        ),
        format!(
            "wait for that run to finish; if none holds it any more: terraform \
             force-unlock {} (`gitstate locks` lists every lock and its age)",
            field("ID")
        ),
    )
    .says("Error acquiring the state lock")
}

/// 401: the name or the password is wrong (never which).
fn credentials(answered: &str, why: &str, backend: &Backend) -> Finding {
    let user = backend.get("username");
    Finding::problem(
        "credentials",
        format!("{answered}: {why}"),
        match user {
            None => "no username is set: set TF_HTTP_USERNAME and TF_HTTP_PASSWORD to a \
                 gitstate user's name and token"
                .to_owned(),
            Some(user) => format!(
                "the user {user:?} ({}) or its password ({}) is wrong; gitstate does not say \
             which. Check them (username/password, or TF_HTTP_USERNAME and \
             TF_HTTP_PASSWORD); an administrator can issue a new token with `gitstate \
             user add`",
                backend.from("username"),
                backend.from("password"),
            ),
        },
    )
    .says("HTTP remote state endpoint requires auth")
}

/// 403: a grant missing, or a repository or branch the backend does not serve.
fn forbidden(answered: &str, why: &str) -> Finding {
    match grant(why) {
        Some((user, role, state)) => Finding::problem(
            "grant",
            format!("{answered}: {why}"),
            format!(
                "an administrator gives {user} the {role} grant: `{role}:{state}` (or a \
             prefix of it, e.g. `{role}:{}`) in its `grants` in the access file",
                state
                    .rsplit_once('/')
                    .map_or_else(|| "*".to_owned(), |(dir, _)| format!("{dir}/"))
            ),
        )
        .says("HTTP remote state endpoint invalid auth"),
        None => Finding::problem(
            "forbidden",
            format!("{answered}: {why}"),
            "use the repository and branch the backend serves, or add them to its allowlist \
         (GITSTATE_ALLOWED_REPOSITORIES, GITSTATE_ALLOWED_REFS)"
                .to_owned(),
        )
        .says("HTTP remote state endpoint invalid auth"),
    }
}

/// Every other refusal or failure, by status.
fn refused(
    op: Op,
    url: &Url,
    status: StatusCode,
    retry_after: Option<&str>,
    answered: &str,
    why: &str,
) -> Finding {
    let code = status.as_u16();
    match (op, code) {
        (_, 429) => {
            let wait = retry_after.unwrap_or("a few");
            Finding::problem(
                "throttled",
                format!("{answered}: {why}"),
                format!(
                    "wait {wait} s (Retry-After), then retry with the right password: the \
                     backend refuses an address and user after repeated failed logins"
                ),
            )
            .says("Unexpected HTTP response code 429 / giving up after N attempt(s)")
        }
        (_, 428) => Finding::problem(
            "unlocked-writes",
            format!("{answered}: {why}"),
            "set lock_address and unlock_address (see no-lock-address)".to_owned(),
        )
        .says("HTTP error: 428"),
        (_, _) if status.is_client_error() && why.contains("branch") => Finding::problem(
            "missing-branch",
            format!("{answered}: {why}"),
            "point the backend (GITSTATE_REF) or the address (?ref=) at the branch that holds \
             the states; the reason names the remote's default branch, or the branches that \
             hold states"
                .to_owned(),
        )
        .says("Unexpected HTTP response code 4xx"),
        (_, 400) => {
            // A GET carries nothing but the address: its 400 is the address's.
            let path = op == Op::Read;
            Finding::problem(
                if path { "wrong-path" } else { "bad-request" },
                format!("{answered}: {why}"),
                if path {
                    format!("address = \"{}\"", guessed_address(url))
                } else {
                    "correct what the reason names".to_owned()
                },
            )
            .says("Unexpected HTTP response code 400")
        }
        (_, 405) => Finding::problem(
            "bad-method",
            format!("{answered}: {why}"),
            "lock_method = \"POST\", unlock_method = \"DELETE\" (or LOCK and UNLOCK)".to_owned(),
        )
        .says("Unexpected HTTP response code 405"),
        (_, _) if status.is_server_error() => Finding::problem(
            "backend-error",
            format!("{answered}: {why}"),
            "the reason says what to do; the backend's log (gitstate serve's output, or \
             CloudWatch on Lambda) has the details"
                .to_owned(),
        )
        .says(
            "HTTP remote state endpoint internal server error / Unexpected HTTP response code 5xx",
        ),
        (_, _) => Finding::problem(
            "unexpected",
            format!("{answered}: {why}"),
            "Terraform accepts only 200 here: is the address gitstate's?".to_owned(),
        )
        .says("Unexpected HTTP response code N"),
    }
}

/// `user U needs the R grant on S` → (U, R, S).
fn grant(reason: &str) -> Option<(&str, &str, &str)> {
    let rest = reason.strip_prefix("user ")?;
    let (user, rest) = rest.split_once(" needs the ")?;
    let (role, state) = rest.split_once(" grant on ")?;
    Some((user, role, state))
}

/// No answer: refused connection, TLS, a timeout.
fn transport(what: &str, url: &Url, error: &reqwest::Error) -> Finding {
    let host = format!(
        "{}:{}",
        url.host_str().unwrap_or_default(),
        url.port_or_known_default().unwrap_or_default()
    );
    let chain = gitstate_core::report::chain(error);
    if let Some(tls) = cause::<rustls::Error>(error) {
        return tls_finding(what, url, tls, &chain);
    }
    if cause::<std::io::Error>(error)
        .is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
    {
        return Finding::problem(
            "unreachable",
            format!("{what}: nothing listens at {host} (connection refused)"),
            "start the backend: `gitstate serve` (it prints the backend block), or run \
             Terraform through `gitstate run -- terraform …`; or correct the host and port in \
             address"
                .to_owned(),
        )
        .says("connect: connection refused");
    }
    if error.is_timeout() {
        return Finding::problem(
            "unreachable",
            format!("{what}: no answer within {} s", TIMEOUT.as_secs()),
            format!("check that {host} is the backend and that a firewall lets it answer"),
        )
        .says("context deadline exceeded / i/o timeout");
    }
    if url.scheme() == "http"
        && ["closed", "reset", "invalid HTTP"]
            .iter()
            .any(|w| chain.contains(w))
    {
        return Finding::problem(
            "tls",
            format!("{what}: no HTTP answer: the port speaks something else, TLS? ({chain})"),
            format!(
                "if the backend serves TLS, use https:// in address: \"{}\"",
                url.as_str().replacen("http://", "https://", 1)
            ),
        )
        .says("malformed HTTP response \"\\x15\\x03…\" (or EOF)");
    }
    Finding::problem(
        "unreachable",
        format!("{what}: {chain}"),
        format!("check the host and port of address ({host}) and that the backend runs there"),
    )
}

fn tls_finding(what: &str, url: &Url, tls: &rustls::Error, chain: &str) -> Finding {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    let (why, fix) = match tls {
        E::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => (
            "the backend's certificate is not issued by a CA this client trusts".to_owned(),
            "give client_ca_certificate_pem (or TF_HTTP_CLIENT_CA_CERTIFICATE_PEM) the PEM text \
             of the CA that issued the backend's certificate"
                .to_owned(),
        ),
        E::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => (
            "the backend's certificate has expired".to_owned(),
            "renew the certificate given to `gitstate serve --tls-cert` and restart it".to_owned(),
        ),
        E::InvalidCertificate(C::NotValidYet | C::NotValidYetContext { .. }) => (
            "the backend's certificate is not valid yet".to_owned(),
            "check the clocks of both machines, or issue a certificate valid from now".to_owned(),
        ),
        E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => (
            format!(
                "the backend's certificate does not name {}",
                url.host_str().unwrap_or_default()
            ),
            "use the host name the certificate names in address, or issue one for this name"
                .to_owned(),
        ),
        E::InvalidMessage(_) | E::InappropriateMessage { .. } => (
            "the backend does not speak TLS on this port".to_owned(),
            format!(
                "use http:// in address: \"{}\"",
                url.as_str().replacen("https://", "http://", 1)
            ),
        ),
        E::AlertReceived(A::CertificateRequired | A::HandshakeFailure | A::BadCertificate) => (
            "the backend requires a client certificate it trusts".to_owned(),
            "set client_certificate_pem and client_private_key_pem (or TF_HTTP_CLIENT_*_PEM) to a \
             certificate issued by the CA of the backend's --tls-client-ca"
                .to_owned(),
        ),
        other => (
            format!("TLS failed: {other}"),
            "check the backend's certificate and the TLS settings".to_owned(),
        ),
    };
    Finding::problem("tls", format!("{what}: {why} ({chain})"), fix)
        .says("tls: failed to verify certificate: x509: … / remote error: tls: …")
}

/// The first cause of type `T` in `error`'s chain.
fn cause<'a, T: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = next {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        // hyper and the TLS connector nest errors in `io::Error`s, whose `source()` skips the
        // error they wrap: those are opened with `get_ref()`.
        next = match e.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}
