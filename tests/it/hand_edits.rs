//! A state's file changed on the branch outside gitstate (a person with the git CLI,
//! terraform-backend-git still writing the repository) while the state's own ref holds the
//! state, against the real `git http-backend`. Reads answered the ref's content, so the edit was
//! hidden: Terraform planned against a state the person had just replaced, and every later fold
//! refused the state in a log nobody reads. Now a read answers 409 naming what to do, until a
//! person settles it; an edit that leaves the state's file as gitstate left it still reads.

use gitstate_tests::handmade::Bare;
use gitstate_tests::{GitServer, PushMode, TestBackend, state_json};

use crate::races::{Built, built, by_hand};

/// What a person does on the branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Edit {
    /// Puts new content in the state's file.
    NewContent,
    /// Puts back the state's first version (a rollback with `git checkout OLD -- PATH`).
    Rollback,
    /// Removes the file in one commit and puts other content back in a later one.
    RemoveThenPutBack,
    /// Removes the file (`git rm`, or the first half of `git mv`).
    Remove,
    /// Puts in the file exactly what the state's ref holds.
    SameAsRef,
    /// Changes another file: the state's file stays as gitstate left it.
    OtherFile,
}

impl Edit {
    const ALL: [Self; 6] = [
        Self::NewContent,
        Self::Rollback,
        Self::RemoveThenPutBack,
        Self::Remove,
        Self::SameAsRef,
        Self::OtherFile,
    ];

    /// Whether the state's file ends up other than both the ref's content and what gitstate
    /// last left on the branch. A removal hides writes only when the ref holds some the branch
    /// never had (`lags`); otherwise it is a person's delete of the state, which stands.
    fn hides(self, lags: bool) -> bool {
        match self {
            Self::NewContent | Self::Rollback | Self::RemoveThenPutBack => true,
            Self::Remove => lags,
            Self::SameAsRef | Self::OtherFile => false,
        }
    }

    fn apply(self, bare: &Bare, path: &str, on_ref: &str) {
        let hand = state_json("l", 90);
        let mut commit = by_hand(path);
        commit.message = format!("{self:?} by hand\n");
        match self {
            Self::NewContent => bare.branch_write(path, Some(hand.as_bytes()), &commit),
            Self::Rollback => bare.branch_write(path, Some(state_json("l", 1).as_bytes()), &commit),
            Self::RemoveThenPutBack => {
                bare.branch_write(path, None, &commit);
                bare.branch_write(path, Some(hand.as_bytes()), &commit)
            }
            Self::Remove => bare.branch_write(path, None, &commit),
            Self::SameAsRef => bare.branch_write(path, Some(on_ref.as_bytes()), &commit),
            Self::OtherFile => bare.branch_write("README.md", Some(b"notes\n"), &commit),
        };
    }
}

/// The state every case edits.
const X: &str = "team/edit.tfstate";

/// A repository whose state [`X`] has its own ref, folded into the branch; when `lags`, one more
/// write on the ref that the branch does not have yet.
struct Site {
    _server: GitServer,
    url: String,
    a: Built,
    bare: Bare,
    state_ref: String,
    /// The state as its ref holds it.
    on_ref: String,
}

async fn site(env: &[(&str, &str)], lags: bool, case: &str) -> Site {
    let server = GitServer::start_in(PushMode::Atomic).await;
    let url = server.create_repo("edit");
    let a = built(&url, env).await;
    a.client.apply(X, "h1", &state_json("l", 1)).await;
    a.client.apply(X, "h2", &state_json("l", 2)).await;
    let report = a.store.fold(&a.at).await.expect("fold");
    assert!(report.refused.is_empty(), "{case}: {report:?}");
    let mut on_ref = state_json("l", 2);
    if lags {
        on_ref = state_json("l", 3);
        a.client.apply(X, "h3", &on_ref).await;
    }
    let bare = Bare::new(&server.repo_dir("edit"), "main");
    let state_ref = bare.state_ref(X);
    Site {
        _server: server,
        url,
        a,
        bare,
        state_ref,
        on_ref,
    }
}

