//! A smart-HTTP git client (protocol v0/v1, stateless RPC): ref advertisement, shallow fetch and
//! push (send-pack), written for this store's few operations.
//!
//! Decisions are taken from `ok`/`ng` in the report-status and from advertised tips, never from
//! the text of a message, which differs between hosts.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::settings::GitAuth;
use base64::Engine;
use gix::ObjectId;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue, LOCATION};

use crate::{Error, pkt};

const AGENT: &str = concat!("agent=gitstate/", env!("CARGO_PKG_VERSION"));
/// Redirects followed for the first ref advertisement (all within the repository's origin).
const MAX_REDIRECTS: usize = 5;
/// The most a remote may send in one answer unless configured otherwise.
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 128 << 20;

/// Whether `a` and `b` are URLs of the same origin: scheme, host and port (a scheme's default port
/// counts as given), so https and http of one host are two origins.
pub fn same_origin(a: &str, b: &str) -> bool {
    match (reqwest::Url::parse(a), reqwest::Url::parse(b)) {
        (Ok(a), Ok(b)) => a.origin().is_tuple() && a.origin() == b.origin(),
        _ => false,
    }
}

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

    pub fn has_cap(&self, cap: &str) -> bool {
        self.caps
            .iter()
            .any(|c| c == cap || c.split('=').next() == Some(cap))
    }

    /// Parse the body of `GET info/refs?service=…` (after the service announcement).
    pub fn parse(body: &[u8], service: Service) -> Result<Self, Error> {
        let mut reader = pkt::Reader::new(body);
        let first = reader
            .next_line()?
            .ok_or_else(|| Error::Protocol("empty ref advertisement".into()))?;
        let announced = format!("# service={}", service.name());
        if first != announced.as_bytes() {
            return Err(Error::Protocol(
                "the server did not announce the service (not a smart HTTP server?)".into(),
            ));
        }
        // A flush ends the announcement.
        if reader.next_frame()? != Some(pkt::Frame::Flush) {
            return Err(Error::Protocol(
                "no flush after the service announcement".into(),
            ));
        }
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
            let text = std::str::from_utf8(line)
                .map_err(|_| Error::Protocol("ref advertisement is not UTF-8".into()))?;
            let (oid, name) = text
                .split_once(' ')
                .ok_or_else(|| Error::Protocol("malformed ref line".into()))?;
            if name == "capabilities^{}" || name.ends_with("^{}") {
                continue;
            }
            let oid = ObjectId::from_hex(oid.as_bytes())
                .map_err(|_| Error::Protocol("malformed object id".into()))?;
            advert.refs.insert(name.to_owned(), oid);
        }
        Ok(advert)
    }
}

/// One ref update of a push. A zero `old` creates; a zero `new` deletes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub old: ObjectId,
    pub new: ObjectId,
    pub name: String,
}

/// The server's verdict on each ref of a push: `Ok(())` or `Err(reason)`.
#[derive(Debug, Clone, Default)]
pub struct PushReport {
    pub refs: Vec<(String, Result<(), String>)>,
}

impl PushReport {
    pub fn all_ok(&self, commands: &[Command]) -> bool {
        commands.iter().all(|c| {
            self.refs
                .iter()
                .any(|(name, status)| *name == c.name && status.is_ok())
        })
    }

    /// Parse report-status (`unpack ok`, then `ok <ref>` / `ng <ref> <reason>` lines).
    pub fn parse(data: &[u8]) -> Result<Self, Error> {
        let mut reader = pkt::Reader::new(data);
        let unpack = reader
            .next_line()?
            .ok_or_else(|| Error::Protocol("empty report-status".into()))?;
        match unpack.strip_prefix(b"unpack ") {
            Some(b"ok") => {}
            Some(why) => {
                return Err(Error::Remote(format!(
                    "the remote could not unpack: {}",
                    String::from_utf8_lossy(why)
                )));
            }
            None => {
                return Err(Error::Protocol(
                    "report-status does not start with 'unpack'".into(),
                ));
            }
        }
        let mut report = PushReport::default();
        while let Some(line) = reader.next_line()? {
            let text = String::from_utf8_lossy(line);
            if let Some(name) = text.strip_prefix("ok ") {
                report.refs.push((name.to_owned(), Ok(())));
            } else if let Some(rest) = text.strip_prefix("ng ") {
                let (name, why) = rest.split_once(' ').unwrap_or((rest, ""));
                report.refs.push((name.to_owned(), Err(why.to_owned())));
            } else {
                return Err(Error::Protocol(format!(
                    "unexpected report-status line {text:?}"
                )));
            }
        }
        Ok(report)
    }
}

