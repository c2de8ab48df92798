//! Typed settings, read once from `GITSTATE_*` variables (or [`crate::layers`] for local use),
//! split by concern: the server, the git repository, encryption, access and limits.

mod access;
mod encryption;
mod git;
mod limits;
mod repository;
mod server;
#[cfg(test)]
mod tests;

use gitstate_core::NameError;
use gitstate_core::refs::RefPolicy;

pub use access::AccessSettings;
pub use encryption::EncryptionSettings;
pub use git::{GitAuth, GitSettings, StateRefs};
pub use limits::{BUFFERED_RESPONSE_LIMIT, DEFAULT_MAX_BODY_BYTES, LimitSettings};
pub use repository::{URL_FORMS, Wire, repository_url};
pub use server::{ConnectionSettings, ServerSettings, TlsFiles};

/// Where the process runs; it decides the defaults that differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// `gitstate serve` / `gitstate run`: caches and the embedded repository under `./.gitstate/`.
    Local,
    /// AWS Lambda: the only writable place is `/tmp`, and a hosted repository is required.
    Lambda,
}

/// Every setting, by concern. `Debug` never shows a secret.
#[derive(Debug, Clone)]
pub struct Settings {
    pub runtime: Runtime,
    pub server: ServerSettings,
    pub git: GitSettings,
    pub encryption: EncryptionSettings,
    pub access: AccessSettings,
    pub limits: LimitSettings,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{var}: {reason}")]
    Invalid { var: &'static str, reason: String },
    #[error("GITSTATE_REF: {0}")]
    Branch(#[source] NameError),
    #[error(
        "GITSTATE_REPOSITORY is required on Lambda (the embedded repository would live in /tmp and vanish)"
    )]
    RepositoryRequired,
    #[error("GITSTATE_ACCESS and GITSTATE_ACCESS_FILE are both set: choose one")]
    TwoAccessSources,
    #[error("GITSTATE_GIT_TOKEN and GITSTATE_GIT_TOKEN_KMS are both set: choose one")]
    TwoGitTokens,
    #[error("GITSTATE_ADMIN_HASH and GITSTATE_ADMIN_HASH_KMS are both set: choose one")]
    TwoAdminHashes,
    #[error("GITSTATE_ENCRYPTION=enforced needs GITSTATE_KMS_KEY_IDS or GITSTATE_AGE_RECIPIENTS")]
    EnforcedWithoutKeys,
    #[error("GITSTATE_KMS_PREVIOUS_KEY_IDS needs GITSTATE_KMS_KEY_IDS")]
    PreviousWithoutKeys,
}

impl Settings {
    /// Read the process environment.
    pub fn from_env(runtime: Runtime) -> Result<Self, ConfigError> {
        Self::from_lookup(runtime, |key| std::env::var(key).ok())
    }

    /// Read settings from any lookup (the environment, layered local settings, a map in tests).
    pub fn from_lookup(
        runtime: Runtime,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let vars = Vars(&lookup);
        let git = GitSettings::read(runtime, &vars)?;
        let server = ServerSettings::read(&vars)?;
        let limits = LimitSettings::read(runtime, server.response_streaming, &vars)?;
        Ok(Self {
            runtime,
            git,
            encryption: encryption::read(&vars)?,
            access: AccessSettings::read(&vars)?,
            server,
            limits,
        })
    }

    /// The branches requests may address (checked when the settings were read).
    pub fn ref_policy(&self) -> Result<RefPolicy, ConfigError> {
        self.git.ref_policy()
    }
}

/// The variables, trimmed; an empty value is an unset one.
pub(crate) struct Vars<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Vars<'_> {
    pub(crate) fn get(&self, var: &str) -> Option<String> {
        (self.0)(var)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    }

    /// A positive whole number, `default` when unset.
    pub(crate) fn number(&self, var: &'static str, default: u64) -> Result<u64, ConfigError> {
        self.get(var).map_or(Ok(default), |v| {
            v.parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or(ConfigError::Invalid {
                    var,
                    reason: format!("{v:?} is not a positive whole number"),
                })
        })
    }

    /// A yes/no setting: `true`/`1` or `false`/`0`, false when unset.
    pub(crate) fn flag(&self, var: &'static str) -> Result<bool, ConfigError> {
        match self.get(var).as_deref() {
            None | Some("false" | "0") => Ok(false),
            Some("true" | "1") => Ok(true),
            Some(other) => Err(ConfigError::Invalid {
                var,
                reason: format!("{other:?} is not true or false"),
            }),
        }
    }

    /// A comma-separated list, blanks dropped.
    pub(crate) fn list(&self, var: &str) -> Vec<String> {
        self.get(var)
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }
}
