//! Every variant of every store error: its text, the store's decisions on it, and the
//! [`StoreError`] it becomes (so the status the HTTP layer answers). Each row names the variant
//! of the crate-wide error it was before each operation had its own (`was`), whose text and
//! `StoreError` it keeps: a reviewer compares the two tables.

use std::collections::BTreeSet;

use gitstate_core::ports::StoreError;

use super::{
    Broken, FoldError, HistoryError, ListError, LockError, OpenError, ReadError, RemoteError,
    UnlockError, WriteError,
};
use crate::protocol::{AdvertError, FetchError, PushError};
use crate::repository::{self, Corruption};
use crate::transport;

/// The kind of [`StoreError`] a failure becomes, with what it carries that the client sees.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    /// 503
    Unavailable,
    /// 502
    Remote,
    /// 500, the reason shown.
    Incompatible(String),
    /// 409, retryable.
    Contention(u32),
    /// 409, naming both settings.
    ProtocolMismatch,
    /// 500, what is unreadable shown.
    Corrupt(String),
    /// 500
    Internal,
    /// 409, a person settles it.
    Diverged,
    /// 400, naming both branches.
    Copied(String, String),
}

fn kind(error: &StoreError) -> Kind {
    match error {
        StoreError::Unavailable(_) => Kind::Unavailable,
        StoreError::Remote(_) => Kind::Remote,
        StoreError::Incompatible(why) => Kind::Incompatible(why.clone()),
        StoreError::Contention { attempts } => Kind::Contention(*attempts),
        StoreError::ProtocolMismatch { .. } => Kind::ProtocolMismatch,
        StoreError::Corrupt(what) => Kind::Corrupt(what.clone()),
        StoreError::Internal(_) => Kind::Internal,
        StoreError::Diverged => Kind::Diverged,
        StoreError::Copied { branch, of } => Kind::Copied(branch.clone(), of.clone()),
    }
}

/// One lower failure: how to make it, the crate-wide variant it was, its text, its kind,
/// whether the remote refused (so transient), whether it is garbled, whether transient.
struct Lower {
    make: fn() -> RemoteError,
    was: &'static str,
    text: &'static str,
    kind: Kind,
    refused: bool,
    garbled: bool,
    transient: bool,
}

fn status(status: u16) -> transport::Error {
    transport::Error::Status {
        status,
        what: "push",
    }
}

fn repo(error: repository::Error) -> RemoteError {
    RemoteError::Repository(error)
}

fn joined() -> tokio::task::JoinError {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let task = tokio::spawn(std::future::pending::<()>());
        task.abort();
        task.await.expect_err("aborted")
    })
}

