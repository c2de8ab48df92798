//! A sops JSON document: its metadata, the data key behind its master keys, the tree walk that
//! decrypts values and recomputes the MAC, and the writers.

use std::time::SystemTime;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest, Sha256, Sha512};
use zeroize::Zeroizing;

use crate::cipher::{self, Sealed};
use crate::tree::Value;
use crate::{Context, DataKey, Error, KeyService, KeySource, Offline, Unwrapped, WrappedKey, time};

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

    /// Decrypt every value, verify the MAC, and give back the plaintext: the `data` string's
    /// bytes in binary mode, JSON otherwise.
    pub fn decrypt(&self, key: &DataKey) -> Result<Plain, Error> {
        if self.is_binary() && self.rule.encrypts(&["data".to_owned()]) {
            return self.decrypt_binary(key);
        }
        let mut walk = Walk {
            key,
            rule: &self.rule,
            hash: Sha512::new(),
            mac_only_encrypted: self.mac_only_encrypted,
        };
        if self.mac_only_encrypted {
            walk.hash.update(Sha256::digest(b"sops"));
        }
        let mut path = Vec::new();
        let mut members = Vec::with_capacity(self.data.len());
        for (k, v) in &self.data {
            path.push(k.clone());
            members.push((k.clone(), walk.value(v, &mut path)?));
            path.pop();
        }
        self.verify_mac(key, walk.hash)?;
        let binding = match members.iter().position(|(k, _)| k == BINDING) {
            Some(at) => match members.remove(at).1 {
                Value::String(text) => Some(binding(&text)?),
                _ => return Err(Error::Format(format!("{BINDING:?} is not a string"))),
            },
            None => None,
        };
        if self.is_binary()
            && let [(_, Value::String(text))] = members.as_mut_slice()
        {
            return Ok(Plain {
                bytes: Zeroizing::new(std::mem::take(text).into_bytes()),
                binary: true,
                binding,
            });
        }
        Ok(Plain {
            bytes: Zeroizing::new(Value::Object(members).to_json().into_bytes()),
            binary: false,
            binding,
        })
    }
}

/// The location a binding names, from its plaintext (the context as a JSON object).
fn binding(text: &str) -> Result<Context, Error> {
    serde_json::from_str(text).map_err(|_| Error::Format(format!("{BINDING:?} is not a location")))
}

impl Document {
    /// Binary mode: the `data` value's plaintext bytes as they are, UTF-8 or not (gitstate seals
    /// gzip streams; sops stores any file so), authenticated by its GCM tag and the MAC, and the
    /// binding after it.
    fn decrypt_binary(&self, key: &DataKey) -> Result<Plain, Error> {
        let mut hash = Sha512::new();
        if self.mac_only_encrypted {
            hash.update(Sha256::digest(b"sops"));
        }
        let mut bytes = Zeroizing::new(Vec::new());
        let mut binding_text = None;
        for (name, value) in &self.data {
            let Value::String(text) = value else {
                continue;
            };
            if text.is_empty() {
                continue;
            }
            let sealed = Sealed::parse(text)
                .ok_or_else(|| Error::Format(format!("value at {name:?} is not encrypted")))??;
            if !matches!(sealed.kind.as_str(), "str" | "bytes") {
                return Err(Error::Format(format!(
                    "value at {name:?} is a {}, not a string",
                    sealed.kind
                )));
            }
            let plain = cipher::decrypt(key, &sealed, format!("{name}:").as_bytes())?;
            hash.update(plain.as_slice());
            if name == "data" {
                bytes = plain;
            } else {
                binding_text = Some(plain);
            }
        }
        self.verify_mac(key, hash)?;
        let binding = match binding_text {
            Some(text) => {
                Some(binding(std::str::from_utf8(&text).map_err(|_| {
                    Error::Format(format!("{BINDING:?} is not UTF-8"))
                })?)?)
            }
            None => None,
        };
        Ok(Plain {
            bytes,
            binary: true,
            binding,
        })
    }

