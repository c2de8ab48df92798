//! Key sources beyond KMS, against the real tools: age keys made by the machine's `age-keygen`,
//! files checked both ways with the stock sops 3.11 (`SOPS_AGE_KEY_FILE`), KMS through moto, key
//! groups with a Shamir threshold mixing both; pinning, rotation, rekey, enforced mode, and a
//! copy at another path refused for each source.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gitstate_core::access::Caller;
use gitstate_core::service::Rekeyed;
use gitstate_core::{ReadContext, StateName};
use gitstate_sops::{AgeKeys, Envelope, Error, Offline, PgpKeys};
use gitstate_tests::{
    Client, GitServer, Moto, TestBackend, commit_file, encrypted_app, init_tracing, seal_setting,
    settings_for, sops311, stored_file,
};

use crate::sops_oracle::generated_state;
use gitstate_tests::sops::{break_glass, gpg_key, gpg_key_as, kms_group, sops, sops_encrypt_json};

/// An age identity made by `age-keygen`: its file and its recipient.
struct AgeKey {
    file: PathBuf,
    recipient: String,
}

fn age_key(dir: &Path, name: &str) -> AgeKey {
    let file = dir.join(name);
    let made = std::process::Command::new("age-keygen")
        .arg("-o")
        .arg(&file)
        .output()
        .expect("age-keygen runs (Debian package age)");
    assert!(made.status.success(), "age-keygen failed");
    let public = std::process::Command::new("age-keygen")
        .arg("-y")
        .arg(&file)
        .output()
        .expect("age-keygen -y");
    let recipient = String::from_utf8(public.stdout)
        .expect("utf-8")
        .trim()
        .to_owned();
    assert!(recipient.starts_with("age1"), "{recipient}");
    AgeKey { file, recipient }
}

/// One identity file holding several keys (as a key file after a rotation does).
fn key_file(dir: &Path, name: &str, keys: &[&AgeKey]) -> PathBuf {
    let text: String = keys
        .iter()
        .map(|k| std::fs::read_to_string(&k.file).expect("key file"))
        .collect();
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

struct Setup {
    moto: Moto,
    server: GitServer,
    url: String,
    keys: tempfile::TempDir,
}

async fn setup() -> Setup {
    init_tracing();
    let moto = Moto::start().await;
    let server = GitServer::start().await;
    let url = server.create_repo("infra");
    Setup {
        moto,
        server,
        url,
        keys: tempfile::tempdir().expect("tempdir"),
    }
}

impl Setup {
    async fn backend(&self, vars: &[(&str, &str)]) -> TestBackend {
        let cache = tempfile::tempdir().expect("tempdir");
        let mut vars = vars.to_vec();
        vars.push(("GITSTATE_MAX_BODY_BYTES", "8000000"));
        let settings = settings_for(&self.url, cache.path(), &vars);
        TestBackend::serve(encrypted_app(&settings, self.moto.kms().await).await, cache).await
    }

    fn stored(&self, name: &str) -> Vec<u8> {
        stored_file(&self.server, "infra", name)
    }

    fn stored_json(&self, name: &str) -> serde_json::Value {
        serde_json::from_slice(&self.stored(name)).expect("json")
    }

    /// The binding of a state at `name` as sops's own plaintext member.
    fn binding(&self, name: &str) -> String {
        let context = gitstate_kms::context(&self.url, &StateName::parse(name).expect("name"));
        serde_json::to_string(&context).expect("json")
    }

    /// A state sealed by sops 3.11 itself with the given key groups, as gitstate's binary mode
    /// with its binding: sops tree mode of `{"data": state, "gitstate_binding": location}`.
    fn sops_bound(
        &self,
        state: &str,
        name: &str,
        groups: &str,
        threshold: Option<usize>,
    ) -> Vec<u8> {
        let plain = serde_json::json!({"data": state, "gitstate_binding": self.binding(name)});
        sops_encrypt_json(
            groups,
            threshold,
            plain.to_string().as_bytes(),
            &self.moto.env(),
        )
    }
}

impl Setup {
    /// Open `stored` as a deployment with these age recipients and identities (no KMS key)
    /// would at `name`: the error says why a state is refused, which the API keeps to its log.
    async fn open_with(
        &self,
        recipients: &[&AgeKey],
        identities: &[&AgeKey],
        stored: &[u8],
        name: &str,
    ) -> Result<gitstate_sops::Opened, Error> {
        let text: String = identities
            .iter()
            .map(|k| std::fs::read_to_string(&k.file).expect("key file"))
            .collect();
        let recipients: Vec<String> = recipients.iter().map(|k| k.recipient.clone()).collect();
        let age = Offline::new(
            Arc::new(AgeKeys::parse(&text).expect("identities")),
            &recipients,
            &[],
        )
        .expect("recipients");
        let context = gitstate_kms::context(&self.url, &StateName::parse(name).expect("name"));
        Envelope::new(self.moto.kms().await, vec![], None)
            .with_offline(vec![age])
            .open(stored, Some(&context))
            .await
    }
}

fn age_env(key: &Path) -> Vec<(&'static str, String)> {
    vec![("SOPS_AGE_KEY_FILE", key.display().to_string())]
}

fn age_group(recipients: &[&AgeKey]) -> String {
    let list: String = recipients
        .iter()
        .map(|k| format!("          - {:?}\n", k.recipient))
        .collect();
    format!("      - age:\n{list}")
}

/// Generated states sealed under an age recipient alone open with sops 3.11 and the identity
/// to exactly the state; they name their location, so a copy at another path is refused; a
/// file sops 3.11 wrote with the same binding reads byte-exact, and one without a binding (which
/// any path could hold) is refused; a deployment whose recipients do not include the file's is
/// refused even when it holds the identity (pinning).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn age_states_open_with_sops311_and_copies_are_refused() {
    let s = setup().await;
    let key = age_key(s.keys.path(), "a.txt");
    let other = age_key(s.keys.path(), "b.txt");
    let file = key.file.display().to_string();
    let backend = s
        .backend(&[
            ("GITSTATE_AGE_RECIPIENTS", key.recipient.as_str()),
            ("GITSTATE_AGE_IDENTITY_FILE", file.as_str()),
        ])
        .await;
    let client = Client::new(&backend.url);
    let cases = 10;
    for seed in 200..200 + cases {
        let state = generated_state(seed, true);
        let name = format!("age/s{seed}.tfstate");
        client.write(&name, &state).await.expect(200);
        let doc = s.stored_json(&name);
        let top: Vec<&String> = doc.as_object().expect("object").keys().collect();
        assert_eq!(top, ["data", "gitstate_binding", "sops"]);
        assert_eq!(doc["sops"]["age"][0]["recipient"], key.recipient.as_str());
        assert!(doc["sops"].get("kms").is_none());
        let stored = s.stored(&name);
        assert!(
            break_glass(&stored, &age_env(&key.file)) == state.as_bytes(),
            "seed {seed}: sops 3.11 gives another state"
        );
        let got = client.get_state(&name).await.expect(200);
        assert!(got.body == state, "seed {seed}");
        // a copy at another path opens (the key is the same) but names another location
        let copy = format!("age/copy{seed}.tfstate");
        commit_file(&s.server, "infra", &copy, &stored);
        let refused = client.get_state(&copy).await;
        assert_eq!(refused.status, 500, "seed {seed}: {}", refused.body);
        assert!(
            matches!(
                s.open_with(&[&key], &[&key], &stored, &copy).await,
                Err(Error::ContextMismatch { .. })
            ),
            "seed {seed}"
        );
    }

    // sops 3.11's own file with gitstate's binding reads, and its copy does not
    let state = generated_state(7, true);
    let sealed = s.sops_bound(&state, "age/by-sops.tfstate", &age_group(&[&key]), None);
    commit_file(&s.server, "infra", "age/by-sops.tfstate", &sealed);
    let got = client.get_state("age/by-sops.tfstate").await.expect(200);
    assert!(got.body == state);
    commit_file(&s.server, "infra", "age/by-sops-copy.tfstate", &sealed);
    assert_eq!(
        client.get_state("age/by-sops-copy.tfstate").await.status,
        500
    );
    // sops 3.11's plain binary mode names no location: refused, saying so
    let unbound = sops(
        &[
            "encrypt",
            "--age",
            &key.recipient,
            "--input-type",
            "binary",
            "--output-type",
            "json",
        ],
        state.as_bytes(),
        &[],
    );
    commit_file(&s.server, "infra", "age/unbound.tfstate", &unbound);
    let refused = client.get_state("age/unbound.tfstate").await;
    assert_eq!(refused.status, 500, "{}", refused.body);
    assert!(matches!(
        s.open_with(&[&key], &[&key], &unbound, "age/unbound.tfstate")
            .await,
        Err(Error::Unbound)
    ));

    // pinning: the identity is held, but the configured recipient is another one (whose
    // identity the deployment holds too, or it would not start)
    let both = key_file(s.keys.path(), "pinned.txt", &[&key, &other]);
    let both = both.display().to_string();
    let pinned = s
        .backend(&[
            ("GITSTATE_AGE_RECIPIENTS", other.recipient.as_str()),
            ("GITSTATE_AGE_IDENTITY_FILE", both.as_str()),
        ])
        .await;
    let refused = Client::new(&pinned.url).get_state("age/s200.tfstate").await;
    assert_eq!(refused.status, 500, "{}", refused.body);
    assert!(matches!(
        s.open_with(
            &[&other],
            &[&key],
            &s.stored("age/s200.tfstate"),
            "age/s200.tfstate"
        )
        .await,
        Err(Error::NoConfiguredKey { .. })
    ));
    eprintln!("MEASURE age: {cases} generated states through sops 3.11");
}

