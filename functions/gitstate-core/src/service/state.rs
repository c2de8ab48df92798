//! Reading, writing and deleting states.

use std::sync::Arc;

use bytes::Bytes;

use super::sealed::SealedView;
use super::{Backend, MAX_OPENS, ServiceError, Version, clash_for, refused};
use crate::access::{Caller, Role};
use crate::ports::{
    Beside, Change, CommitMeta, HeldLock, Location, Refusal, StoreError, Stored, WritePlan, Written,
};
use crate::trailers::Trailers;
use crate::{BranchName, ReadContext, StateName};

/// A state to write: who writes what, where, under which lock, within which request. (No
/// `Debug`: the body is the state, secrets included.)
pub struct WriteRequest<'a> {
    pub caller: &'a Caller,
    pub at: &'a Location,
    pub name: &'a StateName,
    /// Terraform's `?ID=`: present when it holds the lock.
    pub lock_id: Option<&'a str>,
    /// The state, as Terraform sent it.
    pub body: Bytes,
    /// What the store's reads before the write (the branch's status) may reuse.
    pub read: &'a ReadContext,
}

impl<'a> WriteRequest<'a> {
    /// A write without a lock ID.
    pub fn new(
        caller: &'a Caller,
        at: &'a Location,
        name: &'a StateName,
        body: Bytes,
        read: &'a ReadContext,
    ) -> Self {
        Self {
            caller,
            at,
            name,
            lock_id: None,
            body,
            read,
        }
    }

    /// The same write, made holding the lock `lock_id` (`None`: without a lock).
    pub fn lock_id(self, lock_id: Option<&'a str>) -> Self {
        Self { lock_id, ..self }
    }
}

impl Backend {
    #[tracing::instrument(skip(self, caller), fields(state = %name, user = %caller.user))]
    pub async fn get_state(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
        read: &ReadContext,
    ) -> Result<Bytes, ServiceError> {
        caller.require(Role::Read, name)?;
        let Some(stored) = self.store.read_state(at, name, read).await? else {
            // "No state" only where the branch is there (or may be created), and only for a
            // name that is no folder of states and lies below none: Terraform pointed at one
            // would plan against nothing.
            self.require_branch(at, read).await?;
            if let Some(clash) = self.store.clash_seen(at, name).await? {
                return Err(clash_for(caller, clash));
            }
            self.absent_here(at, name, read).await?;
            return Err(ServiceError::NotFound);
        };
        self.branch_seen(at);
        let state = self.open(at, name, stored).await?.plaintext;
        check_stored(&state)?;
        Ok(state)
    }

    /// For a read of `name` at `at` that found no state: refuse it when `elsewhere`, another
    /// branch of the same repository, holds a state by that name (one look at that branch,
    /// reusing what `read` allows).
    pub async fn absent_beside(
        &self,
        at: &Location,
        name: &StateName,
        elsewhere: &BranchName,
        read: &ReadContext,
    ) -> Result<(), ServiceError> {
        if *elsewhere == at.branch {
            return Ok(());
        }
        let other = Location {
            repository: at.repository.clone(),
            branch: elsewhere.clone(),
        };
        match self.store.read_state(&other, name, read).await? {
            Some(_) => Err(ServiceError::OnAnotherBranch {
                name: name.to_string(),
                branch: at.branch.as_str().to_owned(),
                elsewhere: elsewhere.as_str().to_owned(),
            }),
            None => Ok(()),
        }
    }

    /// Write a state, under the lock rule (`lock_id` must be the holder's) and the stale-serial
    /// rule.
    #[tracing::instrument(skip(self, request), fields(state = %request.name, user = %request.caller.user, bytes = request.body.len()))]
    pub async fn put_state(&self, request: WriteRequest<'_>) -> Result<(), ServiceError> {
        request.caller.require(Role::Write, request.name)?;
        let sent = check_state(&request.body)?;
        let unlocked = request.lock_id.is_none();
        self.write(request, sent, Verb::Write).await?;
        if unlocked {
            warn_unlocked("write");
        }
        Ok(())
    }

