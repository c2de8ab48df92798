//! A sops JSON document: its metadata, the data key behind its master keys, the tree walk that
//! decrypts values and recomputes the MAC, and the writers.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use zeroize::Zeroizing;

use crate::tree::Value;
use crate::{Context, DataKey, Error, KeyService, KeySource, Offline, Unwrapped};

mod open;
mod seal;
pub use seal::Seal;
pub(crate) use seal::grouping;

/// The `version` gitstate writes: a valid semver ≥ 3.3.0, or the sops CLI refuses the file or
/// takes its old "encryption context bug" path.
pub const SOPS_VERSION: &str = "3.13.2";

/// The data member holding the location a file is sealed for (its encryption context as JSON),
/// encrypted and under the MAC like the state: sops decrypts past it (the binary store emits only
/// `data`), and a copy at another path shows another location. Written whenever a key source
/// other than KMS (which binds the context itself) seals the file.
pub const BINDING: &str = "gitstate_binding";

/// One `kms[]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KmsEntry {
    pub arn: String,
    pub context: Context,
    pub created_at: String,
    pub enc: Vec<u8>,
}

/// One entry of another source: `age[]` (`recipient`) or `pgp[]` (`fp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The list it lives in: `age` or `pgp`.
    pub list: &'static str,
    /// The recipient or fingerprint.
    pub id: String,
    pub enc: String,
    pub created_at: String,
}

/// A key group: every entry wraps the same secret (the data key, or with several groups this
/// group's Shamir share of it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyGroup {
    pub kms: Vec<KmsEntry>,
    pub entries: Vec<Entry>,
    /// Entries of sources gitstate has no key service for (GCP KMS, Azure Key Vault, Vault).
    pub foreign: usize,
}

impl KeyGroup {
    pub fn len(&self) -> usize {
        self.kms.len() + self.entries.len() + self.foreign
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every entry's key name: KMS ARNs, then the other sources' recipients.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.kms
            .iter()
            .map(|e| e.arn.as_str())
            .chain(self.entries.iter().map(|e| e.id.as_str()))
    }
}

/// Which leaves a tree-mode file encrypts (sops allows one rule).
#[derive(Debug, Clone)]
enum Rule {
    UnencryptedSuffix(String),
    EncryptedSuffix(String),
    UnencryptedRegex(regex_lite::Regex),
    EncryptedRegex(regex_lite::Regex),
}

impl Rule {
    fn encrypts(&self, path: &[String]) -> bool {
        match self {
            Self::UnencryptedSuffix(s) => !path.iter().any(|k| k.ends_with(s.as_str())),
            Self::EncryptedSuffix(s) => path.iter().any(|k| k.ends_with(s.as_str())),
            Self::UnencryptedRegex(r) => !path.iter().any(|k| r.is_match(k)),
            Self::EncryptedRegex(r) => path.iter().any(|k| r.is_match(k)),
        }
    }
}

/// A parsed sops file.
#[derive(Debug, Clone)]
pub struct Document {
    data: Vec<(String, Value)>,
    /// One group when the file lists its keys at the top level; `key_groups` otherwise.
    pub groups: Vec<KeyGroup>,
    /// How many groups open the file (0 in the file means all of them).
    pub threshold: usize,
    pub lastmodified: String,
    mac: String,
    rule: Rule,
    mac_only_encrypted: bool,
    pub version: String,
}

/// A decrypted document: the plaintext bytes, whether it was binary mode, and the location it
/// names (see [`BINDING`]).
#[derive(Debug)]
pub struct Plain {
    pub bytes: Zeroizing<Vec<u8>>,
    pub binary: bool,
    pub binding: Option<Context>,
}

/// Is this a sops document (a JSON object with a top-level `sops` object)? Cheap enough for a
/// synchronous check: a full JSON parse without building the tree.
pub fn looks_like_sops(bytes: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Probe {
        sops: Option<serde::de::IgnoredAny>,
    }
    matches!(
        serde_json::from_slice::<Probe>(bytes),
        Ok(Probe { sops: Some(_) })
    )
}

