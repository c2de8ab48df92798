//! The git repository: where it is, which branches and repositories requests may name, how to
//! authenticate, whom commits are written as.

use std::path::PathBuf;
use std::time::Duration;

use gitstate_core::BranchName;
use gitstate_core::refs::{AllowedRefs, RefPolicy};
use gitstate_core::secret::Secret;
use gitstate_core::service::Identity;

pub use gitstate_git::{GitAuth, StateRefs};

use super::repository::{Wire, repository_url};
use super::{ConfigError, Runtime, Vars};

#[derive(Debug, Clone)]
pub struct GitSettings {
    /// `GITSTATE_REPOSITORY`: the hosted repository (smart HTTP(S) or SSH, see
    /// [`super::repository_url`]); unset = the embedded local one.
    pub repository: Option<String>,
    /// `GITSTATE_ALLOWED_REPOSITORIES`: further repositories requests may name (comma-separated).
    pub allowed_repositories: Vec<String>,
    /// `GITSTATE_REF`: the branch states live on (default `main`).
    pub branch: BranchName,
    /// `GITSTATE_ALLOWED_REFS`: further branches `?ref=` may name (comma-separated; exact names
    /// or `prefix/*`). Refs that clash with the lock refs or the configured branch never are.
    pub allowed_refs: AllowedRefs,
    /// `GITSTATE_LOCK_REF_PREFIX`: where lock refs go (default `refs/heads/locks/`, as the seed tool).
    pub lock_ref_prefix: String,
    /// `GITSTATE_GIT_USERNAME` / `GITSTATE_GIT_TOKEN`: credentials for the hosted repository.
    pub username: Option<String>,
    pub token: Option<Secret>,
    /// `GITSTATE_GIT_TOKEN_KMS`: the git token as base64 of a KMS ciphertext, encrypted under
    /// the context `{"gitstate:purpose": "git-token"}` (plus `"gitstate:team"` with
    /// [`Self::team`]); decrypted once by [`crate::build`].
    pub token_kms: Option<Secret>,
    /// `GITSTATE_TEAM`: the deployment's team (the template sets it). KMS-sealed settings
    /// must name it in their encryption context, so one team's ciphertext starts no other team's
    /// function.
    pub team: Option<String>,
    /// `GITSTATE_GIT_AUTH`: how the token is sent, `basic` (default) or `bearer`.
    pub auth: GitAuth,
    /// `GITSTATE_GIT_CA_FILE` (a PEM bundle's path) and `GITSTATE_GIT_CA_PEM` (PEM text): private
    /// certificate authorities trusted for the git host in addition to the system roots.
    pub ca_pem: Option<String>,
    /// `GITSTATE_REQUIRE_ATOMIC` (default false): refuse remotes without atomic push instead of
    /// writing with the lock checked from the advertisement.
    pub require_atomic: bool,
    /// `GITSTATE_SINGLE_FRONT` (default false; `gitstate run` sets it): every request of a
    /// Terraform run reaches this one process, so the GETs after a LOCK may rest on what the
    /// LOCK push proved for longer (see [`Self::proof_window`]).
    pub single_front: bool,
    /// `GITSTATE_LOCK_PROOF_MS`: how long the GETs after this process's LOCK are answered from
    /// what the LOCK push proved, in milliseconds, 0 to 5000 (default 5000 with
    /// [`Self::single_front`], else 2000; 0: never). Other processes wait that long after the
    /// LOCK before they write under that lock or release it. `None`: the default (see
    /// [`Self::proof_window`]).
    pub lock_proof: Option<Duration>,
    /// `GITSTATE_STATE_REFS`: which writes go to a state's own ref, `auto` (default locally; as
    /// `never` in this version), `always` (default on Lambda, where group commit never applies)
    /// or `never` (only states that already have one).
    pub state_refs: StateRefs,
    /// `GITSTATE_ALLOW_UNLOCKED_WRITES` (default false): accept writes and deletes that hold no
    /// lock (Terraform without `lock_address`, or `-lock=false`), each logged as a warning;
    /// otherwise they are refused with 428.
    pub allow_unlocked_writes: bool,
    /// `GITSTATE_CREATE_REF` (default false): let the first write create a missing branch (the
    /// configured one, while no other branch holds states, or an allowlisted `?ref=`) in a
    /// repository that has other branches; otherwise requests to it are refused (400) naming
    /// the repository's default branch, or the branches holding states. An empty repository's
    /// branch is always created. While it is on, a read of the configured branch that finds no
    /// state looks for a file by that name on the other branches (one more look per create).
    pub create_ref: bool,
    /// `GITSTATE_COMMITTER_NAME` / `GITSTATE_COMMITTER_EMAIL`: who commits are written as.
    pub committer: Identity,
    /// `GITSTATE_CACHE_DIR`: bare cache repositories (default `/tmp/gitstate` or `./.gitstate/cache`).
    pub cache_dir: PathBuf,
    /// `GITSTATE_LOCAL_REPOSITORY`: the embedded default repository (default `./.gitstate/repo.git`).
    pub local_repository: PathBuf,
    /// `GITSTATE_GIT_TIMEOUT_SECS`: timeout of one git HTTP request (default 20).
    pub timeout: Duration,
    /// `GITSTATE_FOLD_LEASE_SECS`: a fold lease older than this is taken over (default 60).
    pub fold_lease_age: Duration,
    /// `GITSTATE_FOLD_AFTER_WRITES`: fold the state refs in the background after a write to one
    /// (default true locally; never on Lambda, where the template's schedule folds).
    pub fold_after_writes: bool,
}

