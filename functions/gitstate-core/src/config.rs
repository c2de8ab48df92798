//! Settings, read once from `GITSTATE_*` environment variables.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::auth::{AccessOptions, AccessSource};
use crate::refs::{AllowedRefs, RefPolicy};
use crate::service::Identity;
use crate::{BranchName, NameError};

/// A secret value: never printed, not even by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Where the process runs; it decides the defaults that differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// `gitstate serve`: caches and the embedded repository under `./.gitstate/`.
    Local,
    /// AWS Lambda: the only writable place is `/tmp`, and a hosted repository is required.
    Lambda,
}

#[derive(Debug, Clone)]
pub struct Settings {
    /// `GITSTATE_REPOSITORY`: the hosted repository (smart HTTP(S)); unset = the embedded local one.
    pub repository: Option<String>,
    /// `GITSTATE_ALLOWED_REPOSITORIES`: further repositories requests may name (comma-separated).
    pub allowed_repositories: Vec<String>,
    /// `GITSTATE_REF`: the branch states live on (default `main`).
    pub branch: BranchName,
    /// `GITSTATE_ALLOWED_REFS`: further branches `?ref=` may name (comma-separated; exact names
    /// or `prefix/*`). Refs that clash with the lock refs or the configured branch never are.
    pub allowed_refs: AllowedRefs,
    /// `GITSTATE_GIT_USERNAME` / `GITSTATE_GIT_TOKEN`: credentials for the hosted repository.
    pub git_username: Option<String>,
    pub git_token: Option<Secret>,
    /// `GITSTATE_GIT_AUTH`: how the token is sent, `basic` (default) or `bearer`.
    pub git_auth: GitAuth,
    /// `GITSTATE_GIT_CA_FILE` (a PEM bundle's path) and `GITSTATE_GIT_CA_PEM` (PEM text): private
    /// certificate authorities trusted for the git host in addition to the system roots.
    pub git_ca_pem: Option<String>,
    /// `GITSTATE_REQUIRE_ATOMIC` (default false): refuse remotes without atomic push instead of
    /// writing with the lock checked from the advertisement.
    pub require_atomic: bool,
    /// `GITSTATE_GIT_TOKEN_KMS`: the git token as base64 of a KMS ciphertext, encrypted under
    /// the context `{"gitstate:purpose": "git-token"}`; the Lambda decrypts it at cold start.
    pub git_token_kms: Option<String>,
    /// `GITSTATE_LOCK_REF_PREFIX`: where lock refs go (default `refs/heads/locks/`, as the seed tool).
    pub lock_ref_prefix: String,
    /// `GITSTATE_CACHE_DIR`: bare cache repositories (default `/tmp/gitstate` or `./.gitstate/cache`).
    pub cache_dir: PathBuf,
    /// `GITSTATE_LOCAL_REPOSITORY`: the embedded default repository (default `./.gitstate/repo.git`).
    pub local_repository: PathBuf,
    /// `GITSTATE_MAX_BODY_BYTES`: largest request body (default 6 MiB, the Function URL limit).
    pub max_body_bytes: usize,
    /// `GITSTATE_GIT_TIMEOUT_SECS`: timeout of one git HTTP request (default 20).
    pub git_timeout: Duration,
    /// `GITSTATE_GIT_MAX_RESPONSE_BYTES`: the most a git remote may send in one answer (ref
    /// advertisement, pack, push report; default 128 MiB); more is a 502.
    pub git_max_response_bytes: u64,
    /// `GITSTATE_HISTORY_MAX_DEPTH`: how many commits of the branch history paging and `?at=` may
    /// fetch at most (default 10000).
    pub history_max_depth: u32,
    /// `GITSTATE_REQUEST_DEADLINE_SECS`: longest time one request may take before it is answered
    /// 504 (default 50, under the Lambda's 60 s; on Lambda the invocation's own deadline, less
    /// 2 s, applies too).
    pub request_deadline: Duration,
    /// `GITSTATE_COMMITTER_NAME` / `GITSTATE_COMMITTER_EMAIL`: who commits are written as.
    pub committer: Identity,
    /// `GITSTATE_LISTEN`: address of the local server (default `127.0.0.1:8080`).
    pub listen: SocketAddr,
    /// Who may do what: `GITSTATE_ACCESS` (the access file's text) or `GITSTATE_ACCESS_FILE` (its
    /// path), else `.gitstate/access.toml` in the repository; `GITSTATE_ADMIN_USER` (default
    /// `admin`) with `GITSTATE_ADMIN_HASH` adds a bootstrap administrator;
    /// `GITSTATE_ACCESS_REFRESH_SECS` (default 10) bounds how long a warm process trusts the
    /// branch tip it saw last before looking for a changed access file.
    pub access: AccessOptions,
    /// `GITSTATE_RESPONSE_STREAMING` (default false): the Function URL uses
    /// `InvokeMode: RESPONSE_STREAM`, so the Lambda streams responses and states over 6 MB can
    /// be read. Without it they are refused with 413 rather than truncated.
    pub response_streaming: bool,
    /// Encryption at rest (see [`EncryptionSettings`]).
    pub encryption: EncryptionSettings,
}

