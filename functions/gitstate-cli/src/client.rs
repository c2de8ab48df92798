//! Commands that talk to a running backend: history, show, restore, locks.

use anyhow::{Context, bail};
use serde_json::Value;

/// Where the backend is and who we are to it.
pub struct Remote {
    pub url: String,
    pub user: String,
    pub password: String,
    http: reqwest::Client,
}

impl Remote {
    pub fn new(
        url: String,
        user: Option<String>,
        password: Option<String>,
    ) -> anyhow::Result<Self> {
        let user = user.context("no user: pass --user or set TF_HTTP_USERNAME")?;
        let password = password.context("no password: set TF_HTTP_PASSWORD")?;
        Ok(Self {
            url: url.trim_end_matches('/').to_owned(),
            user,
            password,
            http: reqwest::Client::new(),
        })
    }

    async fn call(&self, method: reqwest::Method, path: &str) -> anyhow::Result<String> {
        let response = self
            .http
            .request(method, format!("{}{path}", self.url))
            .basic_auth(&self.user, Some(&self.password))
            .send()
            .await
            .with_context(|| format!("reaching {}", self.url))?;
        let status = response.status();
        let body = response.text().await.context("reading the answer")?;
        if !status.is_success() {
            bail!("{status}: {}", body.trim());
        }
        Ok(body)
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<String> {
        self.call(reqwest::Method::GET, path).await
    }

    pub async fn post(&self, path: &str) -> anyhow::Result<String> {
        self.call(reqwest::Method::POST, path).await
    }
}

/// `name@selector` → (name, selector).
pub fn split_target(target: &str) -> anyhow::Result<(&str, &str)> {
    target
        .rsplit_once('@')
        .filter(|(n, s)| !n.is_empty() && !s.is_empty())
        .context("write the revision as <state>@<serial or commit id>, e.g. app/prod.tfstate@12")
}

/// `90s`, `30m`, `2h`, `1d` or plain seconds.
pub fn parse_duration(text: &str) -> anyhow::Result<i64> {
    let (number, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => text.split_at(i),
        None => (text, "s"),
    };
    let number: i64 = number
        .parse()
        .with_context(|| format!("{text:?} is not a duration like 90s, 30m, 2h or 1d"))?;
    let factor = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => bail!("{text:?}: the unit must be s, m, h or d"),
    };
    Ok(number.saturating_mul(factor))
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SSZ` (proleptic Gregorian, UTC).
pub fn format_time(seconds: i64) -> String {
    let days = seconds.div_euclid(86400);
    let rest = seconds.rem_euclid(86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// Age in a short human form.
pub fn format_age(seconds: i64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// A cell of a printed table: what the backend sent, safe for a terminal.
fn text(value: &Value) -> String {
    match value {
        Value::String(s) => printable(s),
        Value::Null => "-".into(),
        other => printable(&other.to_string()),
    }
}

/// `s` with every character a terminal would act on written out as an escape (`\u{1b}`, `\n`):
/// control characters (C0, DEL, C1, so every ESC/CSI sequence is defused) and the bidirectional
/// controls that reorder what is shown. Lock holders and operations are whatever clients sent.
fn printable(s: &str) -> String {
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

pub fn print_history(answer: &str) -> anyhow::Result<()> {
    let answer: Value = serde_json::from_str(answer).context("the backend's answer")?;
    println!(
        "{:<12} {:<21} {:>7}  {:<16} OPERATION",
        "VERSION", "TIME", "SERIAL", "AUTHOR"
    );
    for v in answer["versions"].as_array().into_iter().flatten() {
        let version = text(&v["version"]);
        let short = version.get(..12).unwrap_or(&version);
        let operation = if v["deleted"] == true {
            "deleted".to_owned()
        } else {
            text(&v["operation"])
        };
        println!(
            "{short:<12} {:<21} {:>7}  {:<16} {operation}",
            v["time"].as_i64().map_or_else(|| "-".into(), format_time),
            text(&v["serial"]),
            text(&v["author"]),
        );
    }
    if let Some(next) = answer["next_page"].as_u64() {
        println!("(more: --page {next})");
    }
    Ok(())
}

/// The states of `GET /states` whose name contains `filter`, as a table.
pub fn print_states(answer: &str, filter: &str) -> anyhow::Result<usize> {
    let states: Value = serde_json::from_str(answer).context("the backend's answer")?;
    let states: Vec<&Value> = states
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["state"].as_str().is_some_and(|n| n.contains(filter)))
        .collect();
    if states.is_empty() {
        println!("no states");
        return Ok(0);
    }
    println!(
        "{:<40} {:>7}  {:<21} {:<12} {:<22} LOCK",
        "STATE", "SERIAL", "UPDATED", "AUTHOR", "OPERATION"
    );
    for state in &states {
        let lock = &state["lock"];
        let lock = if lock.is_null() {
            "-".to_owned()
        } else {
            format!(
                "{} ({}, {}) {} ago",
                text(&lock["who"]),
                text(&lock["user"]),
                text(&lock["id"]),
                lock["age_seconds"]
                    .as_i64()
                    .map_or_else(|| "-".into(), format_age)
            )
        };
        println!(
            "{:<40} {:>7}  {:<21} {:<12} {:<22} {lock}",
            text(&state["state"]),
            text(&state["serial"]),
            state["updated"]
                .as_i64()
                .map_or_else(|| "-".into(), format_time),
            text(&state["author"]),
            text(&state["operation"]),
        );
    }
    Ok(states.len())
}

pub fn print_locks(answer: &str, stale_after: i64) -> anyhow::Result<usize> {
    let locks: Value = serde_json::from_str(answer).context("the backend's answer")?;
    let locks = locks.as_array().cloned().unwrap_or_default();
    if locks.is_empty() {
        println!("no locks held");
        return Ok(0);
    }
    println!(
        "{:<40} {:>6}  {:<12} {:<24} {:<22} LOCK ID",
        "STATE", "AGE", "USER", "WHO", "OPERATION"
    );
    let mut stale = 0;
    for lock in &locks {
        let age = lock["age_seconds"].as_i64();
        let old = age.is_some_and(|a| a >= stale_after);
        stale += usize::from(old);
        println!(
            "{:<40} {:>6}  {:<12} {:<24} {:<22} {}{}",
            text(&lock["state"]),
            age.map_or_else(|| "-".into(), format_age),
            text(&lock["user"]),
            text(&lock["who"]),
            text(&lock["operation"]),
            text(&lock["id"]),
            if old { "  STALE" } else { "" }
        );
    }
    if stale > 0 {
        println!(
            "\n{stale} lock(s) older than {}: check with the holder, then `terraform force-unlock <ID>` (admin)",
            format_age(stale_after)
        );
    }
    Ok(stale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(format_time(0), "1970-01-01 00:00:00Z");
        assert_eq!(format_time(1_795_235_400), "2026-11-21 04:30:00Z");
        assert_eq!(parse_duration("2h").expect("valid"), 7200);
        assert_eq!(parse_duration("45").expect("valid"), 45);
        assert!(parse_duration("2w").is_err());
        assert_eq!(
            split_target("a/b.tfstate@12").expect("valid"),
            ("a/b.tfstate", "12")
        );
        assert!(split_target("a/b.tfstate").is_err());
        assert_eq!(format_age(7300), "2h");
    }

    /// Generated cells mixing text with every kind of character a terminal acts on: what is
    /// printed holds none of them, and plain text passes unchanged.
    #[test]
    fn printed_cells_carry_no_terminal_controls() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let shown = |c: char| {
            !c.is_control()
                && !matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        };
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
        for _ in 0..2000 {
            let len = rng.random_range(0..24);
            let raw: String = (0..len)
                .map(|_| {
                    let pool = pools[rng.random_range(0..pools.len())];
                    pool[rng.random_range(0..pool.len())]
                })
                .collect();
            for value in [
                Value::String(raw.clone()),
                serde_json::json!({ "who": raw }),
            ] {
                let cell = text(&value);
                assert!(cell.chars().all(shown), "{raw:?} printed as {cell:?}");
            }
            if raw.chars().all(shown) {
                assert_eq!(text(&Value::String(raw.clone())), raw);
            }
        }
        assert_eq!(text(&Value::String("\u{1b}[2J".into())), "\\u{1b}[2J");
    }
}
