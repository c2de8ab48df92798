//! The sops format against deterministic vectors and a fake key service: reading what sops and
//! terraform-backend-git write, and round trips of what gitstate writes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use base64::Engine;
use gitstate_sops::{
    Context, DataKey, Document, Envelope, Error, Format, KeyError, KeyService, Protection, Seal,
    Unwrapped, WrappedKey, cipher,
};
use zeroize::Zeroizing;

const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors");

fn vector(name: &str) -> Vec<u8> {
    std::fs::read(format!("{VECTORS}/{name}")).expect("vector file")
}

fn vector_key() -> DataKey {
    let mut key = [0u8; 32];
    for (i, b) in key.iter_mut().enumerate() {
        *b = u8::try_from(i).expect("small");
    }
    Zeroizing::new(key)
}

/// A wrapped key's master key ARN, context and plaintext.
type Bound = (String, Context, Vec<u8>);

/// A key service in memory: blobs are opaque handles, bound to their context like KMS does.
#[derive(Default)]
struct FakeKms {
    wrapped: Mutex<HashMap<Vec<u8>, Bound>>,
    calls: Mutex<Vec<&'static str>>,
}

impl FakeKms {
    fn arn(key_id: &str) -> String {
        format!("arn:aws:kms:us-east-1:123456789012:key/{key_id}")
    }
    fn store(&self, key_id: &str, key: &[u8], context: &Context) -> WrappedKey {
        let mut map = self.wrapped.lock().expect("lock");
        let blob = format!("blob-{}", map.len()).into_bytes();
        map.insert(
            blob.clone(),
            (Self::arn(key_id), context.clone(), key.to_vec()),
        );
        WrappedKey {
            arn: Self::arn(key_id),
            blob,
        }
    }
    fn calls(&self) -> Vec<&'static str> {
        self.calls.lock().expect("lock").clone()
    }
    /// Another client of the same key service: the same keys, its own call log.
    fn same_keys(&self) -> Self {
        Self {
            wrapped: Mutex::new(self.wrapped.lock().expect("lock").clone()),
            calls: Mutex::default(),
        }
    }
}

fn refused(what: &str) -> KeyError {
    KeyError::Refused(what.to_owned().into())
}

#[async_trait]
impl KeyService for FakeKms {
    async fn generate(
        &self,
        key_id: &str,
        context: &Context,
    ) -> Result<(DataKey, WrappedKey), KeyError> {
        self.calls.lock().expect("lock").push("GenerateDataKey");
        let mut key = Zeroizing::new([0u8; 32]);
        for (i, b) in key.iter_mut().enumerate() {
            *b = u8::try_from(i).expect("small") ^ 0x5a;
        }
        let wrapped = self.store(key_id, key.as_slice(), context);
        Ok((key, wrapped))
    }
    async fn wrap(
        &self,
        key_id: &str,
        key: &[u8],
        context: &Context,
    ) -> Result<WrappedKey, KeyError> {
        self.calls.lock().expect("lock").push("Encrypt");
        Ok(self.store(key_id, key, context))
    }
    async fn unwrap(&self, wrapped: &WrappedKey, context: &Context) -> Result<Unwrapped, KeyError> {
        self.calls.lock().expect("lock").push("Decrypt");
        let map = self.wrapped.lock().expect("lock");
        match map.get(&wrapped.blob) {
            // like KMS, a blob opens only under the key that wrapped it, named by its ARN
            Some((arn, _, _)) if *arn != wrapped.arn => Err(refused("another key's ciphertext")),
            Some((_, bound, key)) if bound == context => Ok(Zeroizing::new(key.clone())),
            Some(_) => Err(refused("wrong context")),
            None => Err(refused("invalid ciphertext")),
        }
    }
    async fn resolve(&self, key_id: &str) -> Result<String, KeyError> {
        Ok(Self::arn(key_id.trim_start_matches("alias/")))
    }
}

fn context(state: &str) -> Context {
    [
        (
            "gitstate:repository".to_owned(),
            "https://git.example/r".to_owned(),
        ),
        ("gitstate:state".to_owned(), state.to_owned()),
    ]
    .into_iter()
    .collect()
}

