//! The embedded default: the "remote" is a local bare repository, updated with ref transactions
//! that have the same create-only and compare-and-swap semantics a git server gives a push.

use std::sync::{Arc, Mutex};

use gix::ObjectId;
use gix::refs::Target;
use gix::refs::transaction::{Change, LogChange, PreviousValue, RefEdit, RefLog};

use crate::Error;
use crate::cache::Cache;
use crate::smart::{Advert, Command, PushReport};

pub struct LocalRefs {
    repo: Arc<Cache>,
    /// Serialises transactions of this process; other processes are held off by git's lock files.
    serial: Mutex<()>,
}

impl LocalRefs {
    pub fn new(repo: Arc<Cache>) -> Self {
        Self {
            repo,
            serial: Mutex::new(()),
        }
    }

    /// The current tips of `names` (missing refs are left out), with the capabilities a push here has.
    pub fn list(&self, names: &[String]) -> Result<Advert, Error> {
        let repo = self.repo.repo()?;
        let mut advert = Advert {
            caps: ["report-status", "delete-refs", "atomic"]
                .map(str::to_owned)
                .to_vec(),
            ..Advert::default()
        };
        for name in names {
            if let Some(mut reference) = repo.try_find_reference(name.as_str())? {
                let id = reference.peel_to_id()?.detach();
                advert.refs.insert(name.clone(), id);
            }
        }
        Ok(advert)
    }

    /// Every reference under `prefix` (e.g. `refs/heads/locks/`), as an advertisement.
    pub fn list_prefix(&self, prefix: &str) -> Result<Advert, Error> {
        let repo = self.repo.repo()?;
        let mut advert = Advert::default();
        let platform = repo
            .references()
            .map_err(|e| Error::Corrupt(format!("listing references: {e}")))?;
        let all = platform
            .prefixed(prefix)
            .map_err(|e| Error::Corrupt(format!("listing references: {e}")))?;
        for reference in all {
            let mut reference =
                reference.map_err(|e| Error::Corrupt(format!("reading a reference: {e}")))?;
            let name = reference.name().as_bstr().to_string();
            let id = reference.peel_to_id()?.detach();
            advert.refs.insert(name, id);
        }
        Ok(advert)
    }

    /// Apply `commands` in one transaction: all succeed, or none does and each is reported `ng`.
    pub fn push(&self, commands: &[Command]) -> Result<PushReport, Error> {
        let _serial = self
            .serial
            .lock()
            .map_err(|_| Error::Corrupt("local ref lock poisoned".into()))?;
        let repo = self.repo.repo()?;
        let edits = commands
            .iter()
            .map(|c| -> Result<RefEdit, Error> {
                let name = c
                    .name
                    .as_str()
                    .try_into()
                    .map_err(|_| Error::Protocol(format!("invalid ref name {}", c.name)))?;
                let change = if c.new.is_null() {
                    Change::Delete {
                        expected: PreviousValue::MustExistAndMatch(Target::Object(c.old)),
                        log: RefLog::AndReference,
                    }
                } else {
                    Change::Update {
                        log: LogChange::default(),
                        expected: if c.old.is_null() {
                            PreviousValue::MustNotExist
                        } else {
                            PreviousValue::MustExistAndMatch(Target::Object(c.old))
                        },
                        new: Target::Object(c.new),
                    }
                };
                Ok(RefEdit {
                    change,
                    name,
                    deref: false,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let verdict = match repo.edit_references(edits) {
            Ok(_) => Ok(()),
            Err(error) => {
                // Decide from the refs, not from the error text: if any expectation no longer
                // holds, this is a lost race; otherwise something else broke.
                let names: Vec<String> = commands.iter().map(|c| c.name.clone()).collect();
                let now = self.list(&names)?;
                let raced = commands
                    .iter()
                    .any(|c| now.tip(&c.name).unwrap_or(ObjectId::null(c.old.kind())) != c.old);
                if !raced {
                    return Err(error.into());
                }
                Err("failed to update ref".to_owned())
            }
        };
        Ok(PushReport {
            refs: commands
                .iter()
                .map(|c| (c.name.clone(), verdict.clone()))
                .collect(),
        })
    }
}
