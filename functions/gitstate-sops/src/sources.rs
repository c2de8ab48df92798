//! Master key sources: one small trait, one implementation per source. AWS KMS ([`KmsKeys`], a
//! thin adapter over the richer [`KeyService`]), age and OpenPGP here; GCP KMS and Vault transit
//! would each be one more implementation (their entries are read and counted already, and never
//! used).

use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use zeroize::Zeroizing;

use crate::{Context, KeyError, KeyService, Unwrapped, WrappedKey};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    #[error("{0:?} is not an age recipient (age1…)")]
    Recipient(String),
    #[error("line {0} of the age identities is not an age secret key (AGE-SECRET-KEY-1…)")]
    Identity(usize),
    #[error("no age identity in the given text")]
    NoIdentity,
    #[error("{0:?} is not an OpenPGP fingerprint (40 or 64 hex digits)")]
    Fingerprint(String),
    #[error("the OpenPGP public keys do not parse (armored, as `gpg --armor --export` writes)")]
    PgpPublic,
    #[error(
        "the OpenPGP secret keys do not parse (armored, as `gpg --armor --export-secret-keys` writes)"
    )]
    PgpSecret,
    #[error("the OpenPGP secret key {0} is protected by a passphrase: set GITSTATE_PGP_PASSPHRASE")]
    PgpLocked(String),
    #[error("the passphrase does not unlock the OpenPGP secret key {0}")]
    PgpPassphrase(String),
    #[error("{0}")]
    KmsKey(String),
}

/// A secret wrapped by one master key: the name the file records the key by (a KMS key's ARN as
/// KMS answers it, an age recipient, an OpenPGP fingerprint) and the entry's ciphertext (the KMS
/// blob, which the file holds as base64; age and OpenPGP armored text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrappedSecret {
    pub key: String,
    pub enc: Vec<u8>,
}

/// A source of master keys that wraps a data key (or a key group's Shamir share) for a
/// recipient and unwraps an entry with a private key it holds (or, for a key service, asks it to).
#[async_trait]
pub trait KeySource: Send + Sync {
    /// The list of a sops key group its entries live in (`kms`, `age`, `pgp`, `gcp_kms`,
    /// `hc_vault`).
    fn list(&self) -> &'static str;
    /// The one spelling of a recipient the files carry; refuses what is not a recipient.
    fn recipient(&self, id: &str) -> Result<String, SourceError>;
    /// Whether the ciphertext binds the context itself (KMS's encryption context): files sealed
    /// through a source that does not carry the location as [`crate::BINDING`] instead.
    fn binds_context(&self) -> bool {
        false
    }
    /// `secret` wrapped for `recipient`, under `context` where the source binds one.
    async fn wrap(
        &self,
        recipient: &str,
        secret: &[u8],
        context: &Context,
    ) -> Result<WrappedSecret, KeyError>;
    /// Unwrap an entry naming `recipient`, made under `context` where the source binds one.
    async fn unwrap(
        &self,
        recipient: &str,
        enc: &[u8],
        context: &Context,
    ) -> Result<Unwrapped, KeyError>;
}

/// AWS KMS as a [`KeySource`]: wrap and unwrap through a [`KeyService`], which also keeps what
/// only KMS has (a fresh data key from the first key, resolving aliases to ARNs, the data-key
/// cache); the envelope calls those directly.
pub struct KmsKeys<'a, K: ?Sized>(pub &'a K);

