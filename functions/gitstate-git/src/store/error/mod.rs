//! The store's errors: [`RemoteError`], what reaching one remote and its cache fails with (the
//! layer every operation stands on), one error per operation ([`ReadError`], [`ListError`],
//! [`LockError`], [`UnlockError`], [`HistoryError`], [`WriteError`], [`FoldError`],
//! [`OpenError`]), and the one mapping of each onto the core's `StoreError` (the `class`
//! module).

mod class;
mod ops;
mod remote;
#[cfg(test)]
mod tests;

pub use ops::{
    Broken, FoldError, HistoryError, ListError, LockError, OpenError, ReadError, UnlockError,
    WriteError,
};
pub use remote::RemoteError;
