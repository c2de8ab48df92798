use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

/// Pieces of hostile values: line breaks of every kind, other trailers' keys, separators,
/// unicode, long runs.
const PIECES: &[&str] = &[
    "a",
    "Z9",
    " ",
    "  ",
    ":",
    ": ",
    "\n",
    "\r\n",
    "\n\n",
    "\t",
    "\u{0b}",
    "\u{0c}",
    "\u{85}",
    "\u{2028}",
    "\u{2029}",
    "\u{0}",
    "\u{1b}[31m",
    "User: root",
    "\nUser: root",
    "\n\nUser: root\n",
    "Serial: 999",
    "\nSerial: 999",
    "Lock-ID: forged",
    "Restored-from: 0000",
    "Operation: OperationTypeForged",
    "Who: mallory",
    "Lineage: other",
    "é",
    "日本",
    "🦀",
    "\u{200b}",
    "\u{feff}",
    "x",
];

fn value(rng: &mut StdRng) -> Option<String> {
    if rng.random_bool(0.2) {
        return None;
    }
    let mut text = String::new();
    for _ in 0..rng.random_range(0..12) {
        text.push_str(PIECES[rng.random_range(0..PIECES.len())]);
    }
    if rng.random_bool(0.05) {
        text.push_str(&"long ".repeat(rng.random_range(40..80)));
    }
    Some(text)
}

fn trailers(rng: &mut StdRng) -> Trailers {
    Trailers {
        serial: rng.random_bool(0.7).then(|| rng.random()),
        lineage: value(rng),
        restored_from: value(rng),
        operation: value(rng),
        lock_id: value(rng),
        who: value(rng),
        user: value(rng),
    }
}

fn present(t: &Trailers) -> usize {
    usize::from(t.serial.is_some())
        + [
            &t.lineage,
            &t.restored_from,
            &t.operation,
            &t.lock_id,
            &t.who,
            &t.user,
        ]
        .iter()
        .filter(|v| v.is_some())
        .count()
}

/// Generated trailers, hostile values included, read back as exactly what was written (each
/// value in its own field, as one line): no value can forge another trailer or a line, and a
/// hostile subject adds none either.
#[test]
fn every_value_round_trips_and_none_forges_a_trailer() {
    let mut rng = StdRng::seed_from_u64(0x7a11e7);
    let mut hostile = 0;
    for _ in 0..5000 {
        let written = trailers(&mut rng);
        let subject = value(&mut rng).unwrap_or_default();
        let message = written.render(&subject);
        let expected = written.normalised();
        assert_eq!(Trailers::parse(&message), expected, "{message:?}");
        let lines: Vec<&str> = message.lines().collect();
        assert_eq!(lines.len(), 2 + present(&expected), "{message:?}");
        assert!(message.ends_with('\n'));
        for field in [&expected.lineage, &expected.who, &expected.user]
            .into_iter()
            .flatten()
        {
            assert!(field.chars().count() <= MAX_VALUE_CHARS);
            assert!(!field.chars().any(is_break), "{field:?}");
        }
        assert_eq!(
            Trailers::parse(&Trailers::default().render(&subject)),
            Trailers::default(),
            "{subject:?}"
        );
        hostile += usize::from(
            [&written.user, &written.lineage, &written.who]
                .into_iter()
                .flatten()
                .any(|v| v.contains('\n') && v.contains(": ")),
        );
    }
    assert!(hostile > 500, "{hostile} hostile cases");
}

