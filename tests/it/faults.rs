//! Faults in the git server, injected by a proxy in front of it: every answer is a success or a
//! retryable 5xx, nothing is half-written, and no lock leaks once the faults stop.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gitstate_tests::faults::{Fault, FaultProxy};
use gitstate_tests::{
    Answer, Client, GIT_TOKEN, GitServer, TEST_PASSWORD, TestBackend, capture_logs, captured_logs,
    git, lock_info, serial_of, state_json,
};

/// Git request timeout of the backend under test; stalls last longer.
const TIMEOUT_SECS: u64 = 2;

/// Send like Terraform does: retry 5xx (its http backend retries a few times), keep every
/// answer seen.
async fn with_retries(
    client: &Client,
    method: &str,
    path: &str,
    body: Option<&str>,
    seen: &mut BTreeMap<u16, usize>,
) -> Answer {
    for _ in 0..30 {
        let answer = client.send(method, path, body).await;
        *seen.entry(answer.status).or_default() += 1;
        if answer.status < 500 {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{method} {path}: still 5xx after 30 tries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn git_server_faults_give_5xx_or_success_never_half_writes_or_stuck_locks() {
    capture_logs();
    let server = GitServer::start().await;
    server.create_repo("faulty");
    // receive-pack's automatic gc runs inside the push that triggers it, not detached: a
    // background repack could remove a pack while the fsck below reads it.
    git(
        &["config", "gc.autoDetach", "false"],
        Some(&server.repo_dir("faulty")),
    );
    let stall = Duration::from_secs(TIMEOUT_SECS) + Duration::from_millis(500);
    let proxy = FaultProxy::start(
        server.address,
        11,
        0.25,
        vec![
            Fault::Refuse(500),
            Fault::Refuse(503),
            Fault::LoseAnswer,
            Fault::CutBody,
            Fault::Stall(stall),
            Fault::Slow(Duration::from_millis(300)),
        ],
    )
    .await;
    let url = proxy.url("faulty");
    let timeout = TIMEOUT_SECS.to_string();
    let backends = [
        TestBackend::start(&url, &[("GITSTATE_GIT_TIMEOUT_SECS", &timeout)]).await,
        TestBackend::start(&url, &[("GITSTATE_GIT_TIMEOUT_SECS", &timeout)]).await,
    ];
    let urls: Arc<Vec<String>> = Arc::new(backends.iter().map(|b| b.url.clone()).collect());
    const STATES: usize = 4;
    const CYCLES: u64 = 6;
    let started = Instant::now();
    let tasks: Vec<_> = (0..STATES)
        .map(|s| {
            let urls = urls.clone();
            tokio::spawn(async move {
                let mut seen = BTreeMap::new();
                let name = format!("svc-{s}/app.tfstate");
                for cycle in 1..=CYCLES {
                    let client = Client::new(&urls[(s + cycle as usize) % urls.len()]);
                    let id = format!("s{s}-c{cycle}");
                    let lock = with_retries(
                        &client,
                        "POST",
                        &format!("/locks/{name}"),
                        Some(&lock_info(&id)),
                        &mut seen,
                    )
                    .await;
                    assert_eq!(lock.status, 200, "{name} {id}: {}", lock.body);
                    let got =
                        with_retries(&client, "GET", &format!("/states/{name}"), None, &mut seen)
                            .await;
                    if cycle > 1 {
                        assert_eq!(got.status, 200, "{name}: {}", got.body);
                        assert_eq!(serial_of(&got.body), cycle - 1);
                    }
                    let body = state_json(&format!("lineage-{s}"), cycle);
                    let write = with_retries(
                        &client,
                        "POST",
                        &format!("/states/{name}?ID={id}"),
                        Some(&body),
                        &mut seen,
                    )
                    .await;
                    assert_eq!(write.status, 200, "{name} {id}: {}", write.body);
                    let unlock = with_retries(
                        &client,
                        "DELETE",
                        &format!("/locks/{name}"),
                        Some(&lock_info(&id)),
                        &mut seen,
                    )
                    .await;
                    assert_eq!(unlock.status, 200, "{name} {id}: {}", unlock.body);
                }
                seen
            })
        })
        .collect();
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for task in tasks {
        for (status, n) in task.await.expect("apply cycles under faults") {
            *statuses.entry(status).or_default() += n;
        }
    }
    let elapsed = started.elapsed();
    let injected = proxy.injected();
    proxy.set_enabled(false);
    // Requests the backend gave up on may still be finishing at the server.
    server.quiesce().await;

    // Every answer was a success or a 5xx: nothing else leaks out of a git failure.
    for status in statuses.keys() {
        assert!(
            *status == 200 || *status == 404 || *status >= 500,
            "answers: {statuses:?}"
        );
    }
    assert!(
        statuses.keys().any(|s| *s >= 500),
        "the faults were felt: {statuses:?}"
    );

    // Nothing half-written: every version of every state in the history parses, serials only
    // grow, and each state ends at its last cycle.
    let repo = server.repo_dir("faulty");
    for s in 0..STATES {
        let name = format!("svc-{s}/app.tfstate");
        let commits = git(&["rev-list", "--reverse", "main", "--", &name], Some(&repo));
        let mut last = 0;
        for commit in commits.lines() {
            let body = git(&["show", &format!("{commit}:{name}")], Some(&repo));
            let serial = serial_of(&body);
            assert!(serial > last, "{name}: serial {serial} after {last}");
            last = serial;
        }
        assert_eq!(last, CYCLES, "{name} ends at its last write");
    }
    let fsck = gitstate_tests::git_output(&["fsck", "--strict", "--no-progress"], Some(&repo));
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stderr)
    );

    // No lock leaked, and a clean lock/unlock cycle works on every state once the faults stop.
    let refs = git(&["ls-remote", &server.url_with_credentials("faulty")], None);
    assert!(!refs.contains("refs/heads/locks/"), "leaked lock: {refs}");
    let client = Client::new(&backends[0].url);
    for s in 0..STATES {
        let name = format!("svc-{s}/app.tfstate");
        client.lock(&name, "clean").await.expect(200);
        client.unlock(&name, "clean").await.expect(200);
    }
    let logs = captured_logs();
    assert!(logs.contains("DEBUG"), "logs were captured");
    for secret in [GIT_TOKEN, TEST_PASSWORD] {
        assert!(
            !logs.contains(secret),
            "a secret ({}…) was logged",
            &secret[..3]
        );
    }
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for fault in &injected {
        let kind = format!("{fault:?}");
        let kind = kind.split('(').next().unwrap_or_default().to_owned();
        *kinds.entry(kind).or_default() += 1;
    }
    eprintln!(
        "faults: {} injected {kinds:?}; backend answers {statuses:?}; {STATES} states x {CYCLES} \
         cycles done in {elapsed:.1?}; history parses, no lock leaked",
        injected.len()
    );
}

/// Real Terraform through the faulty git server: with its http backend retrying 5xx, every
/// apply succeeds, and the stored state is the last apply's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terraform_applies_through_git_server_faults() {
    let server = GitServer::start().await;
    server.create_repo("tf-faulty");
    git(
        &["config", "gc.autoDetach", "false"],
        Some(&server.repo_dir("tf-faulty")),
    );
    let proxy = FaultProxy::start(
        server.address,
        23,
        0.3,
        vec![
            Fault::Refuse(500),
            Fault::Refuse(503),
            Fault::LoseAnswer,
            Fault::CutBody,
            Fault::Slow(Duration::from_millis(200)),
        ],
    )
    .await;
    let timeout = TIMEOUT_SECS.to_string();
    let backend = TestBackend::start(
        &proxy.url("tf-faulty"),
        &[("GITSTATE_GIT_TIMEOUT_SECS", &timeout)],
    )
    .await;
    let name = "env/app.tfstate";
    let work = tempfile::tempdir().expect("tempdir");
    let base = &backend.url;
    let backend_block = gitstate_tests::terraform_backend_block(
        base,
        name,
        "    retry_max      = 10\n    retry_wait_min = 1\n    retry_wait_max = 1",
    );
    std::fs::write(
        work.path().join("main.tf"),
        format!(
            r#"{backend_block}variable "round" {{
  type = number
}}
resource "terraform_data" "r" {{
  input = var.round
}}
output "round" {{
  value = terraform_data.r.output
}}
"#
        ),
    )
    .expect("main.tf");
    std::fs::write(work.path().join("empty.tfrc"), "").expect("cli config");
    let terraform = |args: &[&str]| {
        std::process::Command::new("terraform")
            .args(args)
            .current_dir(work.path())
            .env("TF_CLI_CONFIG_FILE", work.path().join("empty.tfrc"))
            .env("CHECKPOINT_DISABLE", "1")
            .env("TF_HTTP_USERNAME", gitstate_tests::TEST_USER)
            .env("TF_HTTP_PASSWORD", TEST_PASSWORD)
            .env("TF_IN_AUTOMATION", "1")
            .env("TF_INPUT", "0")
            .output()
            .expect("terraform runs (it must be on PATH)")
    };
    let check = |out: std::process::Output, what: &str| {
        assert!(
            out.status.success(),
            "terraform {what} failed through the faults:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    const APPLIES: u32 = 3;
    let started = Instant::now();
    let init = tokio::task::block_in_place(|| terraform(&["init", "-no-color"]));
    check(init, "init");
    for round in 1..=APPLIES {
        let var = format!("round={round}");
        let apply = tokio::task::block_in_place(|| {
            terraform(&["apply", "-auto-approve", "-no-color", "-var", &var])
        });
        check(apply, &format!("apply {round}"));
    }
    let elapsed = started.elapsed();
    let injected = proxy.injected().len();
    proxy.set_enabled(false);
    let client = Client::new(&backend.url);
    let got = client.get_state(name).await.expect(200);
    let state: serde_json::Value = serde_json::from_str(&got.body).expect("state parses");
    assert_eq!(state["outputs"]["round"]["value"], APPLIES, "{}", got.body);
    let refs = git(
        &["ls-remote", &server.url_with_credentials("tf-faulty")],
        None,
    );
    assert!(!refs.contains("refs/heads/locks/"), "leaked lock: {refs}");
    let repo = server.repo_dir("tf-faulty");
    for commit in git(&["rev-list", "main", "--", name], Some(&repo)).lines() {
        let body = git(&["show", &format!("{commit}:{name}")], Some(&repo));
        serde_json::from_str::<serde_json::Value>(&body).expect("every version parses");
    }
    eprintln!(
        "terraform through faults: init + {APPLIES} applies succeeded with {injected} faults \
         injected in {elapsed:.1?}; no lock leaked"
    );
}

/// A git server that hangs past the git timeout: the request deadline answers 504 (which
/// Terraform retries) long before the git calls would time out, and once the server answers again
/// nothing was left behind and the same operations succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_git_server_gets_a_504_at_the_request_deadline_and_leaves_nothing() {
    let server = GitServer::start().await;
    server.create_repo("hung");
    let proxy = FaultProxy::start(
        server.address,
        3,
        1.0,
        vec![Fault::Stall(Duration::from_secs(120))],
    )
    .await;
    // Git calls would wait 100 s; the request deadline is 2 s.
    let backend = TestBackend::start(
        &proxy.url("hung"),
        &[
            ("GITSTATE_GIT_TIMEOUT_SECS", "100"),
            ("GITSTATE_REQUEST_DEADLINE_SECS", "2"),
        ],
    )
    .await;
    let client = Client::new(&backend.url);
    let name = "hung/app.tfstate";
    let state = state_json("lineage-hung", 1);
    let lock = client.lock(name, "hung-1").await.expect(504);
    assert!(
        lock.body
            .contains("did not answer within 2 s; retrying is safe"),
        "{}",
        lock.body
    );
    for (method, path, body) in [
        ("GET", format!("/states/{name}"), None),
        ("POST", format!("/states/{name}"), Some(state.as_str())),
        ("GET", format!("/locks/{name}"), None),
    ] {
        let answer = client.send(method, &path, body).await;
        assert_eq!(answer.status, 504, "{method} {path}: {}", answer.body);
    }
    assert!(
        proxy.injected().len() >= 4,
        "every request met the stall: {:?}",
        proxy.injected()
    );
    let refs = git(&["ls-remote", &server.url_with_credentials("hung")], None);
    assert!(refs.is_empty(), "nothing reached the remote: {refs}");

    // The server answers again: Terraform's retries of the same requests succeed.
    proxy.set_enabled(false);
    client.lock(name, "hung-1").await.expect(200);
    client
        .write_locked(name, "hung-1", &state)
        .await
        .expect(200);
    client.unlock(name, "hung-1").await.expect(200);
    let refs = git(&["ls-remote", &server.url_with_credentials("hung")], None);
    assert!(!refs.contains("refs/heads/locks/"), "no lock left: {refs}");
}

