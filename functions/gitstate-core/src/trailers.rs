//! The trailers of gitstate's commit messages, written and read here only.
//!
//! A message is a subject line, a blank line, and one trailer a line (`Key: value`):
//!
//! ```text
//! write net/prod.tfstate (serial 7)
//!
//! Serial: 7
//! Lineage: 0e1f…
//! Operation: OperationTypeApply
//! Lock-ID: 5f3c…
//! Who: ann@laptop
//! User: ann
//! ```
//!
//! Values come from clients (lock IDs, `Who`, lineages): [`Trailers::render`] keeps each to one
//! printable line, and [`Trailers::parse`] reads only the last paragraph, so no value can add a
//! line or pass for another trailer.

use crate::LockInfo;

/// The keys, in the order they are written.
const SERIAL: &str = "Serial";
const LINEAGE: &str = "Lineage";
const RESTORED_FROM: &str = "Restored-from";
const OPERATION: &str = "Operation";
const LOCK_ID: &str = "Lock-ID";
const WHO: &str = "Who";
const USER: &str = "User";
/// The state commit a fold replayed onto the branch (see [`with_state_commit`]).
pub const STATE_COMMIT: &str = "State-commit";
/// The branch a commit was made for (see [`with_branch`]).
const BRANCH: &str = "Branch";
/// Until when the process that made a lock commit may answer reads from what its LOCK proved
/// (see [`with_reads_proved_until`]).
const READS_PROVED_UNTIL: &str = "Reads-Proved-Until";

/// The `Lock-ID` of a write made without a lock.
pub const WITHOUT_LOCK: &str = "none (written without a lock)";

/// Longest value written (in characters); longer ones are cut.
const MAX_VALUE_CHARS: usize = 200;
/// Longest operation read back (for lists and history pages).
const MAX_OPERATION_CHARS: usize = 100;

/// What a commit records besides its subject. Every field is optional: commits made by other
/// tools carry none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trailers {
    /// The Terraform serial of the state the commit leaves.
    pub serial: Option<u64>,
    pub lineage: Option<String>,
    /// The revision a restore wrote again.
    pub restored_from: Option<String>,
    /// Terraform's operation from the lock (`OperationTypeApply`…).
    pub operation: Option<String>,
    /// The lock's ID, or [`WITHOUT_LOCK`].
    pub lock_id: Option<String>,
    /// The lock's `Who` (Terraform's user@host).
    pub who: Option<String>,
    /// The authenticated user.
    pub user: Option<String>,
}

impl Trailers {
    /// The trailers of a change `user` made holding the lock `lock` (`None`: without a lock).
    pub fn lock(lock: Option<&LockInfo>, user: &str) -> Self {
        let user = Some(user.to_owned());
        match lock {
            Some(info) => Self {
                operation: Some(info.operation().to_owned()),
                lock_id: Some(info.id().to_owned()),
                who: Some(info.who().to_owned()),
                user,
                ..Self::default()
            },
            None => Self {
                lock_id: Some(WITHOUT_LOCK.to_owned()),
                user,
                ..Self::default()
            },
        }
    }

    /// The whole message: `subject` (kept to one line), a blank line, the trailers.
    pub fn render(&self, subject: &str) -> String {
        let subject: String = subject
            .chars()
            .map(|c| if is_break(c) { ' ' } else { c })
            .collect();
        let mut message = format!("{}\n\n", subject.trim());
        let serial = self.serial.map(|s| s.to_string());
        for (key, value) in [
            (SERIAL, serial.as_deref()),
            (LINEAGE, self.lineage.as_deref()),
            (RESTORED_FROM, self.restored_from.as_deref()),
            (OPERATION, self.operation.as_deref()),
            (LOCK_ID, self.lock_id.as_deref()),
            (WHO, self.who.as_deref()),
            (USER, self.user.as_deref()),
        ] {
            if let Some(value) = value.and_then(one_line) {
                message.push_str(&format!("{key}: {value}\n"));
            }
        }
        message
    }

    /// The trailers of `message`: the lines of its last paragraph (never its subject); the last
    /// of a key wins, unknown keys and unreadable values are ignored.
    pub fn parse(message: &str) -> Self {
        let mut trailers = Self::default();
        let Some((_, block)) = message.trim_end().rsplit_once("\n\n") else {
            return trailers;
        };
        for line in block.lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if value.is_empty() {
                continue;
            }
            let text = Some(value.to_owned());
            match key {
                SERIAL => trailers.serial = value.parse().ok().or(trailers.serial),
                LINEAGE => trailers.lineage = text,
                RESTORED_FROM => trailers.restored_from = text,
                OPERATION => trailers.operation = text,
                LOCK_ID => trailers.lock_id = text,
                WHO => trailers.who = text,
                USER => trailers.user = text,
                _ => {}
            }
        }
        trailers
    }

    /// The value of every field as [`Self::render`] writes it: one line, trimmed, at most 200
    /// characters; empty values are absent.
    pub fn normalised(&self) -> Self {
        let clean = |value: &Option<String>| value.as_deref().and_then(one_line);
        Self {
            serial: self.serial,
            lineage: clean(&self.lineage),
            restored_from: clean(&self.restored_from),
            operation: clean(&self.operation),
            lock_id: clean(&self.lock_id),
            who: clean(&self.who),
            user: clean(&self.user),
        }
    }
}

