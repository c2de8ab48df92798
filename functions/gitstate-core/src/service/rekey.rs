//! Sealing a state again under the configured keys.

use super::lock::OwnLock;
use super::state::Verb;
use super::{Backend, ServiceError, Version, WriteRequest};
use crate::access::{Caller, Role};
use crate::ports::{Location, Protection};
use crate::{ReadContext, StateName};

/// The operation a rekey's commit records (its lock's): the state it found, sealed again.
pub(super) const REKEY_OPERATION: &str = "OperationTypeRekey";

/// What `rekey` did to one state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rekeyed {
    /// Already sealed under exactly the configured keys.
    Current,
    /// Rewritten; it was stored as `from`.
    Rewritten {
        from: &'static str,
    },
    Missing,
}

impl Backend {
    /// Re-encrypt one state under the configured keys, holding its lock so it never races
    /// Terraform. A state already sealed exactly so is left alone.
    #[tracing::instrument(skip(self, caller), fields(state = %name, user = %caller.user))]
    pub async fn rekey(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
        read: &ReadContext,
    ) -> Result<Rekeyed, ServiceError> {
        caller.require(Role::Admin, name)?;
        let encryption = self
            .encryption
            .as_ref()
            .filter(|e| e.sealer.seals())
            .ok_or(ServiceError::NoKeys)?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let lock = OwnLock {
            id: format!("rekey-{nanos:x}-{}", std::process::id()),
            operation: REKEY_OPERATION,
            info: "gitstate rekey".into(),
            who: format!("{}@gitstate", caller.user),
        };
        self.under_lock(caller, at, name, lock, |id| async move {
            let Some(stored) = self.store.read_state(at, name, read).await? else {
                return Ok(Rekeyed::Missing);
            };
            let opened = encryption.sealer.open(stored, at, name).await?;
            if opened.protection == Protection::Current {
                return Ok(Rekeyed::Current);
            }
            let sent = Version::of(&opened.plaintext);
            let request =
                WriteRequest::new(caller, at, name, opened.plaintext, read).lock_id(Some(&id));
            self.write(request, sent, Verb::Rekey).await?;
            Ok(Rekeyed::Rewritten {
                from: opened.format,
            })
        })
        .await
    }
}
