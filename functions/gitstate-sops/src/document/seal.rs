//! Writing a sops document: a data key from the master keys, every value encrypted, the MAC.

use std::time::SystemTime;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest, Sha512};
use zeroize::Zeroizing;

use super::open::{canonical_plain, number_text, upper_hex};
use super::{BINDING, SOPS_VERSION};
use crate::tree::Value;
use crate::{
    Context, DataKey, Error, KeyService, KeySource, KmsKeys, Offline, WrappedKey, cipher, time,
};

/// The settings of one write.
pub struct Seal<'a> {
    pub keys: &'a dyn KeyService,
    /// The KMS master keys, in file order; the first generates the data key.
    pub key_ids: &'a [String],
    /// The other sources, each with the recipients it seals for.
    pub offline: &'a [Offline],
    /// `None` (or 1): one key group of every key, any of which opens the file. `Some(n)`, n ≥ 2:
    /// one group per source (KMS, then each other source), any `n` of which open it.
    pub threshold: Option<usize>,
    pub context: &'a Context,
    pub now: SystemTime,
}

/// One master key of a write: a KMS key ID, or a recipient of another source.
#[derive(Clone, Copy)]
enum Member<'a> {
    Kms(&'a str),
    Offline(&'a Offline, &'a str),
}

/// The key groups of a write from each source's keys (empty ones left out), and the threshold
/// the file names (0 for one group).
pub(crate) fn grouping<T>(
    per_source: Vec<Vec<T>>,
    threshold: Option<usize>,
) -> Result<(Vec<Vec<T>>, usize), Error> {
    let mut groups: Vec<Vec<T>> = per_source.into_iter().filter(|g| !g.is_empty()).collect();
    if groups.is_empty() {
        return Err(Error::NoWriteKey);
    }
    match threshold {
        Some(n) if n >= 2 => {
            if n > groups.len() {
                return Err(Error::Layout(format!(
                    "a threshold of {n} needs at least {n} sources of keys, {} are configured",
                    groups.len()
                )));
            }
            if groups.len() == 1 {
                return Ok((groups, 0));
            }
            Ok((groups, n))
        }
        _ => {
            let one: Vec<T> = groups.drain(..).flatten().collect();
            Ok((vec![one], 0))
        }
    }
}

/// The sealed secret of each group, and each group's entries.
type Wrapped<'a> = (DataKey, Vec<Vec<(Member<'a>, Wrap)>>);

/// What an entry holds once wrapped.
enum Wrap {
    Kms(WrappedKey),
    Text(String),
}

