use super::*;
use gitstate_core::api::VersionInfo;
use rand::{Rng, SeedableRng};

/// Characters a terminal does not act on.
fn shown(c: char) -> bool {
    !c.is_control()
        && !matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Text mixing plain characters with every kind of character a terminal acts on.
fn raw(rng: &mut impl Rng) -> String {
    let pools: [&[char]; 3] = [
        &[
            'a', 'Z', '0', ' ', '-', '@', 'é', '雪', '🙂', '[', ']', ';', '\\',
        ],
        &[
            '\u{1b}', '\u{7}', '\u{8}', '\r', '\n', '\t', '\0', '\u{7f}', '\u{9b}', '\u{9d}',
            '\u{85}',
        ],
        &['\u{202e}', '\u{2066}', '\u{200f}'],
    ];
    let len = rng.random_range(0..24);
    (0..len)
        .map(|_| {
            let pool = pools[rng.random_range(0..pools.len())];
            pool[rng.random_range(0..pool.len())]
        })
        .collect()
}

fn lock(rng: &mut impl Rng, state: &str) -> ListedLock {
    ListedLock {
        state: state.to_owned(),
        id: raw(rng),
        who: raw(rng),
        operation: raw(rng),
        user: rng.random_bool(0.7).then(|| raw(rng)),
        created: Some(rng.random_range(0..2_000_000_000)),
        age_seconds: rng.random_bool(0.9).then(|| rng.random_range(0..400_000)),
    }
}

#[test]
fn times_and_ages() {
    assert_eq!(format_time(0), "1970-01-01 00:00:00Z");
    assert_eq!(format_time(1_795_235_400), "2026-11-21 04:30:00Z");
    assert_eq!(format_time(951_782_400), "2000-02-29 00:00:00Z");
    assert_eq!(format_time(-1), "1969-12-31 23:59:59Z");
    assert_eq!(format_time(i64::MAX), "-");
    // The console's wording (gitstate_core::wording::age), tested there.
    assert_eq!(format_age(7300), "2h1m");
    assert_eq!(format_age(119), "1m");
    assert_eq!(format_age(7199), "1h59m");
    assert_eq!(format_age(172_800), "2d");
}

/// Generated answers whose every text field mixes in characters a terminal acts on: no table
/// prints one of them, each row stays on its own line, and plain text passes unchanged.
#[test]
fn printed_tables_carry_no_terminal_controls() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    for _ in 0..300 {
        let rows = rng.random_range(1..6);
        let listed: Vec<ListedState> = (0..rows)
            .map(|_| {
                let state = raw(&mut rng);
                ListedState {
                    lock: rng.random_bool(0.5).then(|| lock(&mut rng, &state)),
                    state,
                    serial: rng.random_bool(0.8).then(|| rng.random()),
                    lineage: Some(raw(&mut rng)),
                    updated: Some(rng.random_range(0..2_000_000_000)),
                    author: rng.random_bool(0.8).then(|| raw(&mut rng)),
                    operation: rng.random_bool(0.8).then(|| raw(&mut rng)),
                }
            })
            .collect();
        let held: Vec<ListedLock> = (0..rows)
            .map(|_| {
                let state = raw(&mut rng);
                lock(&mut rng, &state)
            })
            .collect();
        let page = HistoryAnswer {
            state: raw(&mut rng),
            page: 0,
            versions: (0..rows)
                .map(|_| VersionInfo {
                    version: raw(&mut rng),
                    time: rng.random_range(0..2_000_000_000),
                    author: raw(&mut rng),
                    operation: raw(&mut rng),
                    serial: rng.random_bool(0.8).then(|| rng.random()),
                    lineage: None,
                    deleted: rng.random(),
                    restored_from: rng.random_bool(0.3).then(|| raw(&mut rng)),
                })
                .collect(),
            next_page: None,
        };
        let tables = [
            states(&listed, "").expect("rows"),
            locks(&held, i64::MAX).expect("rows"),
            history(&page),
        ];
        for printed in tables {
            assert_eq!(printed.lines().count(), rows + 1, "{printed:?}");
            assert!(printed.lines().all(|l| l.chars().all(shown)), "{printed:?}");
        }
        let plain: String = raw(&mut rng).chars().filter(|&c| shown(c)).collect();
        assert_eq!(printable(&plain), plain);
    }
    assert_eq!(printable("\u{1b}[2J"), "\\u{1b}[2J");
}