    /// Seal the body and write it, under the lock and stale-serial rules. The stored state the
    /// rules compare against may be sealed: the plan then asks for it to be opened, and the write
    /// is tried again knowing its version.
    pub(super) async fn write(
        &self,
        request: WriteRequest<'_>,
        sent: Version,
        verb: Verb<'_>,
    ) -> Result<(), ServiceError> {
        let WriteRequest {
            caller,
            at,
            name,
            lock_id,
            body,
            read,
        } = request;
        self.require_branch(at, read).await?;
        self.states_here(at, Beside::Remembered, read).await?;
        if lock_id.is_none() && self.unlocked_writes {
            self.require_protocol(at).await?;
        }
        let sealing = self.encryption.as_ref().is_some_and(|e| e.sealer.seals());
        let body = match &self.encryption {
            Some(e) if sealing => e.sealer.seal(&body, at, name).await?,
            _ => body,
        };
        let mut sealed = SealedView::new(self.sealed.clone(), at, name);
        for _ in 0..MAX_OPENS {
            let plan = self.write_plan(caller, name, lock_id, &sent, verb, sealed.clone());
            match self
                .store
                .write_state(at, name, Change::Put(body.clone()), plan)
                .await?
            {
                Written::Committed {
                    content: Some(id), ..
                } if sealing => {
                    // What this process wrote, sealed: the next write's plan knows it by its id.
                    sealed.wrote(&id, sent.clone());
                    return Ok(());
                }
                Written::Committed { .. } | Written::Unchanged => return Ok(()),
                Written::Refused(Refusal::Sealed(stored)) => {
                    let opened = match verb {
                        // rekey rewrites what enforcement would refuse
                        Verb::Rekey => match &self.encryption {
                            Some(e) => e.sealer.open(stored.clone(), at, name).await?,
                            None => return Err(ServiceError::NoKeys),
                        },
                        Verb::Write | Verb::Restore { .. } => {
                            self.open(at, name, stored.clone()).await?
                        }
                    };
                    sealed.opened.insert(stored, Version::of(&opened.plaintext));
                }
                Written::Refused(refusal) => return Err(refused(caller, refusal)),
            }
        }
        Err(StoreError::Contention {
            attempts: MAX_OPENS,
        }
        .into())
    }