/// How the git token goes to the host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GitAuth {
    /// `Authorization: Basic base64(user:token)`, what every host accepts for PATs.
    #[default]
    Basic,
    /// `Authorization: Bearer <token>` (Bitbucket Data Center project and repository tokens).
    Bearer,
}

/// `GITSTATE_KMS_KEY_IDS`: KMS keys (ARNs, aliases; comma-separated) every write is sealed
/// under, the first making the data key; `GITSTATE_KMS_PREVIOUS_KEY_IDS`: keys that may still
/// unwrap states sealed before a key change, never used to seal (with the current ones, the only
/// keys ever asked to unwrap); `GITSTATE_ENCRYPTION`: `optional` (default: plaintext
/// states are still served and encrypted on their next write) or `enforced` (states not under
/// the configured keys are refused until `gitstate rekey`); `GITSTATE_PASSPHRASE`: reads
/// terraform-backend-git's aes passphrase mode.
#[derive(Debug, Clone, Default)]
pub struct EncryptionSettings {
    pub kms_key_ids: Vec<String>,
    pub previous_kms_key_ids: Vec<String>,
    pub enforced: bool,
    pub passphrase: Option<Secret>,
}

impl EncryptionSettings {
    /// Whether states pass through encryption at all.
    pub fn is_configured(&self) -> bool {
        !self.kms_key_ids.is_empty() || self.passphrase.is_some()
    }
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
    #[error("GITSTATE_ENCRYPTION=enforced needs GITSTATE_KMS_KEY_IDS")]
    EnforcedWithoutKeys,
    #[error("GITSTATE_KMS_PREVIOUS_KEY_IDS needs GITSTATE_KMS_KEY_IDS")]
    PreviousWithoutKeys,
}

pub const DEFAULT_MAX_BODY_BYTES: usize = 6 * 1024 * 1024;

impl Settings {
    /// The branches requests may address (checked when the settings were read).
    pub fn ref_policy(&self) -> Result<RefPolicy, ConfigError> {
        RefPolicy::new(
            self.branch.clone(),
            &self.lock_ref_prefix,
            self.allowed_refs.clone(),
        )
        .map_err(|e| ConfigError::Invalid {
            var: e.setting,
            reason: e.reason,
        })
    }

    /// Read the process environment.
    pub fn from_env(runtime: Runtime) -> Result<Self, ConfigError> {
        Self::from_lookup(runtime, |key| std::env::var(key).ok())
    }