/// Rotation under age: the old recipient as a previous one still reads in enforced mode, rekey
/// rewrites the state for the new recipient alone (then it is current), and sops 3.11 opens the
/// result with the new identity only.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn age_rotation_enforced_and_rekey() {
    let s = setup().await;
    let old = age_key(s.keys.path(), "old.txt");
    let new = age_key(s.keys.path(), "new.txt");
    let old_file = old.file.display().to_string();
    let first = s
        .backend(&[
            ("GITSTATE_AGE_RECIPIENTS", old.recipient.as_str()),
            ("GITSTATE_AGE_IDENTITY_FILE", old_file.as_str()),
        ])
        .await;
    let state = generated_state(31, true);
    Client::new(&first.url)
        .write("rot/a.tfstate", &state)
        .await
        .expect(200);

    let both = key_file(s.keys.path(), "both.txt", &[&old, &new]);
    let both = both.display().to_string();
    let rotated_vars = [
        ("GITSTATE_AGE_RECIPIENTS", new.recipient.as_str()),
        ("GITSTATE_AGE_PREVIOUS_RECIPIENTS", old.recipient.as_str()),
        ("GITSTATE_AGE_IDENTITY_FILE", both.as_str()),
        ("GITSTATE_ENCRYPTION", "enforced"),
    ];
    let rotated = s.backend(&rotated_vars).await;
    let client = Client::new(&rotated.url);
    assert!(client.get_state("rot/a.tfstate").await.expect(200).body == state);

    let cache = tempfile::tempdir().expect("tempdir");
    let settings = settings_for(&s.url, cache.path(), &rotated_vars);
    let backend = gitstate_app::build_with(settings, Some(s.moto.kms().await))
        .await
        .expect("backend")
        .backend;
    let at = backend.locate(None, None).expect("primary");
    let name = StateName::parse("rot/a.tfstate").expect("name");
    let caller = Caller::operator("rekey-test");
    assert_eq!(
        backend
            .rekey(&caller, &at, &name, &ReadContext::no_request())
            .await
            .expect("rekey"),
        Rekeyed::Rewritten {
            from: "sops binary mode"
        }
    );
    assert_eq!(
        backend
            .rekey(&caller, &at, &name, &ReadContext::no_request())
            .await
            .expect("again"),
        Rekeyed::Current
    );
    let doc = s.stored_json("rot/a.tfstate");
    assert_eq!(doc["sops"]["age"].as_array().expect("age").len(), 1);
    assert_eq!(doc["sops"]["age"][0]["recipient"], new.recipient.as_str());
    assert!(break_glass(&s.stored("rot/a.tfstate"), &age_env(&new.file)) == state.as_bytes());
    assert!(client.get_state("rot/a.tfstate").await.expect(200).body == state);
    // and the old identity alone no longer opens it, with sops 3.11 either
    let dir = tempfile::tempdir().expect("tempdir");
    let stored = dir.path().join("a.json");
    std::fs::write(&stored, s.stored("rot/a.tfstate")).expect("write");
    let out = sops311()
        .args(["decrypt", "--input-type", "json", "--output-type", "binary"])
        .arg(&stored)
        .envs(age_env(&old.file))
        .output()
        .expect("sops runs");
    assert!(!out.status.success(), "the old identity still opens it");
}

