//! Group commit: writes of one branch that wait together in one process leave in one push, as a
//! chain of commits (one per write), atomic with every writer's lock. On a server with atomic
//! push and on one without; the git server is behind a proxy that adds a delay to every request,
//! so that writes sent at once do wait together.

use std::collections::BTreeMap;
use std::time::Duration;

use gitstate_tests::faults::{Fault, FaultProxy};
use gitstate_tests::{
    Client, GitServer, PushMode, TestBackend, git, init_tracing, memory_app, settings_for,
    state_json,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DELAY: Duration = Duration::from_millis(60);

/// A git server and a backend that reaches it through a delaying proxy.
struct Slow {
    server: GitServer,
    _proxy: FaultProxy,
    backend: TestBackend,
    /// A second backend straight to the server (another process, its own cache).
    other: TestBackend,
    repo: String,
    /// The repository's URL on the server itself.
    direct: String,
}

impl Slow {
    async fn start(mode: PushMode, repo: &str) -> Self {
        let server = GitServer::start_in(mode).await;
        let direct = server.create_repo(repo);
        let proxy = FaultProxy::start(server.address, 1, 1.0, vec![Fault::Slow(DELAY)]).await;
        let backend = TestBackend::start(&proxy.url(repo), &[]).await;
        let other = TestBackend::start(&direct, &[]).await;
        Self {
            server,
            _proxy: proxy,
            backend,
            other,
            repo: repo.to_owned(),
            direct,
        }
    }

    fn bare(&self) -> String {
        self.server
            .repo_dir(&self.repo)
            .to_str()
            .expect("utf-8")
            .to_owned()
    }

    /// Commits on `main` (none before the first write).
    fn commits(&self) -> usize {
        let out = gitstate_tests::git_output(
            &["--git-dir", &self.bare(), "rev-list", "--count", "main"],
            None,
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(0)
    }

    /// `main` is one line of commits, and the repository passes `git fsck --strict`.
    fn linear_and_sound(&self) {
        let bare = self.bare();
        let merges = git(
            &[
                "--git-dir",
                &bare,
                "rev-list",
                "--merges",
                "--count",
                "main",
            ],
            None,
        );
        assert_eq!(merges.trim(), "0", "history is linear");
        git(&["--git-dir", &bare, "fsck", "--strict"], None);
    }

    /// Receive-pack POSTs the server saw since the last call.
    fn pushes(&self) -> usize {
        self.server
            .take_labels()
            .iter()
            .filter(|l| *l == "POST receive-pack")
            .count()
    }
}

/// `writes` writes at once, each under its own lock: all land, in fewer pushes than writes, one
/// commit per write that changes exactly its state and the index, with its own serial.
async fn writes_leave_together(mode: PushMode) {
    init_tracing();
    let slow = Slow::start(mode, "together").await;
    let client = Client::new(&slow.backend.url);
    let writes = 12;
    for i in 0..writes {
        client
            .lock(&format!("s{i}.tfstate"), &format!("id-{i}"))
            .await
            .expect(200);
    }
    let before = slow.commits();
    slow.pushes();
    let requests: Vec<_> = (0..writes)
        .map(|i| {
            (
                "POST".to_owned(),
                format!("/states/s{i}.tfstate?ID=id-{i}"),
                Some(state_json(&format!("lineage-{i}"), 100 + i as u64)),
            )
        })
        .collect();
    let answers: Vec<u16> = at_once(&slow.backend.url, &requests)
        .await
        .into_iter()
        .map(|(status, _)| status)
        .collect();
    assert!(answers.iter().all(|s| *s == 200), "{answers:?}");
    let pushes = slow.pushes();
    assert!(
        pushes < writes / 2,
        "{writes} writes at once took {pushes} pushes: they did not leave together"
    );
    assert_eq!(slow.commits() - before, writes, "one commit per write");
    let bare = slow.bare();
    let log = git(
        &[
            "--git-dir",
            &bare,
            "log",
            "--format=%H",
            &format!("-{writes}"),
            "main",
        ],
        None,
    );
    let mut seen = Vec::new();
    for commit in log.lines() {
        let files = git(
            &[
                "--git-dir",
                &bare,
                "show",
                "--name-only",
                "--format=",
                commit,
            ],
            None,
        );
        let mut files: Vec<&str> = files.lines().filter(|l| !l.is_empty()).collect();
        files.sort_unstable();
        assert_eq!(
            files.len(),
            2,
            "{commit} changes one state and the index: {files:?}"
        );
        assert_eq!(files[0], ".gitstate/index.json");
        let state = files[1].to_owned();
        let i: u64 = state
            .trim_start_matches('s')
            .trim_end_matches(".tfstate")
            .parse()
            .expect("a state of the test");
        let message = git(
            &["--git-dir", &bare, "show", "-s", "--format=%B", commit],
            None,
        );
        assert!(
            message.contains(&format!("Serial: {}", 100 + i)),
            "{commit} records its own write's serial: {message}"
        );
        assert_eq!(
            git(
                &["--git-dir", &bare, "show", &format!("{commit}:{state}")],
                None
            ),
            state_json(&format!("lineage-{i}"), 100 + i)
        );
        seen.push(i);
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..writes as u64).collect::<Vec<_>>());
    for i in 0..writes {
        client
            .unlock(&format!("s{i}.tfstate"), &format!("id-{i}"))
            .await
            .expect(200);
    }
    slow.linear_and_sound();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_waiting_together_leave_in_one_push() {
    writes_leave_together(PushMode::Atomic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_waiting_together_leave_in_one_push_without_atomic() {
    writes_leave_together(PushMode::NoAtomic).await;
}

/// The requests `(method, path, body)` sent to `base` all at once; their statuses and bodies.
async fn at_once(base: &str, requests: &[(String, String, Option<String>)]) -> Vec<(u16, String)> {
    let tasks: Vec<_> = requests
        .iter()
        .cloned()
        .map(|(method, path, body)| {
            let client = Client::new(base);
            tokio::spawn(async move {
                let answer = client.send(&method, &path, body.as_deref()).await;
                (answer.status, answer.body)
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(tasks.len());
    for task in tasks {
        answers.push(task.await.expect("request task"));
    }
    answers
}

// ---------------------------------------------------------------------------------------------
// Generated: groups of concurrent requests on distinct names, against the same requests one at a
// time on the memory store.

/// Names that collide as files and folders; a group never holds two that overlap (those cannot
/// share a push, and their order would decide the answers).
const NAMES: [&str; 9] = [
    "a.tfstate",
    "b.tfstate",
    "n/c.tfstate",
    "n/d.tfstate",
    "p",
    "p/q.tfstate",
    "deep/er/e.tfstate",
    "x",
    "x/y/z.tfstate",
];

fn overlap(a: &str, b: &str) -> bool {
    a == b || a.starts_with(&format!("{b}/")) || b.starts_with(&format!("{a}/"))
}

/// How a name stands before the group.
#[derive(Debug, Clone, Copy)]
enum Before {
    Unlocked,
    /// Locked by the writer (its ID).
    Mine,
    /// Locked by someone else.
    Theirs,
    /// Locked by the writer, then force-unlocked and locked again by someone else through
    /// another process: the writer's process still remembers its own lock commit.
    Broken,
}

/// What the group does to a name.
#[derive(Debug, Clone, Copy)]
enum Act {
    /// A new state under the writer's ID.
    WriteMine,
    /// A new state without an ID.
    WriteBare,
    /// The stored bytes again, under the writer's ID.
    Same,
    DeleteMine,
    DeleteBare,
}

#[derive(Debug, Clone)]
struct Item {
    name: &'static str,
    before: Before,
    act: Act,
    body: String,
}

fn mine(round: usize, name: &str) -> String {
    format!("mine-{round}-{}", name.replace('/', "_"))
}

/// One backend over git (through the slow proxy), one over the memory store, and a second git
/// backend for the breaking of locks.
struct Both {
    slow: Slow,
    memory: TestBackend,
}

impl Both {
    /// The same request on the git and memory backends (`other`: the git side goes through the
    /// second process); their statuses must agree.
    async fn setup(&self, other: bool, method: &str, path: &str, body: Option<&str>) {
        let git_base = if other {
            &self.slow.other.url
        } else {
            &self.slow.backend.url
        };
        let git = Client::new(git_base).send(method, path, body).await;
        let memory = Client::new(&self.memory.url).send(method, path, body).await;
        assert_eq!(
            (git.status, &git.body),
            (memory.status, &memory.body),
            "set-up {method} {path}"
        );
    }
}

fn lock_body(id: &str) -> String {
    gitstate_tests::lock_info(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_groups_of_concurrent_writes_answer_as_one_at_a_time() {
    init_tracing();
    let seeds: u64 = std::env::var("GITSTATE_BATCH_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2);
    let rounds = 25;
    let mut commits = 0usize;
    let mut pushes = 0usize;
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for seed in 0..seeds {
        let mode = if seed % 2 == 0 {
            PushMode::Atomic
        } else {
            PushMode::NoAtomic
        };
        let slow = Slow::start(mode, "groups").await;
        let cache = tempfile::tempdir().expect("tempdir");
        let (router, _store) = memory_app(&settings_for(&slow.direct, cache.path(), &[]));
        let both = Both {
            memory: TestBackend::serve(router, cache).await,
            slow,
        };
        let mut rng = StdRng::seed_from_u64(seed);
        let mut stored: BTreeMap<&str, String> = BTreeMap::new();
        for round in 0..rounds {
            // A group of names that do not overlap, each with how it stands and what is done.
            let mut group: Vec<Item> = Vec::new();
            let size = rng.random_range(3..=8);
            for _ in 0..20 {
                let name = NAMES[rng.random_range(0..NAMES.len())];
                if group.len() < size && !group.iter().any(|i| overlap(i.name, name)) {
                    let before = match rng.random_range(0..8) {
                        0 | 1 => Before::Unlocked,
                        2 => Before::Theirs,
                        3 => Before::Broken,
                        _ => Before::Mine,
                    };
                    let act = match rng.random_range(0..10) {
                        0 => Act::WriteBare,
                        1 => Act::Same,
                        2 => Act::DeleteMine,
                        3 => Act::DeleteBare,
                        _ => Act::WriteMine,
                    };
                    let body = match (act, stored.get(name)) {
                        (Act::Same, Some(bytes)) => bytes.clone(),
                        _ => state_json(&format!("lineage-{name}"), (round * 10) as u64 + 1),
                    };
                    group.push(Item {
                        name,
                        before,
                        act,
                        body,
                    });
                }
            }
            for item in &group {
                let path = format!("/locks/{}", item.name);
                let mine = Some(lock_body(&mine(round, item.name)));
                if matches!(item.before, Before::Mine | Before::Broken) {
                    both.setup(false, "POST", &path, mine.as_deref()).await;
                }
                match item.before {
                    Before::Unlocked | Before::Mine => {}
                    Before::Theirs => {
                        both.setup(true, "POST", &path, Some(&lock_body("theirs")))
                            .await;
                    }
                    Before::Broken => {
                        both.setup(true, "DELETE", &path, Some("")).await;
                        both.setup(true, "POST", &path, Some(&lock_body("thief")))
                            .await;
                    }
                }
            }
            // The group: at once on git, one at a time on the memory store.
            both.slow.pushes();
            let requests: Vec<(String, String, Option<String>)> = group
                .iter()
                .map(|item| {
                    let id = format!("?ID={}", mine(round, item.name));
                    match item.act {
                        Act::WriteMine | Act::Same => (
                            "POST".to_owned(),
                            format!("/states/{}{id}", item.name),
                            Some(item.body.clone()),
                        ),
                        Act::WriteBare => (
                            "POST".to_owned(),
                            format!("/states/{}", item.name),
                            Some(item.body.clone()),
                        ),
                        Act::DeleteMine => (
                            "DELETE".to_owned(),
                            format!("/states/{}{id}", item.name),
                            None,
                        ),
                        Act::DeleteBare => {
                            ("DELETE".to_owned(), format!("/states/{}", item.name), None)
                        }
                    }
                })
                .collect();
            let commits_before = both.slow.commits();
            let git_answers = at_once(&both.slow.backend.url, &requests).await;
            commits += both.slow.commits() - commits_before;
            pushes += both.slow.pushes();
            let memory = Client::new(&both.memory.url);
            for ((item, (method, path, body)), git) in group.iter().zip(&requests).zip(&git_answers)
            {
                let answer = memory.send(method, path, body.as_deref()).await;
                assert_eq!(
                    git,
                    &(answer.status, answer.body),
                    "seed {seed} round {round}: {method} {path} ({:?} before, {:?}) in the group {:?}",
                    item.before,
                    item.act,
                    group
                        .iter()
                        .map(|i| (i.name, i.before, i.act))
                        .collect::<Vec<_>>()
                );
                *statuses.entry(git.0).or_default() += 1;
                if git.0 == 200 {
                    match item.act {
                        Act::DeleteMine | Act::DeleteBare => {
                            stored.remove(item.name);
                        }
                        _ => {
                            stored.insert(item.name, item.body.clone());
                        }
                    }
                }
            }
            // Every name reads the same from both (on the git side through the other process,
            // so from the remote, not from the writer's cache), and every lock is gone for the
            // next round.
            for name in NAMES {
                for path in [format!("/states/{name}"), format!("/locks/{name}")] {
                    let git = Client::new(&both.slow.other.url)
                        .send("GET", &path, None)
                        .await;
                    let memory = memory.send("GET", &path, None).await;
                    assert_eq!(
                        (git.status, &git.body),
                        (memory.status, &memory.body),
                        "seed {seed} after round {round}: GET {path}"
                    );
                }
                both.setup(true, "DELETE", &format!("/locks/{name}"), Some(""))
                    .await;
            }
        }
        both.slow.linear_and_sound();
    }
    eprintln!("statuses: {statuses:?}; {commits} commits landed in {pushes} pushes");
    for status in [200, 409, 423] {
        assert!(
            statuses.contains_key(&status),
            "no {status} in {statuses:?}"
        );
    }
    assert!(
        pushes < commits,
        "{commits} commits landed in {pushes} pushes: no group left together"
    );
}

/// A server hook that declines any push touching `bad.tfstate`: the writes waiting with it still
/// land (the group is split after two refusals on an unchanged tip), and the declined write is a
/// 502 with the remote's reason rather than 20 s of retries and a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_the_remote_declines_does_not_fail_the_others() {
    init_tracing();
    let slow = Slow::start(PushMode::Atomic, "declines").await;
    let hook = slow.server.repo_dir("declines").join("hooks/pre-receive");
    std::fs::create_dir_all(hook.parent().expect("hooks")).expect("hooks dir");
    std::fs::write(
        &hook,
        "#!/bin/sh\n\
         zero=0000000000000000000000000000000000000000\n\
         while read old new ref; do\n\
           [ \"$new\" = \"$zero\" ] && continue\n\
           range=$new; [ \"$old\" != \"$zero\" ] && range=$old..$new\n\
           if git log --format= --name-only \"$range\" | grep -qx bad.tfstate; then\n\
             echo 'bad.tfstate is not welcome here' >&2; exit 1\n\
           fi\n\
         done\n",
    )
    .expect("hook");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let names: Vec<String> = (0..6)
        .map(|i| format!("good{i}.tfstate"))
        .chain(["bad.tfstate".to_owned()])
        .collect();
    let requests: Vec<_> = names
        .iter()
        .map(|name| {
            (
                "POST".to_owned(),
                format!("/states/{name}"),
                Some(state_json("L", 1)),
            )
        })
        .collect();
    let answers = at_once(&slow.backend.url, &requests).await;
    for (name, (status, body)) in names.iter().zip(&answers) {
        let want = if name == "bad.tfstate" { 502 } else { 200 };
        assert_eq!(*status, want, "{name}: {body}");
    }
    assert_eq!(slow.commits(), 6, "the six good writes landed");
    slow.linear_and_sound();
}

/// Creates of near names of one another (other letter case, other `.tfstate`/`.json` endings)
/// waiting together in one process: at most one becomes a state, the others are the near-name
/// 409, as when they come one after another. Checked against one tip, each alone would pass the
/// tree rule, so a round that took two of them would leave both on the branch, and from then on
/// each address reads its own state (the rule only refuses a name that is no state).
async fn near_names_waiting_together(mode: PushMode) {
    init_tracing();
    let slow = Slow::start(mode, "near").await;
    let client = Client::new(&slow.backend.url);
    let names = [
        "net/app",
        "net/app.tfstate",
        "net/App.tfstate",
        "net/app.json",
        "NET/app.tfstate",
        "net/APP",
        "net/app.tfstate.json",
    ];
    for (i, name) in names.iter().enumerate() {
        client.lock(name, &format!("id-{i}")).await.expect(200);
    }
    let requests: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            (
                "POST".to_owned(),
                format!("/states/{name}?ID=id-{i}"),
                Some(state_json(&format!("lineage-{i}"), 1)),
            )
        })
        .collect();
    // Another state's write leads a round alone; the near names wait for the next one together.
    client.lock("lead.tfstate", "lead").await.expect(200);
    let lead = {
        let client = Client::new(&slow.backend.url);
        tokio::spawn(async move {
            client
                .write_locked("lead.tfstate", "lead", &state_json("lead", 1))
                .await
                .status
        })
    };
    tokio::time::sleep(DELAY / 3).await;
    let answers: Vec<u16> = at_once(&slow.backend.url, &requests)
        .await
        .into_iter()
        .map(|(status, _)| status)
        .collect();
    assert_eq!(lead.await.expect("lead write"), 200);
    let bare = slow.bare();
    let files = git(
        &["--git-dir", &bare, "ls-tree", "-r", "--name-only", "main"],
        None,
    );
    let states: Vec<&str> = files
        .lines()
        .filter(|f| !f.starts_with(".gitstate/") && *f != "lead.tfstate")
        .collect();
    assert_eq!(states.len(), 1, "one state of near names: {states:?}");
    assert_eq!(
        answers.iter().filter(|s| **s == 200).count(),
        1,
        "{answers:?}"
    );
    assert!(
        answers.iter().all(|s| *s == 200 || *s == 409),
        "{answers:?}"
    );
    slow.linear_and_sound();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn near_names_waiting_together_leave_one_state() {
    near_names_waiting_together(PushMode::Atomic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn near_names_waiting_together_leave_one_state_without_atomic() {
    near_names_waiting_together(PushMode::NoAtomic).await;
}
