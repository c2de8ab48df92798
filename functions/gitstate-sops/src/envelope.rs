//! What gitstate stores: every write sealed as sops binary mode under the configured keys (KMS,
//! age; one key group, or a threshold of groups);
//! every read opened whatever it is (sops binary or tree, the aes passphrase mode, plaintext),
//! following the detection order of the format notes: a `sops` object, then any JSON, then the
//! passphrase mode.

use std::time::SystemTime;

use zeroize::Zeroizing;

use crate::document::{Document, Seal, looks_like_sops};
use crate::{
    Context, DataKey, Error, KeyService, KeySource, KmsKeys, Offline, Unwrapped, passphrase,
};

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
    /// The key ARN (or age recipient) that unwrapped the data key, or the first group's share
    /// (for a deployment: a configured key's).
    pub key: Option<String>,
    /// Every key that opened a group (one with a single group).
    pub openers: Vec<String>,
    /// Each group's entries, by key name (what the file claims), and how many groups must open
    /// (0 for a single group).
    pub groups: Vec<Vec<String>>,
    pub threshold: usize,
    /// Whether the file names its location (see [`crate::BINDING`]).
    pub bound: bool,
    /// Entries naming a configured key that the key service refused before one unwrapped, or
    /// that carry another context: a file with a broken (or decoy) entry is never judged current.
    pub refused: usize,
}

impl Opened {
    /// Bytes that no key sealed (plaintext, or the passphrase mode), as read.
    fn unsealed(plaintext: Vec<u8>, format: Format) -> Self {
        Self {
            plaintext: Zeroizing::new(plaintext),
            format,
            arns: Vec::new(),
            key: None,
            openers: Vec::new(),
            groups: Vec::new(),
            threshold: 0,
            bound: false,
            refused: 0,
        }
    }
}

/// A configured key, resolved: the key ARN it is called by, and every ARN a file's entry may
/// name it with (the key ARN, and the alias ARN when configured by alias).
#[derive(Debug, Clone)]
struct Configured {
    arn: String,
    names: Vec<String>,
    current: bool,
}

/// What one key group gave.
enum GroupKey {
    Opened {
        secret: Unwrapped,
        by: String,
        refused: usize,
        kms: bool,
    },
    Failed(Error),
    /// No entry of the group names a configured key.
    NotNamed,
}

/// Seal and open states with a key service, the configured write keys and an optional
/// passphrase for reading the aes mode.
pub struct Envelope<K> {
    keys: K,
    key_ids: Vec<String>,
    /// The other sources (age), with their current and previous recipients.
    offline: Vec<Offline>,
    /// See [`Seal::threshold`].
    threshold: Option<usize>,
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
            offline: Vec::new(),
            threshold: None,
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

    /// Other sources of keys (age), sealing for their current recipients and opening entries
    /// that name a current or previous one.
    pub fn with_offline(mut self, offline: Vec<Offline>) -> Self {
        self.offline = offline;
        self
    }

    /// Key groups: see [`Seal::threshold`].
    pub fn with_threshold(mut self, threshold: Option<usize>) -> Self {
        self.threshold = threshold;
        self
    }

    pub fn keys(&self) -> &K {
        &self.keys
    }

    /// Whether writes are sealed (some key is configured).
    pub fn seals(&self) -> bool {
        !self.key_ids.is_empty() || self.offline.iter().any(|o| !o.current.is_empty())
    }

    /// Cheap and synchronous: does opening these bytes need a key (as opposed to plain JSON)?
    pub fn is_encrypted(stored: &[u8]) -> bool {
        looks_like_sops(stored) || serde_json::from_slice::<serde::de::IgnoredAny>(stored).is_err()
    }

    pub async fn seal(&self, plaintext: &[u8], context: &Context) -> Result<Vec<u8>, Error> {
        Seal {
            keys: &self.keys,
            key_ids: &self.key_ids,
            offline: &self.offline,
            threshold: self.threshold,
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
            return self.open_sops(stored, expected).await;
        }
        if serde_json::from_slice::<serde::de::IgnoredAny>(stored).is_ok() {
            return Ok(Opened::unsealed(stored.to_vec(), Format::Plain));
        }
        let Some(passphrase) = &self.passphrase else {
            return Err(Error::Unrecognised(
                " (set GITSTATE_PASSPHRASE to read terraform-backend-git's aes mode)",
            ));
        };
        let plaintext = passphrase::open_passphrase(passphrase, stored)?;
        Ok(Opened::unsealed(plaintext, Format::Passphrase))
    }

