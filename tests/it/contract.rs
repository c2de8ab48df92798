//! The in-memory store's contract: the router tests of the core run over
//! `gitstate_core::testing::MemoryStore`, so it must answer as the git store does. The model
//! test's generator draws seeded sequences (locks, unlocks, writes with and without IDs and
//! Content-MD5, deletes, restores, history, `?ref=`s, users with random grants, colliding names);
//! each request goes, one at a time, to two routers built from the same settings: one over the
//! git store and the machine's `git http-backend` on loopback, one over the memory store. Every
//! answer must match (status, body, `Gitstate-Lock-User`; commit IDs and clock times aside), and
//! after the sequence every state, lock and history on every branch, and the lists of states and
//! locks each user sees, read the same from both.
//!
//! `GITSTATE_CONTRACT_SEEDS=<from>..<to>` and `GITSTATE_CONTRACT_STEPS=<n>` run more.

use std::collections::BTreeMap;

use gitstate_tests::{GitServer, TestBackend, memory_app, settings_for};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::model::{self, Config, Model, Off, Op, Step, generate};

/// Seeds other than the model test's, covering both branches (`main`, `env/main`) and both lock
/// prefixes (`refs/heads/locks/`, `refs/locks/`).
const SEEDS: [u64; 3] = [21, 22, 23];
const STEPS: usize = 400;

/// Names and refs the final read-back covers.
const NAMES: [&str; 6] = [
    "a",
    "a/b",
    "a/b/c.tfstate",
    "a.tfstate",
    "b/a.tfstate",
    "ab",
];
const REFS: [Option<&str>; 4] = [None, Some("env/prod"), Some("team/x"), Some("main")];

/// Fields whose values are commit IDs or clock times: the two stores name their commits and
/// stamp their times apart. Only the value is set aside; whether the field is there (or null)
/// still counts.
const VOLATILE: [&str; 6] = [
    "version",
    "time",
    "from",
    "created",
    "age_seconds",
    "updated",
];

/// One answer, as compared: status, body (normalised where it is a listing), lock-user header.
type Reply = (u16, String, Option<String>);

/// The answer with its volatile fields set aside. States and error reasons compare byte for
/// byte; only the history, restore and lock listings (JSON gitstate writes) are normalised.
fn comparable(op: &Op, (status, body, lock_user): (u16, Vec<u8>, Option<String>)) -> Reply {
    let listing = matches!(op, Op::History | Op::Restore { .. } | Op::ListLocks);
    let text = match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(mut value) if listing && status == 200 => {
            set_aside(&mut value);
            value.to_string()
        }
        _ => String::from_utf8_lossy(&body).into_owned(),
    };
    (status, text, lock_user)
}

fn set_aside(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, field) in map.iter_mut() {
                if VOLATILE.contains(&key.as_str()) && !field.is_null() {
                    *field = "<set aside>".into();
                } else {
                    set_aside(field);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(set_aside),
        _ => {}
    }
}

/// The two routers over one configuration.
struct Pair {
    _server: GitServer,
    git: TestBackend,
    memory: TestBackend,
    http: reqwest::Client,
}

impl Pair {
    async fn start(cfg: &Config) -> Self {
        let server = GitServer::start().await;
        let url = server.create_repo("contract");
        let vars = cfg.backend_vars();
        let extra: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let git = TestBackend::start(&url, &extra).await;
        let cache = tempfile::tempdir().expect("tempdir");
        let (router, _store) = memory_app(&settings_for(&url, cache.path(), &extra));
        let memory = TestBackend::serve(router, cache).await;
        Self {
            _server: server,
            git,
            memory,
            http: reqwest::Client::new(),
        }
    }

    /// The step on the git store, then on the memory store.
    async fn both(&self, cfg: &Config, step: &Step) -> (Reply, Reply) {
        let git = model::send(&self.http, &self.git.url, cfg, step).await;
        let memory = model::send(&self.http, &self.memory.url, cfg, step).await;
        (comparable(&step.op, git), comparable(&step.op, memory))
    }
}

impl Pair {
    /// `GET /states` (the list of states, JSON) at `base` by `user`.
    async fn list(&self, base: &str, user: &crate::model::User) -> Reply {
        let response = self
            .http
            .get(format!("{base}/states"))
            .header("accept", "application/json")
            .basic_auth(&user.name, Some(&user.password))
            .send()
            .await
            .expect("the backend answers");
        let status = response.status().as_u16();
        let body = response.bytes().await.unwrap_or_default().to_vec();
        comparable(&Op::ListLocks, (status, body, None))
    }
}

