//! Never a stale read, never a lost write (issue 27): generated, seeded, replayable rounds of
//! requests sent by several Terraform-like actors through several `gitstate serve` processes
//! (the Lambda shape: within a round each process serves one request at most, so no two writes
//! ever meet in one process's group commit) to the machine's `git http-backend`.
//!
//! Requests: LOCK, GET, writes under the lock (`POST ?ID=`), writes without a lock (`POST`
//! without `?ID=`, as `-lock=false`; `GITSTATE_ALLOW_UNLOCKED_WRITES=true`), deletes under the
//! lock (`DELETE /states/<name>?ID=`, after which the name may be created again, or a folder
//! relative may take its place), UNLOCK, force-unlock (`DELETE /locks` without a body), restore of
//! an older version (`POST /history/<name>?restore=<serial>`, also of serials that do not exist),
//! plain reads and history reads. Names: eight shared by every actor (folders of one another,
//! case variants, plain names), so they contend, and one per actor that only it touches. Now and
//! then a process is replaced between rounds (stopped, started again on its cache or on an empty
//! one, as Lambda replaces containers), and a fold (`gitstate fold`, a process of its own) runs
//! during a round; one more fold runs before the final checks.
//!
//! A round runs its requests at once. Each touches its own family of names (names that are a
//! folder of one another share a family), so the model predicts every answer, except in the
//! pairs a round may hold on purpose: two requests on one shared name (two LOCKs, a write and a
//! force-unlock, an unlocked write and a LOCK, two unlocked writes, a restore and a write, a
//! read during a write, …), whose answers must be those of one of the two orders (see
//! [`model::judge_pair`]).
//!
//! Asserted: every GET (a lock holder's right after its LOCK included) answers the newest
//! acknowledged version of the name (a process whose GET rests on its own LOCK's proof answers
//! as of that LOCK, see [`as_of_lock`]; only processes declared single fronts do so on a
//! binary that knows `GITSTATE_SINGLE_FRONT`, see [`Setup::single_front`]); every acknowledged write is in the state's
//! history exactly once and in order, through the history API and, after the final fold, through `git log` of
//! the branch on the bare repository; a write answered with a 5xx either left the state
//! unchanged or changed it exactly once (decided from the history) and, if it did not land,
//! never appears later; no refused write ever appears (every read and history is exact); after
//! the final fold the branch's files are the states' newest versions, and no lock is left.
//!
//! Each test runs under a setting of `GITSTATE_STATE_REFS` (`auto`, `always`): while the binary
//! does not know that setting, it is not passed and both runs exercise branch writes. While the
//! binary has no `gitstate fold` command, folds are skipped (the branch is then the only home of
//! a write, or, with state refs, the final checks read each state's newest content where the
//! design keeps it and check `git log` of the branch only when no state ref exists).
//!
//! CI runs [`CI_STEPS`] requests per test with seed [`CI_SEED`]; by hand, e.g.
//! `GITSTATE_MANY_WRITERS_SEED=5 GITSTATE_MANY_WRITERS_STEPS=3000 cargo test -p gitstate-cli
//! --test it many_writers:: -- --nocapture`. A failure prints the replay line (seed, steps) and
//! every round so far.
//!
//! `GITSTATE_MANY_WRITERS_CROWD=1` (by hand, not with a single front) sends each request of a
//! round to the first or the last process at random, so the requests of a round meet in one
//! process: concurrent reads and LOCKs share its looks, and writes its group commit.

mod model;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gitstate_tests::faults::{Fault, FaultProxy};
use gitstate_tests::process::{ServeProcess, has_command, knows_variable, run_command, serve_env};
use gitstate_tests::states::{file_at, held_lock_id, newest_stored, state_refs};
use gitstate_tests::{Client, GitServer, PushMode, git};
use model::{Answered, Effect, Model, NAMES, Op, SHARED, Version, family, own_name};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};

/// Requests CI sends per test (the test without atomic push two thirds, the one with faults
/// half): 10–30 s each on the shared 2-core machine, the four at once.
const CI_STEPS: usize = 250;
const CI_SEED: u64 = 27;
/// `gitstate serve` processes, and so the most requests in one round.
const PROCESSES: usize = 4;
/// Terraform runs, each one request at a time.
const ACTORS: usize = 6;
const REPO: &str = "writers";
const BRANCH: &str = "main";
/// Chances per round: a pair on one shared name, a fold during the round, a process replaced.
const PAIR_RATE: f64 = 0.25;
const FOLD_RATE: f64 = 0.06;
const REPLACE_RATE: f64 = 0.02;

/// What `gitstate fold` says when another fold holds the lease.
const FOLD_BUSY: &str = "another fold holds the lease";

/// The host and the backend's setting under test.
#[derive(Debug, Clone, Copy)]
struct Setup {
    push: PushMode,
    /// `GITSTATE_STATE_REFS`.
    state_refs: &'static str,
    /// Half the processes reach the git server through a proxy that fails some of its requests
    /// ([`FAULTS`]).
    faults: bool,
    /// Every process is the single front of the actors it serves (`GITSTATE_SINGLE_FRONT`):
    /// each actor's requests all reach one process (actor `a` through process `a % PROCESSES`),
    /// and a GET after a LOCK may rest on what the LOCK proved there.
    single_front: bool,
    /// The Lambda's folds: no serve process folds after its writes (the fold lease is held by
    /// hand, see [`World::lambda_folds`]); only the test's own `gitstate fold` runs, at random
    /// points, as the template's schedule would. Also `GITSTATE_MANY_WRITERS_LAMBDA_FOLDS=1`.
    lambda_folds: bool,
}

/// Share of git requests of the faulty processes that fail, and how (never a stall: each would
/// cost a timeout).
const FAULT_RATE: f64 = 0.12;
const FAULTS: [Fault; 4] = [
    Fault::Refuse(500),
    Fault::Refuse(503),
    Fault::LoseAnswer,
    Fault::CutBody,
];

/// What an actor is doing: nothing, or holding (as far as it knows) a lock.
#[derive(Debug, Clone)]
enum Actor {
    Idle,
    Holding {
        name: &'static str,
        id: String,
        read: bool,
    },
}

/// The world: the git server, the processes, a client for each, and how to fold.
struct World {
    server: GitServer,
    clients: Vec<Arc<Client>>,
    procs: Vec<ServeProcess>,
    /// The environment of `gitstate fold`, when the binary has that command.
    fold: Option<Vec<(String, String)>>,
    /// Whether the binary knows `GITSTATE_STATE_REFS` (else the setting is not passed).
    state_refs: bool,
    /// The proxy the faulty processes go through.
    proxy: Option<FaultProxy>,
    /// How long a LOCK's proof answers a GET in these processes (see [`as_of_lock`]).
    proof_window: Option<Duration>,
    /// See `Model::strict_proofs`.
    strict_proofs: bool,
    /// [`Setup::lambda_folds`]: the fold lease is held by hand except while one
    /// of the test's own folds runs, so no background fold of a `serve` moves the branch right
    /// after a write (the Lambda shape, where folds run on a schedule).
    lambda_folds: bool,
    /// See [`Setup::single_front`].
    single_front: bool,
    _root: tempfile::TempDir,
}

