//! Encryption at rest against a real KMS API (moto on loopback), the real git server, real
//! Terraform, and the stock Go sops 3.11 as the independent reader.

use std::path::Path;
use std::sync::Arc;

use gitstate_core::access::Caller;
use gitstate_core::service::Rekeyed;
use gitstate_core::{ReadContext, StateName};
use gitstate_sops::Envelope;
use gitstate_tests::{
    Client, GitServer, Moto, TestBackend, commit_file, encrypted_app, init_tracing,
    realistic_state, settings_for, sops311, state_json, stored_file,
};

const SECRET: &str = "hunter2-very-secret-db-password";

fn state_with_secret(lineage: &str, serial: u64) -> String {
    format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":{serial},"lineage":"{lineage}","outputs":{{"db":{{"value":"{SECRET}","type":"string","sensitive":true}}}},"resources":[]}}"#
    )
}

struct Setup {
    moto: Moto,
    server: GitServer,
    url: String,
}

async fn setup() -> Setup {
    init_tracing();
    let moto = Moto::start().await;
    let server = GitServer::start().await;
    let url = server.create_repo("infra");
    Setup { moto, server, url }
}

impl Setup {
    async fn backend(&self, kms: Arc<gitstate_kms::Kms>, extra: &[(&str, &str)]) -> TestBackend {
        let cache = tempfile::tempdir().expect("tempdir");
        let settings = settings_for(&self.url, cache.path(), extra);
        TestBackend::serve(encrypted_app(&settings, kms).await, cache).await
    }

    fn stored(&self, name: &str) -> Vec<u8> {
        stored_file(&self.server, "infra", name)
    }

    fn stored_json(&self, name: &str) -> serde_json::Value {
        serde_json::from_slice(&self.stored(name)).expect("stored file is JSON")
    }
}

