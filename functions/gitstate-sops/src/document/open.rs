//! Reading a sops document: every value decrypted, the MAC verified, the binding read.

use sha2::{Digest, Sha256, Sha512};
use zeroize::Zeroizing;

use super::{BINDING, Document, Plain, Rule};
use crate::cipher::{self, Sealed};
use crate::tree::Value;
use crate::{Context, DataKey, Error, time};

impl Document {
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

pub(super) fn upper_hex(bytes: &[u8]) -> String {
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
pub(super) fn canonical_plain(leaf: &Value) -> String {
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
pub(super) fn number_text(n: &str) -> (&'static str, String) {
    if let Ok(i) = n.parse::<i64>() {
        return ("int", i.to_string());
    }
    let f: f64 = n.parse().unwrap_or(f64::NAN);
    ("float", format!("{f}"))
}