/// Take the fold lease by hand, dated a day ahead so no fold takes it over, if it is free
/// (a running fold's lease is left alone: tried again for a while).
fn hold_folds(repo: &Path) {
    let date = format!("{} +0000", jiff::Timestamp::now().as_second() + 86_400);
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("--git-dir")
            .arg(repo)
            .args(args)
            .env("GIT_COMMITTER_DATE", &date)
            .env("GIT_AUTHOR_DATE", &date)
            .env("GIT_COMMITTER_NAME", "test")
            .env("GIT_COMMITTER_EMAIL", "test@example.invalid")
            .env("GIT_AUTHOR_NAME", "test")
            .env("GIT_AUTHOR_EMAIL", "test@example.invalid")
            .output()
            .expect("git runs")
    };
    let tree =
        String::from_utf8_lossy(&git(&["hash-object", "-t", "tree", "-w", "/dev/null"]).stdout)
            .trim()
            .to_owned();
    let lease = String::from_utf8_lossy(
        &git(&["commit-tree", &tree, "-m", "fold lease held by the test"]).stdout,
    )
    .trim()
    .to_owned();
    for _ in 0..100 {
        if git(&["update-ref", "refs/gitstate/fold", &lease, &"0".repeat(40)])
            .status
            .success()
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Let go of a lease [`hold_folds`] took (any lease there: only the test holds one then).
fn free_folds(repo: &Path) {
    let _ = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(repo)
        .args(["update-ref", "-d", "refs/gitstate/fold"])
        .output();
}

impl World {
    async fn start(setup: Setup, seed: u64) -> Self {
        let binary = Path::new(crate::GITSTATE);
        let server = GitServer::start_in(setup.push).await;
        let url = server.create_repo(REPO);
        // Reflogs, so that a failure can tell when a ref was made.
        git(
            &["config", "core.logAllRefUpdates", "always"],
            Some(&server.repo_dir(REPO)),
        );
        let mut proxy = None;
        if setup.faults {
            // receive-pack's gc runs inside the push that starts it (a detached one could
            // remove a pack a later read of the test needs).
            git(
                &["config", "gc.autoDetach", "false"],
                Some(&server.repo_dir(REPO)),
            );
            let faults = FAULTS.to_vec();
            proxy = Some(FaultProxy::start(server.address, seed, FAULT_RATE, faults).await);
        }
        let root = tempfile::tempdir().expect("tempdir");
        let state_refs = knows_variable(binary, "GITSTATE_STATE_REFS", setup.state_refs).await;
        let mut extra = vec![("GITSTATE_ALLOW_UNLOCKED_WRITES", "true")];
        if state_refs {
            extra.push(("GITSTATE_STATE_REFS", setup.state_refs));
        }
        // Where the binary knows `GITSTATE_LOCK_PROOF_MS`, every process answers from its
        // LOCK's proof, and waits out another's before it writes under that lock or releases
        // it: windows short enough that those waits (the window and a quarter second) keep
        // rounds quick. Before it, where the binary knows `GITSTATE_SINGLE_FRONT`, a GET rests
        // on a LOCK's proof only where a single front is declared ([`Setup::single_front`]),
        // for 5 s (a second more for the test's own pace); before that setting, the floor's
        // first proof answered for 60 s (a few seconds more).
        let strict_proofs = knows_variable(binary, "GITSTATE_LOCK_PROOF_MS", "300").await;
        let fronts = knows_variable(binary, "GITSTATE_SINGLE_FRONT", "false").await;
        if fronts && setup.single_front {
            extra.push(("GITSTATE_SINGLE_FRONT", "true"));
        }
        let window_ms = if setup.single_front { "1000" } else { "300" };
        let proof_window = match fronts {
            _ if setup.push == PushMode::NoAtomic => None,
            _ if strict_proofs => {
                extra.push(("GITSTATE_LOCK_PROOF_MS", window_ms));
                Some(Duration::from_secs(2))
            }
            true if setup.single_front => Some(Duration::from_secs(6)),
            true => None,
            false => Some(Duration::from_secs(65)),
        };
        let mut procs = Vec::new();
        for i in 0..PROCESSES {
            let dir = root.path().join(format!("serve-{i}"));
            std::fs::create_dir_all(&dir).expect("server dir");
            let url = match &proxy {
                Some(proxy) if i >= PROCESSES / 2 => proxy.url(REPO),
                _ => url.clone(),
            };
            procs.push(ServeProcess::start(binary, &dir, serve_env(&url, &extra)).await);
        }
        let clients: Vec<Arc<Client>> = procs
            .iter()
            .map(|p| Arc::new(Client::new(&p.url)))
            .collect();
        let fold = has_command(binary, "fold").await.then(|| {
            let mut env = serve_env(&url, &extra);
            let cache = root.path().join("fold-cache");
            env.push(("GITSTATE_CACHE_DIR".into(), cache.display().to_string()));
            env
        });
        let lambda_folds =
            setup.lambda_folds || env_number("GITSTATE_MANY_WRITERS_LAMBDA_FOLDS") == Some(1);
        if lambda_folds {
            hold_folds(&server.repo_dir(REPO));
        }
        Self {
            server,
            clients,
            procs,
            fold,
            state_refs,
            proxy,
            proof_window,
            strict_proofs,
            lambda_folds,
            single_front: setup.single_front,
            _root: root,
        }
    }

    /// A container replaced between rounds: process `i` stops and starts again, on its cache or
    /// (when `cold`) on an empty one, so its next request reads cold.
    async fn replace(&mut self, i: usize, cold: bool) {
        let process = &mut self.procs[i];
        process.kill9().await;
        if cold {
            std::fs::remove_dir_all(&process.cache).expect("remove the cache");
        }
        process.restart().await;
        self.clients[i] = Arc::new(Client::new(&process.url));
    }

    fn repo(&self) -> PathBuf {
        self.server.repo_dir(REPO)
    }

    /// `gitstate fold`, now: its exit status and what it said (`None` without the command).
    fn fold(&self) -> Option<impl Future<Output = (bool, String)> + use<>> {
        let env = self.fold.clone()?;
        Some(async move {
            let out = run_command(Path::new(crate::GITSTATE), &["fold"], &env).await;
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            (out.status.success(), said)
        })
    }
}

/// The next request of an actor, on a family no other request of the round touches.
fn next_op(
    rng: &mut StdRng,
    model: &mut Model,
    actor: &Actor,
    who: usize,
    taken: &BTreeSet<usize>,
) -> Option<Op> {
    if let Actor::Holding { name, id, read } = actor {
        if taken.contains(&family(name)) {
            return None;
        }
        let id = id.clone();
        return Some(match rng.random_range(0..100) {
            // Terraform reads right after its LOCK.
            _ if !read => Op::Get { name },
            0..60 => {
                model.writes += 1;
                let version = Version {
                    serial: model.next_serial(name),
                    marker: format!("w{}-a{who}", model.writes),
                };
                Op::Write { name, id, version }
            }
            60..65 => Op::Delete { name, id },
            65..85 => Op::Unlock { name, id },
            _ => Op::Get { name },
        });
    }
    let own = own_name(who);
    let name = if rng.random_bool(0.3) && !taken.contains(&family(own)) {
        own
    } else {
        let free: Vec<&'static str> = NAMES[..SHARED]
            .iter()
            .copied()
            .filter(|n| !taken.contains(&family(n)))
            .collect();
        *free.choose(rng)?
    };
    Some(match rng.random_range(0..100) {
        0..45 => {
            model.writes += 1;
            let id = format!("lock-{}-a{who}", model.writes);
            model.ids.insert(id.clone());
            Op::Lock { name, id }
        }
        45..57 => unlocked_write(model, name, who),
        57..70 => Op::Get { name },
        70..78 => Op::ForceUnlock { name },
        78..90 => restore(rng, model, name).unwrap_or(Op::History { name }),
        _ => Op::History { name },
    })
}

fn unlocked_write(model: &mut Model, name: &'static str, who: usize) -> Op {
    model.writes += 1;
    let version = Version {
        serial: model.next_serial(name),
        marker: format!("u{}-a{who}", model.writes),
    };
    Op::WriteUnlocked { name, version }
}

/// A restore of a serial: mostly one that exists, sometimes any (which may not); never one that
/// two versions share (after a delete), which would restore either.
fn restore(rng: &mut StdRng, model: &mut Model, name: &'static str) -> Option<Op> {
    let top = model.issued.get(name).copied().unwrap_or(0) + 1;
    let stored: Vec<u64> = model.serials(name).into_iter().flatten().collect();
    let serial = match stored.choose(rng) {
        Some(serial) if rng.random_bool(0.75) => *serial,
        _ => rng.random_range(1..=top),
    };
    let shared = model.only_version(name, serial).is_none()
        && model
            .history
            .get(name)
            .into_iter()
            .flatten()
            .flatten()
            .any(|v| v.serial == serial);
    (!shared).then_some(Op::Restore { name, serial })
}

/// A second request on the name of `first`, by `other` (idle), whose answer and `first`'s tell
/// the order they ran in: the pairs whose two orders could leave different states with the same
/// answers (a force-unlock and a LOCK) are not planned.
///
/// UNLOCKED_WRITE_TAKES_NO_LOCK: an unlocked write is paired with neither a restore nor a LOCK
/// of its state until unlocked writes take the state's lock (issue 27's design, i27store):
/// today an unlocked write that advertised before a lock was taken still lands under that
/// lock. A restore, numbered from what it read under the lock, then carries the same serial as
/// the write and lands on top of it (seed 27); a holder whose GET is answered as of its LOCK
/// then misses the write (long run seed 41).
fn second_of_pair(rng: &mut StdRng, model: &mut Model, first: &Op, other: usize) -> Option<Op> {
    let name = first.name();
    model.writes += 1;
    let id = format!("race-{}-a{other}", model.writes);
    model.ids.insert(id.clone());
    let lock = Op::Lock { name, id };
    let get = Op::Get { name };
    Some(match (first, rng.random_range(0..4)) {
        (_, 0) => get,
        (Op::Lock { .. } | Op::Restore { .. }, _) => lock,
        (Op::Unlock { .. }, _) => {
            if rng.random_bool(0.5) {
                lock
            } else {
                unlocked_write(model, name, other)
            }
        }
        (Op::Write { .. } | Op::Delete { .. }, 1 | 2) => Op::ForceUnlock { name },
        (Op::Write { .. } | Op::Delete { .. }, _) => unlocked_write(model, name, other),
        (Op::WriteUnlocked { .. }, 1 | 2) => unlocked_write(model, name, other),
        // Not yet a restore or a LOCK (UNLOCKED_WRITE_TAKES_NO_LOCK).
        (Op::WriteUnlocked { .. }, _) => Op::ForceUnlock { name },
        _ => get,
    })
}

/// A round: at most one request per process and per family, bar one planned pair on a shared
/// name.
fn plan_round(rng: &mut StdRng, model: &mut Model, actors: &[Actor]) -> Vec<(usize, Op)> {
    let mut order: Vec<usize> = (0..ACTORS).collect();
    order.shuffle(rng);
    let size = rng.random_range(1..=PROCESSES);
    let mut taken = BTreeSet::new();
    let mut round = Vec::new();
    for who in order {
        if round.len() == size {
            break;
        }
        if let Some(op) = next_op(rng, model, &actors[who], who, &taken) {
            taken.insert(family(op.name()));
            round.push((who, op));
        }
    }
    let idle = (0..ACTORS)
        .find(|a| matches!(actors[*a], Actor::Idle) && round.iter().all(|(who, _)| who != a));
    if let (Some(other), true) = (idle, round.len() < PROCESSES && rng.random_bool(PAIR_RATE)) {
        let shared: Vec<&Op> = round
            .iter()
            .map(|(_, op)| op)
            .filter(|op| family(op.name()) < SHARED)
            .collect();
        if let Some(first) = shared.choose(rng).map(|op| (*op).clone())
            && let Some(second) = second_of_pair(rng, model, &first, other)
        {
            round.push((other, second));
        }
    }
    round
}

/// A request answered with a 5xx, to settle against the repository: the name, what it may have
/// written (`Some(None)`: a delete), and how long the name's history was before the round.
type Unsure = (&'static str, Option<Option<Version>>, usize);

/// Judge a round's answers against the model as it was before the round, then apply them.
fn settle_round(
    model: &mut Model,
    actors: &mut [Actor],
    round: &[(usize, Op)],
    answers: &[(u16, String)],
    procs: &[usize],
) -> Result<Vec<Unsure>, String> {
    model.rounds += 1;
    for (_, op) in round {
        if let Op::WriteUnlocked { name, .. } = op {
            model.unlocked_sent.insert(name, model.rounds);
        }
    }
    let answers = &as_of_lock(model, round, answers, procs)?;
    let answered: Vec<Answered<'_>> = round
        .iter()
        .zip(answers)
        .map(|((_, op), (status, body))| (op, *status, body.as_str()))
        .collect();
    let mut effects = Vec::new();
    let mut done = vec![false; round.len()];
    for i in 0..round.len() {
        for j in i + 1..round.len() {
            if round[i].1.name() != round[j].1.name() {
                continue;
            }
            model.count(format!(
                "pair {} + {}",
                round[i].1.kind(),
                round[j].1.kind()
            ));
            let pair = model::judge_pair(model, [answered[i], answered[j]])?;
            effects.extend(pair);
            done[i] = true;
            done[j] = true;
        }
    }
    for (i, answer) in answered.iter().enumerate() {
        if !done[i] {
            effects.push(model::judge(model, *answer)?);
        }
    }
    // The actors learn what their own answers said.
    for ((who, op), (status, _)) in round.iter().zip(answers) {
        model.count(format!("{} {status}", op.kind()));
        if matches!(op, Op::Lock { .. }) && *status == 200 && model.tree_clash(op.name()) {
            model.count("LOCK of a folder of a state granted (LOCK_ON_A_FOLDER_AT_THE_FLOOR)");
        }
        let actor = &mut actors[*who];
        match (op, &mut *actor) {
            (Op::Lock { name, id }, Actor::Idle) if *status == 200 => {
                *actor = Actor::Holding {
                    name,
                    id: id.clone(),
                    read: false,
                }
            }
            (Op::Get { .. }, Actor::Holding { read, .. }) => *read = true,
            (Op::Unlock { .. }, _) => *actor = Actor::Idle,
            (Op::Write { .. }, Actor::Holding { .. }) if *status != 200 => *actor = Actor::Idle,
            _ => {}
        }
    }
    let mut unsure = Vec::new();
    for effect in &effects {
        if let Effect::Unsure(name, wrote) = effect {
            let before = model.history.get(name).map_or(0, Vec::len);
            unsure.push((*name, wrote.clone(), before));
        }
    }
    for effect in &effects {
        model.apply(effect);
    }
    for ((_, op), (p, (status, _))) in round.iter().zip(procs.iter().zip(answers)) {
        if matches!(op, Op::Lock { .. }) && *status == 200 {
            let proved = model.newest(op.name()).cloned();
            let at = std::time::Instant::now();
            model.proofs.insert((*p, op.name()), (proved, at));
            model.proof_rounds.insert((*p, op.name()), model.rounds);
        }
    }
    Ok(unsure)
}

/// The LOCK proof: where a process answers the GETs of a name after its own LOCK of it
/// from what that LOCK push proved, it answers as of that LOCK, even when the holder wrote since
/// through another process (found as a stale read with seed 1; now only with
/// `GITSTATE_SINGLE_FRONT=true`, see [`a_lock_proof_never_answers_after_a_write_through_another_process`]).
/// Where the processes may (`Model::proof_window`), such an answer (exactly the proved version,
/// through exactly that process, in the window) is counted and judged as the newest; any other
/// read must be the newest. A GET leaves the proof standing (the process answers every GET in
/// the window from it); any other request of the process on the name ends it.
///
/// Where every process waits out another's proof before it writes under that lock or releases
/// it (`Model::strict_proofs`), such an answer is a stale read (an error), unless an unlocked
/// write of the name was sent in the LOCK's round or since (it asserts no lock, so its push may
/// land right after the LOCK's).
fn as_of_lock(
    model: &mut Model,
    round: &[(usize, Op)],
    answers: &[(u16, String)],
    procs: &[usize],
) -> Result<Vec<(u16, String)>, String> {
    let mut out = answers.to_vec();
    for (((_, op), p), answer) in round.iter().zip(procs).zip(&mut out) {
        let name = op.name();
        let key = (*p, name);
        let proof = if matches!(op, Op::Get { .. }) {
            model.proofs.get(&key).cloned()
        } else {
            model.proof_rounds.remove(&key);
            model.proofs.remove(&key)
        };
        let Some((proved, at)) = proof else {
            continue;
        };
        let got = (answer.0 == 200).then(|| Version::of(&answer.1)).flatten();
        let stale = matches!(op, Op::Get { .. })
            && model
                .proof_window
                .is_some_and(|window| at.elapsed() <= window)
            && (answer.0 == 200 || answer.0 == 404)
            && got == proved
            && model.newest(name).cloned() != proved;
        let raced = model.unlocked_sent.get(name) >= model.proof_rounds.get(&key);
        if stale && model.strict_proofs && !raced {
            return Err(format!(
                "stale read: a GET of {name} through process {p} answered what its LOCK proved \
                 ({proved:?}), not the newest acknowledged version ({:?}), and no unlocked \
                 write of the name was sent since the LOCK",
                model.newest(name)
            ));
        }
        if stale {
            model.count("GET answered as of the LOCK through that process (the LOCK proof)");
            eprintln!("read of {name} as of the LOCK through process {p}: {proved:?}");
            *answer = match model.newest(name) {
                Some(newest) => (200, newest.body(name)),
                None => (404, String::new()),
            };
        }
    }
    Ok(out)
}

/// The whole history of `name` through the history API (every page), oldest first.
async fn api_serials(client: &Client, name: &str) -> Vec<Option<u64>> {
    let mut serials = Vec::new();
    let mut page = Some(0);
    while let Some(p) = page {
        let answer = client
            .history(name, &format!("per_page=100&page={p}"))
            .await
            .expect(200)
            .history();
        serials.extend(model::page_serials(&answer));
        page = answer.next_page;
    }
    serials.reverse();
    serials
}

/// Requests answered with a 5xx: once the git server is quiet, each state's history is the
/// model's, unchanged (what the request would have written never lands: it must never appear)
/// or with that write once, after what the name had before the round; and the lock of each
/// name is what the repository says (a LOCK may have landed, an UNLOCK not, and the lock the
/// backend takes for a restore or an unlocked write may be left behind).
async fn settle_unsure(
    world: &World,
    model: &mut Model,
    actors: &mut [Actor],
    round: &[(usize, Op)],
    unsure: Vec<Unsure>,
) -> Result<(), String> {
    if unsure.is_empty() {
        return Ok(());
    }
    world.server.quiesce().await;
    for (name, wrote, before) in unsure {
        model.count("5xx settled");
        if let Some(wrote) = wrote {
            settle_write(world, model, name, wrote, before).await?;
        }
        let held = held_lock_id(&world.repo(), name);
        if held.as_ref() != model.locks.get(name) {
            model.count(format!("lock after a 5xx: {}", held.is_some()));
            eprintln!(
                "lock of {name} after a 5xx: {held:?}, model {:?}",
                model.locks.get(name)
            );
        }
        match held {
            Some(id) => {
                if !model.ids.contains(&id) {
                    model.count("lock the backend took left after a 5xx");
                }
                for (who, op) in round {
                    if let (Op::Lock { id: sent, .. }, Actor::Idle) = (op, &actors[*who])
                        && *sent == id
                    {
                        actors[*who] = Actor::Holding {
                            name,
                            id: id.clone(),
                            read: false,
                        };
                    }
                }
                model.locks.insert(name, id);
            }
            None => {
                model.locks.remove(name);
            }
        }
    }
    Ok(())
}

/// What a 5xx request may have written: in the history once after `before`, or not at all.
async fn settle_write(
    world: &World,
    model: &mut Model,
    name: &'static str,
    wrote: Option<Version>,
    before: usize,
) -> Result<(), String> {
    let got = api_serials(&world.clients[0], name).await;
    let want = model.serials(name);
    let serial = wrote.as_ref().map(|v| v.serial);
    eprintln!("5xx {name} {wrote:?}: history {got:?}, model {want:?}");
    if got == want {
        // A write's own content never appears later (the history comparisons, exact, also say
        // so); a restore's content is an older version's, which a later restore may write
        // again with the same serial, so only writes are remembered here.
        let fresh = |v: &Version| {
            let mut versions = model.history.values().flatten().flatten();
            !versions.any(|h| h.marker == v.marker)
        };
        if let Some(version) = wrote.filter(fresh) {
            model.unsure.push((name, version));
        }
        return Ok(());
    }
    let landed = (before..=want.len()).find(|&at| {
        let mut with = want.clone();
        with.insert(at, serial);
        with == got
    });
    let Some(at) = landed else {
        return Err(format!(
            "a request answered with a 5xx changed {name} other than once: history {got:?}, \
             model {want:?}, the request's {wrote:?}"
        ));
    };
    model.count("5xx that landed");
    model.history.entry(name).or_default().insert(at, wrote);
    Ok(())
}

/// What the repository holds of `name`, for a failure's report: its history as a read must see
/// it, each commit with its subject and version, and its lock.
fn describe_stored(repo: &Path, name: &str) -> String {
    let history: Vec<String> = gitstate_tests::states::stored_history(repo, BRANCH, name)
        .into_iter()
        .map(|(commit, content)| {
            let subject = git(&["log", "-1", "--format=%s", &commit], Some(repo));
            let version = content.map(|c| Version::of(&String::from_utf8_lossy(&c)));
            format!("{} {} {version:?}", &commit[..10], subject.trim())
        })
        .collect();
    let lock = held_lock_id(repo, name);
    format!("lock {lock:?}, history {history:?}")
}

/// `git log` of the branch: the versions of `name`, oldest first (a delete is `None`).
fn logged_versions(repo: &Path, name: &str) -> Result<Vec<Option<Version>>, String> {
    gitstate_tests::states::file_log(repo, BRANCH, name)
        .into_iter()
        .map(|(commit, content)| match content {
            None => Ok(None),
            Some(body) => {
                let body = String::from_utf8_lossy(&body);
                Version::of(&body)
                    .map(Some)
                    .ok_or_else(|| format!("{commit}:{name} is not ours: {body}"))
            }
        })
        .collect()
}

/// The branch between rounds, folded or not: a state is on it iff the model has it, its file is
/// a version the state had (never one that was not written), never older than the one the branch
/// showed before (a fold replays in order, never back), and the newest one while no state has a
/// ref of its own.
fn check_branch(
    repo: &Path,
    model: &Model,
    shown: &mut BTreeMap<&'static str, Version>,
) -> Result<(), String> {
    let current = state_refs(repo).is_empty();
    for name in NAMES {
        let file = file_at(repo, &format!("refs/heads/{BRANCH}"), name);
        let (body, newest) = match (file, model.newest(name)) {
            (None, None) => continue,
            (Some(body), Some(newest)) => (body, newest),
            (file, newest) => {
                return Err(format!(
                    "{name}: on the branch {}, newest {newest:?}",
                    file.is_some()
                ));
            }
        };
        let history = model
            .history
            .get(name)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let position = |v: &Version| history.iter().rposition(|h| h.as_ref() == Some(v));
        let version = Version::of(&String::from_utf8_lossy(&body));
        let at = version
            .as_ref()
            .and_then(position)
            .ok_or_else(|| format!("{name} on the branch is {version:?}, never written"))?;
        if let Some(before) = shown.get(name).and_then(position)
            && at < before
        {
            return Err(format!("{name} went back on the branch to {version:?}"));
        }
        if current && version.as_ref() != Some(newest) {
            return Err(format!(
                "{name} on the branch is {version:?}, newest {newest:?}, and no state ref"
            ));
        }
        shown.insert(name, version.unwrap_or_else(|| newest.clone()));
    }
    Ok(())
}

/// The end: every version of every state through the history API and (after the final fold)
/// in `git log` of the branch, each state's newest content, and the branch's files.
async fn final_checks(world: &World, model: &Model, folded: bool) -> Result<(), String> {
    let repo = world.repo();
    let files = git(&["ls-tree", "-r", "--name-only", BRANCH], Some(&repo));
    let files: BTreeSet<&str> = files
        .lines()
        .filter(|f| !f.starts_with(".gitstate/"))
        .collect();
    let stored: BTreeSet<&str> = NAMES
        .iter()
        .copied()
        .filter(|n| model.newest(n).is_some())
        .collect();
    if files != stored {
        return Err(format!("branch files {files:?}, stored {stored:?}"));
    }
    // Without a fold, a state ref may be ahead of the branch; after one, the branch is current.
    let branch_current = folded || state_refs(&repo).is_empty();
    for (name, want) in &model.history {
        if let Some(newest) = model.newest(name) {
            let content = newest_stored(&repo, BRANCH, name).unwrap_or_default();
            let stored = Version::of(&String::from_utf8_lossy(&content));
            if stored.as_ref() != Some(newest) {
                return Err(format!("{name} stored: {stored:?}, newest {newest:?}"));
            }
            let on_branch = Version::of(&git(&["show", &format!("{BRANCH}:{name}")], Some(&repo)));
            if branch_current && on_branch.as_ref() != Some(newest) {
                return Err(format!(
                    "{name} on the branch: {on_branch:?}, newest {newest:?}"
                ));
            }
        }
        let serials = api_serials(&world.clients[0], name).await;
        if serials != model.serials(name) {
            return Err(format!(
                "history API of {name}: {serials:?}, model {:?}",
                model.serials(name)
            ));
        }
        // Each commit of the branch that changed the file (not one below it, when the name was
        // a folder later), with its content.
        if branch_current {
            let versions = logged_versions(&repo, name)?;
            if &versions != want {
                return Err(format!(
                    "git log of {name}:\n{versions:?}\nmodel:\n{want:?}"
                ));
            }
        }
    }
    for (name, version) in &model.unsure {
        if model
            .history
            .get(name)
            .is_some_and(|h| h.contains(&Some(version.clone())))
        {
            return Err(format!("unacknowledged {name} {version:?} in the history"));
        }
    }
    // No lock is left: every holder released its own at the end.
    let refs = git(
        &["for-each-ref", "--format=%(refname)", "refs/heads/locks/"],
        Some(&repo),
    );
    if !refs.trim().is_empty() {
        // Which lock, made when, and (reflogs are on) every update of its ref since it was
        // last created: a lock made again after its release shows there.
        // Asked without failing, so that the answer is this message, whatever git says.
        let said = |args: &[&str]| {
            std::process::Command::new("git")
                .args(args)
                .current_dir(&repo)
                .output()
                .map(|out| {
                    let text = [out.stdout, out.stderr].concat();
                    String::from_utf8_lossy(&text).trim().to_owned()
                })
                .unwrap_or_else(|e| format!("git did not run: {e}"))
        };
        let told: Vec<String> = refs
            .lines()
            .map(|name| {
                let commit = said(&["log", "-1", "--format=%H %cd %s", name]);
                let lock = name.trim_start_matches("refs/heads/locks/");
                let file = said(&["show", &format!("{name}:{lock}.lock")]);
                let reflog = said(&["reflog", "show", "--date=iso", name]);
                format!("{name}: {commit}  {file}\n  reflog: {reflog}")
            })
            .collect();
        return Err(format!("locks left:\n{}", told.join("\n")));
    }
    Ok(())
}

/// The last fold, once the processes' own folds are done: it may find another's lease for a
/// while (a process replaced with kill -9 during its background fold leaves its lease until
/// it ages out, `GITSTATE_FOLD_LEASE_SECS`, 60 s), never fail for good.
async fn final_fold(world: &World) -> Result<bool, String> {
    if world.lambda_folds {
        free_folds(&world.repo());
    }
    let mut said = String::new();
    for _ in 0..150 {
        let Some(fold) = world.fold() else {
            return Ok(false);
        };
        world.server.quiesce().await;
        let (ok, out) = fold.await;
        if out.contains("not folded") {
            return Err(format!("the final fold refused states: {out}"));
        }
        // Another fold (a process's own, after its writes) holds the lease: it may have looked
        // before the last writes; this one must run itself. (Busy exits non-zero.)
        if ok && out.contains(FOLD_BUSY) {
            return Err(format!("a fold said busy yet exited 0: {out}"));
        }
        if ok {
            return Ok(true);
        }
        said = out;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(format!("the final fold failed: {said}"))
}

/// One round: plan it, send its requests at once (each through another process), with a fold
/// alongside now and then, and judge the answers.
async fn round(
    world: &World,
    rng: &mut StdRng,
    model: &mut Model,
    actors: &mut [Actor],
    log: &mut Vec<String>,
) -> Result<bool, String> {
    let round = plan_round(rng, model, actors);
    let mut procs: Vec<usize> = (0..PROCESSES).collect();
    procs.shuffle(rng);
    if world.single_front {
        procs = round.iter().map(|(who, _)| who % PROCESSES).collect();
    } else if env_number("GITSTATE_MANY_WRITERS_CROWD") == Some(1) {
        procs = round
            .iter()
            .map(|_| {
                if rng.random_bool(0.5) {
                    0
                } else {
                    PROCESSES - 1
                }
            })
            .collect();
    }
    let tasks: Vec<_> = round
        .iter()
        .zip(&procs)
        .map(|((_, op), p)| {
            let (op, client) = (op.clone(), world.clients[*p].clone());
            tokio::spawn(async move { op.send(&client).await })
        })
        .collect();
    let chosen = world.fold().filter(|_| rng.random_bool(FOLD_RATE));
    if chosen.is_some() && world.lambda_folds {
        free_folds(&world.repo());
    }
    let fold = chosen.map(tokio::spawn);
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.map_err(|e| format!("request task: {e}"))?);
    }
    model.sent += round.len();
    let mut line: Vec<String> = round
        .iter()
        .zip(&answers)
        .map(|((who, op), (status, _))| format!("a{who} {op:?} -> {status}"))
        .collect();
    let folded = fold.is_some();
    if let Some(fold) = fold {
        let (ok, said) = fold.await.map_err(|e| format!("fold task: {e}"))?;
        if world.lambda_folds {
            hold_folds(&world.repo());
        }
        let outcome = match (ok, said.contains(FOLD_BUSY)) {
            (false, true) => "busy",
            (true, false) => "folded",
            (true, true) => return Err(format!("a fold said busy yet exited 0: {said}")),
            (false, false) => "failed",
        };
        model.count(format!("fold during a round: {outcome}"));
        line.push(format!("fold -> {outcome}: {}", said.trim()));
        // Nobody writes the branch behind gitstate here: a state the fold will not fold is a bug.
        if said.contains("not folded") {
            return Err(format!("a fold refused states: {said}\nround: {line:?}"));
        }
    }
    log.push(format!("{line:?}"));
    let unsure = settle_round(model, actors, &round, &answers, &procs).map_err(|e| {
        let names: BTreeSet<&str> = round.iter().map(|(_, op)| op.name()).collect();
        let stored: Vec<String> = names
            .iter()
            .map(|name| format!("{name}: {}", describe_stored(&world.repo(), name)))
            .collect();
        format!("{e}\nin the repository now:\n{}", stored.join("\n"))
    })?;
    settle_unsure(world, model, actors, &round, unsure).await?;
    Ok(folded)
}

/// Run the steps; on a failure, keep the repository where `GITSTATE_MANY_WRITERS_KEEP` says
/// (a folder), to look into with git.
async fn run(seed: u64, steps: usize, setup: Setup) -> Result<(Model, String), String> {
    let mut world = World::start(setup, seed).await;
    let outcome = steps_and_checks(&mut world, seed, steps, setup).await;
    if outcome.is_err()
        && let Ok(keep) = std::env::var("GITSTATE_MANY_WRITERS_KEEP")
    {
        let to = Path::new(&keep).join(format!("{}-{seed}", setup.state_refs));
        let copied = std::process::Command::new("cp")
            .arg("-r")
            .arg(world.repo())
            .arg(&to)
            .status();
        eprintln!("repository kept in {} ({copied:?})", to.display());
        let logs = Path::new(&keep).join(format!("{}-{seed}-serve", setup.state_refs));
        let copied = std::process::Command::new("cp")
            .arg("-r")
            .arg(world._root.path())
            .arg(&logs)
            .status();
        eprintln!("serve logs kept in {} ({copied:?})", logs.display());
    }
    outcome
}

async fn steps_and_checks(
    world: &mut World,
    seed: u64,
    steps: usize,
    setup: Setup,
) -> Result<(Model, String), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model = Model {
        proof_window: world.proof_window,
        strict_proofs: world.strict_proofs,
        ..Model::default()
    };
    let mut actors = vec![Actor::Idle; ACTORS];
    let mut log = Vec::new();
    let mut shown = BTreeMap::new();
    while model.sent < steps {
        let folded = round(world, &mut rng, &mut model, &mut actors, &mut log).await;
        let checked = match folded {
            Ok(true) => check_branch(&world.repo(), &model, &mut shown),
            Ok(false) if log.len() % 10 == 0 => check_branch(&world.repo(), &model, &mut shown),
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        };
        checked.map_err(|e| format!("{e}\nrounds:\n{}", log.join("\n")))?;
        if rng.random_bool(REPLACE_RATE) {
            let (i, cold) = (rng.random_range(0..PROCESSES), rng.random_bool(0.5));
            world.replace(i, cold).await;
            model.proofs.retain(|(p, _), _| *p != i);
            model.proof_rounds.retain(|(p, _), _| *p != i);
            model.count(format!("process replaced, cold {cold}"));
        }
    }
    if let Some(proxy) = &world.proxy {
        proxy.set_enabled(false);
        model.count(format!(
            "git requests failed by the proxy: {}",
            proxy.injected().len()
        ));
    }
    // Every holder releases what it still holds; a lock left by a failed request is forced.
    for actor in &actors {
        if let Actor::Holding { name, id, .. } = actor
            && model.locks.get(name) == Some(id)
        {
            world.clients[0].unlock(name, id).await.expect(200);
            model.locks.remove(name);
        }
    }
    for name in std::mem::take(&mut model.locks).into_keys() {
        world.clients[0].force_unlock(name).await.expect(200);
    }
    let folded = final_fold(world).await?;
    final_checks(world, &model, folded)
        .await
        .map_err(|e| format!("{e}\nrounds:\n{}", log.join("\n")))?;
    let refs = state_refs(&world.repo()).len();
    let shape = format!(
        "GITSTATE_STATE_REFS {}, fold {}, {refs} state refs at the end",
        if world.state_refs {
            setup.state_refs
        } else {
            "unknown to the binary"
        },
        if folded {
            "run"
        } else {
            "unknown to the binary"
        },
    );
    Ok((model, shape))
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_writers_never_read_stale_and_never_lose_a_write() {
    let setup = Setup {
        push: PushMode::Atomic,
        state_refs: "auto",
        faults: false,
        single_front: false,
        lambda_folds: false,
    };
    many_writers(setup, CI_STEPS).await;
}

/// Every update of an existing state to its state ref (the Lambda binary's default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_writers_with_state_refs_always() {
    let setup = Setup {
        push: PushMode::Atomic,
        state_refs: "always",
        faults: false,
        single_front: false,
        lambda_folds: false,
    };
    many_writers(setup, CI_STEPS).await;
}