/// An UNLOCK whose release push landed but whose answer was lost, with another holder locking
/// the state before the UNLOCK's retry of the same delete: the lock asked for is gone, so the
/// UNLOCK succeeds (it answered 409 naming the new holder, which invites a force-unlock of a
/// live lock), and the new holder's lock stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlock_whose_answer_was_lost_succeeds_and_spares_the_next_holder() {
    let server = GitServer::start().await;
    let url = server.create_repo("lost");
    let proxy = FaultProxy::start(server.address, 5, 0.0, Vec::new()).await;
    let (through_proxy, direct) = (
        TestBackend::start(&proxy.url("lost"), &[]).await,
        TestBackend::start(&url, &[]).await,
    );
    let (a, b) = (Client::new(&through_proxy.url), Client::new(&direct.url));
    let name = "lost/app.tfstate";
    // A warm process that made the lock: its UNLOCK is one conditional delete, no look first.
    a.lock(name, "a-0").await.expect(200);
    a.write_locked(name, "a-0", &state_json("lineage-lost", 1))
        .await
        .expect(200);
    a.unlock(name, "a-0").await.expect(200);
    a.lock(name, "a-1").await.expect(200);
    server.take_requests();

    let (release, forwarded) = proxy.lose_next_answer_held();
    let unlock = tokio::spawn(async move { a.unlock(name, "a-1").await });
    forwarded.notified().await;
    let first = server.take_requests();
    assert_eq!(
        first
            .iter()
            .map(gitstate_tests::Seen::label)
            .collect::<Vec<_>>(),
        ["POST receive-pack"],
        "the UNLOCK's first request is its delete"
    );
    // The delete landed; its answer is held. Another holder locks meanwhile.
    b.lock(name, "b-1").await.expect(200);
    release.notify_one();
    unlock.await.expect("unlock task").expect(200);
    let held = b.send("GET", &format!("/locks/{name}"), None).await;
    assert_eq!(held.status, 200, "{}", held.body);
    assert!(
        held.body.contains("\"b-1\""),
        "the next holder's lock stays: {}",
        held.body
    );
    b.unlock(name, "b-1").await.expect(200);
}