/// What a push asks for: only capabilities `caps` advertised. `report-status` is required (the
/// verdict on each ref is what every decision rests on); `atomic` only for several commands,
/// which a caller must not send to a remote without it; `side-band-64k` when offered;
/// `report-status-v2`, `ofs-delta` (our packs hold whole objects), `quiet` and `push-options`
/// never.
pub fn push_capabilities(caps: &Advert, commands: &[Command]) -> Result<Vec<&'static str>, Error> {
    if !caps.has_cap("report-status") {
        return Err(Error::Protocol(
            "the remote does not offer report-status, so a push's outcome could not be known"
                .into(),
        ));
    }
    let mut wanted = vec!["report-status"];
    if caps.has_cap("side-band-64k") {
        wanted.push("side-band-64k");
    }
    if commands.len() > 1 {
        if !caps.has_cap("atomic") {
            return Err(Error::Protocol(
                "several ref updates in one push need atomic, which the remote does not offer"
                    .into(),
            ));
        }
        wanted.push("atomic");
    }
    if commands.iter().any(|c| c.new.is_null()) && !caps.has_cap("delete-refs") {
        return Err(Error::Remote(
            "the remote does not allow deleting refs".into(),
        ));
    }
    wanted.push(AGENT);
    Ok(wanted)
}

/// What a fetch asks for: of the capabilities it can use, those the upload-pack advertisement
/// offered; none when this process has not seen one (the caller makes sure that only happens
/// when whole history is fine, see [`SmartHttp::knows_fetch_capabilities`]).
fn fetch_capabilities(caps: Option<&[String]>) -> Vec<&'static str> {
    ["side-band-64k", "ofs-delta", "shallow", "no-progress"]
        .into_iter()
        .filter(|cap| caps.is_some_and(|caps| caps.iter().any(|c| c == cap)))
        .chain([AGENT])
        .collect()
}

/// The `Authorization` header for `token`: Basic with `username` (default `gitstate`, which
/// hosts that ignore the name accept) or Bearer. Marked sensitive, so it is never logged.
fn authorization(auth: GitAuth, username: Option<&str>, token: &str) -> Result<HeaderValue, Error> {
    let text = match auth {
        GitAuth::Basic => format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{token}", username.unwrap_or("gitstate")))
        ),
        GitAuth::Bearer => format!("Bearer {token}"),
    };
    let mut value = HeaderValue::try_from(text).map_err(|_| {
        Error::Config("git credentials contain characters a header cannot carry".into())
    })?;
    value.set_sensitive(true);
    Ok(value)
}

/// The certificates of a PEM bundle (`GITSTATE_GIT_CA_FILE` / `GITSTATE_GIT_CA_PEM`), trusted in
/// addition to the system roots.
pub fn private_roots(pem: &str) -> Result<Vec<reqwest::Certificate>, Error> {
    let roots = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
        .map_err(|e| Error::Config(format!("GITSTATE_GIT_CA_FILE/GITSTATE_GIT_CA_PEM: {e}")))?;
    if roots.is_empty() {
        return Err(Error::Config(
            "GITSTATE_GIT_CA_FILE/GITSTATE_GIT_CA_PEM: no certificate in the PEM text".into(),
        ));
    }
    Ok(roots)
}

/// A failed request, told apart when the host's certificate did not verify: that needs the
/// operator (a private CA to trust), not a retry, and the log must say which host.
fn request_error(url: &str, error: reqwest::Error) -> Error {
    match tls_error(&error) {
        Some(rustls::Error::InvalidCertificate(why)) => Error::Certificate {
            host: reqwest::Url::parse(url)
                .ok()
                .and_then(|u| u.host_str().map(str::to_owned))
                .unwrap_or_default(),
            reason: format!("{why:?}"),
        },
        _ => Error::Http(error),
    }
}

/// The TLS error behind a failed request. The connector nests it in `io::Error`s, whose
/// `source()` skips the error they wrap, so those are opened with `get_ref()`.
fn tls_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(cause) = next {
        if let Some(tls) = cause.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        next = match cause.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => cause.source(),
        };
    }
    None
}

