//! Many `gitstate serve` processes (separate caches, as separate Lambda containers) against one
//! loopback git server: the lock race, lost updates, kill -9 at random points, corrupted caches.
//!
//! These live in the CLI package because only here does Cargo hand the tests the path of the
//! `gitstate` binary (`CARGO_BIN_EXE_gitstate`); the harness is `gitstate-tests`.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gitstate_tests::process::{ServeProcess, serve_env};
use gitstate_tests::{
    Client, GIT_TOKEN, GitServer, PushMode, TEST_PASSWORD, git, lock_info, serial_of, state_json,
};
use rand::{Rng, SeedableRng};

/// `n` servers over `repository`, each with its own directory under `root`.
async fn servers(root: &Path, repository: &str, n: usize) -> Vec<ServeProcess> {
    let mut out = Vec::new();
    for i in 0..n {
        let dir = root.join(format!("server-{i}"));
        std::fs::create_dir_all(&dir).expect("server dir");
        out.push(
            ServeProcess::start(Path::new(crate::GITSTATE), &dir, serve_env(repository, &[])).await,
        );
    }
    out
}

/// No secret of the suite in any server's log (they run at debug level).
fn assert_no_secret_in_logs(servers: &[ServeProcess]) {
    for server in servers {
        let log = server.log_text();
        assert!(!log.is_empty(), "the server logged nothing");
        for secret in [GIT_TOKEN, TEST_PASSWORD, "argon2id"] {
            assert!(
                !log.contains(secret),
                "a secret ({}…) appears in {}",
                &secret[..3],
                server.log.display()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_processes_race_for_one_lock_twenty_rounds() {
    processes_race_for_one_lock(PushMode::Atomic, 20).await;
}

/// The same race on a server without atomic push; 5 rounds rather than 20 to keep CI time (a
/// lock is one create-only command in both modes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_processes_race_for_one_lock_without_atomic() {
    processes_race_for_one_lock(PushMode::NoAtomic, 5).await;
}

async fn processes_race_for_one_lock(mode: PushMode, rounds: usize) {
    const PROCESSES: usize = 64;
    let server = GitServer::start_in(mode).await;
    let url = server.create_repo("race");
    let root = tempfile::tempdir().expect("tempdir");
    let procs = servers(root.path(), &url, PROCESSES).await;
    let clients: Vec<Arc<Client>> = procs
        .iter()
        .map(|p| Arc::new(Client::new(&p.url)))
        .collect();
    let name = "shared/race.tfstate";
    // Warm every process (connection, argon2, cache) so the race is about the lock alone.
    for client in &clients {
        client.get_lock(name).await.expect(409);
    }
    let mut violations = Vec::new();
    for round in 0..rounds {
        let barrier = Arc::new(tokio::sync::Barrier::new(PROCESSES));
        let tasks: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(i, client)| {
                let (client, barrier) = (client.clone(), barrier.clone());
                let id = format!("r{round}-p{i}");
                tokio::spawn(async move {
                    barrier.wait().await;
                    let answer = client.lock(name, &id).await;
                    (id, answer)
                })
            })
            .collect();
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.expect("task"));
        }
        let winners: Vec<usize> = (0..answers.len())
            .filter(|i| answers[*i].1.status == 200)
            .collect();
        if winners.len() != 1 {
            violations.push(format!("round {round}: {} winners", winners.len()));
            continue;
        }
        let winner = &answers[winners[0]].0;
        for (id, answer) in &answers {
            let names_winner = answer.body.contains(&format!(r#""ID":"{winner}""#));
            if id != winner && (answer.status != 423 || !names_winner) {
                violations.push(format!(
                    "round {round}: {id} got {} {:?}",
                    answer.status, answer.body
                ));
            }
        }
        // The winner releases, through its own process.
        let unlock = clients[winners[0]]
            .send(
                "DELETE",
                &format!("/locks/{name}"),
                Some(&lock_info(winner)),
            )
            .await;
        assert_eq!(unlock.status, 200, "round {round}: {}", unlock.body);
    }
    eprintln!(
        "lock race ({mode:?}): {PROCESSES} processes x {rounds} rounds, {} violations",
        violations.len()
    );
    assert!(
        violations.is_empty(),
        "violations:\n{}",
        violations.join("\n")
    );
    let refs = git(&["ls-remote", &server.url_with_credentials("race")], None);
    assert!(!refs.contains("refs/heads/locks/"), "no lock left: {refs}");
    assert_no_secret_in_logs(&procs);
}

/// The reflog of `main` in the bare repository: (old, new) per update.
fn reflog(repo_dir: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo_dir.join("logs/refs/heads/main")).expect("reflog");
    text.lines()
        .map(|l| {
            let mut parts = l.split(' ');
            let old = parts.next().expect("old").to_owned();
            let new = parts.next().expect("new").to_owned();
            (old, new)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_eight_states_lose_no_update_and_never_rewind() {
    processes_lose_no_update(PushMode::Atomic, 8).await;
}

/// The same on a server without atomic push, 4 cycles per state rather than 8 (CI time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_eight_states_lose_no_update_without_atomic() {
    processes_lose_no_update(PushMode::NoAtomic, 4).await;
}

async fn processes_lose_no_update(mode: PushMode, cycles: usize) {
    const N: usize = 8;
    let server = GitServer::start_in(mode).await;
    let url = server.create_repo("updates");
    let repo_dir = server.repo_dir("updates");
    git(
        &["config", "core.logAllRefUpdates", "always"],
        Some(&repo_dir),
    );
    let root = tempfile::tempdir().expect("tempdir");
    let procs = servers(root.path(), &url, N).await;
    let clients: Arc<Vec<Client>> = Arc::new(procs.iter().map(|p| Client::new(&p.url)).collect());
    let tasks: Vec<_> = (0..N)
        .map(|s| {
            let clients = clients.clone();
            tokio::spawn(async move {
                let name = format!("team-{s}/app.tfstate");
                for cycle in 1..=cycles as u64 {
                    // Each cycle goes through another process, so every cache is stale sometimes.
                    let client = &clients[(s + cycle as usize) % N];
                    let id = format!("s{s}-c{cycle}");
                    client.lock(&name, &id).await.expect(200);
                    let got = client.send("GET", &format!("/states/{name}"), None).await;
                    if cycle == 1 {
                        assert_eq!(got.status, 404, "{name}: {}", got.body);
                    } else {
                        assert_eq!(got.status, 200, "{name}: {}", got.body);
                        assert_eq!(serial_of(&got.body), cycle - 1, "{name} read back");
                    }
                    let body = state_json(&format!("lineage-{s}"), cycle);
                    let write = client
                        .send("POST", &format!("/states/{name}?ID={id}"), Some(&body))
                        .await;
                    assert_eq!(write.status, 200, "{name} {id}: {}", write.body);
                    let unlock = client
                        .send("DELETE", &format!("/locks/{name}"), Some(&lock_info(&id)))
                        .await;
                    assert_eq!(unlock.status, 200, "{name} {id}: {}", unlock.body);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("apply cycles");
    }

    // Every write is in the history, once.
    let subjects = git(&["log", "--format=%s", "main"], Some(&repo_dir));
    let writes: BTreeSet<&str> = subjects
        .lines()
        .filter(|l| l.starts_with("write "))
        .collect();
    let count = subjects.lines().filter(|l| l.starts_with("write ")).count();
    for s in 0..N {
        for cycle in 1..=cycles {
            let subject = format!("write team-{s}/app.tfstate (serial {cycle})");
            assert!(writes.contains(subject.as_str()), "missing: {subject}");
        }
    }
    assert_eq!(count, N * cycles, "each write exactly once");
    // Every state at its final serial.
    for s in 0..N {
        let body = git(
            &["show", &format!("main:team-{s}/app.tfstate")],
            Some(&repo_dir),
        );
        assert_eq!(serial_of(&body), cycles as u64);
    }
    // The history is one line of single-parent commits.
    let parents = git(&["rev-list", "--parents", "main"], Some(&repo_dir));
    for line in parents.lines() {
        assert!(line.split(' ').count() <= 2, "merge commit: {line}");
    }
    let root_commits = parents
        .lines()
        .filter(|l| l.split(' ').count() == 1)
        .count();
    assert_eq!(root_commits, 1, "one root");
    // The branch only ever moved forward: each reflog entry starts where the last ended and is a
    // fast-forward of it, adding one or more writes (writes waiting together in one process leave
    // in one push, a commit each); every write came in exactly one update.
    let log = reflog(&repo_dir);
    assert!(
        (1..=N * cycles).contains(&log.len()),
        "{} ref updates for {} writes",
        log.len(),
        N * cycles
    );
    let zero = "0".repeat(40);
    let mut previous = zero.clone();
    let mut added = 0;
    for (old, new) in &log {
        assert_eq!(*old, previous, "the branch was moved behind our back");
        let range = if *old == zero {
            new.clone()
        } else {
            format!("{old}..{new}")
        };
        let count: usize = git(&["rev-list", "--count", &range], Some(&repo_dir))
            .trim()
            .parse()
            .expect("a count");
        assert!(count >= 1, "{range} adds no commit");
        added += count;
        if *old != zero {
            let forward = gitstate_tests::git_output(
                &["merge-base", "--is-ancestor", old, new],
                Some(&repo_dir),
            );
            assert!(
                forward.status.success(),
                "{old} -> {new} is not a fast-forward"
            );
        }
        previous = new.clone();
    }
    assert_eq!(added, N * cycles, "the updates add every write once");
    eprintln!(
        "lost updates ({mode:?}): {N} processes x {N} states x {cycles} cycles: {count} writes in a \
         linear history, {} reflog entries, no rewind",
        log.len()
    );
    fsck(&server, &repo_dir).await;
    assert_no_secret_in_logs(&procs);
}

/// Every state file on `main` parses as JSON; returns how many there are.
fn states_parse(repo_dir: &Path) -> usize {
    let has_main = gitstate_tests::git_output(
        &["rev-parse", "--verify", "-q", "refs/heads/main"],
        Some(repo_dir),
    );
    if !has_main.status.success() {
        return 0;
    }
    let files = git(&["ls-tree", "-r", "--name-only", "main"], Some(repo_dir));
    for file in files.lines() {
        let body = git(&["show", &format!("main:{file}")], Some(repo_dir));
        serde_json::from_str::<serde_json::Value>(&body)
            .unwrap_or_else(|e| panic!("{file} does not parse: {e}"));
    }
    files.lines().count()
}

/// `git fsck` of the remote once it is quiet. A pack being received while fsck reads is not
/// damage, so a failure is checked once more after the server is quiet again: real corruption
/// stays.
async fn fsck(server: &GitServer, repo_dir: &Path) {
    let run = || {
        gitstate_tests::git_output(
            &["fsck", "--strict", "--no-progress", "--no-dangling"],
            Some(repo_dir),
        )
    };
    server.quiesce().await;
    let mut out = run();
    if !out.status.success() {
        server.quiesce().await;
        out = run();
    }
    assert!(
        out.status.success(),
        "git fsck failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Lock,
    Write,
    Unlock,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_dash_nine_at_random_points_leaves_a_sound_repository() {
    // CI runs 120 seeded trials; longer runs by hand: GITSTATE_CRASH_TRIALS, GITSTATE_CRASH_SEED.
    let from_env = |var: &str, default: u64| {
        std::env::var(var)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let trials = from_env("GITSTATE_CRASH_TRIALS", 120) as usize;
    let seed = from_env("GITSTATE_CRASH_SEED", 7);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let server = GitServer::start().await;
    let url = server.create_repo("crash");
    let repo_dir = server.repo_dir("crash");
    let root = tempfile::tempdir().expect("tempdir");
    // Three victims, killed and restarted on their own caches; one survivor that inspects.
    let mut procs = servers(root.path(), &url, 4).await;
    let survivor = Client::new(&procs[3].url);
    for p in &procs {
        let warm = Client::new(&p.url);
        warm.get_lock("warm-up.tfstate").await.expect(409);
    }
    let names = ["a.tfstate", "env/b.tfstate", "env/deep/c.tfstate"];
    let mut serials = [0u64; 3];
    let (mut killed_midway, mut completed, mut leftover_locks) = (0, 0, 0);
    // Per operation: trials, and how many took effect on the remote before the kill.
    let mut landed: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
    for trial in 0..trials {
        let victim = rng.random_range(0..3usize);
        let state = rng.random_range(0..names.len());
        let name = names[state];
        let op = [Op::Lock, Op::Write, Op::Unlock][rng.random_range(0..3usize)];
        let delay = Duration::from_micros(rng.random_range(0..30_000));
        let id = format!("trial-{trial}");
        // GIVEN the lock held (for a write or an unlock), through the survivor.
        if !matches!(op, Op::Lock) {
            survivor.lock(name, &id).await.expect(200);
        }
        let request = {
            let base = procs[victim].url.clone();
            let (name, id) = (name.to_owned(), id.clone());
            serials[state] += 1;
            let body = state_json(&format!("lineage-{state}"), serials[state]);
            tokio::spawn(async move {
                let (method, path, body) = match op {
                    Op::Lock => ("POST", format!("/locks/{name}"), lock_info(&id)),
                    Op::Write => ("POST", format!("/states/{name}?ID={id}"), body),
                    Op::Unlock => ("DELETE", format!("/locks/{name}"), lock_info(&id)),
                };
                try_send(&base, method, &path, body).await
            })
        };
        // WHEN the server is killed 0–30 ms into the request.
        tokio::time::sleep(delay).await;
        procs[victim].kill9().await;
        match request.await.expect("request task") {
            // An answer that arrived in full is a real answer, and must be a success.
            Some((status, body)) => {
                assert_eq!(status, 200, "trial {trial} {op:?}: {body}");
                completed += 1;
            }
            None => killed_midway += 1,
        }
        // What reached the git server before the kill runs to its end there, as it would on a
        // real one; judge the outcome after that.
        server.quiesce().await;
        let sent_serial = serials[state];
        // THEN the remote is sound and every state parses.
        fsck(&server, &repo_dir).await;
        states_parse(&repo_dir);
        // AND a lock left behind is visible with its age and removable by force-unlock.
        let lock = survivor.send("GET", &format!("/locks/{name}"), None).await;
        let current = survivor.send("GET", &format!("/states/{name}"), None).await;
        let took_effect = match op {
            Op::Lock => lock.status == 200 && lock.body.contains(&format!(r#""ID":"{id}""#)),
            Op::Write => current.status == 200 && serial_of(&current.body) == sent_serial,
            Op::Unlock => lock.status == 409,
        };
        let entry = landed.entry(format!("{op:?}")).or_default();
        *entry = (entry.0 + 1, entry.1 + usize::from(took_effect));
        if lock.status == 200 {
            leftover_locks += 1;
            let (status, headers, _) = survivor
                .send_with_authorization("GET", &format!("/locks/{name}"), Some(&basic_admin()))
                .await;
            assert_eq!(status, 200);
            let created: i64 = headers
                .get("gitstate-lock-created")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .expect("a lock carries its creation time");
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_secs() as i64;
            assert!(
                (0..=120).contains(&(now - created)),
                "age {}",
                now - created
            );
            let force = survivor
                .send("DELETE", &format!("/locks/{name}"), None)
                .await;
            assert_eq!(force.status, 200, "force-unlock: {}", force.body);
        } else {
            assert_eq!(lock.status, 409, "trial {trial}: {}", lock.body);
        }
        let again = survivor.send("GET", &format!("/locks/{name}"), None).await;
        assert_eq!(again.status, 409, "trial {trial}: lock still there");
        // Whatever serial landed, the next write must be above it.
        let got = survivor.send("GET", &format!("/states/{name}"), None).await;
        if got.status == 200 {
            serials[state] = serials[state].max(serial_of(&got.body));
        }
        procs[victim].restart().await;
        // Pay argon2 now, so the next kill lands in the git work, not in authentication.
        let warm = Client::new(&procs[victim].url);
        warm.get_lock("warm-up.tfstate").await.expect(409);
    }
    eprintln!(
        "crashes (seed {seed}): {trials} trials, {killed_midway} killed mid-request, {completed} \
         completed first, {leftover_locks} locks left behind and force-unlocked; git fsck clean \
         after every trial; (trials, took effect before the kill) per operation: {landed:?}"
    );
    // The restarted servers still work on the caches the killed ones left.
    for p in &procs[..3] {
        let client = Client::new(&p.url);
        for name in names {
            let got = client.send("GET", &format!("/states/{name}"), None).await;
            assert!(matches!(got.status, 200 | 404), "{}", got.body);
        }
        client.lock("after.tfstate", "after").await.expect(200);
        client.unlock("after.tfstate", "after").await.expect(200);
    }
    assert_no_secret_in_logs(&procs);
}

/// One request with the test admin's credentials; `None` if the connection died first.
async fn try_send(base: &str, method: &str, path: &str, body: String) -> Option<(u16, String)> {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let response = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .basic_auth(gitstate_tests::TEST_USER, Some(TEST_PASSWORD))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.ok()?))
}

fn basic_admin() -> Vec<u8> {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{TEST_PASSWORD}", gitstate_tests::TEST_USER))
    )
    .into_bytes()
}

/// Ways a cache directory goes bad on disk.
#[derive(Debug, Clone, Copy)]
enum Damage {
    TruncatedPacks,
    GarbageRef,
    DeletedObjects,
}

fn damage(cache: &Path, how: Damage) -> usize {
    let mut touched = 0;
    let repos = std::fs::read_dir(cache).expect("cache dir");
    for repo in repos.flatten().map(|e| e.path()) {
        match how {
            Damage::TruncatedPacks => {
                for pack in std::fs::read_dir(repo.join("objects/pack")).expect("packs") {
                    let path = pack.expect("entry").path();
                    if path.extension().is_some_and(|e| e == "pack") {
                        let bytes = std::fs::read(&path).expect("pack");
                        std::fs::write(&path, &bytes[..bytes.len() / 2]).expect("truncate");
                        touched += 1;
                    }
                }
            }
            Damage::GarbageRef => {
                std::fs::write(repo.join("HEAD"), b"\0garbage\xff\n").expect("HEAD");
                std::fs::create_dir_all(repo.join("refs/heads")).expect("refs");
                std::fs::write(repo.join("refs/heads/main"), b"not-an-object-id\n").expect("ref");
                touched += 1;
            }
            Damage::DeletedObjects => {
                let objects = repo.join("objects");
                for entry in std::fs::read_dir(&objects).expect("objects").flatten() {
                    let path = entry.path();
                    let name = entry.file_name();
                    if name == "info" {
                        continue;
                    }
                    if name == "pack" {
                        for pack in std::fs::read_dir(&path).expect("packs").flatten() {
                            std::fs::remove_file(pack.path()).expect("remove pack");
                            touched += 1;
                        }
                    } else {
                        std::fs::remove_dir_all(&path).expect("remove loose objects");
                        touched += 1;
                    }
                }
            }
        }
    }
    touched
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_cache_is_detected_and_rebuilt_on_the_next_request() {
    let server = GitServer::start().await;
    let url = server.create_repo("corrupt");
    let root = tempfile::tempdir().expect("tempdir");
    let mut procs = servers(root.path(), &url, 2).await;
    let writer = Client::new(&procs[1].url);
    let name = "net/prod.tfstate";
    for (round, how) in [
        Damage::TruncatedPacks,
        Damage::GarbageRef,
        Damage::DeletedObjects,
    ]
    .into_iter()
    .enumerate()
    {
        // GIVEN a state the victim has read (so its cache holds a pack of it) and a newer one
        // written by another process since.
        let serial = round as u64 * 2 + 1;
        let id = format!("corrupt-{round}");
        writer.lock(name, &id).await.expect(200);
        let first = state_json("lin", serial);
        let put = format!("/states/{name}?ID={id}");
        assert_eq!(writer.send("POST", &put, Some(&first)).await.status, 200);
        let victim = Client::new(&procs[0].url);
        assert_eq!(
            victim
                .send("GET", &format!("/states/{name}"), None)
                .await
                .body,
            first
        );
        let second = state_json("lin", serial + 1);
        assert_eq!(writer.send("POST", &put, Some(&second)).await.status, 200);
        writer.unlock(name, &id).await.expect(200);
        // WHEN its cache is damaged while it is down.
        procs[0].kill9().await;
        let touched = damage(&procs[0].cache, how);
        assert!(touched > 0, "{how:?}: nothing to damage");
        procs[0].restart().await;
        // THEN the next requests answer correctly: a read, a lock, a write and an unlock.
        let victim = Client::new(&procs[0].url);
        let got = victim.send("GET", &format!("/states/{name}"), None).await;
        assert_eq!(
            (got.status, got.body.as_str()),
            (200, second.as_str()),
            "{how:?}"
        );
        let id = format!("after-{round}");
        assert_eq!(victim.lock(name, &id).await.status, 200, "{how:?}");
        let third = state_json("lin", serial + 2);
        let write = victim
            .send("POST", &format!("/states/{name}?ID={id}"), Some(&third))
            .await;
        assert_eq!(write.status, 200, "{how:?}: {}", write.body);
        let unlock = victim
            .send("DELETE", &format!("/locks/{name}"), Some(&lock_info(&id)))
            .await;
        assert_eq!(unlock.status, 200, "{how:?}");
        let got = writer.send("GET", &format!("/states/{name}"), None).await;
        assert_eq!(got.body, third, "{how:?}: the other process sees the write");
        eprintln!("cache damage {how:?}: {touched} files damaged, next request recovered");
    }
    fsck(&server, &server.repo_dir("corrupt")).await;
    assert_no_secret_in_logs(&procs);
}
