//! Adversarial tests of issue 27's state refs (the write path's review): each names the review
//! finding it shows (F1 to F15, listed in issue 27's closing notes) and asserts what the design
//! promises, so it fails while the finding is open.

use gitstate_tests::handmade::{Bare, Stamp, StateWrite};
use rand::{Rng, SeedableRng};

/// `gitstate fold` against `url`, as an operator runs it, with a cache and HOME under `work`.
/// `gitstate fold`, again while a serve process's background fold holds the lease (it folds
/// what waits: the next look finds the rest, if any).
fn gitstate_fold(url: &str, work: &std::path::Path) -> (bool, String) {
    let mut answer = fold_once(url, work);
    for _ in 0..40 {
        if answer.0 || !answer.1.contains("another fold holds the lease") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
        answer = fold_once(url, work);
    }
    answer
}

fn fold_once(url: &str, work: &std::path::Path) -> (bool, String) {
    let out = crate::breakglass::gitstate_fold(url, work);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

fn stamp(who: &str, at: i64) -> Stamp {
    Stamp {
        name: who.to_owned(),
        email: format!("{who}@example.invalid"),
        date: format!("{at} +0000"),
    }
}

fn write(path: &str, content: &str, at: i64) -> StateWrite {
    StateWrite {
        path: path.to_owned(),
        content: content.as_bytes().to_vec(),
        author: stamp("ann", at),
        committer: stamp("gitstate", at),
        message: format!("write {path}\n"),
    }
}

/// F8: a state ref whose tip is not an unfolded state commit of its own path (generated: at a
/// branch commit, at another state's commit, at an orphan, moved back behind the fold record)
/// never makes a fold spin until it runs out of rounds: the good state's write is folded, and
/// neither that fold nor the next ends in "the branch kept moving".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_ref_that_is_not_an_unfolded_state_commit_never_makes_folds_spin() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5b1f);
    for kind in 0..4 {
        let server = gitstate_tests::GitServer::start().await;
        let url = server.create_repo("spin");
        let bare = Bare::new(&server.repo_dir("spin"), "main");
        let (good, bad) = ("good/app.tfstate", "bad/app.tfstate");
        let t = 1_700_000_000 + rng.random_range(0..1000);
        bare.branch_write(good, Some(b"{\"serial\":1}\n"), &write(good, "", t));
        bare.branch_write(bad, Some(b"{\"serial\":1}\n"), &write(bad, "", t + 1));
        let work = tempfile::tempdir().expect("tempdir");
        let bad_ref = bare.state_ref(bad);
        let what = match kind {
            0 => {
                let tip = bare.tip("main").expect("branch");
                bare.git(&["update-ref", &bad_ref, &tip], &[], b"");
                "a branch commit"
            }
            1 => {
                let other = bare.state_write(&write("other.tfstate", "{\"o\":1}\n", t + 2));
                bare.git(&["update-ref", &bad_ref, &other], &[], b"");
                "another path's state commit"
            }
            2 => {
                let tree = bare.git(&["mktree"], &[], b"");
                let orphan = bare.git(&["commit-tree", &tree, "-m", "orphan"], &[], b"");
                bare.git(&["update-ref", &bad_ref, &orphan], &[], b"");
                "an orphan commit"
            }
            _ => {
                let first = bare.state_write(&write(bad, "{\"serial\":2}\n", t + 3));
                bare.state_write(&write(bad, "{\"serial\":3}\n", t + 4));
                let (ok, said) = gitstate_fold(&url, work.path());
                assert!(ok, "the first fold: {said}");
                bare.git(&["update-ref", &bad_ref, &first], &[], b"");
                "a state commit behind the fold record"
            }
        };
        bare.state_write(&write(good, "{\"serial\":9}\n", t + 10));
        for run in 0..2 {
            let (_, said) = gitstate_fold(&url, work.path());
            assert!(
                !said.contains("kept moving") && !said.contains("out of rounds"),
                "kind {kind} ({what}), fold {run}: the fold spun: {said}"
            );
        }
        assert_eq!(
            bare.file(good).as_deref(),
            Some(&b"{\"serial\":9}\n"[..]),
            "kind {kind} ({what}): the good state was folded"
        );
    }
}

/// A `pre-receive` hook in a bare repository that, once armed, holds the first push that takes
/// a state away (removes the armed path from `main`, or deletes any state ref) until the test
/// resumes it (at most 8 s: the backends' git timeout is 10 s). receive-pack checks each
/// command's old id only after this hook, so whatever lands meanwhile is what the held push must
/// be judged against: the window between a backend's decision and its push, made wide.
struct Hold {
    dir: std::path::PathBuf,
}