    /// Read settings from any lookup (the environment, or a map in tests).
    pub fn from_lookup(
        runtime: Runtime,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let get = |key: &str| {
            lookup(key)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let repository = get("GITSTATE_REPOSITORY");
        if runtime == Runtime::Lambda && repository.is_none() {
            return Err(ConfigError::RepositoryRequired);
        }
        if let Some(url) = &repository {
            check_url("GITSTATE_REPOSITORY", url)?;
            if runtime == Runtime::Lambda
                && !url.starts_with("https://")
                && !url.starts_with("http://")
            {
                return Err(ConfigError::Invalid {
                    var: "GITSTATE_REPOSITORY",
                    reason: "the Lambda has no ssh: use the repository's https:// URL".into(),
                });
            }
        }
        let allowed_repositories: Vec<String> = get("GITSTATE_ALLOWED_REPOSITORIES")
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        for url in &allowed_repositories {
            check_url("GITSTATE_ALLOWED_REPOSITORIES", url)?;
        }
        let branch = BranchName::parse(&get("GITSTATE_REF").unwrap_or_else(|| "main".into()))
            .map_err(ConfigError::Branch)?;
        let lock_ref_prefix =
            get("GITSTATE_LOCK_REF_PREFIX").unwrap_or_else(|| "refs/heads/locks/".into());
        if !lock_ref_prefix.starts_with("refs/")
            || !lock_ref_prefix.ends_with('/')
            || lock_ref_prefix.contains("..")
        {
            return Err(ConfigError::Invalid {
                var: "GITSTATE_LOCK_REF_PREFIX",
                reason: "must start with 'refs/' and end with '/', e.g. refs/locks/".into(),
            });
        }
        let allowed_refs = AllowedRefs::parse(&get("GITSTATE_ALLOWED_REFS").unwrap_or_default())
            .map_err(|e| ConfigError::Invalid {
                var: "GITSTATE_ALLOWED_REFS",
                reason: e.to_string(),
            })?;
        RefPolicy::new(branch.clone(), &lock_ref_prefix, allowed_refs.clone()).map_err(|e| {
            ConfigError::Invalid {
                var: e.setting,
                reason: e.reason,
            }
        })?;
        let default_cache = match runtime {
            Runtime::Lambda => PathBuf::from("/tmp/gitstate"),
            Runtime::Local => PathBuf::from(".gitstate/cache"),
        };
        let number = |var: &'static str, default: u64| -> Result<u64, ConfigError> {
            get(var).map_or(Ok(default), |v| {
                v.parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or(ConfigError::Invalid {
                        var,
                        reason: format!("{v:?} is not a positive whole number"),
                    })
            })
        };
        let flag = |var: &'static str| -> Result<bool, ConfigError> {
            match get(var).as_deref() {
                None | Some("false" | "0") => Ok(false),
                Some("true" | "1") => Ok(true),
                Some(other) => Err(ConfigError::Invalid {
                    var,
                    reason: format!("{other:?} is not true or false"),
                }),
            }
        };
        let git_auth = match get("GITSTATE_GIT_AUTH").as_deref() {
            None | Some("basic") => GitAuth::Basic,
            Some("bearer") => GitAuth::Bearer,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    var: "GITSTATE_GIT_AUTH",
                    reason: format!("{other:?} is neither `basic` nor `bearer`"),
                });
            }
        };
        let git_ca_pem = git_ca_pem(get("GITSTATE_GIT_CA_FILE"), get("GITSTATE_GIT_CA_PEM"))?;
        let listen = get("GITSTATE_LISTEN").unwrap_or_else(|| "127.0.0.1:8080".into());
        if get("GITSTATE_GIT_TOKEN").is_some() && get("GITSTATE_GIT_TOKEN_KMS").is_some() {
            return Err(ConfigError::TwoGitTokens);
        }
        let encryption = EncryptionSettings {
            kms_key_ids: key_list(&get, "GITSTATE_KMS_KEY_IDS")?,
            previous_kms_key_ids: key_list(&get, "GITSTATE_KMS_PREVIOUS_KEY_IDS")?,
            enforced: match get("GITSTATE_ENCRYPTION").as_deref() {
                None | Some("optional") => false,
                Some("enforced") => true,
                Some(other) => {
                    return Err(ConfigError::Invalid {
                        var: "GITSTATE_ENCRYPTION",
                        reason: format!("{other:?} is neither `optional` nor `enforced`"),
                    });
                }
            },
            passphrase: get("GITSTATE_PASSPHRASE").map(Secret),
        };
        if encryption.enforced && encryption.kms_key_ids.is_empty() {
            return Err(ConfigError::EnforcedWithoutKeys);
        }
        if !encryption.previous_kms_key_ids.is_empty() && encryption.kms_key_ids.is_empty() {
            return Err(ConfigError::PreviousWithoutKeys);
        }
        let source = match (get("GITSTATE_ACCESS"), get("GITSTATE_ACCESS_FILE")) {
            (Some(_), Some(_)) => return Err(ConfigError::TwoAccessSources),
            (Some(text), None) => AccessSource::Text(text),
            (None, Some(path)) => {
                AccessSource::Text(std::fs::read_to_string(&path).map_err(|e| {
                    ConfigError::Invalid {
                        var: "GITSTATE_ACCESS_FILE",
                        reason: format!("cannot read {path:?}: {e}"),
                    }
                })?)
            }
            (None, None) => AccessSource::Repository,
        };
        let refresh = match get("GITSTATE_ACCESS_REFRESH_SECS") {
            None => 10,
            Some(v) => v.parse::<u64>().map_err(|_| ConfigError::Invalid {
                var: "GITSTATE_ACCESS_REFRESH_SECS",
                reason: format!("{v:?} is not a whole number of seconds"),
            })?,
        };
        let access = AccessOptions {
            source,
            bootstrap: get("GITSTATE_ADMIN_HASH").map(|hash| {
                (
                    get("GITSTATE_ADMIN_USER").unwrap_or_else(|| "admin".into()),
                    Secret(hash),
                )
            }),
            refresh: Duration::from_secs(refresh),
        };
        Ok(Self {
            repository,
            allowed_repositories,
            branch,
            allowed_refs,
            git_username: get("GITSTATE_GIT_USERNAME"),
            git_token: get("GITSTATE_GIT_TOKEN").map(Secret),
            git_auth,
            git_ca_pem,
            require_atomic: flag("GITSTATE_REQUIRE_ATOMIC")?,
            git_token_kms: get("GITSTATE_GIT_TOKEN_KMS"),
            lock_ref_prefix,
            cache_dir: get("GITSTATE_CACHE_DIR").map_or(default_cache, PathBuf::from),
            local_repository: get("GITSTATE_LOCAL_REPOSITORY")
                .map_or_else(|| PathBuf::from(".gitstate/repo.git"), PathBuf::from),
            max_body_bytes: usize::try_from(number(
                "GITSTATE_MAX_BODY_BYTES",
                DEFAULT_MAX_BODY_BYTES as u64,
            )?)
            .unwrap_or(usize::MAX),
            git_timeout: Duration::from_secs(number("GITSTATE_GIT_TIMEOUT_SECS", 20)?),
            git_max_response_bytes: number("GITSTATE_GIT_MAX_RESPONSE_BYTES", 128 << 20)?,
            history_max_depth: u32::try_from(number("GITSTATE_HISTORY_MAX_DEPTH", 10_000)?)
                .unwrap_or(u32::MAX),
            request_deadline: Duration::from_secs(number("GITSTATE_REQUEST_DEADLINE_SECS", 50)?),
            committer: Identity {
                name: get("GITSTATE_COMMITTER_NAME").unwrap_or_else(|| "gitstate".into()),
                email: get("GITSTATE_COMMITTER_EMAIL")
                    .unwrap_or_else(|| "gitstate@localhost".into()),
            },
            listen: listen.parse().map_err(|_| ConfigError::Invalid {
                var: "GITSTATE_LISTEN",
                reason: format!("{listen:?} is not an address like 127.0.0.1:8080"),
            })?,
            access,
            response_streaming: match get("GITSTATE_RESPONSE_STREAMING").as_deref() {
                None | Some("false" | "0") => false,
                Some("true" | "1") => true,
                Some(other) => {
                    return Err(ConfigError::Invalid {
                        var: "GITSTATE_RESPONSE_STREAMING",
                        reason: format!("{other:?} is not true or false"),
                    });
                }
            },
            encryption,
        })
    }
}