impl Seal<'_> {
    fn groups(&self) -> Result<(Vec<Vec<Member<'_>>>, usize), Error> {
        let mut per_source = vec![self.key_ids.iter().map(|k| Member::Kms(k)).collect()];
        for source in self.offline {
            per_source.push(
                source
                    .current
                    .iter()
                    .map(|id| Member::Offline(source, id))
                    .collect(),
            );
        }
        grouping(per_source, self.threshold)
    }

    async fn wrap<'m>(&self, member: Member<'m>, secret: &[u8]) -> Result<Wrap, Error> {
        Ok(match member {
            Member::Kms(id) => {
                let wrapped = KmsKeys(self.keys).wrap(id, secret, self.context).await?;
                Wrap::Kms(WrappedKey {
                    arn: wrapped.key,
                    blob: wrapped.enc,
                })
            }
            Member::Offline(source, id) => {
                let wrapped = source.source.wrap(id, secret, self.context).await?;
                // armored text
                Wrap::Text(String::from_utf8(wrapped.enc).map_err(|_| Error::Crypto)?)
            }
        })
    }

    /// The data key and every entry: with one group led by a KMS key, that key generates the
    /// data key; otherwise it is random here, split into shares when there are several groups.
    async fn data_key(&self) -> Result<(Wrapped<'_>, usize, bool), Error> {
        let (groups, threshold) = self.groups()?;
        let bound = groups
            .iter()
            .flatten()
            .any(|m| matches!(m, Member::Offline(o, _) if !o.source.binds_context()));
        let mut out = Vec::with_capacity(groups.len());
        let key = if let [group] = groups.as_slice() {
            let mut entries = Vec::with_capacity(group.len());
            let key = match group.first() {
                Some(Member::Kms(first)) => {
                    let (key, wrapped) = self.keys.generate(first, self.context).await?;
                    entries.push((group[0], Wrap::Kms(wrapped)));
                    key
                }
                _ => random_key(),
            };
            for member in &group[entries.len()..] {
                entries.push((*member, self.wrap(*member, key.as_slice()).await?));
            }
            out.push(entries);
            key
        } else {
            let key = random_key();
            let shares =
                crate::shamir::split(key.as_slice(), groups.len(), threshold, &mut rand::rng())
                    .map_err(|e| Error::Layout(e.to_string()))?;
            for (group, share) in groups.iter().zip(&shares) {
                let mut entries = Vec::with_capacity(group.len());
                for member in group {
                    entries.push((*member, self.wrap(*member, share).await?));
                }
                out.push(entries);
            }
            key
        };
        Ok(((key, out), threshold, bound))
    }

    /// Encrypt a whole payload as sops binary mode: tab-indented, keys sorted, trailing newline.
    /// Any bytes, as sops itself stores a binary file: typed `str`, hashed as they are.
    pub async fn binary(&self, plaintext: &[u8]) -> Result<Vec<u8>, Error> {
        let ((key, wrapped), threshold, bound) = self.data_key().await?;
        let data = if plaintext.is_empty() {
            String::new()
        } else {
            cipher::encrypt(&key, plaintext, b"data:", "str")?.render()
        };
        let mut hash = Sha512::new();
        hash.update(plaintext);
        let mut members = vec![("data".to_owned(), Value::String(data))];
        if bound {
            members.push(self.binding(&key, &mut hash)?);
        }
        let mac = upper_hex(&hash.finalize());
        self.emit(members, &key, &wrapped, threshold, &mac)
    }

    /// Encrypt a JSON document as sops tree mode, typing numbers as sops 3.13.2 does. gitstate
    /// writes binary mode; this exists for reading tests and a possible diffable mode.
    pub async fn tree(&self, plaintext: &[u8]) -> Result<Vec<u8>, Error> {
        let Value::Object(members) =
            Value::parse(plaintext).map_err(|e| Error::Format(e.to_string()))?
        else {
            return Err(Error::Format("the top level is not an object".into()));
        };
        let ((key, wrapped), threshold, bound) = self.data_key().await?;
        let mut hash = Sha512::new();
        let mut path = Vec::new();
        let mut out = Vec::with_capacity(members.len());
        for (k, v) in &members {
            path.push(k.clone());
            out.push((k.clone(), encrypt_value(&key, v, &mut path, &mut hash)?));
            path.pop();
        }
        if bound {
            out.push(self.binding(&key, &mut hash)?);
        }
        let mac = upper_hex(&hash.finalize());
        self.emit(out, &key, &wrapped, threshold, &mac)
    }

    /// The [`BINDING`] member: the context, encrypted at its own path and hashed into the MAC.
    fn binding(&self, key: &DataKey, hash: &mut Sha512) -> Result<(String, Value), Error> {
        let text = serde_json::to_string(self.context).map_err(|_| Error::Crypto)?;
        hash.update(text.as_bytes());
        let sealed = cipher::encrypt(
            key,
            text.as_bytes(),
            format!("{BINDING}:").as_bytes(),
            "str",
        )?;
        Ok((BINDING.to_owned(), Value::String(sealed.render())))
    }

    fn emit(
        &self,
        mut members: Vec<(String, Value)>,
        key: &DataKey,
        wrapped: &[Vec<(Member<'_>, Wrap)>],
        threshold: usize,
        mac: &str,
    ) -> Result<Vec<u8>, Error> {
        let lastmodified = time::format(self.now);
        let mac = cipher::encrypt(key, mac.as_bytes(), lastmodified.as_bytes(), "str")?.render();
        let s = |t: &str| Value::String(t.to_owned());
        // one group's lists, keys sorted: age, kms, pgp (empty ones left out)
        let lists = |group: &[(Member<'_>, Wrap)]| -> Vec<(String, Value)> {
            let mut by_list: Vec<(String, Vec<Value>)> = Vec::new();
            for (member, sealed) in group {
                let (list, entry) = match (member, sealed) {
                    (Member::Kms(_), Wrap::Kms(w)) => {
                        let context = self
                            .context
                            .iter()
                            .map(|(k, v)| (k.clone(), s(v)))
                            .collect();
                        (
                            "kms",
                            Value::Object(vec![
                                ("arn".into(), s(&w.arn)),
                                ("aws_profile".into(), s("")),
                                ("context".into(), Value::Object(context)),
                                ("created_at".into(), s(&lastmodified)),
                                ("enc".into(), Value::String(STANDARD.encode(&w.blob))),
                            ]),
                        )
                    }
                    (Member::Offline(source, id), Wrap::Text(enc)) => {
                        let list = source.source.list();
                        let entry = if list == "age" {
                            vec![("enc".into(), s(enc)), ("recipient".into(), s(id))]
                        } else {
                            vec![
                                ("created_at".into(), s(&lastmodified)),
                                ("enc".into(), s(enc)),
                                ("fp".into(), s(id)),
                            ]
                        };
                        (list, Value::Object(entry))
                    }
                    _ => continue,
                };
                match by_list.iter_mut().find(|(l, _)| l == list) {
                    Some((_, entries)) => entries.push(entry),
                    None => by_list.push((list.to_owned(), vec![entry])),
                }
            }
            by_list.sort_by(|a, b| a.0.cmp(&b.0));
            by_list
                .into_iter()
                .map(|(l, entries)| (l, Value::Array(entries)))
                .collect()
        };
        let mut sops: Vec<(String, Value)> = Vec::new();
        if let [group] = wrapped {
            sops.extend(lists(group));
        } else {
            let groups = wrapped.iter().map(|g| Value::Object(lists(g))).collect();
            sops.push(("key_groups".into(), Value::Array(groups)));
            sops.push((
                "shamir_threshold".into(),
                Value::Number(threshold.to_string()),
            ));
        }
        sops.extend([
            ("lastmodified".into(), s(&lastmodified)),
            ("mac".into(), Value::String(mac)),
            ("unencrypted_suffix".into(), s("_unencrypted")),
            ("version".into(), s(SOPS_VERSION)),
        ]);
        sops.sort_by(|a, b| a.0.cmp(&b.0));
        members.push(("sops".into(), Value::Object(sops)));
        Ok(Value::Object(members).to_json_tabs().into_bytes())
    }
}

fn random_key() -> DataKey {
    let mut key = Zeroizing::new([0u8; 32]);
    rand::RngCore::fill_bytes(&mut rand::rng(), key.as_mut_slice());
    key
}

fn encrypt_value(
    key: &DataKey,
    value: &Value,
    path: &mut Vec<String>,
    hash: &mut Sha512,
) -> Result<Value, Error> {
    let aad = |path: &[String]| format!("{}:", path.join(":"));
    let (kind, text) = match value {
        Value::Null => return Ok(Value::Null),
        Value::Array(items) => {
            return items
                .iter()
                .map(|item| encrypt_value(key, item, path, hash))
                .collect::<Result<_, _>>()
                .map(Value::Array);
        }
        Value::Object(members) => {
            let mut out = Vec::with_capacity(members.len());
            for (k, v) in members {
                path.push(k.clone());
                out.push((k.clone(), encrypt_value(key, v, path, hash)?));
                path.pop();
            }
            return Ok(Value::Object(out));
        }
        Value::String(s) if s.is_empty() => return Ok(Value::String(String::new())),
        Value::String(s) => ("str", s.clone()),
        Value::Bool(b) => ("bool", if *b { "True" } else { "False" }.to_owned()),
        Value::Number(n) => number_text(n),
    };
    if path.iter().any(|k| k.ends_with("_unencrypted")) {
        hash.update(canonical_plain(value).as_bytes());
        return Ok(value.clone());
    }
    hash.update(text.as_bytes());
    Ok(Value::String(
        cipher::encrypt(key, text.as_bytes(), aad(path).as_bytes(), kind)?.render(),
    ))
}
