//! What gitstate stores: every write sealed as sops binary mode under the configured KMS keys;
//! every read opened whatever it is (sops binary or tree, the aes passphrase mode, plaintext),
//! following the detection order of the format notes: a `sops` object, then any JSON, then the
//! passphrase mode.

use std::time::SystemTime;

use zeroize::Zeroizing;

use crate::document::{Document, Seal, looks_like_sops};
use crate::{Context, DataKey, Error, KeyService, WrappedKey, passphrase};

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
    /// The ARNs of the file's KMS entries (what the file claims, not what was checked).
    pub arns: Vec<String>,
    /// The key ARN that unwrapped the data key (for a deployment: a configured key's).
    pub key: Option<String>,
    /// Entries naming a configured key that the key service refused before one unwrapped, or
    /// that carry another context: a file with a broken (or decoy) entry is never judged current.
    pub refused: usize,
}

/// A configured key, resolved: the key ARN it is called by, and every ARN a file's entry may
/// name it with (the key ARN, and the alias ARN when configured by alias).
#[derive(Debug, Clone)]
struct Configured {
    arn: String,
    names: Vec<String>,
    current: bool,
}

/// Seal and open states with a key service, the configured write keys and an optional
/// passphrase for reading the aes mode.
pub struct Envelope<K> {
    keys: K,
    key_ids: Vec<String>,
    /// Keys that may still unwrap (states sealed before a key change), never used to seal.
    previous: Vec<String>,
    passphrase: Option<Zeroizing<String>>,
    /// The configured keys (current, then previous) resolved to ARNs, once.
    resolved: std::sync::OnceLock<Vec<Configured>>,
}

impl<K: KeyService> Envelope<K> {
    pub fn new(keys: K, key_ids: Vec<String>, passphrase: Option<Zeroizing<String>>) -> Self {
        Self {
            keys,
            key_ids,
            previous: Vec::new(),
            passphrase,
            resolved: std::sync::OnceLock::new(),
        }
    }

