//! The wire a git conversation travels on: [`Wire`], one trait for smart HTTP(S) ([`http`]) and
//! SSH ([`ssh`]), each giving the ref advertisement of a service and one request/response
//! exchange, refused once an answer passes the size limit; [`pkt`] is the framing every wire
//! carries. What the bytes mean is the
//! [`crate::protocol`]'s business.

mod error;
pub mod http;
pub mod pkt;
pub mod ssh;

pub use error::{Error, Framing, NotSmart, Redirect};
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
        Err(Error::NoV2)
    }
}

/// Why no wire to a repository could be made: its URL or the credentials and certificates to
/// reach it. Each is the operator's to fix (a 500 naming the setting), never a remote's answer.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("repository URL: {0}")]
    Url(<reqwest::Url as std::str::FromStr>::Err),
    #[error("ssh repository {url:?}: {why}")]
    SshUrl { url: String, why: ssh::BadSshUrl },
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

/// What [`connect`] makes of `url` alone, without making the wire (no HTTP client is built):
/// the SSH URL read as git reads it, or the HTTP(S) URL parsed.
pub fn check_url(url: &str) -> Result<(), ConnectError> {
    if ssh::is_ssh(url) {
        return Ssh::parse(url, std::time::Duration::ZERO).map(drop);
    }
    reqwest::Url::parse(url)
        .map(drop)
        .map_err(ConnectError::Url)
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
    use crate::{GitAuth, RemoteError};

    /// `check_url` refuses exactly the URLs `connect` refuses without credentials: git's SSH
    /// forms, HTTP(S) and what is neither, generated from their parts.
    #[test]
    fn check_url_agrees_with_connect() {
        let none = Connection::default();
        let mut urls = Vec::new();
        for scheme in [
            "ssh://",
            "git+ssh://",
            "ssh+git://",
            "https://",
            "http://",
            "git://",
            "",
        ] {
            for user in ["", "git@", "-o@", "a:pw@"] {
                for host in ["h.example", "[::1]", "-oProxyCommand=x", "h:port", ""] {
                    for path in ["/o/r.git", "/~u/r", "/", "", "/-x", ":o/r.git"] {
                        urls.push(format!("{scheme}{user}{host}{path}"));
                    }
                }
            }
        }
        let (mut ok, mut refused) = (0, 0);
        for url in &urls {
            let checked = super::check_url(url).is_ok();
            assert_eq!(checked, connect(url, &none).is_ok(), "{url}");
            if checked { ok += 1 } else { refused += 1 }
        }
        assert!(
            ok > 100 && refused > 100,
            "{ok} accepted, {refused} refused"
        );
    }

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
                "ssh repository \"ssh://h:port/r\": invalid port number - must be between 1-65535",
            ),
            (
                connect("ssh://git:secret@h/r", &none).err(),
                "ssh repository \"ssh://git:secret@h/r\": a password in an ssh URL is not used: ssh authenticates with keys",
            ),
            (
                connect("git@h:-oProxyCommand=x", &none).err(),
                "ssh repository \"git@h:-oProxyCommand=x\": the path is empty, starts with '-' or holds control characters",
            ),
            (
                private_roots("no pem here").err(),
                "GITSTATE_GIT_CA_FILE/GITSTATE_GIT_CA_PEM: no certificate in the PEM text",
            ),
        ];
        for (error, text) in cases {
            let error = RemoteError::from(error.expect(text));
            assert_eq!(error.to_string(), format!("configuration: {text}"));
            assert!(
                matches!(StoreError::from(error), StoreError::Internal(_)),
                "{text}"
            );
        }
        assert!(connect("https://h.example/r.git", &with("t")).is_ok());
        assert!(connect("git@h.example:o/r.git", &none).is_ok());
    }

    /// Every wire failure keeps the text and the kind it had as one of the crate's string
    /// variants, alone or as the source of any operation's error: the remote's refusals
    /// transient and the remote's fault (502), busy statuses unavailable (503), ssh that cannot
    /// start internal (500), the rest the remote's fault and not transient.
    #[test]
    fn wire_errors_keep_their_texts_and_classes() {
        use std::os::unix::process::ExitStatusExt;

        use super::{Error as Wire, Framing, NotSmart, Redirect};
        use crate::protocol::{AdvertError, FetchError, PushError};

        #[derive(Debug, PartialEq, Clone, Copy)]
        enum Class {
            Unavailable,
            Remote,
            Internal,
        }
        let class = |error: RemoteError| match StoreError::from(error) {
            StoreError::Unavailable(_) => Class::Unavailable,
            StoreError::Remote(_) => Class::Remote,
            StoreError::Internal(_) => Class::Internal,
            other => panic!("{other:?}"),
        };
        fn status(status: u16) -> Wire {
            Wire::Status {
                status,
                what: "push",
            }
        }
        let reports = "git remote reports: ";
        let garbled = "git protocol error: ";
        type Case = (fn() -> Wire, String, bool, Class);
        let cases: Vec<Case> = vec![
            (
                || Wire::Certificate {
                    host: "h".into(),
                    reason: "r".into(),
                },
                "certificate verification failed for git host h (r); trust its CA with GITSTATE_GIT_CA_FILE or GITSTATE_GIT_CA_PEM".into(),
                false,
                Class::Remote,
            ),
            (|| status(403), "git remote answered HTTP 403 to the push".into(), false, Class::Remote),
            (|| status(404), "git remote answered HTTP 404 to the push".into(), false, Class::Remote),
            (|| status(429), "git remote answered HTTP 429 to the push".into(), true, Class::Unavailable),
            (|| status(503), "git remote answered HTTP 503 to the push".into(), true, Class::Unavailable),
            (
                || Wire::Redirect(Redirect::NoLocation),
                format!("{reports}the remote redirected without a usable Location"),
                true,
                Class::Remote,
            ),
            (
                || Wire::Redirect(Redirect::OtherOrigin("https://o".into())),
                format!("{reports}the remote redirected to another origin (https://o); not followed, the git credentials go only to the configured repository's origin"),
                true,
                Class::Remote,
            ),
            (
                || Wire::Redirect(Redirect::TooMany(5)),
                format!("{reports}the remote redirected more than 5 times"),
                true,
                Class::Remote,
            ),
            (
                || Wire::too_large("ref advertisement", 10),
                format!("{reports}the remote's ref advertisement is larger than 10 bytes (GITSTATE_GIT_MAX_RESPONSE_BYTES)"),
                true,
                Class::Remote,
            ),
            (
                || Wire::NotSmart(NotSmart::NoAnnouncement),
                format!("{garbled}the server did not announce the service (not a smart HTTP server?)"),
                false,
                Class::Remote,
            ),
            (
                || Wire::Framing(Framing::Invalid("Received an invalid line of length 3".into())),
                format!("{garbled}bad pkt-line: Received an invalid line of length 3"),
                false,
                Class::Remote,
            ),
            (
                || Wire::Framing(Framing::NoPipe("stdout")),
                format!("{garbled}no stdout"),
                false,
                Class::Remote,
            ),
            (|| Wire::SideBand("fatal: x".into()), format!("{reports}fatal: x"), true, Class::Remote),
            (
                || Wire::NoV2,
                format!("{garbled}protocol v2 is not spoken over this wire"),
                false,
                Class::Remote,
            ),
            (
                || Wire::SshStart(std::io::Error::other("e")),
                "configuration: cannot start ssh (GIT_SSH_COMMAND, GIT_SSH or ssh): e".into(),
                false,
                Class::Internal,
            ),
            (|| Wire::SshSaid("denied".into()), format!("{reports}ssh: denied"), true, Class::Remote),
            (
                || Wire::SshEnded {
                    service: "git-upload-pack",
                    status: std::process::ExitStatus::from_raw(256),
                },
                format!("{reports}git-upload-pack over ssh ended with exit status: 1"),
                true,
                Class::Remote,
            ),
            (
                || Wire::SshTimeout(Duration::from_secs(2)),
                format!("{reports}ssh: no answer within 2s"),
                true,
                Class::Remote,
            ),
            (|| Wire::Io(std::io::Error::other("pipe")), "pipe".into(), false, Class::Internal),
        ];
        for (make, text, transient, expected) in cases {
            let wrapped = [
                RemoteError::from(make()),
                RemoteError::from(AdvertError::from(make())),
                RemoteError::from(FetchError::from(make())),
                RemoteError::from(PushError::from(make())),
            ];
            for error in wrapped {
                assert_eq!(error.to_string(), text);
                assert_eq!(error.is_transient(), transient, "{text}");
                assert_eq!(
                    error.refused(),
                    transient && expected == Class::Remote,
                    "{text}"
                );
                assert!(error.wire().is_some(), "{text}");
                assert_eq!(class(error), expected, "{text}");
            }
        }
    }
}