impl Document {
    pub fn parse(bytes: &[u8]) -> Result<Self, Error> {
        let value = Value::parse(bytes).map_err(|e| Error::Format(e.to_string()))?;
        let Value::Object(members) = value else {
            return Err(Error::Format("the top level is not an object".into()));
        };
        let mut sops = None;
        let mut data = Vec::with_capacity(members.len());
        for (key, value) in members {
            if key == "sops" {
                sops = Some(value);
            } else {
                data.push((key, value));
            }
        }
        let sops = sops.ok_or_else(|| Error::Format("no `sops` metadata".into()))?;
        if !matches!(sops, Value::Object(_)) {
            return Err(Error::Format("`sops` is not an object".into()));
        }
        let text = |key: &str| match sops.get(key) {
            Some(Value::String(s)) => Some(s.clone()),
            _ => None,
        };
        let groups = match sops.get("key_groups") {
            Some(Value::Array(groups)) if !groups.is_empty() => groups
                .iter()
                .map(key_group)
                .collect::<Result<Vec<_>, _>>()?,
            None | Some(Value::Null) | Some(Value::Array(_)) => vec![key_group(&sops)?],
            Some(_) => return Err(Error::Format("`sops.key_groups` is not a list".into())),
        };
        let threshold = match sops.get("shamir_threshold") {
            None | Some(Value::Null) => 0,
            Some(Value::Number(n)) => n
                .parse::<usize>()
                .ok()
                .filter(|t| *t <= groups.len())
                .ok_or_else(|| Error::Format("`sops.shamir_threshold` is out of range".into()))?,
            Some(_) => {
                return Err(Error::Format(
                    "`sops.shamir_threshold` is not a number".into(),
                ));
            }
        };
        let regex = |r: String| {
            regex_lite::Regex::new(&r).map_err(|_| Error::Format("invalid regex rule".into()))
        };
        let rule = if let Some(s) = text("unencrypted_suffix") {
            Rule::UnencryptedSuffix(s)
        } else if let Some(s) = text("encrypted_suffix") {
            Rule::EncryptedSuffix(s)
        } else if let Some(r) = text("unencrypted_regex") {
            Rule::UnencryptedRegex(regex(r)?)
        } else if let Some(r) = text("encrypted_regex") {
            Rule::EncryptedRegex(regex(r)?)
        } else {
            Rule::UnencryptedSuffix("_unencrypted".into())
        };
        Ok(Self {
            data,
            groups,
            threshold,
            lastmodified: text("lastmodified")
                .ok_or_else(|| Error::Format("no `sops.lastmodified`".into()))?,
            mac: text("mac").ok_or_else(|| Error::Format("no `sops.mac`".into()))?,
            rule,
            mac_only_encrypted: matches!(sops.get("mac_only_encrypted"), Some(Value::Bool(true))),
            version: text("version").unwrap_or_default(),
        })
    }

    /// Is this binary mode: the whole plaintext in one `data` string (and maybe the binding)?
    pub fn is_binary(&self) -> bool {
        match self.data.as_slice() {
            [(key, Value::String(_))] => key == "data",
            [(key, Value::String(_)), (binding, Value::String(_))] => {
                key == "data" && binding == BINDING
            }
            _ => false,
        }
    }

    /// How many groups must open: every one when the file says 0, and the one of a single group.
    pub fn needed(&self) -> usize {
        match (self.groups.len(), self.threshold) {
            (0 | 1, _) => 1,
            (groups, 0) => groups,
            (_, threshold) => threshold,
        }
    }

    /// The data key from what the groups that opened unwrapped: the key itself with one group,
    /// Shamir shares with several (a wrong share gives a wrong key, which the MAC then refuses).
    pub fn combine(&self, parts: &[Unwrapped]) -> Result<DataKey, Error> {
        let key = if self.groups.len() > 1 {
            let shares: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
            crate::shamir::combine(&shares)
                .map_err(|e| Error::Format(format!("key group shares: {e}")))?
        } else {
            parts.first().cloned().ok_or(Error::NoKmsEntry)?
        };
        let key: [u8; 32] = key
            .as_slice()
            .try_into()
            .map_err(|_| Error::Format("the data key is not 256 bits".into()))?;
        Ok(Zeroizing::new(key))
    }