/// Key groups: gitstate seals KMS and age as two groups with a threshold of 2; sops 3.11 opens
/// the file with both and not with KMS alone; gitstate without the age identity cannot open it.
/// One group of both (no threshold) opens with either, in sops 3.11 and in gitstate. Files
/// sops 3.11 writes with three groups and a threshold of 2 open in gitstate with any two, and
/// not with one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn key_groups_with_a_threshold_both_ways_with_sops311() {
    let s = setup().await;
    let arn = s.moto.create_key("tfstate").await;
    let a = age_key(s.keys.path(), "a.txt");
    let b = age_key(s.keys.path(), "b.txt");
    let a_file = a.file.display().to_string();
    let mut both_env = s.moto.env();
    both_env.extend(age_env(&a.file));

    // two groups, both needed
    let split = s
        .backend(&[
            ("GITSTATE_KMS_KEY_IDS", "alias/tfstate"),
            ("GITSTATE_AGE_RECIPIENTS", a.recipient.as_str()),
            ("GITSTATE_AGE_IDENTITY_FILE", a_file.as_str()),
            ("GITSTATE_SOPS_SHAMIR_THRESHOLD", "2"),
        ])
        .await;
    let client = Client::new(&split.url);
    let cases = 6;
    for seed in 300..300 + cases {
        let state = generated_state(seed, true);
        let name = format!("groups/s{seed}.tfstate");
        client.write(&name, &state).await.expect(200);
        let doc = s.stored_json(&name);
        assert_eq!(doc["sops"]["shamir_threshold"], 2);
        let groups = doc["sops"]["key_groups"].as_array().expect("key groups");
        assert_eq!(groups.len(), 2);
        assert!(groups[0]["kms"][0]["arn"] == arn.as_str() && groups[1]["age"].is_array());
        let stored = s.stored(&name);
        assert!(
            break_glass(&stored, &both_env) == state.as_bytes(),
            "seed {seed}"
        );
        assert!(client.get_state(&name).await.expect(200).body == state);
    }
    // a copy of a key-group file at another path is refused (its binding names the first)
    commit_file(
        &s.server,
        "infra",
        "groups/copy.tfstate",
        &s.stored("groups/s300.tfstate"),
    );
    assert_eq!(client.get_state("groups/copy.tfstate").await.status, 500);
    let dir = tempfile::tempdir().expect("tempdir");
    let one = dir.path().join("one.json");
    std::fs::write(&one, s.stored("groups/s300.tfstate")).expect("write");
    let kms_alone = sops311()
        .args(["decrypt", "--input-type", "json", "--output-type", "binary"])
        .arg(&one)
        .envs(s.moto.env())
        .output()
        .expect("sops runs");
    assert!(!kms_alone.status.success(), "one share of two opened it");
    // nor does a deployment holding the KMS share alone: it could not open its own writes, so
    // it does not start (one share of gitstate's reading is refused below, "KMS alone")
    let cache = tempfile::tempdir().expect("tempdir");
    let no_identity = settings_for(
        &s.url,
        cache.path(),
        &[
            ("GITSTATE_KMS_KEY_IDS", "alias/tfstate"),
            ("GITSTATE_AGE_RECIPIENTS", a.recipient.as_str()),
            ("GITSTATE_SOPS_SHAMIR_THRESHOLD", "2"),
        ],
    );
    let refused = gitstate_app::build_with(no_identity, Some(s.moto.kms().await)).await;
    assert!(matches!(
        refused,
        Err(gitstate_app::BuildError::Unopenable(_))
    ));

    // one group of both keys: either opens
    let either = s
        .backend(&[
            ("GITSTATE_KMS_KEY_IDS", "alias/tfstate"),
            ("GITSTATE_AGE_RECIPIENTS", a.recipient.as_str()),
        ])
        .await;
    let state = generated_state(320, true);
    Client::new(&either.url)
        .write("groups/either.tfstate", &state)
        .await
        .expect(200);
    let doc = s.stored_json("groups/either.tfstate");
    assert!(doc["sops"]["kms"].is_array() && doc["sops"]["age"].is_array());
    assert!(doc["sops"].get("key_groups").is_none());
    let stored = s.stored("groups/either.tfstate");
    assert!(break_glass(&stored, &s.moto.env()) == state.as_bytes());
    assert!(break_glass(&stored, &age_env(&a.file)) == state.as_bytes());
    let age_only = s
        .backend(&[("GITSTATE_AGE_IDENTITY_FILE", a_file.as_str())])
        .await;
    assert!(
        Client::new(&age_only.url)
            .get_state("groups/either.tfstate")
            .await
            .expect(200)
            .body
            == state
    );

    // sops 3.11 writes three groups (KMS, age a, age b), any two of which open
    let groups = format!(
        "{}{}{}",
        kms_group(&arn, &s.url, "groups/by-sops.tfstate"),
        age_group(&[&a]),
        age_group(&[&b])
    );
    let state = generated_state(330, true);
    let sealed = s.sops_bound(&state, "groups/by-sops.tfstate", &groups, Some(2));
    let doc: serde_json::Value = serde_json::from_slice(&sealed).expect("json");
    assert_eq!(
        doc["sops"]["key_groups"].as_array().expect("groups").len(),
        3
    );
    commit_file(&s.server, "infra", "groups/by-sops.tfstate", &sealed);
    let ab = key_file(s.keys.path(), "ab.txt", &[&a, &b]);
    let ab = ab.display().to_string();
    let b_file = b.file.display().to_string();
    for (what, vars, opens) in [
        (
            "KMS and a",
            vec![
                ("GITSTATE_KMS_KEY_IDS", "alias/tfstate"),
                ("GITSTATE_AGE_IDENTITY_FILE", a_file.as_str()),
            ],
            true,
        ),
        (
            "a and b",
            vec![("GITSTATE_AGE_IDENTITY_FILE", ab.as_str())],
            true,
        ),
        (
            "b alone",
            vec![("GITSTATE_AGE_IDENTITY_FILE", b_file.as_str())],
            false,
        ),
        (
            "KMS alone",
            vec![("GITSTATE_KMS_KEY_IDS", "alias/tfstate")],
            false,
        ),
    ] {
        let backend = s.backend(&vars).await;
        let got = Client::new(&backend.url)
            .get_state("groups/by-sops.tfstate")
            .await;
        if opens {
            assert!(
                got.status == 200 && got.body == state,
                "{what}: {}",
                got.body
            );
        } else {
            assert!(got.status >= 500, "{what}: {}", got.status);
        }
    }
    eprintln!("MEASURE key groups: {cases} generated states through sops 3.11");
}

