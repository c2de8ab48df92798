//! Fetch (upload-pack): packs of wanted commits, shallow or deepened, with or without their
//! blobs, and packs of blobs by id.

use gix::ObjectId;

use super::{AGENT, pkt};
use crate::transport;

/// What a fetch asks for: of the capabilities it can use, those the upload-pack advertisement
/// offered; none when this process has not seen one (the caller makes sure that only happens
/// when whole history is fine, see [`super::SmartClient::knows_fetch_capabilities`]). `filter` only for
/// a partial fetch, and only when offered.
pub(crate) fn fetch_capabilities(caps: Option<&[String]>, partial: bool) -> Vec<&'static str> {
    [
        "side-band-64k",
        "ofs-delta",
        "shallow",
        "no-progress",
        "filter",
    ]
    .into_iter()
    .filter(|cap| partial || *cap != "filter")
    .filter(|cap| caps.is_some_and(|caps| caps.iter().any(|c| c == cap)))
    .chain([AGENT])
    .collect()
}

/// Whether a fetch of commits brings their blobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blobs {
    /// Every blob of the commits' trees (what the cache lacks).
    All,
    /// None (`filter blob:none`) when the remote offers `filter`; otherwise all.
    None,
}

/// The body of a v0 fetch: `wants` (the first with `caps`), then, when the remote can cut
/// history (`shallow` among `caps`), the `shallow` commits and the depth, `filter blob:none` when
/// asked for, and the `haves`.
pub(crate) fn request(
    caps: &[&str],
    wants: &[ObjectId],
    shallow: &[ObjectId],
    haves: &[ObjectId],
    depth: u32,
) -> Vec<u8> {
    // Without `shallow` the host cannot cut history: the whole of it comes.
    let can_cut = caps.contains(&"shallow");
    let mut body = Vec::new();
    for (i, want) in wants.iter().enumerate() {
        let line = if i == 0 {
            format!("want {want} {}\n", caps.join(" "))
        } else {
            format!("want {want}\n")
        };
        pkt::write(&mut body, line.as_bytes());
    }
    if can_cut {
        for commit in shallow {
            pkt::write(&mut body, format!("shallow {commit}\n").as_bytes());
        }
        pkt::write(&mut body, format!("deepen {}\n", depth.max(1)).as_bytes());
    }
    if caps.contains(&"filter") {
        pkt::write(&mut body, b"filter blob:none\n");
    }
    pkt::flush(&mut body);
    for have in haves {
        pkt::write(&mut body, format!("have {have}\n").as_bytes());
    }
    pkt::write(&mut body, b"done\n");
    body
}

/// The body of a protocol-v2 `fetch` of the objects `ids` and nothing else. Protocol v2 lets a
/// client want any object the remote has (partial clone's lazy fetch relies on it), where v0
/// wants only what refs reach.
pub(crate) fn objects_request(ids: &[ObjectId]) -> Vec<u8> {
    let mut body = Vec::new();
    pkt::write(&mut body, b"command=fetch\n");
    pkt::write(&mut body, format!("{AGENT}\n").as_bytes());
    pkt::delim(&mut body);
    pkt::write(&mut body, b"no-progress\n");
    for id in ids {
        pkt::write(&mut body, format!("want {id}\n").as_bytes());
    }
    pkt::write(&mut body, b"done\n");
    pkt::flush(&mut body);
    body
}

/// Why a fetch brought no pack.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The remote answered `ERR …`: it will not send what was wanted (a tip that moved since
    /// it was advertised, say); the store looks again.
    #[error("git remote reports: {0}")]
    Refused(String),
    #[error("git protocol error: the fetch response has no pack")]
    NoPack,
    /// The exchange itself, or its pkt-lines and side-band (channel 3: the remote's error).
    #[error(transparent)]
    Wire(#[from] transport::Error),
}

impl FetchError {
    /// The wire's failure, if that is what this is.
    pub fn wire(&self) -> Option<&transport::Error> {
        match self {
            Self::Wire(wire) => Some(wire),
            Self::Refused(_) | Self::NoPack => None,
        }
    }

    /// The remote would not send what was wanted, or reported an error of its own: a fresh
    /// look may get past it.
    pub fn refused(&self) -> bool {
        match self {
            Self::Refused(_) => true,
            Self::NoPack => false,
            Self::Wire(wire) => wire.refused(),
        }
    }

    /// The answer is not a fetch response git's protocol allows.
    pub fn garbled(&self) -> bool {
        match self {
            Self::NoPack => true,
            Self::Refused(_) => false,
            Self::Wire(wire) => wire.garbled(),
        }
    }
}

/// The pack in an upload-pack response (v0, or v2's `packfile` section).
pub(crate) fn pack_of(response: &[u8]) -> Result<Vec<u8>, FetchError> {
    let mut reader = pkt::Reader::new(response);
    loop {
        // Without side-band the pack follows the acknowledgements raw.
        if reader.rest().starts_with(b"PACK") {
            return Ok(reader.rest().to_vec());
        }
        match reader.next_frame()? {
            Some(pkt::Frame::Data(d)) if matches!(d.first(), Some(1..=3)) => {
                return Ok(pkt::demux(&mut reader, Some(d))?);
            }
            Some(pkt::Frame::Data(d)) if d.starts_with(b"ERR ") => {
                return Err(FetchError::Refused(
                    String::from_utf8_lossy(&d[4..]).trim().to_owned(),
                ));
            }
            // shallow/unshallow updates, ACK/NAK, v2 section headers: nothing to keep, the cache
            // never walks history.
            Some(pkt::Frame::Data(_) | pkt::Frame::Flush | pkt::Frame::Special) => {}
            None => return Err(FetchError::NoPack),
        }
    }
}
