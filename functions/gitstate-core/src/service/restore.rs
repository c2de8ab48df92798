//! Writing an earlier revision of a state again.

use bytes::Bytes;

use super::lock::OwnLock;
use super::state::Verb;
use super::{Backend, Selector, ServiceError, Version, WriteRequest, clash_for};
use crate::access::{Caller, Role};
use crate::ports::Location;
use crate::{ReadContext, StateName};

/// The wire type the history route answers with.
pub use crate::api::Restored;

impl Backend {
    /// Write an earlier revision again as a new one on top, under the state's lock, with its
    /// serial above the current one so Terraform takes it (admin grant). History is never
    /// rewritten; a lock held by someone else refuses the restore.
    #[tracing::instrument(skip(self, caller), fields(state = %name, user = %caller.user))]
    pub async fn restore(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
        selector: &Selector,
        read: &ReadContext,
    ) -> Result<Restored, ServiceError> {
        caller.require(Role::Admin, name)?;
        // The write below checks again against the tree it builds on; this answers before any
        // history is read.
        if let Some(clash) = self.store.clash(at, name).await? {
            return Err(clash_for(caller, clash));
        }
        let (from, old) = self.get_version(caller, at, name, selector).await?;
        let lock = OwnLock {
            id: format!("gitstate-restore-{:016x}", rand::random::<u64>()),
            operation: "OperationTypeRestore",
            info: format!("restore of revision {from}"),
            who: caller.user.clone(),
        };
        self.under_lock(caller, at, name, lock, |id| async move {
            // The current serial is read under the lock: read before it, a write landing in
            // between would leave the restore numbered as that write (two contents, one serial).
            let current = match self.store.read_state(at, name, read).await? {
                Some(stored) => Version::of(&self.open_revision(at, name, stored).await?).serial,
                None => None,
            };
            let (body, sent) = renumbered(&from, &old, current)?;
            let serial = sent.serial.unwrap_or_default();
            let request = WriteRequest::new(caller, at, name, body, read).lock_id(Some(&id));
            self.write(request, sent, Verb::Restore { from: &from })
                .await?;
            Ok(Restored { from, serial })
        })
        .await
    }
}

/// The state `old` (revision `from`) with its serial above both its own and the `current` one.
fn renumbered(
    from: &str,
    old: &[u8],
    current: Option<u64>,
) -> Result<(Bytes, Version), ServiceError> {
    let mut state: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(old)
        .map_err(|e| ServiceError::InvalidState(format!("revision {from}: {e}")))?;
    let old_serial = state.get("serial").and_then(serde_json::Value::as_u64);
    let serial = current.max(old_serial).unwrap_or(0).saturating_add(1);
    state.insert("serial".into(), serial.into());
    let body = serde_json::to_vec(&state).map_err(|e| ServiceError::InvalidState(e.to_string()))?;
    let sent = Version {
        lineage: state
            .get("lineage")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned),
        serial: Some(serial),
    };
    Ok((Bytes::from(body), sent))
}