/// A comma-separated list of KMS keys, each a strictly parsed ARN or a bare alias or key ID.
fn key_list(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
) -> Result<Vec<String>, ConfigError> {
    let Some(value) = get(var) else {
        return Ok(Vec::new());
    };
    let mut keys = Vec::new();
    for key in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        crate::kms_key::KeyName::parse(key).map_err(|e| ConfigError::Invalid {
            var,
            reason: e.to_string(),
        })?;
        if !keys.iter().any(|k| k == key) {
            keys.push(key.to_owned());
        }
    }
    Ok(keys)
}

/// The private CA bundle: the file's PEM text and the variable's, together (either may be unset).
/// Only the shape is checked here; the git adapter parses the certificates.
fn git_ca_pem(file: Option<String>, pem: Option<String>) -> Result<Option<String>, ConfigError> {
    let mut bundle = String::new();
    if let Some(path) = file {
        let text = std::fs::read_to_string(&path).map_err(|e| ConfigError::Invalid {
            var: "GITSTATE_GIT_CA_FILE",
            reason: format!("cannot read {path:?}: {e}"),
        })?;
        if !text.contains("-----BEGIN CERTIFICATE-----") {
            return Err(ConfigError::Invalid {
                var: "GITSTATE_GIT_CA_FILE",
                reason: format!("{path:?} holds no PEM certificate"),
            });
        }
        bundle.push_str(&text);
        bundle.push('\n');
    }
    if let Some(text) = pem.map(|t| unflatten_pem(&t)) {
        if !text.contains("-----BEGIN CERTIFICATE-----") {
            return Err(ConfigError::Invalid {
                var: "GITSTATE_GIT_CA_PEM",
                reason: "holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
            });
        }
        bundle.push_str(&text);
        bundle.push('\n');
    }
    Ok(Some(bundle).filter(|b| !b.is_empty()))
}