impl GitSettings {
    /// How long the GETs after this process's LOCK rest on what it proved: `GITSTATE_LOCK_PROOF_MS`,
    /// or by default the longest for a single front and two seconds elsewhere.
    pub fn proof_window(&self) -> Duration {
        match self.lock_proof {
            Some(window) => window,
            None if self.single_front => gitstate_git::MAX_PROOF_WINDOW,
            None => DEFAULT_PROOF_WINDOW,
        }
    }

    pub(crate) fn read(runtime: Runtime, vars: &Vars<'_>) -> Result<Self, ConfigError> {
        let repository = repository(runtime, vars)?;
        let allowed_repositories = vars.list("GITSTATE_ALLOWED_REPOSITORIES");
        for url in &allowed_repositories {
            check_url("GITSTATE_ALLOWED_REPOSITORIES", url)?;
        }
        let (branch, lock_ref_prefix, allowed_refs) = refs(vars)?;
        if vars.get("GITSTATE_GIT_TOKEN").is_some() && vars.get("GITSTATE_GIT_TOKEN_KMS").is_some()
        {
            return Err(ConfigError::TwoGitTokens);
        }
        let default_cache = match runtime {
            Runtime::Lambda => PathBuf::from("/tmp/gitstate"),
            Runtime::Local => PathBuf::from(".gitstate/cache"),
        };
        Ok(Self {
            repository,
            allowed_repositories,
            branch,
            allowed_refs,
            lock_ref_prefix,
            username: vars.get("GITSTATE_GIT_USERNAME"),
            token: vars.get("GITSTATE_GIT_TOKEN").map(Secret::new),
            token_kms: vars.get("GITSTATE_GIT_TOKEN_KMS").map(Secret::new),
            team: vars.get("GITSTATE_TEAM"),
            auth: auth(vars)?,
            ca_pem: ca_pem(
                vars.get("GITSTATE_GIT_CA_FILE"),
                vars.get("GITSTATE_GIT_CA_PEM"),
            )?,
            require_atomic: vars.flag("GITSTATE_REQUIRE_ATOMIC")?,
            single_front: vars.flag("GITSTATE_SINGLE_FRONT")?,
            lock_proof: lock_proof(vars)?,
            state_refs: state_refs(runtime, vars)?,
            allow_unlocked_writes: vars.flag("GITSTATE_ALLOW_UNLOCKED_WRITES")?,
            create_ref: vars.flag("GITSTATE_CREATE_REF")?,
            committer: Identity {
                name: vars
                    .get("GITSTATE_COMMITTER_NAME")
                    .unwrap_or_else(|| "gitstate".into()),
                email: vars
                    .get("GITSTATE_COMMITTER_EMAIL")
                    .unwrap_or_else(|| "gitstate@localhost".into()),
            },
            cache_dir: vars
                .get("GITSTATE_CACHE_DIR")
                .map_or(default_cache, PathBuf::from),
            local_repository: vars
                .get("GITSTATE_LOCAL_REPOSITORY")
                .map_or_else(|| PathBuf::from(".gitstate/repo.git"), PathBuf::from),
            timeout: Duration::from_secs(vars.number("GITSTATE_GIT_TIMEOUT_SECS", 20)?),
            fold_lease_age: Duration::from_secs(vars.number("GITSTATE_FOLD_LEASE_SECS", 60)?),
            fold_after_writes: fold_after_writes(runtime, vars)?,
        })
    }

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
}

/// `GITSTATE_REPOSITORY`: required on Lambda, and there an http(s) URL.
fn repository(runtime: Runtime, vars: &Vars<'_>) -> Result<Option<String>, ConfigError> {
    let repository = vars.get("GITSTATE_REPOSITORY");
    if runtime == Runtime::Lambda && repository.is_none() {
        return Err(ConfigError::RepositoryRequired);
    }
    if let Some(url) = &repository {
        let wire = check_url("GITSTATE_REPOSITORY", url)?;
        if runtime == Runtime::Lambda && wire != Wire::Http {
            return Err(ConfigError::Invalid {
                var: "GITSTATE_REPOSITORY",
                reason: "the Lambda has no ssh: use the repository's https:// URL".into(),
            });
        }
    }
    Ok(repository)
}