    /// The store's plan for one attempt: the lock rule, the stale-serial rule against the stored
    /// state (`sealed`: the versions of sealed states it may judge by), and the commit.
    fn write_plan(
        &self,
        caller: &Caller,
        name: &StateName,
        lock_id: Option<&str>,
        sent: &Version,
        verb: Verb<'_>,
        sealed: SealedView,
    ) -> WritePlan {
        let base = self.meta(caller, String::new());
        let user = caller.user.clone();
        let lock_id = lock_id.map(str::to_owned);
        let unlocked = self.unlocked_writes;
        let serial = sent.serial.map(|s| format!(" (serial {s})"));
        let subject = format!("{} {name}{}", verb.as_str(), serial.unwrap_or_default());
        let restored_from = verb.restored_from();
        let sent = sent.clone();
        let looks_sealed = self.looks_sealed;
        let (sealer, enforced) = match &self.encryption {
            Some(e) => (Some(e.sealer.clone()), e.enforced && verb == Verb::Write),
            None => (None, false),
        };
        Arc::new(move |lock: Option<&HeldLock>, stored: Option<Stored<'_>>| {
            let holder = admit(lock, lock_id.as_deref(), &user, unlocked)?;
            if let Some(Stored {
                content: stored,
                id,
            }) = stored
            {
                let current = match &sealer {
                    Some(sealer) if sealer.is_sealed(stored) => sealed.version(stored, id)?,
                    Some(_) if enforced => {
                        return Err(Refusal::Unprotected {
                            format: "unencrypted",
                        });
                    }
                    // No keys here: opening it says so (it has no serial to compare).
                    None if looks_sealed(stored) => {
                        return Err(Refusal::Sealed(Bytes::copy_from_slice(stored)));
                    }
                    _ => Version::of(stored),
                };
                if let Some(stored) = stale(&current, &sent) {
                    return Err(Refusal::Stale {
                        stored,
                        sent: sent.serial.unwrap_or_default(),
                    });
                }
            }
            Ok(CommitMeta {
                message: Trailers {
                    serial: sent.serial,
                    lineage: sent.lineage.clone(),
                    restored_from: restored_from.clone(),
                    ..Trailers::lock(holder.map(|held| &held.info), &user)
                }
                .render(&subject),
                ..base.clone()
            })
        })
    }

    /// Remove a state file (Terraform itself never does; administrators may).
    #[tracing::instrument(skip(self, caller), fields(state = %name, user = %caller.user))]
    pub async fn delete_state(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
        lock_id: Option<&str>,
        read: &ReadContext,
    ) -> Result<(), ServiceError> {
        caller.require(Role::Admin, name)?;
        self.require_branch(at, read).await?;
        if lock_id.is_none() && self.unlocked_writes {
            self.require_protocol(at).await?;
        }
        let base = self.meta(caller, String::new());
        let user = caller.user.clone();
        let unlocked = lock_id.is_none();
        let (subject, lock_id) = (format!("delete {name}"), lock_id.map(str::to_owned));
        let allowed = self.unlocked_writes;
        let plan = Arc::new(move |lock: Option<&HeldLock>, stored: Option<Stored<'_>>| {
            let holder = admit(lock, lock_id.as_deref(), &user, allowed)?;
            if stored.is_none() {
                return Err(Refusal::NotFound);
            }
            Ok(CommitMeta {
                message: Trailers::lock(holder.map(|held| &held.info), &user).render(&subject),
                ..base.clone()
            })
        });
        match self
            .store
            .write_state(at, name, Change::Delete, plan)
            .await?
        {
            Written::Committed { .. } | Written::Unchanged => {
                if unlocked {
                    warn_unlocked("delete");
                }
                Ok(())
            }
            Written::Refused(refusal) => Err(refused(caller, refusal)),
        }
    }
}

/// The warning every write let through without a lock leaves (`GITSTATE_ALLOW_UNLOCKED_WRITES`);
/// it is logged inside the request's span, which names the state and the user.
fn warn_unlocked(what: &str) {
    tracing::warn!(
        "unlocked {what} accepted (GITSTATE_ALLOW_UNLOCKED_WRITES=true): nothing kept another writer out"
    );
}

/// Check that a body is a JSON object without building a tree of the whole document (states
/// can be large), and read its lineage and serial.
fn check_state(body: &[u8]) -> Result<Version, ServiceError> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ServiceError::InvalidState(
            "the top level must be an object".into(),
        ));
    }
    let top: TopLevel =
        serde_json::from_slice(body).map_err(|e| ServiceError::InvalidState(e.to_string()))?;
    if top.id.is_some() && top.operation.is_some() {
        return Err(ServiceError::LockRequestToState(
            "a LockInfo was sent as the state",
        ));
    }
    if !nesting_within(body, MAX_STATE_DEPTH) {
        return Err(ServiceError::InvalidState(format!(
            "nesting deeper than {MAX_STATE_DEPTH} levels"
        )));
    }
    Ok(serde_json::from_slice(body).unwrap_or_default())
}

/// The top-level members of a body that tell a LockInfo (`ID`, `Operation`) from a state, read
/// without building the document.
#[derive(serde::Deserialize)]
struct TopLevel {
    #[serde(rename = "ID")]
    id: Option<serde::de::IgnoredAny>,
    #[serde(rename = "Operation")]
    operation: Option<serde::de::IgnoredAny>,
}

