//! A smart-HTTP git client (protocol v0/v1, stateless RPC): ref advertisement, shallow fetch and
//! push (send-pack), written for this store's few operations.
//!
//! Decisions are taken from `ok`/`ng` in the report-status and from advertised tips, never from
//! the text of a message, which differs between hosts.

mod fetch;
mod push;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::settings::GitAuth;
use base64::Engine;

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue, LOCATION};

use crate::Error;
use crate::sync::lock;

use crate::protocol::AGENT;
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

pub use crate::protocol::{Advert, Service};
pub use fetch::Blobs;
pub use push::{Command, PushReport, push_capabilities};

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
        let too_large = || Error::too_large(what, limit);
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
        lock(&self.redirected)
            .clone()
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
            *lock(&self.redirected) = Some(base);
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
        if service == Service::UploadPack {
            *lock(&self.upload_caps) = Some(advert.caps.clone());
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
}

#[cfg(test)]
mod tests;