/// Every edit, on a state whose ref is folded into the branch and on one whose ref is ahead of
/// the branch by an unfolded write (the branch lags). The state's GET, through the process that
/// wrote it and through a cold one, answers 409 for an edit that would be hidden and the ref's
/// content otherwise. A fold refuses such a state too (when it has writes to fold). Deleting the
/// state's ref by hand (the documented way to keep the branch's file) settles it: the branch's
/// file reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_file_changed_outside_gitstate_is_never_hidden_behind_its_ref() {
    let env = [
        ("GITSTATE_STATE_REFS", "always"),
        ("GITSTATE_FOLD_AFTER_WRITES", "false"),
    ];
    for lags in [false, true] {
        for edit in Edit::ALL {
            let case = format!("{edit:?}, the branch lagging the ref: {lags}");
            let Site {
                _server,
                url,
                a,
                bare,
                state_ref,
                on_ref,
            } = site(&env, lags, &case).await;
            let x = X;
            assert!(
                bare.tip(&state_ref).is_some(),
                "{case}: the state has its ref"
            );
            edit.apply(&bare, x, &on_ref);
            let cold = TestBackend::start(&url, &env).await;
            let cold_client = gitstate_tests::Client::new(&cold.url);
            for (who, client) in [("the writer", &a.client), ("a cold process", &cold_client)] {
                let read = client.get_state(x).await;
                if edit.hides(lags) {
                    assert_eq!(read.status, 409, "{case}, through {who}: {}", read.body);
                    assert!(
                        read.body.contains("changed outside gitstate"),
                        "{case}, through {who}: the reason says what happened: {}",
                        read.body
                    );
                } else if edit == Edit::Remove {
                    assert_eq!(read.status, 404, "{case}, through {who}: {}", read.body);
                } else {
                    assert_eq!(
                        (read.status, read.body.as_str()),
                        (200, on_ref.as_str()),
                        "{case}, through {who}"
                    );
                }
            }
            if !edit.hides(lags) {
                continue;
            }
            if lags {
                let report = a.store.fold(&a.at).await.expect("fold");
                assert_eq!(
                    report.refused,
                    vec![x.to_owned()],
                    "{case}: the fold agrees"
                );
            }
            // The person keeps the branch's file (or its absence): the ref goes.
            bare.git(&["update-ref", "-d", &state_ref], &[], b"");
            let kept = bare.file(x);
            for (who, client) in [("the writer", &a.client), ("a cold process", &cold_client)] {
                let read = client.get_state(x).await;
                match &kept {
                    Some(kept) => assert_eq!(
                        (read.status, read.body.as_bytes()),
                        (200, kept.as_slice()),
                        "{case}, through {who}: settled, the branch's file reads"
                    ),
                    None => assert_eq!(
                        read.status, 404,
                        "{case}, through {who}: settled, the state is gone: {}",
                        read.body
                    ),
                }
            }
        }
    }
}