/// OpenPGP through rPGP: generated states sealed for a gpg-made key open with sops 3.11 (which
/// runs gpg on that keyring) to exactly the state, copies at other paths are refused, and files
/// sops 3.11 writes for the key (bound, and in a 2-of-2 group with age) read in gitstate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pgp_states_both_ways_with_sops311_and_gpg() {
    let s = setup().await;
    let key = gpg_key("gitstate test <pgp@example.invalid>");
    let public = key.public.display().to_string();
    let secret = key.secret.display().to_string();
    let vars = [
        ("GITSTATE_PGP_FINGERPRINTS", key.fp.as_str()),
        ("GITSTATE_PGP_PUBLIC_KEYS_FILE", public.as_str()),
        ("GITSTATE_PGP_SECRET_KEYS_FILE", secret.as_str()),
    ];
    let backend = s.backend(&vars).await;
    let client = Client::new(&backend.url);
    let gpg_env = vec![("GNUPGHOME", key.home.path().display().to_string())];
    let cases = 6;
    for seed in 400..400 + cases {
        let state = generated_state(seed, true);
        let name = format!("pgp/s{seed}.tfstate");
        client.write(&name, &state).await.expect(200);
        let doc = s.stored_json(&name);
        assert_eq!(doc["sops"]["pgp"][0]["fp"], key.fp.as_str());
        assert!(doc["gitstate_binding"].is_string());
        let stored = s.stored(&name);
        assert!(
            break_glass(&stored, &gpg_env) == state.as_bytes(),
            "seed {seed}: sops 3.11 gives another state"
        );
        assert!(client.get_state(&name).await.expect(200).body == state);
        let copy = format!("pgp/copy{seed}.tfstate");
        commit_file(&s.server, "infra", &copy, &stored);
        assert_eq!(client.get_state(&copy).await.status, 500, "seed {seed}");
    }
    // sops 3.11's own file for the key, with gitstate's binding
    let state = generated_state(420, true);
    let group = format!("      - pgp:\n          - {:?}\n", key.fp);
    let mut env = s.moto.env();
    env.extend(gpg_env.clone());
    let plain =
        serde_json::json!({"data": state, "gitstate_binding": s.binding("pgp/by-sops.tfstate")});
    let sealed = sops_encrypt_json(&group, None, plain.to_string().as_bytes(), &env);
    commit_file(&s.server, "infra", "pgp/by-sops.tfstate", &sealed);
    assert!(
        client
            .get_state("pgp/by-sops.tfstate")
            .await
            .expect(200)
            .body
            == state
    );
    // and a 2-of-2 of an OpenPGP group and an age group, written by sops, opens with both keys
    let age = age_key(s.keys.path(), "a.txt");
    let groups = format!("{group}{}", age_group(&[&age]));
    let plain =
        serde_json::json!({"data": state, "gitstate_binding": s.binding("pgp/groups.tfstate")});
    let sealed = sops_encrypt_json(&groups, Some(2), plain.to_string().as_bytes(), &env);
    commit_file(&s.server, "infra", "pgp/groups.tfstate", &sealed);
    let age_file = age.file.display().to_string();
    let mut both = vars.to_vec();
    both.push(("GITSTATE_AGE_IDENTITY_FILE", age_file.as_str()));
    let with_both = s.backend(&both).await;
    assert!(
        Client::new(&with_both.url)
            .get_state("pgp/groups.tfstate")
            .await
            .expect(200)
            .body
            == state
    );
    assert!(client.get_state("pgp/groups.tfstate").await.status >= 500);
    eprintln!("MEASURE OpenPGP: {cases} generated states through sops 3.11 and gpg");
}

impl Setup {
    /// Settings for this repository with `vars` (and no KMS-sealed setting opened yet).
    fn settings(&self, cache: &Path, vars: &[(&str, &str)]) -> gitstate_app::Settings {
        let mut vars = vars.to_vec();
        vars.push(("GITSTATE_MAX_BODY_BYTES", "8000000"));
        settings_for(&self.url, cache, &vars)
    }

    /// Why a deployment with `vars` does not start (the whole error chain), or `None` when it
    /// does.
    async fn refusal(&self, vars: &[(&str, &str)]) -> Option<String> {
        let cache = tempfile::tempdir().expect("tempdir");
        gitstate_app::build_with(
            self.settings(cache.path(), vars),
            Some(self.moto.kms().await),
        )
        .await
        .err()
        .map(|e| gitstate_core::report::chain(&e))
    }
}

