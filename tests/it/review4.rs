//! Review 4 of the git store's write side: each test shows one suspected bug against the real
//! `git http-backend`, and fails while it stands.

use gitstate_tests::handmade::{Bare, Stamp, StateWrite};
use gitstate_tests::{Client, GitServer, PushMode, TestBackend, state_json};

/// A commit by a person with the git CLI (break-glass).
fn by_hand(path: &str) -> StateWrite {
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
/// documented break-glass delete), and the holder writes. The write is acknowledged (200), so it
/// must read back: a write that comes after a delete creates the state again, as the same write
/// does from a fresh advertisement (the ref's write sees the branch lacks the file and goes to
/// the branch, removing the ref left over). At the protocol floor the write is pushed to the
/// state's ref alone (`T -> S`, the branch not asserted), behind a branch that lacks the file:
/// the acknowledged write reads as "no state" (404), and Terraform's next plan starts empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ref_write_at_the_floor_after_a_break_glass_delete_reads_back() {
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
            assert_eq!(
                (read.status, read.body.as_str()),
                (200, v3.as_str()),
                "{refs}: the acknowledged write, read through {who} (branch file: {:?}, state \
                 ref: {:?})",
                bare.file(x)
                    .map(|b| String::from_utf8_lossy(&b).into_owned()),
                bare.tip(&bare.state_ref(x)),
            );
        }
    }
}