fn differ(what: &str, git: &Reply, memory: &Reply) -> String {
    format!(
        "{what}\n    git store:    {} {:?} lock user {:?}\n    memory store: {} {:?} lock user {:?}",
        git.0, git.1, git.2, memory.0, memory.1, memory.2
    )
}

/// Run one seed; the statuses seen (to show what was covered), or the first difference.
async fn run_seed(seed: u64, steps: usize) -> Result<BTreeMap<u16, usize>, String> {
    let cfg = Config::for_seed(seed);
    let pair = Pair::start(&cfg).await;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model = Model::default();
    let mut seen = BTreeMap::new();
    let mut sequence = Vec::new();
    for index in 0..steps {
        let mut step = generate(&mut rng, &model, cfg.users.len(), &Off::default());
        step.with = None; // one request at a time: both stores see the same order
        sequence.push(step.to_string());
        // The generator favours the lock holders' IDs: it follows the locks through the model.
        let prediction = model.predict(&cfg, &step);
        let (git, memory) = pair.both(&cfg, &step).await;
        if git != memory {
            let tail = sequence[sequence.len().saturating_sub(12)..].join("\n    ");
            return Err(differ(
                &format!(
                    "{}\n  step {index}: {step}\n  the steps up to it:\n    {tail}",
                    cfg.describe()
                ),
                &git,
                &memory,
            ));
        }
        if git.0 == 200 && prediction.refusals.is_empty() {
            model.apply(&prediction.effect);
        }
        *seen.entry(git.0).or_insert(0) += 1;
    }
    read_back(&cfg, &pair)
        .await
        .map_err(|e| format!("{}\n  {e}", cfg.describe()))?;
    Ok(seen)
}

/// Every state, lock and history the names and refs reach reads the same from both stores.
async fn read_back(cfg: &Config, pair: &Pair) -> Result<(), String> {
    for name in NAMES {
        for reference in REFS {
            for op in [Op::GetState, Op::GetLock, Op::History] {
                // By the first user, administrator of every state.
                let step = Step {
                    backend: 0,
                    user: 0,
                    name,
                    reference,
                    op,
                    with: None,
                };
                let (git, memory) = pair.both(cfg, &step).await;
                if git != memory {
                    return Err(differ(
                        &format!("after the sequence: {step}"),
                        &git,
                        &memory,
                    ));
                }
            }
        }
    }
    // The listings, as each user may see them.
    for index in 0..cfg.users.len() {
        let step = Step {
            backend: 0,
            user: index,
            name: "a",
            reference: None,
            op: Op::ListLocks,
            with: None,
        };
        let (git, memory) = pair.both(cfg, &step).await;
        if git != memory {
            return Err(differ(
                &format!("after the sequence: {step}"),
                &git,
                &memory,
            ));
        }
        let user = &cfg.users[index];
        let (git, memory) = (
            pair.list(&pair.git.url, user).await,
            pair.list(&pair.memory.url, user).await,
        );
        if index == 0 && !(git.0 == 200 && git.1.contains("\"state\"")) {
            return Err(format!("the administrator's list is empty: {git:?}"));
        }
        if git != memory {
            return Err(differ(
                &format!("after the sequence: GET /states by {}", user.name),
                &git,
                &memory,
            ));
        }
    }
    Ok(())
}

fn seeds() -> Vec<u64> {
    match std::env::var("GITSTATE_CONTRACT_SEEDS") {
        Ok(range) => {
            let (from, to) = range
                .split_once("..")
                .expect("GITSTATE_CONTRACT_SEEDS=<from>..<to>");
            (from.trim().parse().expect("a seed")..to.trim().parse().expect("a seed")).collect()
        }
        Err(_) => SEEDS.to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_answers_as_the_git_store_does() {
    let steps = std::env::var("GITSTATE_CONTRACT_STEPS")
        .ok()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(STEPS);
    let mut failures = Vec::new();
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for seed in seeds() {
        match run_seed(seed, steps).await {
            Ok(seen) => {
                for (status, n) in seen {
                    *statuses.entry(status).or_insert(0) += n;
                }
            }
            Err(report) => failures.push(report),
        }
    }
    println!("contract: statuses answered alike by both stores: {statuses:?}");
    assert!(
        failures.is_empty(),
        "the memory store and the git store answer differently:\n{}",
        failures.join("\n")
    );
    // The sequences reach the rules, not only the refusals in front of them.
    for status in [200, 400, 403, 409, 423] {
        assert!(
            statuses.get(&status).is_some_and(|n| *n > 0),
            "no {status} in {statuses:?}"
        );
    }
}