#[async_trait]
impl<K: KeyService + ?Sized> KeySource for KmsKeys<'_, K> {
    fn list(&self) -> &'static str {
        "kms"
    }

    fn recipient(&self, id: &str) -> Result<String, SourceError> {
        let id = id.trim();
        crate::kms_key::KeyName::parse(id).map_err(|e| SourceError::KmsKey(e.to_string()))?;
        Ok(id.to_owned())
    }

    fn binds_context(&self) -> bool {
        true
    }

    async fn wrap(
        &self,
        recipient: &str,
        secret: &[u8],
        context: &Context,
    ) -> Result<WrappedSecret, KeyError> {
        let wrapped = self.0.wrap(recipient, secret, context).await?;
        Ok(WrappedSecret {
            key: wrapped.arn,
            enc: wrapped.blob,
        })
    }

    async fn unwrap(
        &self,
        recipient: &str,
        enc: &[u8],
        context: &Context,
    ) -> Result<Unwrapped, KeyError> {
        let wrapped = WrappedKey {
            arn: recipient.to_owned(),
            blob: enc.to_vec(),
        };
        self.0.unwrap(&wrapped, context).await
    }
}

/// A configured source: its recipients that seal every write (current) and those that only
/// still open (previous). Only entries naming one of them are ever tried.
#[derive(Clone)]
pub struct Offline {
    pub source: Arc<dyn KeySource>,
    pub current: Vec<String>,
    pub previous: Vec<String>,
}

impl Offline {
    /// Recipients spelt as the source spells them; refuses any that is not one.
    pub fn new(
        source: Arc<dyn KeySource>,
        current: &[String],
        previous: &[String],
    ) -> Result<Self, SourceError> {
        let canonical = |ids: &[String]| -> Result<Vec<String>, SourceError> {
            let mut out: Vec<String> = Vec::new();
            for id in ids {
                let id = source.recipient(id)?;
                if !out.contains(&id) {
                    out.push(id);
                }
            }
            Ok(out)
        };
        let current = canonical(current)?;
        let previous = canonical(previous)?
            .into_iter()
            .filter(|id| !current.contains(id))
            .collect();
        Ok(Self {
            source,
            current,
            previous,
        })
    }

    /// Is `id` (as a file spells it) a configured recipient, and a current one?
    pub fn names(&self, id: &str) -> Option<bool> {
        let id = self.source.recipient(id).ok()?;
        if self.current.contains(&id) {
            Some(true)
        } else if self.previous.contains(&id) {
            Some(false)
        } else {
            None
        }
    }
}

/// age X25519 recipients; the identities (private keys) it holds unwrap.
pub struct AgeKeys {
    identities: Vec<age::x25519::Identity>,
}

/// Names the recipients only: the identities are secrets.
impl std::fmt::Debug for AgeKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgeKeys")
            .field("recipients", &self.recipients())
            .finish()
    }
}

impl AgeKeys {
    /// No private key: seals for its recipients, opens nothing.
    pub fn sealing_only() -> Self {
        Self {
            identities: Vec::new(),
        }
    }

    /// Identities as an age identity file holds them: one `AGE-SECRET-KEY-1…` a line, `#`
    /// comments and blank lines skipped.
    pub fn parse(text: &str) -> Result<Self, SourceError> {
        let mut identities = Vec::new();
        for (at, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let identity =
                age::x25519::Identity::from_str(line).map_err(|_| SourceError::Identity(at + 1))?;
            identities.push(identity);
        }
        if identities.is_empty() {
            return Err(SourceError::NoIdentity);
        }
        Ok(Self { identities })
    }

    /// The recipients of the identities held.
    pub fn recipients(&self) -> Vec<String> {
        self.identities
            .iter()
            .map(|i| i.to_public().to_string())
            .collect()
    }
}