fn envelope(keys: &[&str]) -> Envelope<FakeKms> {
    Envelope::new(
        FakeKms::default(),
        keys.iter().map(|k| (*k).to_owned()).collect(),
        Some(Zeroizing::new("my-passphrase".to_owned())),
    )
}

#[test]
fn value_vectors_encrypt_and_decrypt_exactly() {
    // GIVEN the per-value vectors (fixed key and IVs)
    let doc: serde_json::Value =
        serde_json::from_slice(&vector("value-vectors.json")).expect("json");
    let key = vector_key();
    for v in doc["values"].as_array().expect("values") {
        let plaintext = match &v["plaintext"] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Bool(true) => "True".into(),
            serde_json::Value::Bool(false) => "False".into(),
            other => other.to_string(),
        };
        let enc = v["enc"].as_str().expect("enc");
        let kind = enc
            .rsplit("type:")
            .next()
            .expect("type")
            .trim_end_matches(']');
        let iv: [u8; 32] = hex(v["iv_hex"].as_str().expect("iv"))
            .try_into()
            .expect("32 bytes");
        let aad = v["aad"].as_str().expect("aad").as_bytes();
        // WHEN encrypted with the same IV, THEN the exact ENC string; and it decrypts back
        let sealed =
            cipher::encrypt_with_iv(&key, &iv, plaintext.as_bytes(), aad, kind).expect("encrypts");
        assert_eq!(sealed.render(), enc);
        let parsed = gitstate_sops::Sealed::parse(enc)
            .expect("ENC")
            .expect("valid");
        assert_eq!(
            cipher::decrypt(&key, &parsed, aad)
                .expect("opens")
                .as_slice(),
            plaintext.as_bytes()
        );
    }
    // AND the MAC of the plain tfstate is SHA-512 of its bytes, upper-case hex
    use sha2::Digest;
    let mac: String = sha2::Sha512::digest(vector("tfstate.plain.json"))
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect();
    assert_ne!(mac, "", "computed");
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn tree_vector_decrypts_to_its_plain_file() {
    // GIVEN the tree-mode vector written with the fixed data key
    let document = Document::parse(&vector("tfstate.enc.fixedkey.json")).expect("sops file");
    assert!(!document.is_binary());
    // WHEN decrypted (MAC verified)
    let plain = document.decrypt(&vector_key()).expect("decrypts");
    let got: serde_json::Value = serde_json::from_slice(&plain.bytes).expect("json");
    let mut want: serde_json::Value =
        serde_json::from_slice(&vector("tfstate.plain.json")).expect("json");
    // THEN it equals the plain file, except the over-int64 number sops types as a lossy float
    assert_eq!(
        got["outputs"]["big"]["value"].to_string(),
        "12345678901234567000"
    );
    want["outputs"]["big"]["value"] = got["outputs"]["big"]["value"].clone();
    assert_eq!(got, want);
    // AND integers come back as integers (Terraform refuses "version": 4.0)
    let text = String::from_utf8(plain.bytes.to_vec()).expect("utf-8");
    assert!(text.contains("\"version\": 4,"), "{text}");
    // AND a wrong data key fails
    assert!(document.decrypt(&Zeroizing::new([9u8; 32])).is_err());
}

#[test]
fn tree_vector_tampering_is_detected() {
    let original = String::from_utf8(vector("tfstate.enc.fixedkey.json")).expect("utf-8");
    // a value swapped between two paths: its AAD no longer matches
    let lineage = original
        .lines()
        .find(|l| l.contains("\"lineage\""))
        .expect("line")
        .split('"')
        .nth(3)
        .expect("value")
        .to_owned();
    let terraform = original
        .lines()
        .find(|l| l.contains("\"terraform_version\""))
        .expect("line")
        .split('"')
        .nth(3)
        .expect("value")
        .to_owned();
    let swapped = original
        .replace(&lineage, "@@SWAP@@")
        .replace(&terraform, &lineage)
        .replace("@@SWAP@@", &terraform);
    let moved = Document::parse(swapped.as_bytes())
        .expect("parses")
        .decrypt(&vector_key());
    assert!(matches!(moved, Err(Error::Tampered { .. })), "{moved:?}");
    // a cleartext value changed: only the MAC notices
    let changed = original.replace("\"empty\": \"\"", "\"empty\": \"x\"");
    assert_ne!(changed, original);
    let mac = Document::parse(changed.as_bytes())
        .expect("parses")
        .decrypt(&vector_key());
    assert!(mac.is_err(), "{mac:?}");
    // the lastmodified changed: the MAC's AAD no longer matches
    let when = original.replace(
        "\"lastmodified\": \"2026-01-02T03:04:05Z\"",
        "\"lastmodified\": \"2026-01-02T03:04:06Z\"",
    );
    let when = Document::parse(when.as_bytes())
        .expect("parses")
        .decrypt(&vector_key());
    assert!(matches!(when, Err(Error::MacMismatch)), "{when:?}");
}