/// PEM text whose newlines became spaces (a CloudFormation parameter or an environment variable
/// typed on one line) with its lines back; PEM with newlines is returned unchanged.
fn unflatten_pem(text: &str) -> String {
    if text.trim().contains('\n') {
        return text.to_owned();
    }
    let mut out = String::new();
    for part in text.split("-----").map(str::trim).filter(|p| !p.is_empty()) {
        if part.starts_with("BEGIN ") || part.starts_with("END ") {
            out.push_str(&format!("-----{part}-----\n"));
        } else {
            for chunk in part.split_whitespace() {
                out.push_str(chunk);
                out.push('\n');
            }
        }
    }
    out
}

/// Why `url` carries a credential, if it does: any user part of an http(s) URL (a token is often
/// sent as the user name alone), a password in an `ssh://` URL. The user name of an SSH remote
/// (`git@host:path`, `ssh://git@host/path`) is not a secret. The reason never repeats the URL.
pub fn credentials_in_url(url: &str) -> Option<&'static str> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let (userinfo, _) = authority.rsplit_once('@')?;
    if scheme.eq_ignore_ascii_case("ssh") {
        userinfo
            .contains(':')
            .then_some("the URL carries a password (user:password@)")
    } else {
        Some("the URL carries credentials (user@ or user:token@)")
    }
}