    /// The stored MAC (encrypted under the data key, bound to `lastmodified`) against the hash
    /// of the values.
    fn verify_mac(&self, key: &DataKey, hash: Sha512) -> Result<(), Error> {
        let computed = upper_hex(&hash.finalize());
        let aad = time::normalise(&self.lastmodified)
            .ok_or_else(|| Error::Format("`sops.lastmodified` is not an RFC 3339 time".into()))?;
        let sealed = Sealed::parse(&self.mac)
            .ok_or_else(|| Error::Format("`sops.mac` is not encrypted".into()))??;
        let stored = cipher::decrypt(key, &sealed, aad.as_bytes()).map_err(|e| match e {
            Error::Tampered { .. } => Error::MacMismatch,
            other => other,
        })?;
        if stored.as_slice() != computed.as_bytes() {
            return Err(Error::MacMismatch);
        }
        Ok(())
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

fn upper_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

struct Walk<'a> {
    key: &'a DataKey,
    rule: &'a Rule,
    hash: Sha512,
    mac_only_encrypted: bool,
}

impl Walk<'_> {
    fn value(&mut self, value: &Value, path: &mut Vec<String>) -> Result<Value, Error> {
        match value {
            Value::Null => Ok(Value::Null),
            Value::Array(items) => items
                .iter()
                .map(|item| self.value(item, path))
                .collect::<Result<_, _>>()
                .map(Value::Array),
            Value::Object(members) => {
                let mut out = Vec::with_capacity(members.len());
                for (k, v) in members {
                    path.push(k.clone());
                    out.push((k.clone(), self.value(v, path)?));
                    path.pop();
                }
                Ok(Value::Object(out))
            }
            leaf if self.rule.encrypts(path) => self.decrypt_leaf(leaf, path),
            leaf => {
                if !self.mac_only_encrypted {
                    self.hash.update(canonical_plain(leaf).as_bytes());
                }
                Ok(leaf.clone())
            }
        }
    }

    fn decrypt_leaf(&mut self, leaf: &Value, path: &[String]) -> Result<Value, Error> {
        let at = || path.join(":");
        let Value::String(text) = leaf else {
            return Err(Error::Format(format!(
                "expected an encrypted string at {:?}",
                at()
            )));
        };
        if text.is_empty() {
            return Ok(Value::String(String::new()));
        }
        let sealed = Sealed::parse(text)
            .ok_or_else(|| Error::Format(format!("value at {:?} is not encrypted", at())))??;
        let aad = format!("{}:", path.join(":"));
        let plain = cipher::decrypt(self.key, &sealed, aad.as_bytes())?;
        let text = std::str::from_utf8(&plain)
            .map_err(|_| Error::Format(format!("value at {:?} is not UTF-8", at())))?;
        let bad = || {
            Error::Format(format!(
                "value at {:?} is not a valid {}",
                at(),
                sealed.kind
            ))
        };
        let (value, mac) = match sealed.kind.as_str() {
            "str" | "bytes" | "time" => (Value::String(text.to_owned()), text.to_owned()),
            "int" => {
                let n: i64 = text.trim().parse().map_err(|_| bad())?;
                (Value::Number(n.to_string()), n.to_string())
            }
            "float" => {
                let n: f64 = text.trim().parse().map_err(|_| bad())?;
                // Emit the written digits verbatim (`4`, not `4.0`) when they are a JSON number.
                let verbatim = serde_json::from_str::<serde_json::Number>(text.trim()).is_ok();
                let shown = if verbatim {
                    text.trim().to_owned()
                } else if n.is_finite() {
                    format!("{n}")
                } else {
                    return Err(bad());
                };
                (Value::Number(shown), format!("{n}"))
            }
            "bool" => {
                let b = parse_bool(text).ok_or_else(bad)?;
                (Value::Bool(b), if b { "True" } else { "False" }.to_owned())
            }
            other => {
                return Err(Error::Unsupported(format!("value type {other:?}")));
            }
        };
        self.hash.update(mac.as_bytes());
        Ok(value)
    }
}

/// Go's `strconv.ParseBool`.
fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The MAC bytes of a cleartext leaf (sops `ToBytes` of the value as sops 3.13.2 parses it).
fn canonical_plain(leaf: &Value) -> String {
    match leaf {
        Value::String(s) => s.clone(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => number_text(n).1,
        Value::Null | Value::Array(_) | Value::Object(_) => String::new(),
    }
}

/// sops 3.13.2's typing of a JSON number: an integer within i64 is `int`, anything else is a
/// `float` printed with the shortest round-trip digits. Returns (type, text).
fn number_text(n: &str) -> (&'static str, String) {
    if let Ok(i) = n.parse::<i64>() {
        return ("int", i.to_string());
    }
    let f: f64 = n.parse().unwrap_or(f64::NAN);
    ("float", format!("{f}"))
}
