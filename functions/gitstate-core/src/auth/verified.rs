//! The verified-credential cache: a credential argon2 accepted is remembered by a keyed hash of
//! user, secret and the stored hash it matched (never the secret), so a warm process pays argon2
//! once per credential, and a new policy that keeps the user's hash keeps it remembered while a
//! changed or removed hash drops it. The same key makes the throttle's (user, address) keys.

use std::collections::HashSet;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::throttle::{AddressKey, PairKey};
use crate::secret::Secret;

/// Most credentials remembered under one policy; the set starts afresh when full.
const MAX_VERIFIED: usize = 4_096;

/// A keyed hash of a user and a secret.
pub(super) type Fingerprint = [u8; 32];

/// Computes fingerprints under a key random per process.
pub(super) struct Fingerprints {
    key: [u8; 32],
}

impl Fingerprints {
    pub(super) fn new() -> Self {
        Self {
            key: rand::random(),
        }
    }

    fn mac(&self, domain: &[u8]) -> Hmac<Sha256> {
        // HMAC accepts keys of any length; this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        mac.update(domain);
        mac
    }

    /// The fingerprint of `secret` given for `user`, whose stored hash is `phc`.
    pub(super) fn of(&self, user: &str, secret: &Secret, phc: &str) -> Fingerprint {
        let mut mac = self.mac(b"credential\0");
        // Lengths first: no two (user, hash, secret) triples hash the same bytes.
        for part in [user, phc] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        mac.update(secret.expose().as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// The throttle key of `user` tried from `address` (`None`: an unknown address).
    pub(super) fn pair(&self, user: &str, address: Option<AddressKey>) -> PairKey {
        let mut mac = self.mac(b"pair\0");
        mac.update(&address.map_or([0u8; 9], AddressKey::bytes));
        mac.update(user.as_bytes());
        let full: [u8; 32] = mac.finalize().into_bytes().into();
        let mut key = [0u8; 16];
        key.copy_from_slice(&full[..16]);
        key
    }
}

/// The credentials verified (bounded: the set starts afresh when full).
#[derive(Default)]
pub(super) struct Verified {
    fingerprints: HashSet<Fingerprint>,
}

impl Verified {
    pub(super) fn contains(&self, fingerprint: &Fingerprint) -> bool {
        self.fingerprints.contains(fingerprint)
    }

    pub(super) fn remember(&mut self, fingerprint: Fingerprint) {
        if self.fingerprints.len() >= MAX_VERIFIED {
            self.fingerprints.clear();
        }
        self.fingerprints.insert(fingerprint);
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    /// Generated triples over an alphabet with the separator-like bytes: equal triples hash
    /// equal, different ones (also those whose concatenations are equal) differ, and another
    /// process (key) hashes differently.
    #[test]
    fn fingerprints_tell_pairs_apart() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0xf1);
        let word = |rng: &mut rand::rngs::StdRng| -> String {
            (0..rng.random_range(0..4))
                .map(|_| ['a', 'b', '\0', ':'][rng.random_range(0..4)])
                .collect()
        };
        let (one, other) = (Fingerprints::new(), Fingerprints::new());
        let mut seen = std::collections::HashMap::new();
        for _ in 0..2000 {
            let (user, secret, phc) = (word(&mut rng), word(&mut rng), word(&mut rng));
            let fingerprint = one.of(&user, &Secret::new(secret.clone()), &phc);
            assert_eq!(
                fingerprint,
                one.of(&user, &Secret::new(secret.clone()), &phc)
            );
            assert_ne!(
                fingerprint,
                other.of(&user, &Secret::new(secret.clone()), &phc)
            );
            let triple =
                seen.entry(fingerprint)
                    .or_insert((user.clone(), secret.clone(), phc.clone()));
            assert_eq!(*triple, (user, secret, phc));
        }
        assert_ne!(
            one.of("a\0b", &Secret::new("c".into()), "h"),
            one.of("a", &Secret::new("b\0c".into()), "h")
        );
        assert_ne!(
            one.of("a", &Secret::new("c".into()), "h1"),
            one.of("a", &Secret::new("c".into()), "h2")
        );
    }

    /// Generated (user, address) pairs: equal pairs key equal, a different user or address
    /// (IPv4 against IPv6 included) keys differently.
    #[test]
    fn pair_keys_tell_users_and_addresses_apart() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0xa1);
        let keys = Fingerprints::new();
        let mut seen = std::collections::HashMap::new();
        for _ in 0..3000 {
            let user = format!("u{}", rng.random_range(0..20));
            let address = match rng.random_range(0..3) {
                0 => None,
                1 => Some(AddressKey::V4(rng.random_range(0..20))),
                _ => Some(AddressKey::V6Prefix(rng.random_range(0..20))),
            };
            let key = keys.pair(&user, address);
            assert_eq!(key, keys.pair(&user, address));
            assert_eq!(
                *seen.entry(key).or_insert((user.clone(), address)),
                (user, address)
            );
        }
    }

    #[test]
    fn the_cache_is_bounded() {
        let mut verified = Verified::default();
        let keys = Fingerprints::new();
        for i in 0..(MAX_VERIFIED + 10) {
            verified.remember(keys.of(&i.to_string(), &Secret::new("s".into()), "h"));
            assert!(verified.fingerprints.len() <= MAX_VERIFIED);
        }
        let last = keys.of(
            &(MAX_VERIFIED + 9).to_string(),
            &Secret::new("s".into()),
            "h",
        );
        assert!(verified.contains(&last));
    }
}