#[tokio::test]
async fn passphrase_vector_opens_with_the_passphrase_only() {
    let stored = vector("plumber-aes.tfstate.bin");
    let opened = envelope(&[]).open(&stored, None).await.expect("aes mode");
    assert_eq!(opened.format, Format::Passphrase);
    let got: serde_json::Value = serde_json::from_slice(&opened.plaintext).expect("json");
    assert_eq!(got["lineage"], "3f1c2a9e-8b7d-4c1e-9f00-1234567890ab");
    let without = Envelope::new(FakeKms::default(), vec![], None);
    assert!(matches!(
        without.open(&stored, None).await,
        Err(Error::Unrecognised(_))
    ));
    let wrong = Envelope::new(
        FakeKms::default(),
        vec![],
        Some(Zeroizing::new("nope".into())),
    );
    assert!(matches!(
        wrong.open(&stored, None).await,
        Err(Error::Tampered { .. })
    ));
}

#[tokio::test]
async fn binary_round_trip_is_byte_exact_under_two_keys() {
    // GIVEN two configured keys
    let env = envelope(&["k1", "k2"]);
    let plaintext = vector("tfstate.plain.json");
    // WHEN sealed
    let sealed = env
        .seal(&plaintext, &context("a.tfstate"))
        .await
        .expect("seals");
    let text = String::from_utf8(sealed.clone()).expect("utf-8");
    // THEN binary mode, tab-indented, no plaintext, one generate and one wrap
    assert!(
        text.starts_with("{\n\t\"data\": \"ENC[AES256_GCM,data:"),
        "{text}"
    );
    assert!(text.ends_with("}\n"));
    assert!(!text.contains("lineage") && !text.contains("3f1c2a9e"));
    assert_eq!(env.keys().calls(), ["GenerateDataKey", "Encrypt"]);
    let doc: serde_json::Value = serde_json::from_slice(&sealed).expect("json");
    assert_eq!(doc["sops"]["kms"].as_array().expect("kms").len(), 2);
    assert_eq!(doc["sops"]["version"], "3.13.2");
    assert_eq!(doc["sops"]["kms"][0]["aws_profile"], "");
    // AND it opens byte-exact, as Current
    let opened = env
        .open(&sealed, Some(&context("a.tfstate")))
        .await
        .expect("opens");
    assert_eq!(opened.plaintext.as_slice(), plaintext.as_slice());
    assert_eq!(opened.format, Format::SopsBinary);
    assert_eq!(
        env.protection(&opened).await.expect("resolves"),
        Protection::Current
    );
    // AND either key alone suffices: drop the first entry
    let mut second_only = doc.clone();
    second_only["sops"]["kms"]
        .as_array_mut()
        .expect("kms")
        .remove(0);
    let reopened = env
        .open(&serde_json::to_vec(&second_only).expect("json"), None)
        .await
        .expect("second key");
    assert_eq!(reopened.plaintext.as_slice(), plaintext.as_slice());
    // AND after rotation to another key set, it opens through k2 and is only partly current
    let rotated = Envelope::new(env.keys().same_keys(), vec!["k2".into(), "k3".into()], None);
    let through_k2 = rotated
        .open(&sealed, Some(&context("a.tfstate")))
        .await
        .expect("k2 is configured");
    assert_eq!(through_k2.key.as_deref(), Some(FakeKms::arn("k2").as_str()));
    assert_eq!(
        rotated.protection(&through_k2).await.expect("resolves"),
        Protection::Partly
    );
    // AND under k1 as a previous key only, it opens and is partly current
    let previous = Envelope::new(env.keys().same_keys(), vec!["k3".into()], None)
        .with_previous(vec!["k1".into()]);
    let through_k1 = previous
        .open(&sealed, Some(&context("a.tfstate")))
        .await
        .expect("k1 is a previous key");
    assert_eq!(
        previous.protection(&through_k1).await.expect("resolves"),
        Protection::Partly
    );
    // AND a deployment with neither key refuses it without asking the key service
    let foreign = Envelope::new(env.keys().same_keys(), vec!["k9".into()], None);
    assert!(matches!(
        foreign.open(&sealed, Some(&context("a.tfstate"))).await,
        Err(Error::NoConfiguredKey { entries: 2, .. })
    ));
    assert!(foreign.keys().calls().is_empty());
    // AND a thousand decoy entries naming k1 before the real ones cost one call per key
    let mut decoyed = doc.clone();
    let decoy = {
        let mut e = decoyed["sops"]["kms"][0].clone();
        e["enc"] = "ZGVjb3k=".into();
        e
    };
    let list = decoyed["sops"]["kms"].as_array_mut().expect("kms");
    for _ in 0..1000 {
        list.insert(0, decoy.clone());
    }
    let both = Envelope::new(env.keys().same_keys(), vec!["k1".into(), "k2".into()], None);
    let opened_decoyed = both
        .open(
            &serde_json::to_vec(&decoyed).expect("json"),
            Some(&context("a.tfstate")),
        )
        .await
        .expect("k2's entry opens it");
    assert_eq!(both.keys().calls(), ["Decrypt", "Decrypt"]);
    assert_eq!(opened_decoyed.refused, 1);
    assert_eq!(
        both.protection(&opened_decoyed).await.expect("resolves"),
        Protection::Partly,
        "a refused entry: never current"
    );
    // AND entries naming a configured key under another context, anywhere among the real ones,
    // are counted: such a file is never current, so rekey and enforced mode rewrite it
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(6);
    for _ in 0..32 {
        let mut decoyed = doc.clone();
        let list = decoyed["sops"]["kms"].as_array_mut().expect("kms");
        let decoys = rand::Rng::random_range(&mut rng, 1..4);
        for _ in 0..decoys {
            let mut e = list[rand::Rng::random_range(&mut rng, 0..2)].clone();
            e["context"]["decoy"] = "another state".into();
            let at = rand::Rng::random_range(&mut rng, 0..=list.len());
            list.insert(at, e);
        }
        let env = Envelope::new(env.keys().same_keys(), vec!["k1".into(), "k2".into()], None);
        let opened = env
            .open(
                &serde_json::to_vec(&decoyed).expect("json"),
                Some(&context("a.tfstate")),
            )
            .await
            .expect("the real entries open it");
        assert_eq!(opened.refused, decoys, "{decoyed}");
        assert_eq!(
            env.protection(&opened).await.expect("resolves"),
            Protection::Partly,
            "an entry with another context: never current"
        );
    }
    // AND the protection of a state read break-glass under a key the deployment lacks is none
    let opened = Opened2::from(opened);
    assert_eq!(
        foreign.protection(&opened.0).await.expect("resolves"),
        Protection::Unprotected
    );
}

