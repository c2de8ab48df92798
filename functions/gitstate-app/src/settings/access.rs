//! Who may do what: where the access policy comes from, the bootstrap administrator, how long a
//! warm process trusts the access file it read.

use std::time::Duration;

use gitstate_core::auth::{AccessOptions, AccessSource};
use gitstate_core::secret::Secret;

use super::{ConfigError, Vars};

/// `GITSTATE_ACCESS` (the access file's text) or `GITSTATE_ACCESS_FILE` (its path), else
/// `.gitstate/access.toml` in the repository; `GITSTATE_ADMIN_USER` (default `admin`) with
/// `GITSTATE_ADMIN_HASH` adds a bootstrap administrator; `GITSTATE_ACCESS_REFRESH_SECS`
/// (default 10) bounds how long a warm process trusts the branch tip it saw last before looking
/// for a changed access file.
#[derive(Debug, Clone)]
pub struct AccessSettings {
    /// The policy's text when given by a setting (it holds password hashes); `None`: the file in
    /// the repository.
    pub text: Option<Secret>,
    /// A bootstrap administrator: user name and argon2id hash.
    pub bootstrap: Option<(String, Secret)>,
    /// `GITSTATE_ADMIN_HASH_KMS`: the bootstrap administrator's hash as base64 of a KMS
    /// ciphertext (context `{"gitstate:purpose": "admin-hash"}`, plus the team), so the hash is
    /// not readable in the function's configuration; decrypted once by [`crate::build`].
    pub bootstrap_kms: Option<(String, Secret)>,
    pub refresh: Duration,
    /// The memory one argon2 check may take (KiB): half of what the process has, see
    /// [`process_memory_bytes`].
    pub hash_memory_kib: u32,
}

/// The memory this process really has: on Lambda the function's configured size
/// (`AWS_LAMBDA_FUNCTION_MEMORY_SIZE`, in MB), else the smaller of its cgroup's limit and the
/// machine's memory (`None`: neither could be read).
pub(crate) fn process_memory_bytes(vars: &Vars<'_>) -> Result<Option<u64>, ConfigError> {
    if let Some(mb) = vars.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE") {
        let mb = mb.parse::<u64>().map_err(|_| ConfigError::Invalid {
            var: "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
            reason: format!("{mb:?} is not a whole number of MB"),
        })?;
        return Ok(Some(mb.saturating_mul(1 << 20)));
    }
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let cgroup = read("/sys/fs/cgroup/memory.max")
        .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
        .and_then(|text| text.trim().parse::<u64>().ok());
    let machine = read("/proc/meminfo").and_then(|text| {
        text.lines()
            .find_map(|line| line.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|kb| kb.trim().parse::<u64>().ok())
            .map(|kb| kb.saturating_mul(1024))
    });
    Ok(match (cgroup, machine) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    })
}

impl AccessSettings {
    pub(crate) fn read(vars: &Vars<'_>) -> Result<Self, ConfigError> {
        let text = match (
            vars.get("GITSTATE_ACCESS"),
            vars.get("GITSTATE_ACCESS_FILE"),
        ) {
            (Some(_), Some(_)) => return Err(ConfigError::TwoAccessSources),
            (Some(text), None) => Some(text),
            (None, Some(path)) => {
                Some(
                    std::fs::read_to_string(&path).map_err(|e| ConfigError::Invalid {
                        var: "GITSTATE_ACCESS_FILE",
                        reason: format!("cannot read {path:?}: {e}"),
                    })?,
                )
            }
            (None, None) => None,
        };
        let refresh = match vars.get("GITSTATE_ACCESS_REFRESH_SECS") {
            None => 10,
            Some(v) => v.parse::<u64>().map_err(|_| ConfigError::Invalid {
                var: "GITSTATE_ACCESS_REFRESH_SECS",
                reason: format!("{v:?} is not a whole number of seconds"),
            })?,
        };
        let user = || {
            vars.get("GITSTATE_ADMIN_USER")
                .unwrap_or_else(|| "admin".into())
        };
        let bootstrap = vars.get("GITSTATE_ADMIN_HASH");
        let bootstrap_kms = vars.get("GITSTATE_ADMIN_HASH_KMS");
        if bootstrap.is_some() && bootstrap_kms.is_some() {
            return Err(ConfigError::TwoAdminHashes);
        }
        Ok(Self {
            text: text.map(Secret::new),
            bootstrap: bootstrap.map(|hash| (user(), Secret::new(hash))),
            bootstrap_kms: bootstrap_kms.map(|sealed| (user(), Secret::new(sealed))),
            refresh: Duration::from_secs(refresh),
            hash_memory_kib: process_memory_bytes(vars)?.map_or(
                gitstate_core::password::MAX_MEMORY_KIB,
                gitstate_core::password::hash_memory_budget,
            ),
        })
    }

    /// The core's access options.
    pub fn options(&self) -> AccessOptions {
        AccessOptions {
            source: match &self.text {
                Some(text) => AccessSource::Text(text.expose().to_owned()),
                None => AccessSource::Repository,
            },
            bootstrap: self.bootstrap.clone(),
            refresh: self.refresh,
            hash_memory_kib: self.hash_memory_kib,
        }
    }
}