/// A host without atomic push (Azure DevOps, CodeCommit), where a write under a lock checks the
/// lock as of its advertisement; two thirds of the requests in CI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_writers_without_atomic_push() {
    let setup = Setup {
        push: PushMode::NoAtomic,
        state_refs: "auto",
        faults: false,
        single_front: false,
        lambda_folds: false,
    };
    many_writers(setup, CI_STEPS * 2 / 3).await;
}

/// Half the processes reach the git server through a proxy that fails 12 % of their git
/// requests (refused, answer lost after the server acted, body cut): every 5xx must leave each
/// state unchanged or changed once, never a wrong read; half the requests in CI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_writers_with_git_faults() {
    let setup = Setup {
        push: PushMode::Atomic,
        state_refs: "auto",
        faults: true,
        single_front: false,
        lambda_folds: false,
    };
    many_writers(setup, CI_STEPS / 2).await;
}

/// Each process the single front of the actors it serves: GETs after a LOCK rest on what the
/// LOCK push proved (its probe of an absent state ref included), with force-unlocks, unlocked
/// writes and folds through the others; half the requests in CI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_writers_each_behind_a_single_front() {
    let setup = Setup {
        push: PushMode::Atomic,
        state_refs: "auto",
        faults: false,
        single_front: true,
        lambda_folds: false,
    };
    many_writers(setup, CI_STEPS / 2).await;
}