struct Opened2(gitstate_sops::Opened);
impl From<gitstate_sops::Opened> for Opened2 {
    fn from(o: gitstate_sops::Opened) -> Self {
        Self(o)
    }
}

#[tokio::test]
async fn tampered_data_mac_enc_and_context_are_refused() {
    let env = envelope(&["k1"]);
    let ctx = context("a.tfstate");
    let sealed = String::from_utf8(
        env.seal(b"{\"serial\":1,\"secret\":\"hunter2\"}", &ctx)
            .await
            .expect("seals"),
    )
    .expect("utf-8");
    let doc: serde_json::Value = serde_json::from_str(&sealed).expect("json");
    let flip = |s: &str| -> String {
        // change one base64 character inside the data: part
        let start = s.find("data:").expect("data") + 5;
        let mut chars: Vec<char> = s.chars().collect();
        chars[start] = if chars[start] == 'A' { 'B' } else { 'A' };
        chars.into_iter().collect()
    };
    let with = |path: &[&str], value: serde_json::Value| -> Vec<u8> {
        let mut d = doc.clone();
        let mut at = &mut d;
        for p in path {
            at = match p.parse::<usize>() {
                Ok(i) => &mut at[i],
                Err(_) => &mut at[*p],
            };
        }
        *at = value;
        serde_json::to_vec(&d).expect("json")
    };
    let data = with(&["data"], flip(doc["data"].as_str().expect("data")).into());
    assert!(matches!(
        env.open(&data, Some(&ctx)).await,
        Err(Error::Tampered { .. })
    ));
    let mac = with(
        &["sops", "mac"],
        flip(doc["sops"]["mac"].as_str().expect("mac")).into(),
    );
    assert!(matches!(
        env.open(&mac, Some(&ctx)).await,
        Err(Error::MacMismatch)
    ));
    let enc = with(
        &["sops", "kms", "0", "enc"],
        base64::engine::general_purpose::STANDARD
            .encode("forged")
            .into(),
    );
    assert!(matches!(
        env.open(&enc, Some(&ctx)).await,
        Err(Error::NoKey { .. })
    ));
    // copied to another state: refused before asking the key service
    assert!(matches!(
        env.open(sealed.as_bytes(), Some(&context("b.tfstate")))
            .await,
        Err(Error::ContextMismatch { .. })
    ));
    // ... and with the context rewritten to match, the key service refuses
    let moved = with(
        &["sops", "kms", "0", "context", "gitstate:state"],
        "b.tfstate".into(),
    );
    assert!(matches!(
        env.open(&moved, Some(&context("b.tfstate"))).await,
        Err(Error::NoKey { .. })
    ));
}

