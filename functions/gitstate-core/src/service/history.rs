//! A state's revisions, and reading one of them.

use bytes::Bytes;

use super::rekey::REKEY_OPERATION;
use super::{Backend, ServiceError, Version};
use crate::StateName;
use crate::access::{Caller, Role};
use crate::ports::Location;
use crate::trailers::{Trailers, operation_of};

/// Which revision of a state a request means: a commit id (whole, or any unique prefix of
/// [`MIN_PREFIX`] hex digits or more, as `git` abbreviates them), or a Terraform serial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// A whole commit id: read as it is.
    Version(String),
    /// The start of a commit id: the one revision of the state it begins.
    Prefix(String),
    Serial(u64),
    /// Decimal digits that can be both (7 to 19 of them): whichever one revision they name.
    SerialOrPrefix(u64, String),
}

/// The fewest hex digits a commit id may be given by (`git`'s default abbreviation).
pub const MIN_PREFIX: usize = 7;

/// The hex digits of a whole commit id.
const FULL_ID: usize = 40;

impl Selector {
    pub fn parse(text: &str) -> Result<Self, ServiceError> {
        let bad = || ServiceError::BadSelector(text.chars().take(64).collect());
        let decimal = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
        let hex = !text.is_empty() && text.bytes().all(|b| b.is_ascii_hexdigit());
        let serial = || text.parse::<u64>().ok().filter(|_| text.len() < 20);
        match text.len() {
            FULL_ID if hex => Ok(Self::Version(text.to_ascii_lowercase())),
            n if decimal && n < MIN_PREFIX => serial().map(Self::Serial).ok_or_else(bad),
            n if decimal && n < FULL_ID => Ok(match serial() {
                Some(serial) => Self::SerialOrPrefix(serial, text.to_owned()),
                None => Self::Prefix(text.to_owned()),
            }),
            n if hex && (MIN_PREFIX..FULL_ID).contains(&n) => {
                Ok(Self::Prefix(text.to_ascii_lowercase()))
            }
            _ => Err(bad()),
        }
    }
}

/// The one id of `ids` that starts with `prefix`: none is `Ok(None)`, several an error naming
/// the prefix and how many.
pub fn match_prefix<'a>(
    prefix: &str,
    ids: impl IntoIterator<Item = &'a str>,
) -> Result<Option<&'a str>, ServiceError> {
    let mut found: Vec<&str> = ids
        .into_iter()
        .filter(|id| id.starts_with(prefix))
        .collect();
    found.sort_unstable();
    found.dedup();
    match found.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one)),
        many => Err(ServiceError::AmbiguousVersion {
            prefix: prefix.to_owned(),
            count: many.len(),
        }),
    }
}

/// The wire type the history route answers with.
pub use crate::api::VersionInfo;

/// Most revisions one history page lists.
pub const MAX_PAGE: usize = 100;

impl Backend {
    /// One page of a state's revisions, newest first (read grant).
    #[tracing::instrument(skip(self, caller), fields(state = %name, user = %caller.user))]
    pub async fn history(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
        page: usize,
        per_page: usize,
    ) -> Result<(Vec<VersionInfo>, bool), ServiceError> {
        caller.require(Role::Read, name)?;
        let per_page = per_page.clamp(1, MAX_PAGE);
        let found = self
            .store
            .history(at, name, page.saturating_mul(per_page), per_page)
            .await?;
        let mut versions = Vec::with_capacity(found.revisions.len());
        for revision in found.revisions {
            let trailers = Trailers::parse(&revision.message);
            let (mut serial, mut lineage) = (trailers.serial, trailers.lineage);
            if serial.is_none() && !revision.deleted {
                // Written by another tool: look at the content itself.
                if let Some(bytes) = self.store.read_version(at, name, &revision.version).await? {
                    match self.open_revision(at, name, bytes).await {
                        Ok(bytes) => {
                            let version = Version::of(&bytes);
                            (serial, lineage) = (version.serial, version.lineage);
                        }
                        // Listed without a serial; reading that version reports the failure.
                        Err(error @ (ServiceError::Seal(_) | ServiceError::SealedWithoutKeys)) => {
                            tracing::warn!(version = %revision.version, error = %error, "a version does not open: listed without a serial");
                        }
                        Err(other) => return Err(other),
                    }
                }
            }
            let operation = operation_of(&revision.message);
            versions.push(VersionInfo {
                version: revision.version,
                time: revision.time,
                author: revision.author,
                operation,
                serial,
                lineage,
                deleted: revision.deleted,
                restored_from: trailers.restored_from,
            });
        }
        Ok((versions, found.more))
    }