/// `always` with the Lambda's folds (F16): no process folds after its writes, so a write stays
/// on its state's ref until one of the test's folds runs, and races that a fold right after
/// each write would end stay open; half the requests in CI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_writers_with_folds_on_a_schedule() {
    let setup = Setup {
        push: PushMode::Atomic,
        state_refs: "always",
        faults: false,
        single_front: false,
        lambda_folds: true,
    };
    many_writers(setup, CI_STEPS / 2).await;
}

/// `always` on a host without atomic push (no state ref is created there; run by hand).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "review runs by hand"]
async fn interleaved_writers_always_without_atomic_push() {
    let setup = Setup {
        push: PushMode::NoAtomic,
        state_refs: "always",
        faults: false,
        single_front: false,
        lambda_folds: false,
    };
    many_writers(setup, CI_STEPS * 2 / 3).await;
}

/// `always` with git faults (run by hand).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "review runs by hand"]
async fn interleaved_writers_always_with_git_faults() {
    let setup = Setup {
        push: PushMode::Atomic,
        state_refs: "always",
        faults: true,
        single_front: false,
        lambda_folds: false,
    };
    many_writers(setup, CI_STEPS / 2).await;
}

async fn many_writers(setup: Setup, ci_steps: usize) {
    let seed = env_number("GITSTATE_MANY_WRITERS_SEED").unwrap_or(CI_SEED);
    let steps = env_number("GITSTATE_MANY_WRITERS_STEPS").map_or(ci_steps, |s| s as usize);
    let started = std::time::Instant::now();
    match run(seed, steps, setup).await {
        Ok((model, shape)) => eprintln!(
            "many writers ({setup:?}, seed {seed}; {shape}): {} requests through {PROCESSES} \
             processes in {:.1} s, {} writes, restores and deletes acknowledged, {} history \
             entries over {} names, {} unacknowledged never landed; answers {:?}",
            model.sent,
            started.elapsed().as_secs_f64(),
            model.acknowledged,
            model.history.values().map(Vec::len).sum::<usize>(),
            model.history.len(),
            model.unsure.len(),
            model.seen,
        ),
        Err(problem) => panic!(
            "many writers ({setup:?}) failed (replay: GITSTATE_MANY_WRITERS_SEED={seed} \
             GITSTATE_MANY_WRITERS_STEPS={steps}):\n{problem}"
        ),
    }
}

