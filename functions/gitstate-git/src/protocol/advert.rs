//! Ref advertisements: tips and capabilities.

use gix::ObjectId;
use std::collections::HashMap;

use super::Service;
use super::pkt;
use crate::transport;
use crate::transport::http::strip_announcement;

/// Why an advertisement could not be read: a ref line that is not one (the remote's fault, not
/// transient), or the wire.
#[derive(Debug, thiserror::Error)]
pub enum AdvertError {
    #[error("git protocol error: ref advertisement is not UTF-8")]
    NotUtf8,
    #[error("git protocol error: malformed ref line")]
    MalformedLine,
    #[error("git protocol error: malformed object id")]
    MalformedId,
    /// The request itself, its pkt-lines, or smart HTTP's service announcement.
    #[error(transparent)]
    Wire(#[from] transport::Error),
}

impl AdvertError {
    /// The wire's failure, if that is what this is.
    pub fn wire(&self) -> Option<&transport::Error> {
        match self {
            Self::Wire(wire) => Some(wire),
            Self::NotUtf8 | Self::MalformedLine | Self::MalformedId => None,
        }
    }

    /// What the wire said was a refusal of the host's (see [`transport::Error::refused`]).
    pub fn refused(&self) -> bool {
        self.wire().is_some_and(transport::Error::refused)
    }

    /// The advertisement, or what carried it, is not git's protocol.
    pub fn garbled(&self) -> bool {
        match self {
            Self::NotUtf8 | Self::MalformedLine | Self::MalformedId => true,
            Self::Wire(wire) => wire.garbled(),
        }
    }
}

/// Ref tips and capabilities, as a server advertises them (or the local repository reports them).
#[derive(Debug, Clone, Default)]
pub struct Advert {
    pub refs: HashMap<String, ObjectId>,
    pub caps: Vec<String>,
}

impl Advert {
    pub fn tip(&self, name: &str) -> Option<ObjectId> {
        self.refs.get(name).copied()
    }

    /// Whether this is a receive-pack advertisement (the only kind that offers
    /// `report-status`), which names no `HEAD`.
    pub fn is_for_pushes(&self) -> bool {
        self.has_cap("report-status")
    }

    pub fn has_cap(&self, cap: &str) -> bool {
        self.caps
            .iter()
            .any(|c| c == cap || c.split('=').next() == Some(cap))
    }

    /// Parse the body of `GET info/refs?service=…` (the service announcement, then the refs).
    pub fn parse(body: &[u8], service: Service) -> Result<Self, AdvertError> {
        Self::parse_refs(strip_announcement(body, service)?)
    }

    /// Parse the refs and capabilities of an advertisement, up to the flush that ends them.
    pub fn parse_refs(body: &[u8]) -> Result<Self, AdvertError> {
        let mut reader = pkt::Reader::new(body);
        let mut advert = Advert::default();
        let mut first_ref = true;
        while let Some(line) = reader.next_line()? {
            let (line, caps) = match line.iter().position(|b| *b == 0) {
                Some(nul) => (&line[..nul], Some(&line[nul + 1..])),
                None => (line, None),
            };
            if let (true, Some(caps)) = (first_ref, caps) {
                advert.caps = String::from_utf8_lossy(caps)
                    .split(' ')
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned)
                    .collect();
            }
            first_ref = false;
            let text = std::str::from_utf8(line).map_err(|_| AdvertError::NotUtf8)?;
            let (oid, name) = text.split_once(' ').ok_or(AdvertError::MalformedLine)?;
            if name == "capabilities^{}" || name.ends_with("^{}") {
                continue;
            }
            let oid = ObjectId::from_hex(oid.as_bytes()).map_err(|_| AdvertError::MalformedId)?;
            advert.refs.insert(name.to_owned(), oid);
        }
        Ok(advert)
    }
}