/// A DELETE whose push landed but whose answer was lost: the retry finds the state gone, by its
/// own push, and the DELETE answers 200 (it answered 404 "no state stored", which Terraform and
/// a person read as "nothing was deleted"). The state is deleted once, and a DELETE of a state
/// that is not there still answers 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_whose_answer_was_lost_answers_that_it_deleted() {
    let server = GitServer::start().await;
    server.create_repo("gone");
    let proxy = FaultProxy::start(server.address, 5, 0.0, Vec::new()).await;
    let backend = TestBackend::start(&proxy.url("gone"), &[]).await;
    let a = Client::new(&backend.url);
    let name = "gone/app.tfstate";
    a.lock(name, "a-0").await.expect(200);
    for serial in 1..=2 {
        a.write_locked(name, "a-0", &state_json("lineage-gone", serial))
            .await
            .expect(200);
    }
    // The next request is the delete's push (a warm process decides at the floor): it lands,
    // and its answer is lost.
    server.take_requests();
    let (release, _forwarded) = proxy.lose_next_answer_held();
    release.notify_one();
    let deleted = a.delete_state(name, Some("a-0")).await;
    assert_eq!(deleted.status, 200, "{}", deleted.body);
    let labels: Vec<String> = server
        .take_requests()
        .iter()
        .map(gitstate_tests::Seen::label)
        .collect();
    assert_eq!(
        labels.first().map(String::as_str),
        Some("POST receive-pack"),
        "{labels:?}"
    );
    a.get_state(name).await.expect(404);
    let history = a.history(name, "per_page=10").await.expect(200).history();
    let deletes = history.versions.iter().filter(|v| v.deleted).count();
    assert_eq!(deletes, 1, "deleted once: {history:?}");
    assert_eq!(
        a.delete_state(name, Some("a-0")).await.status,
        404,
        "a DELETE of a state that is not there"
    );
    a.unlock(name, "a-0").await.expect(200);
}