#[async_trait]
impl KeySource for AgeKeys {
    fn list(&self) -> &'static str {
        "age"
    }

    fn recipient(&self, id: &str) -> Result<String, SourceError> {
        age::x25519::Recipient::from_str(id.trim())
            .map(|r| r.to_string())
            .map_err(|_| SourceError::Recipient(id.chars().take(80).collect()))
    }

    async fn wrap(
        &self,
        recipient: &str,
        secret: &[u8],
        _: &Context,
    ) -> Result<WrappedSecret, KeyError> {
        let to = age::x25519::Recipient::from_str(recipient)
            .map_err(|e| KeyError::Refused(e.to_string().into()))?;
        let armored = age::encrypt_and_armor(&to, secret)
            .map_err(|e| KeyError::Refused(e.to_string().into()))?;
        Ok(WrappedSecret {
            key: recipient.to_owned(),
            enc: armored.into_bytes(),
        })
    }

    async fn unwrap(
        &self,
        recipient: &str,
        enc: &[u8],
        _: &Context,
    ) -> Result<Unwrapped, KeyError> {
        let identity = self
            .identities
            .iter()
            .find(|i| i.to_public().to_string() == recipient)
            .ok_or_else(|| KeyError::Refused("no age identity for this recipient".into()))?;
        age::decrypt(identity, enc)
            .map(Zeroizing::new)
            .map_err(|e| KeyError::Refused(e.to_string().into()))
    }
}

/// OpenPGP keys (rPGP): public keys to seal for, by primary-key fingerprint as sops names them
/// (40 upper-case hex digits), and the secret keys that open (unlocked once, when parsed, with
/// the passphrase given for those protected by one).
pub struct PgpKeys {
    public: Vec<pgp::composed::SignedPublicKey>,
    secret: Vec<pgp::composed::SignedSecretKey>,
}

/// Names the fingerprints only: the secret keys are secrets.
impl std::fmt::Debug for PgpKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use pgp::types::KeyDetails;
        let fps = |keys: Vec<String>| keys;
        f.debug_struct("PgpKeys")
            .field(
                "public",
                &fps(self
                    .public
                    .iter()
                    .map(|k| fingerprint(&k.fingerprint()))
                    .collect()),
            )
            .field(
                "secret",
                &fps(self
                    .secret
                    .iter()
                    .map(|k| fingerprint(&k.fingerprint()))
                    .collect()),
            )
            .finish()
    }
}

fn fingerprint(fp: &pgp::types::Fingerprint) -> String {
    format!("{fp:X}")
}

impl PgpKeys {
    /// Armored public keys (any number, as `gpg --armor --export` writes them) and armored secret
    /// keys (`gpg --armor --export-secret-keys`), either may be empty. Secret keys protected by a
    /// passphrase are unlocked here with `passphrase` (the same for all of them): a key it does
    /// not unlock, or a protected key without one, is refused now rather than at the first read.
    pub fn parse(
        public: &str,
        secret: &str,
        passphrase: Option<&str>,
    ) -> Result<Self, SourceError> {
        use pgp::composed::{Deserializable, SignedPublicKey, SignedSecretKey};
        let mut keys = Self {
            public: Vec::new(),
            secret: Vec::new(),
        };
        for block in armor_blocks(public) {
            let (many, _) =
                SignedPublicKey::from_string_many(block).map_err(|_| SourceError::PgpPublic)?;
            for key in many {
                keys.public.push(key.map_err(|_| SourceError::PgpPublic)?);
            }
        }
        for block in armor_blocks(secret) {
            let (many, _) =
                SignedSecretKey::from_string_many(block).map_err(|_| SourceError::PgpSecret)?;
            for key in many {
                let key = key.map_err(|_| SourceError::PgpSecret)?;
                keys.secret.push(unlock(key, passphrase)?);
            }
        }
        Ok(keys)
    }

    /// Whether a public key with this (primary) fingerprint is held.
    pub fn has_public(&self, fp: &str) -> bool {
        use pgp::types::KeyDetails;
        self.public
            .iter()
            .any(|k| fingerprint(&k.fingerprint()) == fp)
    }

    /// The fingerprints of the secret keys held.
    pub fn fingerprints(&self) -> Vec<String> {
        use pgp::types::KeyDetails;
        self.secret
            .iter()
            .map(|k| fingerprint(&k.fingerprint()))
            .collect()
    }
}