/// Passphrase-protected OpenPGP secret keys (made by `gpg --quick-gen-key` with a passphrase,
/// exported armored): without the passphrase, or with a wrong one, the deployment does not
/// start, and the error names the key and the variable, never the passphrase; with it (from
/// `GITSTATE_PGP_PASSPHRASE_FILE` or `GITSTATE_PGP_PASSPHRASE`), generated states round-trip and
/// open with sops 3.11 through gpg given the same passphrase.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pgp_secret_keys_with_a_passphrase() {
    let s = setup().await;
    let passphrase = "correct horse ✓ battery staple";
    let key = gpg_key_as(
        "locked <locked@example.invalid>",
        "default",
        passphrase,
        "--export-secret-keys",
    );
    let armored = std::fs::read_to_string(&key.secret).expect("secret");
    assert!(armored.starts_with("-----BEGIN PGP PRIVATE KEY BLOCK-----"));
    let public = key.public.display().to_string();
    let secret = key.secret.display().to_string();
    let base = [
        ("GITSTATE_PGP_FINGERPRINTS", key.fp.as_str()),
        ("GITSTATE_PGP_PUBLIC_KEYS_FILE", public.as_str()),
        ("GITSTATE_PGP_SECRET_KEYS_FILE", secret.as_str()),
    ];
    let message = s
        .refusal(&base)
        .await
        .expect("a locked key without a passphrase");
    assert!(
        message.contains("GITSTATE_PGP_SECRET_KEYS_FILE")
            && message.contains(&key.fp)
            && message.contains("GITSTATE_PGP_PASSPHRASE"),
        "{message}"
    );
    for wrong in [
        "",
        "correct horse ✓ battery stapl",
        "Correct horse ✓ battery staple",
    ] {
        let mut vars = base.to_vec();
        vars.push(("GITSTATE_PGP_PASSPHRASE", wrong));
        let message = s.refusal(&vars).await.expect("a wrong passphrase");
        assert!(
            message.contains("GITSTATE_PGP_PASSPHRASE") && message.contains(&key.fp),
            "{message}"
        );
        assert!(!message.contains("horse"), "{message}");
    }
    let file = s.keys.path().join("passphrase.txt");
    std::fs::write(&file, format!("{passphrase}\nsecond line ignored\n")).expect("write");
    let file = file.display().to_string();
    let mut vars = base.to_vec();
    vars.push(("GITSTATE_PGP_PASSPHRASE_FILE", file.as_str()));
    let backend = s.backend(&vars).await;
    let client = Client::new(&backend.url);
    let env = key.sops_env(passphrase);
    let cases = 4;
    for seed in 500..500 + cases {
        let state = generated_state(seed, true);
        let name = format!("locked/s{seed}.tfstate");
        client.write(&name, &state).await.expect(200);
        assert_eq!(
            s.stored_json(&name)["sops"]["pgp"][0]["fp"],
            key.fp.as_str()
        );
        assert!(
            break_glass(&s.stored(&name), &env) == state.as_bytes(),
            "seed {seed}: sops 3.11 gives another state"
        );
        assert!(client.get_state(&name).await.expect(200).body == state);
    }
    // the same passphrase given in the variable opens what the first deployment wrote
    let mut vars = base.to_vec();
    vars.push(("GITSTATE_PGP_PASSPHRASE", passphrase));
    let direct = s.backend(&vars).await;
    let got = Client::new(&direct.url)
        .get_state("locked/s500.tfstate")
        .await
        .expect(200);
    assert!(got.body == generated_state(500, true));
    eprintln!("MEASURE OpenPGP passphrase: {cases} generated states through sops 3.11 and gpg");
}

/// Private keys kept as KMS ciphertexts (`GITSTATE_AGE_IDENTITY_KMS`,
/// `GITSTATE_PGP_SECRET_KEYS_KMS`, through moto), bound like the git token to their purpose and
/// to the team: every combination of the context they were sealed under and the deployment's
/// `GITSTATE_TEAM` starts the deployment exactly when the two agree, and a refusal names the
/// variable and the context expected, never the key. Where it starts, states round-trip and open
/// with sops 3.11. The OpenPGP key is an RSA-3072 key's decryption subkey
/// (`--export-secret-subkeys`, the primary a gpg stub), which is what fits in a KMS ciphertext.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sealed_private_keys_open_only_for_their_purpose_and_team() {
    let s = setup().await;
    let arn = s.moto.create_key("settings").await;
    let kms = s.moto.kms().await;
    let age = age_key(s.keys.path(), "sealed-age.txt");
    let age_text = std::fs::read_to_string(&age.file).expect("identity");
    let pgp = gpg_key_as(
        "sealed <sealed@example.invalid>",
        "default",
        "",
        "--export-secret-subkeys",
    );
    let pgp_text = std::fs::read_to_string(&pgp.secret).expect("secret");
    assert!(pgp_text.len() <= 4096, "{} bytes", pgp_text.len());
    let public = pgp.public.display().to_string();
    let team = gitstate_kms::TEAM_CONTEXT_KEY;
    let age_purpose = gitstate_kms::AGE_IDENTITY_PURPOSE;
    let pgp_purpose = gitstate_kms::PGP_SECRET_KEYS_PURPOSE;

    struct Source<'a> {
        var: &'static str,
        purpose: (&'static str, &'static str),
        other: (&'static str, &'static str),
        plaintext: &'a str,
        vars: Vec<(&'static str, &'a str)>,
        env: Vec<(&'static str, String)>,
        list: &'static str,
    }
    let sources = [
        Source {
            var: "GITSTATE_AGE_IDENTITY_KMS",
            purpose: age_purpose,
            other: pgp_purpose,
            plaintext: &age_text,
            vars: vec![("GITSTATE_AGE_RECIPIENTS", age.recipient.as_str())],
            env: age_env(&age.file),
            list: "age",
        },
        Source {
            var: "GITSTATE_PGP_SECRET_KEYS_KMS",
            purpose: pgp_purpose,
            other: age_purpose,
            plaintext: &pgp_text,
            vars: vec![
                ("GITSTATE_PGP_FINGERPRINTS", pgp.fp.as_str()),
                ("GITSTATE_PGP_PUBLIC_KEYS_FILE", public.as_str()),
            ],
            env: pgp.sops_env(""),
            list: "pgp",
        },
    ];
    let (mut started, mut refused) = (0u64, 0u64);
    for source in &sources {
        // (sealed under purpose, sealed for team, deployment's team): starts?
        let cases: [(bool, Option<&str>, Option<&str>, bool); 7] = [
            (true, Some("blue"), Some("blue"), true),
            (true, Some("blue"), Some("green"), false),
            (true, Some("blue"), None, false),
            (true, None, Some("blue"), false),
            (true, None, None, true),
            (false, Some("blue"), Some("blue"), false),
            (false, None, None, false),
        ];
        for (at, (own_purpose, sealed_for, deployed, starts)) in cases.into_iter().enumerate() {
            let mut context = vec![if own_purpose {
                source.purpose
            } else {
                source.other
            }];
            context.extend(sealed_for.map(|t| (team, t)));
            let ciphertext = seal_setting(&kms, &arn, source.plaintext, &context).await;
            let mut vars = source.vars.clone();
            vars.push((source.var, ciphertext.as_str()));
            vars.extend(deployed.map(|t| ("GITSTATE_TEAM", t)));
            let case = format!(
                "{} case {at}: {context:?} under team {deployed:?}",
                source.var
            );
            match s.refusal(&vars).await {
                Some(message) => {
                    assert!(!starts, "{case}: {message}");
                    refused += 1;
                    assert!(message.contains(source.var), "{case}: {message}");
                    let expected = format!("{}={}", source.purpose.0, source.purpose.1);
                    assert!(message.contains(&expected), "{case}: {message}");
                    if let Some(t) = deployed {
                        assert!(
                            message.contains(&format!("{team}={t}")),
                            "{case}: {message}"
                        );
                    }
                    assert!(
                        !message.contains("SECRET-KEY") && !message.contains("PRIVATE KEY"),
                        "{case}: {message}"
                    );
                }
                None => {
                    assert!(starts, "{case}: started");
                    started += 1;
                    let backend = s.backend(&vars).await;
                    let client = Client::new(&backend.url);
                    let state = generated_state(600 + at as u64, true);
                    let name = format!("sealed/{}-{at}.tfstate", source.list);
                    client.write(&name, &state).await.expect(200);
                    assert!(s.stored_json(&name)["sops"][source.list].is_array());
                    assert!(client.get_state(&name).await.expect(200).body == state);
                    assert!(
                        break_glass(&s.stored(&name), &source.env) == state.as_bytes(),
                        "{case}: sops 3.11 gives another state"
                    );
                }
            }
        }
    }
    assert_eq!((started, refused), (4, 10));
    eprintln!(
        "MEASURE sealed private keys: {started} started, {refused} refused (age and OpenPGP)"
    );
}