const HOOK: &str = r#"#!/bin/sh
Z=0000000000000000000000000000000000000000
hold=0
while read old new ref; do
  case "$ref" in
    refs/gitstate/states/*)
      if [ "$new" = "$Z" ] && [ -e "$GIT_DIR/refuse-ref-deletes" ]; then
        echo "state ref deletes refused by the test" >&2; exit 1
      fi ;;
  esac
  [ -e "$GIT_DIR/armed" ] || continue
  P=$(cat "$GIT_DIR/armed")
  case "$ref" in
    refs/gitstate/states/*) [ "$new" = "$Z" ] && hold=1 ;;
    refs/heads/main)
      if [ "$old" != "$Z" ] && git cat-file -e "$old:$P" 2>/dev/null && ! git cat-file -e "$new:$P" 2>/dev/null; then hold=1; fi ;;
  esac
done
if [ $hold = 1 ] && mv "$GIT_DIR/armed" "$GIT_DIR/holding" 2>/dev/null; then
  i=0
  while [ ! -e "$GIT_DIR/resume" ] && [ $i -lt 160 ]; do sleep 0.05; i=$((i+1)); done
  rm -f "$GIT_DIR/resume" "$GIT_DIR/holding"
fi
exit 0
"#;

impl Hold {
    fn install(dir: &std::path::Path) -> Self {
        let hook = dir.join("hooks/pre-receive");
        std::fs::create_dir_all(dir.join("hooks")).expect("hooks dir");
        std::fs::write(&hook, HOOK).expect("hook");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        Self {
            dir: dir.to_owned(),
        }
    }

    /// Hold the next push that takes `path` away.
    fn arm(&self, path: &str) {
        std::fs::write(self.dir.join("armed"), path).expect("arm");
    }

    /// Wait until a push is held; `false` if none came within `secs`.
    async fn held(&self, secs: u64) -> bool {
        for _ in 0..secs * 20 {
            if self.dir.join("holding").exists() {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        false
    }

    /// Refuse (the whole push) any push that deletes a state ref, or stop refusing.
    fn refuse_ref_deletes(&self, refuse: bool) {
        let flag = self.dir.join("refuse-ref-deletes");
        if refuse {
            std::fs::write(flag, "").expect("flag");
        } else {
            let _ = std::fs::remove_file(flag);
        }
    }

    fn resume(&self) {
        std::fs::write(self.dir.join("resume"), "").expect("resume");
    }
}

/// Take the fold lease by hand (a fresh one: every fold is busy until [`let_folds_go`]), so
/// that no background fold of a `serve` moves the branch: the Lambda shape, where folds run on
/// a schedule.
fn hold_folds(bare: &Bare) {
    let tree = bare.git(&["mktree"], &[], b"");
    let lease = bare.git(
        &["commit-tree", &tree, "-m", "fold lease held by a test"],
        &[],
        b"",
    );
    bare.git(&["update-ref", "refs/gitstate/fold", &lease], &[], b"");
}

fn let_folds_go(bare: &Bare) {
    bare.git(&["update-ref", "-d", "refs/gitstate/fold"], &[], b"");
}

/// Every content `path` had on `main` (oldest first, `None` for a removal), with the content
/// its state ref holds now if the branch has the file.
fn contents_ever(bare: &Bare, path: &str) -> (Vec<Option<String>>, Option<String>) {
    let log = bare.log(path);
    let contents = log
        .iter()
        .map(|entry| {
            let out = std::process::Command::new("git")
                .arg("--git-dir")
                .arg(&bare.dir)
                .args(["cat-file", "blob", &format!("{}:{path}", entry.id)])
                .output()
                .expect("git");
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        })
        .collect();
    let newest = gitstate_tests::states::newest_stored(&bare.dir, "main", path)
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    (contents, newest)
}

/// F5: a DELETE decided under a lock that is force-unlocked before its push lands, while the
/// next holder writes the state through another process. On a host without atomic push the
/// lock is checked as of the advertisement, but a late DELETE must never take an acknowledged
/// write of the next holder with it: the next holder's write is either the state's newest
/// content, or in the branch's history before the removal (after a fold). With atomic push the
/// late DELETE must not land at all. Both push modes, `always` and `auto`, and a state whose
/// ref exists already on a host without atomic push (made before the repository moved there,
/// or by hand: `seeded`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_delete_never_takes_the_next_holders_write_with_it() {
    use gitstate_tests::process::{ServeProcess, serve_env};
    use gitstate_tests::{Client, GitServer, PushMode, state_json};
    for (push, refs, seeded) in [
        (PushMode::NoAtomic, "always", false),
        (PushMode::NoAtomic, "always", true),
        (PushMode::Atomic, "always", false),
        (PushMode::NoAtomic, "auto", false),
        (PushMode::NoAtomic, "auto", true),
    ] {
        let server = GitServer::start_in(push).await;
        let url = server.create_repo("late");
        let dir = server.repo_dir("late");
        let hold = Hold::install(&dir);
        let bare = Bare::new(&dir, "main");
        hold_folds(&bare);
        let root = tempfile::tempdir().expect("tempdir");
        let mut procs = Vec::new();
        for i in 0..3 {
            let d = root.path().join(format!("p{i}"));
            std::fs::create_dir_all(&d).expect("dir");
            let env = serve_env(&url, &[("GITSTATE_STATE_REFS", refs)]);
            procs.push(ServeProcess::start(std::path::Path::new(crate::GITSTATE), &d, env).await);
        }
        let (p, q, r) = (
            Client::new(&procs[0].url),
            Client::new(&procs[1].url),
            Client::new(&procs[2].url),
        );
        let x = "team/late.tfstate";
        p.lock(x, "h1").await.expect(200);
        p.write_locked(x, "h1", &state_json("l", 1))
            .await
            .expect(200);
        if seeded {
            // The state's ref, as a gitstate write on a host with atomic push made it.
            let mut second = write(x, &state_json("l", 2), 1_700_000_100);
            second.message = "write team/late.tfstate (serial 2)\n\nSerial: 2\n".into();
            bare.state_write(&second);
        } else {
            p.write_locked(x, "h1", &state_json("l", 2))
                .await
                .expect(200);
        }
        hold.arm(x);
        let deleting = tokio::spawn(async move {
            let answer = p.delete_state(x, Some("h1")).await;
            (p, answer)
        });
        let held = hold.held(5).await;
        assert!(
            held,
            "{push:?}/{refs}/{seeded}: the DELETE pushed nothing that takes the state away"
        );
        q.force_unlock(x).await.expect(200);
        q.lock(x, "h2").await.expect(200);
        let read = q.get_state(x).await.expect(200);
        assert_eq!(
            gitstate_tests::serial_of(&read.body),
            2,
            "{push:?}/{refs}/{seeded}"
        );
        let v3 = state_json("l", 3);
        let wrote = q.write_locked(x, "h2", &v3).await;
        hold.resume();
        let (_, deleted) = deleting.await.expect("delete task");
        let_folds_go(&bare);
        let work = tempfile::tempdir().expect("tempdir");
        let _ = gitstate_fold(&url, work.path());
        let (contents, newest) = contents_ever(&bare, x);
        let after = r.get_state(x).await;
        eprintln!(
            "{push:?}/{refs}: write {} {}, delete {} {}, now {} {}, branch had {contents:?}",
            wrote.status, wrote.body, deleted.status, deleted.body, after.status, after.body
        );
        if wrote.status == 200 {
            let kept = newest.as_deref() == Some(v3.as_str())
                || contents.iter().any(|c| c.as_deref() == Some(v3.as_str()));
            assert!(
                kept,
                "{push:?}/{refs}/{seeded}: the next holder's acknowledged write is gone: DELETE answered \
                 {} {}, the state now reads {} {}, the branch had {contents:?}",
                deleted.status, deleted.body, after.status, after.body
            );
            if push == PushMode::Atomic {
                assert_ne!(
                    deleted.status, 200,
                    "{push:?}/{refs}: a DELETE under a broken lock landed"
                );
            }
        }
    }
}

/// A git server with the repository `repo` (pushing as `push` says) and `count` serve processes
/// on it, each with `env`: the server, the repository's URL, the processes' folder (kept while
/// they run) and the processes.
async fn site(
    push: gitstate_tests::PushMode,
    repo: &str,
    count: usize,
    env: &[(&str, &str)],
) -> (
    gitstate_tests::GitServer,
    String,
    tempfile::TempDir,
    Vec<gitstate_tests::process::ServeProcess>,
) {
    let server = gitstate_tests::GitServer::start_in(push).await;
    let url = server.create_repo(repo);
    let root = tempfile::tempdir().expect("tempdir");
    let procs = processes(&url, root.path(), count, env).await;
    (server, url, root, procs)
}

/// Serve processes on `url`, each with `env` on top of the test defaults.
async fn processes(
    url: &str,
    root: &std::path::Path,
    count: usize,
    env: &[(&str, &str)],
) -> Vec<gitstate_tests::process::ServeProcess> {
    use gitstate_tests::process::{ServeProcess, serve_env};
    let mut procs = Vec::new();
    for i in 0..count {
        let d = root.join(format!("p{i}"));
        std::fs::create_dir_all(&d).expect("dir");
        procs.push(
            ServeProcess::start(
                std::path::Path::new(crate::GITSTATE),
                &d,
                serve_env(url, env),
            )
            .await,
        );
    }
    procs
}

/// (serial, deleted) of each revision the history API lists, oldest first.
async fn history_of(client: &gitstate_tests::Client, name: &str) -> Vec<(Option<u64>, bool)> {
    let page = client
        .history(name, "per_page=100")
        .await
        .expect(200)
        .history();
    page.versions
        .iter()
        .rev()
        .map(|v| (v.serial, v.deleted))
        .collect()
}

/// F2: processes whose cache still holds the state as it was before it was deleted and created
/// again elsewhere (the Lambda shape: containers stay warm) write it after a LOCK. Such a write
/// is judged against the state as it is now (a serial below the current one is refused, 409),
/// and an accepted one keeps every revision in the history and folds onto the branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_process_never_judges_or_bases_a_write_on_a_state_deleted_since() {
    use gitstate_tests::{Client, state_json};
    for refs in ["always", "auto"] {
        let (server, url, _root, procs) = site(
            gitstate_tests::PushMode::Atomic,
            "warm",
            3,
            &[("GITSTATE_STATE_REFS", refs)],
        )
        .await;
        let clients: Vec<Client> = procs.iter().map(|p| Client::new(&p.url)).collect();
        let (q1, q2, r) = (&clients[0], &clients[1], &clients[2]);
        let x = "team/warm.tfstate";
        // Both stale processes see the state at serial 5 (and write it twice: a state ref may
        // exist by then).
        q1.lock(x, "h0").await.expect(200);
        q1.get_state(x).await.expect(404);
        q1.write_locked(x, "h0", &state_json("l", 4))
            .await
            .expect(200);
        q1.write_locked(x, "h0", &state_json("l", 5))
            .await
            .expect(200);
        q1.unlock(x, "h0").await.expect(200);
        assert_eq!(
            gitstate_tests::serial_of(&q2.get_state(x).await.expect(200).body),
            5
        );
        // Elsewhere: deleted, created again at serial 10 (same lineage).
        r.lock(x, "h1").await.expect(200);
        r.delete_state(x, Some("h1")).await.expect(200);
        r.unlock(x, "h1").await.expect(200);
        r.lock(x, "h2").await.expect(200);
        r.write_locked(x, "h2", &state_json("l", 10))
            .await
            .expect(200);
        r.unlock(x, "h2").await.expect(200);
        // A stale serial through a warm process: refused against serial 10.
        q1.lock(x, "h3").await.expect(200);
        let stale = q1.write_locked(x, "h3", &state_json("l", 7)).await;
        q1.unlock(x, "h3").await.expect(200);
        assert_eq!(
            stale.status, 409,
            "{refs}: a write of serial 7 judged against the state before its delete: {}",
            stale.body
        );
        // A newer serial through the other warm process: accepted, and nothing is lost.
        q2.lock(x, "h4").await.expect(200);
        q2.write_locked(x, "h4", &state_json("l", 11))
            .await
            .expect(200);
        q2.unlock(x, "h4").await.expect(200);
        assert_eq!(
            gitstate_tests::serial_of(&r.get_state(x).await.expect(200).body),
            11
        );
        let want = vec![
            (Some(4), false),
            (Some(5), false),
            (None, true),
            (Some(10), false),
            (Some(11), false),
        ];
        assert_eq!(history_of(r, x).await, want, "{refs}: the history API");
        let work = tempfile::tempdir().expect("tempdir");
        let (folded, said) = gitstate_fold(&url, work.path());
        assert!(folded, "{refs}: the fold: {said}");
        let bare = Bare::new(&server.repo_dir("warm"), "main");
        let (contents, _) = contents_ever(&bare, x);
        let serials: Vec<Option<u64>> = contents
            .iter()
            .map(|c| c.as_deref().map(gitstate_tests::serial_of))
            .collect();
        assert_eq!(
            serials,
            vec![Some(4), Some(5), None, Some(10), Some(11)],
            "{refs}: git log of the branch after the fold"
        );
    }
}

/// F6: a state ref left over by a delete (the branch lacks the file: by hand, `git rm` as a
/// break-glass delete; or a DELETE on a host without atomic push whose ref delete failed) is
/// never where a later acknowledged write goes: a CREATE through a process that still caches
/// the state, locked or not, reads back through every other process, and the left-over content
/// never comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_after_a_delete_that_left_its_state_ref_reads_back() {
    use gitstate_tests::{Client, PushMode, state_json};
    for (how, push) in [
        ("git rm by hand", PushMode::Atomic),
        ("git rm by hand", PushMode::NoAtomic),
        ("a DELETE whose ref delete failed", PushMode::NoAtomic),
    ] {
        for locked in [true, false] {
            let env = [
                ("GITSTATE_STATE_REFS", "always"),
                ("GITSTATE_ALLOW_UNLOCKED_WRITES", "true"),
            ];
            let (server, _url, _root, procs) = site(push, "left", 3, &env).await;
            let dir = server.repo_dir("left");
            let hook = Hold::install(&dir);
            let c: Vec<Client> = procs.iter().map(|p| Client::new(&p.url)).collect();
            let x = "team/left.tfstate";
            let case = format!("{how}, {push:?}, locked {locked}");
            // Every process knows the state and its ref.
            c[0].lock(x, "h0").await.expect(200);
            c[0].write_locked(x, "h0", &state_json("old", 1))
                .await
                .expect(200);
            c[0].write_locked(x, "h0", &state_json("old", 2))
                .await
                .expect(200);
            c[0].unlock(x, "h0").await.expect(200);
            for client in &c {
                client.get_state(x).await.expect(200);
            }
            let bare = Bare::new(&dir, "main");
            if how.starts_with("git rm") {
                bare.branch_write(x, None, &write(x, "", 1_700_000_000));
            } else {
                hook.refuse_ref_deletes(true);
                c[2].lock(x, "h1").await.expect(200);
                let _ = c[2].delete_state(x, Some("h1")).await;
                let _ = c[2].unlock(x, "h1").await;
                hook.refuse_ref_deletes(false);
            }
            if bare.file(x).is_some() {
                // The DELETE did not land at all: nothing left over to attack.
                continue;
            }
            let fresh = state_json("new", 1);
            let wrote = if locked {
                c[0].lock(x, "h2").await.expect(200);
                let wrote = c[0].write_locked(x, "h2", &fresh).await;
                c[0].unlock(x, "h2").await.expect(200);
                wrote
            } else {
                c[0].write(x, &fresh).await
            };
            assert_eq!(wrote.status, 200, "{case}: {}", wrote.body);
            for (i, client) in c.iter().enumerate() {
                let read = client.get_state(x).await;
                assert_eq!(
                    (read.status, read.body.as_str()),
                    (200, fresh.as_str()),
                    "{case}: the acknowledged create, read through process {i}"
                );
            }
        }
    }
}

/// F13 (looks since the LOCK): in the Lambda shape one lock holder's requests reach any
/// process, so what a process looked at after its own LOCK is out of date as soon as the same
/// holder writes through another process. Here P takes the lock and reads (its look: no state
/// ref), the holder's write goes through Q (`always`: the state's ref is created), and the
/// holder's DELETE goes through P. The delete must carry that write onto the branch: after the
/// state is created again, the history API and `git log` of the folded branch list every
/// acknowledged write once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_through_the_locking_process_carries_a_write_made_through_another() {
    use gitstate_tests::{Client, state_json};
    let (server, url, _root, procs) = site(
        gitstate_tests::PushMode::Atomic,
        "carry",
        3,
        &[("GITSTATE_STATE_REFS", "always")],
    )
    .await;
    let c: Vec<Client> = procs.iter().map(|p| Client::new(&p.url)).collect();
    let (p, q, r) = (&c[0], &c[1], &c[2]);
    // Warm P (capabilities, tip): its next LOCK and writes go at the floor.
    let warm = "warm/p.tfstate";
    p.lock(warm, "w").await.expect(200);
    p.write_locked(warm, "w", &state_json("w", 1))
        .await
        .expect(200);
    p.unlock(warm, "w").await.expect(200);
    let x = "team/carry.tfstate";
    r.lock(x, "h0").await.expect(200);
    r.write_locked(x, "h0", &state_json("l", 1))
        .await
        .expect(200);
    r.unlock(x, "h0").await.expect(200);
    p.get_state(x).await.expect(200);
    // One holder: LOCK and GET through P, a write through Q, the DELETE through P.
    p.lock(x, "h").await.expect(200);
    assert_eq!(
        gitstate_tests::serial_of(&p.get_state(x).await.expect(200).body),
        1
    );
    q.write_locked(x, "h", &state_json("l", 2))
        .await
        .expect(200);
    p.delete_state(x, Some("h")).await.expect(200);
    p.unlock(x, "h").await.expect(200);
    r.get_state(x).await.expect(404);
    r.lock(x, "h2").await.expect(200);
    r.write_locked(x, "h2", &state_json("m", 1))
        .await
        .expect(200);
    r.unlock(x, "h2").await.expect(200);
    let want = vec![
        (Some(1), false),
        (Some(2), false),
        (None, true),
        (Some(1), false),
    ];
    let history = history_of(r, x).await;
    let work = tempfile::tempdir().expect("tempdir");
    let (folded, said) = gitstate_fold(&url, work.path());
    let bare = Bare::new(&server.repo_dir("carry"), "main");
    let (contents, _) = contents_ever(&bare, x);
    let serials: Vec<Option<u64>> = contents
        .iter()
        .map(|c| c.as_deref().map(gitstate_tests::serial_of))
        .collect();
    assert_eq!(
        history, want,
        "the history API (the write through Q is serial 2)"
    );
    assert!(folded, "the fold: {said}");
    assert_eq!(
        serials,
        vec![Some(1), Some(2), None, Some(1)],
        "git log of the branch after the fold"
    );
}

/// F2 (same holder): P takes the lock and reads serial 1; the same holder deletes the state and
/// creates it again at serial 10 through R; then writes serial 7 through P. Judged against the
/// state as it is (serial 10, same lineage) that write is stale: 409, nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_through_the_locking_process_is_judged_against_a_create_made_through_another() {
    use gitstate_tests::{Client, state_json};
    for refs in ["always", "auto"] {
        let (_server, url, _root, procs) = site(
            gitstate_tests::PushMode::Atomic,
            "judge",
            2,
            &[("GITSTATE_STATE_REFS", refs)],
        )
        .await;
        let c: Vec<Client> = procs.iter().map(|p| Client::new(&p.url)).collect();
        let (p, r) = (&c[0], &c[1]);
        let warm = "warm/p.tfstate";
        p.lock(warm, "w").await.expect(200);
        p.write_locked(warm, "w", &state_json("w", 1))
            .await
            .expect(200);
        p.unlock(warm, "w").await.expect(200);
        let x = "team/judge.tfstate";
        r.lock(x, "h0").await.expect(200);
        r.write_locked(x, "h0", &state_json("l", 1))
            .await
            .expect(200);
        r.unlock(x, "h0").await.expect(200);
        p.lock(x, "h").await.expect(200);
        assert_eq!(
            gitstate_tests::serial_of(&p.get_state(x).await.expect(200).body),
            1
        );
        r.delete_state(x, Some("h")).await.expect(200);
        r.write_locked(x, "h", &state_json("l", 10))
            .await
            .expect(200);
        let stale = p.write_locked(x, "h", &state_json("l", 7)).await;
        let now = r.get_state(x).await.expect(200);
        assert_eq!(
            (stale.status, gitstate_tests::serial_of(&now.body)),
            (409, 10),
            "{refs}: a write of serial 7 after the state was created again at serial 10: {}",
            stale.body
        );
        p.unlock(x, "h").await.expect(200);
        let work = tempfile::tempdir().expect("tempdir");
        let (folded, said) = gitstate_fold(&url, work.path());
        assert!(folded, "{refs}: the fold: {said}");
    }
}

/// F1: a process with a single front (`gitstate run`) answers the GET after its LOCK from what
/// the LOCK push proved. When its knowledge that the state has no ref is older than the LOCK
/// (here: a listing from its previous apply), another backend's write to the state's new ref in
/// between must not be hidden: the GET answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_front_lock_never_proves_a_state_without_a_ref_from_an_old_listing() {
    use gitstate_tests::{Client, GitServer, state_json};
    let server = GitServer::start().await;
    let url = server.create_repo("proof");
    let root = tempfile::tempdir().expect("tempdir");
    let single = processes(
        &url,
        &root.path().join("single"),
        1,
        &[
            ("GITSTATE_SINGLE_FRONT", "true"),
            ("GITSTATE_STATE_REFS", "always"),
        ],
    )
    .await;
    let other = processes(
        &url,
        &root.path().join("other"),
        1,
        &[("GITSTATE_STATE_REFS", "always")],
    )
    .await;
    let (b, a) = (Client::new(&single[0].url), Client::new(&other[0].url));
    hold_folds(&Bare::new(&server.repo_dir("proof"), "main"));
    let x = "team/proof.tfstate";
    // B's first apply: creates the state, two writes (it may get a ref of its own), unlock.
    b.lock(x, "b1").await.expect(200);
    b.get_state(x).await.expect(404);
    b.write_locked(x, "b1", &state_json("l", 1))
        .await
        .expect(200);
    b.unlock(x, "b1").await.expect(200);
    // A deletes and creates it again: no ref; B's last listing still says no ref.
    a.lock(x, "a0").await.expect(200);
    a.delete_state(x, Some("a0")).await.expect(200);
    a.write_locked(x, "a0", &state_json("l", 2))
        .await
        .expect(200);
    a.unlock(x, "a0").await.expect(200);
    b.lock(x, "b2").await.expect(200);
    assert_eq!(
        gitstate_tests::serial_of(&b.get_state(x).await.expect(200).body),
        2
    );
    b.unlock(x, "b2").await.expect(200);
    // A's apply writes the state to its (new) ref; the branch does not move.
    a.lock(x, "a1").await.expect(200);
    a.get_state(x).await.expect(200);
    a.write_locked(x, "a1", &state_json("l", 3))
        .await
        .expect(200);
    a.unlock(x, "a1").await.expect(200);
    // B's next apply: its LOCK goes at the floor; the GET after it must answer serial 3.
    b.lock(x, "b3").await.expect(200);
    let read = b.get_state(x).await.expect(200);
    b.unlock(x, "b3").await.expect(200);
    assert_eq!(
        gitstate_tests::serial_of(&read.body),
        3,
        "the GET after a single-front LOCK answered the branch, not the state's ref: {}",
        read.body
    );
}

/// F10: a version id the history API listed stays listed, readable (`?at=`) and restorable
/// after the state is deleted and created again (the console keeps such ids; on a branch alone
/// they are commits of the branch's history for ever). The delete replays the ref's writes onto
/// the branch under new commits; each is listed under the state commit it replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_version_id_stays_readable_after_a_delete() {
    use gitstate_tests::{Client, state_json};
    let (_server, _url, _root, procs) = site(
        gitstate_tests::PushMode::Atomic,
        "ids",
        2,
        &[("GITSTATE_STATE_REFS", "always")],
    )
    .await;
    let (p, r) = (Client::new(&procs[0].url), Client::new(&procs[1].url));
    let x = "team/ids.tfstate";
    p.lock(x, "h").await.expect(200);
    for serial in 1..=3 {
        p.write_locked(x, "h", &state_json("l", serial))
            .await
            .expect(200);
    }
    let listed = p.history(x, "").await.expect(200).history();
    p.delete_state(x, Some("h")).await.expect(200);
    p.write_locked(x, "h", &state_json("m", 1))
        .await
        .expect(200);
    p.unlock(x, "h").await.expect(200);
    for version in &listed.versions {
        let at = r.history(x, &format!("at={}", version.version)).await;
        let serial = (at.status == 200)
            .then(|| version.serial.map(|_| gitstate_tests::serial_of(&at.body)))
            .flatten();
        assert_eq!(
            (at.status, serial),
            (200, version.serial),
            "?at={} (serial {:?}) after the delete: {}",
            version.version,
            version.serial,
            at.body
        );
    }
    // The history after the delete lists each of them under the same id (a person copying an
    // id from the console before the delete finds it after), and a restore of one lands.
    let now = r.history(x, "").await.expect(200).history();
    for version in &listed.versions {
        assert!(
            now.versions.iter().any(|v| v.version == version.version),
            "{} (serial {:?}) is no longer listed: {:?}",
            version.version,
            version.serial,
            now.versions
                .iter()
                .map(|v| (&v.version, v.serial))
                .collect::<Vec<_>>()
        );
    }
    let second = listed
        .versions
        .iter()
        .find(|v| v.serial == Some(2))
        .expect("serial 2 listed");
    r.restore(x, &second.version).await.expect(200);
    let restored = p.get_state(x).await.expect(200);
    let restored: serde_json::Value = serde_json::from_str(&restored.body).expect("a state");
    // A restore is a new write of that content, numbered above the stored serial.
    assert_eq!(
        (restored["lineage"].as_str(), restored["serial"].as_u64()),
        (Some("l"), Some(3)),
        "the restore of {} (serial 2 of the deleted state, over serial 1 of the new one)",
        second.version
    );
}

/// F7: one state name on two branches of one repository (`?ref=`, `GITSTATE_ALLOWED_REFS`).
/// Writes of it through one branch, to its own ref, never change what the other branch reads,
/// lists or folds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_ref_belongs_to_its_branch() {
    use gitstate_tests::{Client, state_json};
    let env = [
        ("GITSTATE_STATE_REFS", "always"),
        ("GITSTATE_ALLOWED_REFS", "staging"),
    ];
    let (server, url, _root, procs) = site(gitstate_tests::PushMode::Atomic, "two", 2, &env).await;
    let (p, r) = (Client::new(&procs[0].url), Client::new(&procs[1].url));
    let x = "team/two.tfstate";
    write_on(&p, x, "main", "m1", state_json("main", 1)).await;
    // Started as the docs say (a copy of main would be refused).
    Bare::new(&server.repo_dir("two"), "staging").start_branch();
    write_on(&p, x, "staging", "s1", state_json("staging", 1)).await;
    write_on(&p, x, "staging", "s2", state_json("staging", 2)).await;
    write_on(&p, x, "staging", "s3", state_json("staging", 3)).await;
    for client in [&p, &r] {
        let main = client
            .send("GET", &format!("/states/{x}?ref=main"), None)
            .await;
        assert_eq!(
            (main.status, main.body.as_str()),
            (200, state_json("main", 1).as_str()),
            "main's state after writes through staging"
        );
        let staging = client
            .send("GET", &format!("/states/{x}?ref=staging"), None)
            .await;
        assert_eq!(staging.body, state_json("staging", 3), "staging's state");
    }
    let work = tempfile::tempdir().expect("tempdir");
    let (folded, said) = gitstate_fold(&url, work.path());
    assert!(folded, "folding main: {said}");
    let bare = Bare::new(&server.repo_dir("two"), "main");
    assert_eq!(
        bare.file(x).as_deref(),
        Some(state_json("main", 1).as_bytes()),
        "main's file after folding main"
    );
}

/// LOCK, write and UNLOCK `name` on `branch` (`?ref=`).
async fn write_on(
    client: &gitstate_tests::Client,
    name: &str,
    branch: &str,
    id: &str,
    state: String,
) {
    let lock = gitstate_tests::lock_info(id);
    let locks = format!("/locks/{name}?ref={branch}");
    client.send("POST", &locks, Some(&lock)).await.expect(200);
    client
        .send(
            "POST",
            &format!("/states/{name}?ref={branch}&ID={id}"),
            Some(&state),
        )
        .await
        .expect(200);
    client.send("DELETE", &locks, Some(&lock)).await.expect(200);
}

/// F15: a DELETE of a state whose ref cannot be carried (its file on the branch was written
/// outside gitstate, so a fold refuses it too) is a person's decision: a 409 that says so, not a
/// retried "remote refused" 5xx; and writes of other states that share its group-commit rounds
/// in the same process still land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_that_cannot_carry_its_writes_is_refused_alone() {
    use gitstate_tests::{Client, state_json};
    let env = [
        ("GITSTATE_STATE_REFS", "always"),
        ("GITSTATE_ALLOW_UNLOCKED_WRITES", "true"),
    ];
    let (server, _url, _root, procs) =
        site(gitstate_tests::PushMode::Atomic, "stuck", 1, &env).await;
    let dir = server.repo_dir("stuck");
    let bare = Bare::new(&dir, "main");
    hold_folds(&bare);
    let p = Client::new(&procs[0].url);
    let (x, others) = (
        "team/stuck.tfstate",
        ["team/a.tfstate", "team/b.tfstate", "team/c.tfstate"],
    );
    p.lock(x, "h").await.expect(200);
    p.write_locked(x, "h", &state_json("l", 1))
        .await
        .expect(200);
    p.write_locked(x, "h", &state_json("l", 2))
        .await
        .expect(200);
    assert!(
        bare.tip(&bare.state_ref(x)).is_some(),
        "the state has a ref"
    );
    // Someone writes the branch's file by hand.
    bare.branch_write(
        x,
        Some(state_json("hand", 9).as_bytes()),
        &write(x, "", 1_700_000_000),
    );
    for other in others {
        p.write(other, &state_json("o", 1)).await.expect(200);
    }
    let p = std::sync::Arc::new(p);
    let deleting = {
        let p = p.clone();
        tokio::spawn(async move { p.delete_state(x, Some("h")).await })
    };
    let mut writes = Vec::new();
    for (i, other) in others.into_iter().enumerate() {
        let p = p.clone();
        writes.push(tokio::spawn(async move {
            p.write(other, &state_json("o", 2 + i as u64)).await
        }));
    }
    let deleted = deleting.await.expect("delete");
    for (other, write) in others.iter().zip(writes) {
        let answer = write.await.expect("write");
        assert_eq!(
            answer.status, 200,
            "{other} beside the stuck delete: {}",
            answer.body
        );
    }
    assert_eq!(
        deleted.status, 409,
        "a DELETE whose writes cannot be carried: {}",
        deleted.body
    );
    let_folds_go(&bare);
}

/// Group commit (one `serve`, writes that wait together leave in one push) with deletes that
/// carry their states' unfolded writes: generated batches of DELETEs and writes of other
/// states at once; after a fold each deleted state's `git log` is every acknowledged write once,
/// then the removal, and every other state's is every write once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_batched_in_one_push_each_carry_their_own_writes() {
    use gitstate_tests::{Client, state_json};
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xba7c);
    for round in 0..3 {
        let (server, url, _root, procs) = site(
            gitstate_tests::PushMode::Atomic,
            "batch",
            1,
            &[("GITSTATE_STATE_REFS", "always")],
        )
        .await;
        let dir = server.repo_dir("batch");
        let bare = Bare::new(&dir, "main");
        hold_folds(&bare);
        let p = std::sync::Arc::new(Client::new(&procs[0].url));
        let names: Vec<String> = (0..rng.random_range(3..7))
            .map(|i| format!("batch/s{i}.tfstate"))
            .collect();
        let mut writes = std::collections::BTreeMap::new();
        for (i, name) in names.iter().enumerate() {
            let id = format!("h{i}");
            p.lock(name, &id).await.expect(200);
            let count = rng.random_range(1..4u64);
            for serial in 1..=count {
                p.write_locked(name, &id, &state_json("l", serial))
                    .await
                    .expect(200);
            }
            writes.insert(name.clone(), count);
        }
        // Half the states are deleted, the others written, all at once.
        let mut tasks = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let (p, name, id) = (p.clone(), name.clone(), format!("h{i}"));
            let delete = i % 2 == 0;
            let next = writes[&name] + 1;
            tasks.push(tokio::spawn(async move {
                let answer = if delete {
                    p.delete_state(&name, Some(&id)).await
                } else {
                    p.write_locked(&name, &id, &state_json("l", next)).await
                };
                (name, delete, answer)
            }));
        }
        let mut deleted = std::collections::BTreeSet::new();
        for task in tasks {
            let (name, delete, answer) = task.await.expect("task");
            assert_eq!(answer.status, 200, "round {round}: {name}: {}", answer.body);
            if delete {
                deleted.insert(name);
            } else {
                *writes.get_mut(&name).expect("name") += 1;
            }
        }
        let_folds_go(&bare);
        let work = tempfile::tempdir().expect("tempdir");
        let (folded, said) = gitstate_fold(&url, work.path());
        assert!(folded, "round {round}: fold: {said}");
        for name in &names {
            let (contents, _) = contents_ever(&bare, name);
            let serials: Vec<Option<u64>> = contents
                .iter()
                .map(|c| c.as_deref().map(gitstate_tests::serial_of))
                .collect();
            let mut want: Vec<Option<u64>> = (1..=writes[name]).map(Some).collect();
            if deleted.contains(name) {
                want.push(None);
            }
            assert_eq!(serials, want, "round {round}: git log of {name}");
        }
    }
}

/// The list (`GET /states`, what the console shows) through another process answers each
/// state's newest serial while its writes sit unfolded on its ref (the branch's index is
/// behind), after a delete that carried them, and after the state is created again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_answers_the_newest_serial_of_unfolded_states() {
    use gitstate_tests::{Client, state_json};
    let (server, _url, _root, procs) = site(
        gitstate_tests::PushMode::Atomic,
        "list",
        2,
        &[("GITSTATE_STATE_REFS", "always")],
    )
    .await;
    let bare = Bare::new(&server.repo_dir("list"), "main");
    hold_folds(&bare);
    let (p, q) = (Client::new(&procs[0].url), Client::new(&procs[1].url));
    let (x, y) = ("list/x.tfstate", "list/y.tfstate");
    let serial_listed = |listed: &serde_json::Value, name: &str| {
        listed
            .as_array()
            .expect("a list")
            .iter()
            .find(|entry| entry["state"] == name)
            .map(|entry| entry["serial"].as_u64())
    };
    p.lock(x, "h").await.expect(200);
    p.lock(y, "k").await.expect(200);
    for serial in 1..=4 {
        p.write_locked(x, "h", &state_json("x", serial))
            .await
            .expect(200);
        p.write_locked(y, "k", &state_json("y", serial * 10))
            .await
            .expect(200);
        // Q listed a moment ago (F18): its advertisement from then, younger than a second,
        // must not answer this list, which began after the writes.
        let listed = q.send("GET", "/states", None).await.expect(200).json();
        assert_eq!(
            (serial_listed(&listed, x), serial_listed(&listed, y)),
            (Some(Some(serial)), Some(Some(serial * 10))),
            "after write {serial}: {listed}"
        );
    }
    p.delete_state(x, Some("h")).await.expect(200);
    let listed = q.send("GET", "/states", None).await.expect(200).json();
    // Still locked: listed for its lock, with no state.
    assert_eq!(
        serial_listed(&listed, x).flatten(),
        None,
        "after the delete: {listed}"
    );
    assert_eq!(
        serial_listed(&listed, y),
        Some(Some(40)),
        "after the delete: {listed}"
    );
    p.write_locked(x, "h", &state_json("x2", 7))
        .await
        .expect(200);
    p.write_locked(x, "h", &state_json("x2", 8))
        .await
        .expect(200);
    let listed = q.send("GET", "/states", None).await.expect(200).json();
    assert_eq!(
        serial_listed(&listed, x),
        Some(Some(8)),
        "created again: {listed}"
    );
    let_folds_go(&bare);
}

/// F19 (a create at the floor under `always`): a create may rest on a look under the lock that
/// saw no state ref only on the very branch tip that look saw. Here P takes the lock and reads
/// (no state, no ref); through Q the same holder creates the state and updates it (its ref is
/// made); a person removes the file by hand (`git rm`, the ref stays behind); P then learns the
/// new branch tip from a read of another state, while its look at this one still says "no
/// ref". P's create must not land on the branch beside the left-over ref: while the ref holds
/// the write the removal dropped, the create is refused (the hand edit's 409); once a person
/// deletes the ref, it lands and every process reads it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_at_the_floor_never_lands_beside_a_ref_left_since_its_look() {
    use gitstate_tests::{Client, state_json};
    let env = [
        ("GITSTATE_STATE_REFS", "always"),
        ("GITSTATE_FOLD_AFTER_WRITES", "false"),
    ];
    let (server, _url, _root, procs) =
        site(gitstate_tests::PushMode::Atomic, "beside", 2, &env).await;
    let dir = server.repo_dir("beside");
    let bare = Bare::new(&dir, "main");
    hold_folds(&bare);
    let (p, q) = (Client::new(&procs[0].url), Client::new(&procs[1].url));
    let (x, y) = ("team/beside.tfstate", "team/other.tfstate");
    // Another state, through which P learns a branch tip without looking at x again.
    q.lock(y, "y").await.expect(200);
    q.write_locked(y, "y", &state_json("y", 1))
        .await
        .expect(200);
    q.unlock(y, "y").await.expect(200);
    p.lock(x, "h").await.expect(200);
    p.get_state(x).await.expect(404);
    for serial in 1..=2 {
        q.write_locked(x, "h", &state_json("l", serial))
            .await
            .expect(200);
    }
    let reference = gitstate_tests::states::state_ref("main", x);
    assert!(
        gitstate_tests::states::ref_tip(&dir, &reference).is_some(),
        "the update made the state's ref"
    );
    bare.branch_write(x, None, &write(x, "", 1_700_000_000));
    assert!(bare.file(x).is_none(), "the file is gone by hand");
    p.get_state(y).await.expect(200);
    let fresh = state_json("l", 3);
    // The removal dropped a write the branch never had (serial 2, on the ref): like any edit made
    // outside gitstate on an older view, it is refused until a person settles it, and the create
    // lands nowhere.
    let tips = || (bare.tip("refs/heads/main"), bare.tip(&reference));
    let before = tips();
    let refused = p.write_locked(x, "h", &fresh).await;
    assert_eq!(refused.status, 409, "the create: {}", refused.body);
    assert_eq!(tips(), before, "the refused create pushed nothing");
    // The person settles for the removal: the ref goes. The create lands, and reads back.
    bare.git(&["update-ref", "-d", &reference], &[], b"");
    let wrote = p.write_locked(x, "h", &fresh).await;
    p.unlock(x, "h").await.expect(200);
    assert_eq!(wrote.status, 200, "the create: {}", wrote.body);
    for (i, client) in [p, q].iter().enumerate() {
        let read = client.get_state(x).await;
        assert_eq!(
            (read.status, read.body.as_str()),
            (200, fresh.as_str()),
            "the acknowledged create, read through process {i}"
        );
    }
}

/// F12: a state's own ref moved by hand to a commit without the state's file, while the branch
/// has the file. Neither "no state" (404: Terraform would plan against an empty state) nor the
/// branch's older file is the answer: every read, write, delete and history of that state fails
/// loudly (500, the backend's log naming the ref) and changes nothing, in a warm process and in
/// a cold one, until a person mends the ref.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_ref_without_the_state_s_file_never_reads_as_no_state() {
    use gitstate_tests::{Client, state_json};
    let env = [("GITSTATE_STATE_REFS", "always")];
    let (server, url, root, procs) = site(gitstate_tests::PushMode::Atomic, "bad", 1, &env).await;
    let warm = Client::new(&procs[0].url);
    let x = "team/bad.tfstate";
    let bare = Bare::new(&server.repo_dir("bad"), "main");
    // The branch keeps serial 1: no background fold replays the ref's write onto it.
    hold_folds(&bare);
    for serial in 1..=2 {
        write_on(
            &warm,
            x,
            "main",
            &format!("w{serial}"),
            state_json("bad", serial),
        )
        .await;
    }
    let name = bare.state_ref(x);
    let good = bare
        .tip(&name)
        .expect("the second write made the state's ref");
    // A commit whose tree has another file only.
    let blob = bare.git(&["hash-object", "-w", "--stdin"], &[], b"not a state\n");
    let tree = bare.git(
        &["mktree"],
        &[],
        format!("100644 blob {}\tother.txt\n", blob.trim()).as_bytes(),
    );
    let wrong = bare.git(&["commit-tree", tree.trim(), "-m", "by hand"], &[], b"");
    bare.git(&["update-ref", &name, wrong.trim(), &good], &[], b"");
    let cold = processes(&url, &root.path().join("cold"), 1, &env).await;
    let cold_client = Client::new(&cold[0].url);
    for (who, client, log) in [
        ("warm", &warm, &procs[0].log),
        ("cold", &cold_client, &cold[0].log),
    ] {
        let got = client.get_state(x).await;
        assert_eq!(
            got.status, 500,
            "{who}: GET of a state whose ref lacks its file: {}",
            got.body
        );
        let logged = std::fs::read_to_string(log).expect("the log");
        assert!(
            logged.contains(&format!(
                "the state ref {name} (commit {}) has no file",
                wrong.trim()
            )),
            "{who}: the log does not name the ref: {logged}"
        );
        let id = format!("{who}-lock");
        assert_eq!(client.lock(x, &id).await.status, 200, "{who}: LOCK");
        let wrote = client.write_locked(x, &id, &state_json("bad", 3)).await;
        assert_eq!(
            wrote.status, 500,
            "{who}: a write over a state whose ref lacks its file: {} {}",
            wrote.status, wrote.body
        );
        let deleted = client.delete_state(x, Some(&id)).await;
        assert_eq!(
            deleted.status, 500,
            "{who}: a DELETE of a state whose ref lacks its file: {}",
            deleted.body
        );
        assert_eq!(client.unlock(x, &id).await.status, 200, "{who}: UNLOCK");
        let history = client.history(x, "per_page=100").await;
        assert_eq!(
            history.status, 500,
            "{who}: the history of a state whose ref lacks its file: {}",
            history.body
        );
        assert_eq!(
            bare.tip(&name).as_deref(),
            Some(wrong.trim()),
            "{who}: the ref is as the person left it"
        );
    }
    assert_eq!(
        bare.file(x).as_deref(),
        Some(state_json("bad", 1).as_bytes()),
        "the branch's file is untouched"
    );
    // Mended by hand, the state reads as its newest write again.
    bare.git(&["update-ref", &name, &good, wrong.trim()], &[], b"");
    assert_eq!(cold_client.get_state(x).await.body, state_json("bad", 2));
}

/// F9: gitstate versions from before states had refs of their own would read the branch and
/// write behind a state's ref. A backend that may write states to their own refs
/// (`GITSTATE_STATE_REFS=always` on a host that pushes atomically) records the fence with its
/// first LOCK of the repository: those versions read it as another deployment's lock ref prefix
/// and refuse to lock and to start (the protocol's unit test shows how such a version reads
/// it). It is added beside a prefix recorded before it came; backends that never make state refs
/// (`auto`, or no atomic push) do not record it; and this version locks as before either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_that_write_states_to_refs_fence_off_versions_that_do_not_read_them() {
    use gitstate_core::protocol::{STATE_REFS_FENCE, lock_prefix_record};
    use gitstate_tests::{Client, PushMode};
    let record = lock_prefix_record("refs/heads/locks/");
    for (push, refs, fenced) in [
        (PushMode::Atomic, "always", true),
        (PushMode::Atomic, "auto", false),
        (PushMode::NoAtomic, "always", false),
    ] {
        let what = format!("{push:?}, {refs}");
        let env = [("GITSTATE_STATE_REFS", refs)];
        let (server, url, root, procs) = site(push, "fence", 1, &[]).await;
        let bare = Bare::new(&server.repo_dir("fence"), "main");
        // A backend that never makes state refs (as versions before the fence) locked first.
        let before = Client::new(&procs[0].url);
        before.lock("a.tfstate", "first").await.expect(200);
        before.unlock("a.tfstate", "first").await.expect(200);
        assert!(
            bare.tip(&record).is_some(),
            "{what}: the prefix is recorded"
        );
        assert_eq!(bare.tip(STATE_REFS_FENCE), None, "{what}: no fence yet");
        let now = processes(&url, &root.path().join("now"), 1, &env).await;
        let client = Client::new(&now[0].url);
        for round in 0..2 {
            let id = format!("now-{round}");
            client.lock("a.tfstate", &id).await.expect(200);
            client.unlock("a.tfstate", &id).await.expect(200);
        }
        assert_eq!(
            bare.tip(STATE_REFS_FENCE).is_some(),
            fenced,
            "{what}: the fence after a LOCK"
        );
        if fenced {
            let why = bare.git(
                &["show", &format!("{STATE_REFS_FENCE}:protocol.json")],
                &[],
                b"",
            );
            assert!(why.contains("refs/gitstate/states/"), "{what}: {why}");
        }
        // Backends of this version lock as before beside the fence, whatever their setting.
        before.lock("a.tfstate", "after").await.expect(200);
        before.unlock("a.tfstate", "after").await.expect(200);
    }
}