/// One of each lower failure (each variant of [`RemoteError`] and of [`repository::Error`];
/// the wire's own are in `transport`'s tests).
fn lower() -> Vec<Lower> {
    let row = |make, was, text, kind, (refused, garbled, transient)| Lower {
        make,
        was,
        text,
        kind,
        refused,
        garbled,
        transient,
    };
    let no = (false, false, false);
    vec![
        row(|| status(503).into(), "Wire", "git remote answered HTTP 503 to the push", Kind::Unavailable, (false, false, true)),
        row(|| status(403).into(), "Wire", "git remote answered HTTP 403 to the push", Kind::Remote, no),
        row(
            || transport::Error::SshStart(std::io::Error::other("no ssh")).into(),
            "Wire",
            "configuration: cannot start ssh (GIT_SSH_COMMAND, GIT_SSH or ssh): no ssh",
            Kind::Internal,
            no,
        ),
        row(
            || transport::ConnectError::NoCertificate.into(),
            "Connect",
            "configuration: GITSTATE_GIT_CA_FILE/GITSTATE_GIT_CA_PEM: no certificate in the PEM text",
            Kind::Internal,
            no,
        ),
        row(|| AdvertError::MalformedLine.into(), "Advert", "git protocol error: malformed ref line", Kind::Remote, (false, true, false)),
        row(|| AdvertError::Wire(status(502)).into(), "Advert", "git remote answered HTTP 502 to the push", Kind::Unavailable, (false, false, true)),
        row(|| FetchError::Refused("not our ref".into()).into(), "Fetch", "git remote reports: not our ref", Kind::Remote, (true, false, true)),
        row(|| FetchError::NoPack.into(), "Fetch", "git protocol error: the fetch response has no pack", Kind::Remote, (false, true, false)),
        row(|| PushError::Unpack("disk full".into()).into(), "Push", "git remote reports: the remote could not unpack: disk full", Kind::Remote, (true, false, true)),
        row(
            || PushError::NoAtomic.into(),
            "Push",
            "git protocol error: several ref updates in one push need atomic, which the remote does not offer",
            Kind::Remote,
            (false, true, false),
        ),
        row(
            || RemoteError::AtomicRequired,
            "AtomicRequired",
            "the git remote does not offer atomic push and GITSTATE_REQUIRE_ATOMIC=true refuses such remotes",
            Kind::Incompatible("the git remote does not offer atomic push and GITSTATE_REQUIRE_ATOMIC=true refuses such remotes".into()),
            no,
        ),
        row(|| RemoteError::Undelivered("commits"), "Undelivered", "git remote reports: the fetch did not deliver the requested commits", Kind::Remote, (true, false, true)),
        row(|| RemoteError::Undelivered("blobs"), "Undelivered", "git remote reports: the fetch did not deliver the requested blobs", Kind::Remote, (true, false, true)),
        row(|| RemoteError::EditedOutside("a/b.tfstate".into()), "EditedOutside", "a/b.tfstate: the branch's file was written outside gitstate while the state's ref holds it", Kind::Diverged, (false, false, false)),
        row(|| RemoteError::BranchLost("refs/heads/main".into()), "BranchLost", "refs/heads/main is gone while its states' refs remain: it was deleted outside gitstate", Kind::Diverged, (false, false, false)),
        row(|| RemoteError::BranchCopied { branch: "refs/heads/staging".into(), of: "refs/heads/prod".into() }, "BranchCopied", "refs/heads/staging and refs/heads/prod keep the same states (one is a copy of the other): a plan on either would act on the other's resources", Kind::Copied("staging".into(), "prod".into()), (false, false, false)),
        row(
            || repo(repository::Error::Git(gix::Error::from_error(std::io::Error::other("odb")))),
            "Git",
            "local git repository",
            Kind::Internal,
            no,
        ),
        row(
            || repo(repository::Error::Pack(gix::Error::from_error(std::io::Error::other("bad")))),
            "Pack",
            "received pack is invalid",
            Kind::Remote,
            no,
        ),
        row(
            || Corruption::Walk("gone".into()).into(),
            "Corrupt",
            "cache is corrupt: walking the history: gone",
            Kind::Corrupt("walking the history: gone".into()),
            no,
        ),
        row(
            || Corruption::FoldRecord("eof".into()).into(),
            "Corrupt",
            "cache is corrupt: .gitstate/folded.json on the branch cannot be read (eof): restore it from the branch's history, then fold again",
            Kind::Corrupt(".gitstate/folded.json on the branch cannot be read (eof): restore it from the branch's history, then fold again".into()),
            no,
        ),
        row(|| repo(repository::Error::RefName("refs/x..y".into())), "RefName", "git protocol error: invalid ref name refs/x..y", Kind::Remote, (false, true, false)),
        row(|| repo(repository::Error::TooManyObjects), "TooManyObjects", "git protocol error: too many objects for one pack", Kind::Remote, (false, true, false)),
        row(|| repo(std::io::Error::other("disk").into()), "Io", "disk", Kind::Internal, no),
        row(|| repo(joined().into()), "Join", "background task failed", Kind::Internal, no),
    ]
}

