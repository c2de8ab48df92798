//! The stock Go sops 3.11 as the oracle of the file format, both ways, over generated states
//! (sizes, non-ASCII text, numbers at the edges): every file gitstate writes decrypts with it to
//! exactly the state (through `gzip -d`), and every file it writes (binary and tree mode) reads
//! through gitstate; KMS through moto.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use gitstate_core::StateName;
use gitstate_tests::{
    Client, GitServer, Moto, TestBackend, commit_file, encrypted_app, init_tracing,
    realistic_state, settings_for, sops311, stored_file,
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
pub fn sops_config(dir: &Path, groups: &str, threshold: Option<usize>) -> std::path::PathBuf {
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
        let dir = tempfile::tempdir().expect("tempdir");
        let config = sops_config(dir.path(), &kms_group(&s.arn, &s.url, &name), None);
        let sealed = sops(
            &[
                "--config",
                config.to_str().expect("utf-8"),
                "encrypt",
                "--input-type",
                "json",
                "--output-type",
                "json",
            ],
            state.as_bytes(),
            &env,
        );
        assert!(String::from_utf8_lossy(&sealed).contains("type:float"));
        commit_file(&s.server, "infra", &name, &sealed);
        let got = client.get_state(&name).await.expect(200);
        let got: serde_json::Value = serde_json::from_str(&got.body).expect("json");
        let want: serde_json::Value = serde_json::from_str(&state).expect("json");
        assert_eq!(got, want, "seed {seed}");
    }
}
