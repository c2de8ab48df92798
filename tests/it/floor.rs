//! Partial fetch and the protocol floor against the real `git http-backend`: exact git requests
//! and fetched bytes of cold and warm reads, update and no-op applies and UNLOCKs, with
//! `uploadpack.allowFilter` on and off, with and without atomic push; a push on a stale tip
//! falls back to the normal path and still wins or loses as it should.

use gitstate_tests::{
    Client, GitServer, PushMode, Seen, TestBackend, app, git, init_tracing, lock_info,
    realistic_repo, realistic_state, settings_for,
};

/// States in the seeded repository, and the one the tests read and write.
const STATES: usize = 200;
const NAME: &str = "team/s0007.tfstate";

/// The labels of the requests since the last look, and the bytes their answers carried.
fn seen(server: &GitServer) -> (Vec<String>, u64) {
    let requests = server.take_requests();
    (
        requests.iter().map(Seen::label).collect(),
        requests.iter().map(|r| r.bytes).sum(),
    )
}

async fn get(client: &Client, name: &str) -> String {
    let answer = client.send("GET", &format!("/states/{name}"), None).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

/// A cold read fetches the tip's trees, then the one blob it reads; a warm read of another state
/// fetches just that blob. Without `filter` the whole tip comes at depth 1, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_and_warm_reads_fetch_only_the_blobs_they_read() {
    for filter in [true, false] {
        let server = GitServer::start().await;
        let url = realistic_repo(&server, "states", STATES, filter);
        server.take_requests();
        let backend = TestBackend::start(&url, &[]).await;
        let client = Client::new(&backend.url);

        assert_eq!(get(&client, NAME).await, realistic_state(7, 60, 1));
        let (labels, bytes) = seen(&server);
        if filter {
            assert_eq!(
                labels,
                [
                    "GET refs/upload-pack",
                    "POST upload-pack",
                    "POST upload-pack"
                ]
            );
            // Advertisement, trees, one blob: 9,958 to 9,963 bytes over runs (the server's pack
            // of the trees is not byte-for-byte the same every time).
            assert!(
                (9_950..=9_970).contains(&bytes),
                "cold read fetched {bytes} bytes"
            );
        } else {
            assert_eq!(labels, ["GET refs/upload-pack", "POST upload-pack"]);
            // Every blob of the tip; git's threaded delta search makes the last bytes vary.
            assert!(
                (800_000..900_000).contains(&bytes),
                "a whole tip is {bytes} bytes"
            );
        }
        eprintln!("filter {filter}: cold read {labels:?} {bytes} bytes");

        // Warm: another state of the same tip.
        let other = "team/s0123.tfstate";
        assert_eq!(get(&client, other).await, realistic_state(123, 60, 1));
        let (labels, bytes) = seen(&server);
        if filter {
            assert_eq!(labels, ["GET refs/upload-pack", "POST upload-pack"]);
            // Advertisement and one blob: 4,884 to 4,889 bytes over runs (whether the server
            // reuses the blob's packed form or compresses it again).
            assert!(
                (4_870..=4_900).contains(&bytes),
                "warm read fetched {bytes} bytes"
            );
        } else {
            assert_eq!(labels, ["GET refs/upload-pack"]);
        }
        eprintln!("filter {filter}: warm read {labels:?} {bytes} bytes");
        // Read again: nothing but the advertisement.
        get(&client, other).await;
        assert_eq!(seen(&server).0, ["GET refs/upload-pack"]);
    }
}

/// A state list and a history page in a process that fetched trees only: they read the index
/// and walk trees, fetching what they need.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_and_history_work_on_a_partial_cache() {
    let server = GitServer::start().await;
    let url = realistic_repo(&server, "states", STATES, true);
    let backend = TestBackend::start(&url, &[]).await;
    let client = Client::new(&backend.url);
    get(&client, NAME).await;
    let list = client.send("GET", "/states", None).await;
    assert_eq!(list.status, 200, "{}", list.body);
    assert!(list.body.contains("team/s0199.tfstate"), "{}", list.body);
    let history = client.send("GET", &format!("/history/{NAME}"), None).await;
    assert_eq!(history.status, 200, "{}", history.body);
    let at = client
        .send("GET", &format!("/history/{NAME}?at=1"), None)
        .await;
    assert_eq!(
        (at.status, at.body.as_str()),
        (200, realistic_state(7, 60, 1).as_str())
    );
}

