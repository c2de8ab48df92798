//! Taking, releasing and listing locks; and holding one around an operation of gitstate's own.

use std::future::Future;

use bytes::Bytes;

use super::{Backend, ServiceError, clash_for};
use crate::access::{Caller, Role};
use crate::ports::{Acquire, HeldLock, Location, Release, StoreError};
use crate::trailers::Trailers;
use crate::{LockInfo, StateName, UnlockRequest};
use std::time::Duration;

/// The lock gitstate takes for an operation of its own (rekey, restore), as Terraform's lock
/// info: Terraform shows it to whoever finds the state locked.
pub(super) struct OwnLock {
    pub id: String,
    /// `OperationType…`, as Terraform names operations.
    pub operation: &'static str,
    pub info: String,
    pub who: String,
}

impl OwnLock {
    fn body(&self, name: &StateName) -> Bytes {
        let info = serde_json::json!({
            "ID": self.id,
            "Operation": self.operation,
            "Info": self.info,
            "Who": self.who,
            "Version": "",
            "Created": "",
            "Path": name.as_str(),
        });
        Bytes::from(info.to_string())
    }
}

/// The pauses before each new try of releasing gitstate's own lock after a transient failure.
const RELEASE_PAUSES: [Duration; 3] = [
    Duration::from_millis(50),
    Duration::from_millis(200),
    Duration::from_millis(800),
];

impl Backend {
    #[tracing::instrument(skip(self, caller), fields(state = %name, user = %caller.user))]
    pub async fn get_lock(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
    ) -> Result<HeldLock, ServiceError> {
        caller.require(Role::Read, name)?;
        self.store
            .read_lock(at, name)
            .await?
            .ok_or(ServiceError::NoLock)
    }

    /// Take the lock. Taking it again with the same ID succeeds, because clients retry a LOCK
    /// whose answer they did not see.
    #[tracing::instrument(skip(self, caller, body), fields(state = %name, user = %caller.user, lock_id))]
    pub async fn lock(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
        body: Bytes,
    ) -> Result<(), ServiceError> {
        caller.require(Role::Write, name)?;
        let info = LockInfo::parse_sent(body)?;
        tracing::Span::current().record("lock_id", info.id());
        let meta = self.meta(
            caller,
            Trailers::lock(Some(&info), &caller.user).render(&format!("lock {name}")),
        );
        match self.store.acquire_lock(at, name, &info, &meta).await? {
            Acquire::Acquired => Ok(()),
            // Terraform's retry of its own LOCK; the same ID from another user is not a retry.
            Acquire::Held(held)
                if held.info.id() == info.id()
                    && held.owner.as_deref() == Some(caller.user.as_str()) =>
            {
                Ok(())
            }
            Acquire::Held(held) => Err(ServiceError::Locked(held)),
            Acquire::Clash(clash) => Err(clash_for(caller, clash)),
        }
    }

    /// Release the lock. An ID must match the holder; no ID is Terraform's force-unlock.
    /// Releasing a lock nobody holds succeeds. Writers release their own locks; force-unlock
    /// and releasing another user's lock take the admin grant.
    #[tracing::instrument(skip(self, caller, body), fields(state = %name, user = %caller.user))]
    pub async fn unlock(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
        body: &[u8],
    ) -> Result<(), ServiceError> {
        caller.require(Role::Write, name)?;
        let request = UnlockRequest::parse(body)?;
        // The lock this process made, released without reading it first when the request may
        // release it; the release is conditional on it, so a lock that changed meanwhile falls
        // through to reading it.
        if let Some(held) = self.store.known_lock(at, name).await?
            && match &request {
                UnlockRequest::Id(id) => {
                    id == held.info.id() && held.owner.as_deref() == Some(caller.user.as_str())
                }
                UnlockRequest::Force => false,
            }
            && self.store.release_lock(at, name, &held).await? == Release::Released
        {
            return Ok(());
        }
        // A bounded loop: the lock can change between reading it and releasing it.
        for _ in 0..4 {
            let Some(held) = self.store.read_lock(at, name).await? else {
                // Releasing a lock that exists is always allowed (it harms nothing, and no lock
                // may get stuck); a name that cannot hold one is not "unlocked".
                if let Some(clash) = self.store.clash(at, name).await? {
                    return Err(clash_for(caller, clash));
                }
                return Ok(());
            };
            match &request {
                UnlockRequest::Id(id) if id != held.info.id() => {
                    return Err(ServiceError::LockMismatch(held));
                }
                UnlockRequest::Force => {
                    caller.require(Role::Admin, name)?;
                    tracing::warn!(holder = held.info.id(), owner = ?held.owner, "force-unlock");
                }
                UnlockRequest::Id(_) if held.owner.as_deref() != Some(caller.user.as_str()) => {
                    caller.require(Role::Admin, name)?;
                    tracing::warn!(owner = ?held.owner, "unlocking another user's lock");
                }
                UnlockRequest::Id(_) => {}
            }
            if self.store.release_lock(at, name, &held).await? == Release::Released {
                return Ok(());
            }
        }
        Err(StoreError::Contention { attempts: 4 }.into())
    }

    /// Every lock on states the caller may read (one ref advertisement, and one fetch of the
    /// lock commits not cached yet).
    #[tracing::instrument(skip(self, caller), fields(user = %caller.user))]
    pub async fn list_locks(
        &self,
        caller: &Caller,
        at: &Location,
    ) -> Result<Vec<(StateName, HeldLock)>, ServiceError> {
        let mut locks = self.store.list_locks(at).await?;
        locks.retain(|(name, _)| caller.may(Role::Read, name));
        Ok(locks)
    }

    /// Take `lock` on `name`, run `act` with its ID, and release the lock whatever `act` did:
    /// succeeded, failed, or met a failing store. An error of `act` is reported before one of
    /// the release.
    pub(super) async fn under_lock<T, F, Fut>(
        &self,
        caller: &Caller,
        at: &Location,
        name: &StateName,
        lock: OwnLock,
        act: F,
    ) -> Result<T, ServiceError>
    where
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Result<T, ServiceError>>,
    {
        let body = lock.body(name);
        self.lock(caller, at, name, body.clone()).await?;
        let outcome = act(lock.id).await;
        let mut released = self.unlock(caller, at, name, &body).await;
        // A release that met a transient failure is tried again (releasing is idempotent): a
        // lock left behind keeps every Terraform run out until someone force-unlocks it.
        for pause in RELEASE_PAUSES {
            if !matches!(
                released,
                Err(ServiceError::Store(StoreError::Unavailable(_)))
            ) {
                break;
            }
            tokio::time::sleep(pause).await;
            released = self.unlock(caller, at, name, &body).await;
        }
        if let (Ok(_), Err(error)) = (&outcome, &released) {
            tracing::error!(%error, "the operation succeeded but its lock was not released");
        }
        let outcome = outcome?;
        released?;
        Ok(outcome)
    }
}