fn arns(doc: &serde_json::Value) -> Vec<String> {
    doc["sops"]["kms"]
        .as_array()
        .expect("kms entries")
        .iter()
        .map(|e| e["arn"].as_str().expect("arn").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn round_trip_two_keys_either_decrypts_and_no_plaintext_in_git() {
    let s = setup().await;
    let main_key = s.moto.create_key("tfstate").await;
    let glass_key = s.moto.create_key("break-glass").await;
    let kms = s.moto.kms().await;
    let keys = format!("alias/tfstate,{glass_key}");
    let backend = s
        .backend(kms.clone(), &[("GITSTATE_KMS_KEY_IDS", &keys)])
        .await;
    let client = Client::new(&backend.url);
    let body = state_with_secret("L1", 1);

    // WHEN a state is written and read back through the API
    client.write("app/prod.tfstate", &body).await.expect(200);
    let got = client.send("GET", "/states/app/prod.tfstate", None).await;
    // THEN it comes back byte-exact
    assert_eq!((got.status, got.body.as_str()), (200, body.as_str()));

    // AND git holds sops binary mode with no fragment of the state
    let stored = s.stored("app/prod.tfstate");
    let text = String::from_utf8(stored.clone()).expect("utf-8");
    assert!(
        !text.contains(SECRET) && !text.contains("\"L1\"") && !text.contains("terraform_version"),
        "{text}"
    );
    let doc: serde_json::Value = serde_json::from_str(&text).expect("json");
    let top: Vec<&str> = doc
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(top, ["data", "sops"]);
    assert!(
        doc["data"]
            .as_str()
            .expect("data")
            .starts_with("ENC[AES256_GCM,data:")
    );
    assert_eq!(arns(&doc), [main_key.clone(), glass_key.clone()]);
    assert_eq!(
        doc["sops"]["kms"][0]["context"]["gitstate:state"],
        "app/prod.tfstate"
    );
    assert_eq!(
        doc["sops"]["kms"][0]["context"]["gitstate:repository"],
        s.url.trim_end_matches(".git")
    );
    // one GenerateDataKey and one Encrypt for the write; the read hit the cache
    let calls = kms.calls();
    assert_eq!(
        (calls.generate_data_key, calls.encrypt, calls.decrypt),
        (1, 1, 0),
        "{calls:?}"
    );

    // AND either key alone decrypts, with a fresh client (no cache), to exactly the plaintext
    for keep in 0..2 {
        let mut one = doc.clone();
        one["sops"]["kms"]
            .as_array_mut()
            .expect("kms")
            .remove(1 - keep);
        let fresh = Envelope::new(s.moto.kms().await, vec![], None);
        let opened = fresh
            .open(&serde_json::to_vec(&one).expect("json"), None)
            .await
            .expect("one key suffices");
        let opened = gitstate_kms::unpack(opened, 1 << 20).expect("expands");
        assert_eq!(opened.plaintext.as_slice(), body.as_bytes());
        assert_eq!(fresh.keys().calls().decrypt, 1);
    }

    // AND a cold backend decrypts once, then serves from its cache
    let kms2 = s.moto.kms().await;
    let cold = s
        .backend(kms2.clone(), &[("GITSTATE_KMS_KEY_IDS", &keys)])
        .await;
    let cold_client = Client::new(&cold.url);
    for _ in 0..3 {
        assert_eq!(
            cold_client
                .send("GET", "/states/app/prod.tfstate", None)
                .await
                .body,
            body
        );
    }
    assert_eq!(kms2.calls().decrypt, 1);

    // AND the stale-serial rule holds over sealed states
    client
        .write("app/prod.tfstate", &state_with_secret("L1", 3))
        .await
        .expect(200);
    let stale = client
        .write("app/prod.tfstate", &state_with_secret("L1", 2))
        .await
        .expect(409);
    assert!(stale.body.contains("stale"), "{}", stale.body);
    cold_client
        .write("app/prod.tfstate", &state_with_secret("L1", 2))
        .await
        .expect(409);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wrong_context_and_tampering_are_refused() {
    let s = setup().await;
    s.moto.create_key("tfstate").await;
    let backend = s
        .backend(
            s.moto.kms().await,
            &[("GITSTATE_KMS_KEY_IDS", "alias/tfstate")],
        )
        .await;
    let client = Client::new(&backend.url);
    let body = state_with_secret("L", 1);
    client.write("a.tfstate", &body).await.expect(200);
    let doc = s.stored_json("a.tfstate");
    let put = |name: &str, doc: &serde_json::Value| {
        commit_file(
            &s.server,
            "infra",
            name,
            &serde_json::to_vec_pretty(doc).expect("json"),
        );
    };
    // Fresh backends (cold caches) read what was pushed behind their back.
    let read = |name: &'static str| {
        let s = &s;
        async move {
            let b = s
                .backend(
                    s.moto.kms().await,
                    &[("GITSTATE_KMS_KEY_IDS", "alias/tfstate")],
                )
                .await;
            let answer = Client::new(&b.url)
                .send("GET", &format!("/states/{name}"), None)
                .await;
            // a refusal never hands out (part of) the state
            assert!(
                answer.status == 200 || !answer.body.contains(SECRET),
                "{}",
                answer.body
            );
            answer.status
        }
    };

    // copied to another path: the context names a.tfstate
    put("b.tfstate", &doc);
    assert_eq!(read("b.tfstate").await, 500);
    // ... and with the context rewritten to match, KMS itself refuses the blob
    let mut moved = doc.clone();
    moved["sops"]["kms"][0]["context"]["gitstate:state"] = "c.tfstate".into();
    put("c.tfstate", &moved);
    assert_eq!(read("c.tfstate").await, 502);

    let flip = |text: &str| -> String {
        let at = text.find("data:").expect("data:") + 8;
        let mut chars: Vec<char> = text.chars().collect();
        chars[at] = if chars[at] == 'A' { 'B' } else { 'A' };
        chars.into_iter().collect()
    };
    let mut data = doc.clone();
    data["data"] = flip(doc["data"].as_str().expect("data")).into();
    put("a.tfstate", &data);
    assert_eq!(read("a.tfstate").await, 500, "tampered data");
    let mut mac = doc.clone();
    mac["sops"]["mac"] = flip(doc["sops"]["mac"].as_str().expect("mac")).into();
    put("a.tfstate", &mac);
    assert_eq!(read("a.tfstate").await, 500, "tampered mac");
    let mut enc = doc.clone();
    let blob = doc["sops"]["kms"][0]["enc"].as_str().expect("enc");
    enc["sops"]["kms"][0]["enc"] = format!("AAAA{}", &blob[4..]).into();
    put("a.tfstate", &enc);
    assert_eq!(read("a.tfstate").await, 502, "tampered enc");
    put("a.tfstate", &doc);
    assert_eq!(read("a.tfstate").await, 200, "restored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migration_enforcement_rotation_and_rekey() {
    let s = setup().await;
    let old_key = s.moto.create_key("old").await;
    let new_key = s.moto.create_key("new").await;
    // GIVEN plaintext states written before encryption was configured
    let plain = TestBackend::start(&s.url, &[]).await;
    let plain_client = Client::new(&plain.url);
    for name in ["net/a.tfstate", "net/b.tfstate", "other/c.tfstate"] {
        plain_client
            .write(name, &state_with_secret(name, 1))
            .await
            .expect(200);
    }
    assert!(
        String::from_utf8(s.stored("net/a.tfstate"))
            .expect("utf-8")
            .contains(SECRET)
    );

    // WHEN encryption is configured (optional): plaintext is still served, the next write seals
    let optional = s
        .backend(s.moto.kms().await, &[("GITSTATE_KMS_KEY_IDS", "alias/old")])
        .await;
    let client = Client::new(&optional.url);
    assert_eq!(
        client.send("GET", "/states/net/a.tfstate", None).await.body,
        state_with_secret("net/a.tfstate", 1)
    );
    client
        .write("net/a.tfstate", &state_with_secret("net/a.tfstate", 2))
        .await
        .expect(200);
    assert_eq!(arns(&s.stored_json("net/a.tfstate")), [old_key.as_str()]);
    assert!(
        !String::from_utf8(s.stored("net/a.tfstate"))
            .expect("utf-8")
            .contains(SECRET)
    );

    // AND enforced mode refuses the remaining plaintext state, naming rekey, but serves the sealed one
    let enforced_vars = [
        ("GITSTATE_KMS_KEY_IDS", "alias/old"),
        ("GITSTATE_ENCRYPTION", "enforced"),
    ];
    let enforced = s.backend(s.moto.kms().await, &enforced_vars).await;
    let strict = Client::new(&enforced.url);
    let refused = strict.get_state("net/b.tfstate").await.expect(409);
    assert!(
        refused.body.contains("gitstate rekey") && !refused.body.contains(SECRET),
        "{}",
        refused.body
    );
    strict
        .write("net/b.tfstate", &state_with_secret("net/b.tfstate", 2))
        .await
        .expect(409);
    strict.get_state("net/a.tfstate").await.expect(200);

    // WHEN the keys rotate to the new key alone, a state under the old key names no key of the
    // deployment: refused, never unwrapped with the key the file names
    let new_only = s
        .backend(
            s.moto.kms().await,
            &[
                ("GITSTATE_KMS_KEY_IDS", "alias/new"),
                ("GITSTATE_ENCRYPTION", "enforced"),
            ],
        )
        .await;
    assert_eq!(
        Client::new(&new_only.url)
            .send("GET", "/states/net/a.tfstate", None)
            .await
            .status,
        500,
        "old key only, and the old key is not configured"
    );
    // AND with the old key as a previous key it still reads (in enforced mode too), until rekey
    let rotated_vars = [
        ("GITSTATE_KMS_KEY_IDS", "alias/new"),
        ("GITSTATE_KMS_PREVIOUS_KEY_IDS", "alias/old"),
        ("GITSTATE_ENCRYPTION", "enforced"),
    ];
    let rotated = s.backend(s.moto.kms().await, &rotated_vars).await;
    let rotated_client = Client::new(&rotated.url);
    let through_old = rotated_client.get_state("net/a.tfstate").await.expect(200);
    assert!(through_old.body.contains(SECRET));

    // AND rekey of net/ (as `gitstate rekey --prefix net/` does) rewrites both under the new key
    let cache = tempfile::tempdir().expect("tempdir");
    let settings = settings_for(&s.url, cache.path(), &rotated_vars);
    let kms = s.moto.kms().await;
    let backend = gitstate_app::build_with(settings, Some(kms.clone()))
        .await
        .expect("backend")
        .backend;
    let at = backend.locate(None, None).expect("primary");
    let names = backend
        .store()
        .list_states(&at, "net/")
        .await
        .expect("list");
    let listed: Vec<&str> = names.iter().map(StateName::as_str).collect();
    assert_eq!(listed, ["net/a.tfstate", "net/b.tfstate"]);
    let caller = Caller::operator("rekey-test");
    let mut outcomes = Vec::new();
    for name in &names {
        outcomes.push(
            backend
                .rekey(&caller, &at, name, &ReadContext::no_request())
                .await
                .expect("rekey"),
        );
    }
    assert_eq!(
        outcomes,
        [
            Rekeyed::Rewritten {
                from: "sops binary mode"
            },
            Rekeyed::Rewritten {
                from: "unencrypted"
            }
        ]
    );
    assert_eq!(
        backend
            .rekey(&caller, &at, &names[0], &ReadContext::no_request())
            .await
            .expect("again"),
        Rekeyed::Current
    );
    for name in ["net/a.tfstate", "net/b.tfstate"] {
        assert_eq!(arns(&s.stored_json(name)), [new_key.as_str()]);
        let answer = rotated_client.get_state(name).await.expect(200);
        assert!(answer.body.contains(SECRET));
    }
    // the lock was released, and other/ was left alone
    rotated_client.get_lock("net/a.tfstate").await.expect(409);
    assert!(
        String::from_utf8(s.stored("other/c.tfstate"))
            .expect("utf-8")
            .contains(SECRET)
    );
    // a locked state is not rekeyed under Terraform's feet
    rotated_client
        .lock("net/b.tfstate", "tf-run")
        .await
        .expect(200);
    assert!(
        backend
            .rekey(&caller, &at, &names[1], &ReadContext::no_request())
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tree_mode_and_passphrase_states_are_read() {
    let s = setup().await;
    s.moto.create_key("tfstate").await;
    let plain = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../functions/gitstate-sops/tests/vectors/tfstate-nonull.plain.json"),
    )
    .expect("vector");
    // a tree-mode file (as sops writes it by hand or terraform-backend-git's sops mode does),
    // under a moto key, with the context gitstate expects at that path
    let kms = s.moto.kms().await;
    let tree_under = |context: gitstate_sops::Context| {
        let kms = kms.clone();
        let plain = plain.clone();
        async move {
            gitstate_sops::Seal {
                keys: &kms,
                key_ids: &["alias/tfstate".to_owned()],
                offline: &[],
                threshold: None,
                context: &context,
                now: std::time::SystemTime::now(),
            }
            .tree(&plain)
            .await
            .expect("tree mode")
        }
    };
    let name = |n: &str| StateName::parse(n).expect("name");
    let tree = tree_under(gitstate_kms::context(&s.url, &name("tree.tfstate"))).await;
    commit_file(&s.server, "infra", "tree.tfstate", &tree);
    // the same with a context of its own (that tool's, not gitstate's): a file anyone could
    // copy to any path, so it is refused (migrate it with `gitstate decrypt`)
    let tool_context = [("tool".to_owned(), "terraform-backend-git".to_owned())].into();
    commit_file(
        &s.server,
        "infra",
        "tool.tfstate",
        &tree_under(tool_context).await,
    );
    let aes = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../functions/gitstate-sops/tests/vectors/plumber-aes.tfstate.bin"),
    )
    .expect("vector");
    commit_file(&s.server, "infra", "aes.tfstate", &aes);

    let backend = s
        .backend(
            s.moto.kms().await,
            &[
                ("GITSTATE_KMS_KEY_IDS", "alias/tfstate"),
                ("GITSTATE_PASSPHRASE", "my-passphrase"),
            ],
        )
        .await;
    let client = Client::new(&backend.url);
    let want: serde_json::Value = serde_json::from_slice(&plain).expect("json");
    let tree_read = client.get_state("tree.tfstate").await.expect(200);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&tree_read.body).expect("json"),
        want
    );
    client.get_state("tool.tfstate").await.expect(500);
    let aes_read = client.get_state("aes.tfstate").await.expect(200);
    let aes_state: serde_json::Value = serde_json::from_str(&aes_read.body).expect("json");
    assert_eq!(aes_state["lineage"], "3f1c2a9e-8b7d-4c1e-9f00-1234567890ab");
    // without the passphrase the aes state is an error, never garbage
    let no_pass = s
        .backend(
            s.moto.kms().await,
            &[("GITSTATE_KMS_KEY_IDS", "alias/tfstate")],
        )
        .await;
    assert_eq!(
        Client::new(&no_pass.url)
            .send("GET", "/states/aes.tfstate", None)
            .await
            .status,
        500
    );
    // writing either migrates it to binary mode
    let next = state_json("3f1c2a9e-8b7d-4c1e-9f00-1234567890ab", 18);
    client.write("aes.tfstate", &next).await.expect(200);
    assert!(
        s.stored_json("aes.tfstate")["data"]
            .as_str()
            .expect("binary")
            .starts_with("ENC[")
    );
    assert_eq!(
        client.send("GET", "/states/aes.tfstate", None).await.body,
        next
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sops311_decrypts_a_gitstate_state_and_sizes() {
    let s = setup().await;
    s.moto.create_key("tfstate").await;
    let backend = s
        .backend(
            s.moto.kms().await,
            &[
                ("GITSTATE_KMS_KEY_IDS", "alias/tfstate"),
                ("GITSTATE_MAX_BODY_BYTES", "4000000"),
            ],
        )
        .await;
    let client = Client::new(&backend.url);
    // a state of about 1 MB
    let resources: Vec<String> = (0..2600)
        .map(|i| format!(r#"{{"mode":"managed","type":"terraform_data","name":"r{i}","provider":"provider[\"terraform.io/builtin/terraform\"]","instances":[{{"schema_version":0,"attributes":{{"id":"{i:08}-7d1c-4e55-a1b2-0123456789ab","input":{{"value":"{SECRET}-{i}","type":"string"}},"output":{{"value":"{SECRET}-{i}","type":"string"}},"triggers_replace":null}},"sensitive_attributes":[]}}]}}"#))
        .collect();
    let body = format!(
        r#"{{"version":4,"terraform_version":"1.11.4","serial":1,"lineage":"big","outputs":{{}},"resources":[{}],"check_results":null}}"#,
        resources.join(",")
    );
    client.write("big.tfstate", &body).await.expect(200);
    let stored = s.stored("big.tfstate");
    eprintln!(
        "MEASURE 1 MB state: plaintext {} bytes, stored (compressed, sealed) {} bytes (x{:.3})",
        body.len(),
        stored.len(),
        stored.len() as f64 / body.len() as f64
    );
    assert!(stored.len() < body.len() / 10);
    assert!(!String::from_utf8_lossy(&stored).contains(SECRET));

    // THEN the stock sops 3.11 (an independent implementation) decrypts it, MAC checked, to
    // the gzip stream of exactly the plaintext
    let (_, expanded) = sops_then_gzip(&s.moto, &stored, &["-d"]);
    assert!(
        expanded == body.as_bytes(),
        "sops 3.11 output differs ({} vs {} bytes)",
        expanded.len(),
        body.len()
    );
}

const CONFIG: &str = r#"
variable "secret" {
  type      = string
  sensitive = true
}
variable "round" {
  type    = number
  default = 0
}
resource "terraform_data" "db" {
  input = "${var.secret}-${var.round}"
}
output "round" {
  value = var.round
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terraform_apply_through_an_encrypting_backend() {
    let s = setup().await;
    s.moto.create_key("tfstate").await;
    let kms = s.moto.kms().await;
    let backend = s
        .backend(kms.clone(), &[("GITSTATE_KMS_KEY_IDS", "alias/tfstate")])
        .await;
    let work = tempfile::tempdir().expect("tempdir");
    let base = &backend.url;
    let name = "tf/app.tfstate";
    std::fs::write(
        work.path().join("main.tf"),
        format!(
            "terraform {{\n  backend \"http\" {{\n    address = \"{base}/states/{name}\"\n    lock_address = \"{base}/locks/{name}\"\n    unlock_address = \"{base}/locks/{name}\"\n    lock_method = \"POST\"\n    unlock_method = \"DELETE\"\n  }}\n}}\n{CONFIG}"
        ),
    )
    .expect("config");
    let cli_config = work.path().join("empty.tfrc");
    std::fs::write(&cli_config, "").expect("cli config");
    let run = |args: &[&str]| {
        let out = std::process::Command::new("terraform")
            .args(args)
            .current_dir(work.path())
            .env("TF_CLI_CONFIG_FILE", &cli_config)
            .env("CHECKPOINT_DISABLE", "1")
            .env("TF_HTTP_USERNAME", gitstate_tests::TEST_USER)
            .env("TF_HTTP_PASSWORD", gitstate_tests::TEST_PASSWORD)
            .env("TF_IN_AUTOMATION", "1")
            .env("TF_INPUT", "0")
            .env("TF_VAR_secret", SECRET)
            .output()
            .expect("terraform runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "terraform {args:?} failed:\n{text}");
        text
    };
    run(&["init", "-no-color"]);
    run(&["apply", "-auto-approve", "-no-color", "-var", "round=1"]);
    let after_first = kms.calls();
    run(&["apply", "-auto-approve", "-no-color", "-var", "round=2"]);
    let after_second = kms.calls();
    eprintln!(
        "MEASURE KMS calls: first apply (new state) {after_first:?}; second apply cycle (warm): generate {} encrypt {} decrypt {} describe {}",
        after_second.generate_data_key - after_first.generate_data_key,
        after_second.encrypt - after_first.encrypt,
        after_second.decrypt - after_first.decrypt,
        after_second.describe_key - after_first.describe_key,
    );
    // the state in git is sealed and holds no trace of the secret
    let stored = String::from_utf8(s.stored(name)).expect("utf-8");
    assert!(
        !stored.contains(SECRET) && stored.contains("\"sops\""),
        "{stored}"
    );
    // and Terraform reads it back through a cold backend (one Decrypt)
    let cold_kms = s.moto.kms().await;
    let cold = s
        .backend(
            cold_kms.clone(),
            &[("GITSTATE_KMS_KEY_IDS", "alias/tfstate")],
        )
        .await;
    let text = std::fs::read_to_string(work.path().join("main.tf")).expect("config");
    std::fs::write(
        work.path().join("main.tf"),
        text.replace(base.as_str(), &cold.url),
    )
    .expect("config");
    run(&["init", "-no-color", "-reconfigure"]);
    let plan = run(&["plan", "-no-color", "-detailed-exitcode", "-var", "round=2"]);
    assert!(plan.contains("No changes"), "{plan}");
    let cold_calls = cold_kms.calls();
    eprintln!("MEASURE KMS calls: plan on a cold backend {cold_calls:?}");
    assert_eq!(cold_calls.decrypt, 1, "{cold_calls:?}");
    assert_eq!(cold_calls.generate_data_key, 0);
}

/// The git token of a deployment, stored as a KMS ciphertext (GITSTATE_GIT_TOKEN_KMS) and
/// decrypted the way the Lambda does at cold start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_git_token_decrypts_only_under_its_context() {
    use base64::Engine as _;
    let moto = Moto::start().await;
    let key = moto.create_key("git-token").await;
    let kms = moto.kms().await;
    let token = "ghp_example-git-token-0123456789";
    let encrypt = |context: Option<(&'static str, &'static str)>| {
        let kms = kms.clone();
        let key = key.clone();
        async move {
            let mut request = kms
                .client()
                .encrypt()
                .key_id(key)
                .plaintext(aws_sdk_kms::primitives::Blob::new(token.as_bytes()));
            if let Some((k, v)) = context {
                request = request.encryption_context(k, v);
            }
            let out = request.send().await.expect("Encrypt");
            base64::engine::general_purpose::STANDARD
                .encode(out.ciphertext_blob.expect("blob").into_inner())
        }
    };
    let bound = encrypt(Some(gitstate_kms::GIT_TOKEN_PURPOSE)).await;
    let decrypted = gitstate_kms::decrypt_git_token(&kms, &bound, None)
        .await
        .expect("decrypts");
    assert_eq!(decrypted.expose(), token);

    let unbound = encrypt(None).await;
    let refused = gitstate_kms::decrypt_git_token(&kms, &unbound, None)
        .await
        .expect_err("a ciphertext without the git-token context is refused");
    let message = gitstate_core::report::chain(&refused);
    assert!(message.contains("GITSTATE_GIT_TOKEN_KMS"), "{message}");
    assert!(!message.contains(token));
    assert!(
        gitstate_kms::decrypt_git_token(&kms, "not base64!", None)
            .await
            .is_err()
    );
}

/// History of an encrypted state: listed with serials, old revisions decrypted with the context
/// they were written under, and a restore written encrypted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn history_and_restore_of_encrypted_states() {
    let s = setup().await;
    s.moto.create_key("tfstate").await;
    let kms = s.moto.kms().await;
    let backend = s
        .backend(kms, &[("GITSTATE_KMS_KEY_IDS", "alias/tfstate")])
        .await;
    let c = Client::new(&backend.url);
    let name = "net/hist.tfstate";
    for serial in 1..=2 {
        let body = state_with_secret("H", serial);
        c.write(name, &body).await.expect(200);
    }
    let listed: serde_json::Value =
        serde_json::from_str(&c.send("GET", &format!("/history/{name}"), None).await.body)
            .expect("json");
    let serials: Vec<u64> = listed["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .map(|v| v["serial"].as_u64().expect("serial"))
        .collect();
    assert_eq!(serials, [2, 1]);
    let old = c.send("GET", &format!("/history/{name}?at=1"), None).await;
    assert_eq!(
        (old.status, old.body.as_str()),
        (200, state_with_secret("H", 1).as_str())
    );

    c.restore(name, "1").await.expect(200);
    let stored = String::from_utf8(s.stored(name)).expect("utf-8");
    assert!(
        stored.contains("ENC[AES256_GCM"),
        "the restore is stored encrypted"
    );
    assert!(!stored.contains(SECRET));
    let now: serde_json::Value =
        serde_json::from_str(&c.send("GET", &format!("/states/{name}"), None).await.body)
            .expect("json");
    assert_eq!(now["serial"], 3);
    assert_eq!(now["outputs"]["db"]["value"], SECRET);

    // The list reads serials from the index (written from the commits' trailers, no KMS); the
    // console's state page opens versions to compare them but shows no value.
    let index = String::from_utf8(s.stored(".gitstate/index.json")).expect("utf-8");
    assert!(
        index.contains("\"serial\":3") && !index.contains(SECRET),
        "{index}"
    );
    let list: serde_json::Value =
        serde_json::from_str(&c.send("GET", "/states", None).await.body).expect("json");
    assert_eq!(
        (list[0]["state"].as_str(), list[0]["serial"].as_u64()),
        (Some(name), Some(3))
    );
    let page = c.send("GET", &format!("/ui/states/{name}"), None).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("Serial 3") && page.body.contains("Serial 1"));
    assert!(!page.body.contains(SECRET), "{}", page.body);
}

/// KMS unavailable (the emulator stopped): writes fail closed with a retryable 5xx and write
/// nothing; a process without the data key cached cannot read an encrypted state (5xx, never
/// ciphertext or garbage).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kms_outage_fails_closed() {
    let Setup { moto, server, url } = setup().await;
    moto.create_key("tfstate").await;
    let kms = moto.kms().await;
    let cold_kms = moto.kms().await;
    let keys = [("GITSTATE_KMS_KEY_IDS", "alias/tfstate")];
    let s = Setup {
        moto,
        server,
        url: url.clone(),
    };
    let warm = s.backend(kms, &keys).await;
    let cold = s.backend(cold_kms, &keys).await;
    let c = Client::new(&warm.url);
    let name = "net/outage.tfstate";
    c.write(name, &state_with_secret("O", 1)).await.expect(200);
    let Setup { moto, server, .. } = s;
    drop(moto);
    let refs = || gitstate_tests::git(&["ls-remote", &server.url_with_credentials("infra")], None);
    let before = refs();

    let write = c
        .send(
            "POST",
            &format!("/states/{name}"),
            Some(&state_with_secret("O", 2)),
        )
        .await;
    assert!(
        matches!(write.status, 502 | 503),
        "a write without KMS fails closed: {} {}",
        write.status,
        write.body
    );
    let read = Client::new(&cold.url)
        .send("GET", &format!("/states/{name}"), None)
        .await;
    assert!(
        matches!(read.status, 502 | 503),
        "{} {}",
        read.status,
        read.body
    );
    assert!(!read.body.contains(SECRET) && !read.body.contains("ENC["));
    assert_eq!(refs(), before, "nothing was written");
    let stored = String::from_utf8(stored_file(&server, "infra", name)).expect("utf-8");
    assert!(stored.contains("ENC[AES256_GCM") && !stored.contains(SECRET));
}

/// The break-glass path as docs/operating.md gives it: the stock sops 3.11 decrypts the file to the
/// sealed payload, the machine's stock gzip (`gzip_args`) expands it. Returns (payload, expanded).
fn sops_then_gzip(moto: &Moto, stored: &[u8], gzip_args: &[&str]) -> (Vec<u8>, Vec<u8>) {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("state.tfstate");
    std::fs::write(&file, stored).expect("write");
    let sops = sops311()
        .args(["decrypt", "--input-type", "json", "--output-type", "binary"])
        .arg(&file)
        .envs(moto.env())
        .output()
        .expect("sops runs");
    assert!(
        sops.status.success(),
        "sops 3.11 failed: {}",
        String::from_utf8_lossy(&sops.stderr)
    );
    let mut gzip = std::process::Command::new("gzip")
        .args(gzip_args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("gzip runs");
    gzip.stdin
        .take()
        .expect("stdin")
        .write_all(&sops.stdout)
        .expect("gzip reads");
    let out = gzip.wait_with_output().expect("gzip ends");
    assert!(out.status.success(), "gzip -d failed");
    (sops.stdout, out.stdout)
}

/// States of 0 to 400 resources, some with non-ASCII text, through an encrypting backend: each
/// is sealed as its gzip stream, comes back byte-exact through the API, and opens with the stock
/// sops 3.11 piped into `gzip -d`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compressed_states_round_trip_and_break_glass_with_sops311() {
    let s = setup().await;
    s.moto.create_key("tfstate").await;
    let backend = s
        .backend(
            s.moto.kms().await,
            &[("GITSTATE_KMS_KEY_IDS", "alias/tfstate")],
        )
        .await;
    let client = Client::new(&backend.url);
    for (seed, resources) in [(1_u64, 0_usize), (2, 1), (3, 7), (4, 60), (5, 60), (6, 400)] {
        let mut body = realistic_state(seed, resources, 1);
        if seed % 2 == 0 {
            body = body.replace("platform", "plätform ✓ 🙂 \\\"q\\\"");
        }
        let name = format!("gen/s{seed}.tfstate");
        let path = format!("/states/{name}");
        assert_eq!(client.send("POST", &path, Some(&body)).await.status, 200);
        // THEN it reads back byte-exact, warm and from a cold backend
        let got = client.send("GET", &path, None).await;
        assert_eq!((got.status, got.body.as_str()), (200, body.as_str()));
        let cold = s
            .backend(
                s.moto.kms().await,
                &[("GITSTATE_KMS_KEY_IDS", "alias/tfstate")],
            )
            .await;
        let got = Client::new(&cold.url).send("GET", &path, None).await;
        assert_eq!((got.status, got.body.as_str()), (200, body.as_str()));
        // AND git holds a sops binary-mode file whose payload is the gzip stream of the state
        let stored = s.stored(&name);
        let kms = s.moto.kms().await;
        let opened = Envelope::new(kms, vec![], None)
            .open(&stored, None)
            .await
            .expect("opens");
        assert!(gitstate_sops::compression::is_compressed(&opened.plaintext));
        let state = gitstate_kms::unpack(opened, 6 << 20).expect("expands");
        assert_eq!(state.plaintext.as_slice(), body.as_bytes());
        eprintln!(
            "MEASURE {resources} resources: state {} bytes, stored {} bytes",
            body.len(),
            stored.len()
        );
        if resources >= 60 {
            assert!(
                stored.len() * 4 < body.len(),
                "{} vs {}",
                stored.len(),
                body.len()
            );
        }
        // AND the break-glass path yields the exact state
        if matches!(resources, 0 | 60 | 400) {
            let (payload, expanded) = sops_then_gzip(&s.moto, &stored, &["-d"]);
            assert!(gitstate_sops::compression::is_compressed(&payload));
            assert!(expanded == body.as_bytes(), "break-glass output differs");
        }
    }
}

/// Files sealed before compression (the JSON itself as the payload, as gitstate wrote until
/// now) keep reading; the next write stores the compressed form.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn states_sealed_before_compression_keep_reading() {
    let s = setup().await;
    s.moto.create_key("tfstate").await;
    let body = realistic_state(9, 60, 4);
    let name = StateName::parse("old/prod.tfstate").expect("name");
    // GIVEN a file sealed the old way: the state itself under the location's context
    let old = Envelope::new(s.moto.kms().await, vec!["alias/tfstate".to_owned()], None)
        .seal(body.as_bytes(), &gitstate_kms::context(&s.url, &name))
        .await
        .expect("seals");
    commit_file(&s.server, "infra", name.as_str(), &old);
    let backend = s
        .backend(
            s.moto.kms().await,
            &[("GITSTATE_KMS_KEY_IDS", "alias/tfstate")],
        )
        .await;
    let client = Client::new(&backend.url);
    // THEN it reads byte-exact, and sops 3.11 still yields the JSON itself
    let got = client.send("GET", "/states/old/prod.tfstate", None).await;
    assert_eq!((got.status, got.body.as_str()), (200, body.as_str()));
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("old.json");
    std::fs::write(&file, &old).expect("write");
    let sops = sops311()
        .args(["decrypt", "--input-type", "json", "--output-type", "binary"])
        .arg(&file)
        .envs(s.moto.env())
        .output()
        .expect("sops runs");
    assert!(sops.status.success() && sops.stdout == body.as_bytes());
    // (and the pipe docs/operating.md gives for either kind, `| gzip -dc -f`, passes it through)
    let (_, passed) = sops_then_gzip(&s.moto, &old, &["-dc", "-f"]);
    assert!(passed == body.as_bytes());
    // AND the next write stores it compressed, which reads back byte-exact
    let next = realistic_state(9, 60, 5);
    client.write("old/prod.tfstate", &next).await.expect(200);
    let stored = s.stored(name.as_str());
    assert!(
        stored.len() * 4 < old.len(),
        "{} vs {}",
        stored.len(),
        old.len()
    );
    let (_, expanded) = sops_then_gzip(&s.moto, &stored, &["-dc", "-f"]);
    assert!(expanded == next.as_bytes());
    let got = client.send("GET", "/states/old/prod.tfstate", None).await;
    assert_eq!((got.status, got.body.as_str()), (200, next.as_str()));
}

/// A payload that authenticates (valid GCM tag and MAC) but is not a sound gzip stream, or
/// expands past the maximum state size, is a 500 with a one-line reason: never garbage, never
/// part of the state, and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn corrupted_compressed_payloads_are_a_clear_500() {
    use gitstate_sops::compression::compress;
    let s = setup().await;
    s.moto.create_key("tfstate").await;
    let limit = 1_000_000;
    let body = state_with_secret("L", 1);
    let good = compress(body.as_bytes()).expect("compresses");
    let mut flipped_crc = good.clone();
    let crc_at = good.len() - 8;
    flipped_crc[crc_at] ^= 1;
    let mut trailing = good.clone();
    trailing.extend_from_slice(body.as_bytes());
    let mut garbage = vec![0x1f, 0x8b, 8, 0];
    garbage.extend((0..500_u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    let bombs = [
        // just over the limit: a JSON string of '{'s
        compress(&vec![b'{'; limit + 1]).expect("compresses"),
        compress(&vec![0; 64 << 20]).expect("compresses"),
    ];
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage after the magic", garbage),
        ("truncated", good[..good.len() / 2].to_vec()),
        ("crc flipped", flipped_crc),
        ("bytes after the stream", trailing),
        ("over the maximum state size", bombs[0].clone()),
        ("64 MiB of zeros", bombs[1].clone()),
    ];
    for (i, (what, payload)) in cases.into_iter().enumerate() {
        let name = StateName::parse(&format!("bad/{i}.tfstate")).expect("name");
        let sealed = Envelope::new(s.moto.kms().await, vec!["alias/tfstate".to_owned()], None)
            .seal(&payload, &gitstate_kms::context(&s.url, &name))
            .await
            .expect("seals");
        commit_file(&s.server, "infra", name.as_str(), &sealed);
        let backend = s
            .backend(
                s.moto.kms().await,
                &[
                    ("GITSTATE_KMS_KEY_IDS", "alias/tfstate"),
                    ("GITSTATE_MAX_BODY_BYTES", &limit.to_string()),
                ],
            )
            .await;
        let client = Client::new(&backend.url);
        let path = format!("/states/{}", name.as_str());
        let got = client.send("GET", &path, None).await;
        assert_eq!(got.status, 500, "{what}: {}", got.body);
        assert_eq!(
            got.body.trim_end().lines().count(),
            1,
            "{what}: {}",
            got.body
        );
        assert!(
            !got.body.contains(SECRET) && !got.body.contains('{'),
            "{what}"
        );
        // AND a write over it is refused too, leaving the file as it was
        let write = client
            .send("POST", &path, Some(&state_with_secret("L", 2)))
            .await;
        assert!(
            write.status >= 500,
            "{what}: {} {}",
            write.status,
            write.body
        );
        assert_eq!(s.stored(name.as_str()), sealed, "{what}");
    }
}