/// The operation a commit made: Terraform's from the `Operation` trailer, else the first word
/// of the message (`write`, `delete`, `restore`, `rekey`, or whatever another tool wrote).
pub fn operation_of(message: &str) -> String {
    Trailers::parse(message)
        .operation
        .as_deref()
        .or_else(|| message.split_whitespace().next())
        .unwrap_or_default()
        .chars()
        .take(MAX_OPERATION_CHARS)
        .collect()
}

/// `message` with the trailer `State-commit: <id>` added to its trailers (a new trailer paragraph
/// when it has none): what a fold writes on the branch commit that replays the state commit
/// `id`, so the branch's history names the write it carries.
pub fn with_state_commit(message: &str, id: &str) -> String {
    with_trailer(message, STATE_COMMIT, id)
}

/// The state commit a fold replayed into this branch commit, from its `State-commit` trailer.
pub fn state_commit_of(message: &str) -> Option<String> {
    last_trailer(message, STATE_COMMIT)
}

/// `message` with the trailer `Branch: <branch>` added to its trailers: every commit the store
/// makes for a branch (a write, or the state commit a fold replays there) names it, so a copy
/// of the branch under another name can be told from the branch itself.
pub fn with_branch(message: &str, branch: &str) -> String {
    let branch = one_line(branch).unwrap_or_default();
    with_trailer(message, BRANCH, &branch)
}

/// The branch a commit was made for, from its last `Branch` trailer (a fold's replay of a state
/// commit keeps the state commit's).
pub fn branch_of(message: &str) -> Option<String> {
    last_trailer(message, BRANCH)
}

/// `message` with `key: value` added to its trailers (a new trailer paragraph when it has none).
fn with_trailer(message: &str, key: &str, value: &str) -> String {
    let body = message.trim_end();
    let has_trailers = body.rsplit_once("\n\n").is_some_and(|(_, block)| {
        block
            .lines()
            .all(|line| line.split_once(": ").is_some_and(|(key, _)| is_key(key)))
    });
    let joint = if has_trailers { "\n" } else { "\n\n" };
    format!("{body}{joint}{key}: {value}\n")
}

/// The value of the last trailer `key` of `message`.
fn last_trailer(message: &str, wanted: &str) -> Option<String> {
    let (_, block) = message.trim_end().rsplit_once("\n\n")?;
    block.lines().rev().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        let value = value.trim();
        (key == wanted && !value.is_empty()).then(|| value.to_owned())
    })
}

/// `message` with the trailer `Reads-Proved-Until: <time>` added to its trailers: what a lock
/// commit records when the process that makes it may answer the state's reads from what its
/// LOCK push proved until `until`. Every other process that writes the state under that lock,
/// or releases it, waits until then, so no read answered that way can miss a write.
pub fn with_reads_proved_until(message: &str, until: jiff::Timestamp) -> String {
    with_trailer(message, READS_PROVED_UNTIL, &until.to_string())
}

/// Until when a lock commit's maker may answer reads from its LOCK's proof (see
/// [`with_reads_proved_until`]); `None` when the message says nothing readable.
pub fn reads_proved_until(message: &str) -> Option<jiff::Timestamp> {
    last_trailer(message, READS_PROVED_UNTIL)?.parse().ok()
}

/// A trailer key as git writes one: letters, digits and dashes.
fn is_key(key: &str) -> bool {
    !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// The user recorded in a commit message, if any.
pub fn user_of(message: &str) -> Option<String> {
    Trailers::parse(message).user
}

/// Characters that end a line somewhere (git, terminals, editors): controls and every
/// whitespace but the plain space.
fn is_break(c: char) -> bool {
    c.is_control() || (c.is_whitespace() && c != ' ')
}

/// A client-chosen value as one printable, trimmed line of at most 200 characters; `None` when
/// nothing is left.
fn one_line(value: &str) -> Option<String> {
    let line: String = value
        .chars()
        .take(MAX_VALUE_CHARS)
        .map(|c| if is_break(c) { ' ' } else { c })
        .collect();
    let line = line.trim();
    (!line.is_empty()).then(|| line.to_owned())
}

#[cfg(test)]
mod tests;