    /// Resolve a selector to a revision id: serials and prefixes are looked up in the history.
    async fn resolve(
        &self,
        at: &Location,
        name: &StateName,
        selector: &Selector,
    ) -> Result<String, ServiceError> {
        let (serial, prefix) = match selector {
            Selector::Version(version) => return Ok(version.clone()),
            Selector::Serial(serial) => (Some(*serial), None),
            Selector::Prefix(prefix) => (None, Some(prefix.as_str())),
            Selector::SerialOrPrefix(serial, prefix) => (Some(*serial), Some(prefix.as_str())),
        };
        let by_prefix = match prefix {
            Some(prefix) => self.by_prefix(at, name, prefix).await?,
            None => None,
        };
        let by_serial = match serial {
            Some(serial) => self.by_serial(at, name, serial).await?,
            None => Vec::new(),
        };
        match (by_prefix, by_serial.as_slice()) {
            // Which of them the caller means is theirs to say, whatever a prefix matched too.
            (_, [_, _, ..]) => Err(ServiceError::SharedSerial {
                serial: serial.unwrap_or_default(),
                state: name.as_str().to_owned(),
                revisions: by_serial,
            }),
            (Some(a), [b]) if a != *b => Err(ServiceError::AmbiguousVersion {
                prefix: prefix.unwrap_or_default().to_owned(),
                count: 2,
            }),
            (Some(found), _) => Ok(found),
            (None, [found]) => Ok(found.clone()),
            (None, []) => Err(ServiceError::NoSuchVersion(match (prefix, serial) {
                (Some(prefix), _) => prefix.to_owned(),
                (None, serial) => format!("serial {}", serial.unwrap_or_default()),
            })),
        }
    }

    /// Every revision holding `serial` that is not a removal, newest first. The whole history
    /// (as deep as the store reads it) is walked: a serial is no order once a state was pushed
    /// back to an older one or given a new lineage, so a holder may lie anywhere. A rekey
    /// rewrites the state it finds, serial and all, under the rekey's lock: the revision just
    /// below it holds the same state, so only the rekey (sealed under the current keys) counts.
    async fn by_serial(
        &self,
        at: &Location,
        name: &StateName,
        serial: u64,
    ) -> Result<Vec<String>, ServiceError> {
        let operator = Caller::operator("history");
        let mut holders = Vec::new();
        // Whether the revision just newer than the one looked at is a rekey holding `serial`.
        let mut below_rekey = false;
        for page in 0.. {
            let (versions, more) = self.history(&operator, at, name, page, MAX_PAGE).await?;
            for v in versions {
                let holds = v.serial == Some(serial) && !v.deleted;
                if holds && !below_rekey {
                    holders.push(v.version);
                }
                below_rekey = holds && v.operation == REKEY_OPERATION;
            }
            if !more {
                break;
            }
        }
        Ok(holders)
    }

    /// The one revision of the state whose id starts with `prefix`: the whole history (as deep
    /// as the store reads it) is walked, since a second match anywhere makes it ambiguous.
    async fn by_prefix(
        &self,
        at: &Location,
        name: &StateName,
        prefix: &str,
    ) -> Result<Option<String>, ServiceError> {
        let mut matches = Vec::new();
        for page in 0usize.. {
            let found = self
                .store
                .history(at, name, page.saturating_mul(MAX_PAGE), MAX_PAGE)
                .await?;
            matches.extend(
                found
                    .revisions
                    .into_iter()
                    .map(|r| r.version)
                    .filter(|v| v.starts_with(prefix)),
            );
            if !found.more {
                break;
            }
        }
        Ok(match_prefix(prefix, matches.iter().map(String::as_str))?.map(str::to_owned))
    }

    /// The state as one revision left it (read grant).
    #[tracing::instrument(skip(self, caller), fields(state = %name, user = %caller.user))]
    pub async fn get_version(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
        selector: &Selector,
    ) -> Result<(String, Bytes), ServiceError> {
        caller.require(Role::Read, name)?;
        let version = self.resolve(at, name, selector).await?;
        let stored = self
            .store
            .read_version(at, name, &version)
            .await?
            .ok_or_else(|| ServiceError::NoSuchVersion(version.clone()))?;
        Ok((version, self.open_revision(at, name, stored).await?))
    }
}