/// The state the lost-answer tests write.
const KEPT: &str = "kept/app.tfstate";

/// A git server with the repository `kept`, a backend A reaching it through a fault proxy and
/// a backend B reaching it directly (both with `GITSTATE_STATE_REFS=refs`); A holds the lock
/// `a-0` of [`KEPT`] and has written serial 1 under it.
struct Kept {
    server: GitServer,
    proxy: FaultProxy,
    a: std::sync::Arc<Client>,
    b: Client,
    _backends: (TestBackend, TestBackend),
}

impl Kept {
    async fn start(refs: &str) -> Self {
        let server = GitServer::start().await;
        let url = server.create_repo("kept");
        let proxy = FaultProxy::start(server.address, 5, 0.0, Vec::new()).await;
        let env = [("GITSTATE_STATE_REFS", refs)];
        let backends = (
            TestBackend::start(&proxy.url("kept"), &env).await,
            TestBackend::start(&url, &env).await,
        );
        let (a, b) = (
            std::sync::Arc::new(Client::new(&backends.0.url)),
            Client::new(&backends.1.url),
        );
        a.lock(KEPT, "a-0").await.expect(200);
        a.write_locked(KEPT, "a-0", &state_json("lineage-kept", 1))
            .await
            .expect(200);
        server.take_requests();
        Self {
            server,
            proxy,
            a,
            b,
            _backends: backends,
        }
    }
}

