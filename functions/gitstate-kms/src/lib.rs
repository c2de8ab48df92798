//! AWS KMS as gitstate's key service: data keys from `GenerateDataKey`, extra wrappings with
//! `Encrypt`, unwrapping with `Decrypt`, all under an encryption context. Decrypted data keys are
//! cached in memory (zeroised when dropped), keyed by the key ARN, the wrapped key *and* its
//! context, so a warm process asks KMS once per distinct ciphertext and a blob moved to another
//! context or named by another key still goes to KMS, which refuses it. The region of a call is
//! that of the key ARN it is made with (strictly parsed); the endpoint is the configuration's.
//!
//! Configuration is the standard AWS chain (environment, profiles, SSO, web identity, container
//! and instance roles); `AWS_ENDPOINT_URL_KMS` / `AWS_ENDPOINT_URL` point it at LocalStack or
//! moto.

/// KMS key ARNs and names, parsed strictly (they live with the sops format, which names keys by ARN).
pub use gitstate_sops::kms_key;
mod sealer;

/// Log targets of the AWS SDK and the HTTP/TLS crates under it, whose TRACE (and some DEBUG)
/// output holds whole requests: a KMS `Encrypt` request carries a plaintext data key. Every
/// binary caps them at INFO whatever level is configured (prefix match on the target).
pub const SECRET_BEARING_LOG_TARGETS: [&str; 10] = [
    "aws_smithy_runtime",
    "aws_smithy_runtime_api",
    "aws_sigv4",
    "aws_config",
    "aws_sdk_kms",
    "hyper",
    "hyper_util",
    "h2",
    "reqwest",
    "rustls",
];

pub use sealer::{
    AGE_IDENTITY_PURPOSE, CONTEXT_REPOSITORY, CONTEXT_STATE, EncryptionSettings,
    PGP_SECRET_KEYS_PURPOSE, PrivateKeyError, SopsSealer, context, encryption, encryption_with,
    open_private_keys, pack, seal_error, unpack,
};

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use aws_sdk_kms::Client;
use aws_sdk_kms::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_kms::primitives::Blob;
use aws_sdk_kms::types::DataKeySpec;
use base64::Engine;
use gitstate_core::secret::Secret;
use gitstate_sops::{Context, DataKey, KeyError, KeyService, Unwrapped, WrappedKey};
use kms_key::KeyArn;
use zeroize::{Zeroize, Zeroizing};

/// At most this many data keys stay cached; beyond it the cache starts over.
const CACHE_CAPACITY: usize = 4096;

/// How many calls of each kind this process made to KMS.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Calls {
    pub generate_data_key: u64,
    pub encrypt: u64,
    pub decrypt: u64,
    pub describe_key: u64,
}

impl Calls {
    pub fn total(&self) -> u64 {
        self.generate_data_key + self.encrypt + self.decrypt + self.describe_key
    }
}

#[derive(Default)]
struct Counters {
    generate_data_key: AtomicU64,
    encrypt: AtomicU64,
    decrypt: AtomicU64,
    describe_key: AtomicU64,
}

/// The key ARN that (un)wrapped, the wrapped blob and its context: a blob cached under one key
/// is never handed out for an entry that names another.
type CacheKey = (String, Vec<u8>, Context);

/// The KMS key service.
pub struct Kms {
    config: aws_config::SdkConfig,
    /// One client per region: sops files name the region in each key ARN.
    clients: Mutex<HashMap<String, Client>>,
    default: Client,
    keys: Mutex<HashMap<CacheKey, Unwrapped>>,
    arns: Mutex<HashMap<String, String>>,
    counters: Counters,
}

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("the ciphertext is not base64")]
    Base64,
    #[error(transparent)]
    Key(#[from] KeyError),
}

/// The encryption context a KMS-encrypted git token is bound to.
pub const GIT_TOKEN_PURPOSE: (&str, &str) = ("gitstate:purpose", "git-token");
/// The encryption context a KMS-encrypted bootstrap administrator's hash is bound to.
pub const ADMIN_HASH_PURPOSE: (&str, &str) = ("gitstate:purpose", "admin-hash");
/// The context key naming the deployment's team (`GITSTATE_TEAM`) in a sealed setting's
/// context: a ciphertext made for one team does not decrypt in another team's function.
pub const TEAM_CONTEXT_KEY: &str = "gitstate:team";

/// Decrypt `GITSTATE_GIT_TOKEN_KMS` (base64 of a KMS ciphertext) into the git token, under the
/// context `{"gitstate:purpose": "git-token"}` plus `{"gitstate:team": team}` when the
/// deployment names its team. Errors name the variable, never the value.
pub async fn decrypt_git_token(
    kms: &Kms,
    ciphertext: &str,
    team: Option<&str>,
) -> Result<Secret, SealedSettingError> {
    decrypt_setting(
        kms,
        "GITSTATE_GIT_TOKEN_KMS",
        GIT_TOKEN_PURPOSE,
        team,
        ciphertext,
    )
    .await
}

