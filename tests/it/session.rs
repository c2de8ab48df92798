//! What a process leaves in its cache for the next one (the wrapper's next run: the push
//! capabilities, the branch tip, the protocol record agreed), against the real `git
//! http-backend`. Generated: what happened to the repository between the two processes, and
//! what happened to the note. The next process takes the note up only where it is whole,
//! recent and made under the same settings, and whatever it takes up, its apply reads the
//! newest state, writes on top of it, and leaves no lock; where nothing moved and the note
//! stands, the apply is at the floor (LOCK, write and UNLOCK one push each, the GET nothing).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use gitstate_core::ports::Location;
use gitstate_core::service::Backend;
use gitstate_tests::{Client, GitServer, Seen, TestBackend, serve_on_loopback, settings_for};

const NAME: &str = "env/app.tfstate";
const LINEAGE: &str = "session-lineage";
const WITHIN: Duration = Duration::from_secs(3600);

/// What happens on the remote after the first process kept its note.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum World {
    Unchanged,
    /// Another backend writes the state (under its own lock).
    OtherWritesIt,
    /// Another backend creates another state: the branch moves, this state does not.
    OtherWritesAnother,
    /// Another backend holds the state's lock.
    OtherHoldsTheLock,
    /// A person commits a file beside the states.
    HandCommit,
    /// Another backend (`GITSTATE_STATE_REFS=always`) writes the state to its own ref: the
    /// branch does not move.
    OtherWritesItsRef,
    /// A person renames the branch.
    Renamed,
}

const WORLDS: [World; 7] = [
    World::Unchanged,
    World::OtherWritesIt,
    World::OtherWritesAnother,
    World::OtherHoldsTheLock,
    World::HandCommit,
    World::OtherWritesItsRef,
    World::Renamed,
];

/// What happens to the note.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Note {
    Kept,
    Deleted,
    Truncated,
    /// A tip the cache does not have.
    UnknownTip,
    TipNotHex,
    /// Its look was made over an hour ago.
    Old,
    /// Its look is dated in the future.
    Future,
    OtherRepository,
    OtherLockPrefix,
    OtherStateRefs,
    /// Capabilities that are not a receive-pack advertisement's.
    NotForPushes,
}

const NOTES: [Note; 11] = [
    Note::Kept,
    Note::Deleted,
    Note::Truncated,
    Note::UnknownTip,
    Note::TipNotHex,
    Note::Old,
    Note::Future,
    Note::OtherRepository,
    Note::OtherLockPrefix,
    Note::OtherStateRefs,
    Note::NotForPushes,
];

/// A backend process over `url` with its cache in `cache`, the single front of its clients as
/// the wrapper is: its router's address, its store and where it writes.
struct Process {
    client: Client,
    backend: Arc<Backend>,
    at: Location,
    _task: tokio::task::JoinHandle<()>,
}

async fn process(url: &str, cache: &Path) -> Process {
    let settings = settings_for(url, cache, &[("GITSTATE_SINGLE_FRONT", "true")]);
    let app = gitstate_app::build(settings).await.expect("backend");
    let backend = app.backend.clone();
    let at = backend.locate(None, None).expect("location");
    let (address, task) = serve_on_loopback(app.router()).await;
    Process {
        client: Client::new(&format!("http://{address}")),
        backend,
        at,
        _task: task,
    }
}

fn find_note(dir: &Path) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path
            .file_name()
            .is_some_and(|n| n == "gitstate-session.json")
        {
            return Some(path);
        }
        if path.is_dir()
            && let Some(found) = find_note(&path)
        {
            return Some(found);
        }
    }
    None
}

/// Change the note as `note` says; `true` when the next process may still take it up.
fn change_note(path: &Path, note: Note) -> bool {
    let text = std::fs::read(path).expect("the note");
    let mut value: serde_json::Value = serde_json::from_slice(&text).expect("a note is JSON");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut set = |key: &str, to: serde_json::Value| value[key] = to;
    match note {
        Note::Kept => return true,
        Note::Deleted => {
            std::fs::remove_file(path).expect("delete");
            return false;
        }
        Note::Truncated => {
            std::fs::write(path, &text[..text.len() / 2]).expect("write");
            return false;
        }
        Note::UnknownTip => set("tip", "1234567890abcdef1234567890abcdef12345678".into()),
        Note::TipNotHex => set("tip", "main".into()),
        Note::Old => set("looked", (now - 3700).into()),
        Note::Future => set("looked", (now + 3700).into()),
        Note::OtherRepository => set("repository", "http://127.0.0.1:1/other.git".into()),
        Note::OtherLockPrefix => set("lock_ref_prefix", "refs/locks/".into()),
        Note::OtherStateRefs => set("state_refs", "Never".into()),
        Note::NotForPushes => set("caps", serde_json::json!(["multi_ack", "side-band-64k"])),
    }
    std::fs::write(path, serde_json::to_vec(&value).expect("json")).expect("write");
    false
}

