//! Races between a write and what changed since the look it rests on, and answers lost on the
//! way, against the real `git http-backend`: a person's edit on the branch, another backend's
//! write, a lost answer to a fold's lease or to a state ref's push. Found by review.

use gitstate_tests::handmade::{Bare, Stamp, StateWrite};
use gitstate_tests::{Client, GitServer, PushMode, TestBackend, state_json};

/// A commit by a person with the git CLI (break-glass).
pub(crate) fn by_hand(path: &str) -> StateWrite {
    let stamp = Stamp {
        name: "ann".into(),
        email: "ann@example.invalid".into(),
        date: "1700000000 +0000".into(),
    };
    StateWrite {
        path: path.to_owned(),
        content: Vec::new(),
        author: stamp.clone(),
        committer: stamp,
        message: format!("break-glass: remove {path}\n"),
    }
}

/// A state whose home is its own ref; its holder LOCKs and GETs (a look under the lock: the ref
/// at its tip). A person then deletes the state's file on the branch by hand (`git rm`, the
/// documented break-glass delete), and the holder writes. The write to the state's ref does not
/// assert the branch (every apply's push would lock the one branch ref on the host), so it lands
/// behind the removal, which it cannot order against: the acknowledged write must then never
/// read as "no state" (Terraform's next plan would start empty) nor as the content before it.
/// Every read answers it, or 409 (the file removed outside gitstate while the ref holds writes
/// the branch never had: a person decides, both kept), and the state's ref holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ref_write_at_the_floor_after_a_break_glass_delete_never_reads_as_no_state() {
    for refs in ["auto", "always"] {
        let server = GitServer::start_in(PushMode::Atomic).await;
        let url = server.create_repo("rm");
        let env = [
            ("GITSTATE_STATE_REFS", refs),
            ("GITSTATE_FOLD_AFTER_WRITES", "false"),
        ];
        let backend = TestBackend::start(&url, &env).await;
        let c = Client::new(&backend.url);
        let x = "team/rm.tfstate";
        c.lock(x, "h0").await.expect(200);
        c.write_locked(x, "h0", &state_json("l", 1))
            .await
            .expect(200);
        let bare = Bare::new(&server.repo_dir("rm"), "main");
        if refs == "always" {
            c.write_locked(x, "h0", &state_json("l", 2))
                .await
                .expect(200);
        } else {
            // `auto` creates no ref: one made by an `always` backend of the same repository.
            let mut second = by_hand(x);
            second.content = state_json("l", 2).into_bytes();
            second.message = format!("write {x}\n\nSerial: 2\n");
            bare.state_write(&second);
        }
        c.unlock(x, "h0").await.expect(200);
        assert!(
            bare.tip(&bare.state_ref(x)).is_some(),
            "{refs}: the state has its own ref"
        );
        // The holder's LOCK and GET: a look under the lock.
        c.lock(x, "h1").await.expect(200);
        let read = c.get_state(x).await.expect(200);
        assert_eq!(gitstate_tests::serial_of(&read.body), 2, "{refs}");
        // A person removes the file on the branch.
        bare.branch_write(x, None, &by_hand(x));
        assert!(bare.file(x).is_none(), "{refs}: removed by hand");
        let v3 = state_json("l", 3);
        let wrote = c.write_locked(x, "h1", &v3).await;
        c.unlock(x, "h1").await.expect(200);
        if wrote.status != 200 {
            // Refused: nothing acknowledged, nothing to read back.
            continue;
        }
        let cold = TestBackend::start(&url, &env).await;
        for (who, client) in [
            ("the writer", &c),
            ("a cold process", &Client::new(&cold.url)),
        ] {
            let read = client.get_state(x).await;
            let answered = (read.status == 200 && read.body == v3)
                || (read.status == 409 && read.body.contains("outside gitstate"));
            assert!(
                answered,
                "{refs}: the acknowledged write, or 409, read through {who}: {} {} (branch \
                 file: {:?}, state ref: {:?})",
                read.status,
                read.body,
                bare.file(x)
                    .map(|b| String::from_utf8_lossy(&b).into_owned()),
                bare.tip(&bare.state_ref(x)),
            );
        }
        let kept = bare
            .tip(&bare.state_ref(x))
            .map(|tip| bare.git(&["show", &format!("{tip}:{x}")], &[], b""));
        let on_branch = bare
            .file(x)
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        assert!(
            kept.as_deref().map(str::trim) == Some(v3.trim())
                || on_branch.as_deref() == Some(v3.as_str()),
            "{refs}: the acknowledged write is kept (state ref: {kept:?}, branch: {on_branch:?})"
        );
    }
}