/// The name of a lower failure's variant, down to the repository's: every one must have a row.
fn lower_variant(error: &RemoteError) -> &'static str {
    match error {
        RemoteError::Wire(_) => "Wire",
        RemoteError::Connect(_) => "Connect",
        RemoteError::Advert(_) => "Advert",
        RemoteError::Fetch(_) => "Fetch",
        RemoteError::Push(_) => "Push",
        RemoteError::AtomicRequired => "AtomicRequired",
        RemoteError::Undelivered(_) => "Undelivered",
        RemoteError::EditedOutside(_) => "EditedOutside",
        RemoteError::BranchLost(_) => "BranchLost",
        RemoteError::BranchCopied { .. } => "BranchCopied",
        RemoteError::Repository(error) => match error {
            repository::Error::Git(_) => "Git",
            repository::Error::Pack(_) => "Pack",
            repository::Error::Corrupt(_) => "Corrupt",
            repository::Error::RefName(_) => "RefName",
            repository::Error::TooManyObjects => "TooManyObjects",
            repository::Error::Io(_) => "Io",
            repository::Error::Join(_) => "Join",
        },
    }
}

/// Each lower failure keeps the text, the decisions and the kind it had as a variant of the
/// crate-wide error, alone, shared by the writes of one round (each caller's the same kind and
/// text as the failure alone, as the echo it replaces gave), and as the source of every
/// operation's error (which wraps it transparently).
#[test]
fn every_lower_failure_keeps_its_text_decisions_and_kind() {
    let mut seen = BTreeSet::new();
    for row in lower() {
        let error = (row.make)();
        let what = row.text;
        seen.insert(lower_variant(&error));
        assert_eq!(lower_variant(&error), row.was, "{what}");
        assert_eq!(error.to_string(), row.text);
        assert_eq!(error.refused(), row.refused, "{what}");
        assert_eq!(error.garbled(), row.garbled, "{what}");
        assert_eq!(error.is_transient(), row.transient, "{what}");
        assert_eq!(kind(&StoreError::from((row.make)())), row.kind, "{what}");
        let shared = WriteError::from((row.make)());
        let WriteError::Remote(failure) = &shared else {
            unreachable!("a lower failure is the write's Remote")
        };
        let failure = gitstate_core::report::chain(&**failure);
        for caller in [shared.clone(), shared] {
            assert_eq!(caller.to_string(), row.text, "{what}: shared");
            assert_eq!(caller.refused(), row.refused, "{what}: shared");
            let store_error = StoreError::from(caller);
            assert_eq!(kind(&store_error), row.kind, "{what}: shared");
            // The whole failure is the source, as the first caller's is (the echo's text).
            let expected = match &row.kind {
                Kind::Incompatible(_) | Kind::Corrupt(_) | Kind::Diverged | Kind::Copied(..) => {
                    store_error.to_string()
                }
                _ => format!("{store_error}: {failure}"),
            };
            assert_eq!(chain(&store_error), expected, "{what}: shared");
        }
        let wrapped: [(String, StoreError); 7] = [
            wrap(ReadError::Remote((row.make)())),
            wrap(ListError::Remote((row.make)())),
            wrap(LockError::Remote((row.make)())),
            wrap(UnlockError::Remote((row.make)())),
            wrap(HistoryError::Remote((row.make)())),
            wrap(WriteError::from((row.make)())),
            wrap(FoldError::Remote((row.make)())),
        ];
        for (text, store_error) in wrapped {
            assert_eq!(text, row.text);
            assert_eq!(kind(&store_error), row.kind, "{what}");
        }
    }
    let every = [
        "Wire",
        "Connect",
        "Advert",
        "Fetch",
        "Push",
        "AtomicRequired",
        "Undelivered",
        "EditedOutside",
        "BranchLost",
        "BranchCopied",
        "Git",
        "Pack",
        "Corrupt",
        "RefName",
        "TooManyObjects",
        "Io",
        "Join",
    ];
    assert_eq!(seen, every.into_iter().collect());
    // The status and the wire's failure are read through any exchange's error, never text.
    let statuses: [(RemoteError, Option<u16>); 5] = [
        (status(503).into(), Some(503)),
        (AdvertError::Wire(status(429)).into(), Some(429)),
        (FetchError::Wire(status(404)).into(), Some(404)),
        (PushError::Wire(status(500)).into(), Some(500)),
        (RemoteError::Undelivered("commits"), None),
    ];
    for (error, code) in statuses {
        assert_eq!(error.status(), code, "{error}");
        assert_eq!(error.wire().is_some(), code.is_some(), "{error}");
    }
}