    /// [`Self::open`] for a sops document.
    async fn open_sops(&self, stored: &[u8], expected: Option<&Context>) -> Result<Opened, Error> {
        let document = Document::parse(stored)?;
        let (key, openers, refused, via_kms) = match expected {
            Some(expected) => self.configured_key(&document, expected).await?,
            None => {
                let (key, id) = document.data_key_from(&self.keys, &self.offline).await?;
                (key, vec![id], 0, false)
            }
        };
        let plain = document.decrypt(&key)?;
        if let Some(expected) = expected {
            match &plain.binding {
                Some(found) if found != expected => {
                    return Err(Error::ContextMismatch {
                        found: found.clone(),
                        expected: expected.clone(),
                    });
                }
                None if !via_kms => return Err(Error::Unbound),
                _ => {}
            }
        }
        let threshold = if document.groups.len() > 1 {
            document.needed()
        } else {
            0
        };
        Ok(Opened {
            plaintext: plain.bytes,
            format: if plain.binary {
                Format::SopsBinary
            } else {
                Format::SopsTree
            },
            arns: document
                .groups
                .iter()
                .flat_map(|g| g.kms.iter().map(|e| e.arn.clone()))
                .collect(),
            key: openers.first().cloned(),
            openers,
            groups: document
                .groups
                .iter()
                .map(|g| g.ids().map(str::to_owned).collect())
                .collect(),
            threshold,
            bound: plain.binding.is_some(),
            refused,
        })
    }

    /// The data key through the entries that name a configured key (current keys first, then
    /// previous ones): in each group, age entries naming a configured recipient, then KMS entries
    /// that carry exactly the expected context; at most one entry per configured key is tried,
    /// so a file with many entries costs no more KMS calls than keys are configured. With
    /// several groups, groups open until the threshold is met. Returns the key, the keys that
    /// opened, the entries refused and whether a KMS key (which binds the context) opened one.
    async fn configured_key(
        &self,
        document: &Document,
        expected: &Context,
    ) -> Result<(DataKey, Vec<String>, usize, bool), Error> {
        let entries: usize = document.groups.iter().map(|g| g.len()).sum();
        if entries == 0 {
            return Err(Error::NoKmsEntry);
        }
        let configured = if self.key_ids.is_empty() && self.previous.is_empty() {
            &[][..]
        } else {
            self.configured().await?
        };
        let needed = document.needed();
        let (mut parts, mut openers, mut refused, mut via_kms) = (Vec::new(), Vec::new(), 0, false);
        let (mut named, mut last) = (0, None);
        for group in &document.groups {
            if parts.len() >= needed {
                break;
            }
            match self.group_key(group, expected, configured).await {
                GroupKey::Opened {
                    secret,
                    by,
                    refused: r,
                    kms,
                } => {
                    parts.push(secret);
                    openers.push(by);
                    refused += r;
                    via_kms |= kms;
                    named += 1;
                }
                GroupKey::Failed(e) => {
                    named += 1;
                    // a copy's mismatch outranks any later failure
                    if !matches!(last, Some(Error::ContextMismatch { .. })) {
                        last = Some(e);
                    }
                }
                GroupKey::NotNamed => {}
            }
        }
        if parts.len() >= needed {
            return Ok((document.combine(&parts)?, openers, refused, via_kms));
        }
        if named == 0 {
            let first = document
                .groups
                .iter()
                .flat_map(|g| g.ids())
                .next()
                .unwrap_or_default();
            return Err(Error::NoConfiguredKey {
                entries,
                first: first.chars().take(160).collect(),
            });
        }
        if document.groups.len() > 1 {
            // a group bound to another location says so: the file was copied, not under-keyed
            if let Some(Error::ContextMismatch { .. }) = &last {
                return Err(last.unwrap_or(Error::NoKmsEntry));
            }
            let last = match last {
                Some(Error::NoKey { last, .. }) => last,
                Some(Error::Key(e)) => Some(e),
                _ => None,
            };
            return Err(Error::Threshold {
                opened: parts.len(),
                groups: document.groups.len(),
                threshold: needed,
                last,
            });
        }
        Err(last.unwrap_or(Error::NoKey {
            tried: 0,
            last: None,
        }))
    }