/// One request's answer status, asserted.
async fn send(client: &Client, method: &str, path: &str, body: Option<&str>, want: u16) {
    let answer = client.send(method, path, body).await;
    assert_eq!(answer.status, want, "{method} {path}: {}", answer.body);
}

/// An apply's requests, each with the git requests it made.
async fn apply(
    server: &GitServer,
    client: &Client,
    id: &str,
    write: Option<&str>,
) -> Vec<(&'static str, Vec<String>, u64)> {
    let mut steps = Vec::new();
    send(
        client,
        "LOCK",
        &format!("/states/{NAME}"),
        Some(&lock_info(id)),
        200,
    )
    .await;
    let (labels, bytes) = seen(server);
    steps.push(("LOCK", labels, bytes));
    get(client, NAME).await;
    let (labels, bytes) = seen(server);
    steps.push(("GET", labels, bytes));
    if let Some(state) = write {
        send(
            client,
            "POST",
            &format!("/states/{NAME}?ID={id}"),
            Some(state),
            200,
        )
        .await;
        let (labels, bytes) = seen(server);
        steps.push(("write", labels, bytes));
    }
    send(
        client,
        "UNLOCK",
        &format!("/states/{NAME}"),
        Some(&lock_info(id)),
        200,
    )
    .await;
    let (labels, bytes) = seen(server);
    steps.push(("UNLOCK", labels, bytes));
    steps
}

fn labels(steps: &[(&str, Vec<String>, u64)]) -> Vec<(String, Vec<String>)> {
    steps
        .iter()
        .map(|(op, labels, _)| ((*op).to_owned(), labels.clone()))
        .collect()
}

fn step(op: &str, labels: &[&str]) -> (String, Vec<String>) {
    (
        op.to_owned(),
        labels.iter().map(|l| (*l).to_owned()).collect(),
    )
}

/// A backend that every request of a Terraform run reaches (`GITSTATE_SINGLE_FRONT`): the GET
/// after a LOCK may rest on what the LOCK push proved.
const SINGLE_FRONT: &[(&str, &str)] = &[("GITSTATE_SINGLE_FRONT", "true")];

const PUSH: &str = "POST receive-pack";
const PUSH_ADVERT: &str = "GET refs/receive-pack";
const FETCH: &str = "POST upload-pack";
const FETCH_ADVERT: &str = "GET refs/upload-pack";