/// The armored blocks of a text (one `-----BEGIN PGP …` line each, as files that hold several
/// exports one after another do); text before the first block is ignored.
fn armor_blocks(text: &str) -> Vec<&str> {
    let mut starts: Vec<usize> = text
        .match_indices("-----BEGIN PGP ")
        .map(|(at, _)| at)
        .filter(|&at| at == 0 || text[..at].ends_with('\n'))
        .collect();
    if starts.is_empty() && !text.trim().is_empty() {
        // not armored: the parser says so
        starts.push(0);
    }
    let ends = starts.iter().skip(1).copied().chain([text.len()]);
    starts.iter().zip(ends).map(|(&a, b)| &text[a..b]).collect()
}

/// The secret key with its decryption material unlocked: every subkey that can encrypt, or the
/// primary key when none can (signing material, possibly a `gpg` stub after
/// `--export-secret-subkeys`, is left as it is and never used).
fn unlock(
    mut key: pgp::composed::SignedSecretKey,
    passphrase: Option<&str>,
) -> Result<pgp::composed::SignedSecretKey, SourceError> {
    use pgp::types::{KeyDetails, Password};
    let fp = fingerprint(&key.fingerprint());
    let password = passphrase.map(Password::from);
    let unlock_one = |locked: bool,
                      remove: &mut dyn FnMut(&Password) -> pgp::errors::Result<()>|
     -> Result<(), SourceError> {
        if !locked {
            return Ok(());
        }
        let password = password
            .as_ref()
            .ok_or_else(|| SourceError::PgpLocked(fp.clone()))?;
        remove(password).map_err(|_| SourceError::PgpPassphrase(fp.clone()))
    };
    let mut subkeys = 0;
    for sub in &mut key.secret_subkeys {
        if sub.key.algorithm().can_encrypt() {
            subkeys += 1;
            let locked = sub.key.secret_params().is_encrypted();
            unlock_one(locked, &mut |p| sub.key.remove_password(p))?;
        }
    }
    if subkeys == 0 {
        let locked = key.primary_key.secret_params().is_encrypted();
        unlock_one(locked, &mut |p| key.primary_key.remove_password(p))?;
    }
    Ok(key)
}