/// ASCII-only generated rows: every column starts where its header starts, the serial ends
/// where its header ends, the column is at least seven wide, and a filter keeps only the matching states.
#[test]
fn columns_line_up_under_their_headers() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for _ in 0..200 {
        let listed: Vec<ListedState> = (0..rng.random_range(1..8))
            .map(|i| ListedState {
                state: format!("team-{i}/{}.tfstate", "x".repeat(rng.random_range(1..50))),
                serial: Some(rng.random_range(0..10_000_000)),
                lineage: None,
                updated: Some(rng.random_range(0..2_000_000_000)),
                author: Some("a".repeat(rng.random_range(1..20))),
                operation: Some("OperationTypeApply".into()),
                lock: None,
            })
            .collect();
        let printed = states(&listed, "").expect("rows");
        let lines: Vec<&str> = printed.lines().collect();
        let starts = |line: &str| -> Vec<usize> {
            let mut starts = vec![0];
            let bytes = line.as_bytes();
            for i in 2..bytes.len() {
                if bytes[i] != b' ' && bytes[i - 1] == b' ' && bytes[i - 2] == b' ' {
                    starts.push(i);
                }
            }
            starts
        };
        let header = starts(lines[0]);
        assert_eq!(header.len(), 6, "{printed}");
        assert!(lines[0].contains("   SERIAL  UPDATED"), "{printed}");
        for (line, state) in lines[1..].iter().zip(&listed) {
            assert!(line.starts_with(&state.state), "{printed}");
            let serial = state.serial.expect("set").to_string();
            // SERIAL is right-aligned: it ends where the header's SERIAL ends.
            let end = header[1] + "SERIAL".len();
            let at = line.find(&format!(" {serial}  ")).expect("serial") + 1;
            assert_eq!(at + serial.len(), end, "{printed}");
            assert_eq!(&starts(line)[2..], &header[2..], "{printed}");
        }
        let wanted = rng.random_range(0..listed.len());
        let one = states(&listed, &format!("team-{wanted}/")).expect("one row");
        assert_eq!(one.lines().count(), 2);
        assert!(states(&listed, "nothing-like-it").is_none());
    }
    let page = HistoryAnswer {
        state: "s".into(),
        page: 0,
        versions: vec![VersionInfo {
            version: "0123456789abcdef".into(),
            time: 0,
            author: "admin".into(),
            operation: "OperationTypeApply".into(),
            serial: Some(2),
            lineage: None,
            deleted: false,
            restored_from: None,
        }],
        next_page: Some(1),
    };
    let mut restore = page.clone();
    restore.versions[0].operation = "OperationTypeRestore".into();
    restore.versions[0].restored_from = Some("fedcba9876543210fedcba9876543210fedcba98".into());
    assert!(
        history(&restore).contains("admin   restore of fedcba987654"),
        "{}",
        history(&restore)
    );
    let printed = history(&page);
    assert!(
        printed.contains("0123456789ab  1970-01-01 00:00:00Z"),
        "{printed}"
    );
    assert!(printed.contains(" 2  admin   apply"), "{printed}");
    assert!(printed.ends_with("\n(more: --page 1)"), "{printed}");
}

#[test]
fn stale_locks_are_flagged_and_counted() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for _ in 0..100 {
        let held: Vec<ListedLock> = (0..rng.random_range(1..6))
            .map(|i| ListedLock {
                state: format!("s{i}.tfstate"),
                id: format!("id-{i}"),
                who: "me@host".into(),
                operation: "OperationTypeApply".into(),
                user: Some("ci".into()),
                created: None,
                age_seconds: Some(rng.random_range(0..10_000)),
            })
            .collect();
        let stale_after = rng.random_range(0..10_000);
        let printed = locks(&held, stale_after).expect("rows");
        let stale = held
            .iter()
            .filter(|l| l.age_seconds.is_some_and(|a| a >= stale_after))
            .count();
        assert_eq!(printed.matches("STALE").count(), stale, "{printed}");
        assert!(!printed.contains("OperationType"), "{printed}");
        for lock in &held {
            let age = format_age(lock.age_seconds.expect("set"));
            assert!(printed.contains(&format!("{age}  ci")), "{printed}");
        }
        assert_eq!(
            printed.contains(&format!("{stale} lock(s) older than")),
            stale > 0,
            "{printed}"
        );
    }
    assert!(locks(&[], 0).is_none());
}

/// Generated grants: one line each, indented by two, the descriptions in one column.
#[test]
fn grants_list_one_a_line_under_the_user() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(6);
    for _ in 0..200 {
        let given: Vec<Grant> = (0..rng.random_range(1..6))
            .map(|_| {
                let role = ["read", "write", "admin"][rng.random_range(0..3)];
                let prefix = match rng.random_range(0..3) {
                    0 => "*".to_owned(),
                    n => format!("{}/", "n".repeat(n * rng.random_range(1..30))),
                };
                Grant::parse(&format!("{role}:{prefix}")).expect("valid")
            })
            .collect();
        let printed = grants(&given);
        let lines: Vec<&str> = printed.lines().collect();
        assert_eq!(lines.len(), given.len(), "{printed}");
        let column = lines[0].find(&given[0].describe()).expect("described");
        for (line, grant) in lines.iter().zip(&given) {
            assert!(line.starts_with(&format!("  {grant}  ")), "{printed}");
            assert_eq!(line.find(&grant.describe()), Some(column), "{printed}");
        }
    }
}
