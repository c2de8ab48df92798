//! Smart HTTP(S) (stateless RPC): `GET info/refs?service=…` for the advertisement, one `POST`
//! per request; credentials only to the repository's origin, redirects only for the first
//! advertisement and only within that origin.

use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue, LOCATION};

use super::{ConnectError, Error, NotSmart, Redirect, Service, Wire, pkt};
use crate::settings::GitAuth;
use crate::sync::lock;

/// What this client calls itself to the host.
const USER_AGENT: &str = concat!("gitstate/", env!("CARGO_PKG_VERSION"));
/// Redirects followed for the first ref advertisement (all within the repository's origin).
const MAX_REDIRECTS: usize = 5;

/// Whether `a` and `b` are URLs of the same origin: scheme, host and port (a scheme's default port
/// counts as given), so https and http of one host are two origins.
pub fn same_origin(a: &str, b: &str) -> bool {
    match (reqwest::Url::parse(a), reqwest::Url::parse(b)) {
        (Ok(a), Ok(b)) => a.origin().is_tuple() && a.origin() == b.origin(),
        _ => false,
    }
}

/// The `Authorization` header for `token`: Basic with `username` (default `gitstate`, which
/// hosts that ignore the name accept) or Bearer. Marked sensitive, so it is never logged.
fn authorization(
    auth: GitAuth,
    username: Option<&str>,
    token: &str,
) -> Result<HeaderValue, ConnectError> {
    let text = match auth {
        GitAuth::Basic => format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{token}", username.unwrap_or("gitstate")))
        ),
        GitAuth::Bearer => format!("Bearer {token}"),
    };
    let mut value = HeaderValue::try_from(text).map_err(|_| ConnectError::HeaderCredentials)?;
    value.set_sensitive(true);
    Ok(value)
}

