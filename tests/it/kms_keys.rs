//! Only the deployment's KMS keys unwrap (issue 12): moto with two keys, behind a loopback proxy
//! that records every KMS request the backend makes (its operation and the KeyId it names), the
//! real git server, and files crafted the way someone with push access could craft them.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use gitstate_core::access::Caller;
use gitstate_core::service::Rekeyed;
use gitstate_core::{ReadContext, StateName};
use gitstate_tests::{
    AWS_REGION, Client, GitServer, Moto, TestBackend, capture_logs, captured_logs, commit_file,
    encrypted_app, settings_for, stored_file,
};

const SECRET: &str = "kms-keys-test-secret-4f1d";

fn state(serial: u64) -> String {
    format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"L","outputs":{{"db":{{"value":"{SECRET}","type":"string","sensitive":true}}}},"resources":[]}}"#
    )
}

/// One KMS request: its operation (`Decrypt`, …) and the KeyId it named, if any.
type Seen = (String, Option<String>);

/// A recording HTTP proxy on loopback in front of moto.
struct KmsProxy {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    _task: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct Forward {
    upstream: String,
    http: reqwest::Client,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn forward(
    State(f): State<Forward>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let operation = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .map(|t| t.rsplit('.').next().unwrap_or(t).to_owned())
        .unwrap_or_default();
    let key = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|b| b["KeyId"].as_str().map(str::to_owned));
    f.seen.lock().expect("seen").push((operation, key));
    let mut request = f.http.request(
        method,
        format!(
            "{}{}",
            f.upstream,
            uri.path_and_query().map_or("/", |p| p.as_str())
        ),
    );
    for (name, value) in &headers {
        if name != "host" && name != "content-length" {
            request = request.header(name, value);
        }
    }
    let answer = request.body(body).send().await.expect("moto answers");
    let status = StatusCode::from_u16(answer.status().as_u16()).expect("status");
    let mut out = HeaderMap::new();
    for (name, value) in answer.headers() {
        if !matches!(
            name.as_str(),
            "content-length" | "transfer-encoding" | "connection"
        ) {
            out.insert(name.clone(), value.clone());
        }
    }
    let bytes = answer.bytes().await.expect("moto body");
    (status, out, bytes).into_response()
}

impl KmsProxy {
    async fn start(upstream: &str) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new().fallback(forward).with_state(Forward {
            upstream: upstream.to_owned(),
            http: reqwest::Client::new(),
            seen: seen.clone(),
        });
        let (address, task) = gitstate_tests::serve_on_loopback(app).await;
        Self {
            url: format!("http://{address}"),
            seen,
            _task: task,
        }
    }

    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.seen.lock().expect("seen"))
    }

    /// A KMS client (fresh cache) whose every request passes this proxy.
    async fn kms(&self) -> Arc<gitstate_kms::Kms> {
        let loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .endpoint_url(&self.url)
            .region(aws_config::Region::new(AWS_REGION))
            .credentials_provider(aws_sdk_kms::config::Credentials::new(
                "testing", "testing", None, None, "moto",
            ));
        Arc::new(gitstate_kms::Kms::load(loader).await)
    }
}

struct Setup {
    moto: Moto,
    server: GitServer,
    url: String,
    proxy: KmsProxy,
    a: String,
    b: String,
}

async fn setup() -> Setup {
    capture_logs();
    let moto = Moto::start().await;
    let server = GitServer::start().await;
    let url = server.create_repo("infra");
    let proxy = KmsProxy::start(&moto.endpoint).await;
    let a = moto.create_key("a").await;
    let b = moto.create_key("b").await;
    Setup {
        moto,
        server,
        url,
        proxy,
        a,
        b,
    }
}

impl Setup {
    /// A fresh backend (cold caches) over the recording proxy.
    async fn backend(&self, vars: &[(&str, &str)]) -> TestBackend {
        let cache = tempfile::tempdir().expect("tempdir");
        let settings = settings_for(&self.url, cache.path(), vars);
        TestBackend::serve(
            encrypted_app(&settings, self.proxy.kms().await).await,
            cache,
        )
        .await
    }

    async fn get(&self, vars: &[(&str, &str)], name: &str) -> (u16, String) {
        let backend = self.backend(vars).await;
        let answer = Client::new(&backend.url)
            .send("GET", &format!("/states/{name}"), None)
            .await;
        assert!(
            answer.status == 200 || !answer.body.contains(SECRET),
            "a refusal hands out the state: {}",
            answer.body
        );
        (answer.status, answer.body)
    }

    fn context(&self, name: &str) -> gitstate_sops::Context {
        gitstate_kms::context(&self.url, &StateName::parse(name).expect("name"))
    }

    /// `plaintext` sealed as gitstate seals it, under `keys`, with `context`.
    async fn seal(&self, keys: &[&str], context: &gitstate_sops::Context) -> serde_json::Value {
        let kms = self.moto.kms().await;
        let ids: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
        let sealed = gitstate_sops::Seal {
            keys: &kms,
            key_ids: &ids,
            offline: &[],
            threshold: None,
            context,
            now: std::time::SystemTime::now(),
        }
        .binary(state(1).as_bytes())
        .await
        .expect("seals");
        serde_json::from_slice(&sealed).expect("json")
    }