    /// Keys that still unwrap states sealed under them, but seal nothing.
    pub fn with_previous(mut self, previous: Vec<String>) -> Self {
        self.previous = previous;
        self
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

    /// Open stored bytes. With `expected` (a deployment reading the state at a location), only
    /// the configured keys unwrap, each called by its own ARN, and only an entry whose context
    /// equals `expected` is used; a file naming none of them is refused before any KMS call.
    /// Without it (break-glass), the file's own entries decide, as `sops -d` does.
    pub async fn open(&self, stored: &[u8], expected: Option<&Context>) -> Result<Opened, Error> {
        if looks_like_sops(stored) {
            let document = Document::parse(stored)?;
            let (key, arn, refused) = match expected {
                Some(expected) => self.configured_key(&document, expected).await?,
                None => {
                    let (key, arn) = document.data_key_from(&self.keys).await?;
                    (key, arn, 0)
                }
            };
            let plain = document.decrypt(&key)?;
            return Ok(Opened {
                plaintext: plain.bytes,
                format: if plain.binary {
                    Format::SopsBinary
                } else {
                    Format::SopsTree
                },
                arns: document.kms.iter().map(|e| e.arn.clone()).collect(),
                key: Some(arn),
                refused,
            });
        }
        if serde_json::from_slice::<serde::de::IgnoredAny>(stored).is_ok() {
            return Ok(Opened {
                plaintext: Zeroizing::new(stored.to_vec()),
                format: Format::Plain,
                arns: Vec::new(),
                key: None,
                refused: 0,
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
            key: None,
            refused: 0,
        })
    }

    /// The data key through the entries that name a configured key (current keys first, then
    /// previous ones) and carry exactly the expected context; at most one entry per configured
    /// key is tried, so a file with many entries costs no more KMS calls than keys are configured.
    async fn configured_key(
        &self,
        document: &Document,
        expected: &Context,
    ) -> Result<(DataKey, String, usize), Error> {
        if document.kms.is_empty() {
            return Err(Error::NoKmsEntry);
        }
        let configured = self.configured().await?;
        let mut candidates: Vec<(&Configured, &crate::KmsEntry)> = Vec::new();
        for entry in &document.kms {
            if let Some(key) = configured.iter().find(|c| c.names.contains(&entry.arn)) {
                candidates.push((key, entry));
            }
        }
        if candidates.is_empty() {
            return Err(Error::NoConfiguredKey {
                entries: document.kms.len(),
                first: document.kms[0].arn.chars().take(160).collect(),
            });
        }
        candidates.sort_by_key(|(key, _)| !key.current);
        // Entries naming a configured key under another context are never tried, but they keep
        // the file from being judged current, wherever they stand.
        let mismatched = candidates
            .iter()
            .filter(|(_, entry)| entry.context != *expected)
            .count();
        let (mut tried, mut last, mut mismatch) = (0, None, None);
        let mut asked: Vec<&str> = Vec::new();
        for (key, entry) in candidates {
            if asked.contains(&key.arn.as_str()) {
                continue;
            }
            if entry.context != *expected {
                mismatch = Some(Error::ContextMismatch {
                    found: entry.context.clone(),
                    expected: expected.clone(),
                });
                continue;
            }
            tried += 1;
            asked.push(&key.arn);
            let wrapped = WrappedKey {
                arn: key.arn.clone(),
                blob: entry.enc.clone(),
            };
            match self.keys.unwrap(&wrapped, expected).await {
                Ok(data_key) => return Ok((data_key, key.arn.clone(), tried - 1 + mismatched)),
                Err(e) => last = Some(e),
            }
        }
        match (mismatch, last) {
            (Some(mismatch), None) => Err(mismatch),
            (_, last) => Err(Error::NoKey { tried, last }),
        }
    }

    async fn configured(&self) -> Result<&[Configured], Error> {
        if let Some(keys) = self.resolved.get() {
            return Ok(keys);
        }
        let mut keys: Vec<Configured> = Vec::new();
        let all = self.key_ids.iter().map(|id| (id, true));
        for (id, current) in all.chain(self.previous.iter().map(|id| (id, false))) {
            let arn = self.keys.resolve(id).await?;
            let mut names = vec![arn.clone()];
            if id.starts_with("arn:") {
                names.push(id.clone());
            } else if id.starts_with("alias/")
                && let Some((prefix, _)) = arn.split_once(":key/")
            {
                names.push(format!("{prefix}:{id}"));
            }
            match keys.iter_mut().find(|k| k.arn == arn) {
                // a key in both lists is current
                Some(known) => {
                    known.current |= current;
                    known.names.extend(names);
                }
                None => keys.push(Configured {
                    arn,
                    names,
                    current,
                }),
            }
        }
        Ok(self.resolved.get_or_init(|| keys))
    }

    /// How the opened state stands, judged by the key that unwrapped it (not by the ARNs the
    /// file names): a current key makes it Current when it is binary mode and its entries name
    /// exactly the current keys and no entry naming one was refused, Partly otherwise; a previous
    /// key makes it Partly; no key (or one the deployment lacks, read break-glass) Unprotected.
    pub async fn protection(&self, opened: &Opened) -> Result<Protection, Error> {
        let Some(arn) = &opened.key else {
            return Ok(Protection::Unprotected);
        };
        if !self.seals() {
            return Ok(Protection::Unprotected);
        }
        let configured = self.configured().await?;
        let Some(unwrapped) = configured.iter().find(|c| c.names.contains(arn)) else {
            return Ok(Protection::Unprotected);
        };
        if !unwrapped.current {
            return Ok(Protection::Partly);
        }
        let named = |entry: &String| configured.iter().position(|c| c.names.contains(entry));
        let mut have: Vec<Option<usize>> = opened.arns.iter().map(named).collect();
        let mut want: Vec<Option<usize>> = (0..configured.len())
            .filter(|i| configured[*i].current)
            .map(Some)
            .collect();
        have.sort();
        have.dedup();
        want.sort();
        Ok(
            if opened.format == Format::SopsBinary && have == want && opened.refused == 0 {
                Protection::Current
            } else {
                Protection::Partly
            },
        )
    }
}