/// Warm applies at the floor, in a backend every request of a run reaches, of a state without a
/// ref of its own (`GITSTATE_STATE_REFS=auto`): where the remote pushes atomically, an update
/// apply is 3 git requests and a no-op apply 2: the LOCK push asserts the branch at the tip
/// this process knows and shows that the state has no ref (its probe is refused by a ref of
/// that name), so the GET asks nothing, and the write rests on what the LOCK proved. Without
/// atomic push the LOCK proves nothing: the GET asks and a write under a lock keeps its
/// advertisement (5). The same with the filter on and off. (With a ref, the LOCK asserts its
/// tip: `state_ref_updates_are_at_the_floor`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_applies_are_at_the_floor() {
    init_tracing();
    for mode in [PushMode::Atomic, PushMode::NoAtomic] {
        for filter in [true, false] {
            let server = GitServer::start_in(mode).await;
            let url = realistic_repo(&server, "states", STATES, filter);
            let backend = TestBackend::start(&url, SINGLE_FRONT).await;
            let client = Client::new(&backend.url);
            // The first apply of the process: cold.
            let cold = apply(&server, &client, "a-1", Some(&realistic_state(7, 60, 2))).await;
            eprintln!("{mode:?} filter {filter}: cold update apply {cold:?}");
            let update = apply(&server, &client, "a-2", Some(&realistic_state(7, 60, 3))).await;
            eprintln!("{mode:?} filter {filter}: warm update apply {update:?}");
            let atomic = mode == PushMode::Atomic;
            let (read, write): (&[&str], &[&str]) = if atomic {
                (&[], &[PUSH])
            } else {
                (&[FETCH_ADVERT], &[PUSH_ADVERT, PUSH])
            };
            assert_eq!(
                labels(&update),
                [
                    step("LOCK", &[PUSH]),
                    step("GET", read),
                    step("write", write),
                    step("UNLOCK", &[PUSH]),
                ],
                "{mode:?} filter {filter}"
            );
            // Exact bytes: report-status answers, and the GET's advertisement (which lists
            // `filter` when offered, and the ref recording the lock ref prefix: 101 bytes).
            let advert = match (atomic, filter) {
                (true, _) => 0,
                (false, true) => 555,
                (false, false) => 548,
            };
            // With atomic push, the report answers the lock's create, the branch's assertion
            // and the probe's three commands.
            let lock_bytes = if atomic { 174 } else { 70 };
            // The release deletes the probe with the lock.
            let unlock_bytes = if atomic { 151 } else { 70 };
            let write_bytes = if atomic { 93 } else { 441 };
            let bytes: Vec<u64> = update.iter().map(|s| s.2).collect();
            assert_eq!(
                bytes,
                [lock_bytes, advert, write_bytes, unlock_bytes],
                "{mode:?} filter {filter}"
            );
            let noop = apply(&server, &client, "a-3", None).await;
            let bytes: Vec<u64> = noop.iter().map(|s| s.2).collect();
            assert_eq!(
                bytes,
                [lock_bytes, advert, unlock_bytes],
                "{mode:?} filter {filter}"
            );
            eprintln!("{mode:?} filter {filter}: warm no-op apply {noop:?}");
            assert_eq!(
                labels(&noop),
                [
                    step("LOCK", &[PUSH]),
                    step("GET", read),
                    step("UNLOCK", &[PUSH]),
                ],
                "{mode:?} filter {filter}"
            );
            assert_eq!(get(&client, NAME).await, realistic_state(7, 60, 3));
        }
    }
}

/// A single front that writes every update to the state's own ref, with the Lambda's settings
/// otherwise (no fold after writes).
async fn single_front_on_refs(url: &str) -> TestBackend {
    let cache = tempfile::tempdir().expect("tempdir");
    let mut extra = vec![("GITSTATE_STATE_REFS", "always")];
    extra.extend(SINGLE_FRONT.iter().copied());
    let mut settings = settings_for(url, cache.path(), &extra);
    settings.runtime = gitstate_app::Runtime::Lambda;
    TestBackend::serve(app(&settings).await, cache).await
}