    fn put(&self, name: &str, doc: &serde_json::Value) {
        commit_file(
            &self.server,
            "infra",
            name,
            &serde_json::to_vec_pretty(doc).expect("json"),
        );
    }

    /// Key `key`'s own wrapping (KMS Encrypt) of `plaintext` under `context`, base64.
    async fn wrap(&self, key: &str, plaintext: &[u8], context: &gitstate_sops::Context) -> String {
        let kms = self.moto.kms().await;
        let mut request = kms
            .client()
            .encrypt()
            .key_id(key)
            .plaintext(aws_sdk_kms::primitives::Blob::new(plaintext.to_vec()));
        for (k, v) in context {
            request = request.encryption_context(k, v);
        }
        let out = request.send().await.expect("Encrypt");
        STANDARD.encode(out.ciphertext_blob.expect("blob").into_inner())
    }
}

fn entries(doc: &mut serde_json::Value) -> &mut Vec<serde_json::Value> {
    doc["sops"]["kms"].as_array_mut().expect("kms entries")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_state_under_a_key_the_deployment_lacks_is_refused_without_a_kms_call() {
    let s = setup().await;
    let (a, b) = (s.a.as_str(), s.b.as_str());
    // GIVEN a state sealed under key B, exactly as gitstate seals it at its path
    let doc = s.seal(&[b], &s.context("app/b.tfstate")).await;
    s.put("app/b.tfstate", &doc);

    // WHEN a deployment configured with key A only reads it
    let (status, _) = s.get(&[("GITSTATE_KMS_KEY_IDS", a)], "app/b.tfstate").await;
    // THEN it is a 500, the log says why in one line, and KMS never heard of it
    assert_eq!(status, 500);
    assert!(
        captured_logs().contains("names a configured key (the first names"),
        "the reason is logged"
    );
    assert_eq!(s.proxy.take(), []);
    // AND the state list, the console's list and the state's page stay up around it: the
    // state is listed without a serial, the page without its changes, still with no KMS call
    let backend = s.backend(&[("GITSTATE_KMS_KEY_IDS", a)]).await;
    let client = Client::new(&backend.url);
    for path in ["/states", "/ui/", "/ui/states/app/b.tfstate"] {
        let answer = client.send("GET", path, None).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        assert!(
            answer.body.contains("app/b.tfstate"),
            "{path}: {}",
            answer.body
        );
        assert!(!answer.body.contains(SECRET), "{path}");
    }
    assert_eq!(s.proxy.take(), []);
    // AND in enforced mode too
    let enforced = [
        ("GITSTATE_KMS_KEY_IDS", a),
        ("GITSTATE_ENCRYPTION", "enforced"),
    ];
    assert_eq!(s.get(&enforced, "app/b.tfstate").await.0, 500);
    assert_eq!(s.proxy.take(), []);

    // WHEN the file's entry names key B in another region (sops would call that region), a
    // deployment configured with B itself does not follow it
    let mut moved = s.seal(&[b], &s.context("app/moved.tfstate")).await;
    let elsewhere = b.replace(":us-east-1:", ":eu-west-1:");
    entries(&mut moved)[0]["arn"] = elsewhere.into();
    s.put("app/moved.tfstate", &moved);
    let (status, _) = s
        .get(&[("GITSTATE_KMS_KEY_IDS", b)], "app/moved.tfstate")
        .await;
    assert_eq!(status, 500);
    assert_eq!(s.proxy.take(), []);

    // WHEN B is the current key, or a previous key (by ARN or by bare alias) next to A
    for vars in [
        vec![("GITSTATE_KMS_KEY_IDS", b)],
        vec![
            ("GITSTATE_KMS_KEY_IDS", a),
            ("GITSTATE_KMS_PREVIOUS_KEY_IDS", b),
        ],
        vec![
            ("GITSTATE_KMS_KEY_IDS", a),
            ("GITSTATE_KMS_PREVIOUS_KEY_IDS", "alias/b"),
            ("GITSTATE_ENCRYPTION", "enforced"),
        ],
    ] {
        // THEN it reads, through exactly one Decrypt naming key B's ARN
        let (status, body) = s.get(&vars, "app/b.tfstate").await;
        assert_eq!(
            (status, body.as_str()),
            (200, state(1).as_str()),
            "{vars:?}"
        );
        let decrypts: Vec<Seen> = s
            .proxy
            .take()
            .into_iter()
            .filter(|(op, _)| op != "DescribeKey")
            .collect();
        assert_eq!(decrypts, [("Decrypt".to_owned(), Some(b.to_owned()))]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn enforced_mode_is_not_fooled_by_a_decoy_entry_naming_the_configured_key() {
    let s = setup().await;
    let (a, b) = (s.a.as_str(), s.b.as_str());
    let name = "app/decoy.tfstate";
    let context = s.context(name);
    let real = s.seal(&[b], &context).await;
    let b_blob = entries(&mut real.clone())[0]["enc"].clone();
    let decoy = |enc: serde_json::Value| {
        let mut doc = real.clone();
        let mut entry = entries(&mut doc)[0].clone();
        entry["arn"] = a.into();
        entry["enc"] = enc;
        entries(&mut doc).insert(0, entry);
        doc
    };
    let garbage = STANDARD.encode([0x5au8; 96]);
    let other_key = s.wrap(a, &[0x11u8; 32], &context).await;
    // (what, the status when both keys are current: the decoy stands first, so an entry of A
    // that unwraps to another data key fails the MAC)
    let variants = [
        ("garbage", decoy(garbage.into()), 200),
        (
            "A's wrapping of another data key",
            decoy(other_key.into()),
            500,
        ),
        ("B's blob named as A", decoy(b_blob), 200),
    ];
    let only_a = [
        ("GITSTATE_KMS_KEY_IDS", a),
        ("GITSTATE_ENCRYPTION", "enforced"),
    ];
    for (what, doc, _) in &variants {
        s.put(name, doc);
        // WHEN a deployment enforcing key A reads a state really sealed under B, with a decoy
        let (status, _) = s.get(&only_a, name).await;
        // THEN it is refused (never 200), and only key A was ever asked
        assert!((500..600).contains(&status), "{what}: {status}");
        let seen = s.proxy.take();
        assert!(
            seen.iter()
                .all(|(op, key)| op == "Decrypt" && key.as_deref() == Some(a)),
            "{what}: {seen:?}"
        );
    }

    // WHEN both keys are current, and the decoy stands first
    let both = format!("{a},{b}");
    let vars = [
        ("GITSTATE_KMS_KEY_IDS", both.as_str()),
        ("GITSTATE_ENCRYPTION", "enforced"),
    ];
    let cache = tempfile::tempdir().expect("tempdir");
    let settings = settings_for(&s.url, cache.path(), &vars);
    let backend = gitstate_app::build_with(settings, Some(s.proxy.kms().await))
        .await
        .expect("backend")
        .backend;
    let at = backend.locate(None, None).expect("primary");
    let caller = Caller::operator("kms-keys-test");
    let state_name = StateName::parse(name).expect("name");
    for (what, doc, expected) in &variants {
        s.put(name, doc);
        // THEN it is served through B (or refused), but judged by what unwrapped, never
        // "current": rekey rewrites it with fresh wrappings under both keys
        let (status, body) = s.get(&vars, name).await;
        assert_eq!(status, *expected, "{what}");
        if status != 200 {
            s.proxy.take();
            continue;
        }
        assert_eq!(body, state(1), "{what}");
        let outcome = backend
            .rekey(&caller, &at, &state_name, &ReadContext::no_request())
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            outcome,
            Rekeyed::Rewritten {
                from: "sops binary mode"
            },
            "{what}"
        );
        assert_eq!(
            backend
                .rekey(&caller, &at, &state_name, &ReadContext::no_request())
                .await
                .expect("again"),
            Rekeyed::Current,
            "{what}: the rewritten file is current"
        );
        let rewritten: serde_json::Value =
            serde_json::from_slice(&stored_file(&s.server, "infra", name)).expect("json");
        let arns: Vec<&str> = rewritten["sops"]["kms"]
            .as_array()
            .expect("kms")
            .iter()
            .map(|e| e["arn"].as_str().expect("arn"))
            .collect();
        assert_eq!(arns, [a, b], "{what}");
        s.proxy.take();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_entry_bound_to_another_location_is_refused_without_a_kms_call() {
    let s = setup().await;
    let a = s.a.as_str();
    let name = "app/here.tfstate";
    let other_repository = {
        let mut c = s.context(name);
        c.insert(
            gitstate_kms::CONTEXT_REPOSITORY.to_owned(),
            format!("{}-other", s.url.trim_end_matches(".git")),
        );
        c
    };
    let extra_key = {
        let mut c = s.context(name);
        c.insert("gitstate:extra".to_owned(), "x".to_owned());
        c
    };
    let missing_key = {
        let mut c = s.context(name);
        c.remove(gitstate_kms::CONTEXT_REPOSITORY);
        c
    };
    for (what, context) in [
        ("another path", s.context("app/there.tfstate")),
        ("another repository", other_repository),
        ("an extra context key", extra_key),
        ("a context key missing", missing_key),
        ("no context", gitstate_sops::Context::new()),
    ] {
        // GIVEN a state sealed under the configured key, bound to somewhere else
        let doc = s.seal(&[a], &context).await;
        s.put(name, &doc);
        // WHEN read at this path, THEN it is refused before KMS is asked
        let (status, _) = s.get(&[("GITSTATE_KMS_KEY_IDS", a)], name).await;
        assert_eq!(status, 500, "{what}");
        assert_eq!(s.proxy.take(), [], "{what}");
    }
    // AND sealed for this path, it reads
    s.put(name, &s.seal(&[a], &s.context(name)).await);
    let (status, body) = s.get(&[("GITSTATE_KMS_KEY_IDS", a)], name).await;
    assert_eq!((status, body.as_str()), (200, state(1).as_str()));
}
