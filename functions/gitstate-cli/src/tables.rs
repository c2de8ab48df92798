//! The backend's answers as plain-text tables: one header line, one line a row, columns two
//! spaces apart, no borders (easy to read, easy to `grep` and `awk`).

use comfy_table::{CellAlignment, ColumnConstraint, Table, Width, presets};
use gitstate_core::access::Grant;
use gitstate_core::api::{HistoryAnswer, ListedLock, ListedState};

/// An empty table with `header`; columns listed in `right` are right-aligned.
fn table(header: &[&str], right: &[usize]) -> Table {
    let mut table = Table::new();
    table.set_header(header.to_vec());
    plain(&mut table, right);
    table
}

/// No borders, columns two spaces apart, those listed in `right` right-aligned.
fn plain(table: &mut Table, right: &[usize]) {
    table.load_style(presets::NOTHING);
    let last = table.column_count().saturating_sub(1);
    for (i, column) in table.column_iter_mut().enumerate() {
        column.set_padding((0, if i == last { 0 } else { 2 }));
        if right.contains(&i) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
}

/// A user's grants and what each allows, one a line, indented under the user's name.
pub fn grants(grants: &[Grant]) -> String {
    let mut table = Table::new();
    for grant in grants {
        table.add_row(vec![grant.to_string(), grant.describe()]);
    }
    plain(&mut table, &[]);
    table
        .lines()
        .map(|line| format!("  {}", line.trim_end()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SSZ` (UTC); `-` outside the calendar's range.
pub fn format_time(seconds: i64) -> String {
    jiff::Timestamp::from_second(seconds).map_or_else(
        |_| "-".into(),
        |at| at.strftime("%Y-%m-%d %H:%M:%SZ").to_string(),
    )
}

/// Age as the console words it too: `45s`, `12m`, `3h5m`, `2d4h`.
pub fn format_age(seconds: i64) -> String {
    gitstate_core::wording::age(seconds)
}

/// An operation as the console words it too (`apply`, `migration`, `restore`…), printable.
fn operation(raw: &str) -> String {
    printable(&gitstate_core::wording::operation(raw))
}

fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".into(), |v| printable(&v.to_string()))
}

/// `s` with every character a terminal would act on written out as an escape (`\u{1b}`, `\n`):
/// control characters (C0, DEL, C1, so every ESC/CSI sequence is defused) and the bidirectional
/// controls that reorder what is shown. Lock holders and operations are whatever clients sent.
pub fn printable(s: &str) -> String {
    let acts = |c: char| {
        c.is_control()
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !s.chars().any(acts) {
        return s.to_owned();
    }
    s.chars()
        .map(|c| {
            if acts(c) {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A history page, newest first, with a pointer to the next page when there is one.
pub fn history(answer: &HistoryAnswer) -> String {
    let mut table = table(&["VERSION", "TIME", "SERIAL", "AUTHOR", "OPERATION"], &[2]);
    for v in &answer.versions {
        let version = printable(&v.version);
        let short: String = version.chars().take(12).collect();
        let operation = match (&v.restored_from, v.deleted) {
            (_, true) => "deleted".to_owned(),
            // As the console words it: which version a restore wrote again.
            (Some(from), false) => format!(
                "{} of {}",
                operation(&v.operation),
                printable(&from.chars().take(12).collect::<String>())
            ),
            (None, false) => operation(&v.operation),
        };
        table.add_row(vec![
            short,
            format_time(v.time),
            or_dash(v.serial),
            printable(&v.author),
            operation,
        ]);
    }
    let mut out = table.trim_fmt();
    if let Some(next) = answer.next_page {
        out.push_str(&format!("\n(more: --page {next})"));
    }
    out
}

/// The states whose name contains `filter`; `None` when there is none.
pub fn states(states: &[ListedState], filter: &str) -> Option<String> {
    let header = ["STATE", "SERIAL", "UPDATED", "AUTHOR", "OPERATION", "LOCK"];
    let mut table = table(&header, &[1]);
    // The serial column is as wide as it always was, so scripts that cut it keep working.
    if let Some(serial) = table.column_mut(1) {
        serial.set_constraint(ColumnConstraint::LowerBoundary(Width::Fixed(7)));
    }
    for state in states.iter().filter(|s| s.state.contains(filter)) {
        let lock = state.lock.as_ref().map_or_else(
            || "-".to_owned(),
            |lock| {
                let age = lock.age_seconds.map_or_else(|| "-".into(), format_age);
                let (who, user, id) = (&lock.who, or_dash(lock.user.as_ref()), &lock.id);
                format!("{} ({user}, {}) {age} ago", printable(who), printable(id))
            },
        );
        table.add_row(vec![
            printable(&state.state),
            or_dash(state.serial),
            state.updated.map_or_else(|| "-".into(), format_time),
            or_dash(state.author.as_ref()),
            state
                .operation
                .as_deref()
                .map_or_else(|| "-".into(), operation),
            lock,
        ]);
    }
    (!table.is_empty()).then(|| table.trim_fmt())
}

/// Every lock with its age, those at least `stale_after` seconds old flagged STALE, then advice
/// when any is; `None` when no lock is held.
pub fn locks(locks: &[ListedLock], stale_after: i64) -> Option<String> {
    if locks.is_empty() {
        return None;
    }
    let header = ["STATE", "AGE", "USER", "WHO", "OPERATION", "LOCK ID"];
    let mut table = table(&header, &[1]);
    let mut stale = 0;
    for lock in locks {
        let old = lock.age_seconds.is_some_and(|a| a >= stale_after);
        stale += usize::from(old);
        table.add_row(vec![
            printable(&lock.state),
            lock.age_seconds.map_or_else(|| "-".into(), format_age),
            or_dash(lock.user.as_ref()),
            printable(&lock.who),
            operation(&lock.operation),
            format!(
                "{}{}",
                printable(&lock.id),
                if old { "  STALE" } else { "" }
            ),
        ]);
    }
    let mut out = table.trim_fmt();
    if stale > 0 {
        out.push_str(&format!(
            "\n\n{stale} lock(s) older than {}: check with the holder, then \
             `terraform force-unlock <ID>` (admin)",
            format_age(stale_after)
        ));
    }
    Some(out)
}

#[cfg(test)]
mod tests;