/// Every edit, as above; then the changes a client can send: a write under a lock (through the
/// writer, after its GET, and through a cold process that did not read), a DELETE, a restore.
/// Where the edit would be hidden, each is the reads' 409, and the branch and the state's ref
/// are left as the edit left them: a write would bury the edit behind the ref exactly as a read
/// would hide it. Otherwise the write lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_to_a_state_file_changed_outside_gitstate_are_refused_and_push_nothing() {
    let env = [
        ("GITSTATE_STATE_REFS", "always"),
        ("GITSTATE_FOLD_AFTER_WRITES", "false"),
    ];
    let next = state_json("l", 100);
    for lags in [false, true] {
        for edit in Edit::ALL {
            let case = format!("{edit:?}, the branch lagging the ref: {lags}");
            let Site {
                _server,
                url,
                a,
                bare,
                state_ref,
                on_ref,
            } = site(&env, lags, &case).await;
            let x = X;
            edit.apply(&bare, x, &on_ref);
            let homes = || (bare.tip("refs/heads/main"), bare.tip(&state_ref));
            let before = homes();
            let cold = TestBackend::start(&url, &env).await;
            let cold = gitstate_tests::Client::new(&cold.url);
            let first = a.client.history(x, "").await.expect(200).history();
            let oldest = first.versions.last().expect("a version").version.clone();
            let refused = |what: &str, answer: gitstate_tests::Answer| {
                assert_eq!(answer.status, 409, "{case}: {what}: {}", answer.body);
                assert!(
                    answer.body.contains("changed outside gitstate"),
                    "{case}: {what}: the reason says what happened: {}",
                    answer.body
                );
            };
            // Through the writer: its LOCK, its GET (the look a write at the floor rests on),
            // the write.
            a.client.lock(x, "w").await.expect(200);
            let read = a.client.get_state(x).await;
            let write = a.client.write_locked(x, "w", &next).await;
            if edit == Edit::Remove && !lags {
                // A person's delete of a folded state: the write creates it again.
                assert_eq!(
                    (read.status, write.status),
                    (404, 200),
                    "{case}: {}",
                    write.body
                );
                a.client.unlock(x, "w").await.expect(200);
                continue;
            }
            if !edit.hides(lags) {
                assert_eq!(
                    (read.status, write.status),
                    (200, 200),
                    "{case}: {}",
                    write.body
                );
                a.client.unlock(x, "w").await.expect(200);
                let landed = bare.git(&["show", &format!("{state_ref}:{x}")], &[], b"");
                assert_eq!(
                    landed.trim_end(),
                    next,
                    "{case}: the write is on the state's ref"
                );
                continue;
            }
            refused("the writer's write", write);
            let delete = a.client.delete_state(x, Some("w")).await;
            refused("the writer's delete", delete);
            a.client.unlock(x, "w").await.expect(200);
            cold.lock(x, "c").await.expect(200);
            refused("a cold write", cold.write_locked(x, "c", &next).await);
            refused("a cold delete", cold.delete_state(x, Some("c")).await);
            cold.unlock(x, "c").await.expect(200);
            refused("a restore", a.client.restore(x, &oldest).await);
            assert_eq!(homes(), before, "{case}: nothing was pushed");
        }
    }
}

/// Every edit, as above, made while the writer holds the lock: after its LOCK and its GET (the
/// look its write at the floor rests on) and before its write, which therefore cannot see it.
/// The write to the state's ref does not assert the branch (every apply's push would lock it),
/// so it may land behind the edit. Whatever it answers, nothing is hidden or lost: a refused
/// write left the state's ref as it was; an acknowledged one is on the ref or the branch, and
/// every read after it, through the writer and through a cold process, answers it or the
/// edit's 409, never "no state" nor any other content. A fold then carries it or refuses the
/// state, never dropping it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_the_write_did_not_see_neither_hides_it_nor_is_hidden() {
    let env = [
        ("GITSTATE_STATE_REFS", "always"),
        ("GITSTATE_FOLD_AFTER_WRITES", "false"),
    ];
    let next = state_json("l", 100);
    for lags in [false, true] {
        for edit in Edit::ALL {
            let case = format!("{edit:?} during the lock, the branch lagging the ref: {lags}");
            let Site {
                _server,
                url,
                a,
                bare,
                state_ref,
                on_ref,
            } = site(&env, lags, &case).await;
            let x = X;
            a.client.lock(x, "w").await.expect(200);
            let read = a.client.get_state(x).await.expect(200);
            assert_eq!(read.body, on_ref, "{case}: the look before the edit");
            edit.apply(&bare, x, &on_ref);
            let ref_before = bare.tip(&state_ref);
            let write = a.client.write_locked(x, "w", &next).await;
            a.client.unlock(x, "w").await.expect(200);
            let on = |tip: Option<String>| {
                tip.map(|tip| bare.git(&["show", &format!("{tip}:{x}")], &[], b""))
            };
            if write.status != 200 {
                assert_eq!(write.status, 409, "{case}: {}", write.body);
                assert_eq!(bare.tip(&state_ref), ref_before, "{case}: refused, kept");
                continue;
            }
            let kept = on(bare.tip(&state_ref)).as_deref().map(str::trim) == Some(next.trim())
                || bare.file(x).as_deref() == Some(next.as_bytes());
            assert!(
                kept,
                "{case}: the acknowledged write is on the ref or the branch"
            );
            let cold = TestBackend::start(&url, &env).await;
            let cold_client = gitstate_tests::Client::new(&cold.url);
            for (who, client) in [("the writer", &a.client), ("a cold process", &cold_client)] {
                let read = client.get_state(x).await;
                let answered = (read.status == 200 && read.body == next)
                    || (read.status == 409 && read.body.contains("changed outside gitstate"));
                assert!(
                    answered,
                    "{case}, through {who}: the write or the edit's 409, not {} {}",
                    read.status, read.body
                );
            }
            let report = a.store.fold(&a.at).await.expect("fold");
            let folded = bare.file(x).as_deref() == Some(next.as_bytes());
            assert!(
                folded || report.refused.contains(&x.to_owned()),
                "{case}: the fold carries the write or refuses the state: {report:?}"
            );
        }
    }
}