fn check_url(var: &'static str, url: &str) -> Result<(), ConfigError> {
    // ssh:// and user@host:path: the local server reaches them through the system ssh.
    let scp_like = !url.contains("://")
        && url.split_once(':').is_some_and(|(host, path)| {
            !host.is_empty() && !host.contains('/') && !path.is_empty()
        });
    if let Some(reason) = credentials_in_url(url) {
        return Err(ConfigError::Invalid {
            var,
            reason: format!(
                "{reason}: set GITSTATE_GIT_USERNAME / GITSTATE_GIT_TOKEN instead (or, for local \
                 use, let `git credential` supply them)"
            ),
        });
    }
    if url.starts_with("https://")
        || url.starts_with("http://")
        || url.starts_with("ssh://")
        || scp_like
    {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            var,
            reason: format!("{url:?} is neither an http(s):// URL nor an SSH remote"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(runtime: Runtime, vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        Settings::from_lookup(runtime, |k| map.get(k).cloned())
    }

    #[test]
    fn local_defaults() {
        let s = settings(Runtime::Local, &[]).expect("defaults are valid");
        assert_eq!(
            (s.repository, s.branch.as_str(), s.max_body_bytes),
            (None, "main", 6 * 1024 * 1024)
        );
        assert_eq!(s.cache_dir, PathBuf::from(".gitstate/cache"));
        assert_eq!(s.lock_ref_prefix, "refs/heads/locks/");
    }

    #[test]
    fn lambda_needs_a_repository_and_uses_tmp() {
        assert!(matches!(
            settings(Runtime::Lambda, &[]),
            Err(ConfigError::RepositoryRequired)
        ));
        let s = settings(
            Runtime::Lambda,
            &[
                ("GITSTATE_REPOSITORY", "https://h/o/r.git"),
                ("GITSTATE_GIT_TOKEN", "t0k"),
            ],
        )
        .expect("valid");
        assert_eq!(s.cache_dir, PathBuf::from("/tmp/gitstate"));
        for ssh in ["ssh://git@h/o/r.git", "git@h:o/r.git"] {
            let vars = [("GITSTATE_REPOSITORY", ssh)];
            assert!(settings(Runtime::Lambda, &vars).is_err(), "{ssh}");
            assert!(settings(Runtime::Local, &vars).is_ok(), "{ssh}");
        }
        assert!(
            !format!("{s:?}").contains("t0k"),
            "the token must not be printed"
        );
    }

    #[test]
    fn encryption_settings() {
        let s = settings(
            Runtime::Local,
            &[
                (
                    "GITSTATE_KMS_KEY_IDS",
                    " alias/a , arn:aws:kms:eu-west-1:123456789012:key/mrk-0123456789abcdef0123456789abcdef,",
                ),
                (
                    "GITSTATE_KMS_PREVIOUS_KEY_IDS",
                    "1234abcd-12ab-34cd-56ef-1234567890ab",
                ),
                ("GITSTATE_ENCRYPTION", "enforced"),
                ("GITSTATE_PASSPHRASE", "pw-123"),
            ],
        )
        .expect("valid");
        assert_eq!(
            s.encryption.kms_key_ids,
            [
                "alias/a",
                "arn:aws:kms:eu-west-1:123456789012:key/mrk-0123456789abcdef0123456789abcdef"
            ]
        );
        assert_eq!(
            s.encryption.previous_kms_key_ids,
            ["1234abcd-12ab-34cd-56ef-1234567890ab"]
        );
        assert!(s.encryption.enforced && s.encryption.is_configured());
        assert!(!format!("{s:?}").contains("pw-123"));
        let plain = settings(Runtime::Local, &[]).expect("valid");
        assert!(!plain.encryption.is_configured());
    }

    #[test]
    fn refuses_bad_values() {
        for vars in [
            [("GITSTATE_REPOSITORY", "ftp://github.com/o/r.git")],
            [("GITSTATE_LOCK_REF_PREFIX", "locks/")],
            [("GITSTATE_MAX_BODY_BYTES", "-1")],
            [("GITSTATE_REF", "a..b")],
            [("GITSTATE_LISTEN", "nowhere")],
            [("GITSTATE_ENCRYPTION", "enforced")],
            [("GITSTATE_ENCRYPTION", "sometimes")],
            [("GITSTATE_REF", "locks")],
            [("GITSTATE_REF", "locks/main")],
            [("GITSTATE_ALLOWED_REFS", "locks/*")],
            [("GITSTATE_ALLOWED_REFS", "main/x")],
            [("GITSTATE_ALLOWED_REFS", "env/*/x")],
            [("GITSTATE_KMS_PREVIOUS_KEY_IDS", "alias/old")],
            [("GITSTATE_HISTORY_MAX_DEPTH", "0")],
            [("GITSTATE_GIT_MAX_RESPONSE_BYTES", "lots")],
            [("GITSTATE_GIT_AUTH", "digest")],
            [("GITSTATE_REQUIRE_ATOMIC", "yes")],
            [("GITSTATE_GIT_CA_PEM", "not a certificate")],
            [("GITSTATE_GIT_CA_FILE", "/nonexistent/ca.pem")],
        ] {
            assert!(settings(Runtime::Local, &vars).is_err(), "{vars:?}");
        }
        // a malformed key is a start-up error naming the setting it is in
        for var in ["GITSTATE_KMS_KEY_IDS", "GITSTATE_KMS_PREVIOUS_KEY_IDS"] {
            for bad in [
                "arn:aws:kms:us-east-1:1:key/b",
                "alias/aws/ebs",
                "tfstate",
                "alias/ok,arn:aws:kms:evil.example:123456789012:alias/x",
            ] {
                let error = settings(
                    Runtime::Local,
                    &[("GITSTATE_KMS_KEY_IDS", "alias/ok"), (var, bad)],
                )
                .expect_err(bad)
                .to_string();
                assert!(error.starts_with(var), "{error}");
            }
        }
    }

    /// Every URL shape with a credential in it, for both repository settings, is a start-up
    /// error that names the setting and the credential settings and never repeats the secret;
    /// the user name of an SSH remote is no secret and stays accepted.
    #[test]
    fn urls_with_credentials_are_refused() {
        let hosts = ["h.example", "h.example:8443", "127.0.0.1:9", "[::1]:8080"];
        let users = ["u", "x-access-token", "u%40corp", "", "oauth2"];
        let secrets = ["s3cr3t-tok", "p%3Aw%40d", "ghp_s3cr3tT0ken", ""];
        for scheme in ["https", "http"] {
            for host in hosts {
                for user in users {
                    for secret in secrets {
                        let userinfo = match (user, secret) {
                            ("", "") => "@".to_owned(),
                            (u, "") => format!("{u}@"),
                            (u, p) => format!("{u}:{p}@"),
                        };
                        for path in ["/o/r.git", "", "/o/r@x.git", "?x=1"] {
                            let url = format!("{scheme}://{userinfo}{host}{path}");
                            for var in ["GITSTATE_REPOSITORY", "GITSTATE_ALLOWED_REPOSITORIES"] {
                                let list = format!("https://ok.example/r.git,{url}");
                                let value = if var == "GITSTATE_REPOSITORY" {
                                    &url
                                } else {
                                    &list
                                };
                                let error = settings(Runtime::Local, &[(var, value)])
                                    .expect_err(&url)
                                    .to_string();
                                assert!(error.starts_with(var), "{error}");
                                assert!(error.contains("GITSTATE_GIT_TOKEN"), "{error}");
                                if !secret.is_empty() {
                                    assert!(!error.contains(secret), "{error}");
                                }
                            }
                        }
                    }
                }
            }
        }
        for ok in [
            "https://h.example/o/r.git",
            "http://127.0.0.1:8080/o/r@x.git",
            "git@h.example:o/r.git",
            "ssh://git@h.example/o/r.git",
            "ssh://git@h.example:2222/o/r.git",
        ] {
            for var in ["GITSTATE_REPOSITORY", "GITSTATE_ALLOWED_REPOSITORIES"] {
                assert!(settings(Runtime::Local, &[(var, ok)]).is_ok(), "{ok}");
            }
        }
        let error = settings(
            Runtime::Local,
            &[("GITSTATE_REPOSITORY", "ssh://git:pw-9@h.example/o/r.git")],
        )
        .expect_err("a password in an ssh URL")
        .to_string();
        assert!(!error.contains("pw-9"), "{error}");
    }

    #[test]
    fn ref_settings_name_the_setting_at_fault() {
        let error = settings(Runtime::Local, &[("GITSTATE_REF", "locks")])
            .expect_err("clashes with the lock refs");
        assert!(error.to_string().starts_with("GITSTATE_REF:"), "{error}");
        let error = settings(Runtime::Local, &[("GITSTATE_ALLOWED_REFS", "dev,locks")])
            .expect_err("clashes with the lock refs");
        assert!(
            error.to_string().starts_with("GITSTATE_ALLOWED_REFS:"),
            "{error}"
        );
        let s = settings(
            Runtime::Local,
            &[
                ("GITSTATE_REF", "locks"),
                ("GITSTATE_LOCK_REF_PREFIX", "refs/locks/"),
                ("GITSTATE_ALLOWED_REFS", "env/*, dev"),
            ],
        )
        .expect("refs/locks/ keeps lock refs off the branches");
        assert_eq!(s.allowed_refs.patterns().len(), 2);
        assert!(s.ref_policy().is_ok());
    }

    #[test]
    fn bounds_on_git_work() {
        let s = settings(Runtime::Local, &[]).expect("defaults");
        assert_eq!(
            (s.history_max_depth, s.git_max_response_bytes),
            (10_000, 128 << 20)
        );
        let s = settings(
            Runtime::Local,
            &[
                ("GITSTATE_HISTORY_MAX_DEPTH", "100"),
                ("GITSTATE_GIT_MAX_RESPONSE_BYTES", "4096"),
            ],
        )
        .expect("valid");
        assert_eq!((s.history_max_depth, s.git_max_response_bytes), (100, 4096));
    }

    #[test]
    fn git_host_settings() {
        let s = settings(Runtime::Local, &[]).expect("defaults");
        assert_eq!(
            (s.git_auth, s.git_ca_pem, s.require_atomic),
            (GitAuth::Basic, None, false)
        );
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let file = std::env::temp_dir().join(format!("gitstate-ca-{}.pem", std::process::id()));
        std::fs::write(&file, pem).expect("write");
        let path = file.display().to_string();
        let s = settings(
            Runtime::Local,
            &[
                ("GITSTATE_GIT_AUTH", "bearer"),
                ("GITSTATE_REQUIRE_ATOMIC", "true"),
                ("GITSTATE_GIT_CA_FILE", &path),
                ("GITSTATE_GIT_CA_PEM", pem),
            ],
        )
        .expect("valid");
        assert_eq!((s.git_auth, s.require_atomic), (GitAuth::Bearer, true));
        let bundle = s.git_ca_pem.expect("a bundle");
        let flat = pem.replace('\n', " ");
        let s = settings(Runtime::Local, &[("GITSTATE_GIT_CA_PEM", &flat)]).expect("valid");
        assert_eq!(s.git_ca_pem.as_deref().map(str::trim), Some(pem.trim()));
        assert_eq!(
            bundle.matches("BEGIN CERTIFICATE").count(),
            2,
            "file and text together"
        );
        let _ = std::fs::remove_file(file);
    }

    #[test]
    fn access_sources() {
        let s = settings(Runtime::Local, &[]).expect("defaults");
        assert_eq!(s.access.source, AccessSource::Repository);
        assert_eq!(s.access.refresh, Duration::from_secs(10));
        let dir = std::env::temp_dir().join(format!("gitstate-access-{}", std::process::id()));
        std::fs::write(&dir, "[users]\n").expect("write");
        let path = dir.display().to_string();
        let s = settings(
            Runtime::Local,
            &[
                ("GITSTATE_ACCESS_FILE", &path),
                ("GITSTATE_ADMIN_HASH", "$argon2id$…"),
                ("GITSTATE_ACCESS_REFRESH_SECS", "0"),
            ],
        )
        .expect("valid");
        assert_eq!(s.access.source, AccessSource::Text("[users]\n".into()));
        assert_eq!(s.access.refresh, Duration::ZERO);
        let (user, hash) = s.access.bootstrap.clone().expect("bootstrap");
        assert_eq!((user.as_str(), hash.expose()), ("admin", "$argon2id$…"));
        assert!(
            !format!("{s:?}").contains("argon2id"),
            "hashes stay out of Debug"
        );
        let _ = std::fs::remove_file(&dir);
        assert!(matches!(
            settings(
                Runtime::Local,
                &[("GITSTATE_ACCESS", "x"), ("GITSTATE_ACCESS_FILE", "y")]
            ),
            Err(ConfigError::TwoAccessSources)
        ));
        assert!(
            settings(
                Runtime::Local,
                &[("GITSTATE_ACCESS_FILE", "/nonexistent/x")]
            )
            .is_err()
        );
    }
}