/// Updates of a state's own ref (`GITSTATE_STATE_REFS=always`, the Lambda's default; here with
/// the Lambda's settings, which fold on a schedule, not after each write): the first update of a
/// state creates its ref with one create-only push that asserts the branch the GET saw (a fresh
/// advertisement when the branch moved since), and every update after it is one push at the
/// floor, `T → S` with the lock ref asserted; the LOCK push asserts the state's ref (so the GET
/// asks nothing), with a single front as in the Lambda shape: an update apply is 3 git requests
/// (LOCK, write, UNLOCK).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_ref_updates_are_at_the_floor() {
    init_tracing();
    for single in [false, true] {
        let server = GitServer::start().await;
        let url = realistic_repo(&server, "states", STATES, true);
        let cache = tempfile::tempdir().expect("tempdir");
        let mut extra = vec![("GITSTATE_STATE_REFS", "always")];
        extra.extend(SINGLE_FRONT.iter().copied().filter(|_| single));
        let mut settings = settings_for(&url, cache.path(), &extra);
        settings.runtime = gitstate_app::Runtime::Lambda;
        let backend = TestBackend::serve(app(&settings).await, cache).await;
        let client = Client::new(&backend.url);
        let branch_file = || {
            git(
                &["show", &format!("main:{NAME}")],
                Some(&server.repo_dir("states")),
            )
        };
        let before = branch_file();
        // The first apply of the process (cold), and the state's first update: its ref is made.
        apply(&server, &client, "a-1", Some(&realistic_state(7, 60, 2))).await;
        let update = apply(&server, &client, "a-2", Some(&realistic_state(7, 60, 3))).await;
        eprintln!("single front {single}: warm update apply of a state ref {update:?}");
        assert_eq!(
            labels(&update),
            [
                step("LOCK", &[PUSH]),
                step("GET", &[]),
                step("write", &[PUSH]),
                step("UNLOCK", &[PUSH]),
            ],
            "single front {single}"
        );
        assert_eq!(get(&client, NAME).await, realistic_state(7, 60, 3));
        assert_eq!(branch_file(), before, "the branch waits for a fold");
        let reference = gitstate_tests::states::state_ref("main", NAME);
        let tip = gitstate_tests::states::ref_tip(&server.repo_dir("states"), &reference);
        assert!(tip.is_some(), "{reference}");

        // Another state, updated for the first time: the lock's probe (the LOCK showed that
        // the state has no ref) goes first, then its ref is created by one create-only push
        // that also asserts the branch the GET under the lock saw.
        let other = "team/s0008.tfstate";
        client.lock(other, "b-1").await.expect(200);
        get(&client, other).await;
        server.take_requests();
        let state = realistic_state(8, 60, 2);
        send(
            &client,
            "POST",
            &format!("/states/{other}?ID=b-1"),
            Some(&state),
            200,
        )
        .await;
        assert_eq!(seen(&server).0, [PUSH, PUSH], "a state's first update");
        client.unlock(other, "b-1").await.expect(200);
        assert_eq!(get(&client, other).await, state);

        // The branch moved between the GET and the first update (another process created a
        // state): the assertion refuses the push, and the write lands from a fresh look.
        let third = "team/s0009.tfstate";
        client.lock(third, "c-1").await.expect(200);
        get(&client, third).await;
        let elsewhere = TestBackend::start(&url, &[]).await;
        let created = "team/new.tfstate";
        let maker = Client::new(&elsewhere.url);
        maker.lock(created, "n-1").await.expect(200);
        maker
            .write_locked(created, "n-1", &realistic_state(1, 3, 1))
            .await
            .expect(200);
        maker.unlock(created, "n-1").await.expect(200);
        server.take_requests();
        let state = realistic_state(9, 60, 2);
        send(
            &client,
            "POST",
            &format!("/states/{third}?ID=c-1"),
            Some(&state),
            200,
        )
        .await;
        assert_eq!(
            seen(&server).0,
            [PUSH, PUSH, PUSH_ADVERT, FETCH, PUSH],
            "a first update after the branch moved (the probe's delete, the refused create, then \
             the fresh look fetches the new tip)"
        );
        client.unlock(third, "c-1").await.expect(200);
        assert_eq!(get(&client, third).await, state);
        assert_eq!(get(&maker, created).await, realistic_state(1, 3, 1));
    }
}

