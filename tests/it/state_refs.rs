//! Writes to the states' own refs (issue 27, `GITSTATE_STATE_REFS`), generated and seeded,
//! against the real `git http-backend` with and without `atomic`: backends with `always`, `auto`
//! and `never` over one repository take turns on a few states: applies (LOCK, GET, write,
//! UNLOCK; sometimes the write right after the LOCK, with no look under the lock), unlocked
//! writes, deletes under a lock (a state with unfolded writes on its ref among them) and creates
//! after them, restores, folds, and refs left over by a delete whose second push failed (a host
//! without `atomic`). So a state ref is often created by one process between another's last look
//! and its next write.
//!
//! After every step each state reads (through every backend) as the model says, and the newest
//! content stored in the repository is the model's; at the end, after a fold, the branch's
//! `git log` of each state is every acknowledged write once, in order. `GITSTATE_STATE_REFS_SEED`
//! and `GITSTATE_STATE_REFS_STEPS` run others.

use std::collections::BTreeMap;
use std::sync::Arc;

use gitstate_core::ports::{Location, StateStore};
use gitstate_tests::states::{file_log, newest_stored, ref_tip, state_ref, state_refs};
use gitstate_tests::{
    Client, GitServer, PushMode, TestBackend, git, init_tracing, settings_for, state_json,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const NAMES: [&str; 3] = ["r/one.tfstate", "r/two.tfstate", "r/three.tfstate"];
const MODES: [&str; 4] = ["always", "always", "auto", "never"];
const BRANCH: &str = "main";

/// One backend, and its store (for folds).
struct Backend {
    client: Client,
    store: Arc<dyn StateStore>,
    at: Location,
    _served: TestBackend,
}

async fn backend(url: &str, mode: &str) -> Backend {
    let cache = tempfile::tempdir().expect("tempdir");
    let settings = settings_for(url, cache.path(), &[("GITSTATE_STATE_REFS", mode)]);
    let built = gitstate_app::build(settings).await.expect("backend");
    let store = built.backend.store().clone();
    let at = built.backend.locate(None, None).expect("primary");
    let served = TestBackend::serve(built.router(), cache).await;
    Backend {
        client: Client::new(&served.url),
        store,
        at,
        _served: served,
    }
}

/// Per state: its content now (`None`: no state) and every acknowledged write (`None`: a delete).
#[derive(Default)]
struct Model {
    now: BTreeMap<&'static str, Option<String>>,
    history: BTreeMap<&'static str, Vec<Option<String>>>,
    serial: u64,
    lineages: u64,
}

impl Model {
    fn current(&self, name: &str) -> Option<&String> {
        self.now.get(name).and_then(Option::as_ref)
    }

    /// The next state of `name`: a new serial, its lineage kept while it exists.
    fn next(&mut self, name: &str) -> String {
        self.serial += 1;
        let lineage = match self.current(name) {
            Some(state) => lineage_of(state),
            None => {
                self.lineages += 1;
                format!("lineage-{}", self.lineages)
            }
        };
        state_json(&lineage, self.serial)
    }

    fn wrote(&mut self, name: &'static str, state: Option<String>) {
        self.now.insert(name, state.clone());
        self.history.entry(name).or_default().push(state);
    }
}

async fn run(push: PushMode, seed: u64, steps: usize) {
    init_tracing();
    let server = GitServer::start_in(push).await;
    let url = server.create_repo("refs");
    let repo = server.repo_dir("refs");
    let mut backends = Vec::new();
    for mode in MODES {
        backends.push(backend(&url, mode).await);
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model = Model::default();
    let mut log: Vec<String> = Vec::new();
    for step in 0..steps {
        let b = rng.random_range(0..backends.len());
        let name = NAMES[rng.random_range(0..NAMES.len())];
        let client = &backends[b].client;
        let id = format!("s{step}");
        let kind = rng.random_range(0..100);
        log.push(format!("{step}: {} {kind} {name}", MODES[b]));
        match kind {
            // An apply: LOCK, GET (mostly), write, UNLOCK.
            0..=44 => {
                client.lock(name, &id).await.expect(200);
                if rng.random_bool(0.8) {
                    expect_read(client, name, model.current(name)).await;
                }
                let state = model.next(name);
                client.write_locked(name, &id, &state).await.expect(200);
                model.wrote(name, Some(state));
                client.unlock(name, &id).await.expect(200);
            }
            // A write without a lock.
            45..=59 => {
                let state = model.next(name);
                client.write(name, &state).await.expect(200);
                model.wrote(name, Some(state));
            }
            // A delete under a lock (of a state that exists).
            60..=74 if model.current(name).is_some() => {
                client.lock(name, &id).await.expect(200);
                if rng.random_bool(0.5) {
                    expect_read(client, name, model.current(name)).await;
                }
                client.delete_state(name, Some(&id)).await.expect(200);
                model.wrote(name, None);
                client.unlock(name, &id).await.expect(200);
                // Now and then the delete's ref is left over, as when its second push fails on
                // a host without `atomic`: put it back where it was.
                if let Some((reference, tip)) = left_over(&log, &repo, name)
                    && rng.random_bool(0.4)
                {
                    git(&["update-ref", &reference, &tip], Some(&repo));
                    log.push(format!("  left over {reference} at {tip}"));
                }
            }
            // A restore of the version before the newest.
            75..=84 if model.history.get(name).is_some_and(|h| h.len() >= 2) => {
                let Some(Some(before)) = model.history[name].iter().rev().nth(1).cloned() else {
                    continue;
                };
                if model.current(name).is_none() {
                    continue;
                }
                let serial = gitstate_tests::serial_of(&before);
                let answer = client.restore(name, &serial.to_string()).await.expect(200);
                let restored = client.get_state(name).await.expect(200).body;
                assert_eq!(lineage_of(&restored), lineage_of(&before), "{answer:?}");
                model.wrote(name, Some(restored));
            }
            // A fold by one of the backends.
            85..=92 => {
                let backend = &backends[b];
                let report = backend.store.fold(&backend.at).await.expect("fold");
                assert!(report.refused.is_empty(), "a fold refused {report:?}");
            }
            _ => {
                let other = &backends[rng.random_range(0..backends.len())].client;
                expect_read(other, name, model.current(name)).await;
            }
        }
        for name in NAMES {
            let stored = newest_stored(&repo, BRANCH, name)
                .map(|b| String::from_utf8_lossy(&b).into_owned());
            assert_eq!(
                stored.as_ref(),
                model.current(name),
                "seed {seed}, step {step}: {name} in the repository\n{}",
                log.join("\n")
            );
        }
    }
    for backend in &backends {
        for name in NAMES {
            expect_read(&backend.client, name, model.current(name)).await;
        }
    }
    let report = backends[0]
        .store
        .fold(&backends[0].at)
        .await
        .expect("final fold");
    assert!(report.refused.is_empty(), "{report:?}");
    for name in NAMES {
        let logged: Vec<Option<String>> = file_log(&repo, &format!("refs/heads/{BRANCH}"), name)
            .into_iter()
            .map(|(_, content)| content.map(|c| String::from_utf8_lossy(&c).into_owned()))
            .collect();
        let want = model.history.get(name).cloned().unwrap_or_default();
        assert_eq!(
            logged,
            want,
            "seed {seed}: git log of {name} after the final fold\n{}",
            log.join("\n")
        );
    }
    eprintln!(
        "state refs ({push:?}, seed {seed}): {steps} steps, {} writes, {} state refs at the end",
        model.history.values().map(Vec::len).sum::<usize>(),
        state_refs(&repo).len()
    );
}

/// The ref a delete of `name` just removed and its tip before (read from the repository's
/// reflog-free history: the last state commit of `name` the branch's fold record names).
fn left_over(_log: &[String], repo: &std::path::Path, name: &str) -> Option<(String, String)> {
    let reference = state_ref(BRANCH, name);
    if ref_tip(repo, &reference).is_some() {
        return None;
    }
    let record = gitstate_tests::states::file_at(
        repo,
        &format!("refs/heads/{BRANCH}"),
        ".gitstate/folded.json",
    )?;
    let record: serde_json::Value = serde_json::from_slice(&record).ok()?;
    let tip = record.get(name)?.as_str()?.to_owned();
    Some((reference, tip))
}

async fn expect_read(client: &Client, name: &str, want: Option<&String>) {
    let answer = client.get_state(name).await;
    match want {
        Some(state) => {
            assert_eq!(answer.status, 200, "{name}: {}", answer.body);
            assert_eq!(&answer.body, state, "{name}");
        }
        None => assert_eq!(answer.status, 404, "{name}: {}", answer.body),
    }
}

fn lineage_of(state: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(state).expect("a state");
    value["lineage"].as_str().expect("a lineage").to_owned()
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

async fn generated(push: PushMode, steps: usize) {
    let seed = env_number("GITSTATE_STATE_REFS_SEED").unwrap_or(27);
    let steps = env_number("GITSTATE_STATE_REFS_STEPS").map_or(steps, |s| s as usize);
    run(push, seed, steps).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_writes_through_mixed_settings_lose_nothing() {
    generated(PushMode::Atomic, 120).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_writes_through_mixed_settings_lose_nothing_without_atomic_push() {
    generated(PushMode::NoAtomic, 100).await;
}

/// One Terraform apply whose requests a load balancer spreads over two `serve` processes with
/// different `GITSTATE_STATE_REFS` (a rolling change of the setting): the LOCK and the GET go to
/// a `never` process, which finds no state ref; the first write goes to an `always` process,
/// which moves the state to a new ref of its own; the apply's last write goes back to the
/// `never` process, which, at the protocol floor, trusts its look ("no ref") and writes the
/// branch. The branch's newer file is hidden behind the ref: every read answers the first
/// write's older state, and the next plan runs against it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "mixing GITSTATE_STATE_REFS behind one address is documented as unsupported; a \
            rolling change of the setting does it: a floor write under never/auto would have \
            to prove the ref absent (a probe) or the always backend refuse to create a ref \
            under a lock another process took"]
async fn a_rolling_change_of_state_refs_never_hides_a_newer_write() {
    init_tracing();
    let server = GitServer::start_in(PushMode::Atomic).await;
    let url = server.create_repo("refs");
    let never = backend(&url, "never").await;
    let always = backend(&url, "always").await;
    let name = NAMES[0];
    let mut model = Model::default();
    let first = model.next(name);
    never.client.apply(name, "create", &first).await;
    model.wrote(name, Some(first));

    never.client.lock(name, "run").await.expect(200);
    expect_read(&never.client, name, model.current(name)).await;
    let middle = model.next(name);
    always
        .client
        .write_locked(name, "run", &middle)
        .await
        .expect(200);
    let last = model.next(name);
    never
        .client
        .write_locked(name, "run", &last)
        .await
        .expect(200);
    never.client.unlock(name, "run").await.expect(200);
    for client in [&never.client, &always.client] {
        expect_read(client, name, Some(&last)).await;
    }
}