#[tokio::test]
async fn tree_mode_written_and_read_back() {
    let env = envelope(&["k1"]);
    let plaintext = vector("tfstate-nonull.plain.json");
    let seal = Seal {
        keys: env.keys(),
        key_ids: &["k1".to_owned()],
        offline: &[],
        threshold: None,
        context: &context("t.tfstate"),
        now: UNIX_EPOCH + Duration::from_secs(1_767_323_045),
    };
    let tree = seal.tree(&plaintext).await.expect("tree mode");
    let opened = env.open(&tree, None).await.expect("opens");
    assert_eq!(opened.format, Format::SopsTree);
    let got: serde_json::Value = serde_json::from_slice(&opened.plaintext).expect("json");
    let want: serde_json::Value = serde_json::from_slice(&plaintext).expect("json");
    assert_eq!(got, want);
    assert_eq!(
        env.protection(&opened).await.expect("resolves"),
        Protection::Partly
    );
}

#[tokio::test]
async fn plain_json_passes_and_garbage_is_refused() {
    let env = envelope(&["k1"]);
    let opened = env.open(b"{\"version\":4}", None).await.expect("plain");
    assert_eq!(opened.format, Format::Plain);
    assert_eq!(
        env.protection(&opened).await.expect("ok"),
        Protection::Unprotected
    );
    assert!(env.open(b"not json, too short", None).await.is_err());
    assert!(env.keys().calls().is_empty());
}

/// A JSON state of a random shape: nested objects and arrays of random depth and width, strings
/// with escapes and non-ASCII text, numbers, literals; from a few bytes to a few hundred KB.
fn random_state(rng: &mut rand::rngs::StdRng) -> Vec<u8> {
    use rand::Rng;
    fn value(rng: &mut rand::rngs::StdRng, depth: usize) -> serde_json::Value {
        let pick = if depth == 0 {
            rng.random_range(0..4)
        } else {
            rng.random_range(0..6)
        };
        match pick {
            0 => serde_json::Value::Null,
            1 => rng.random::<bool>().into(),
            2 => rng.random_range(-1_000_000_000_i64..1_000_000_000).into(),
            3 => {
                const CHARS: &[char] = &[
                    'a', 'f', '0', '9', '-', '/', ':', '"', '\\', '\n', '\t', ' ', 'é', '€', '😀',
                ];
                (0..rng.random_range(0..60))
                    .map(|_| CHARS[rng.random_range(0..CHARS.len())])
                    .collect::<String>()
                    .into()
            }
            4 => (0..rng.random_range(0..8))
                .map(|_| value(rng, depth - 1))
                .collect::<Vec<_>>()
                .into(),
            _ => (0..rng.random_range(0..8))
                .map(|i| {
                    (
                        format!("k{i}_{}", rng.random_range(0..100)),
                        value(rng, depth - 1),
                    )
                })
                .collect::<serde_json::Map<_, _>>()
                .into(),
        }
    }
    let resources: Vec<_> = (0..rng.random_range(0..300))
        .map(|_| value(rng, 4))
        .collect();
    let state = serde_json::json!({"version": 4, "serial": rng.random_range(0..1000), "resources": resources});
    if rng.random::<bool>() {
        serde_json::to_vec_pretty(&state).expect("json")
    } else {
        serde_json::to_vec(&state).expect("json")
    }
}