/// What a LOCK proves is the state's newest content only as far as this process knows it:
/// after another process wrote the state, the LOCK's assertion is refused and the GET asks the
/// remote (and answers the other's write); an accepted one answers the GETs of the next five
/// seconds (Terraform's create reads twice), and a GET after that, or after the holder's own
/// write, asks again. Each GET's answer is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_proves_the_state_only_while_the_branch_is_as_known() {
    init_tracing();
    let server = GitServer::start().await;
    let url = realistic_repo(&server, "states", STATES, true);
    // Only a state's own ref is proved (see `warm_applies_are_at_the_floor`): every update goes
    // there (`always`), and no fold runs after writes (the Lambda's settings) to add requests.
    let (a, b) = (
        single_front_on_refs(&url).await,
        single_front_on_refs(&url).await,
    );
    let (a, b) = (Client::new(&a.url), Client::new(&b.url));
    apply(&server, &a, "a-1", Some(&realistic_state(7, 60, 2))).await;
    let path = format!("/states/{NAME}");

    // B writes the state (under its own lock): A's LOCK is still one push, whose assertion of
    // the tip A knew is refused; A's GET asks the remote and reads B's write.
    let by_b = realistic_state(7, 60, 3);
    apply(&server, &b, "b-1", Some(&by_b)).await;
    server.take_requests();
    send(&a, "LOCK", &path, Some(&lock_info("a-2")), 200).await;
    assert_eq!(seen(&server).0, [PUSH], "the LOCK is one push");
    assert_eq!(get(&a, NAME).await, by_b, "the GET after a refused proof");
    let (labels, _) = seen(&server);
    assert!(labels.starts_with(&[FETCH_ADVERT.to_owned()]), "{labels:?}");
    send(&a, "UNLOCK", &path, Some(&lock_info("a-2")), 200).await;

    // Nothing moved since: the proof holds for the GETs that follow.
    server.take_requests();
    send(&a, "LOCK", &path, Some(&lock_info("a-3")), 200).await;
    assert_eq!(get(&a, NAME).await, by_b);
    assert_eq!(
        seen(&server).0,
        [PUSH],
        "LOCK and a GET from what it proved"
    );
    assert_eq!(get(&a, NAME).await, by_b);
    assert_eq!(
        seen(&server).0,
        Vec::<String>::new(),
        "a second GET from it too"
    );
    // A few seconds on, it answers no GET: a lock broken by force could have let a write in.
    tokio::time::sleep(std::time::Duration::from_millis(5_100)).await;
    assert_eq!(get(&a, NAME).await, by_b);
    assert_eq!(seen(&server).0, [FETCH_ADVERT], "a GET after 5 s asks");

    // A's own write under the lock: the proof is gone, the GET asks and reads the write.
    send(&a, "UNLOCK", &path, Some(&lock_info("a-3")), 200).await;
    send(&a, "LOCK", &path, Some(&lock_info("a-4")), 200).await;
    let by_a = realistic_state(7, 60, 4);
    send(&a, "POST", &format!("{path}?ID=a-4"), Some(&by_a), 200).await;
    server.take_requests();
    assert_eq!(get(&a, NAME).await, by_a);
    assert_eq!(
        seen(&server).0,
        [FETCH_ADVERT],
        "a GET after the write asks"
    );
    send(&a, "UNLOCK", &path, Some(&lock_info("a-4")), 200).await;
    assert_eq!(get(&b, NAME).await, by_a);
}

/// UNLOCK with the LockInfo of a lock another process made: the advertisement shows the lock,
/// one fetch brings its commit to compare the ID, then the conditional delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_of_another_process_lock_reads_it_first() {
    for filter in [true, false] {
        let server = GitServer::start().await;
        let url = realistic_repo(&server, "states", STATES, filter);
        let locker = TestBackend::start(&url, &[]).await;
        send(
            &Client::new(&locker.url),
            "LOCK",
            &format!("/states/{NAME}"),
            Some(&lock_info("other")),
            200,
        )
        .await;
        server.take_requests();
        let other = TestBackend::start(&url, &[]).await;
        let client = Client::new(&other.url);
        // A warm process: it has read and knows the capabilities.
        get(&client, NAME).await;
        send(&client, "GET", &format!("/locks/{NAME}"), None, 200).await;
        server.take_requests();
        send(
            &client,
            "UNLOCK",
            &format!("/states/{NAME}"),
            Some(&lock_info("other")),
            200,
        )
        .await;
        let (labels, bytes) = seen(&server);
        eprintln!("filter {filter}: unlock of another's lock {labels:?} {bytes} bytes");
        assert_eq!(labels, [PUSH_ADVERT, PUSH], "filter {filter}");
        // (the advertisement lists the ref recording the lock ref prefix, 101 of them, the
        // fence of versions that do not wait out a LOCK's proof, 123, and the probe the LOCK
        // made, which the push deletes with the lock: 200 more)
        assert_eq!(bytes, 791, "filter {filter}");
        send(&client, "GET", &format!("/locks/{NAME}"), None, 409).await;
    }
}