/// Messages as gitstate wrote them before this module existed read the same.
#[test]
fn messages_of_earlier_writes_parse() {
    let write = "write a (serial 3)\n\nSerial: 3\nLineage: L\nOperation: OperationTypeApply\nLock-ID: x\nWho: w\nUser: ann\n";
    assert_eq!(
        Trailers::parse(write),
        Trailers {
            serial: Some(3),
            lineage: Some("L".into()),
            restored_from: None,
            operation: Some("OperationTypeApply".into()),
            lock_id: Some("x".into()),
            who: Some("w".into()),
            user: Some("ann".into()),
        }
    );
    assert_eq!(operation_of(write), "OperationTypeApply");
    let unlocked = "delete a\n\nLock-ID: none (written without a lock)\nUser: bob\n";
    assert_eq!(user_of(unlocked).as_deref(), Some("bob"));
    assert_eq!(
        Trailers::parse(unlocked).lock_id.as_deref(),
        Some(WITHOUT_LOCK)
    );
    assert_eq!(operation_of(unlocked), "delete");
    // Other tools' commits: no trailers, the first word is the operation.
    for foreign in ["Lock a.tfstate", "Update x\n", "", "User: x", "state 3\n"] {
        assert_eq!(Trailers::parse(foreign), Trailers::default(), "{foreign:?}");
        assert_eq!(user_of(foreign), None);
    }
    assert_eq!(operation_of("Update x\n"), "Update");
    assert_eq!(operation_of(&"w".repeat(500)).len(), MAX_OPERATION_CHARS);
    // An unreadable serial is no serial; a later line of a key wins.
    let odd = "x\n\nSerial: ten\nUser: a\nUser: b\nSerial:\n";
    assert_eq!(
        (Trailers::parse(odd).serial, user_of(odd).as_deref()),
        (None, Some("b"))
    );
}

#[test]
fn a_rendered_message_reads_as_git_writes_it() {
    let message = Trailers {
        serial: Some(7),
        lineage: Some("L".into()),
        lock_id: Some(WITHOUT_LOCK.into()),
        user: Some("ann".into()),
        ..Trailers::default()
    }
    .render("write net/a.tfstate (serial 7)");
    assert_eq!(
        message,
        "write net/a.tfstate (serial 7)\n\nSerial: 7\nLineage: L\nLock-ID: none (written without a lock)\nUser: ann\n"
    );
}

/// Generated messages (gitstate's, hostile values included, and other tools' with no trailers
/// at all): the `State-commit` a fold adds reads back, and every other trailer reads as before.
#[test]
fn a_state_commit_trailer_adds_to_any_message() {
    let mut rng = StdRng::seed_from_u64(0x5747e);
    let mut bare = 0;
    for case in 0..3000 {
        let written = trailers(&mut rng);
        let subject = value(&mut rng).unwrap_or_default();
        let message = if rng.random_bool(0.2) {
            bare += 1;
            format!("{}\n", subject.replace('\n', " "))
        } else {
            written.render(&subject)
        };
        let id = format!("{case:040x}");
        let folded = with_state_commit(&message, &id);
        assert_eq!(state_commit_of(&folded).as_deref(), Some(id.as_str()));
        assert_eq!(
            Trailers::parse(&folded),
            Trailers::parse(&message),
            "{message:?}"
        );
        assert!(folded.ends_with(&format!("\n{STATE_COMMIT}: {id}\n")));
        assert_eq!(state_commit_of(&message), None, "{message:?}");
        // The branch a write was made for, kept through the fold's replay of it.
        let branch = format!("env/{}", value(&mut rng).unwrap_or_default());
        let marked = with_branch(&message, &branch);
        assert_eq!(branch_of(&message), None, "{message:?}");
        let named = branch_of(&marked).expect("a branch");
        assert!(
            named.starts_with("env/") && !named.contains(['\n', '\r']),
            "{branch:?} {named:?}"
        );
        let kept: String = branch
            .chars()
            .take(200)
            .map(|c| if is_break(c) { ' ' } else { c })
            .collect();
        assert_eq!(named, kept.trim(), "{branch:?}");
        let replayed = with_state_commit(&marked, &id);
        assert_eq!(branch_of(&replayed), Some(named), "{marked:?}");
        assert_eq!(Trailers::parse(&replayed), Trailers::parse(&message));
        // A lock commit's proof deadline: read back to the nanosecond after the branch's mark,
        // never found in a message that lacks it, and no other trailer changed.
        let until =
            jiff::Timestamp::from_nanosecond(rng.random_range(0..200_000_000_000_000_000_000_i128))
                .expect("a time");
        let lock = with_reads_proved_until(&marked, until);
        assert_eq!(reads_proved_until(&lock), Some(until), "{lock:?}");
        assert_eq!(reads_proved_until(&marked), None, "{marked:?}");
        assert_eq!(Trailers::parse(&lock), Trailers::parse(&message));
    }
    assert!(bare > 300, "{bare}");
}