#[tokio::test]
async fn compressed_states_round_trip_through_binary_mode() {
    use gitstate_sops::compression::{GZIP_MAGIC, compress, decompress};
    use rand::{Rng, SeedableRng};
    let env = envelope(&["k1"]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    for round in 0..40 {
        // GIVEN a generated state (and, every fourth round, arbitrary bytes: the payload is
        // binary either way)
        let state = if round % 4 == 3 {
            (0..rng.random_range(0..5000))
                .map(|_| rng.random::<u8>())
                .collect()
        } else {
            random_state(&mut rng)
        };
        // WHEN compressed and sealed
        let payload = compress(&state).expect("compresses");
        assert!(payload.starts_with(&GZIP_MAGIC));
        let sealed = env
            .seal(&payload, &context("a.tfstate"))
            .await
            .expect("seals");
        // THEN the file is a sops binary-mode text file
        let doc: serde_json::Value = serde_json::from_slice(&sealed).expect("json");
        assert!(
            doc["data"]
                .as_str()
                .expect("data")
                .starts_with("ENC[AES256_GCM,data:")
        );
        // AND it opens to the payload, MAC checked, which expands to exactly the state
        let opened = env
            .open(&sealed, Some(&context("a.tfstate")))
            .await
            .expect("opens");
        assert_eq!(opened.format, Format::SopsBinary);
        assert_eq!(opened.plaintext.as_slice(), payload.as_slice());
        let expanded = decompress(&opened.plaintext, state.len())
            .expect("expands")
            .expect("compressed");
        assert_eq!(expanded.as_slice(), state.as_slice(), "round {round}");
        // AND one byte less than the state's size is over the limit
        if !state.is_empty() {
            assert!(matches!(
                decompress(&opened.plaintext, state.len() - 1),
                Err(Error::TooLarge { .. })
            ));
        }
        // AND a payload that is not compressed (a file sealed before compression) is left alone
        if !state.starts_with(&GZIP_MAGIC) {
            assert!(decompress(&state, 0).expect("passes").is_none());
        }
    }
}

#[test]
fn damaged_gzip_streams_are_refused_never_returned() {
    use gitstate_sops::compression::{compress, decompress};
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(1515);
    let state = random_state(&mut rng);
    let good = compress(&state).expect("compresses");
    let limit = 1 << 24;
    let refused = |payload: &[u8]| match decompress(payload, limit) {
        Err(Error::Compression(reason)) => assert!(!reason.contains('\n'), "{reason}"),
        other => panic!(
            "expected a refusal, got {:?}",
            other.map(|o| o.map(|s| s.len()))
        ),
    };
    // every truncation of the stream (past its magic)
    for cut in 2..good.len() {
        refused(&good[..cut]);
    }
    // every single-bit flip of the 8-byte trailer (CRC-32, length)
    for at in good.len() - 8..good.len() {
        for bit in 0..8 {
            let mut bad = good.clone();
            bad[at] ^= 1 << bit;
            refused(&bad);
        }
    }
    // random garbage after the magic, and bytes following a complete stream
    for _ in 0..200 {
        let mut bad = vec![0x1f, 0x8b];
        bad.extend((0..rng.random_range(0..300)).map(|_| rng.random::<u8>()));
        assert!(decompress(&bad, limit).is_err());
    }
    let mut trailing = good.clone();
    trailing.extend_from_slice(b"{}");
    refused(&trailing);
    // a bomb: 64 MiB of zeros in about 64 KB stops at the limit
    let bomb = compress(&vec![0u8; 64 << 20]).expect("compresses");
    assert!(bomb.len() < 100_000);
    assert!(matches!(
        decompress(&bomb, 6 << 20),
        Err(Error::TooLarge { limit }) if limit == 6 << 20
    ));
}
