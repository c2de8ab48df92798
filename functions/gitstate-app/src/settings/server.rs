//! The server: where it listens, TLS, how long a request may take, streaming, the access log.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::{ConfigError, Vars};

#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// `GITSTATE_LISTEN`: address of the local server (default `127.0.0.1:8080`).
    pub listen: SocketAddr,
    /// `GITSTATE_TLS_CERT` / `GITSTATE_TLS_KEY` / `GITSTATE_TLS_CLIENT_CA`: the local server's
    /// PEM files (checked when the listener is set up).
    pub tls: TlsFiles,
    /// `GITSTATE_INSECURE_LISTEN`: a non-loopback address without TLS is allowed.
    pub insecure_listen: bool,
    /// `GITSTATE_ACCESS_LOG`: one log line per request.
    pub access_log: bool,
    /// `GITSTATE_REQUEST_DEADLINE_SECS`: longest time one request may take before it is answered
    /// 504 (default 50, under the Lambda's 60 s; on Lambda the invocation's own deadline, less
    /// 2 s, applies too).
    pub request_deadline: Duration,
    /// `GITSTATE_RESPONSE_STREAMING` (default false): the Function URL uses
    /// `InvokeMode: RESPONSE_STREAM`, so the Lambda streams responses and states over 6 MB can
    /// be read. Without it they are refused with 413 rather than truncated.
    pub response_streaming: bool,
}

/// Paths of the local server's TLS files, as given.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub client_ca: Option<PathBuf>,
}

impl ServerSettings {
    pub(crate) fn read(vars: &Vars<'_>) -> Result<Self, ConfigError> {
        let listen = vars
            .get("GITSTATE_LISTEN")
            .unwrap_or_else(|| "127.0.0.1:8080".into());
        let path = |var| vars.get(var).map(PathBuf::from);
        Ok(Self {
            listen: listen.parse().map_err(|_| ConfigError::Invalid {
                var: "GITSTATE_LISTEN",
                reason: format!("{listen:?} is not an address like 127.0.0.1:8080"),
            })?,
            tls: TlsFiles {
                cert: path("GITSTATE_TLS_CERT"),
                key: path("GITSTATE_TLS_KEY"),
                client_ca: path("GITSTATE_TLS_CLIENT_CA"),
            },
            insecure_listen: vars.flag("GITSTATE_INSECURE_LISTEN")?,
            access_log: vars.flag("GITSTATE_ACCESS_LOG")?,
            request_deadline: Duration::from_secs(
                vars.number("GITSTATE_REQUEST_DEADLINE_SECS", 50)?,
            ),
            response_streaming: vars.flag("GITSTATE_RESPONSE_STREAMING")?,
        })
    }
}
