//! Fetch (upload-pack): packs of wanted commits, shallow or deepened.

use gix::ObjectId;
use reqwest::header::{ACCEPT, CONTENT_TYPE};

use super::{AGENT, Service, SmartHttp};
use crate::{Error, pkt};

/// What a fetch asks for: of the capabilities it can use, those the upload-pack advertisement
/// offered; none when this process has not seen one (the caller makes sure that only happens
/// when whole history is fine, see [`SmartHttp::knows_fetch_capabilities`]).
pub(super) fn fetch_capabilities(caps: Option<&[String]>) -> Vec<&'static str> {
    ["side-band-64k", "ofs-delta", "shallow", "no-progress"]
        .into_iter()
        .filter(|cap| caps.is_some_and(|caps| caps.iter().any(|c| c == cap)))
        .chain([AGENT])
        .collect()
}

impl SmartHttp {
    /// Whether an upload-pack advertisement has told this client what a fetch may ask for.
    /// Without one a fetch asks for nothing optional: no `shallow`, so the whole history of
    /// each want comes, which is only right for orphan commits (locks).
    pub fn knows_fetch_capabilities(&self) -> bool {
        self.upload_caps.lock().is_ok_and(|caps| caps.is_some())
    }

    /// `POST git-upload-pack`: the objects of `wants` at depth 1, given we have `haves` (as shallow
    /// commits). Returns the pack. One request.
    pub async fn fetch(&self, wants: &[ObjectId], haves: &[ObjectId]) -> Result<Vec<u8>, Error> {
        self.fetch_depth(wants, haves, 1).await
    }

    /// Like [`Self::fetch`], with history `depth` commits deep from each want.
    pub async fn fetch_depth(
        &self,
        wants: &[ObjectId],
        haves: &[ObjectId],
        depth: u32,
    ) -> Result<Vec<u8>, Error> {
        self.fetch_with(wants, haves, haves, depth).await
    }

    /// Deepen the history behind `tip` (which the cache has) to `depth` commits: the cache's
    /// `boundary` commits are declared shallow and `tip` had, so the server sends only the commits
    /// past the boundary. One request.
    pub async fn fetch_deeper(
        &self,
        tip: ObjectId,
        boundary: &[ObjectId],
        depth: u32,
    ) -> Result<Vec<u8>, Error> {
        self.fetch_with(&[tip], boundary, &[tip], depth).await
    }

    async fn fetch_with(
        &self,
        wants: &[ObjectId],
        shallow: &[ObjectId],
        haves: &[ObjectId],
        depth: u32,
    ) -> Result<Vec<u8>, Error> {
        let caps = fetch_capabilities(
            self.upload_caps
                .lock()
                .map_err(|_| Error::Corrupt("poisoned".into()))?
                .as_deref(),
        );
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
        let mut reader = pkt::Reader::new(&response);
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
                // shallow/unshallow updates, ACK/NAK: nothing to keep, the cache never walks history.
                Some(pkt::Frame::Data(_) | pkt::Frame::Flush | pkt::Frame::Special) => {}
                None => return Err(Error::Protocol("the fetch response has no pack".into())),
            }
        }
    }
}