#[async_trait]
impl KeySource for PgpKeys {
    fn list(&self) -> &'static str {
        "pgp"
    }

    fn recipient(&self, id: &str) -> Result<String, SourceError> {
        let fp: String = id.chars().filter(|c| !c.is_whitespace()).collect();
        if (fp.len() == 40 || fp.len() == 64) && fp.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(fp.to_ascii_uppercase())
        } else {
            Err(SourceError::Fingerprint(id.chars().take(80).collect()))
        }
    }

    async fn wrap(
        &self,
        recipient: &str,
        secret: &[u8],
        _: &Context,
    ) -> Result<WrappedSecret, KeyError> {
        use pgp::composed::{ArmorOptions, MessageBuilder};
        use pgp::crypto::sym::SymmetricKeyAlgorithm;
        use pgp::types::KeyDetails;
        let refused = |e: &dyn std::fmt::Display| KeyError::Refused(e.to_string().into());
        let key = self
            .public
            .iter()
            .find(|k| fingerprint(&k.fingerprint()) == recipient)
            .ok_or_else(|| {
                KeyError::Refused("no OpenPGP public key for this fingerprint".into())
            })?;
        let subkey = key
            .public_subkeys
            .iter()
            .find(|s| s.algorithm().can_encrypt())
            .ok_or_else(|| KeyError::Refused("the OpenPGP key has no encryption subkey".into()))?;
        let mut rng = rand08::rngs::OsRng;
        let mut builder = MessageBuilder::from_bytes("", secret.to_vec())
            .seipd_v1(rng, SymmetricKeyAlgorithm::AES256);
        builder
            .encrypt_to_key(&mut rng, subkey)
            .map_err(|e| refused(&e))?;
        let armored = builder
            .to_armored_string(rng, ArmorOptions::default())
            .map_err(|e| refused(&e))?;
        Ok(WrappedSecret {
            key: recipient.to_owned(),
            enc: armored.into_bytes(),
        })
    }

    async fn unwrap(
        &self,
        recipient: &str,
        enc: &[u8],
        _: &Context,
    ) -> Result<Unwrapped, KeyError> {
        use pgp::composed::Message;
        use pgp::types::KeyDetails;
        let refused = |e: &dyn std::fmt::Display| KeyError::Refused(e.to_string().into());
        let key = self
            .secret
            .iter()
            .find(|k| fingerprint(&k.fingerprint()) == recipient)
            .ok_or_else(|| {
                KeyError::Refused("no OpenPGP secret key for this fingerprint".into())
            })?;
        let (message, _) = Message::from_armor(enc).map_err(|e| refused(&e))?;
        // unlocked when parsed
        let mut message = message
            .decrypt(&pgp::types::Password::empty(), key)
            .map_err(|e| refused(&e))?;
        if message.is_compressed() {
            message = message.decompress().map_err(|e| refused(&e))?;
        }
        message
            .as_data_vec()
            .map(Zeroizing::new)
            .map_err(|e| refused(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Generated files of several armored blocks (with text before, blank lines between, CRLF
    /// or not) split into exactly those blocks; a marker inside a line starts none.
    #[test]
    fn armor_blocks_split_concatenated_exports() {
        let block = |kind: &str, body: &str, nl: &str| {
            format!("-----BEGIN PGP {kind}-----{nl}{nl}{body}{nl}-----END PGP {kind}-----{nl}")
        };
        for n in 1..=4 {
            for nl in ["\n", "\r\n"] {
                for lead in ["", "comment line\n", "\n\n"] {
                    let blocks: Vec<String> = (0..n)
                        .map(|i| {
                            block("PUBLIC KEY BLOCK", &format!("body{i} -----BEGIN PGP x"), nl)
                        })
                        .collect();
                    let text = format!("{lead}{}", blocks.join(nl));
                    let got = armor_blocks(&text);
                    assert_eq!(got.len(), n, "{text:?}");
                    for (i, part) in got.iter().enumerate() {
                        assert!(part.starts_with("-----BEGIN PGP PUBLIC KEY BLOCK-----"));
                        assert!(part.contains(&format!("body{i} ")), "{part:?}");
                    }
                }
            }
        }
        assert!(armor_blocks("").is_empty() && armor_blocks(" \n").is_empty());
        assert_eq!(armor_blocks("not armored"), ["not armored"]);
    }

    /// The KMS adapter names its list, binds the context, and spells a key as configured,
    /// refusing what no KMS key name parses as.
    #[test]
    fn kms_adapter_recipients() {
        struct NoKms;
        #[async_trait]
        impl KeyService for NoKms {
            async fn generate(
                &self,
                _: &str,
                _: &Context,
            ) -> Result<(crate::DataKey, WrappedKey), KeyError> {
                Err(KeyError::Refused("no".into()))
            }
            async fn wrap(&self, _: &str, _: &[u8], _: &Context) -> Result<WrappedKey, KeyError> {
                Err(KeyError::Refused("no".into()))
            }
            async fn unwrap(&self, _: &WrappedKey, _: &Context) -> Result<Unwrapped, KeyError> {
                Err(KeyError::Refused("no".into()))
            }
            async fn resolve(&self, _: &str) -> Result<String, KeyError> {
                Err(KeyError::Refused("no".into()))
            }
        }
        let kms = KmsKeys(&NoKms);
        assert_eq!(kms.list(), "kms");
        assert!(kms.binds_context());
        assert!(!AgeKeys::sealing_only().binds_context());
        let arn = "arn:aws:kms:eu-west-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab";
        assert_eq!(kms.recipient(&format!(" {arn} ")).as_deref(), Ok(arn));
        assert_eq!(
            kms.recipient("alias/tfstate").as_deref(),
            Ok("alias/tfstate")
        );
        assert!(kms.recipient("arn:aws:kms:nowhere").is_err());
    }
}
