//! Why the wire failed: every operation's error (advertisement, fetch, push) has this as its
//! source when the exchange itself, its framing or its host failed.

use std::process::ExitStatus;
use std::time::Duration;

/// A failure of the wire: the host could not be reached or answered with an error, an answer
/// broke git's framing, or the host reported a failure of its own.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("git HTTP request failed")]
    Http(#[source] reqwest::Error),
    #[error(
        "certificate verification failed for git host {host} ({reason}); trust its CA with GITSTATE_GIT_CA_FILE or GITSTATE_GIT_CA_PEM"
    )]
    Certificate { host: String, reason: String },
    #[error("git remote answered HTTP {status} to the {what}")]
    Status { status: u16, what: &'static str },
    #[error("git remote reports: {0}")]
    Redirect(Redirect),
    /// An answer over the size limit, over HTTP or SSH.
    #[error(
        "git remote reports: the remote's {what} is larger than {limit} bytes (GITSTATE_GIT_MAX_RESPONSE_BYTES)"
    )]
    TooLarge { what: String, limit: u64 },
    /// The host is not a smart-HTTP git server.
    #[error("git protocol error: {0}")]
    NotSmart(NotSmart),
    #[error("git protocol error: {0}")]
    Framing(Framing),
    /// A message on side-band channel 3: the remote's fatal error.
    #[error("git remote reports: {0}")]
    SideBand(String),
    #[error("git protocol error: protocol v2 is not spoken over this wire")]
    NoV2,
    #[error("configuration: cannot start ssh (GIT_SSH_COMMAND, GIT_SSH or ssh): {0}")]
    SshStart(std::io::Error),
    /// The last line ssh or the remote wrote on stderr.
    #[error("git remote reports: ssh: {0}")]
    SshSaid(String),
    #[error("git remote reports: {service} over ssh ended with {status}")]
    SshEnded {
        service: &'static str,
        status: ExitStatus,
    },
    #[error("git remote reports: ssh: no answer within {0:?}")]
    SshTimeout(Duration),
    /// Talking to the ssh process.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Why a redirect was not followed.
#[derive(Debug, thiserror::Error)]
pub enum Redirect {
    #[error("the remote redirected without a usable Location")]
    NoLocation,
    #[error("the remote redirected a later ref advertisement (to {0}); only the first is followed")]
    Later(String),
    #[error(
        "the remote redirected to another origin ({0}); not followed, the git credentials go only to the configured repository's origin"
    )]
    OtherOrigin(String),
    #[error("the remote redirected the ref advertisement to {0} but not to an info/refs path")]
    NotInfoRefs(String),
    #[error("the remote redirected more than {0} times")]
    TooMany(usize),
}

/// Why an answer to `GET info/refs` is not a smart-HTTP advertisement.
#[derive(Debug, thiserror::Error)]
pub enum NotSmart {
    #[error("ref advertisement has content type {found:?}, not {expected}")]
    ContentType { found: String, expected: String },
    #[error("empty ref advertisement")]
    Empty,
    #[error("the server did not announce the service (not a smart HTTP server?)")]
    NoAnnouncement,
    #[error("no flush after the service announcement")]
    NoFlush,
}

/// How a pkt-line stream broke.
#[derive(Debug, thiserror::Error)]
pub enum Framing {
    #[error("truncated pkt-line header")]
    TruncatedHeader,
    /// What `gix-packetline` says is wrong with a pkt-line's length.
    #[error("bad pkt-line: {0}")]
    Invalid(String),
    #[error("truncated pkt-line")]
    Truncated,
    #[error("side-band frame without a valid channel")]
    NoChannel,
    #[error("no {0}")]
    NoPipe(&'static str),
    #[error("the ssh session ended before the refs")]
    SshEndedBeforeRefs,
    #[error("bad pkt-line header over ssh")]
    SshHeader,
    #[error("bad pkt-line length over ssh")]
    SshLength,
}

impl Error {
    /// An answer over the size limit.
    pub(crate) fn too_large(what: impl Into<String>, limit: u64) -> Self {
        Self::TooLarge {
            what: what.into(),
            limit,
        }
    }

    /// The host answered, and what it said was a refusal or a failure of its own (a redirect
    /// not followed, an answer too large, a side-band or ssh error): a fresh look may get past
    /// it.
    pub fn refused(&self) -> bool {
        match self {
            Self::Redirect(_)
            | Self::TooLarge { .. }
            | Self::SideBand(_)
            | Self::SshSaid(_)
            | Self::SshEnded { .. }
            | Self::SshTimeout(_) => true,
            Self::Http(_)
            | Self::Certificate { .. }
            | Self::Status { .. }
            | Self::NotSmart(_)
            | Self::Framing(_)
            | Self::NoV2
            | Self::SshStart(_)
            | Self::Io(_) => false,
        }
    }

    /// What came back is not git's protocol: no smart-HTTP server, broken pkt-lines, no v2.
    pub fn garbled(&self) -> bool {
        matches!(self, Self::NotSmart(_) | Self::Framing(_) | Self::NoV2)
    }

    /// An HTTP status that may pass: a server error or "too many requests".
    pub fn busy(&self) -> bool {
        matches!(self, Self::Status { status, .. } if *status >= 500 || *status == 429)
    }

    /// The host could not be reached, or did not answer in time (a retry later may).
    pub fn unreachable(&self) -> bool {
        matches!(self, Self::Http(e) if e.is_timeout() || e.is_connect() || e.is_request() || e.is_body())
    }

    /// A failure on this side: ssh that cannot be started, its pipes.
    pub fn local(&self) -> bool {
        matches!(self, Self::SshStart(_) | Self::Io(_))
    }
}