fn chain(error: &StoreError) -> String {
    gitstate_core::report::chain(error)
}

fn wrap<E: std::error::Error + Into<StoreError>>(error: E) -> (String, StoreError) {
    (error.to_string(), error.into())
}

/// Each operation's own variants (those that are not its lower failure): the text and the kind
/// each had, as a variant of the crate-wide error or as the `StoreError` the operation made
/// itself.
#[test]
fn every_operations_own_variant_keeps_its_text_and_kind() {
    let mismatch = || LockError::ProtocolMismatch {
        setting: "GITSTATE_LOCK_REF_PREFIX",
        ours: "refs/heads/locks/".into(),
        recorded: "refs/locks/".into(),
    };
    let refused = || LockError::Refused {
        lock_ref: "refs/heads/locks/a".into(),
        report: "r".into(),
    };
    // (error, was, text, kind, refused)
    let cases: Vec<(String, StoreError, &str, &str, Kind)> = vec![
        own(
            refused(),
            "LockRefused",
            "git remote reports: the remote kept refusing to create refs/heads/locks/a (r)",
            Kind::Remote,
        ),
        own(
            LockError::Contention { attempts: 10 },
            "StoreError::Contention",
            "the branch kept moving after 10 attempts",
            Kind::Contention(10),
        ),
        own(
            mismatch(),
            "StoreError::ProtocolMismatch",
            "this backend's GITSTATE_LOCK_REF_PREFIX is \"refs/heads/locks/\", but the repository records \"refs/locks/\"",
            Kind::ProtocolMismatch,
        ),
        own(
            HistoryError::Broken(Broken::MissingParent),
            "Corrupt(MissingParent)",
            "cache is corrupt: history has a missing parent commit",
            Kind::Corrupt("history has a missing parent commit".into()),
        ),
        own(
            HistoryError::Broken(Broken::BoundaryMoved),
            "Corrupt(BoundaryMoved)",
            "cache is corrupt: history boundary moved",
            Kind::Corrupt("history boundary moved".into()),
        ),
        own(
            WriteError::Declined("hook".into()),
            "Declined",
            "git remote reports: the remote refused the push on an unchanged branch: hook",
            Kind::Remote,
        ),
        own(
            WriteError::Contention { attempts: 40 },
            "StoreError::Contention",
            "the branch kept moving after 40 attempts",
            Kind::Contention(40),
        ),
        own(
            WriteError::Unanswered,
            "StoreError::Internal",
            "the write task ended unanswered",
            Kind::Internal,
        ),
        own(
            WriteError::Misrouted,
            "StoreError::Internal",
            "a write without a lock went to a state ref",
            Kind::Internal,
        ),
        own(
            FoldError::Contention { attempts: 12 },
            "StoreError::Contention",
            "the branch kept moving after 12 attempts",
            Kind::Contention(12),
        ),
    ];
    for (text, store_error, was, expect, expect_kind) in cases {
        assert_eq!(text, expect, "{was}");
        assert_eq!(kind(&store_error), expect_kind, "{was}");
    }
    // The protocol mismatch reaches the client as the core's error, with the same settings.
    let StoreError::ProtocolMismatch {
        setting,
        ours,
        recorded,
    } = StoreError::from(mismatch())
    else {
        unreachable!("checked above")
    };
    assert_eq!(
        (setting, ours.as_str(), recorded.as_str()),
        (
            "GITSTATE_LOCK_REF_PREFIX",
            "refs/heads/locks/",
            "refs/locks/"
        )
    );
    // The write's own answers reach the client as the core's did, source and all.
    assert_eq!(
        chain(&WriteError::Contention { attempts: 40 }.into()),
        chain(&StoreError::Contention { attempts: 40 })
    );
    assert_eq!(
        chain(&WriteError::Unanswered.into()),
        chain(&StoreError::Internal(
            "the write task ended unanswered".into()
        ))
    );
    // The refusals are the remote's, and a fresh look may get past them.
    assert!(refused().refused() && WriteError::Declined("hook".into()).refused());
    assert!(!LockError::Contention { attempts: 1 }.refused() && !mismatch().refused());
    assert!(!WriteError::Contention { attempts: 1 }.refused() && !WriteError::Unanswered.refused());
}

