//! RFC 3339 timestamps as sops writes them (`2026-01-02T03:04:05Z`), with jiff doing the
//! calendar.

use std::sync::LazyLock;
use std::time::SystemTime;

use jiff::Timestamp;

/// The form sops (Go's `time.RFC3339`) writes: UTC, to the second.
const SOPS_FORM: &str = "%Y-%m-%dT%H:%M:%SZ";

/// RFC 3339's `date-time`, and nothing more of ISO 8601 than that: the date and time, an
/// optional fraction of any length, then `Z` or `±HH:MM`. jiff's own parser is wider (a space
/// for the `T`, offsets without a colon, time zone annotations).
static RFC3339: LazyLock<Option<regex_lite::Regex>> = LazyLock::new(|| {
    regex_lite::Regex::new(
        r"^(\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2})(?:\.\d+)?([Zz]|[+-]\d{2}:\d{2})$",
    )
    .ok()
});

/// `YYYY-MM-DDTHH:MM:SSZ` for a moment, in UTC, to the second (a moment before 1970 is written
/// as the epoch, one past jiff's range as its last second).
pub fn format(at: SystemTime) -> String {
    let at = if at < SystemTime::UNIX_EPOCH {
        Timestamp::UNIX_EPOCH
    } else {
        Timestamp::try_from(at).unwrap_or(Timestamp::MAX)
    };
    at.strftime(SOPS_FORM).to_string()
}

/// Re-format any RFC 3339 time the way Go's `time.Format(time.RFC3339)` prints it in UTC
/// after parsing: sops uses that string, not the raw one, as the MAC's additional data.
/// Fractional seconds are dropped; an offset is applied. `None` for anything else, and for a
/// date or time that does not exist (February 30th, 25 o'clock).
pub fn normalise(text: &str) -> Option<String> {
    let parts = RFC3339.as_ref()?.captures(text)?;
    // The fraction never reaches the output: leave it out rather than bound its length.
    let whole = format!("{}{}", parts.get(1)?.as_str(), parts.get(2)?.as_str());
    let at: Timestamp = whole.parse().ok()?;
    Some(at.strftime(SOPS_FORM).to_string())
}

#[cfg(test)]
mod tests;
