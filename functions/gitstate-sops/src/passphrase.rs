//! terraform-backend-git's `aes` mode: key = the 32 ASCII hex digits of md5(passphrase),
//! AES-256-GCM, stored as `nonce(12) ‖ ciphertext ‖ tag(16)`. Read-only migration path (the
//! writer exists for tests).

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce};
use md5::{Digest, Md5};
use zeroize::Zeroizing;

use crate::Error;

const NONCE_LEN: usize = 12;
const MIN_LEN: usize = NONCE_LEN + 16;

fn cipher(passphrase: &str) -> Result<Aes256Gcm, Error> {
    let digest = Md5::digest(passphrase.as_bytes());
    let hex: Zeroizing<String> =
        Zeroizing::new(digest.iter().map(|b| format!("{b:02x}")).collect());
    Aes256Gcm::new_from_slice(hex.as_bytes()).map_err(|_| Error::Crypto)
}

/// Whether `stored` has the `aes` mode's shape: nonce, ciphertext and tag, at least 28 random
/// bytes, which are valid UTF-8 about once in 2^28 files or less (a state, plaintext or sops,
/// always is).
pub fn looks_passphrase_sealed(stored: &[u8]) -> bool {
    stored.len() >= MIN_LEN && std::str::from_utf8(stored).is_err()
}

pub fn open_passphrase(passphrase: &str, stored: &[u8]) -> Result<Vec<u8>, Error> {
    if stored.len() < MIN_LEN {
        return Err(Error::Unrecognised(" (too short for the aes mode)"));
    }
    let (nonce, sealed) = stored.split_at(NONCE_LEN);
    cipher(passphrase)?
        .decrypt(Nonce::from_slice(nonce), sealed)
        .map_err(|_| Error::Tampered {
            what: "passphrase-encrypted state".into(),
        })
}

pub fn seal_passphrase(
    passphrase: &str,
    nonce: [u8; NONCE_LEN],
    plaintext: &[u8],
) -> Result<Vec<u8>, Error> {
    let mut out = nonce.to_vec();
    out.extend(
        cipher(passphrase)?
            .encrypt(Nonce::from_slice(&nonce), plaintext)
            .map_err(|_| Error::Crypto)?,
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Every file the `aes` mode writes has its shape, whatever the nonce and plaintext; no
    /// text (a plain state, or a sops file) has it.
    #[test]
    fn sealed_files_are_told_from_text_by_their_shape() {
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..500 {
            let len = rng.random_range(0..2000);
            let text: String = (0..len).map(|_| rng.random_range(' '..='~')).collect();
            assert!(!looks_passphrase_sealed(text.as_bytes()), "{text}");
            let sealed = seal_passphrase("p", rng.random(), text.as_bytes()).expect("seals");
            assert!(looks_passphrase_sealed(&sealed));
        }
    }

    #[test]
    fn round_trip_and_wrong_passphrase() {
        let sealed = seal_passphrase("p", [3; 12], b"{}").expect("seals");
        assert_eq!(open_passphrase("p", &sealed).expect("opens"), b"{}");
        assert!(open_passphrase("q", &sealed).is_err());
        assert!(open_passphrase("p", b"short").is_err());
    }
}