/// Decrypt a setting kept as base64 of a KMS ciphertext (`var`), made under the context
/// `purpose` plus the team when given; the plaintext is UTF-8, trimmed, not empty.
pub async fn decrypt_setting(
    kms: &Kms,
    var: &'static str,
    purpose: (&str, &str),
    team: Option<&str>,
    ciphertext: &str,
) -> Result<Secret, SealedSettingError> {
    let mut context: Context = [(purpose.0.to_owned(), purpose.1.to_owned())].into();
    if let Some(team) = team {
        context.insert(TEAM_CONTEXT_KEY.to_owned(), team.to_owned());
    }
    let plaintext = kms
        .decrypt_base64(ciphertext, &context)
        .await
        .map_err(|source| SealedSettingError::Decrypt {
            var,
            context: describe(&context),
            source,
        })?;
    let value = std::str::from_utf8(&plaintext).map_err(|_| SealedSettingError::Utf8 { var })?;
    let value = value.trim();
    if value.is_empty() {
        return Err(SealedSettingError::Empty { var });
    }
    Ok(Secret::new(value.to_owned()))
}

/// `k=v,k=v` as `aws kms encrypt --encryption-context` takes it.
fn describe(context: &Context) -> String {
    context
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[derive(Debug, thiserror::Error)]
pub enum SealedSettingError {
    #[error("{var} could not be decrypted with the encryption context {context}")]
    Decrypt {
        var: &'static str,
        context: String,
        source: SecretError,
    },
    #[error("{var} decrypts to something that is not UTF-8")]
    Utf8 { var: &'static str },
    #[error("{var} decrypts to an empty value")]
    Empty { var: &'static str },
}

impl Kms {
    /// A client from the standard AWS configuration chain.
    pub async fn from_env() -> Self {
        Self::load(aws_config::defaults(aws_config::BehaviorVersion::latest())).await
    }

    /// A client from a configuration loader (tests set endpoint, region and credentials here),
    /// with gitstate's HTTPS client (rustls with ring, like the git transport).
    pub async fn load(loader: aws_config::ConfigLoader) -> Self {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        Self::new(loader.http_client(http).load().await)
    }

    pub fn new(config: aws_config::SdkConfig) -> Self {
        Self {
            default: Client::new(&config),
            config,
            clients: Mutex::default(),
            keys: Mutex::default(),
            arns: Mutex::default(),
            counters: Counters::default(),
        }
    }

    /// The KMS client, for tests and tools that set up keys.
    pub fn client(&self) -> &Client {
        &self.default
    }

    pub fn calls(&self) -> Calls {
        let c = &self.counters;
        Calls {
            generate_data_key: c.generate_data_key.load(Ordering::Relaxed),
            encrypt: c.encrypt.load(Ordering::Relaxed),
            decrypt: c.decrypt.load(Ordering::Relaxed),
            describe_key: c.describe_key.load(Ordering::Relaxed),
        }
    }

    /// Decrypt a base64 KMS ciphertext (e.g. a secret kept encrypted in an environment variable),
    /// with the encryption context it was made under (empty for none).
    pub async fn decrypt_base64(
        &self,
        ciphertext: &str,
        context: &Context,
    ) -> Result<Zeroizing<Vec<u8>>, SecretError> {
        let blob = base64::engine::general_purpose::STANDARD
            .decode(ciphertext.trim())
            .map_err(|_| SecretError::Base64)?;
        self.counters.decrypt.fetch_add(1, Ordering::Relaxed);
        let out = self
            .default
            .decrypt()
            .ciphertext_blob(Blob::new(blob))
            .set_encryption_context(non_empty(context))
            .send()
            .await
            .map_err(key_error)?;
        Ok(Zeroizing::new(
            out.plaintext.map(Blob::into_inner).unwrap_or_default(),
        ))
    }

    /// The client for the region a key ARN names (the default one for aliases and bare IDs). An
    /// `arn:` that does not parse strictly is refused before any call.
    fn client_for(&self, key: &str) -> Result<Client, KeyError> {
        if !key.starts_with("arn:") {
            return Ok(self.default.clone());
        }
        let arn = KeyArn::parse(key).map_err(|e| KeyError::Refused(e.into()))?;
        let region = arn.region;
        if self.config.region().map(|r| r.as_ref()) == Some(region.as_str()) {
            return Ok(self.default.clone());
        }
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        Ok(clients
            .entry(region.clone())
            .or_insert_with(|| {
                let config = aws_sdk_kms::config::Builder::from(&self.config)
                    .region(aws_sdk_kms::config::Region::new(region))
                    .build();
                Client::from_conf(config)
            })
            .clone())
    }

    fn remember(&self, wrapped: &WrappedKey, context: &Context, key: &[u8]) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if keys.len() >= CACHE_CAPACITY {
            keys.clear();
        }
        keys.insert(
            (wrapped.arn.clone(), wrapped.blob.clone(), context.clone()),
            Zeroizing::new(key.to_vec()),
        );
    }
}

fn non_empty(context: &Context) -> Option<HashMap<String, String>> {
    (!context.is_empty()).then(|| {
        context
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    })
}

/// Take a plaintext key out of a KMS answer, wiping the SDK's copy.
fn data_key(blob: Option<Blob>) -> Result<DataKey, KeyError> {
    let mut bytes = blob.map(Blob::into_inner).unwrap_or_default();
    let key: Result<[u8; 32], _> = bytes.as_slice().try_into();
    bytes.zeroize();
    key.map(Zeroizing::new)
        .map_err(|_| KeyError::Refused("KMS returned a data key that is not 256 bits".into()))
}

fn key_error<E, R>(error: SdkError<E, R>) -> KeyError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let transient = match &error {
        SdkError::ServiceError(_) => matches!(
            error.code(),
            Some(
                "ThrottlingException"
                    | "KMSInternalException"
                    | "DependencyTimeoutException"
                    | "KeyUnavailableException"
            )
        ),
        _ => true,
    };
    let described: gitstate_sops::BoxError = format!(
        "{}: {}",
        error.code().unwrap_or("no error code"),
        aws_sdk_kms::error::DisplayErrorContext(&error)
    )
    .into();
    if transient {
        KeyError::Unavailable(described)
    } else {
        KeyError::Refused(described)
    }
}

#[async_trait]
impl KeyService for Kms {
    async fn generate(
        &self,
        key_id: &str,
        context: &Context,
    ) -> Result<(DataKey, WrappedKey), KeyError> {
        self.counters
            .generate_data_key
            .fetch_add(1, Ordering::Relaxed);
        let out = self
            .client_for(key_id)?
            .generate_data_key()
            .key_id(key_id)
            .key_spec(DataKeySpec::Aes256)
            .set_encryption_context(non_empty(context))
            .send()
            .await
            .map_err(key_error)?;
        let key = data_key(out.plaintext)?;
        let wrapped = WrappedKey {
            arn: out.key_id.unwrap_or_else(|| key_id.to_owned()),
            blob: out
                .ciphertext_blob
                .map(Blob::into_inner)
                .unwrap_or_default(),
        };
        self.remember(&wrapped, context, key.as_slice());
        Ok((key, wrapped))
    }

    async fn wrap(
        &self,
        key_id: &str,
        secret: &[u8],
        context: &Context,
    ) -> Result<WrappedKey, KeyError> {
        self.counters.encrypt.fetch_add(1, Ordering::Relaxed);
        let out = self
            .client_for(key_id)?
            .encrypt()
            .key_id(key_id)
            .plaintext(Blob::new(secret.to_vec()))
            .set_encryption_context(non_empty(context))
            .send()
            .await
            .map_err(key_error)?;
        let wrapped = WrappedKey {
            arn: out.key_id.unwrap_or_else(|| key_id.to_owned()),
            blob: out
                .ciphertext_blob
                .map(Blob::into_inner)
                .unwrap_or_default(),
        };
        self.remember(&wrapped, context, secret);
        Ok(wrapped)
    }

    async fn unwrap(&self, wrapped: &WrappedKey, context: &Context) -> Result<Unwrapped, KeyError> {
        let cache_key = (wrapped.arn.clone(), wrapped.blob.clone(), context.clone());
        if let Some(key) = self
            .keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&cache_key)
        {
            return Ok(key.clone());
        }
        self.counters.decrypt.fetch_add(1, Ordering::Relaxed);
        let out = self
            .client_for(&wrapped.arn)?
            .decrypt()
            .key_id(&wrapped.arn)
            .ciphertext_blob(Blob::new(wrapped.blob.clone()))
            .set_encryption_context(non_empty(context))
            .send()
            .await
            .map_err(key_error)?;
        let secret = Zeroizing::new(out.plaintext.map(Blob::into_inner).unwrap_or_default());
        self.remember(wrapped, context, &secret);
        Ok(secret)
    }

    async fn resolve(&self, key_id: &str) -> Result<String, KeyError> {
        if key_id.starts_with("arn:") && key_id.contains(":key/") {
            return Ok(key_id.to_owned());
        }
        if let Some(arn) = self
            .arns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key_id)
        {
            return Ok(arn.clone());
        }
        self.counters.describe_key.fetch_add(1, Ordering::Relaxed);
        let out = self
            .client_for(key_id)?
            .describe_key()
            .key_id(key_id)
            .send()
            .await
            .map_err(key_error)?;
        let arn = out
            .key_metadata
            .and_then(|m| m.arn)
            .ok_or_else(|| KeyError::Refused(format!("KMS describes no key {key_id:?}").into()))?;
        self.arns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key_id.to_owned(), arn.clone());
        Ok(arn)
    }
}