/// A `pre-receive` hook that, once armed (a file `armed`), holds the first push that creates a
/// state ref (`0 -> S` under `refs/gitstate/states/`) until the test resumes it (at most 8 s).
/// receive-pack checks the old ids after the hook, so what lands meanwhile is what the held push
/// is judged against.
const HOLD_CREATES: &str = r#"#!/bin/sh
Z=0000000000000000000000000000000000000000
hold=0
while read old new ref; do
  case "$ref" in
    refs/gitstate/states/*/absent) ;;
    refs/gitstate/states/*) [ "$old" = "$Z" ] && [ -e "$GIT_DIR/armed" ] && hold=1 ;;
  esac
done
if [ $hold = 1 ] && mv "$GIT_DIR/armed" "$GIT_DIR/holding" 2>/dev/null; then
  i=0
  while [ ! -e "$GIT_DIR/resume" ] && [ $i -lt 160 ]; do sleep 0.05; i=$((i+1)); done
  rm -f "$GIT_DIR/resume" "$GIT_DIR/holding"
fi
exit 0
"#;

fn install_hook(dir: &std::path::Path, hook: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("hooks/pre-receive");
    std::fs::create_dir_all(dir.join("hooks")).expect("hooks dir");
    std::fs::write(&path, hook).expect("hook");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

async fn wait_for(path: &std::path::Path, secs: u64) -> bool {
    for _ in 0..secs * 20 {
        if path.exists() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    false
}

/// A backend and its store (for folds).
pub(crate) struct Built {
    pub(crate) client: Client,
    pub(crate) store: std::sync::Arc<dyn gitstate_core::ports::StateStore>,
    pub(crate) at: gitstate_core::ports::Location,
    pub(crate) _served: TestBackend,
}

pub(crate) async fn built(url: &str, env: &[(&str, &str)]) -> Built {
    let cache = tempfile::tempdir().expect("tempdir");
    let settings = gitstate_tests::settings_for(url, cache.path(), env);
    let app = gitstate_app::build(settings).await.expect("backend");
    let store = app.backend.store().clone();
    let at = app.backend.locate(None, None).expect("primary");
    let served = TestBackend::serve(app.router(), cache).await;
    Built {
        client: Client::new(&served.url),
        store,
        at,
        _served: served,
    }
}

/// Unlocked writes (`GITSTATE_ALLOW_UNLOCKED_WRITES=true`, documented as compare-and-swaps of
/// the state's ref too): an `always` backend's first update of a state creates its ref by a
/// create-only push `0 -> S` planned on the branch's file as an advertisement showed it; the
/// push proves the ref absent and now asserts the branch as the plan judged it. Another
/// backend's write of the same state that lands on the branch in between (an unlocked DELETE; or
/// the update of a backend with `auto`, which writes a state without a ref to the branch) makes
/// it refused, and the write is planned again on what landed. Before, both were acknowledged:
/// - after the DELETE, the acknowledged update lived only on a ref the branch's missing file
///   made a leftover: the state read 404 and no history had the write;
/// - after the branch update, the ref's write hid it (its plan judged the older file: a lost
///   update), and every fold refused the state as if a person had edited the branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_refs_create_only_push_never_loses_a_branch_write_made_since_its_look() {
    for (other, deletes) in [("auto", false), ("always", true)] {
        let case = format!("the other backend {other}, deletes {deletes}");
        let server = GitServer::start_in(PushMode::Atomic).await;
        let url = server.create_repo("race");
        let dir = server.repo_dir("race");
        let fold_off = ("GITSTATE_FOLD_AFTER_WRITES", "false");
        let a = built(&url, &[("GITSTATE_STATE_REFS", "always"), fold_off]).await;
        let b = built(&url, &[("GITSTATE_STATE_REFS", other), fold_off]).await;
        let x = "team/race.tfstate";
        b.client.write(x, &state_json("l", 1)).await.expect(200);
        let bare = Bare::new(&dir, "main");
        assert!(bare.tip(&bare.state_ref(x)).is_none(), "{case}: no ref yet");
        install_hook(&dir, HOLD_CREATES);
        std::fs::write(dir.join("armed"), "").expect("arm");
        let v2 = state_json("l", 2);
        let writing = {
            let (client, v2) = (Client::new(&a._served.url), v2.clone());
            tokio::spawn(async move { client.write(x, &v2).await })
        };
        assert!(
            wait_for(&dir.join("holding"), 5).await,
            "{case}: the ref's create-only push was held"
        );
        let v3 = state_json("l", 3);
        let other_answer = if deletes {
            b.client.delete_state(x, None).await
        } else {
            b.client.write(x, &v3).await
        };
        std::fs::write(dir.join("resume"), "").expect("resume");
        let wrote = writing.await.expect("write task");
        eprintln!(
            "{case}: ref write {} {}, other {} {}",
            wrote.status, wrote.body, other_answer.status, other_answer.body
        );
        if wrote.status != 200 || other_answer.status != 200 {
            // One of them was refused: nothing lost.
            continue;
        }
        let report = a.store.fold(&a.at).await.expect("fold");
        let read = a.client.get_state(x).await;
        let log: Vec<Option<String>> = gitstate_tests::states::file_log(&dir, "refs/heads/main", x)
            .into_iter()
            .map(|(_, c)| c.map(|c| String::from_utf8_lossy(&c).into_owned()))
            .collect();
        let newest = gitstate_tests::states::newest_stored(&dir, "main", x)
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        let kept = |state: &str| {
            newest.as_deref() == Some(state) || log.iter().any(|c| c.as_deref() == Some(state))
        };
        assert!(
            kept(&v2),
            "{case}: the ref's acknowledged write is in neither the state nor its history: the \
             state reads {} {}, the branch's log {log:?}",
            read.status,
            read.body
        );
        if !deletes {
            assert!(kept(&v3), "{case}: the branch's acknowledged write is lost");
            assert!(
                report.refused.is_empty(),
                "{case}: a fold refuses a state nobody edited by hand: {report:?}"
            );
        }
    }
}

/// A fold whose push of the lease `refs/gitstate/fold` lands but whose answer is lost (a proxy's
/// 500, a connection cut after the server acted) looks again, finds the lease it just made and
/// takes it for its own (it remembers the lease commit it pushed until an answer comes), and
/// lets go of it when done. Before, it ended as "another fold holds the lease": nothing was
/// folded, and the lease stayed behind for the lease age (60 s), during which every fold gave up
/// as busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fold_whose_lease_answer_was_lost_neither_gives_up_nor_leaves_the_lease() {
    let server = GitServer::start_in(PushMode::Atomic).await;
    server.create_repo("lease");
    let proxy = gitstate_tests::faults::FaultProxy::start(server.address, 1, 0.0, vec![]).await;
    let url = proxy.url("lease");
    let env = [
        ("GITSTATE_STATE_REFS", "always"),
        ("GITSTATE_FOLD_AFTER_WRITES", "false"),
    ];
    let a = built(&url, &env).await;
    let x = "team/lease.tfstate";
    a.client.lock(x, "h").await.expect(200);
    for serial in 1..=2 {
        a.client
            .write_locked(x, "h", &state_json("l", serial))
            .await
            .expect(200);
    }
    a.client.unlock(x, "h").await.expect(200);
    let dir = server.repo_dir("lease");
    let bare = Bare::new(&dir, "main");
    assert!(bare.tip(&bare.state_ref(x)).is_some(), "a write to fold");
    server.take_labels();
    // The fold's look passes; the request after it (the lease's create) lands, its answer lost.
    let (look_go, look_here) = proxy.hold_next_before(None);
    let (push_go, push_here) = proxy.hold_next_before(None);
    let folding = {
        let (store, at) = (a.store.clone(), a.at.clone());
        tokio::spawn(async move { store.fold(&at).await })
    };
    look_here.notified().await;
    look_go.notify_one();
    push_here.notified().await;
    let (lost_go, lost_done) = proxy.lose_next_answer_held();
    push_go.notify_one();
    lost_done.notified().await;
    lost_go.notify_one();
    let report = folding.await.expect("fold task");
    let labels = server.take_labels();
    assert_eq!(
        labels.get(1).map(String::as_str),
        Some("POST receive-pack"),
        "the second request of the fold is the lease's push: {labels:?}"
    );
    let lease = bare.tip("refs/gitstate/fold");
    assert!(
        lease.is_none(),
        "the lease is left behind (fold answered {report:?}, requests {labels:?})"
    );
    let report = report.expect("the fold");
    assert!(
        !report.busy && report.writes == 1,
        "the fold gave up on its own lease: {report:?}"
    );
}

/// A write to a state's ref whose push lands but whose answer is lost is acknowledged on its
/// retry (the retry finds its commit on the ref). The background fold that follows a write to a
/// state ref (`gitstate serve`, and `gitstate run`, which waits for it before it exits: "branch
/// lag: none once gitstate run has exited") follows this write too: after `finish_folds` the
/// branch has it (before, only a push this process heard land started one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ref_write_whose_answer_was_lost_is_folded_in_the_background_too() {
    let server = GitServer::start_in(PushMode::Atomic).await;
    server.create_repo("bg");
    let proxy = gitstate_tests::faults::FaultProxy::start(server.address, 2, 0.0, vec![]).await;
    let url = proxy.url("bg");
    let a = built(&url, &[("GITSTATE_STATE_REFS", "always")]).await;
    let x = "team/bg.tfstate";
    a.client.lock(x, "h").await.expect(200);
    a.client
        .write_locked(x, "h", &state_json("l", 1))
        .await
        .expect(200);
    server.take_labels();
    // The write goes at the protocol floor (the create's push was a look under the lock): its
    // first request is its push to the state's ref, which lands, the answer lost.
    let (push_go, push_here) = proxy.hold_next_before(None);
    let v2 = state_json("l", 2);
    let writing = {
        let (client, v2) = (Client::new(&a._served.url), v2.clone());
        tokio::spawn(async move { client.write_locked(x, "h", &v2).await })
    };
    push_here.notified().await;
    let (lost_go, lost_done) = proxy.lose_next_answer_held();
    push_go.notify_one();
    lost_done.notified().await;
    lost_go.notify_one();
    let wrote = writing.await.expect("write task");
    let labels = server.take_labels();
    assert_eq!(wrote.status, 200, "{}: {labels:?}", wrote.body);
    a.client.unlock(x, "h").await.expect(200);
    let bare = Bare::new(&server.repo_dir("bg"), "main");
    assert!(
        bare.tip(&bare.state_ref(x)).is_some(),
        "the write went to the state's ref: {labels:?}"
    );
    a.store.finish_folds().await;
    assert_eq!(
        bare.file(x)
            .map(|b| String::from_utf8_lossy(&b).into_owned()),
        Some(v2),
        "the background folds are done and the branch lacks the acknowledged write ({labels:?})"
    );
}

/// A state written back to a content it had before (a `terraform state push` of the state it
/// replaced: the same serial, or another lineage, passes the stale rule), after a fold carried
/// that earlier write: the new state commit's tree is the earlier one's, object for object. A
/// fold, or a DELETE that carries the state's unfolded writes, fetches them "beyond" the branch
/// tip and the last folded state commit; a process whose cache lacks that commit (any other than
/// the one that folded it, or one started since) must still get the repeated tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_repeats_a_folded_state_is_folded_and_deleted_by_a_cold_process() {
    let state = |marker: &str| {
        format!(
            r#"{{"version":4,"terraform_version":"1.11.4","serial":1,"lineage":"l","outputs":{{"m":{{"value":"{marker}","type":"string"}}}},"resources":[]}}"#
        )
    };
    for how in ["delete", "fold"] {
        let server = GitServer::start_in(PushMode::Atomic).await;
        let url = server.create_repo("again");
        let env = [
            ("GITSTATE_STATE_REFS", "always"),
            ("GITSTATE_FOLD_AFTER_WRITES", "false"),
        ];
        let a = built(&url, &env).await;
        let x = "team/again.tfstate";
        a.client.lock(x, "h").await.expect(200);
        // The create (the branch), then the first update (the state's ref), folded.
        for marker in ["created", "first"] {
            a.client
                .write_locked(x, "h", &state(marker))
                .await
                .expect(200);
        }
        let folded = a.store.fold(&a.at).await.expect("fold");
        assert_eq!(folded.writes, 1, "{how}: {folded:?}");
        // Another content, the first one again (its state commit's tree is the folded one's), and
        // one more on top.
        for marker in ["other", "first", "last"] {
            a.client
                .write_locked(x, "h", &state(marker))
                .await
                .expect(200);
        }
        a.client.unlock(x, "h").await.expect(200);
        let bare = Bare::new(&server.repo_dir("again"), "main");
        let cold = built(&url, &env).await;
        if how == "fold" {
            let report = cold.store.fold(&cold.at).await;
            assert!(
                matches!(&report, Ok(r) if r.writes == 3 && r.refused.is_empty()),
                "a fold in another process: {report:?}"
            );
            assert_eq!(
                bare.file(x)
                    .map(|b| String::from_utf8_lossy(&b).into_owned()),
                Some(state("last")),
                "the branch after the fold"
            );
        } else {
            cold.client.lock(x, "d").await.expect(200);
            let deleted = cold.client.delete_state(x, Some("d")).await;
            cold.client.unlock(x, "d").await.expect(200);
            assert_eq!(
                deleted.status, 200,
                "a DELETE in another process: {}",
                deleted.body
            );
            assert!(bare.file(x).is_none(), "deleted");
            let log: Vec<Option<String>> =
                gitstate_tests::states::file_log(&server.repo_dir("again"), "refs/heads/main", x)
                    .into_iter()
                    .map(|(_, c)| c.map(|c| String::from_utf8_lossy(&c).into_owned()))
                    .collect();
            assert!(
                log.iter()
                    .filter(|c| c.as_deref() == Some(&state("first")))
                    .count()
                    == 2
                    && log.iter().any(|c| c.as_deref() == Some(&state("other")))
                    && log.iter().any(|c| c.as_deref() == Some(&state("last"))),
                "the DELETE carried every write onto the branch: {log:?}"
            );
        }
    }
}
