//! How the console and the command line word what Terraform and gitstate record: operation
//! names and lock ages. One place, so that a page and a terminal say the same thing.

/// The operations Terraform and OpenTofu name in a lock's `Operation` (and gitstate copies into
/// the commit that writes under it), gitstate's own, and the first words of the commit subjects
/// gitstate writes without a lock; each with the words a person reads.
const KNOWN: [(&str, &str); 20] = [
    ("OperationTypeApply", "apply"),
    ("OperationTypePlan", "plan"),
    ("OperationTypeRefresh", "refresh"),
    // `terraform import` (and `console`, which writes nothing) run an operation that names no
    // type; tests/it/console.rs records what terraform and OpenTofu send for each command.
    ("OperationTypeInvalid", "import"),
    ("state-push", "state push"),
    ("state-mv", "state mv"),
    ("state-rm", "state rm"),
    ("state-replace-provider", "state replace-provider"),
    ("taint", "taint"),
    ("untaint", "untaint"),
    ("migration destination state", "migration"),
    ("migration source state", "migration (source)"),
    ("import", "import"),
    ("force-unlock", "force-unlock"),
    // gitstate's own.
    ("OperationTypeRestore", "restore"),
    ("OperationTypeRekey", "rekey"),
    ("restore", "restore"),
    ("rekey", "rekey"),
    ("write", "write"),
    ("delete", "delete"),
];

/// Longest operation shown, in characters; longer ones end in `…`.
const MAX_SHOWN: usize = 60;

/// `raw` (a lock's `Operation`, or what a commit recorded) as a person reads it: `apply`,
/// `migration`, `restore`…; an unknown `OperationTypeFooBar` as `foo bar`; anything else as
/// sent, on one line, at most 60 characters; nothing at all as `unnamed`.
pub fn operation(raw: &str) -> String {
    let raw = raw.trim();
    if let Some((_, name)) = KNOWN.iter().find(|(known, _)| *known == raw) {
        return (*name).to_owned();
    }
    let text = match raw.strip_prefix("OperationType").filter(|k| !k.is_empty()) {
        Some(kind) => words_of(kind),
        None => raw.to_owned(),
    };
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.is_empty() {
        "unnamed".to_owned()
    } else {
        shortened(&line)
    }
}

/// `FooBar` as `foo bar`.
fn words_of(camel: &str) -> String {
    let mut out = String::new();
    for c in camel.chars() {
        if c.is_uppercase() && !out.is_empty() {
            out.push(' ');
        }
        out.extend(c.to_lowercase());
    }
    out
}

fn shortened(text: &str) -> String {
    if text.chars().count() <= MAX_SHOWN {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(MAX_SHOWN - 1).collect();
    cut.push('…');
    cut
}

/// How long something has been held, in the two largest units that matter, as Terraform's
/// durations are written (`-lock-timeout=5m`): `45s`, `12m`, `3h5m`, `2d4h`; `0s` for a moment
/// in the future (clocks differ).
pub fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    let (days, hours, minutes) = (s / 86_400, s % 86_400 / 3600, s % 3600 / 60);
    let pair = |big: i64, unit: &str, small: i64, small_unit: &str| {
        if small == 0 {
            format!("{big}{unit}")
        } else {
            format!("{big}{unit}{small}{small_unit}")
        }
    };
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{minutes}m"),
        3600..86_400 => pair(s / 3600, "h", minutes, "m"),
        _ => pair(days, "d", hours, "h"),
    }
}

#[cfg(test)]
mod tests;
