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
    /// How `gitstate serve` treats connections.
    pub connections: ConnectionSettings,
    /// `GITSTATE_TRUSTED_PROXIES`: addresses or CIDR blocks of reverse proxies in front of
    /// `gitstate serve`. A connection from one of them counts under the total cap only, and each
    /// of its requests is the client's that `X-Forwarded-For` names (the nearest address not
    /// itself a trusted proxy); the header of anyone else is ignored.
    pub trusted_proxies: Vec<ipnet::IpNet>,
}

/// `gitstate serve`'s bounds on connections, so slow or numerous clients cannot hold them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionSettings {
    /// `GITSTATE_HEADER_TIMEOUT_SECS` (default 10): how long a connection may take to send a
    /// whole request head, counted from when it is ready for one: just opened (after the TLS
    /// handshake) or idle after an answer (the keep-alive timeout too).
    pub header_timeout: Duration,
    /// `GITSTATE_BODY_TIMEOUT_SECS` (default 20): the longest wait for the next piece of a
    /// request body, or for the client to take more of its answer.
    pub body_timeout: Duration,
    /// `GITSTATE_MAX_CONNECTIONS` (default 1024, and never more than the open-file limit allows):
    /// connections open at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// `GITSTATE_MAX_CONNECTIONS_PER_ADDRESS` (default 64): connections open at once from one
    /// client address (IPv6: one /64); more are answered 503 and closed.
    pub max_per_address: usize,
}

impl Default for ConnectionSettings {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(20),
            max_connections: 1024,
            max_per_address: 64,
        }
    }
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
            connections: ConnectionSettings::read(vars)?,
            trusted_proxies: trusted_proxies(vars)?,
        })
    }
}

/// `GITSTATE_TRUSTED_PROXIES`: `10.0.0.5`, `10.0.0.0/8`, `fd00::/8`… (an address alone is its
/// own block).
fn trusted_proxies(vars: &Vars<'_>) -> Result<Vec<ipnet::IpNet>, ConfigError> {
    vars.list("GITSTATE_TRUSTED_PROXIES")
        .iter()
        .map(|entry| {
            entry
                .parse::<ipnet::IpNet>()
                .or_else(|_| entry.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| ConfigError::Invalid {
                    var: "GITSTATE_TRUSTED_PROXIES",
                    reason: format!("{entry:?} is not an address or a CIDR block like 10.0.0.0/8"),
                })
        })
        .collect()
}

impl ConnectionSettings {
    fn read(vars: &Vars<'_>) -> Result<Self, ConfigError> {
        let default = Self::default();
        let count = |var, default: usize| -> Result<usize, ConfigError> {
            let n = vars.number(var, default as u64)?;
            usize::try_from(n).map_err(|_| ConfigError::Invalid {
                var,
                reason: format!("{n} is too large"),
            })
        };
        Ok(Self {
            header_timeout: Duration::from_secs(vars.number(
                "GITSTATE_HEADER_TIMEOUT_SECS",
                default.header_timeout.as_secs(),
            )?),
            body_timeout: Duration::from_secs(
                vars.number("GITSTATE_BODY_TIMEOUT_SECS", default.body_timeout.as_secs())?,
            ),
            max_connections: count("GITSTATE_MAX_CONNECTIONS", default.max_connections)?,
            max_per_address: count(
                "GITSTATE_MAX_CONNECTIONS_PER_ADDRESS",
                default.max_per_address,
            )?,
        })
    }
}
