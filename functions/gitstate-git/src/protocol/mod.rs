//! The git protocol (v0/v1 stateless, and v2's `fetch` for blobs by id), independent of the wire
//! it travels on ([`crate::transport`]): pkt-lines, ref advertisements, fetch and push requests
//! and their answers, and [`SmartClient`], which sends them.

pub mod advert;
mod client;
pub mod fetch;
pub mod push;

pub use crate::transport::{Service, pkt};
pub use advert::{Advert, AdvertError};
pub use client::{DEFAULT_MAX_RESPONSE_BYTES, SmartClient};
pub use fetch::{Blobs, FetchError};
pub use push::{Command, PushError, PushReport, Updates, push_capabilities};

/// What this client calls itself in capability lists (`agent=…`).
pub(crate) const AGENT: &str = concat!("agent=gitstate/", env!("CARGO_PKG_VERSION"));

#[cfg(test)]
mod tests;