/// OpenPGP rotation on its own: the old fingerprint as a previous one still reads in enforced
/// mode, rekey rewrites each state for the new key alone (then it is current), and sops 3.11
/// opens the result with the new key and not with the old. Pinning: a deployment holding both
/// secret keys but configured with the new fingerprint only refuses a state still sealed for the
/// old one, before trying any key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pgp_rotation_enforced_rekey_and_pinning() {
    let s = setup().await;
    let old = gpg_key_as(
        "old <old@example.invalid>",
        "future-default",
        "",
        "--export-secret-keys",
    );
    let new = gpg_key_as(
        "new <new@example.invalid>",
        "future-default",
        "",
        "--export-secret-keys",
    );
    let (old_public, old_secret) = (
        old.public.display().to_string(),
        old.secret.display().to_string(),
    );
    let first = s
        .backend(&[
            ("GITSTATE_PGP_FINGERPRINTS", old.fp.as_str()),
            ("GITSTATE_PGP_PUBLIC_KEYS_FILE", old_public.as_str()),
            ("GITSTATE_PGP_SECRET_KEYS_FILE", old_secret.as_str()),
        ])
        .await;
    let cases = 3;
    let names: Vec<String> = (0..cases).map(|i| format!("rot/p{i}.tfstate")).collect();
    for (i, name) in names.iter().enumerate() {
        Client::new(&first.url)
            .write(name, &generated_state(700 + i as u64, true))
            .await
            .expect(200);
    }
    Client::new(&first.url)
        .write("rot/left.tfstate", &generated_state(799, true))
        .await
        .expect(200);

    // both secret keys in one file, as a key file after a rotation holds them
    let both = s.keys.path().join("both.asc");
    let text = std::fs::read_to_string(&old.secret).expect("old")
        + &std::fs::read_to_string(&new.secret).expect("new");
    std::fs::write(&both, text).expect("write");
    let both = both.display().to_string();
    let new_public = new.public.display().to_string();
    let rotated_vars = [
        ("GITSTATE_PGP_FINGERPRINTS", new.fp.as_str()),
        ("GITSTATE_PGP_PREVIOUS_FINGERPRINTS", old.fp.as_str()),
        ("GITSTATE_PGP_PUBLIC_KEYS_FILE", new_public.as_str()),
        ("GITSTATE_PGP_SECRET_KEYS_FILE", both.as_str()),
        ("GITSTATE_ENCRYPTION", "enforced"),
    ];
    let rotated = s.backend(&rotated_vars).await;
    let client = Client::new(&rotated.url);
    for (i, name) in names.iter().enumerate() {
        let got = client.get_state(name).await.expect(200);
        assert!(got.body == generated_state(700 + i as u64, true), "{name}");
    }

    let cache = tempfile::tempdir().expect("tempdir");
    let backend = gitstate_app::build_with(
        s.settings(cache.path(), &rotated_vars),
        Some(s.moto.kms().await),
    )
    .await
    .expect("backend")
    .backend;
    let at = backend.locate(None, None).expect("primary");
    let caller = Caller::operator("rekey-test");
    for (i, name) in names.iter().enumerate() {
        let state = generated_state(700 + i as u64, true);
        let parsed = StateName::parse(name).expect("name");
        assert_eq!(
            backend
                .rekey(&caller, &at, &parsed, &ReadContext::no_request())
                .await
                .expect("rekey"),
            Rekeyed::Rewritten {
                from: "sops binary mode"
            },
            "{name}"
        );
        assert_eq!(
            backend
                .rekey(&caller, &at, &parsed, &ReadContext::no_request())
                .await
                .expect("again"),
            Rekeyed::Current
        );
        let doc = s.stored_json(name);
        let entries = doc["sops"]["pgp"].as_array().expect("pgp");
        assert_eq!(entries.len(), 1, "{name}");
        assert_eq!(entries[0]["fp"], new.fp.as_str());
        let stored = s.stored(name);
        assert!(
            break_glass(&stored, &new.sops_env("")) == state.as_bytes(),
            "{name}"
        );
        assert!(client.get_state(name).await.expect(200).body == state);
        // and the old key alone no longer opens it, with sops 3.11 either
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("a.json");
        std::fs::write(&file, &stored).expect("write");
        let out = sops311()
            .args(["decrypt", "--input-type", "json", "--output-type", "binary"])
            .arg(&file)
            .envs(old.sops_env(""))
            .output()
            .expect("sops runs");
        assert!(!out.status.success(), "{name}: the old key still opens it");
    }

    // pinning: both secret keys held, only the new fingerprint configured
    let pinned_vars = [
        ("GITSTATE_PGP_FINGERPRINTS", new.fp.as_str()),
        ("GITSTATE_PGP_PUBLIC_KEYS_FILE", new_public.as_str()),
        ("GITSTATE_PGP_SECRET_KEYS_FILE", both.as_str()),
    ];
    let pinned = s.backend(&pinned_vars).await;
    let refused = Client::new(&pinned.url).get_state("rot/left.tfstate").await;
    assert!(refused.status >= 500, "{} {}", refused.status, refused.body);
    let keys = PgpKeys::parse(
        &std::fs::read_to_string(&new.public).expect("public"),
        &std::fs::read_to_string(&both).expect("secret"),
        None,
    )
    .expect("keys");
    assert_eq!(keys.fingerprints(), [old.fp.clone(), new.fp.clone()]);
    let pgp =
        Offline::new(Arc::new(keys), std::slice::from_ref(&new.fp), &[]).expect("fingerprints");
    let context =
        gitstate_kms::context(&s.url, &StateName::parse("rot/left.tfstate").expect("name"));
    let opened = Envelope::new(s.moto.kms().await, vec![], None)
        .with_offline(vec![pgp])
        .open(&s.stored("rot/left.tfstate"), Some(&context))
        .await;
    assert!(
        matches!(opened, Err(Error::NoConfiguredKey { .. })),
        "{opened:?}"
    );
    // the rotated deployment still reads it, in enforced mode, as a previous key
    let got = client.get_state("rot/left.tfstate").await.expect(200);
    assert!(got.body == generated_state(799, true));
    eprintln!("MEASURE OpenPGP rotation: {cases} states rekeyed, 1 refused when pinned");
}

