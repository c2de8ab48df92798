use super::*;
use rand::{Rng, SeedableRng};
use std::time::{Duration, UNIX_EPOCH};

#[test]
fn formats_and_normalises() {
    let at = UNIX_EPOCH + Duration::from_secs(1_767_323_045);
    assert_eq!(format(at), "2026-01-02T03:04:05Z");
    assert_eq!(
        format(at + Duration::from_millis(999)),
        "2026-01-02T03:04:05Z"
    );
    assert_eq!(
        format(UNIX_EPOCH - Duration::from_secs(5)),
        "1970-01-01T00:00:00Z"
    );
    assert_eq!(
        normalise("2026-01-02T03:04:05Z").as_deref(),
        Some("2026-01-02T03:04:05Z")
    );
    assert_eq!(
        normalise("2026-01-02T04:04:05.123+01:00").as_deref(),
        Some("2026-01-02T03:04:05Z")
    );
    assert_eq!(
        normalise("2024-02-29T23:30:00-01:00").as_deref(),
        Some("2024-03-01T00:30:00Z")
    );
    assert_eq!(
        normalise("2026-01-02t03:04:05.1234567890123z").as_deref(),
        Some("2026-01-02T03:04:05Z"),
        "lower-case t and z, a fraction longer than nanoseconds"
    );
    for bad in [
        "yesterday",
        "2026-01-02 03:04:05Z",
        "2026-01-02T03:04:05",
        "2026-01-02T03:04:05+0100",
        "2026-01-02T03:04:05.Z",
        "2026-01-02T03:04:05Z[Europe/Paris]",
        "20260102T030405Z",
        "2026-02-30T03:04:05Z",
        "2026-01-02T25:04:05Z",
        "2026-13-02T03:04:05Z",
        "+2026-01-02T03:04:05Z",
    ] {
        assert_eq!(normalise(bad), None, "{bad}");
    }
}

/// The civil date of a day count (Howard Hinnant's algorithm): the formatting this module did
/// by hand before it used jiff, kept as an independent oracle.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn oracle(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    std::format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Generated moments from 1970 to the end of 9999 (leap days and year ends weighted in): `format` writes
/// byte for byte what the hand-written code wrote, and the same moment written with a
/// generated offset and fraction normalises back to it.
#[test]
fn generated_moments_format_as_before_and_normalise_back() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3339);
    // jiff's last moment (9999-12-30T22:00:00Z), the end of the range it formats exactly.
    let last = Timestamp::MAX.as_second();
    let edges = [
        0,
        951_782_400,
        951_868_799,
        1_709_251_199,
        4_107_542_399,
        last,
    ];
    for i in 0..20_000 {
        let secs = match edges.get(i) {
            Some(&edge) => edge,
            None if i % 4 == 0 => {
                // Around a day boundary.
                rng.random_range(0..last / 86_400) * 86_400 + rng.random_range(-2..=2)
            }
            None => rng.random_range(0..=last),
        }
        .clamp(0, last);
        let at = UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs());
        let written = format(at);
        assert_eq!(written, oracle(secs), "{secs}");
        assert_eq!(normalise(&written).as_deref(), Some(written.as_str()));

        let offset = rng.random_range(-(23_i64 * 60 + 59)..=(23 * 60 + 59));
        let local = oracle(secs + offset * 60);
        let sign = if offset < 0 { '-' } else { '+' };
        let fraction = match rng.random_range(0..3) {
            0 => String::new(),
            n => std::format!(".{}", "7".repeat(n * 5)),
        };
        let text = std::format!(
            "{}{fraction}{sign}{:02}:{:02}",
            &local[..19],
            offset.abs() / 60,
            offset.abs() % 60
        );
        if (0..=last).contains(&(secs + offset * 60)) {
            assert_eq!(
                normalise(&text).as_deref(),
                Some(written.as_str()),
                "{text}"
            );
        }
    }
}
