use super::*;
use rand::{Rng, SeedableRng};

/// Every value of the reference (what Terraform 1.11 and OpenTofu send) and gitstate's own.
#[test]
fn the_values_clients_send_read_as_words() {
    for (raw, shown) in [
        ("OperationTypeApply", "apply"),
        ("OperationTypePlan", "plan"),
        ("state-push", "state push"),
        ("migration destination state", "migration"),
        ("OperationTypeRestore", "restore"),
        ("OperationTypeRekey", "rekey"),
        ("OperationTypeInvalid", "import"),
        ("  OperationTypeApply\n", "apply"),
        ("", "unnamed"),
        (" \t", "unnamed"),
    ] {
        assert_eq!(operation(raw), shown, "{raw:?}");
    }
    for (raw, shown) in KNOWN {
        assert_eq!(operation(raw), shown);
        assert!(!shown.contains("OperationType") && !shown.is_empty());
        assert_eq!(operation(shown), shown, "a shown name reads the same again");
    }
}

fn camel_word(rng: &mut impl Rng) -> String {
    let len = rng.random_range(1..8);
    let mut word: String = (0..len)
        .map(|_| char::from(rng.random_range(b'a'..=b'z')))
        .collect();
    word[..1].make_ascii_uppercase();
    word
}

/// Operation types Terraform may add: `OperationTypeFooBar` reads `foo bar`.
#[test]
fn unknown_operation_types_read_as_lowercase_words() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(25);
    for _ in 0..2000 {
        let words: Vec<String> = (0..rng.random_range(1..4))
            .map(|_| camel_word(&mut rng))
            .collect();
        let raw = format!("OperationType{}", words.concat());
        if KNOWN.iter().any(|(known, _)| *known == raw) {
            continue;
        }
        let expected = words.join(" ").to_lowercase();
        assert_eq!(operation(&raw), expected, "{raw}");
    }
}

/// Anything else a client may send: shown on one line, never empty, never longer than
/// [`MAX_SHOWN`] characters, the same when read again.
#[test]
fn any_operation_is_shown_on_one_short_line() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(2525);
    let pool = [
        'a', 'Z', '-', '_', ' ', '\t', '\n', '\r', '\u{1b}', '\0', '\u{85}', 'é', '雪', '🙂', '<',
        '"', '&',
    ];
    for _ in 0..5000 {
        let len = rng.random_range(0..150);
        let mut raw: String = (0..len)
            .map(|_| pool[rng.random_range(0..pool.len())])
            .collect();
        if rng.random_bool(0.2) {
            raw.insert_str(0, "OperationType");
        }
        let shown = operation(&raw);
        assert!(!shown.is_empty(), "{raw:?}");
        assert!(shown.chars().count() <= MAX_SHOWN, "{raw:?} → {shown:?}");
        assert!(!shown.chars().any(char::is_control), "{raw:?} → {shown:?}");
        assert_eq!(shown.trim(), shown);
        assert_eq!(operation(&shown), shown, "{raw:?}");
    }
}

/// The seconds an age says, read back (`3h5m` → 11100).
fn seconds_of(text: &str) -> i64 {
    let mut total = 0;
    let mut number = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c {
            'd' => 86_400,
            'h' => 3600,
            'm' => 60,
            's' => 1,
            other => panic!("unit {other:?} in {text:?}"),
        };
        total += number.parse::<i64>().expect("a number before each unit") * unit;
        number.clear();
    }
    assert!(number.is_empty(), "{text:?} ends in a unit");
    total
}

#[test]
fn ages_name_the_two_largest_units() {
    assert_eq!(age(-5), "0s");
    assert_eq!(age(59), "59s");
    assert_eq!(age(61), "1m");
    assert_eq!(age(3600), "1h");
    assert_eq!(age(3 * 3600 + 5 * 60 + 7), "3h5m");
    assert_eq!(age(2 * 86_400 + 4 * 3600), "2d4h");
    assert_eq!(age(86_400 + 59 * 60), "1d");
    let mut rng = rand::rngs::StdRng::seed_from_u64(60);
    let mut last = (0, 0);
    let mut ages: Vec<i64> = (0..5000)
        .map(|_| {
            let digits = rng.random_range(1..9);
            rng.random_range(0..10_i64.pow(digits))
        })
        .collect();
    ages.sort_unstable();
    for s in ages {
        let text = age(s);
        let said = seconds_of(&text);
        // Rounded down to the smaller unit shown: a minute below a day, an hour above.
        let step = match s {
            0..60 => 1,
            60..86_400 => 60,
            _ => 3600,
        };
        assert!(said <= s && s - said < step, "{s} → {text}");
        assert!(!text.contains(' ') && text.len() <= 10, "{text}");
        assert!(
            said >= last.1,
            "older never reads younger: {last:?} then {s} → {text}"
        );
        last = (s, said);
    }
}