fn own<E: std::error::Error + Into<StoreError>>(
    error: E,
    was: &'static str,
    text: &'static str,
    kind: Kind,
) -> (String, StoreError, &'static str, &'static str, Kind) {
    let (shown, store_error) = wrap(error);
    (shown, store_error, was, text, kind)
}

/// Every operation's variants, by name: a variant added without a row above fails to compile
/// here (each match is exhaustive), and one without a case fails the test.
#[test]
fn every_operation_variant_has_a_case() {
    fn names(list: &[&'static str]) -> BTreeSet<&'static str> {
        list.iter().copied().collect()
    }
    let lock = |e: &LockError| match e {
        LockError::Remote(_) => "Remote",
        LockError::Refused { .. } => "Refused",
        LockError::Contention { .. } => "Contention",
        LockError::ProtocolMismatch { .. } => "ProtocolMismatch",
    };
    let history = |e: &HistoryError| match e {
        HistoryError::Remote(_) => "Remote",
        HistoryError::Broken(_) => "Broken",
    };
    let write = |e: &WriteError| match e {
        WriteError::Remote(_) => "Remote",
        WriteError::Declined(_) => "Declined",
        WriteError::Contention { .. } => "Contention",
        WriteError::Unanswered => "Unanswered",
        WriteError::Misrouted => "Misrouted",
    };
    let fold = |e: &FoldError| match e {
        FoldError::Remote(_) => "Remote",
        FoldError::Contention { .. } => "Contention",
    };
    let single = |read: &ReadError, list: &ListError, unlock: &UnlockError| {
        let (ReadError::Remote(_), ListError::Remote(_), UnlockError::Remote(_)) =
            (read, list, unlock);
    };
    let lower = || RemoteError::Undelivered("commits");
    single(&lower().into(), &lower().into(), &lower().into());
    let locks = [
        LockError::Remote(lower()),
        LockError::Refused {
            lock_ref: String::new(),
            report: String::new(),
        },
        LockError::Contention { attempts: 1 },
        LockError::ProtocolMismatch {
            setting: "",
            ours: String::new(),
            recorded: String::new(),
        },
    ];
    assert_eq!(
        locks.iter().map(lock).collect::<BTreeSet<_>>(),
        names(&["Remote", "Refused", "Contention", "ProtocolMismatch"])
    );
    let histories = [
        HistoryError::Remote(lower()),
        HistoryError::Broken(Broken::MissingParent),
    ];
    assert_eq!(
        histories.iter().map(history).collect::<BTreeSet<_>>(),
        names(&["Remote", "Broken"])
    );
    let writes = [
        WriteError::from(lower()),
        WriteError::Declined(String::new()),
        WriteError::Contention { attempts: 1 },
        WriteError::Unanswered,
        WriteError::Misrouted,
    ];
    assert_eq!(
        writes.iter().map(write).collect::<BTreeSet<_>>(),
        names(&[
            "Remote",
            "Declined",
            "Contention",
            "Unanswered",
            "Misrouted"
        ])
    );
    let folds = [
        FoldError::Remote(lower()),
        FoldError::Contention { attempts: 1 },
    ];
    assert_eq!(
        folds.iter().map(fold).collect::<BTreeSet<_>>(),
        names(&["Remote", "Contention"])
    );
}

/// Opening the store is not a request's failure (it stops the process): its texts stay what
/// they were as the crate-wide error's `Connect`, `Git` and `Io`.
#[test]
fn opening_errors_keep_their_texts() {
    let cases = [
        (
            OpenError::from(transport::ConnectError::NoCertificate),
            "configuration: GITSTATE_GIT_CA_FILE/GITSTATE_GIT_CA_PEM: no certificate in the PEM text",
        ),
        (
            OpenError::from(repository::Error::Git(gix::Error::from_error(
                std::io::Error::other("x"),
            ))),
            "local git repository",
        ),
        (
            OpenError::from(std::io::Error::other("no such dir")),
            "no such dir",
        ),
    ];
    for (error, text) in cases {
        assert_eq!(error.to_string(), text);
    }
}