/// An answer over the size limit, over HTTP or SSH (a 502 with this reason).
pub(crate) fn too_large(what: &str, limit: u64) -> Error {
    Error::Remote(format!(
        "the remote's {what} is larger than {limit} bytes (GITSTATE_GIT_MAX_RESPONSE_BYTES)"
    ))
}

/// A remote repository reached over smart HTTP(S), or over SSH ([`crate::ssh`]).
pub struct SmartHttp {
    client: reqwest::Client,
    url: String,
    authorization: Option<HeaderValue>,
    /// Where the first ref advertisement was redirected to (same origin), used from then on.
    redirected: Mutex<Option<String>>,
    /// Whether a ref advertisement was asked for yet: only the first may be redirected.
    advertised: AtomicBool,
    /// The most one answer may hold; more is refused while it arrives.
    max_response_bytes: u64,
    /// Set for SSH remotes: the same requests and parsers, another wire.
    wire: Option<Box<dyn crate::ssh::Wire>>,
    /// Upload-pack capabilities, from the last upload-pack advertisement.
    upload_caps: Mutex<Option<Vec<String>>>,
}

/// How [`SmartHttp`] reaches and authenticates to the host, beyond the URL.
#[derive(Debug, Clone, Default)]
pub struct Connection<'a> {
    pub username: Option<&'a str>,
    pub token: Option<&'a str>,
    pub auth: GitAuth,
    /// Extra trusted roots (a private CA), added to the system's.
    pub roots: &'a [reqwest::Certificate],
    pub timeout: Duration,
}

impl SmartHttp {
    /// The token is sent pre-emptively (Basic or Bearer); never over plain http to anything but
    /// the loopback interface. `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY` are honoured. SSH remotes
    /// (`ssh://…`, `user@host:path`) go through the system `ssh` instead.
    pub fn new(url: &str, connection: &Connection<'_>) -> Result<Self, Error> {
        if crate::ssh::is_ssh(url) {
            return Ok(Self {
                client: reqwest::Client::builder().build().map_err(Error::Http)?,
                url: url.to_owned(),
                authorization: None,
                redirected: Mutex::new(None),
                advertised: AtomicBool::new(false),
                max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
                wire: Some(Box::new(crate::ssh::Ssh::parse(url, connection.timeout)?)),
                upload_caps: Mutex::new(None),
            });
        }
        let parsed =
            reqwest::Url::parse(url).map_err(|e| Error::Config(format!("repository URL: {e}")))?;
        let authorization = match connection.token {
            None => None,
            Some(token) => {
                let loopback =
                    matches!(parsed.host_str(), Some("127.0.0.1" | "localhost" | "[::1]"));
                if parsed.scheme() != "https" && !loopback {
                    return Err(Error::Config(
                        "refusing to send git credentials over plain http; use https://".into(),
                    ));
                }
                Some(authorization(connection.auth, connection.username, token)?)
            }
        };
        let timeout = connection.timeout;
        let mut builder = reqwest::Client::builder()
            // Redirects are followed by hand, for the first advertisement only: see
            // `advertisement_response`.
            .redirect(reqwest::redirect::Policy::none())
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .user_agent(AGENT.trim_start_matches("agent="));
        for root in connection.roots {
            builder = builder.add_root_certificate(root.clone());
        }
        let client = builder.build().map_err(Error::Http)?;
        Ok(Self {
            client,
            url: url.trim_end_matches('/').to_owned(),
            authorization,
            redirected: Mutex::new(None),
            advertised: AtomicBool::new(false),
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            wire: None,
            upload_caps: Mutex::new(None),
        })
    }

    /// Refuse answers larger than `bytes` (`GITSTATE_GIT_MAX_RESPONSE_BYTES`).
    #[must_use]
    pub fn with_max_response_bytes(mut self, bytes: u64) -> Self {
        self.max_response_bytes = bytes;
        self
    }

    /// The most one answer may hold, over whichever wire.
    pub(crate) fn max_response_bytes(&self) -> u64 {
        self.max_response_bytes
    }

