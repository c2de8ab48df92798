//! The wire a git conversation travels on: [`Wire`], one trait for smart HTTP(S) ([`http`]) and
//! SSH ([`ssh`]), each giving the ref advertisement of a service and one request/response
//! exchange, refused once an answer passes the size limit; [`pkt`] is the framing every wire
//! carries. What the bytes mean is the
//! [`crate::protocol`]'s business.

pub mod http;
pub mod pkt;
pub mod ssh;

use crate::Error;

pub use http::{Connection, Http, private_roots, same_origin};
pub use ssh::Ssh;

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

#[async_trait::async_trait]
pub trait Wire: Send + Sync {
    /// The ref advertisement of `service`: its pkt-lines of refs and capabilities up to and
    /// including the flush that ends them.
    async fn advertise(&self, service: Service, limit: u64) -> Result<Vec<u8>, Error>;

    /// One request to `service` and its whole response.
    async fn exchange(
        &self,
        service: Service,
        request: Vec<u8>,
        limit: u64,
    ) -> Result<Vec<u8>, Error>;

    /// Whether this wire carries protocol v2 (a fetch of blobs by id needs it).
    fn carries_v2(&self) -> bool {
        false
    }

    /// One protocol-v2 upload-pack request and its response.
    async fn exchange_v2(&self, _request: Vec<u8>, _limit: u64) -> Result<Vec<u8>, Error> {
        Err(Error::Protocol(
            "protocol v2 is not spoken over this wire".into(),
        ))
    }
}

/// Why no wire to a repository could be made: its URL or the credentials and certificates to
/// reach it. Each is the operator's to fix (a 500 naming the setting), never a remote's answer.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("repository URL: {0}")]
    Url(<reqwest::Url as std::str::FromStr>::Err),
    #[error("ssh repository {url:?}: {why}")]
    SshUrl { url: String, why: &'static str },
    #[error("refusing to send git credentials over plain http; use https://")]
    CredentialsOverHttp,
    #[error("git credentials contain characters a header cannot carry")]
    HeaderCredentials,
    #[error("GITSTATE_GIT_CA_FILE/GITSTATE_GIT_CA_PEM: {0}")]
    CaBundle(reqwest::Error),
    #[error("GITSTATE_GIT_CA_FILE/GITSTATE_GIT_CA_PEM: no certificate in the PEM text")]
    NoCertificate,
    /// The HTTP client could not be built (its TLS backend, say).
    #[error("git HTTP request failed")]
    Client(#[source] reqwest::Error),
}

/// The wire to `url`: SSH for `ssh://…` and `user@host:path`, smart HTTP(S) otherwise.
pub fn connect(url: &str, connection: &Connection<'_>) -> Result<Box<dyn Wire>, ConnectError> {
    if ssh::is_ssh(url) {
        return Ok(Box::new(Ssh::parse(url, connection.timeout)?));
    }
    Ok(Box::new(Http::new(url, connection)?))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use gitstate_core::ports::StoreError;

    use super::{Connection, connect, private_roots};
    use crate::{Error, GitAuth};

    /// Every way a wire cannot be made reads as it did before connecting had its own error
    /// (`configuration: …`), and is the operator's to fix: an internal error (500), never the
    /// remote's (502).
    #[test]
    fn connect_errors_read_as_configuration_and_are_internal() {
        let none = Connection::default();
        let with = |token| Connection {
            token: Some(token),
            timeout: Duration::from_secs(1),
            ..Connection::default()
        };
        let cases = [
            (
                connect("not a url", &none).err(),
                "repository URL: relative URL without a base",
            ),
            (
                connect("http://h.example/r.git", &with("t")).err(),
                "refusing to send git credentials over plain http; use https://",
            ),
            (
                connect(
                    "https://h.example/r.git",
                    &Connection {
                        auth: GitAuth::Bearer,
                        ..with("a\nb")
                    },
                )
                .err(),
                "git credentials contain characters a header cannot carry",
            ),
            (
                connect("ssh://-oProxyCommand=x/r", &none).err(),
                "ssh repository \"ssh://-oProxyCommand=x/r\": the host is not a host name",
            ),
            (
                connect("ssh://h:port/r", &none).err(),
                "ssh repository \"ssh://h:port/r\": the port is not a number",
            ),
            (
                private_roots("no pem here").err(),
                "GITSTATE_GIT_CA_FILE/GITSTATE_GIT_CA_PEM: no certificate in the PEM text",
            ),
        ];
        for (error, text) in cases {
            let error = Error::from(error.expect(text));
            assert_eq!(error.to_string(), format!("configuration: {text}"));
            assert!(
                matches!(StoreError::from(error), StoreError::Internal(_)),
                "{text}"
            );
        }
        assert!(connect("https://h.example/r.git", &with("t")).is_ok());
        assert!(connect("git@h.example:o/r.git", &none).is_ok());
    }
}