/// A warm process's pushes at the floor meet a remote that moved: a write on a stale tip falls
/// back and wins; a LOCK while another process holds the lock, and a write under a lock that was
/// force-unlocked and taken by another, lose as they must, leaving the branch as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_floor_pushes_fall_back_and_win_or_lose_correctly() {
    init_tracing();
    for mode in [PushMode::Atomic, PushMode::NoAtomic] {
        let server = GitServer::start_in(mode).await;
        let url = realistic_repo(&server, "states", STATES, true);
        let a = TestBackend::start(&url, &[]).await;
        let b = TestBackend::start(&url, &[]).await;
        let (a, b) = (Client::new(&a.url), Client::new(&b.url));
        apply(&server, &a, "a-1", Some(&realistic_state(7, 60, 2))).await;

        // A locks and reads (the GET's look under the lock lets A's write go at the floor);
        // then B moves the branch (another state): A's write at the floor misses, then wins.
        send(
            &a,
            "LOCK",
            &format!("/states/{NAME}"),
            Some(&lock_info("a-2")),
            200,
        )
        .await;
        get(&a, NAME).await;
        let other = "team/s0001.tfstate";
        send(
            &b,
            "POST",
            &format!("/states/{other}"),
            Some(&realistic_state(1, 60, 2)),
            200,
        )
        .await;
        server.take_requests();
        let state = realistic_state(7, 60, 3);
        send(
            &a,
            "POST",
            &format!("/states/{NAME}?ID=a-2"),
            Some(&state),
            200,
        )
        .await;
        let (labels, _) = seen(&server);
        if mode == PushMode::Atomic {
            // Missed, then the normal path: the new tip's trees and the index another write
            // changed (the state's own blob is unchanged, so cached).
            assert_eq!(
                labels,
                [PUSH, PUSH_ADVERT, FETCH, FETCH, PUSH],
                "missed the floor, then won"
            );
        } else {
            // Without atomic push a write under a lock advertises first anyway.
            assert_eq!(labels, [PUSH_ADVERT, FETCH, FETCH, PUSH]);
        }
        assert_eq!(get(&b, NAME).await, state);
        assert_eq!(get(&b, other).await, realistic_state(1, 60, 2));

        // B force-unlocks and takes the lock: A's write under its old lock is refused.
        send(&b, "UNLOCK", &format!("/states/{NAME}"), Some(""), 200).await;
        send(
            &b,
            "LOCK",
            &format!("/states/{NAME}"),
            Some(&lock_info("b-1")),
            200,
        )
        .await;
        let before = git(&["ls-remote", &server.url_with_credentials("states")], None);
        let refused = a
            .send(
                "POST",
                &format!("/states/{NAME}?ID=a-2"),
                Some(&realistic_state(7, 60, 4)),
            )
            .await;
        assert!(
            refused.status == 409 || refused.status == 423,
            "{mode:?}: {} {}",
            refused.status,
            refused.body
        );
        // A LOCK at the floor while B holds it: create-only, refused, the holder reported.
        let locked = a
            .send("LOCK", &format!("/states/{NAME}"), Some(&lock_info("a-3")))
            .await;
        assert_eq!(locked.status, 423, "{}", locked.body);
        assert!(locked.body.contains("b-1"), "{}", locked.body);
        assert_eq!(
            git(&["ls-remote", &server.url_with_credentials("states")], None),
            before,
            "{mode:?}: nothing moved"
        );
        assert_eq!(get(&a, NAME).await, state);

        // B releases its lock. A still remembers the lock it made (force-unlocked long ago): a
        // write without a lock ID, refused on that memory, is decided again from the remote.
        send(
            &b,
            "UNLOCK",
            &format!("/states/{NAME}"),
            Some(&lock_info("b-1")),
            200,
        )
        .await;
        let free = realistic_state(7, 60, 5);
        send(&a, "POST", &format!("/states/{NAME}"), Some(&free), 200).await;
        assert_eq!(get(&b, NAME).await, free);
    }
}