/// The replay of seed 1 in its smallest form: Terraform's LOCK reaches one process, its GET and
/// write another (the Lambda shape routes each request to any free container); a later GET
/// through the first process must answer the written state, not what that LOCK proved.
///
/// Every process answers the GETs right after its LOCK from what the LOCK push proved (the first
/// asks no git request here), and the other waits out that window before it writes under the
/// lock, releases it, force-unlocks it or deletes the state under it. So a later GET through the
/// first process answers the newest state after each of those through the other process: a
/// write under its lock; its holder's UNLOCK, then another lock and a write; a force-unlock, a
/// lock and a write; a DELETE under its lock. Under `GITSTATE_STATE_REFS=auto` (writes to the
/// branch) and `always` (an update to the state's own ref).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_proof_never_answers_after_a_write_through_another_process() {
    for mode in ["auto", "always"] {
        let server = GitServer::start().await;
        let url = server.create_repo(REPO);
        let extra = [("GITSTATE_STATE_REFS", mode)];
        let (_root, procs) = two_processes_with(&url, &extra).await;
        let (p, q) = (Client::new(&procs[0].url), Client::new(&procs[1].url));
        let name = "env/app.tfstate";
        // Warm both processes (capabilities and tip known: the LOCK goes at the floor).
        for (i, client) in [&p, &q].into_iter().enumerate() {
            let (other, id) = (format!("warm/{i}.tfstate"), format!("warm-{i}"));
            let warm = Version {
                serial: 1,
                marker: id.clone(),
            };
            client.lock(&other, &id).await.expect(200);
            client.get_state(&other).await.expect(404);
            client
                .write_locked(&other, &id, &warm.body(&other))
                .await
                .expect(200);
            client.unlock(&other, &id).await.expect(200);
        }
        p.get_state("warm/1.tfstate").await.expect(200);
        // The first LOCK fenced off the versions that do not wait out a LOCK's proof.
        let fence = gitstate_core::protocol::PROOF_FENCE;
        let fenced = gitstate_tests::states::ref_tip(&server.repo_dir(REPO), fence);
        assert!(fenced.is_some(), "{mode}: no {fence}");
        p.lock(name, "apply-1").await.expect(200);
        server.take_requests();
        p.get_state(name).await.expect(404);
        let asked = server.take_requests();
        assert!(
            asked.is_empty(),
            "{mode}: the GET right after the LOCK through the same process rests on what the \
             LOCK proved: {:?}",
            asked
                .iter()
                .map(gitstate_tests::Seen::label)
                .collect::<Vec<_>>()
        );
        q.get_state(name).await.expect(404);
        let mut serial = 0;
        let mut write = |marker: &str| {
            serial += 1;
            Version {
                serial,
                marker: marker.to_owned(),
            }
        };
        let created = write("written-through-q");
        written(
            &q,
            &p,
            (name, "apply-1", &created),
            mode,
            "a create under its lock through q",
        )
        .await;
        q.unlock(name, "apply-1").await.expect(200);
        // The same for an update (under `always`, to the state's own ref).
        p.lock(name, "apply-2").await.expect(200);
        newest(&p, name, Some(&created), mode, "its proof").await;
        let updated = write("updated-through-q");
        written(
            &q,
            &p,
            (name, "apply-2", &updated),
            mode,
            "an update under its lock through q",
        )
        .await;
        // The holder's UNLOCK through Q, then another lock and a write there.
        q.unlock(name, "apply-2").await.expect(200);
        p.lock(name, "apply-3").await.expect(200);
        newest(&p, name, Some(&updated), mode, "its proof").await;
        q.unlock(name, "apply-3").await.expect(200);
        q.lock(name, "apply-4").await.expect(200);
        let after_unlock = write("after-an-unlock-through-q");
        written(
            &q,
            &p,
            (name, "apply-4", &after_unlock),
            mode,
            "UNLOCK, LOCK and write through q",
        )
        .await;
        q.unlock(name, "apply-4").await.expect(200);
        // A force-unlock through Q, then another lock and a write there.
        p.lock(name, "apply-5").await.expect(200);
        newest(&p, name, Some(&after_unlock), mode, "its proof").await;
        q.force_unlock(name).await.expect(200);
        q.lock(name, "apply-6").await.expect(200);
        let after_force = write("after-a-force-unlock");
        written(
            &q,
            &p,
            (name, "apply-6", &after_force),
            mode,
            "force-unlock, LOCK and write through q",
        )
        .await;
        q.unlock(name, "apply-6").await.expect(200);
        // A DELETE under its lock through Q.
        p.lock(name, "apply-7").await.expect(200);
        newest(&p, name, Some(&after_force), mode, "its proof").await;
        q.delete_state(name, Some("apply-7")).await.expect(200);
        newest(&p, name, None, mode, "a DELETE under its lock through q").await;
        q.unlock(name, "apply-7").await.expect(200);
    }
}