    async fn group_key(
        &self,
        group: &crate::KeyGroup,
        expected: &Context,
        configured: &[Configured],
    ) -> GroupKey {
        let (mut refused, mut tried, mut last) = (0, 0, None);
        // other sources first: no network, and pinned to the configured recipients
        let offline = self.offline_entries(group);
        for (_, source, entry) in &offline {
            tried += 1;
            match source
                .source
                .unwrap(&entry.id, entry.enc.as_bytes(), expected)
                .await
            {
                Ok(secret) => {
                    return GroupKey::Opened {
                        secret,
                        by: entry.id.clone(),
                        refused,
                        kms: false,
                    };
                }
                Err(e) => {
                    refused += 1;
                    last = Some(e);
                }
            }
        }
        let candidates = kms_entries(group, configured);
        if candidates.is_empty() && offline.is_empty() {
            return GroupKey::NotNamed;
        }
        // Entries naming a configured key under another context are never tried, but they keep
        // the file from being judged current, wherever they stand.
        let mismatched = candidates
            .iter()
            .filter(|(_, entry)| entry.context != *expected)
            .count();
        let mut mismatch = None;
        let mut asked: Vec<&str> = Vec::new();
        let mut kms_tried = 0;
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
            kms_tried += 1;
            asked.push(&key.arn);
            match KmsKeys(&self.keys)
                .unwrap(&key.arn, &entry.enc, expected)
                .await
            {
                Ok(secret) => {
                    return GroupKey::Opened {
                        secret,
                        by: key.arn.clone(),
                        refused: refused + kms_tried - 1 + mismatched,
                        kms: true,
                    };
                }
                Err(e) => last = Some(e),
            }
        }
        GroupKey::Failed(match (mismatch, last) {
            (Some(mismatch), None) => mismatch,
            (_, last) => Error::NoKey { tried, last },
        })
    }

    /// A group's entries of other sources that a configured recipient opens, current ones first.
    fn offline_entries<'a>(
        &'a self,
        group: &'a crate::KeyGroup,
    ) -> Vec<(bool, &'a Offline, &'a crate::Entry)> {
        let mut found = Vec::new();
        for entry in &group.entries {
            for source in self
                .offline
                .iter()
                .filter(|o| o.source.list() == entry.list)
            {
                if let Some(current) = source.names(&entry.id) {
                    found.push((current, source, entry));
                }
            }
        }
        found.sort_by_key(|(current, _, _)| !current);
        found
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

    /// How the opened state stands, judged by the keys that opened it (not by the names the
    /// file lists): when every opener is a current key, it is Current if it is binary mode, its
    /// groups hold exactly the keys (and threshold) a write would seal with now, it names its
    /// location whenever a source other than KMS seals, and no entry naming a configured key was
    /// refused; Partly otherwise. An opener that is only a previous key makes it Partly; no key
    /// (or one the deployment lacks, read break-glass) Unprotected.
    pub async fn protection(&self, opened: &Opened) -> Result<Protection, Error> {
        if opened.openers.is_empty() || !self.seals() {
            return Ok(Protection::Unprotected);
        }
        let configured = if self.key_ids.is_empty() && self.previous.is_empty() {
            &[][..]
        } else {
            self.configured().await?
        };
        // a key name, as the one name of a configured key and whether it is current
        let canonical = |id: &String| -> Option<(String, bool)> {
            if let Some(key) = configured.iter().find(|c| c.names.contains(id)) {
                return Some((format!("kms:{}", key.arn), key.current));
            }
            self.offline.iter().find_map(|o| {
                let current = o.names(id)?;
                let id = o.source.recipient(id).ok()?;
                Some((format!("{}:{id}", o.source.list()), current))
            })
        };
        let mut any_previous = false;
        for opener in &opened.openers {
            match canonical(opener) {
                None => return Ok(Protection::Unprotected),
                Some((_, current)) => any_previous |= !current,
            }
        }
        if any_previous {
            return Ok(Protection::Partly);
        }
        let mut have: Vec<Vec<String>> = opened
            .groups
            .iter()
            .map(|group| {
                let mut names: Vec<String> = group
                    .iter()
                    .map(|id| canonical(id).map_or_else(|| format!("?:{id}"), |(n, _)| n))
                    .collect();
                names.sort();
                names.dedup();
                names
            })
            .collect();
        have.sort();
        let mut per_source: Vec<Vec<String>> = vec![
            configured
                .iter()
                .filter(|c| c.current)
                .map(|c| format!("kms:{}", c.arn))
                .collect(),
        ];
        for o in &self.offline {
            per_source.push(
                o.current
                    .iter()
                    .map(|id| format!("{}:{id}", o.source.list()))
                    .collect(),
            );
        }
        let binds = self.offline.iter().any(|o| !o.current.is_empty());
        let (mut want, threshold) = crate::document::grouping(per_source, self.threshold)?;
        for group in &mut want {
            group.sort();
        }
        want.sort();
        Ok(
            if opened.format == Format::SopsBinary
                && have == want
                && opened.threshold == threshold
                && opened.refused == 0
                && (opened.bound || !binds)
            {
                Protection::Current
            } else {
                Protection::Partly
            },
        )
    }
}

/// A group's KMS entries that name a configured key, with that key, current keys first.
fn kms_entries<'a>(
    group: &'a crate::KeyGroup,
    configured: &'a [Configured],
) -> Vec<(&'a Configured, &'a crate::KmsEntry)> {
    let mut found: Vec<(&Configured, &crate::KmsEntry)> = group
        .kms
        .iter()
        .filter_map(|entry| {
            configured
                .iter()
                .find(|c| c.names.contains(&entry.arn))
                .map(|key| (key, entry))
        })
        .collect();
    found.sort_by_key(|(key, _)| !key.current);
    found
}