/// What one source of a generated deployment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// The source is not configured.
    Absent,
    /// Its recipients (fingerprints and public keys for OpenPGP), no private side.
    SealOnly,
    /// A private side, but of another key than the one it seals for.
    OtherKey,
    /// The private side of the key it seals for.
    Own,
}

/// Deployments that could not open what they seal do not start: generated over KMS (which always
/// opens), age and OpenPGP each absent, sealing only, holding another key's private side or
/// their own, and no threshold or one of 2 or 3 groups. Before, such a deployment accepted a
/// new state's write (sealed for keys it lacks) and answered 500 on every later read and write of
/// it: Terraform's apply succeeded and every plan after it failed. The refusal names the
/// setting that lacks its private side, never a key; every deployment that starts reads back
/// what it wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_that_cannot_open_what_it_seals_does_not_start() {
    let s = setup().await;
    s.moto.create_key("tfstate").await;
    let age_own = age_key(s.keys.path(), "own.txt");
    let age_other = age_key(s.keys.path(), "other.txt");
    let pgp_own = gpg_key_as(
        "own <own@example.invalid>",
        "future-default",
        "",
        "--export-secret-keys",
    );
    let pgp_other = gpg_key_as(
        "other <other@example.invalid>",
        "future-default",
        "",
        "--export-secret-keys",
    );
    let path = |p: &Path| p.display().to_string();
    let (age_own_file, age_other_file) = (path(&age_own.file), path(&age_other.file));
    let (pgp_public, pgp_own_secret, pgp_other_secret) = (
        path(&pgp_own.public),
        path(&pgp_own.secret),
        path(&pgp_other.secret),
    );
    let (mut started, mut refused) = (0u64, 0u64);
    let helds = [Held::Absent, Held::SealOnly, Held::OtherKey, Held::Own];
    for kms in [false, true] {
        for age in helds {
            for pgp in helds {
                for threshold in [None, Some(2), Some(3)] {
                    let sealing = usize::from(kms)
                        + usize::from(age != Held::Absent)
                        + usize::from(pgp != Held::Absent);
                    if sealing == 0 || threshold.is_some_and(|t| t > sealing) {
                        continue;
                    }
                    let opening = usize::from(kms)
                        + usize::from(age == Held::Own)
                        + usize::from(pgp == Held::Own);
                    let starts = opening >= threshold.unwrap_or(1);
                    let mut vars: Vec<(&str, String)> = Vec::new();
                    if kms {
                        vars.push(("GITSTATE_KMS_KEY_IDS", "alias/tfstate".into()));
                    }
                    if age != Held::Absent {
                        vars.push(("GITSTATE_AGE_RECIPIENTS", age_own.recipient.clone()));
                    }
                    match age {
                        Held::OtherKey => {
                            vars.push(("GITSTATE_AGE_IDENTITY_FILE", age_other_file.clone()))
                        }
                        Held::Own => {
                            vars.push(("GITSTATE_AGE_IDENTITY_FILE", age_own_file.clone()))
                        }
                        Held::Absent | Held::SealOnly => {}
                    }
                    if pgp != Held::Absent {
                        vars.push(("GITSTATE_PGP_FINGERPRINTS", pgp_own.fp.clone()));
                        vars.push(("GITSTATE_PGP_PUBLIC_KEYS_FILE", pgp_public.clone()));
                    }
                    match pgp {
                        Held::OtherKey => {
                            vars.push(("GITSTATE_PGP_SECRET_KEYS_FILE", pgp_other_secret.clone()))
                        }
                        Held::Own => {
                            vars.push(("GITSTATE_PGP_SECRET_KEYS_FILE", pgp_own_secret.clone()))
                        }
                        Held::Absent | Held::SealOnly => {}
                    }
                    if let Some(t) = threshold {
                        vars.push(("GITSTATE_SOPS_SHAMIR_THRESHOLD", t.to_string()));
                    }
                    let what = format!("kms={kms} age={age:?} pgp={pgp:?} threshold={threshold:?}");
                    let cache = tempfile::tempdir().expect("tempdir");
                    let vars: Vec<(&str, &str)> =
                        vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    let settings = settings_for(&s.url, cache.path(), &vars);
                    let built = gitstate_app::build_with(settings, Some(s.moto.kms().await)).await;
                    match built {
                        Ok(app) if starts => {
                            started += 1;
                            let backend = TestBackend::serve(app.router(), cache).await;
                            let client = Client::new(&backend.url);
                            let name = format!("opens/{started}.tfstate");
                            let state = generated_state(started, true);
                            client.write(&name, &state).await.expect(200);
                            let read = client.get_state(&name).await.expect(200);
                            assert!(read.body == state, "{what}: reads back what it wrote");
                        }
                        Err(error) if !starts => {
                            refused += 1;
                            let message = gitstate_core::report::chain(&error);
                            for (held, setting) in [
                                (age, "GITSTATE_AGE_RECIPIENTS"),
                                (pgp, "GITSTATE_PGP_FINGERPRINTS"),
                            ] {
                                let lacks = matches!(held, Held::SealOnly | Held::OtherKey);
                                assert_eq!(message.contains(setting), lacks, "{what}: {message}");
                            }
                            assert!(!message.contains("AGE-SECRET-KEY"), "{what}: {message}");
                        }
                        Ok(_) => panic!("{what}: must not start, it cannot open what it seals"),
                        Err(error) => panic!(
                            "{what}: must start: {}",
                            gitstate_core::report::chain(&error)
                        ),
                    }
                }
            }
        }
    }
    eprintln!("unopenable: {started} deployments started, {refused} refused");
    assert!(started > 0 && refused > 0);
}