/// A person rewinds the branch (`git push --force` of an older or a new history: undoing a bad
/// merge, recreating the branch) to a tree without the state's file, while the state's ref holds
/// a write the branch never had. The removal goes with the state index's entry, which is how
/// gitstate's own delete looks too, but the ref's writes were never carried: a read must not
/// answer "no state" (Terraform would plan every resource again) any more than after `git rm`.
/// The fold already refuses the state: the ref's writes were made on a branch file that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_rewound_past_a_lagging_state_is_never_no_state() {
    let env = [
        ("GITSTATE_STATE_REFS", "always"),
        ("GITSTATE_FOLD_AFTER_WRITES", "false"),
    ];
    let Site {
        _server,
        url,
        a,
        bare,
        state_ref,
        ..
    } = site(&env, true, "rewound").await;
    assert!(bare.tip(&state_ref).is_some(), "the state has its ref");
    let empty = bare.git(&["hash-object", "-t", "tree", "-w", "--stdin"], &[], b"");
    let commit = bare.git(
        &["commit-tree", empty.trim(), "-m", "start the branch over"],
        &[],
        b"",
    );
    bare.git(&["update-ref", "refs/heads/main", commit.trim()], &[], b"");
    let report = a.store.fold(&a.at).await.expect("fold");
    assert_eq!(report.refused, vec![X.to_owned()], "the fold refuses it");
    let cold = TestBackend::start(&url, &env).await;
    let cold = gitstate_tests::Client::new(&cold.url);
    for (who, client) in [("the writer", &a.client), ("a cold process", &cold)] {
        let read = client.get_state(X).await;
        assert_eq!(read.status, 409, "through {who}: {}", read.body);
    }
}

