//! The git store: states and locks kept in a git repository with the branch-lock protocol, over
//! smart HTTP(S) or SSH to a hosted repository or directly on an embedded local one.
//!
//! Layers, each using only those below it: [`transport`] (the wire: HTTP or SSH) →
//! [`protocol`] (pkt-lines, advertisements, fetch, push) → the repository (`repository`: the
//! cache, packs, the state index, the embedded repository's refs) → `store` ([`GitStore`]).
//!
//! Errors follow the layers: the wire's ([`transport::Error`]) is the source of each exchange's
//! ([`protocol::AdvertError`], [`protocol::FetchError`], [`protocol::PushError`]); those and the
//! cache's ([`RepositoryError`]) are the source of [`RemoteError`], which every store operation
//! stands on; each operation has its own ([`ReadError`], [`LockError`], …), mapped once onto
//! the core's `StoreError`.

pub mod protocol;
mod repository;
mod settings;
mod store;
mod sync;
pub mod transport;

pub use repository::{Corruption, Error as RepositoryError};
pub use settings::{GitAuth, GitSettings, MAX_PROOF_WINDOW, StateRefs};
pub use store::{
    Broken, FoldError, GitStore, HistoryError, Holder, ListError, LockError, OpenError, ReadError,
    RemoteError, StoreOptions, UnlockError, WriteError, WriteMode,
};
