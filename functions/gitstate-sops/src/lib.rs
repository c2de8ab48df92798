//! The sops file format, as gitstate reads and writes it: pure cryptography, no AWS.
//!
//! - writes sops *binary mode* (`{"data": "ENC[…]", "sops": {…}}`), which the stock `sops` CLI
//!   decrypts byte-exact;
//! - reads binary and tree mode (per-value `ENC[…]`, as terraform-backend-git writes), and that
//!   tool's `aes` passphrase mode;
//! - seals a state gzip-compressed ([`compression`]) and reads uncompressed ones;
//! - the data key comes from, and is wrapped by, a [`KeyService`] (AWS KMS in production), and
//!   by any [`KeySource`] that works offline (age); with key groups, each group wraps a Shamir
//!   share of it ([`shamir`]), as sops writes `key_groups` and `shamir_threshold`.

pub mod cipher;
pub mod compression;
mod document;
mod envelope;
pub mod kms_key;
mod passphrase;
pub mod shamir;
mod sources;
mod time;
mod tree;

use std::collections::BTreeMap;

use async_trait::async_trait;
use zeroize::Zeroizing;

pub use cipher::Sealed;
pub use document::{
    BINDING, Document, Entry, KeyGroup, KmsEntry, Plain, SOPS_VERSION, Seal, looks_like_sops,
};
pub use envelope::{Envelope, Format, Opened, Protection};
pub use passphrase::{looks_passphrase_sealed, open_passphrase, seal_passphrase};
pub use sources::{AgeKeys, KeySource, KmsKeys, Offline, PgpKeys, SourceError, WrappedSecret};

/// Whether a stored file is sealed in a form this crate opens (sops, or terraform-backend-git's
/// `aes` mode), told from its shape alone: what a backend without keys must neither serve as a
/// state nor write over.
pub fn looks_sealed(stored: &[u8]) -> bool {
    looks_like_sops(stored) || looks_passphrase_sealed(stored)
}

/// A 256-bit data key, wiped from memory when dropped.
pub type DataKey = Zeroizing<[u8; 32]>;

/// What a master key unwraps: a data key, or a key group's Shamir share of one.
pub type Unwrapped = Zeroizing<Vec<u8>>;

/// An encryption context: sent with every wrap and unwrap, stored in the file.
pub type Context = BTreeMap<String, String>;

pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A data key wrapped by one master key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WrappedKey {
    /// The master key's full ARN (sops takes the region from it).
    pub arn: String,
    pub blob: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The key service answered no: wrong context, tampered blob, no access, unknown key.
    #[error("the key service refused")]
    Refused(#[source] BoxError),
    /// The key service could not be reached or throttled us.
    #[error("the key service is unavailable")]
    Unavailable(#[source] BoxError),
}

/// Where data keys come from and how they are (un)wrapped: AWS KMS, or a fake in tests.
#[async_trait]
pub trait KeyService: Send + Sync {
    /// A fresh data key from `key_id`, and that key's wrapping of it.
    async fn generate(
        &self,
        key_id: &str,
        context: &Context,
    ) -> Result<(DataKey, WrappedKey), KeyError>;

    /// Wrap an existing data key (or a key group's Shamir share) under one more master key.
    async fn wrap(
        &self,
        key_id: &str,
        secret: &[u8],
        context: &Context,
    ) -> Result<WrappedKey, KeyError>;

    async fn unwrap(&self, wrapped: &WrappedKey, context: &Context) -> Result<Unwrapped, KeyError>;

    /// The full key ARN a configured key ID (ARN, alias, alias ARN or bare ID) names.
    async fn resolve(&self, key_id: &str) -> Result<String, KeyError>;
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("not a readable sops file: {0}")]
    Format(String),
    #[error("unsupported sops file: {0}")]
    Unsupported(String),
    #[error("authentication failed at {what:?}: the file was altered or the data key is wrong")]
    Tampered { what: String },
    #[error("the MAC does not match the content: the file was altered")]
    MacMismatch,
    #[error(
        "the file is bound to another location (encryption context {found:?}, expected {expected:?})"
    )]
    ContextMismatch { found: Context, expected: Context },
    #[error("none of the {tried} master keys of the file could decrypt its data key")]
    NoKey {
        tried: usize,
        #[source]
        last: Option<KeyError>,
    },
    #[error("the file has no master key entry gitstate can use")]
    NoKmsEntry,
    #[error("key groups: {opened} of {groups} opened, {threshold} needed")]
    Threshold {
        opened: usize,
        groups: usize,
        threshold: usize,
        #[source]
        last: Option<KeyError>,
    },
    /// Opened through a key that binds no location (age, OpenPGP), yet the file names none.
    #[error(
        "the file names no location: under age alone it opens only as gitstate seals it (import it by writing its plaintext)"
    )]
    Unbound,
    /// No entry names a key of the deployment: nothing was asked to unwrap.
    #[error(
        "none of the file's {entries} KMS entries names a configured key (the first names {first:?}); no KMS call was made"
    )]
    NoConfiguredKey { entries: usize, first: String },
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("no key is configured for writing")]
    NoWriteKey,
    #[error("invalid key group layout: {0}")]
    Layout(String),
    #[error("neither JSON nor a passphrase-encrypted state{0}")]
    Unrecognised(&'static str),
    #[error("cipher failure")]
    Crypto,
    #[error("the sealed state is not a valid gzip stream: {0}")]
    Compression(String),
    #[error("the sealed state expands to more than {limit} bytes, the maximum state size")]
    TooLarge { limit: usize },
}

#[async_trait]
impl<T: KeyService + ?Sized> KeyService for std::sync::Arc<T> {
    async fn generate(
        &self,
        key_id: &str,
        context: &Context,
    ) -> Result<(DataKey, WrappedKey), KeyError> {
        (**self).generate(key_id, context).await
    }

    async fn wrap(
        &self,
        key_id: &str,
        secret: &[u8],
        context: &Context,
    ) -> Result<WrappedKey, KeyError> {
        (**self).wrap(key_id, secret, context).await
    }

    async fn unwrap(&self, wrapped: &WrappedKey, context: &Context) -> Result<Unwrapped, KeyError> {
        (**self).unwrap(wrapped, context).await
    }

    async fn resolve(&self, key_id: &str) -> Result<String, KeyError> {
        (**self).resolve(key_id).await
    }
}