/// The labels of the requests to `repo` since the last look (requests to other repositories,
/// a background fold of an earlier case, say, are dropped).
fn labels(server: &GitServer, repo: &str) -> Vec<String> {
    let ours = format!("/{repo}.git/");
    server
        .take_requests()
        .iter()
        .filter(|seen| seen.path.contains(&ours))
        .map(Seen::label)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_takes_up_only_a_sound_note_and_never_reads_or_writes_past_the_remote() {
    gitstate_tests::init_tracing();
    let seed = crate::misconfigured::seed("session");
    let mut rng = StdRng::seed_from_u64(seed);
    let server = GitServer::start().await;
    let mut cases: Vec<(World, Note)> = WORLDS
        .iter()
        .flat_map(|w| NOTES.iter().map(move |n| (*w, *n)))
        .collect();
    // Every world with the note kept and every note in the unchanged world, and a draw of the
    // rest.
    cases.retain(|(w, n)| *w == World::Unchanged || *n == Note::Kept || rng.random_bool(0.25));
    for (case, (world, note)) in cases.into_iter().enumerate() {
        let what = format!("case {case}: {world:?}, note {note:?}");
        let repo = format!("session{case}");
        let url = server.create_repo(&repo);
        let cache = tempfile::tempdir().expect("tempdir");
        // The first process: the wrapper's start-up look, two applies, then its note.
        let first = process(&url, cache.path()).await;
        let read = gitstate_core::ReadContext::request(std::time::Instant::now(), None);
        let looked = first.backend.ready_to_write(&first.at, &read).await;
        assert!(matches!(looked, Ok(None)), "{what}: {looked:?}");
        for (serial, id) in [(1, "first-1"), (2, "first-2")] {
            first.client.lock(NAME, id).await.expect(200);
            let want = if serial == 1 { 404 } else { 200 };
            first.client.get_state(NAME).await.expect(want);
            let state = gitstate_tests::state_json(LINEAGE, serial);
            first
                .client
                .write_locked(NAME, id, &state)
                .await
                .expect(200);
            first.client.unlock(NAME, id).await.expect(200);
        }
        first
            .backend
            .keep_session(&first.at, true)
            .await
            .expect("kept");
        let path = find_note(cache.path()).unwrap_or_else(|| panic!("{what}: no note kept"));

        let other = TestBackend::start(&url, &[]).await;
        let other = Client::new(&other.url);
        let mut newest = 2;
        // Kept to the end of the case: its background fold may still run.
        let mut writer = None;
        match world {
            World::Unchanged => {}
            World::OtherWritesIt | World::OtherWritesItsRef => {
                let refs = if world == World::OtherWritesIt {
                    "auto"
                } else {
                    "always"
                };
                let backend = TestBackend::start(&url, &[("GITSTATE_STATE_REFS", refs)]).await;
                let client = Client::new(&backend.url);
                client.lock(NAME, "other").await.expect(200);
                client.get_state(NAME).await.expect(200);
                let state = gitstate_tests::state_json(LINEAGE, 3);
                client.write_locked(NAME, "other", &state).await.expect(200);
                client.unlock(NAME, "other").await.expect(200);
                writer = Some(backend);
                newest = 3;
            }
            World::OtherWritesAnother => {
                let state = gitstate_tests::state_json("another", 1);
                other.write("env/another.tfstate", &state).await.expect(200);
            }
            World::OtherHoldsTheLock => {
                other.lock(NAME, "other").await.expect(200);
            }
            World::HandCommit => {
                gitstate_tests::commit_file(&server, &repo, "README.md", b"states\n");
            }
            World::Renamed => {
                let bare = server.repo_dir(&repo);
                gitstate_tests::git(&["branch", "-m", "main", "trunk"], Some(&bare));
            }
        }
        let sound = change_note(&path, note);
        let bare = server.repo_dir(&repo);
        let refs = || gitstate_tests::git(&["for-each-ref", "--format=%(refname)"], Some(&bare));

        let next = process(&url, cache.path()).await;
        let resumed = next
            .backend
            .resume_session(&next.at, WITHIN)
            .await
            .expect("resume");
        assert_eq!(resumed, sound, "{what}: taken up");
        labels(&server, &repo);
        let id = "next";
        let newest_state = gitstate_tests::state_json(LINEAGE, newest);
        match world {
            World::OtherHoldsTheLock => {
                // The holder's LOCK made a probe; a refused LOCK moves nothing, that probe
                // included (one it moved to its own lock commit goes back).
                let tips = || {
                    let format = "--format=%(refname) %(objectname)";
                    gitstate_tests::git(&["for-each-ref", format], Some(&bare))
                };
                let before = tips();
                next.client.lock(NAME, id).await.expect(423);
                assert_eq!(tips(), before, "{what}: a refused LOCK moved refs");
                let got = next.client.get_state(NAME).await.expect(200);
                assert_eq!(got.body, newest_state, "{what}");
                let got = other.get_state(NAME).await.expect(200);
                assert_eq!(got.body, newest_state, "{what}: nothing written");
                continue;
            }
            World::Renamed => {
                // A LOCK at the floor lands on its own (lock refs are the repository's), one
                // that looks first may be refused; every read and write of the branch that is
                // gone is refused, never "no state".
                let locked = next.client.lock(NAME, id).await;
                assert!(
                    locked.status == 200 || (400..500).contains(&locked.status),
                    "{what}: LOCK answered {}",
                    locked.status
                );
                let got = next.client.get_state(NAME).await;
                assert!(
                    (400..500).contains(&got.status) && got.status != 404,
                    "{what}: GET answered {}: {}",
                    got.status,
                    got.body
                );
                // A state the branch never had: not "no state" either.
                let new = next.client.get_state("env/new.tfstate").await;
                assert!(
                    (400..500).contains(&new.status) && new.status != 404,
                    "{what}: GET of a new state answered {}: {}",
                    new.status,
                    new.body
                );
                let mine = gitstate_tests::state_json(LINEAGE, newest + 1);
                let put = next.client.write_locked(NAME, id, &mine).await;
                assert!(
                    (400..500).contains(&put.status),
                    "{what}: write {}",
                    put.status
                );
                if locked.status == 200 {
                    next.client.unlock(NAME, id).await.expect(200);
                }
                let left = refs();
                assert!(
                    !left.contains("refs/heads/main") && !left.contains("locks/"),
                    "{what}: {left}"
                );
                assert!(
                    !left.contains("/absent"),
                    "{what}: a probe was left: {left}"
                );
                continue;
            }
            _ => {}
        }
        next.client.lock(NAME, id).await.expect(200);
        let got = next.client.get_state(NAME).await.expect(200);
        assert_eq!(got.body, newest_state, "{what}: the GET after the LOCK");
        let mine = gitstate_tests::state_json(LINEAGE, newest + 1);
        next.client.write_locked(NAME, id, &mine).await.expect(200);
        next.client.unlock(NAME, id).await.expect(200);
        let seen = labels(&server, &repo);
        eprintln!("{what}: {} requests: {seen:?}", seen.len());
        if sound && world == World::Unchanged {
            assert_eq!(
                seen, ["POST receive-pack"; 3],
                "{what}: at the floor (LOCK, write, UNLOCK; the GET asked nothing)"
            );
            // A create: Terraform's two GETs of the state it does not find ask nothing either.
            let created = "env/created.tfstate";
            next.client.lock(created, "create").await.expect(200);
            next.client.get_state(created).await.expect(404);
            next.client.get_state(created).await.expect(404);
            let state = gitstate_tests::state_json("created", 1);
            next.client
                .write_locked(created, "create", &state)
                .await
                .expect(200);
            next.client.unlock(created, "create").await.expect(200);
            assert_eq!(
                labels(&server, &repo),
                ["POST receive-pack"; 3],
                "{what}: a create at the floor"
            );
        }
        // Read back through a backend that knows nothing of either process.
        let fresh = TestBackend::start(&url, &[]).await;
        let fresh = Client::new(&fresh.url);
        let got = fresh.get_state(NAME).await.expect(200);
        assert_eq!(got.body, mine, "{what}: the write is the newest");
        let left = refs();
        assert!(!left.contains("locks/"), "{what}: a lock was left: {left}");
        assert!(
            !left.contains("/absent"),
            "{what}: a probe was left: {left}"
        );
        drop(writer);
    }
}