/// A locked write whose push landed but whose answer was lost, with the lock broken by force
/// before the write's retry and then, by another who takes the lock, nothing more, one to three
/// newer states written, or the state deleted (the delete carries an unfolded write onto the
/// branch): the retry finds its own commit, or the commit that carried it, on the branch or the
/// state's ref, and answers 200. Each write is in the history once; on the branch (`auto`) and
/// on the state's own ref (`always`). Before, it answered 409 ("not locked") for a write in
/// the history; with two or more writes after it, the walk stopped where the retry's shallow
/// fetch ended; after a delete, the retry went to the branch with no record of its push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_answer_was_lost_answers_that_it_wrote_after_a_force_unlock() {
    // What the next holder does before the retry: write this many newer states, or delete.
    #[derive(Debug, Clone, Copy)]
    enum Then {
        Writes(u64),
        Delete,
    }
    for refs in ["auto", "always"] {
        for then in [
            Then::Writes(0),
            Then::Writes(1),
            Then::Writes(2),
            Then::Writes(3),
            Then::Delete,
        ] {
            let kept = Kept::start(refs).await;
            let (server, proxy, b, name) = (&kept.server, &kept.proxy, &kept.b, KEPT);
            let a = kept.a.clone();
            let (release, forwarded) = proxy.lose_next_answer_held();
            let written = state_json("lineage-kept", 2);
            let write = {
                let written = written.clone();
                tokio::spawn(async move { a.write_locked(name, "a-0", &written).await })
            };
            forwarded.notified().await;
            let first: Vec<String> = server
                .take_requests()
                .iter()
                .map(gitstate_tests::Seen::label)
                .collect();
            assert_eq!(
                first,
                ["POST receive-pack"],
                "{refs}: the write's first request is its push"
            );
            // The write landed; its answer is held. Someone breaks the lock meanwhile.
            b.force_unlock(name).await.expect(200);
            let mut newest = written.clone();
            let mut want = vec![Some(2), Some(1)];
            match then {
                Then::Writes(0) => {}
                Then::Writes(count) => {
                    b.lock(name, "b-1").await.expect(200);
                    for serial in 3..3 + count {
                        newest = state_json("lineage-kept", serial);
                        b.write_locked(name, "b-1", &newest).await.expect(200);
                        want.insert(0, Some(serial));
                    }
                }
                Then::Delete => {
                    b.lock(name, "b-1").await.expect(200);
                    b.delete_state(name, Some("b-1")).await.expect(200);
                }
            }
            release.notify_one();
            let answer = write.await.expect("write task");
            let what = format!("{refs}, then {then:?}");
            assert_eq!(answer.status, 200, "{what}: {}", answer.body);
            let read = b.get_state(name).await;
            match then {
                Then::Delete => assert_eq!(read.status, 404, "{what}: deleted"),
                Then::Writes(_) => assert_eq!(read.expect(200).body, newest, "{what}"),
            }
            let history = b.history(name, "per_page=10").await.expect(200).history();
            let serials: Vec<Option<u64>> = history
                .versions
                .iter()
                .filter(|v| !v.deleted)
                .map(|v| v.serial)
                .collect();
            assert_eq!(serials, want, "{what}: each write once: {history:?}");
        }
    }
}

