//! The fold (issue 27): writes kept on the states' own refs replayed onto the branch, against the
//! real `git http-backend` (with and without `atomic`) and the embedded repository. The inputs
//! are generated: states, chains of writes with skewed clocks and time zones, branch writes
//! between them, folds by several processes (some at once, some taking over any lease), leases
//! left by crashed holders, and writes behind the protocol's back. Set `GITSTATE_FOLD_RUNS` for
//! a longer run (default 3 per repository kind).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gitstate_core::fold::FoldReport;
use gitstate_core::ports::{Location, StateStore};
use gitstate_tests::handmade::{Bare, Stamp, StateWrite};
use gitstate_tests::{GitServer, PushMode, init_tracing, settings_for};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Where the states live, and two processes' stores over it (one takes over leases sooner).
struct Scene {
    bare: Bare,
    at: Location,
    folders: Vec<Arc<dyn StateStore>>,
    _server: Option<GitServer>,
    _dirs: Vec<tempfile::TempDir>,
}

/// A store over `repository` (`None`: the embedded one at `local`) whose lease age is `lease`.
async fn store(
    repository: Option<&str>,
    local: &std::path::Path,
    lease: &str,
) -> (Arc<dyn StateStore>, Location, tempfile::TempDir) {
    let cache = tempfile::tempdir().expect("tempdir");
    let mut extra = vec![("GITSTATE_FOLD_LEASE_SECS", lease)];
    let local = local.to_str().expect("utf-8");
    if repository.is_none() {
        extra.push(("GITSTATE_LOCAL_REPOSITORY", local));
    }
    let mut settings = settings_for(repository.unwrap_or(""), cache.path(), &extra);
    if repository.is_none() {
        settings.git.repository = None;
    }
    let app = gitstate_app::build(settings).await.expect("backend");
    let at = app.backend.locate(None, None).expect("primary");
    (app.backend.store().clone(), at, cache)
}

impl Scene {
    async fn new(kind: Kind) -> Self {
        let (server, dir, url, dirs) = match kind {
            Kind::Hosted(mode) => {
                let server = GitServer::start_in(mode).await;
                let url = server.create_repo("states");
                let dir = server.repo_dir("states");
                (Some(server), dir, Some(url), Vec::new())
            }
            Kind::Embedded => {
                let dir = tempfile::tempdir().expect("tempdir");
                let repo = dir.path().join("repo.git");
                gitstate_tests::git(
                    &[
                        "init",
                        "--bare",
                        "-q",
                        "--initial-branch=main",
                        repo.to_str().expect("utf-8"),
                    ],
                    None,
                );
                (None, repo, None, vec![dir])
            }
        };
        let bare = Bare::new(&dir, "main");
        bare.branch_write("README.md", Some(b"states\n"), &write(0, "README.md", b""));
        let mut folders = Vec::new();
        let mut dirs = dirs;
        let mut at = None;
        for lease in ["60", "1"] {
            let (folder, location, cache) = store(url.as_deref(), &dir, lease).await;
            folders.push(folder);
            dirs.push(cache);
            at = Some(location);
        }
        Self {
            bare,
            at: at.expect("a location"),
            folders,
            _server: server,
            _dirs: dirs,
        }
    }