/// A backend configured with no keys at all (a wrapper run without the team's key settings),
/// on states sealed in every sops shape this repository can hold: gitstate's own under age, and
/// terraform-backend-git's tree mode made by sops 3.11. Every read of them, current or past, is
/// 500 naming the missing keys, never the ciphertext answered as the state; a write (which would
/// find no serial to compare in the sealed file) and a restore change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backend_without_keys_never_serves_or_overwrites_a_sealed_state() {
    let s = setup().await;
    let key = age_key(s.keys.path(), "a.txt");
    let file = key.file.display().to_string();
    let sealing = s
        .backend(&[
            ("GITSTATE_AGE_RECIPIENTS", key.recipient.as_str()),
            ("GITSTATE_AGE_IDENTITY_FILE", file.as_str()),
        ])
        .await;
    let sealer = Client::new(&sealing.url);
    let own = "sealed/own.tfstate";
    for seed in 1..=2 {
        sealer
            .write(own, &generated_state(seed, true))
            .await
            .expect(200);
    }
    let tree = "sealed/seed-tree.tfstate";
    let by_seed = sops(
        &[
            "encrypt",
            "--age",
            &key.recipient,
            "--input-type",
            "json",
            "--output-type",
            "json",
        ],
        generated_state(3, true).as_bytes(),
        &[],
    );
    commit_file(&s.server, "infra", tree, &by_seed);
    let plain = TestBackend::start(&s.url, &[]).await;
    let client = Client::new(&plain.url);
    for name in [own, tree] {
        let stored = s.stored(name);
        let got = client.get_state(name).await;
        assert_eq!(got.status, 500, "{name}: {}", got.body);
        assert!(
            got.body.contains("no keys configured"),
            "{name}: the reason says why: {}",
            got.body
        );
        let newer = generated_state(9, false);
        let written = client.write(name, &newer).await;
        assert_eq!(written.status, 500, "{name}: {}", written.body);
        let page = client.history(name, "").await.expect(200).history();
        if let Some(oldest) = page.versions.last() {
            let past = client
                .history(name, &format!("at={}", oldest.version))
                .await;
            assert_eq!(past.status, 500, "{name}: a past revision: {}", past.body);
            let restored = client.restore(name, &oldest.version).await;
            assert_eq!(restored.status, 500, "{name}: {}", restored.body);
        }
        assert!(s.stored(name) == stored, "{name}: the sealed file changed");
    }
    // The same states read through a backend that holds the key.
    assert_eq!(sealer.get_state(own).await.status, 200);
}

/// terraform-backend-git's `aes` passphrase mode is a sealed state too: a backend configured
/// with no keys and no `GITSTATE_PASSPHRASE` (a wrapper run without the migration's settings)
/// must not answer its ciphertext as the state, nor write a state over it (the ciphertext has no
/// serial to be stale against), as it refuses a sops file. The reason names the passphrase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_without_keys_never_serves_or_overwrites_a_passphrase_sealed_state() {
    let server = GitServer::start().await;
    let url = server.create_repo("aes");
    let name = "seed/aes.tfstate";
    let sealed = gitstate_sops::seal_passphrase(
        "the seed's passphrase",
        [7; 12],
        generated_state(4, true).as_bytes(),
    )
    .expect("sealed");
    commit_file(&server, "aes", name, &sealed);
    let plain = TestBackend::start(&url, &[]).await;
    let client = Client::new(&plain.url);
    let got = client.get_state(name).await;
    assert_eq!(got.status, 500, "{}", got.body);
    assert!(got.body.contains("GITSTATE_PASSPHRASE"), "{}", got.body);
    let written = client.write(name, &generated_state(9, false)).await;
    assert_eq!(written.status, 500, "{}", written.body);
    assert!(
        stored_file(&server, "aes", name) == sealed,
        "the sealed file changed"
    );
    // With the passphrase, the same backend setup reads it.
    let with = TestBackend::start(&url, &[("GITSTATE_PASSPHRASE", "the seed's passphrase")]).await;
    assert_eq!(Client::new(&with.url).get_state(name).await.status, 200);
}

/// A key rotation rewrites every state as it is, serial and all: one more revision holding the
/// serial the state already had. Reading or restoring that serial by number (`?at=<serial>`,
/// `gitstate show|restore name@<serial>`, the form the docs give) must still name the state:
/// both revisions hold the same state, so there is nothing to choose between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_serial_survives_a_rekey() {
    let s = setup().await;
    let old = age_key(s.keys.path(), "old.txt");
    let new = age_key(s.keys.path(), "new.txt");
    let old_file = old.file.display().to_string();
    let first = s
        .backend(&[
            ("GITSTATE_AGE_RECIPIENTS", old.recipient.as_str()),
            ("GITSTATE_AGE_IDENTITY_FILE", old_file.as_str()),
        ])
        .await;
    let state = generated_state(32, true);
    let serial = gitstate_tests::serial_of(&state);
    let name = "rot/b.tfstate";
    Client::new(&first.url)
        .write(name, &state)
        .await
        .expect(200);
    let both = key_file(s.keys.path(), "both.txt", &[&old, &new]);
    let both = both.display().to_string();
    let rotated_vars = [
        ("GITSTATE_AGE_RECIPIENTS", new.recipient.as_str()),
        ("GITSTATE_AGE_PREVIOUS_RECIPIENTS", old.recipient.as_str()),
        ("GITSTATE_AGE_IDENTITY_FILE", both.as_str()),
    ];
    let rotated = s.backend(&rotated_vars).await;
    let cache = tempfile::tempdir().expect("tempdir");
    let settings = settings_for(&s.url, cache.path(), &rotated_vars);
    let backend = gitstate_app::build_with(settings, Some(s.moto.kms().await))
        .await
        .expect("backend")
        .backend;
    let at = backend.locate(None, None).expect("primary");
    let parsed = StateName::parse(name).expect("name");
    let caller = Caller::operator("rekey-test");
    backend
        .rekey(&caller, &at, &parsed, &ReadContext::no_request())
        .await
        .expect("rekey");
    let client = Client::new(&rotated.url);
    let versions = client
        .history(name, "")
        .await
        .expect(200)
        .history()
        .versions;
    assert_eq!(versions.len(), 2, "the write and the rekey");
    let read = client.history(name, &format!("at={serial}")).await;
    assert_eq!(read.status, 200, "{}", read.body);
    assert!(read.body == state);
    let restored = client.restore(name, &serial.to_string()).await;
    assert_eq!(restored.status, 200, "{}", restored.body);
}
