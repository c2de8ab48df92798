//! One sops value: `ENC[AES256_GCM,data:…,iv:…,tag:…,type:…]`, AES-256-GCM with a 32-byte IV and
//! the value's path (or, for the MAC, `lastmodified`) as additional authenticated data.

use aes_gcm::aead::consts::U32;
use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::aes::Aes256;
use aes_gcm::{AesGcm, Nonce};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use zeroize::Zeroizing;

use crate::{DataKey, Error};

type Cipher = AesGcm<Aes256, U32>;

const TAG_LEN: usize = 16;
const IV_LEN: usize = 32;

/// An encrypted value taken apart; `kind` is sops's `type` (`str`, `int`, `float`, `bool`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    pub data: Vec<u8>,
    pub iv: Vec<u8>,
    pub tag: Vec<u8>,
    pub kind: String,
}

impl Sealed {
    /// Parse the `ENC[…]` form; `None` when `text` is not one.
    pub fn parse(text: &str) -> Option<Result<Self, Error>> {
        let body = text
            .strip_prefix("ENC[AES256_GCM,data:")?
            .strip_suffix(']')?;
        Some(Self::parse_body(body))
    }

    fn parse_body(body: &str) -> Result<Self, Error> {
        let malformed = || Error::Format("malformed ENC[…] value".into());
        let (data, rest) = body.split_once(",iv:").ok_or_else(malformed)?;
        let (iv, rest) = rest.split_once(",tag:").ok_or_else(malformed)?;
        let (tag, kind) = rest.split_once(",type:").ok_or_else(malformed)?;
        let decode = |s: &str| STANDARD.decode(s).map_err(|_| malformed());
        let sealed = Self {
            data: decode(data)?,
            iv: decode(iv)?,
            tag: decode(tag)?,
            kind: kind.to_owned(),
        };
        if sealed.data.is_empty() || sealed.iv.is_empty() || sealed.tag.len() != TAG_LEN {
            return Err(malformed());
        }
        Ok(sealed)
    }

    pub fn render(&self) -> String {
        format!(
            "ENC[AES256_GCM,data:{},iv:{},tag:{},type:{}]",
            STANDARD.encode(&self.data),
            STANDARD.encode(&self.iv),
            STANDARD.encode(&self.tag),
            self.kind
        )
    }
}

/// Encrypt `plaintext` (never empty: sops keeps empty strings as they are) under a fresh IV.
pub fn encrypt(key: &DataKey, plaintext: &[u8], aad: &[u8], kind: &str) -> Result<Sealed, Error> {
    let mut iv = [0u8; IV_LEN];
    rand::fill(&mut iv);
    encrypt_with_iv(key, &iv, plaintext, aad, kind)
}

/// Encrypt with a given IV (deterministic test vectors only; writers use [`encrypt`]).
pub fn encrypt_with_iv(
    key: &DataKey,
    iv: &[u8; IV_LEN],
    plaintext: &[u8],
    aad: &[u8],
    kind: &str,
) -> Result<Sealed, Error> {
    let cipher = Cipher::new_from_slice(key.as_slice()).map_err(|_| Error::Crypto)?;
    let mut data = cipher
        .encrypt(
            Nonce::<U32>::from_slice(iv),
            Payload {
                msg: plaintext,
                aad,
            },
        )
        .map_err(|_| Error::Crypto)?;
    let tag = data.split_off(data.len() - TAG_LEN);
    Ok(Sealed {
        data,
        iv: iv.to_vec(),
        tag,
        kind: kind.to_owned(),
    })
}

/// Decrypt and authenticate; any IV length is accepted, as sops does.
pub fn decrypt(key: &DataKey, sealed: &Sealed, aad: &[u8]) -> Result<Zeroizing<Vec<u8>>, Error> {
    let mut message = Vec::with_capacity(sealed.data.len() + TAG_LEN);
    message.extend_from_slice(&sealed.data);
    message.extend_from_slice(&sealed.tag);
    let payload = Payload { msg: &message, aad };
    // aes-gcm fixes the nonce length in the type: the two lengths sops files carry.
    let opened = match sealed.iv.len() {
        IV_LEN => Cipher::new_from_slice(key.as_slice())
            .map_err(|_| Error::Crypto)?
            .decrypt(Nonce::<U32>::from_slice(&sealed.iv), payload),
        12 => aes_gcm::Aes256Gcm::new_from_slice(key.as_slice())
            .map_err(|_| Error::Crypto)?
            .decrypt(aes_gcm::Nonce::from_slice(&sealed.iv), payload),
        other => {
            return Err(Error::Format(format!(
                "unsupported IV length {other} (32 or 12 bytes)"
            )));
        }
    };
    opened.map(Zeroizing::new).map_err(|_| Error::Tampered {
        what: String::from_utf8_lossy(aad).chars().take(120).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> DataKey {
        Zeroizing::new([byte; 32])
    }

    #[test]
    fn decrypts_the_sops_test_value() {
        // GIVEN sops's own aes/cipher_test.go vector (key 32 × 'f', path "bar:")
        let enc = "ENC[AES256_GCM,data:oYyi,iv:MyIDYbT718JRr11QtBkcj3Dwm4k1aCGZBVeZf0EyV8o=,tag:t5z2Z023Up0kxwCgw1gNxg==,type:str]";
        let sealed = Sealed::parse(enc).expect("ENC form").expect("well formed");
        // THEN it opens with its path and fails under another
        assert_eq!(
            decrypt(&key(b'f'), &sealed, b"bar:")
                .expect("opens")
                .as_slice(),
            b"foo"
        );
        assert!(matches!(
            decrypt(&key(b'f'), &sealed, b""),
            Err(Error::Tampered { .. })
        ));
    }

    #[test]
    fn round_trip_and_render() {
        let sealed = encrypt(&key(7), b"secret", b"a:b:", "str").expect("encrypts");
        let text = sealed.render();
        let parsed = Sealed::parse(&text)
            .expect("ENC form")
            .expect("well formed");
        assert_eq!(parsed, sealed);
        assert_eq!(
            decrypt(&key(7), &parsed, b"a:b:")
                .expect("opens")
                .as_slice(),
            b"secret"
        );
        assert!(decrypt(&key(8), &parsed, b"a:b:").is_err(), "wrong key");
    }

    #[test]
    fn rejects_malformed_values() {
        assert!(Sealed::parse("plain").is_none());
        for bad in [
            "ENC[AES256_GCM,data:,iv:AA==,tag:AAAAAAAAAAAAAAAAAAAAAA==,type:str]",
            "ENC[AES256_GCM,data:AA==,iv:AA==,type:str]",
            "ENC[AES256_GCM,data:!!,iv:AA==,tag:AAAAAAAAAAAAAAAAAAAAAA==,type:str]",
        ] {
            assert!(matches!(Sealed::parse(bad), Some(Err(_))), "{bad}");
        }
    }
}