    /// The data key as `sops -d` finds it, for break-glass reads of a file in hand: in each group
    /// the first entry that opens, age entries with any identity held, KMS entries with their own
    /// ARN and context. A deployment reads through [`crate::Envelope::open`] with an expected
    /// context instead, where only its configured keys unwrap. Returns the key and the name of
    /// the first entry that opened.
    pub async fn data_key_from(
        &self,
        keys: &dyn KeyService,
        offline: &[Offline],
    ) -> Result<(DataKey, String), Error> {
        let needed = self.needed();
        let (mut parts, mut first, mut last, mut tried) = (Vec::new(), None, None, 0);
        for group in &self.groups {
            if parts.len() >= needed {
                break;
            }
            let mut got = None;
            'entries: for entry in &group.entries {
                for source in offline.iter().filter(|o| o.source.list() == entry.list) {
                    tried += 1;
                    // break-glass: no expected context; these sources bind none
                    let none = Context::new();
                    match source
                        .source
                        .unwrap(&entry.id, entry.enc.as_bytes(), &none)
                        .await
                    {
                        Ok(secret) => {
                            got = Some((secret, entry.id.clone()));
                            break 'entries;
                        }
                        Err(e) => last = Some(e),
                    }
                }
            }
            if got.is_none() {
                for entry in &group.kms {
                    tried += 1;
                    let kms = crate::KmsKeys(keys);
                    match kms.unwrap(&entry.arn, &entry.enc, &entry.context).await {
                        Ok(secret) => {
                            got = Some((secret, entry.arn.clone()));
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
            }
            if let Some((secret, id)) = got {
                parts.push(secret);
                first.get_or_insert(id);
            }
        }
        match first {
            Some(id) if parts.len() >= needed => Ok((self.combine(&parts)?, id)),
            _ if self.groups.len() > 1 => Err(Error::Threshold {
                opened: parts.len(),
                groups: self.groups.len(),
                threshold: needed,
                last,
            }),
            _ if tried == 0 => Err(Error::NoKmsEntry),
            _ => Err(Error::NoKey { tried, last }),
        }
    }
}

/// A key group: the `kms`, `age` and `pgp` lists of the metadata (or of one `key_groups[]`
/// object); null and missing lists are empty, entries of other sources are only counted.
fn key_group(value: &Value) -> Result<KeyGroup, Error> {
    let list = |key: &str| match value.get(key) {
        None | Some(Value::Null) => Ok(&[][..]),
        Some(Value::Array(entries)) => Ok(entries.as_slice()),
        Some(_) => Err(Error::Format(format!("`{key}` is not a list"))),
    };
    let kms = list("kms")?
        .iter()
        .map(kms_entry)
        .collect::<Result<Vec<_>, _>>()?;
    let mut entries = Vec::new();
    for (name, id_key) in [("age", "recipient"), ("pgp", "fp")] {
        for entry in list(name)? {
            let text = |key: &str| match entry.get(key) {
                Some(Value::String(s)) => Some(s.clone()),
                _ => None,
            };
            entries.push(Entry {
                list: name,
                id: text(id_key)
                    .ok_or_else(|| Error::Format(format!("an {name} entry has no `{id_key}`")))?,
                enc: text("enc")
                    .ok_or_else(|| Error::Format(format!("an {name} entry has no `enc`")))?,
                created_at: text("created_at").unwrap_or_default(),
            });
        }
    }
    let mut foreign = 0;
    for name in ["gcp_kms", "azure_kv", "hc_vault", "hckms"] {
        foreign += list(name)?.len();
    }
    Ok(KeyGroup {
        kms,
        entries,
        foreign,
    })
}

fn kms_entry(value: &Value) -> Result<KmsEntry, Error> {
    let text = |key: &str| match value.get(key) {
        Some(Value::String(s)) => Some(s.clone()),
        _ => None,
    };
    let context = match value.get("context") {
        Some(Value::Object(members)) => members
            .iter()
            .filter_map(|(k, v)| match v {
                Value::String(s) => Some((k.clone(), s.clone())),
                _ => None,
            })
            .collect(),
        _ => Context::new(),
    };
    let enc = text("enc").ok_or_else(|| Error::Format("a kms entry has no `enc`".into()))?;
    Ok(KmsEntry {
        arn: text("arn").ok_or_else(|| Error::Format("a kms entry has no `arn`".into()))?,
        context,
        created_at: text("created_at").unwrap_or_default(),
        enc: STANDARD
            .decode(enc.trim())
            .map_err(|_| Error::Format("a kms entry's `enc` is not base64".into()))?,
    })
}
