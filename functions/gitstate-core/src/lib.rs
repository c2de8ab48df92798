//! gitstate's domain: names, locks, the service rules, the ports to storage. It knows nothing
//! of HTTP frameworks, git libraries, AWS or how settings are read.

pub mod access;
pub mod api;
pub mod auth;
pub mod changes;
pub mod fold;
pub mod index;
mod lock;
mod name;
pub mod password;
pub mod ports;
pub mod protocol;
pub mod refs;
pub mod report;
pub mod scope;
pub mod secret;
pub mod service;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod trailers;
pub mod wording;

pub use lock::{LockInfo, LockInfoError, UnlockRequest};
pub use name::{BranchName, MAX_NAME_BYTES, NameError, StateName};