/// A person deletes the branch (`git push origin :main`, a rename in a host's settings) while
/// the states' refs hold them, folded or not. The repository then has nothing but gitstate's
/// refs, which is how an empty repository looks to the branch rule: reads answered "no state"
/// (Terraform would plan every resource again) and the first write started a new branch without
/// the other states. Reads and writes of every state (one with its own ref, one written once
/// and so without, and a new name) are the hand edit's 409, in the process that wrote them and
/// in a fresh one, and push nothing; so are their histories and the list of states. Deleting the states' refs too is starting over: a write
/// then starts the branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_branch_beside_its_states_refs_is_never_no_state() {
    const ONCE: &str = "team/once.tfstate";
    const NEW: &str = "team/new.tfstate";
    for lags in [false, true] {
        let env = [
            ("GITSTATE_STATE_REFS", "always"),
            ("GITSTATE_FOLD_AFTER_WRITES", "false"),
        ];
        let case = format!("deleted, lags {lags}");
        let Site {
            _server,
            url,
            a,
            bare,
            state_ref,
            ..
        } = site(&env, lags, &case).await;
        a.client.apply(ONCE, "o1", &state_json("o", 1)).await;
        assert!(
            bare.tip(&state_ref).is_some(),
            "{case}: the state has its ref"
        );
        assert!(
            bare.tip(&bare.state_ref(ONCE)).is_none(),
            "{case}: {ONCE} has none"
        );
        bare.git(&["update-ref", "-d", "refs/heads/main"], &[], b"");
        let cold = TestBackend::start(&url, &env).await;
        let cold = gitstate_tests::Client::new(&cold.url);
        let next = state_json("l", 9);
        for (who, client) in [("the writer", &a.client), ("a fresh process", &cold)] {
            for name in [X, ONCE, NEW] {
                let read = client.get_state(name).await;
                assert_eq!(
                    read.status, 409,
                    "{case}, {name} through {who}: {}",
                    read.body
                );
                client.lock(name, "w").await.expect(200);
                let write = client.write_locked(name, "w", &next).await;
                assert_eq!(
                    write.status, 409,
                    "{case}, {who}'s write of {name}: {}",
                    write.body
                );
                client.unlock(name, "w").await.expect(200);
                let history = client.history(name, "").await;
                assert_eq!(
                    history.status, 409,
                    "{case}, {who}'s history of {name}: {}",
                    history.body
                );
            }
            let list = client.send("GET", "/states", None).await;
            assert_eq!(list.status, 409, "{case}, {who}'s list: {}", list.body);
        }
        assert_eq!(
            bare.tip("refs/heads/main"),
            None,
            "{case}: no branch was started"
        );
        assert!(bare.tip(&state_ref).is_some(), "{case}: the ref is kept");
        bare.git(&["update-ref", "-d", &state_ref], &[], b"");
        a.client.get_state(NEW).await.expect(404);
        a.client.apply(NEW, "n1", &state_json("n", 1)).await;
        assert!(
            bare.tip("refs/heads/main").is_some(),
            "{case}: started over"
        );
        let list = a.client.send("GET", "/states", None).await;
        assert_eq!(
            list.status, 200,
            "{case}: the list after starting over: {}",
            list.body
        );
    }
}

/// The branch renamed on the host (`master` to `main`, or deleted) while a long-running process
/// that saw it still serves it, with no states' refs to tell (the local default `auto` keeps
/// none after a plain write; a host without them). Reads in that process answered "no state"
/// and its next write started the old name anew, holding one state beside the renamed branch.
/// Now that process answers the deleted branch's 409 to reads and writes and pushes nothing,
/// as a fresh process refuses the missing branch (400): both name no state as absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_branch_is_never_no_state_in_a_process_that_saw_it() {
    gitstate_tests::init_tracing();
    // The branch moved to another branch, or only a tag of it kept: either way the
    // repository is no empty one, to a fresh process's branch rule as to this one.
    for (mode, kept) in [
        ("auto", "refs/heads/trunk"),
        ("never", "refs/heads/trunk"),
        ("auto", "refs/tags/last"),
    ] {
        let server = GitServer::start().await;
        let url = server.create_repo("renamed");
        let bare = Bare::new(&server.repo_dir("renamed"), "main");
        let env = [("GITSTATE_STATE_REFS", mode)];
        let warm = TestBackend::start(&url, &env).await;
        let warm = gitstate_tests::Client::new(&warm.url);
        warm.apply(X, "a", &state_json("x", 1)).await;
        let tip = bare.tip("refs/heads/main").expect("the branch");
        bare.git(&["update-ref", kept, &tip], &[], b"");
        bare.git(&["update-ref", "-d", "refs/heads/main"], &[], b"");
        let cold = TestBackend::start(&url, &env).await;
        let cold = gitstate_tests::Client::new(&cold.url);
        for name in [X, "team/new.tfstate"] {
            let read = warm.get_state(name).await;
            assert_eq!(
                read.status, 409,
                "{mode}, {kept}: {name}, warm: {}",
                read.body
            );
            let read = cold.get_state(name).await;
            assert_eq!(
                read.status, 400,
                "{mode}, {kept}: {name}, fresh: {}",
                read.body
            );
            warm.lock(name, "w").await.expect(200);
            let write = warm.write_locked(name, "w", &state_json("x", 2)).await;
            assert_eq!(write.status, 409, "{mode}: {name}, warm: {}", write.body);
            warm.unlock(name, "w").await.expect(200);
        }
        assert_eq!(
            bare.tip("refs/heads/main"),
            None,
            "{mode}: no branch was started"
        );
        assert_eq!(bare.tip(kept), Some(tip), "{mode}: {kept} untouched");
    }
}
