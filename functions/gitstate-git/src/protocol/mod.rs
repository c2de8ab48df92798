//! The git protocol (v0/v1 stateless, and v2's `fetch` for blobs by id), independent of the wire
//! it travels on: pkt-lines, ref advertisements, fetch and push requests and their answers.

mod advert;
pub mod pkt;

pub use advert::Advert;

/// What this client calls itself in capability lists (`agent=…`).
pub(crate) const AGENT: &str = concat!("agent=gitstate/", env!("CARGO_PKG_VERSION"));

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    UploadPack,
    ReceivePack,
}

impl Service {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::UploadPack => "git-upload-pack",
            Self::ReceivePack => "git-receive-pack",
        }
    }
}