/// With the access policy in the repository (`.gitstate/access.toml`), a cold read fetches the
/// tip's trees once, then the access file and the state: the policy costs no second look at the
/// remote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_read_with_the_policy_in_the_repository() {
    let server = GitServer::start().await;
    let url = realistic_repo(&server, "policy", STATES, true);
    let work = tempfile::tempdir().expect("tempdir");
    let clone = work.path().join("clone");
    let clone_str = clone.to_str().expect("utf-8");
    git(
        &[
            "clone",
            "-q",
            &server.url_with_credentials("policy"),
            clone_str,
        ],
        None,
    );
    std::fs::create_dir_all(clone.join(".gitstate")).expect("mkdir");
    std::fs::write(
        clone.join(".gitstate/access.toml"),
        gitstate_tests::access_file(&[(
            gitstate_tests::TEST_USER,
            gitstate_tests::TEST_PASSWORD,
            &["admin:*"],
        )]),
    )
    .expect("write");
    git(&["add", "."], Some(&clone));
    git(&["commit", "-q", "-m", "access"], Some(&clone));
    git(&["push", "-q", "origin", "HEAD:main"], Some(&clone));
    server.take_requests();
    let backend = TestBackend::start(&url, &[("GITSTATE_ACCESS_REFRESH_SECS", "10")]).await;
    let client = Client::new(&backend.url);
    assert_eq!(get(&client, NAME).await, realistic_state(7, 60, 1));
    let (labels, bytes) = seen(&server);
    eprintln!("cold read with the policy in the repository: {labels:?} {bytes} bytes");
    assert_eq!(
        labels,
        [
            "GET refs/upload-pack",
            "POST upload-pack",
            "POST upload-pack"
        ]
    );
}

/// A host that declines a whole push naming a ref outside branches and tags (a pre-receive
/// hook: some hosts allow only those). A single front's LOCK, whose probe is such a ref, goes
/// once more alone and lands; from then on no LOCK probes there and the GET after it asks the
/// remote, as without a proof. Every answer is the state's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_allows_only_branches_and_tags_still_locks_a_single_front() {
    use std::os::unix::fs::PermissionsExt;
    init_tracing();
    let server = GitServer::start().await;
    let url = realistic_repo(&server, "states", STATES, true);
    let hook = server.repo_dir("states").join("hooks/pre-receive");
    let script = "#!/bin/sh\nwhile read old new ref; do\n  case \"$ref\" in\n    refs/heads/*|refs/tags/*) ;;\n    *) echo \"only branches and tags: $ref\" >&2; exit 1 ;;\n  esac\ndone\n";
    std::fs::write(&hook, script).expect("hook");
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let backend = TestBackend::start(&url, SINGLE_FRONT).await;
    let client = Client::new(&backend.url);
    let first = apply(&server, &client, "a-1", Some(&realistic_state(7, 60, 2))).await;
    let pushes = first[0].1.iter().filter(|l| *l == PUSH).count();
    // The declined LOCK push, the lock alone, and the record of the lock ref prefix (the
    // repository's first LOCK), which this host declines too (a warning).
    assert_eq!(pushes, 3, "{first:?}");
    // No probe from then on; the record is pushed again with each LOCK (a refusal may be
    // passing), which advertises first: the host never lets a LOCK go at the floor.
    for serial in 3..=4 {
        let id = format!("a-{serial}");
        let update = apply(&server, &client, &id, Some(&realistic_state(7, 60, serial))).await;
        assert_eq!(
            labels(&update),
            [
                step("LOCK", &[PUSH_ADVERT, PUSH, PUSH]),
                step("GET", &[FETCH_ADVERT]),
                step("write", &[PUSH]),
                step("UNLOCK", &[PUSH]),
            ]
        );
    }
    assert_eq!(get(&client, NAME).await, realistic_state(7, 60, 4));
}