/// The certificates of a PEM bundle (`GITSTATE_GIT_CA_FILE` / `GITSTATE_GIT_CA_PEM`), trusted in
/// addition to the system roots.
pub fn private_roots(pem: &str) -> Result<Vec<reqwest::Certificate>, ConnectError> {
    let roots =
        reqwest::Certificate::from_pem_bundle(pem.as_bytes()).map_err(ConnectError::CaBundle)?;
    if roots.is_empty() {
        return Err(ConnectError::NoCertificate);
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

/// A repository reached over smart HTTP(S).
pub struct Http {
    client: reqwest::Client,
    url: String,
    authorization: Option<HeaderValue>,
    /// Whether a ref advertisement was asked for yet (only the first may be redirected), and
    /// where the first was redirected to: one lock, so no request sees one without the other.
    base: Mutex<Base>,
}

/// Where requests go, as the first ref advertisement decided.
enum Base {
    /// No advertisement asked for yet: the next one may be redirected.
    Unasked,
    /// Asked for; `Some`: redirected there (same origin), used from then on.
    Asked(Option<String>),
}

/// How [`Http`] reaches and authenticates to the host, beyond the URL.
#[derive(Debug, Clone, Default)]
pub struct Connection<'a> {
    pub username: Option<&'a str>,
    pub token: Option<&'a str>,
    pub auth: GitAuth,
    /// Extra trusted roots (a private CA), added to the system's.
    pub roots: &'a [reqwest::Certificate],
    pub timeout: Duration,
}

impl Http {
    /// The token is sent pre-emptively (Basic or Bearer); never over plain http to anything but
    /// the loopback interface. `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY` are honoured.
    pub fn new(url: &str, connection: &Connection<'_>) -> Result<Self, ConnectError> {
        let parsed = reqwest::Url::parse(url).map_err(ConnectError::Url)?;
        let authorization = match connection.token {
            None => None,
            Some(token) => {
                let loopback =
                    matches!(parsed.host_str(), Some("127.0.0.1" | "localhost" | "[::1]"));
                if parsed.scheme() != "https" && !loopback {
                    return Err(ConnectError::CredentialsOverHttp);
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
            .user_agent(USER_AGENT);
        for root in connection.roots {
            builder = builder.add_root_certificate(root.clone());
        }
        let client = builder.build().map_err(ConnectError::Client)?;
        Ok(Self {
            client,
            url: url.trim_end_matches('/').to_owned(),
            authorization,
            base: Mutex::new(Base::Unasked),
        })
    }

    /// The body of `response`, refused once it passes the size limit (by its declared length at
    /// once, else while it arrives), so a remote cannot fill memory or `/tmp`.
    async fn read_capped(
        &self,
        mut response: reqwest::Response,
        what: &'static str,
        limit: u64,
    ) -> Result<Vec<u8>, Error> {
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
        match &*lock(&self.base) {
            Base::Asked(Some(redirected)) => redirected.clone(),
            Base::Unasked | Base::Asked(None) => self.url.clone(),
        }
    }

    /// `GET info/refs?service=…`, following redirects only when this is the first advertisement
    /// and only within the repository's origin (so never from https to http, and the credentials
    /// never reach another host). The redirected base is used for every later request.
    async fn advertisement_response(&self, service: Service) -> Result<reqwest::Response, Error> {
        let first = {
            let mut base = lock(&self.base);
            let first = matches!(*base, Base::Unasked);
            if first {
                *base = Base::Asked(None);
            }
            first
        };
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
                .ok_or(Error::Redirect(Redirect::NoLocation))?;
            let origin = next.origin().ascii_serialization();
            if !first {
                return Err(Error::Redirect(Redirect::Later(origin)));
            }
            if !same_origin(&self.url, next.as_str()) {
                return Err(Error::Redirect(Redirect::OtherOrigin(origin)));
            }
            let base = next
                .as_str()
                .split_once("/info/refs")
                .map(|(base, _)| base.to_owned())
                .ok_or(Error::Redirect(Redirect::NotInfoRefs(origin)))?;
            tracing::info!(to = %next.path(), "following the remote's redirect of the first ref advertisement");
            *lock(&self.base) = Base::Asked(Some(base));
            url = next.into();
        }
        Err(Error::Redirect(Redirect::TooMany(MAX_REDIRECTS)))
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
        limit: u64,
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
        self.read_capped(response, what, limit).await
    }

    /// The body of `GET info/refs?service=…`, checked to be a smart-HTTP advertisement.
    async fn advertisement_body(&self, service: Service, limit: u64) -> Result<Vec<u8>, Error> {
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
            return Err(Error::NotSmart(NotSmart::ContentType {
                found: content_type.to_owned(),
                expected,
            }));
        }
        self.read_capped(response, "ref advertisement", limit).await
    }

    /// `POST <service>` with `body`; `v2` asks for protocol v2.
    async fn post(
        &self,
        service: Service,
        body: Vec<u8>,
        v2: bool,
        what: &'static str,
        limit: u64,
    ) -> Result<Vec<u8>, Error> {
        let name = service.name();
        let mut request = self
            .client
            .post(format!("{}/{name}", self.base()))
            .header(CONTENT_TYPE, format!("application/x-{name}-request"))
            .header(ACCEPT, format!("application/x-{name}-result"));
        if v2 {
            request = request.header("Git-Protocol", HeaderValue::from_static("version=2"));
        }
        self.send(request.body(body), what, limit).await
    }
}

#[async_trait::async_trait]
impl Wire for Http {
    /// One request; the service announcement smart HTTP puts first is checked and dropped.
    async fn advertise(&self, service: Service, limit: u64) -> Result<Vec<u8>, Error> {
        let body = self.advertisement_body(service, limit).await?;
        Ok(strip_announcement(&body, service)?.to_vec())
    }

    async fn exchange(
        &self,
        service: Service,
        request: Vec<u8>,
        limit: u64,
    ) -> Result<Vec<u8>, Error> {
        let what = match service {
            Service::UploadPack => "fetch",
            Service::ReceivePack => "push",
        };
        self.post(service, request, false, what, limit).await
    }

    fn carries_v2(&self) -> bool {
        true
    }

    async fn exchange_v2(&self, request: Vec<u8>, limit: u64) -> Result<Vec<u8>, Error> {
        self.post(Service::UploadPack, request, true, "fetch of blobs", limit)
            .await
    }
}

/// What follows the service announcement smart HTTP puts before the refs (`# service=…`, then a
/// flush), which is checked.
pub fn strip_announcement(body: &[u8], service: Service) -> Result<&[u8], Error> {
    let mut reader = pkt::Reader::new(body);
    let first = reader
        .next_line()?
        .ok_or(Error::NotSmart(NotSmart::Empty))?;
    let announced = format!("# service={}", service.name());
    if first != announced.as_bytes() {
        return Err(Error::NotSmart(NotSmart::NoAnnouncement));
    }
    // A flush ends the announcement.
    if reader.next_frame()? != Some(pkt::Frame::Flush) {
        return Err(Error::NotSmart(NotSmart::NoFlush));
    }
    Ok(reader.rest())
}

#[cfg(test)]
mod tests;
