//! Writing a sops document: a data key from the master keys, every value encrypted, the MAC.

use super::*;

/// The settings of one write.
pub struct Seal<'a> {
    pub keys: &'a dyn KeyService,
    /// The master keys, in file order; the first generates the data key.
    pub key_ids: &'a [String],
    pub context: &'a Context,
    pub now: SystemTime,
}

impl Seal<'_> {
    async fn data_key(&self) -> Result<(DataKey, Vec<WrappedKey>), Error> {
        let (first, rest) = self.key_ids.split_first().ok_or(Error::NoWriteKey)?;
        let (key, wrapped) = self.keys.generate(first, self.context).await?;
        let mut all = vec![wrapped];
        for id in rest {
            all.push(self.keys.wrap(id, &key, self.context).await?);
        }
        Ok((key, all))
    }

    /// Encrypt a whole payload as sops binary mode: tab-indented, keys sorted, trailing newline.
    /// Any bytes, as sops itself stores a binary file: typed `str`, hashed as they are.
    pub async fn binary(&self, plaintext: &[u8]) -> Result<Vec<u8>, Error> {
        let (key, wrapped) = self.data_key().await?;
        let data = if plaintext.is_empty() {
            String::new()
        } else {
            cipher::encrypt(&key, plaintext, b"data:", "str")?.render()
        };
        let mac = upper_hex(&Sha512::digest(plaintext));
        let members = vec![("data".to_owned(), Value::String(data))];
        self.emit(members, &key, &wrapped, &mac)
    }

    /// Encrypt a JSON document as sops tree mode, typing numbers as sops 3.13.2 does. gitstate
    /// writes binary mode; this exists for reading tests and a possible diffable mode.
    pub async fn tree(&self, plaintext: &[u8]) -> Result<Vec<u8>, Error> {
        let Value::Object(members) =
            Value::parse(plaintext).map_err(|e| Error::Format(e.to_string()))?
        else {
            return Err(Error::Format("the top level is not an object".into()));
        };
        let (key, wrapped) = self.data_key().await?;
        let mut hash = Sha512::new();
        let mut path = Vec::new();
        let mut out = Vec::with_capacity(members.len());
        for (k, v) in &members {
            path.push(k.clone());
            out.push((k.clone(), encrypt_value(&key, v, &mut path, &mut hash)?));
            path.pop();
        }
        let mac = upper_hex(&hash.finalize());
        self.emit(out, &key, &wrapped, &mac)
    }

    fn emit(
        &self,
        mut members: Vec<(String, Value)>,
        key: &DataKey,
        wrapped: &[WrappedKey],
        mac: &str,
    ) -> Result<Vec<u8>, Error> {
        let lastmodified = time::format(self.now);
        let mac = cipher::encrypt(key, mac.as_bytes(), lastmodified.as_bytes(), "str")?.render();
        let s = |t: &str| Value::String(t.to_owned());
        let entries = wrapped
            .iter()
            .map(|w| {
                let context = self
                    .context
                    .iter()
                    .map(|(k, v)| (k.clone(), s(v)))
                    .collect();
                Value::Object(vec![
                    ("arn".into(), s(&w.arn)),
                    ("aws_profile".into(), s("")),
                    ("context".into(), Value::Object(context)),
                    ("created_at".into(), s(&lastmodified)),
                    ("enc".into(), Value::String(STANDARD.encode(&w.blob))),
                ])
            })
            .collect();
        let sops = Value::Object(vec![
            ("kms".into(), Value::Array(entries)),
            ("lastmodified".into(), s(&lastmodified)),
            ("mac".into(), Value::String(mac)),
            ("unencrypted_suffix".into(), s("_unencrypted")),
            ("version".into(), s(SOPS_VERSION)),
        ]);
        members.push(("sops".into(), sops));
        Ok(Value::Object(members).to_json_tabs().into_bytes())
    }
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