    async fn fold(&self, which: usize) -> FoldReport {
        self.folders[which].fold(&self.at).await.expect("the fold")
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Hosted(PushMode),
    Embedded,
}

/// A write of `path` at step `step`, by one of a few people, in one of a few time zones.
fn write(step: i64, path: &str, content: &[u8]) -> StateWrite {
    let stamp = |who: &str, seconds: i64, zone: &str| Stamp {
        name: who.to_owned(),
        email: format!("{who}@example.invalid"),
        date: format!("{seconds} {zone}"),
    };
    StateWrite {
        path: path.to_owned(),
        content: content.to_vec(),
        author: stamp("ann", 1_700_000_000 + step * 10, "+0000"),
        committer: stamp("gitstate", 1_700_000_000 + step * 10, "+0000"),
        message: format!("write {path}\n\nSerial: {step}\nUser: ann\n"),
    }
}

fn random_write(rng: &mut StdRng, step: i64, path: &str) -> StateWrite {
    let people = ["ann", "bob", "chloé", "dev ops"];
    let zones = ["+0000", "+0130", "-0700", "+0545"];
    let mut w = write(step, path, format!("{{\"serial\":{step}}}\n").as_bytes());
    let who = people[rng.random_range(0..people.len())];
    // Clocks of different writers disagree: committer times go back now and then.
    let seconds = 1_700_000_000 + step * 10 + rng.random_range(-25..=25);
    w.author = Stamp {
        name: who.to_owned(),
        email: format!("{}@example.invalid", who.replace(' ', ".")),
        date: format!(
            "{} {}",
            seconds - 1,
            zones[rng.random_range(0..zones.len())]
        ),
    };
    w.committer.date = format!("{seconds} {}", zones[rng.random_range(0..zones.len())]);
    w.message = if rng.random_bool(0.2) {
        format!("write {path} by another tool\n")
    } else {
        format!(
            "write {path} (serial {step})\n\nSerial: {step}\nLineage: l-{path}\nOperation: OperationTypeApply\nLock-ID: id-{step}\nWho: {who}@host\nUser: {who}\n"
        )
    };
    w
}

/// What the test knows was written, per state.
#[derive(Default)]
struct Model {
    /// Every state write, in order: (state commit, write).
    writes: BTreeMap<String, Vec<(String, StateWrite)>>,
    /// How many of each state's writes a fold has carried.
    folded: BTreeMap<String, usize>,
    /// States written on the branch behind the protocol's back, with what was written.
    foreign: BTreeMap<String, Vec<u8>>,
}

impl Model {
    /// After a fold that was not busy: every write of a state not written behind the
    /// protocol's back is folded.
    fn all_folded(&mut self) {
        for (path, writes) in &self.writes {
            if !self.foreign.contains_key(path) {
                self.folded.insert(path.clone(), writes.len());
            }
        }
    }

