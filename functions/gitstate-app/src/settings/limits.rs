//! Limits: request bodies, responses, and the git work one request may cause.

use super::{ConfigError, Runtime, Vars};

/// `GITSTATE_MAX_BODY_BYTES` by default: 6 MiB, the Function URL's request limit.
pub const DEFAULT_MAX_BODY_BYTES: usize = 6 * 1024 * 1024;

/// The payload limit of a buffered Function URL response.
pub const BUFFERED_RESPONSE_LIMIT: usize = 6 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct LimitSettings {
    /// `GITSTATE_MAX_BODY_BYTES`: largest request body (default 6 MiB, the Function URL limit).
    pub max_body_bytes: usize,
    /// Largest response payload the transport carries: [`BUFFERED_RESPONSE_LIMIT`] on a Lambda
    /// without `GITSTATE_RESPONSE_STREAMING` (larger states are refused with 413 rather than
    /// truncated); `None` when responses are streamed or served directly.
    pub max_response_bytes: Option<usize>,
    /// `GITSTATE_GIT_MAX_RESPONSE_BYTES`: the most a git remote may send in one answer (ref
    /// advertisement, pack, push report; default 128 MiB); more is a 502.
    pub git_max_response_bytes: u64,
    /// `GITSTATE_HISTORY_MAX_DEPTH`: how many commits of the branch history paging and `?at=` may
    /// fetch at most (default 10000).
    pub history_max_depth: u32,
    /// `GITSTATE_GIT_WRITES_PER_PUSH`: how many writes waiting at once in one process may leave
    /// in one push (default 32; 1 pushes every write alone).
    pub git_writes_per_push: usize,
}

impl LimitSettings {
    pub(crate) fn read(
        runtime: Runtime,
        streaming: bool,
        vars: &Vars<'_>,
    ) -> Result<Self, ConfigError> {
        let max_body_bytes =
            vars.number("GITSTATE_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES as u64)?;
        let history_max_depth = vars.number("GITSTATE_HISTORY_MAX_DEPTH", 10_000)?;
        let writes_per_push = vars.number("GITSTATE_GIT_WRITES_PER_PUSH", 32)?;
        if writes_per_push > 256 {
            return Err(ConfigError::Invalid {
                var: "GITSTATE_GIT_WRITES_PER_PUSH",
                reason: format!("{writes_per_push} is more than 256"),
            });
        }
        Ok(Self {
            max_body_bytes: usize::try_from(max_body_bytes).unwrap_or(usize::MAX),
            max_response_bytes: (runtime == Runtime::Lambda && !streaming)
                .then_some(BUFFERED_RESPONSE_LIMIT),
            git_max_response_bytes: vars.number("GITSTATE_GIT_MAX_RESPONSE_BYTES", 128 << 20)?,
            history_max_depth: u32::try_from(history_max_depth).unwrap_or(u32::MAX),
            git_writes_per_push: usize::try_from(writes_per_push).unwrap_or(1),
        })
    }
}
