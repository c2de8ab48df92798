//! What gitstate stores: every write sealed as sops binary mode under the configured KMS keys;
//! every read opened whatever it is (sops binary or tree, the aes passphrase mode, plaintext),
//! following the detection order of the format notes: a `sops` object, then any JSON, then the
//! passphrase mode.

use std::time::SystemTime;

use zeroize::Zeroizing;

use crate::document::{Document, Seal, looks_like_sops};
use crate::{Context, Error, KeyService, passphrase};

/// How a stored state was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Not encrypted by gitstate or sops: plaintext JSON (or an OpenTofu-encrypted state, which
    /// is opaque here).
    Plain,
    SopsBinary,
    SopsTree,
    /// terraform-backend-git's `aes` passphrase mode.
    Passphrase,
}

impl Format {
    pub fn describe(self) -> &'static str {
        match self {
            Self::Plain => "unencrypted",
            Self::SopsBinary => "sops binary mode",
            Self::SopsTree => "sops tree mode",
            Self::Passphrase => "passphrase-encrypted (aes mode)",
        }
    }
}

/// How well a stored state is protected, measured against the configured keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    /// Not under any configured KMS key.
    Unprotected,
    /// Under at least one configured key, but not exactly as a write would seal it now (another
    /// key set, or tree mode): `rekey` rewrites it.
    Partly,
    /// Sops binary mode under exactly the configured keys.
    Current,
}

#[derive(Debug)]
pub struct Opened {
    pub plaintext: Zeroizing<Vec<u8>>,
    pub format: Format,
    /// The ARNs of the file's KMS entries.
    pub arns: Vec<String>,
}

/// Seal and open states with a key service, the configured write keys and an optional
/// passphrase for reading the aes mode.
pub struct Envelope<K> {
    keys: K,
    key_ids: Vec<String>,
    passphrase: Option<Zeroizing<String>>,
    /// The configured key IDs resolved to ARNs, once.
    resolved: std::sync::OnceLock<Vec<String>>,
}

impl<K: KeyService> Envelope<K> {
    pub fn new(keys: K, key_ids: Vec<String>, passphrase: Option<Zeroizing<String>>) -> Self {
        Self {
            keys,
            key_ids,
            passphrase,
            resolved: std::sync::OnceLock::new(),
        }
    }

    pub fn keys(&self) -> &K {
        &self.keys
    }

    /// Whether writes are sealed (some KMS key is configured).
    pub fn seals(&self) -> bool {
        !self.key_ids.is_empty()
    }

    /// Cheap and synchronous: does opening these bytes need a key (as opposed to plain JSON)?
    pub fn is_encrypted(stored: &[u8]) -> bool {
        looks_like_sops(stored) || serde_json::from_slice::<serde::de::IgnoredAny>(stored).is_err()
    }

    pub async fn seal(&self, plaintext: &[u8], context: &Context) -> Result<Vec<u8>, Error> {
        Seal {
            keys: &self.keys,
            key_ids: &self.key_ids,
            context,
            now: SystemTime::now(),
        }
        .binary(plaintext)
        .await
    }

    /// Open stored bytes. `expected` is the context this location binds (see
    /// [`Document::data_key`]).
    pub async fn open(&self, stored: &[u8], expected: Option<&Context>) -> Result<Opened, Error> {
        if looks_like_sops(stored) {
            let document = Document::parse(stored)?;
            let key = document.data_key(&self.keys, expected).await?;
            let plain = document.decrypt(&key)?;
            return Ok(Opened {
                plaintext: plain.bytes,
                format: if plain.binary {
                    Format::SopsBinary
                } else {
                    Format::SopsTree
                },
                arns: document.kms.iter().map(|e| e.arn.clone()).collect(),
            });
        }
        if serde_json::from_slice::<serde::de::IgnoredAny>(stored).is_ok() {
            return Ok(Opened {
                plaintext: Zeroizing::new(stored.to_vec()),
                format: Format::Plain,
                arns: Vec::new(),
            });
        }
        let Some(passphrase) = &self.passphrase else {
            return Err(Error::Unrecognised(
                " (set GITSTATE_PASSPHRASE to read terraform-backend-git's aes mode)",
            ));
        };
        let plaintext = passphrase::open_passphrase(passphrase, stored)?;
        Ok(Opened {
            plaintext: Zeroizing::new(plaintext),
            format: Format::Passphrase,
            arns: Vec::new(),
        })
    }

    /// The configured key IDs as ARNs (resolved through the key service once per process).
    pub async fn configured_arns(&self) -> Result<&[String], Error> {
        if let Some(arns) = self.resolved.get() {
            return Ok(arns);
        }
        let mut arns = Vec::with_capacity(self.key_ids.len());
        for id in &self.key_ids {
            arns.push(self.keys.resolve(id).await?);
        }
        Ok(self.resolved.get_or_init(|| arns))
    }

    pub async fn protection(&self, opened: &Opened) -> Result<Protection, Error> {
        if opened.arns.is_empty() || !self.seals() {
            return Ok(Protection::Unprotected);
        }
        let configured = self.configured_arns().await?;
        if !opened.arns.iter().any(|a| configured.contains(a)) {
            return Ok(Protection::Unprotected);
        }
        let mut have: Vec<&String> = opened.arns.iter().collect();
        let mut want: Vec<&String> = configured.iter().collect();
        have.sort();
        have.dedup();
        want.sort();
        want.dedup();
        Ok(if opened.format == Format::SopsBinary && have == want {
            Protection::Current
        } else {
            Protection::Partly
        })
    }
}