/// The branch, the lock ref prefix and the further branches, checked together.
fn refs(vars: &Vars<'_>) -> Result<(BranchName, String, AllowedRefs), ConfigError> {
    let branch = BranchName::parse(&vars.get("GITSTATE_REF").unwrap_or_else(|| "main".into()))
        .map_err(ConfigError::Branch)?;
    let lock_ref_prefix = vars
        .get("GITSTATE_LOCK_REF_PREFIX")
        .unwrap_or_else(|| "refs/heads/locks/".into());
    if !lock_ref_prefix.starts_with("refs/")
        || !lock_ref_prefix.ends_with('/')
        || lock_ref_prefix.contains("..")
        || lock_ref_prefix.starts_with("refs/gitstate/")
    {
        return Err(ConfigError::Invalid {
            var: "GITSTATE_LOCK_REF_PREFIX",
            reason: "must start with 'refs/' and end with '/', e.g. refs/locks/, and not lie under refs/gitstate/ (gitstate's own records)".into(),
        });
    }
    let allowed_refs = AllowedRefs::parse(&vars.get("GITSTATE_ALLOWED_REFS").unwrap_or_default())
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
    Ok((branch, lock_ref_prefix, allowed_refs))
}

/// `GITSTATE_STATE_REFS`: `always` on Lambda (one request at a time per container, so group
/// commit never batches writes there), `auto` locally, unless set.
fn state_refs(runtime: Runtime, vars: &Vars<'_>) -> Result<StateRefs, ConfigError> {
    match vars.get("GITSTATE_STATE_REFS") {
        None if runtime == Runtime::Lambda => Ok(StateRefs::Always),
        None => Ok(StateRefs::Auto),
        Some(text) => StateRefs::parse(&text).ok_or(ConfigError::Invalid {
            var: "GITSTATE_STATE_REFS",
            reason: format!("{text:?} is none of `auto`, `always`, `never`"),
        }),
    }
}

/// `GITSTATE_FOLD_AFTER_WRITES`: `true` by default locally. A Lambda container is frozen once
/// it has answered, so a fold it started would stop halfway (holding the fold lease): there it
/// is always `false`, and asking for `true` is refused.
fn fold_after_writes(runtime: Runtime, vars: &Vars<'_>) -> Result<bool, ConfigError> {
    const VAR: &str = "GITSTATE_FOLD_AFTER_WRITES";
    let set = vars.get(VAR).is_some();
    let fold = vars.flag(VAR)?;
    match runtime {
        Runtime::Local if !set => Ok(true),
        Runtime::Local => Ok(fold),
        Runtime::Lambda if fold => Err(ConfigError::Invalid {
            var: VAR,
            reason: "a Lambda container is frozen once it answers, so it cannot fold after a \
                     write: the template's FoldSchedule folds every minute"
                .into(),
        }),
        Runtime::Lambda => Ok(false),
    }
}

fn auth(vars: &Vars<'_>) -> Result<GitAuth, ConfigError> {
    match vars.get("GITSTATE_GIT_AUTH").as_deref() {
        None | Some("basic") => Ok(GitAuth::Basic),
        Some("bearer") => Ok(GitAuth::Bearer),
        Some(other) => Err(ConfigError::Invalid {
            var: "GITSTATE_GIT_AUTH",
            reason: format!("{other:?} is neither `basic` nor `bearer`"),
        }),
    }
}

/// The private CA bundle: the file's PEM text and the variable's, together (either may be unset).
/// Only the shape is checked here; the git adapter parses the certificates.
fn ca_pem(file: Option<String>, pem: Option<String>) -> Result<Option<String>, ConfigError> {
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

fn check_url(var: &'static str, url: &str) -> Result<Wire, ConfigError> {
    repository_url(url).map_err(|reason| ConfigError::Invalid { var, reason })
}

/// `GITSTATE_LOCK_PROOF_MS` (see [`GitSettings::lock_proof`]).
fn lock_proof(vars: &Vars<'_>) -> Result<Option<Duration>, ConfigError> {
    const VAR: &str = "GITSTATE_LOCK_PROOF_MS";
    let most = gitstate_git::MAX_PROOF_WINDOW;
    let Some(value) = vars.get(VAR) else {
        return Ok(None);
    };
    let window = value
        .parse::<u64>()
        .ok()
        .map(Duration::from_millis)
        .filter(|window| *window <= most)
        .ok_or(ConfigError::Invalid {
            var: VAR,
            reason: format!(
                "{value:?} is not a whole number of milliseconds from 0 to {}",
                most.as_millis()
            ),
        })?;
    Ok(Some(window))
}

/// The proof window where other processes may serve the same Terraform run (Lambda, `serve`
/// behind a load balancer): long enough for the GET right after a LOCK, short enough that a
/// write or release through another process seldom waits for it.
const DEFAULT_PROOF_WINDOW: Duration = Duration::from_secs(2);