/// A write of `version` to `name` under the lock `id` through `q`, then [`newest`] through `p`.
async fn written(
    q: &Client,
    p: &Client,
    (name, id, version): (&str, &str, &Version),
    mode: &str,
    what: &str,
) {
    q.write_locked(name, id, &version.body(name))
        .await
        .expect(200);
    newest(p, name, Some(version), mode, what).await;
}

/// A GET of `name` through `client` answers `want` (`None`: no state), after `what`.
async fn newest(client: &Client, name: &str, want: Option<&Version>, mode: &str, what: &str) {
    let read = client.get_state(name).await;
    let got = (read.status == 200)
        .then(|| Version::of(&read.body))
        .flatten();
    assert_eq!(
        (read.status, got.as_ref()),
        (if want.is_some() { 200 } else { 404 }, want),
        "{mode}: a GET through the process that took the LOCK, after {what}: {}",
        read.body
    );
}

/// Two `gitstate serve` processes of the repository at `url`, each with its own directory
/// (kept while the returned directory lives).
async fn two_processes(url: &str) -> (tempfile::TempDir, Vec<ServeProcess>) {
    two_processes_with(url, &[]).await
}

/// [`two_processes`], with the settings `extra`.
async fn two_processes_with(
    url: &str,
    extra: &[(&str, &str)],
) -> (tempfile::TempDir, Vec<ServeProcess>) {
    let root = tempfile::tempdir().expect("tempdir");
    let mut procs = Vec::new();
    for i in 0..2 {
        let dir = root.path().join(format!("serve-{i}"));
        std::fs::create_dir_all(&dir).expect("server dir");
        let env = serve_env(url, extra);
        procs.push(ServeProcess::start(Path::new(crate::GITSTATE), &dir, env).await);
    }
    (root, procs)
}

