//! Fetch (upload-pack): packs of wanted commits, shallow or deepened, with or without their
//! blobs, and packs of blobs by id.

use gix::ObjectId;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderValue};

use super::SmartHttp;
use crate::Error;
use crate::protocol::pkt;
use crate::protocol::{AGENT, Service};
use crate::sync::lock;

/// What a fetch asks for: of the capabilities it can use, those the upload-pack advertisement
/// offered; none when this process has not seen one (the caller makes sure that only happens
/// when whole history is fine, see [`SmartHttp::knows_fetch_capabilities`]). `filter` only for
/// a partial fetch, and only when offered.
pub(super) fn fetch_capabilities(caps: Option<&[String]>, partial: bool) -> Vec<&'static str> {
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

impl SmartHttp {
    /// Whether an upload-pack advertisement has told this client what a fetch may ask for.
    /// Without one a fetch asks for nothing optional: no `shallow`, so the whole history of
    /// each want comes, which is only right for orphan commits (locks).
    pub fn knows_fetch_capabilities(&self) -> bool {
        lock(&self.upload_caps).is_some()
    }

    /// Whether fetches can leave blobs out and fetch them later by id: the upload-pack
    /// advertisement offered `filter` (partial clone), over HTTP (a fetch of blobs by id uses
    /// protocol v2, which this client speaks over HTTP only).
    pub fn offers_filter(&self) -> bool {
        self.wire.is_none()
            && lock(&self.upload_caps)
                .as_ref()
                .is_some_and(|c| c.iter().any(|c| c == "filter"))
    }

    /// `POST git-upload-pack`: the objects of `wants` at depth 1, given we have `haves` (as shallow
    /// commits). Returns the pack. One request.
    pub async fn fetch(
        &self,
        wants: &[ObjectId],
        haves: &[ObjectId],
        blobs: Blobs,
    ) -> Result<Vec<u8>, Error> {
        self.fetch_with(wants, haves, haves, 1, blobs).await
    }

    /// Deepen the history behind `tip` (which the cache has) to `depth` commits: the cache's
    /// `boundary` commits are declared shallow and `tip` had, so the server sends only the commits
    /// past the boundary. One request.
    pub async fn fetch_deeper(
        &self,
        tip: ObjectId,
        boundary: &[ObjectId],
        depth: u32,
        blobs: Blobs,
    ) -> Result<Vec<u8>, Error> {
        self.fetch_with(&[tip], boundary, &[tip], depth, blobs)
            .await
    }

    /// `POST git-upload-pack` with protocol v2's `fetch`: the blobs `ids` and nothing else. Protocol
    /// v2 lets a client want any object the remote has (partial clone's lazy fetch relies on it),
    /// where v0 wants only what refs reach. One request.
    pub async fn fetch_blobs(&self, ids: &[ObjectId]) -> Result<Vec<u8>, Error> {
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
        let request = self
            .client
            .post(format!("{}/git-upload-pack", self.base()))
            .header(CONTENT_TYPE, "application/x-git-upload-pack-request")
            .header(ACCEPT, "application/x-git-upload-pack-result")
            .header("Git-Protocol", HeaderValue::from_static("version=2"))
            .body(body);
        let response = self.send(request, "fetch of blobs").await?;
        pack_of(&response)
    }

    async fn fetch_with(
        &self,
        wants: &[ObjectId],
        shallow: &[ObjectId],
        haves: &[ObjectId],
        depth: u32,
        blobs: Blobs,
    ) -> Result<Vec<u8>, Error> {
        let caps = fetch_capabilities(lock(&self.upload_caps).as_deref(), blobs == Blobs::None);
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
        let response = match &self.wire {
            Some(wire) => {
                wire.exchange(Service::UploadPack, body, self.max_response_bytes())
                    .await?
            }
            None => {
                let request = self
                    .client
                    .post(format!("{}/git-upload-pack", self.base()))
                    .header(CONTENT_TYPE, "application/x-git-upload-pack-request")
                    .header(ACCEPT, "application/x-git-upload-pack-result")
                    .body(body);
                self.send(request, "fetch").await?
            }
        };
        pack_of(&response)
    }
}

/// The pack in an upload-pack response (v0, or v2's `packfile` section).
fn pack_of(response: &[u8]) -> Result<Vec<u8>, Error> {
    let mut reader = pkt::Reader::new(response);
    loop {
        // Without side-band the pack follows the acknowledgements raw.
        if reader.rest().starts_with(b"PACK") {
            return Ok(reader.rest().to_vec());
        }
        match reader.next_frame()? {
            Some(pkt::Frame::Data(d)) if matches!(d.first(), Some(1..=3)) => {
                return pkt::demux(&mut reader, Some(d));
            }
            Some(pkt::Frame::Data(d)) if d.starts_with(b"ERR ") => {
                return Err(Error::Remote(
                    String::from_utf8_lossy(&d[4..]).trim().to_owned(),
                ));
            }
            // shallow/unshallow updates, ACK/NAK, v2 section headers: nothing to keep, the cache
            // never walks history.
            Some(pkt::Frame::Data(_) | pkt::Frame::Flush | pkt::Frame::Special) => {}
            None => return Err(Error::Protocol("the fetch response has no pack".into())),
        }
    }
}
