//! The stock Go sops 3.11 as the oracle of the file format, both ways, over generated states
//! (sizes, non-ASCII text, numbers at the edges): every file gitstate writes decrypts with it to
//! exactly the state (through `gzip -d`), and every file it writes (binary and tree mode) reads
//! through gitstate; KMS through moto.

use gitstate_tests::sops::{break_glass, kms_group, sops, sops_config, sops_encrypt_json};
use gitstate_tests::{
    Client, GitServer, Moto, TestBackend, commit_file, encrypted_app, init_tracing,
    realistic_state, settings_for, stored_file,
};
use rand::{Rng, SeedableRng};

/// Numbers JSON allows that f64 or i64 do not hold exactly, as text (binary mode keeps them).
const EDGE_NUMBERS: [&str; 11] = [
    "0",
    "-0",
    "9007199254740993",
    "18446744073709551616",
    "-9223372036854775809",
    "9223372036854775807",
    "5e-324",
    "1.7976931348623157e308",
    "0.1",
    "1E+2",
    "-1.5e-7",
];

/// A generated state: a realistic one of `seed`'s size, maybe with non-ASCII text, maybe with
/// an output of edge numbers (`edges`: only where the file is binary mode).
pub fn generated_state(seed: u64, edges: bool) -> String {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let sizes = [0, 1, 2, 7, 30, 60, 150, 400];
    let resources = sizes[rng.random_range(0..sizes.len())];
    let mut state = realistic_state(seed, resources, rng.random_range(1..1000));
    if rng.random_bool(0.5) {
        state = state.replace("platform", "plätform ✓ 🙂 \u{2028} \\\"q\\\" <&> \\u0000");
    }
    if edges {
        let picked: Vec<&str> = EDGE_NUMBERS
            .iter()
            .filter(|_| rng.random_bool(0.6))
            .copied()
            .collect();
        state = state.replacen(
            "\"outputs\": {",
            &format!(
                "\"outputs\": {{\n    \"edge\": {{\"value\": [{}], \"type\": \"dynamic\"}},",
                picked.join(", ")
            ),
            1,
        );
    }
    state
}

struct Setup {
    moto: Moto,
    server: GitServer,
    url: String,
    arn: String,
}

async fn setup() -> Setup {
    init_tracing();
    let moto = Moto::start().await;
    let server = GitServer::start().await;
    let url = server.create_repo("infra");
    let arn = moto.create_key("tfstate").await;
    Setup {
        moto,
        server,
        url,
        arn,
    }
}

impl Setup {
    async fn backend(&self) -> TestBackend {
        let cache = tempfile::tempdir().expect("tempdir");
        let settings = settings_for(
            &self.url,
            cache.path(),
            &[
                ("GITSTATE_KMS_KEY_IDS", "alias/tfstate"),
                ("GITSTATE_MAX_BODY_BYTES", "8000000"),
            ],
        );
        TestBackend::serve(encrypted_app(&settings, self.moto.kms().await).await, cache).await
    }
}

/// Generated states written through gitstate under KMS decrypt with sops 3.11 to exactly the
/// state; the same states sealed by sops 3.11 (binary mode, with gitstate's context for the
/// path) read through gitstate byte-exact, and a copy at another path is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kms_files_both_ways_with_sops311() {
    let s = setup().await;
    let backend = s.backend().await;
    let client = Client::new(&backend.url);
    let env = s.moto.env();
    let cases = 12;
    for seed in 0..cases {
        let state = generated_state(seed, true);
        let name = format!("gen/w{seed}.tfstate");
        client.write(&name, &state).await.expect(200);
        let stored = stored_file(&s.server, "infra", &name);
        assert!(
            break_glass(&stored, &env) == state.as_bytes(),
            "seed {seed}: sops 3.11 gives another state"
        );

        // AND sops 3.11's own binary-mode file of it, under the context of its path, reads
        let dir = tempfile::tempdir().expect("tempdir");
        let read_name = format!("gen/r{seed}.tfstate");
        let config = sops_config(dir.path(), &kms_group(&s.arn, &s.url, &read_name), None);
        let config = config.to_str().expect("utf-8");
        let sealed = sops(
            &[
                "--config",
                config,
                "encrypt",
                "--input-type",
                "binary",
                "--output-type",
                "json",
            ],
            state.as_bytes(),
            &env,
        );
        commit_file(&s.server, "infra", &read_name, &sealed);
        let got = client.get_state(&read_name).await.expect(200);
        assert!(
            got.body == state,
            "seed {seed}: gitstate reads another state"
        );
        // a copy of it at another path does not open
        let copy = format!("gen/c{seed}.tfstate");
        commit_file(&s.server, "infra", &copy, &sealed);
        let refused = client.get_state(&copy).await;
        assert!(refused.status >= 400, "seed {seed}: {}", refused.status);
    }
    eprintln!("MEASURE sops 3.11 oracle, KMS: {cases} generated states each way");
}

/// Tree-mode files sops 3.11 writes (every value its own `ENC[…]`, numbers as floats) read
/// through gitstate as the same JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kms_tree_mode_files_of_sops311_read() {
    let s = setup().await;
    let backend = s.backend().await;
    let client = Client::new(&backend.url);
    let env = s.moto.env();
    let cases = 8;
    for seed in 100..100 + cases {
        let state = generated_state(seed, false);
        let name = format!("tree/t{seed}.tfstate");
        let group = kms_group(&s.arn, &s.url, &name);
        let sealed = sops_encrypt_json(&group, None, state.as_bytes(), &env);
        assert!(String::from_utf8_lossy(&sealed).contains("type:float"));
        commit_file(&s.server, "infra", &name, &sealed);
        let got = client.get_state(&name).await.expect(200);
        let got: serde_json::Value = serde_json::from_str(&got.body).expect("json");
        let want: serde_json::Value = serde_json::from_str(&state).expect("json");
        assert_eq!(got, want, "seed {seed}");
    }
}
