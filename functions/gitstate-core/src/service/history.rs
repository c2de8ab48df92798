//! A state's revisions, and reading one of them.

use bytes::Bytes;

use super::{Backend, ServiceError, Version};
use crate::StateName;
use crate::access::{Caller, Role};
use crate::ports::Location;
use crate::trailers::{Trailers, operation_of};

/// Which revision of a state a request means: a commit id, or a Terraform serial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    Version(String),
    Serial(u64),
}

impl Selector {
    pub fn parse(text: &str) -> Result<Self, ServiceError> {
        let is_hex = text.len() == 40 && text.bytes().all(|b| b.is_ascii_hexdigit());
        if is_hex {
            return Ok(Self::Version(text.to_ascii_lowercase()));
        }
        match text.parse::<u64>() {
            Ok(serial) if text.len() < 20 => Ok(Self::Serial(serial)),
            _ => Err(ServiceError::BadSelector(text.chars().take(64).collect())),
        }
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
                        Err(ServiceError::Seal(error)) => {
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

    /// Resolve a selector to a revision id: serials are looked up in the history.
    async fn resolve(
        &self,
        at: &Location,
        name: &StateName,
        selector: &Selector,
    ) -> Result<String, ServiceError> {
        let serial = match selector {
            Selector::Version(version) => return Ok(version.clone()),
            Selector::Serial(serial) => *serial,
        };
        let operator = Caller::operator("history");
        for page in 0.. {
            let (versions, more) = self.history(&operator, at, name, page, MAX_PAGE).await?;
            if let Some(found) = versions
                .iter()
                .find(|v| v.serial == Some(serial) && !v.deleted)
            {
                return Ok(found.version.clone());
            }
            if !more {
                break;
            }
        }
        Err(ServiceError::NoSuchVersion(format!("serial {serial}")))
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
