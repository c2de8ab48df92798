//! The application: typed settings ([`settings`]), where they come from for local use
//! ([`layers`]), and the one assembly of store, encryption, access and router ([`build`]) that
//! the Lambda binary, `gitstate serve`, `gitstate run` and the tests share; [`docs`] makes the
//! operators' settings table from the settings list.

pub mod docs;
#[cfg(feature = "lambda")]
pub mod invocation;
#[cfg(feature = "lambda")]
pub mod lambda;
pub mod layers;
pub mod settings;

use std::sync::Arc;

use gitstate_core::auth::Access;
use gitstate_core::ports::StateStore;
use gitstate_core::service::{Backend, Repositories};
use gitstate_git::GitStore;
use gitstate_http::{Limits, router};
use gitstate_kms::Kms;

pub use settings::{ConfigError, Runtime, Settings};

/// What [`build`] made: the backend and the access policy guarding it, and the limits the router
/// applies.
pub struct App {
    pub backend: Arc<Backend>,
    pub access: Arc<Access>,
    pub limits: Limits,
}

impl App {
    /// The HTTP router over this backend.
    pub fn router(&self) -> axum::Router {
        router(self.backend.clone(), self.access.clone(), self.limits)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Sealed(#[from] gitstate_kms::SealedSettingError),
    #[error(transparent)]
    PrivateKeys(#[from] gitstate_kms::PrivateKeyError),
    #[error("opening the git store")]
    Store(#[from] gitstate_git::OpenError),
    #[error(transparent)]
    Settings(#[from] ConfigError),
    #[error("the primary repository: {0}")]
    Primary(String),
    #[error("access policy: {0}")]
    Access(String),
    #[error("encryption: {0}")]
    Unopenable(String),
}

/// The application `settings` describe, with KMS (for the git token and for encryption, when
/// configured) on the standard AWS configuration chain.
pub async fn build(settings: Settings) -> Result<App, BuildError> {
    build_with(settings, None).await
}

/// [`build`], with KMS calls going to `kms` when given (tests point it at a local KMS): states
/// are then sealed through it as `settings.encryption` says, even when that names no key.
pub async fn build_with(settings: Settings, kms: Option<Arc<Kms>>) -> Result<App, BuildError> {
    open(settings, kms, true).await
}

/// [`build`] for `gitstate rekey`, which may re-encrypt every state for keys whose private side
/// is kept elsewhere (the deployment's): it opens with the previous keys alone.
pub async fn build_to_rekey(settings: Settings) -> Result<App, BuildError> {
    open(settings, None, false).await
}

/// [`build_with`]; a process that `serves` must open what it seals.
async fn open(
    mut settings: Settings,
    kms: Option<Arc<Kms>>,
    serves: bool,
) -> Result<App, BuildError> {
    let seal = kms.is_some() || settings.encryption.is_configured();
    let needs_kms = settings.git.token_kms.is_some()
        || settings.access.bootstrap_kms.is_some()
        || settings.encryption.is_configured();
    let kms = match kms {
        Some(kms) => Some(kms),
        None if needs_kms => Some(Arc::new(Kms::from_env().await)),
        None => None,
    };
    let team = settings.git.team.clone();
    if let (Some(ciphertext), Some(kms)) = (settings.git.token_kms.take(), &kms) {
        // Once per process: the token never sits in the template or the console in clear.
        settings.git.token =
            Some(gitstate_kms::decrypt_git_token(kms, ciphertext.expose(), team.as_deref()).await?);
    }
    if let (Some((user, ciphertext)), Some(kms)) = (settings.access.bootstrap_kms.take(), &kms) {
        let hash = gitstate_kms::decrypt_setting(
            kms,
            "GITSTATE_ADMIN_HASH_KMS",
            gitstate_kms::ADMIN_HASH_PURPOSE,
            team.as_deref(),
            ciphertext.expose(),
        )
        .await?;
        settings.access.bootstrap = Some((user, hash));
    }
    gitstate_kms::open_private_keys(kms.as_deref(), team.as_deref(), &mut settings.encryption)
        .await?;
    if let Some(why) = settings.encryption.unopenable().filter(|_| serves) {
        return Err(BuildError::Unopenable(why));
    }
    let (store, primary) = GitStore::new(&store_settings(&settings))?;
    assemble(&settings, Arc::new(store), primary, kms.filter(|_| seal))
}

/// The application `settings` describe, over `store` (whose primary repository is `primary`)
/// instead of a git store, unencrypted: the contract test runs this same assembly over the
/// in-memory store beside the git store.
pub fn build_over(
    settings: &Settings,
    store: Arc<dyn StateStore>,
    primary: String,
) -> Result<App, BuildError> {
    assemble(settings, store, primary, None)
}

/// Backend, encryption (when `kms` is given), access policy and limits over `store`.
fn assemble(
    settings: &Settings,
    store: Arc<dyn StateStore>,
    primary: String,
    kms: Option<Arc<Kms>>,
) -> Result<App, BuildError> {
    let repositories = Repositories {
        primary,
        default_branch: settings.git.branch.clone(),
        allowed: settings.git.allowed_repositories.clone(),
    };
    let backend = Backend::new(store, repositories, settings.git.committer.clone())
        .with_refs(settings.ref_policy()?)
        .with_unlocked_writes(settings.git.allow_unlocked_writes)
        .with_branch_creation(settings.git.create_ref)
        .with_sealed_files(gitstate_sops::looks_sealed);
    let backend = match kms {
        Some(kms) => backend.with_encryption(gitstate_kms::encryption_with(
            kms,
            &settings.encryption,
            settings.limits.max_body_bytes,
        )),
        None => backend,
    };
    let primary = backend
        .locate(None, None)
        .map_err(|e| BuildError::Primary(e.to_string()))?;
    let access = Access::new(
        backend.store().clone(),
        primary,
        settings.access.options(),
        Arc::new(gitstate_core::password::Argon2id),
    )
    .map_err(|e| BuildError::Access(e.to_string()))?;
    Ok(App {
        backend: Arc::new(backend),
        access: Arc::new(access),
        limits: Limits {
            max_body_bytes: settings.limits.max_body_bytes,
            max_response_bytes: settings.limits.max_response_bytes,
            request_deadline: settings.server.request_deadline,
        },
    })
}

/// The git adapter's own settings.
fn store_settings(settings: &Settings) -> gitstate_git::GitSettings {
    let git = &settings.git;
    gitstate_git::GitSettings {
        repository: git.repository.clone(),
        local_repository: git.local_repository.clone(),
        cache_dir: git.cache_dir.clone(),
        lock_ref_prefix: git.lock_ref_prefix.clone(),
        username: git.username.clone(),
        token: git.token.clone(),
        auth: git.auth,
        ca_pem: git.ca_pem.clone(),
        require_atomic: git.require_atomic,
        timeout: git.timeout,
        max_response_bytes: settings.limits.git_max_response_bytes,
        max_history_depth: settings.limits.history_max_depth,
        writes_per_push: settings.limits.git_writes_per_push,
        fold_lease_age: settings.git.fold_lease_age,
        // Never on Lambda, whatever was read: a container is frozen once it has answered.
        fold_after_writes: git.fold_after_writes && settings.runtime == Runtime::Local,
        state_refs: git.state_refs,
        proof_window: git.proof_window(),
    }
}