/// The replay of seed 1001 (`interleaved_writers_with_git_faults`, 3000 steps) in its smallest
/// form, without faults: Terraform's DELETE of a state under its lock reaches another process
/// (200); the same DELETE again, within the same second, reaches the process that took the LOCK,
/// which goes at the floor on the tip it cached before the first DELETE. Its commit is byte for
/// byte the first DELETE's (same parent, tree, trailers, author and second), so its push is
/// refused (the tip moved). A refused push landed nothing and leaves the record: the next round
/// does not take the first DELETE's commit for its own (it did, and the rule for a push whose
/// answer was lost answered 200 for a DELETE of a state that is not there: 404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_delete_is_not_taken_for_its_own_landed_push() {
    let server = GitServer::start().await;
    let url = server.create_repo(REPO);
    let (_root, procs) = two_processes(&url).await;
    let (p, q) = (Client::new(&procs[0].url), Client::new(&procs[1].url));
    let mut answers = Vec::new();
    for round in 0..3 {
        let name = format!("del/{round}.tfstate");
        let id = format!("apply-{round}");
        let version = Version {
            serial: 1,
            marker: id.clone(),
        };
        // p takes the lock and writes: it made the lock and caches the tip (the floor).
        p.lock(&name, &id).await.expect(200);
        p.get_state(&name).await.expect(404);
        p.write_locked(&name, &id, &version.body(&name))
            .await
            .expect(200);
        // Start both DELETEs just after a second begins, so that they share the second.
        let now = jiff::Timestamp::now();
        let into = u64::try_from(now.subsec_nanosecond()).expect("positive");
        tokio::time::sleep(Duration::from_nanos(1_000_000_000 - into + 20_000_000)).await;
        q.delete_state(&name, Some(&id)).await.expect(200);
        let again = p.delete_state(&name, Some(&id)).await;
        answers.push((name.clone(), again.status, again.body.clone()));
        p.unlock(&name, &id).await.expect(200);
    }
    assert!(
        answers.iter().all(|(_, status, _)| *status == 404),
        "a DELETE of a state the same lock's DELETE removed answered other than 404: {answers:?}"
    );
}

