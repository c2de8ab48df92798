//! A git client for this store's few operations over any [`Wire`]: ref advertisements, shallow,
//! deepened and partial fetches, fetches of blobs by id, and push (send-pack).
//!
//! Decisions are taken from `ok`/`ng` in the report-status and from advertised tips, never from
//! the text of a message, which differs between hosts.

use std::sync::Mutex;

use gix::ObjectId;

use super::Advert;
use super::advert::AdvertError;
use super::fetch::{self, Blobs, FetchError, fetch_capabilities, pack_of};
use super::push::{self, Command, PushError, PushReport, Updates, push_capabilities};
use crate::sync::lock;
use crate::transport::{ConnectError, Connection, Service, Wire};

/// The most a remote may send in one answer unless configured otherwise.
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 128 << 20;

/// A remote repository, reached over the wire its URL names.
pub struct SmartClient {
    wire: Box<dyn Wire>,
    /// The most one answer may hold; more is refused while it arrives.
    max_response_bytes: u64,
    /// Upload-pack capabilities, from the last upload-pack advertisement.
    upload_caps: Mutex<Option<Vec<String>>>,
}

impl SmartClient {
    /// The client of `url`: over SSH for `ssh://…` and `user@host:path`, else smart HTTP(S)
    /// (see [`crate::transport::connect`]).
    pub fn new(url: &str, connection: &Connection<'_>) -> Result<Self, ConnectError> {
        Ok(Self {
            wire: crate::transport::connect(url, connection)?,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            upload_caps: Mutex::new(None),
        })
    }

    /// Refuse answers larger than `bytes` (`GITSTATE_GIT_MAX_RESPONSE_BYTES`).
    #[must_use]
    pub fn with_max_response_bytes(mut self, bytes: u64) -> Self {
        self.max_response_bytes = bytes;
        self
    }

    /// The ref advertisement of `service`: one request.
    pub async fn advertise(&self, service: Service) -> Result<Advert, AdvertError> {
        let body = self
            .wire
            .advertise(service, self.max_response_bytes)
            .await?;
        let advert = Advert::parse_refs(&body)?;
        if service == Service::UploadPack {
            *lock(&self.upload_caps) = Some(advert.caps.clone());
        }
        Ok(advert)
    }

    /// Whether an upload-pack advertisement has told this client what a fetch may ask for.
    /// Without one a fetch asks for nothing optional: no `shallow`, so the whole history of
    /// each want comes, which is only right for orphan commits (locks).
    pub fn knows_fetch_capabilities(&self) -> bool {
        lock(&self.upload_caps).is_some()
    }

    /// Whether fetches can leave blobs out and fetch them later by id: the upload-pack
    /// advertisement offered `filter` (partial clone), and the wire carries protocol v2 (which a
    /// fetch of blobs by id uses).
    pub fn offers_filter(&self) -> bool {
        self.wire.carries_v2()
            && lock(&self.upload_caps)
                .as_ref()
                .is_some_and(|c| c.iter().any(|c| c == "filter"))
    }

    /// Upload-pack: the objects of `wants` at depth 1, given we have `haves` (as shallow
    /// commits). Returns the pack. One request.
    pub async fn fetch(
        &self,
        wants: &[ObjectId],
        haves: &[ObjectId],
        blobs: Blobs,
    ) -> Result<Vec<u8>, FetchError> {
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
    ) -> Result<Vec<u8>, FetchError> {
        self.fetch_with(&[tip], boundary, &[tip], depth, blobs)
            .await
    }

    /// Upload-pack: every object `wants` reach that `haves` do not, whole history and blobs (no
    /// `shallow`, no filter): what a fold fetches of the state refs. One request.
    pub async fn fetch_beyond(
        &self,
        wants: &[ObjectId],
        haves: &[ObjectId],
    ) -> Result<Vec<u8>, FetchError> {
        let caps: Vec<&str> = fetch_capabilities(lock(&self.upload_caps).as_deref(), false)
            .into_iter()
            .filter(|cap| *cap != "shallow")
            .collect();
        let request = fetch::request(&caps, wants, &[], haves, 0);
        let response = self
            .wire
            .exchange(Service::UploadPack, request, self.max_response_bytes)
            .await?;
        pack_of(&response)
    }

    /// Upload-pack with protocol v2's `fetch`: the blobs `ids` and nothing else. One request.
    pub async fn fetch_blobs(&self, ids: &[ObjectId]) -> Result<Vec<u8>, FetchError> {
        let request = fetch::objects_request(ids);
        let response = self
            .wire
            .exchange_v2(request, self.max_response_bytes)
            .await?;
        pack_of(&response)
    }

    async fn fetch_with(
        &self,
        wants: &[ObjectId],
        shallow: &[ObjectId],
        haves: &[ObjectId],
        depth: u32,
        blobs: Blobs,
    ) -> Result<Vec<u8>, FetchError> {
        let caps = fetch_capabilities(lock(&self.upload_caps).as_deref(), blobs == Blobs::None);
        let request = fetch::request(&caps, wants, shallow, haves, depth);
        let response = self
            .wire
            .exchange(Service::UploadPack, request, self.max_response_bytes)
            .await?;
        pack_of(&response)
    }

    /// Receive-pack with `commands`, standing together as `updates` says, and `pack`. `caps`
    /// are the receive-pack capabilities advertised earlier. One request.
    pub async fn push(
        &self,
        caps: &Advert,
        commands: &[Command],
        updates: Updates,
        pack: Option<Vec<u8>>,
    ) -> Result<PushReport, PushError> {
        let wanted = push_capabilities(caps, commands, updates)?;
        let sideband = wanted.contains(&"side-band-64k");
        let request = push::request(&wanted, commands, pack);
        let response = self
            .wire
            .exchange(Service::ReceivePack, request, self.max_response_bytes)
            .await?;
        push::report(&response, sideband)
    }
}