    /// States that have writes no fold may carry.
    fn refused(&self) -> BTreeSet<String> {
        self.foreign
            .keys()
            .filter(|path| {
                self.writes.get(*path).map_or(0, Vec::len)
                    > self.folded.get(*path).copied().unwrap_or(0)
            })
            .cloned()
            .collect()
    }
}

const PATHS: [&str; 6] = [
    "a.tfstate",
    "team/app.tfstate",
    "team/net/core.tfstate",
    "zz/Upper_case-1.tfstate",
    "prod",
    "deep/er/still/x.tfstate",
];

/// One generated run: `steps` random steps, then a last fold, then every assertion.
async fn run(kind: Kind, seed: u64, steps: usize) {
    let scene = Scene::new(kind).await;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model = Model::default();
    let mut created: Vec<&str> = Vec::new();
    for step in 1..=steps as i64 {
        let roll = rng.random_range(0..100);
        if created.is_empty() || roll < 10 {
            // A state created on the branch (creates go through the branch).
            if let Some(path) = PATHS.iter().find(|p| !created.contains(p)) {
                let content = format!("{{\"created\":{step}}}\n");
                scene
                    .bare
                    .branch_write(path, Some(content.as_bytes()), &write(step, path, b""));
                created.push(path);
            }
        } else if roll < 65 {
            let path = created[rng.random_range(0..created.len())];
            let w = random_write(&mut rng, step, path);
            let id = scene.bare.state_write(&w);
            model
                .writes
                .entry(path.to_owned())
                .or_default()
                .push((id, w));
        } else if roll < 70 {
            // Another file on the branch moves the tip the writes were planned on.
            let note = format!("note {step}\n");
            scene.bare.branch_write(
                "notes/NOTES.md",
                Some(note.as_bytes()),
                &write(step, "notes", b""),
            );
        } else if roll < 73 {
            // Someone writes a state on the branch without the protocol.
            let path = created[rng.random_range(0..created.len())];
            let content = format!("{{\"foreign\":{step}}}\n").into_bytes();
            scene
                .bare
                .branch_write(path, Some(&content), &write(step, path, b""));
            // Before the state has a state ref, that is just a write on the branch: its first
            // state commit will be written on it.
            if model.writes.contains_key(path) {
                model.foreign.insert(path.to_owned(), content);
            }
        } else if roll < 78 {
            // A crashed holder's lease, long expired: the next fold takes it over.
            let mut lease = write(step, "lease", b"");
            lease.committer.date = "1600000000 +0000".into();
            lease.message = "fold lease\n\nHolder: crashed\n".into();
            leave_lease(&scene.bare, &lease);
            let report = scene.fold(rng.random_range(0..2)).await;
            assert!(!report.busy, "an expired lease is taken over");
            model.all_folded();
        } else if roll < 90 {
            let report = scene.fold(rng.random_range(0..2)).await;
            assert!(!report.busy, "nobody else folds");
            check_report(&model, &report);
            model.all_folded();
        } else {
            // Two processes fold at once while the lease is deleted under them now and then (as
            // a takeover of a lease past its age would), so both may fold at the same time.
            let vandal = vandal(&scene.bare, rng.random_range(0..3), rng.random());
            let (a, b) = tokio::join!(scene.fold(0), scene.fold(1));
            vandal.await.expect("the lease vandal");
            assert!(
                !(a.busy && b.busy),
                "seed {seed} step {step}: one of them folded"
            );
            model.all_folded();
        }
    }
    let report = scene.fold(0).await;
    assert!(!report.busy);
    check_report(&model, &report);
    model.all_folded();
    check_branch(&scene.bare, &model, seed);
    assert_eq!(
        scene.bare.tip("refs/gitstate/fold"),
        None,
        "the lease was let go"
    );
}

/// Delete the lease ref `times` times at random moments of the next few tens of milliseconds.
fn vandal(bare: &Bare, times: usize, seed: u64) -> tokio::task::JoinHandle<()> {
    let dir = bare.dir.clone();
    tokio::task::spawn_blocking(move || {
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..times {
            std::thread::sleep(std::time::Duration::from_millis(rng.random_range(0..40)));
            let _ = std::process::Command::new("git")
                .arg("--git-dir")
                .arg(&dir)
                .args(["update-ref", "-d", "refs/gitstate/fold"])
                .output();
        }
    })
}

/// A fold reports by name exactly the states written behind the protocol's back that have
/// writes waiting.
fn check_report(model: &Model, report: &FoldReport) {
    let refused: BTreeSet<String> = report.refused.iter().cloned().collect();
    assert_eq!(
        refused,
        model.refused(),
        "refused states; writes {:?}, folded {:?}, foreign {:?}",
        model
            .writes
            .iter()
            .map(|(p, w)| (p, w.len()))
            .collect::<Vec<_>>(),
        model.folded,
        model.foreign.keys().collect::<Vec<_>>()
    );
}

/// A lease ref made by hand, as a crashed holder leaves it.
fn leave_lease(bare: &Bare, lease: &StateWrite) {
    let tree = bare.git(&["hash-object", "-t", "tree", "-w", "--stdin"], &[], b"");
    let commit = bare.git(
        &["commit-tree", &tree, "-m", &lease.message],
        &[
            ("GIT_COMMITTER_DATE", lease.committer.date.as_str()),
            ("GIT_AUTHOR_DATE", lease.committer.date.as_str()),
        ],
        b"",
    );
    bare.git(&["update-ref", "refs/gitstate/fold", &commit], &[], b"");
}

/// The branch has every folded write exactly once, in its order, as it was written; the files,
/// the index and the record agree with the last of them.
fn check_branch(bare: &Bare, model: &Model, seed: u64) {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for (path, writes) in &model.writes {
        let log = bare.log(path);
        let replays: Vec<_> = log
            .iter()
            .filter_map(|c| gitstate_core::trailers::state_commit_of(&c.message).map(|s| (s, c)))
            .collect();
        let folded = model.folded.get(path).copied().unwrap_or(0);
        assert_eq!(replays.len(), folded, "seed {seed}: {path} replays");
        for ((state, commit), (id, w)) in replays.iter().zip(writes) {
            assert_eq!(state, id, "seed {seed}: {path} in order");
            assert!(
                seen.insert(state.clone()),
                "seed {seed}: {state} replayed twice"
            );
            assert_eq!(commit.author, w.author, "seed {seed}: author");
            assert_eq!(commit.committer, w.committer, "seed {seed}: committer");
            assert_eq!(
                commit.message,
                gitstate_core::trailers::with_state_commit(&w.message, id),
                "seed {seed}: message and trailers"
            );
        }
        let folded_json = bare.folded();
        if folded > 0 {
            let (last_id, last) = &writes[folded - 1];
            assert_eq!(
                folded_json.get(path),
                Some(last_id),
                "seed {seed}: record of {path}"
            );
            let index = bare.index();
            let entry = &index["states"][path.as_str()];
            if !model.foreign.contains_key(path) {
                assert_eq!(
                    bare.file(path).as_deref(),
                    Some(last.content.as_slice()),
                    "seed {seed}: {path}"
                );
                assert_eq!(
                    entry["content"].as_str(),
                    bare.blob_id(path).as_deref(),
                    "seed {seed}: index of {path}"
                );
                let seconds: i64 = last
                    .committer
                    .date
                    .split(' ')
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("seconds");
                assert_eq!(
                    entry["time"].as_i64(),
                    Some(seconds),
                    "seed {seed}: index time"
                );
                assert_eq!(entry["author"].as_str(), Some(last.author.name.as_str()));
            }
        }
        if let Some(content) = model.foreign.get(path) {
            assert_eq!(
                bare.file(path).as_deref(),
                Some(content.as_slice()),
                "seed {seed}: a state written behind the protocol's back keeps that write"
            );
        }
        assert!(bare.tip(&bare.state_ref(path)).is_some(), "state refs stay");
    }
}

fn runs() -> u64 {
    std::env::var("GITSTATE_FOLD_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_writes_fold_once_each_over_http() {
    init_tracing();
    for seed in 0..runs() {
        let mode = if seed % 2 == 0 {
            PushMode::Atomic
        } else {
            PushMode::NoAtomic
        };
        run(Kind::Hosted(mode), 0xf01d + seed, 40).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_writes_fold_once_each_in_the_embedded_repository() {
    init_tracing();
    for seed in 0..runs() {
        run(Kind::Embedded, 0xe3b + seed, 40).await;
    }
}

/// A lease that a live holder took is respected (the fold is busy and folds nothing) until it
/// is older than the lease age; then the next fold takes it over and folds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_lease_stops_folds_only_for_the_lease_age() {
    init_tracing();
    let server = GitServer::start().await;
    let url = server.create_repo("lease");
    let bare = Bare::new(&server.repo_dir("lease"), "main");
    bare.branch_write("a.tfstate", Some(b"{}\n"), &write(1, "a.tfstate", b""));
    let w = write(2, "a.tfstate", b"{\"serial\":2}\n");
    let id = bare.state_write(&w);
    let mut lease = write(3, "lease", b"");
    lease.committer.date = format!("{} +0000", jiff_now());
    lease.message = "fold lease\n\nHolder: crashed\n".into();
    leave_lease(&bare, &lease);
    let (folder, at, _cache) = store(Some(&url), &server.repo_dir("lease"), "2").await;
    let report = folder.fold(&at).await.expect("fold");
    assert!(report.busy && report.writes == 0, "{report:?}");
    assert!(bare.folded().is_empty());
    tokio::time::sleep(std::time::Duration::from_millis(3100)).await;
    let report = folder.fold(&at).await.expect("fold");
    assert_eq!((report.busy, report.writes, report.states), (false, 1, 1));
    assert_eq!(bare.folded().get("a.tfstate"), Some(&id));
    assert_eq!(bare.tip("refs/gitstate/fold"), None);
}

fn jiff_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

/// The Lambda binary's invocations: every Function URL event of `events/` is a request, the
/// schedule's input and EventBridge's own scheduled event are the fold, anything else is an
/// error; the scheduled fold folds what waits on the state refs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lambda_schedule_folds_and_function_url_events_still_route() {
    use gitstate_app::invocation::{Invocation, invocation, scheduled_fold};
    init_tracing();
    let events = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../events");
    let mut requests = 0;
    for entry in std::fs::read_dir(&events).expect("events/") {
        let text = std::fs::read_to_string(entry.expect("entry").path()).expect("event");
        assert!(matches!(invocation(&text), Ok(Invocation::Url(_))));
        requests += 1;
    }
    assert!(requests >= 5, "{requests} events");
    let scheduled = r#"{"version":"0","id":"x","detail-type":"Scheduled Event","source":"aws.events","account":"1","time":"2026-11-25T06:00:00Z","region":"eu-west-1","resources":[],"detail":{}}"#;
    for fold in [r#"{"gitstate": "fold"}"#, scheduled] {
        assert!(matches!(invocation(fold), Ok(Invocation::Fold)), "{fold}");
    }
    for other in [r#"{"gitstate": "other"}"#, "{}", "[]", "not json"] {
        assert!(invocation(other).is_err(), "{other}");
    }

    let server = GitServer::start().await;
    let url = server.create_repo("scheduled");
    let bare = Bare::new(&server.repo_dir("scheduled"), "main");
    bare.branch_write("a.tfstate", Some(b"{}\n"), &write(1, "a.tfstate", b""));
    let id = bare.state_write(&write(2, "a.tfstate", b"{\"serial\":2}\n"));
    let cache = tempfile::tempdir().expect("tempdir");
    let mut settings = settings_for(&url, cache.path(), &[]);
    settings.runtime = gitstate_app::Runtime::Lambda;
    let app = gitstate_app::build(settings).await.expect("backend");
    let answer = scheduled_fold(&app.backend)
        .await
        .expect("the scheduled fold");
    assert_eq!(answer["writes"], 1, "{answer}");
    assert_eq!(bare.folded().get("a.tfstate"), Some(&id));
    let again = scheduled_fold(&app.backend)
        .await
        .expect("the scheduled fold");
    assert_eq!(again["writes"], 0, "nothing twice: {again}");
}

/// A fold's git requests do not grow with the writes or the states it carries: one
/// advertisement, one fetch of every unfolded chain, one push (plus the lease, the tip's trees
/// when new, and the look that finds nothing left). Generated sets of states and writes, folded
/// by a process that has never seen the repository and by one that folded before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folds_requests_do_not_grow_with_its_writes_or_states() {
    init_tracing();
    let mut rng = StdRng::seed_from_u64(0x2e9);
    let mut counts = Vec::new();
    for mode in [PushMode::Atomic, PushMode::NoAtomic] {
        let server = GitServer::start_in(mode).await;
        let url = server.create_repo("count");
        let bare = Bare::new(&server.repo_dir("count"), "main");
        bare.branch_write("README.md", Some(b"x\n"), &write(0, "README.md", b""));
        let (warm, at, _cache) = store(Some(&url), &server.repo_dir("count"), "60").await;
        let mut step = 1;
        for round in 0..4 {
            let states = [1, 3, 8, 20][round];
            let mut writes = 0;
            for s in 0..states {
                let path = format!("r{round}/s{s}.tfstate");
                bare.branch_write(&path, Some(b"{}\n"), &write(step, &path, b""));
                for _ in 0..rng.random_range(1..5) {
                    step += 1;
                    bare.state_write(&random_write(&mut rng, step, &path));
                    writes += 1;
                }
            }
            let (cold, _, _cold_cache) = store(Some(&url), &server.repo_dir("count"), "60").await;
            let which: &dyn StateStore = if round % 2 == 0 { &*warm } else { &*cold };
            server.quiesce().await;
            server.take_requests();
            let report = which.fold(&at).await.expect("fold");
            assert_eq!((report.writes, report.states), (writes, states));
            let labels = server.take_labels();
            eprintln!(
                "{mode:?} {states} states {writes} writes, {}: {labels:?}",
                if round % 2 == 0 { "warm" } else { "cold" }
            );
            counts.push(labels.len());
            assert!(labels.len() <= 9, "{labels:?}");
        }
    }
    eprintln!("requests per fold: {counts:?}");
    let (least, most) = (counts.iter().min(), counts.iter().max());
    assert!(
        most.zip(least).is_some_and(|(m, l)| m - l <= 2),
        "flat: {counts:?}"
    );
}