/// A stored state must be a JSON object (checked at its ends; the write checked it whole): an
/// empty file or other bytes are an error, never "no state".
pub(crate) fn check_stored(state: &[u8]) -> Result<(), ServiceError> {
    let text = state.trim_ascii();
    if text.is_empty() {
        return Err(ServiceError::NotAState("the file is empty"));
    }
    if text.first() != Some(&b'{') || text.last() != Some(&b'}') {
        return Err(ServiceError::NotAState("the file is not a JSON object"));
    }
    Ok(())
}

/// What a write is for: the subject of its commit, and the rules it is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verb<'a> {
    /// Terraform's write: refused over a state that is not under the keys when that is enforced.
    Write,
    /// Sealing again what is stored; opens what enforcement would refuse.
    Rekey,
    /// Writing the content of revision `from` again.
    Restore { from: &'a str },
}

impl Verb<'_> {
    fn as_str(self) -> &'static str {
        match self {
            Self::Write => "write",
            Self::Rekey => "rekey",
            Self::Restore { .. } => "restore",
        }
    }

    fn restored_from(self) -> Option<String> {
        match self {
            Self::Restore { from } => Some(from.to_owned()),
            Self::Write | Self::Rekey => None,
        }
    }
}

/// The serial of the stored state when it is newer than the sent one of the same lineage (a
/// state without lineage or serial is never stale).
fn stale(stored: &Version, sent: &Version) -> Option<u64> {
    let (Some(lineage), Some(serial)) = (&sent.lineage, sent.serial) else {
        return None;
    };
    let newer = stored.serial.filter(|s| *s > serial)?;
    (stored.lineage.as_ref() == Some(lineage)).then_some(newer)
}

/// The lock rule for writes: with an ID, it must be the holder's and the lock `user`'s own;
/// without one, nobody may hold it, and the deployment must allow `unlocked` writes.
fn admit<'a>(
    lock: Option<&'a HeldLock>,
    id: Option<&str>,
    user: &str,
    unlocked: bool,
) -> Result<Option<&'a HeldLock>, Refusal> {
    match (lock, id) {
        // The holder's ID from another user (administrators too: they force-unlock first).
        (Some(held), Some(id)) if held.info.id() == id && held.owner.as_deref() != Some(user) => {
            Err(Refusal::Locked(held.clone()))
        }
        (Some(held), Some(id)) if held.info.id() == id => Ok(Some(held)),
        (Some(held), Some(_)) => Err(Refusal::LockMismatch(held.clone())),
        (None, Some(id)) => Err(Refusal::NotLocked { id: id.to_owned() }),
        (Some(held), None) => Err(Refusal::Locked(held.clone())),
        (None, None) if unlocked => Ok(None),
        (None, None) => Err(Refusal::Unlocked),
    }
}

/// Deepest nesting accepted in a state: serde_json's own limit, which refused deeper states while
/// they were parsed into a tree. Skipping a value (`IgnoredAny`) has no limit.
const MAX_STATE_DEPTH: usize = 128;

/// Whether the arrays and objects of a (valid) JSON document nest at most `max` deep; one pass,
/// no tree.
fn nesting_within(json: &[u8], max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &byte in json {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > max {
                    return false;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_is_bounded_outside_strings() {
        let deep = |n: usize| format!("{}1{}", r#"{"a":"#.repeat(n), "}".repeat(n));
        assert!(nesting_within(
            deep(MAX_STATE_DEPTH).as_bytes(),
            MAX_STATE_DEPTH
        ));
        assert!(!nesting_within(
            deep(MAX_STATE_DEPTH + 1).as_bytes(),
            MAX_STATE_DEPTH
        ));
        let brackets_in_strings = format!(r#"{{"s":"{}\"{}"}}"#, "[{".repeat(500), "{".repeat(9));
        assert!(nesting_within(brackets_in_strings.as_bytes(), 2));
    }
}
