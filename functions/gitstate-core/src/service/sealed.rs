//! What the service remembers of the sealed states it opened or wrote: each one's version
//! (lineage and serial), by the id of its stored bytes (git: the blob id, see
//! [`crate::ports::Stored`]). A write's plan judges a sealed stored state by it, without opening
//! it again: no key service call, and no second round of the write.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::Version;
use crate::StateName;
use crate::ports::{Location, Refusal};

/// Most sealed states remembered (all are forgotten when it fills: a forgotten state is opened
/// again, once).
const MOST: usize = 4096;

#[derive(Default)]
pub(super) struct SealedVersions(Mutex<HashMap<String, Version>>);

impl SealedVersions {
    /// The version of the sealed state stored as `id`, if this process knows it.
    pub(super) fn get(&self, id: &str) -> Option<Version> {
        self.0.lock().ok()?.get(id).cloned()
    }

    /// The sealed state stored as `id` is `version`.
    pub(super) fn remember(&self, id: &str, version: Version) {
        if let Ok(mut known) = self.0.lock() {
            if known.len() >= MOST && !known.contains_key(id) {
                known.clear();
            }
            known.insert(id.to_owned(), version);
        }
    }
}

/// The sealed versions one write may judge by: those remembered for its state (the key binds
/// the location and name, as sealing does), and those it opened itself (by their bytes).
#[derive(Clone)]
pub(super) struct SealedView {
    versions: Arc<SealedVersions>,
    prefix: String,
    /// Sealed states this write opened, by their stored bytes.
    pub(super) opened: HashMap<Bytes, Version>,
}

impl SealedView {
    pub(super) fn new(versions: Arc<SealedVersions>, at: &Location, name: &StateName) -> Self {
        Self {
            versions,
            prefix: format!("{}\n{}\n{name}\n", at.repository, at.branch),
            opened: HashMap::new(),
        }
    }

    /// What this process wrote as `id`, sealed: `version`.
    pub(super) fn wrote(&self, id: &str, version: Version) {
        self.versions
            .remember(&format!("{}{id}", self.prefix), version);
    }

    /// The version of a sealed stored state: known by its id (this process opened or wrote it),
    /// or opened during this write (then remembered by its id). Otherwise the service must open
    /// it first ([`Refusal::Sealed`]).
    pub(super) fn version(&self, stored: &[u8], id: Option<&str>) -> Result<Version, Refusal> {
        let key = id.map(|id| format!("{}{id}", self.prefix));
        if let Some(version) = key.as_deref().and_then(|key| self.versions.get(key)) {
            return Ok(version);
        }
        let version = self
            .opened
            .get(stored)
            .cloned()
            .ok_or_else(|| Refusal::Sealed(Bytes::copy_from_slice(stored)))?;
        if let Some(key) = key {
            self.versions.remember(&key, version.clone());
        }
        Ok(version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_remembered_by_id_and_forgotten_when_full() {
        let known = SealedVersions::default();
        let version = |serial| Version {
            lineage: Some("l".into()),
            serial: Some(serial),
        };
        known.remember("a", version(1));
        assert_eq!(known.get("a").and_then(|v| v.serial), Some(1));
        assert!(known.get("b").is_none());
        for i in 0..MOST {
            known.remember(&i.to_string(), version(2));
        }
        assert!(known.get("a").is_none(), "forgotten when it filled");
        let last = (MOST - 1).to_string();
        assert_eq!(known.get(&last).and_then(|v| v.serial), Some(2));
    }
}