    /// The body of `response`, refused once it passes the size limit (by its declared length at
    /// once, else while it arrives), so a remote cannot fill memory or `/tmp`.
    async fn read_capped(
        &self,
        mut response: reqwest::Response,
        what: &'static str,
    ) -> Result<Vec<u8>, Error> {
        let limit = self.max_response_bytes;
        let too_large = || too_large(what, limit);
        if response.content_length().is_some_and(|n| n > limit) {
            return Err(too_large());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(Error::Http)? {
            if (body.len() + chunk.len()) as u64 > limit {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// The repository's URL, or where its first advertisement was redirected to.
    fn base(&self) -> String {
        self.redirected
            .lock()
            .ok()
            .and_then(|r| r.clone())
            .unwrap_or_else(|| self.url.clone())
    }

    /// `GET info/refs?service=…`, following redirects only when this is the first advertisement
    /// and only within the repository's origin (so never from https to http, and the credentials
    /// never reach another host). The redirected base is used for every later request.
    async fn advertisement_response(&self, service: Service) -> Result<reqwest::Response, Error> {
        let first = !self.advertised.swap(true, Ordering::SeqCst);
        let mut url = format!("{}/info/refs?service={}", self.base(), service.name());
        for _ in 0..=MAX_REDIRECTS {
            let response = self
                .with_auth(self.client.get(&url))
                .send()
                .await
                .map_err(|e| request_error(&self.url, e))?;
            if !response.status().is_redirection() {
                return Ok(response);
            }
            let next = response
                .headers()
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|location| reqwest::Url::parse(&url).ok()?.join(location).ok())
                .ok_or_else(|| {
                    Error::Remote("the remote redirected without a usable Location".into())
                })?;
            let origin = next.origin().ascii_serialization();
            if !first {
                return Err(Error::Remote(format!(
                    "the remote redirected a later ref advertisement (to {origin}); only the first is followed"
                )));
            }
            if !same_origin(&self.url, next.as_str()) {
                return Err(Error::Remote(format!(
                    "the remote redirected to another origin ({origin}); not followed, the git credentials go only to the configured repository's origin"
                )));
            }
            let base = next
                .as_str()
                .split_once("/info/refs")
                .map(|(base, _)| base.to_owned())
                .ok_or_else(|| {
                    Error::Remote(format!(
                        "the remote redirected the ref advertisement to {origin} but not to an info/refs path"
                    ))
                })?;
            tracing::info!(to = %next.path(), "following the remote's redirect of the first ref advertisement");
            if let Ok(mut redirected) = self.redirected.lock() {
                *redirected = Some(base);
            }
            url = next.into();
        }
        Err(Error::Remote(format!(
            "the remote redirected more than {MAX_REDIRECTS} times"
        )))
    }

    fn with_auth(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.authorization {
            Some(value) => request.header(AUTHORIZATION, value.clone()),
            None => request,
        }
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        what: &'static str,
    ) -> Result<Vec<u8>, Error> {
        let response = self
            .with_auth(request)
            .send()
            .await
            .map_err(|e| request_error(&self.url, e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(Error::Status {
                status: status.as_u16(),
                what,
            });
        }
        self.read_capped(response, what).await
    }

    /// `GET info/refs?service=…`: one request.
    pub async fn advertise(&self, service: Service) -> Result<Advert, Error> {
        let body = match &self.wire {
            Some(wire) => wire.advertise(service, self.max_response_bytes()).await?,
            None => self.advertisement_body(service).await?,
        };
        let advert = Advert::parse(&body, service)?;
        if service == Service::UploadPack
            && let Ok(mut known) = self.upload_caps.lock()
        {
            *known = Some(advert.caps.clone());
        }
        Ok(advert)
    }

    /// The body of `GET info/refs?service=…`, checked to be a smart-HTTP advertisement.
    async fn advertisement_body(&self, service: Service) -> Result<Vec<u8>, Error> {
        let response = self.advertisement_response(service).await?;
        let status = response.status();
        if !status.is_success() {
            return Err(Error::Status {
                status: status.as_u16(),
                what: "ref advertisement",
            });
        }
        let expected = format!("application/x-{}-advertisement", service.name());
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if content_type != expected {
            return Err(Error::Protocol(format!(
                "ref advertisement has content type {content_type:?}, not {expected}"
            )));
        }
        self.read_capped(response, "ref advertisement").await
    }

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

    /// `POST git-receive-pack` with `commands` and `pack`. `caps` are the receive-pack
    /// capabilities advertised earlier. One request.
    pub async fn push(
        &self,
        caps: &Advert,
        commands: &[Command],
        pack: Option<Vec<u8>>,
    ) -> Result<PushReport, Error> {
        let wanted = push_capabilities(caps, commands)?;
        let sideband = wanted.contains(&"side-band-64k");
        let mut body = Vec::new();
        for (i, c) in commands.iter().enumerate() {
            let mut line = format!("{} {} {}", c.old, c.new, c.name).into_bytes();
            if i == 0 {
                line.push(0);
                line.extend_from_slice(wanted.join(" ").as_bytes());
            }
            line.push(b'\n');
            pkt::write(&mut body, &line);
        }
        pkt::flush(&mut body);
        if let Some(pack) = pack {
            body.extend_from_slice(&pack);
        }
        let response = match &self.wire {
            Some(wire) => {
                wire.exchange(Service::ReceivePack, body, self.max_response_bytes())
                    .await?
            }
            None => {
                let request = self
                    .client
                    .post(format!("{}/git-receive-pack", self.base()))
                    .header(CONTENT_TYPE, "application/x-git-receive-pack-request")
                    .header(ACCEPT, "application/x-git-receive-pack-result")
                    .body(body);
                self.send(request, "push").await?
            }
        };
        if sideband {
            let data = pkt::demux(&mut pkt::Reader::new(&response), None)?;
            PushReport::parse(&data)
        } else {
            PushReport::parse(&response)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn advert_body(lines: &[&[u8]]) -> Vec<u8> {
        let mut body = Vec::new();
        pkt::write(&mut body, b"# service=git-receive-pack\n");
        pkt::flush(&mut body);
        for line in lines {
            pkt::write(&mut body, line);
        }
        pkt::flush(&mut body);
        body
    }

    #[test]
    fn parses_advertisements() {
        let a = "1111111111111111111111111111111111111111";
        let body = advert_body(&[
            format!("{a} refs/heads/main\0report-status delete-refs atomic side-band-64k\n")
                .as_bytes(),
            format!("{a} refs/heads/locks/x.tfstate\n").as_bytes(),
        ]);
        let advert = Advert::parse(&body, Service::ReceivePack).expect("valid");
        assert!(advert.has_cap("atomic") && !advert.has_cap("thin-pack"));
        assert_eq!(advert.refs.len(), 2);
        assert_eq!(
            advert.tip("refs/heads/main").map(|o| o.to_string()),
            Some(a.to_owned())
        );
    }

    #[test]
    fn parses_empty_repository() {
        let zero = "0000000000000000000000000000000000000000";
        let body = advert_body(&[format!("{zero} capabilities^{{}}\0report-status\n").as_bytes()]);
        let advert = Advert::parse(&body, Service::ReceivePack).expect("valid");
        assert!(advert.refs.is_empty() && advert.has_cap("report-status"));
    }

    #[test]
    fn origins_are_scheme_host_and_port() {
        for (a, b, same) in [
            ("https://h/a.git", "https://h/b.git", true),
            ("https://h/a.git", "https://h:443/b.git", true),
            ("https://h/a.git", "http://h/a.git", false),
            ("https://h/a.git", "https://h:8443/a.git", false),
            ("https://h/a.git", "https://g/a.git", false),
            ("https://h/a.git", "https://h.evil/a.git", false),
            ("http://127.0.0.1:1/a", "http://127.0.0.1:2/a", false),
            ("http://127.0.0.1:1/a", "http://localhost:1/a", false),
            ("https://h/a.git", "not a url", false),
            ("file:///a", "file:///a", false),
        ] {
            assert_eq!(same_origin(a, b), same, "{a} vs {b}");
        }
    }

    #[test]
    fn refuses_dumb_servers() {
        assert!(Advert::parse(b"1111111 refs/heads/main\n", Service::UploadPack).is_err());
    }

    #[test]
    fn parses_report_status() {
        let mut data = Vec::new();
        pkt::write(&mut data, b"unpack ok\n");
        pkt::write(&mut data, b"ok refs/heads/main\n");
        pkt::write(&mut data, b"ng refs/heads/locks/a failed to update ref\n");
        pkt::flush(&mut data);
        let report = PushReport::parse(&data).expect("valid");
        assert_eq!(report.refs[0], ("refs/heads/main".into(), Ok(())));
        assert_eq!(
            report.refs[1],
            (
                "refs/heads/locks/a".into(),
                Err("failed to update ref".into())
            )
        );
        let mut bad = Vec::new();
        pkt::write(&mut bad, b"unpack index-pack failed\n");
        assert!(matches!(PushReport::parse(&bad), Err(Error::Remote(_))));
    }

    const PUSH_CAPS: [&str; 10] = [
        "report-status",
        "report-status-v2",
        "delete-refs",
        "side-band-64k",
        "quiet",
        "atomic",
        "ofs-delta",
        "push-options",
        "object-format=sha1",
        "agent=git/2.43.0",
    ];

    /// Every subset of capabilities a receive-pack could advertise, with one to three commands
    /// (creates, updates, deletes): a push asks only for what was advertised, never for what it
    /// does not use, and refuses exactly when a needed capability is missing.
    #[test]
    fn push_asks_only_for_advertised_capabilities() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(14);
        let id = |n: u8| ObjectId::from_bytes_or_panic(&[n; 20]);
        for mask in 0u32..(1 << PUSH_CAPS.len()) {
            let caps = Advert {
                caps: (0..PUSH_CAPS.len())
                    .filter(|i| mask & (1 << i) != 0)
                    .map(|i| PUSH_CAPS[i].to_owned())
                    .collect(),
                ..Advert::default()
            };
            let commands: Vec<Command> = (0..rng.random_range(1..=3))
                .map(|i| Command {
                    old: if rng.random_bool(0.3) { null() } else { id(1) },
                    new: if rng.random_bool(0.3) { null() } else { id(2) },
                    name: format!("refs/heads/r{i}"),
                })
                .collect();
            let deletes = commands.iter().any(|c| c.new.is_null());
            let possible = caps.has_cap("report-status")
                && (commands.len() == 1 || caps.has_cap("atomic"))
                && (!deletes || caps.has_cap("delete-refs"));
            match push_capabilities(&caps, &commands) {
                Ok(wanted) => {
                    assert!(possible, "{caps:?} {commands:?}");
                    for cap in wanted.iter().filter(|c| !c.starts_with("agent=")) {
                        assert!(caps.has_cap(cap), "asked for {cap} not in {caps:?}");
                        assert!(
                            !["report-status-v2", "quiet", "push-options", "ofs-delta"]
                                .contains(cap),
                            "asked for unused {cap}"
                        );
                    }
                    assert_eq!(wanted.contains(&"atomic"), commands.len() > 1);
                    assert_eq!(
                        wanted.contains(&"side-band-64k"),
                        caps.has_cap("side-band-64k")
                    );
                }
                Err(_) => assert!(!possible, "{caps:?} {commands:?}"),
            }
        }
    }

    fn null() -> ObjectId {
        ObjectId::null(gix::hash::Kind::Sha1)
    }

    #[test]
    fn fetch_asks_only_for_advertised_capabilities() {
        let all = [
            "side-band-64k",
            "ofs-delta",
            "shallow",
            "no-progress",
            "filter",
        ];
        for mask in 0u32..(1 << all.len()) {
            let caps: Vec<String> = (0..all.len())
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| all[i].to_owned())
                .collect();
            let wanted = fetch_capabilities(Some(&caps));
            for cap in wanted.iter().filter(|c| !c.starts_with("agent=")) {
                assert!(caps.iter().any(|c| c == cap), "{cap} not in {caps:?}");
            }
            assert_eq!(
                wanted.len(),
                1 + caps.iter().filter(|c| *c != "filter").count()
            );
        }
        assert_eq!(
            fetch_capabilities(None),
            [AGENT],
            "nothing optional unadvertised"
        );
    }

    #[test]
    fn authorization_schemes() {
        let basic = authorization(GitAuth::Basic, Some("x-token-auth"), "t0k").expect("valid");
        assert_eq!(
            basic.to_str().expect("ascii"),
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode("x-token-auth:t0k")
            )
        );
        let bearer = authorization(GitAuth::Bearer, Some("ignored"), "t0k").expect("valid");
        assert_eq!(bearer.to_str().expect("ascii"), "Bearer t0k");
        assert!(basic.is_sensitive() && bearer.is_sensitive());
        assert!(authorization(GitAuth::Bearer, None, "a\nb").is_err());
    }

    /// However deep the connector nests the TLS error in `io::Error`s, it is found.
    #[test]
    fn finds_the_tls_error_in_nested_io_errors() {
        let unknown = || rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        for depth in 0..4 {
            let mut error: Box<dyn std::error::Error + Send + Sync> = Box::new(unknown());
            for _ in 0..depth {
                error = Box::new(std::io::Error::other(error));
            }
            assert_eq!(tls_error(error.as_ref()), Some(&unknown()), "depth {depth}");
        }
        let plain = std::io::Error::other("connection refused");
        assert_eq!(tls_error(&plain), None);
    }

    #[test]
    fn private_roots_need_a_certificate() {
        assert!(private_roots("no pem here").is_err());
    }
}