/// A LOCK's probe stands while its lock is held and goes with the release, a force-unlock's
/// through another backend included. One left behind otherwise (here made by hand, as a lock
/// deleted by hand would leave it) never costs more than a look: a single front's next LOCK
/// cannot create it and its GET asks, the LOCK after that takes it over (the GET asks nothing)
/// and its release deletes it; and a backend with `GITSTATE_STATE_REFS=always` deletes one in
/// the way of the state's first ref. Every write reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_left_behind_never_keeps_a_state_from_its_ref() {
    init_tracing();
    let server = GitServer::start().await;
    let url = realistic_repo(&server, "states", STATES, true);
    let repo = server.repo_dir("states");
    let reference = gitstate_tests::states::state_ref("main", NAME);
    let probe = format!("{reference}/absent");
    let probe_tip = || gitstate_tests::states::ref_tip(&repo, &probe);
    let leave_probe = || {
        git(&["update-ref", &probe, "refs/heads/main"], Some(&repo));
    };
    let single = TestBackend::start(&url, SINGLE_FRONT).await;
    let front = Client::new(&single.url);
    let cache = tempfile::tempdir().expect("tempdir");
    let settings = settings_for(&url, cache.path(), &[("GITSTATE_STATE_REFS", "always")]);
    let other = TestBackend::serve(app(&settings).await, cache).await;
    let other = Client::new(&other.url);
    // Warm (capabilities, tip), then a LOCK that probes: its probe stands until the release. A
    // GET through another backend meanwhile asks and sees the probe; the next LOCK still
    // probes afresh, and its GET asks nothing.
    apply(&server, &front, "a-1", Some(&realistic_state(7, 60, 2))).await;
    front.lock(NAME, "a-2").await.expect(200);
    assert!(probe_tip().is_some(), "{probe}");
    let proved = get(&front, NAME).await;
    assert_eq!(get(&front, NAME).await, proved);
    assert_eq!(get(&other, NAME).await, proved, "read beside the probe");
    front.unlock(NAME, "a-2").await.expect(200);
    assert_eq!(probe_tip(), None, "released with the lock");
    let next = apply(&server, &front, "a-2b", None).await;
    assert_eq!(next[1].1, Vec::<String>::new(), "{next:?}");
    front.lock(NAME, "a-3").await.expect(200);
    other.force_unlock(NAME).await.expect(200);
    assert_eq!(
        probe_tip(),
        None,
        "released with the lock, by force elsewhere"
    );

    // Left behind: the next LOCK's GET asks; the one after takes the probe over.
    leave_probe();
    let asks = apply(&server, &front, "a-4", None).await;
    assert_eq!(asks[1].1, [FETCH_ADVERT], "{asks:?}");
    assert!(probe_tip().is_some(), "not this process's to delete yet");
    let over = apply(&server, &front, "a-5", None).await;
    assert_eq!(
        labels(&over),
        [
            step("LOCK", &[PUSH]),
            step("GET", &[]),
            step("UNLOCK", &[PUSH])
        ],
        "taken over, then released"
    );
    assert_eq!(probe_tip(), None);

    // Left behind again, in the way of a state ref's create under `always`.
    leave_probe();
    other.lock(NAME, "b-1").await.expect(200);
    get(&other, NAME).await;
    for serial in 3..=4 {
        let state = realistic_state(7, 60, serial);
        other.write_locked(NAME, "b-1", &state).await.expect(200);
        assert_eq!(get(&other, NAME).await, state);
    }
    other.unlock(NAME, "b-1").await.expect(200);
    assert_eq!(probe_tip(), None);
    assert!(
        gitstate_tests::states::ref_tip(&repo, &reference).is_some(),
        "the state's ref"
    );
    assert_eq!(get(&front, NAME).await, realistic_state(7, 60, 4));
}