/// Seed 1003 (`interleaved_writers_with_git_faults`, 3000 steps) in its smallest form, without
/// faults: the holder's DELETE through another process (200), its write that creates the state
/// again (200), then its DELETE again, within the same second, through the process that took the
/// LOCK (at the floor, on the tip it cached before the first DELETE). That DELETE's commit is
/// byte for byte the first one's; its push is refused, which strikes it from the DELETE's record
/// of pushes, so the next round does not take the first DELETE's commit, below the new write,
/// for its own landed push (it did: 200, and the state was still there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_answered_200_leaves_no_state_behind() {
    let server = GitServer::start().await;
    let url = server.create_repo(REPO);
    let (_root, procs) = two_processes(&url).await;
    let (p, q) = (Client::new(&procs[0].url), Client::new(&procs[1].url));
    let mut left = Vec::new();
    for round in 0..3 {
        let name = format!("del/{round}.tfstate");
        let id = format!("apply-{round}");
        let version = |serial| Version {
            serial,
            marker: format!("{id}-{serial}"),
        };
        p.lock(&name, &id).await.expect(200);
        p.get_state(&name).await.expect(404);
        p.write_locked(&name, &id, &version(1).body(&name))
            .await
            .expect(200);
        let now = jiff::Timestamp::now();
        let into = u64::try_from(now.subsec_nanosecond()).expect("positive");
        tokio::time::sleep(Duration::from_nanos(1_000_000_000 - into + 20_000_000)).await;
        q.delete_state(&name, Some(&id)).await.expect(200);
        q.write_locked(&name, &id, &version(2).body(&name))
            .await
            .expect(200);
        let deleted = p.delete_state(&name, Some(&id)).await;
        let read = q.get_state(&name).await;
        if deleted.status == 200 && read.status != 404 {
            left.push((name.clone(), read.status, Version::of(&read.body)));
        }
        p.unlock(&name, &id).await.expect(200);
    }
    assert!(
        left.is_empty(),
        "a DELETE answered 200 and the state is still there: {left:?}"
    );
}