/// The other side of the two tests above: a deposed holder's write whose push went out but did
/// not land (its lock was broken and taken by another, who wrote the same content or deleted the
/// state, before the push reached the server; the server refused it, or it never got there) is
/// not answered 200: the content is there, but not by its push, and its lock is gone. Only a
/// push whose own commit is on the branch or the state's ref counts as landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_holders_push_that_did_not_land_is_not_acknowledged() {
    let mut wrong = Vec::new();
    let cases = [
        ("auto", false, None),
        ("always", false, None),
        ("auto", true, None),
        ("auto", false, Some(503)),
        ("always", false, Some(503)),
        ("auto", true, Some(503)),
    ];
    for (refs, delete, refuse) in cases {
        let kept = Kept::start(refs).await;
        let (server, proxy, b, name) = (&kept.server, &kept.proxy, &kept.b, KEPT);
        let a = kept.a.clone();
        let (release, arrived) = proxy.hold_next_before(refuse);
        let written = state_json("lineage-kept", 2);
        let write = {
            let written = written.clone();
            tokio::spawn(async move {
                if delete {
                    a.delete_state(name, Some("a-0")).await
                } else {
                    a.write_locked(name, "a-0", &written).await
                }
            })
        };
        arrived.notified().await;
        // A's push waits at the proxy. Its lock is broken and taken; the new holder writes the
        // very same content (or deletes the state).
        b.force_unlock(name).await.expect(200);
        b.lock(name, "b-1").await.expect(200);
        if delete {
            b.delete_state(name, Some("b-1")).await.expect(200);
        } else {
            b.write_locked(name, "b-1", &written).await.expect(200);
        }
        release.notify_one();
        let answer = write.await.expect("write task");
        let seen: Vec<String> = server
            .take_requests()
            .iter()
            .map(gitstate_tests::Seen::label)
            .collect();
        eprintln!(
            "{refs} delete={delete} refuse={refuse:?}: A answered {} {} after {seen:?}",
            answer.status,
            answer.body.trim()
        );
        if ![409, 423].contains(&answer.status) {
            wrong.push(format!(
                "{refs} delete={delete} refuse={refuse:?}: {}",
                answer.status
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "a deposed holder's write that did not land was answered: {wrong:?}"
    );
}

/// A GET after a LOCK answered from the LOCK's proof never says "no state" for a state that
/// exists. One process P in front of its clients (`GITSTATE_SINGLE_FRONT`, states on their own
/// refs) serves a list whose fetch is slow; meanwhile a run creates the state `s` and updates it
/// (to its own ref `T`) through P. The list then ends and notes the branch tip its
/// advertisement showed, which predates `s`, as the tip P last saw. The next run's LOCK at the
/// floor asserts `s`'s ref at `T` and the branch at that stale tip: the branch's assertion fails,
/// so the GET asks the remote rather than read "no file at that tip" as "no state" (which
/// Terraform would plan against). Found by review.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_after_a_proved_lock_never_says_no_state_for_a_state_that_exists() {
    let server = GitServer::start().await;
    let url = server.create_repo("front");
    let proxy = FaultProxy::start(server.address, 7, 0.0, Vec::new()).await;
    let env = [
        ("GITSTATE_SINGLE_FRONT", "true"),
        ("GITSTATE_STATE_REFS", "always"),
        ("GITSTATE_FOLD_AFTER_WRITES", "false"),
    ];
    let p = TestBackend::start(&proxy.url("front"), &env).await;
    let q = TestBackend::start(&url, &env).await;
    let (pc, qc) = (Arc::new(Client::new(&p.url)), Client::new(&q.url));
    // Warm P: its lock records the protocol, its write puts the tip in its cache.
    let warm = "front/warm.tfstate";
    pc.lock(warm, "w-0").await.expect(200);
    pc.write_locked(warm, "w-0", &state_json("lineage-warm", 1))
        .await
        .expect(200);
    pc.unlock(warm, "w-0").await.expect(200);
    // Another backend holds a lock P has not seen: P's list must fetch its commit.
    qc.lock("front/other.tfstate", "q-0").await.expect(200);
    let (release, arrived) = proxy.hold_next_fetch();
    let list = {
        let pc = pc.clone();
        tokio::spawn(async move { pc.send("GET", "/states", None).await })
    };
    arrived.notified().await;
    // While the list's fetch waits: a run creates `s` and updates it (to its own ref), through P.
    let name = "front/s.tfstate";
    let step = Duration::from_secs(20);
    let run = async {
        pc.lock(name, "r-1").await.expect(200);
        pc.get_state(name).await.expect(404);
        for serial in [1, 2] {
            pc.write_locked(name, "r-1", &state_json("lineage-s", serial))
                .await
                .expect(200);
        }
        pc.unlock(name, "r-1").await.expect(200);
    };
    tokio::time::timeout(step, run)
        .await
        .expect("the run through P finished while the list's fetch waited");
    release.notify_one();
    let listed = tokio::time::timeout(step, list)
        .await
        .expect("the list finished")
        .expect("list task");
    assert_eq!(listed.status, 200, "{}", listed.body);
    // The next run: LOCK, then Terraform's GET.
    pc.lock(name, "r-2").await.expect(200);
    let read = pc.get_state(name).await;
    let direct = qc.get_state(name).await;
    assert_eq!(direct.status, 200, "the state exists: {}", direct.body);
    assert_eq!(
        (read.status, read.body.as_str()),
        (200, direct.body.as_str()),
        "the GET after the LOCK answered an existing state as absent"
    );
    pc.unlock(name, "r-2").await.expect(200);
}

/// A DELETE whose push landed but whose answer was lost answers 200 (the rule of
/// `a_delete_whose_answer_was_lost_answers_that_it_deleted`) also when other states were written
/// meanwhile: two writes of other states through another backend land between the delete's
/// push and its retry, whose shallow fetch the walk for the delete's commit deepens (found by
/// review: the walk stopped there, and the rules answered 404 for a DELETE that deleted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_whose_answer_was_lost_answers_that_it_deleted_after_other_writes() {
    let kept = Kept::start("auto").await;
    let (proxy, b, name) = (&kept.proxy, &kept.b, KEPT);
    let a = kept.a.clone();
    let (release, forwarded) = proxy.lose_next_answer_held();
    let delete = tokio::spawn(async move { a.delete_state(name, Some("a-0")).await });
    forwarded.notified().await;
    // The delete landed; its answer is held. Other states are written meanwhile.
    for other in ["kept/other-1.tfstate", "kept/other-2.tfstate"] {
        b.lock(other, "b-1").await.expect(200);
        b.write_locked(other, "b-1", &state_json("lineage-other", 1))
            .await
            .expect(200);
        b.unlock(other, "b-1").await.expect(200);
    }
    release.notify_one();
    let answer = delete.await.expect("delete task");
    b.get_state(name).await.expect(404);
    assert_eq!(
        answer.status, 200,
        "a DELETE that deleted the state: {}",
        answer.body
    );
}
