//! The verified-credential cache: a credential argon2 accepted is remembered by a keyed hash of
//! user and secret (never the secret), so a warm process pays argon2 once per credential.

use std::collections::HashSet;

use hmac::{Hmac, Mac};
use sha2::Sha256;

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

    pub(super) fn of(&self, user: &str, secret: &Secret) -> Fingerprint {
        // HMAC accepts keys of any length; this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        // The user's length first: no two (user, secret) pairs hash the same bytes.
        mac.update(&(user.len() as u64).to_be_bytes());
        mac.update(user.as_bytes());
        mac.update(secret.expose().as_bytes());
        mac.finalize().into_bytes().into()
    }
}

/// The credentials verified under one policy (a new policy starts a new set).
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

    /// Generated pairs over an alphabet with the separator-like bytes: equal pairs hash equal,
    /// different pairs (also those whose concatenations are equal) differ, and another process
    /// (key) hashes differently.
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
            let (user, secret) = (word(&mut rng), word(&mut rng));
            let fingerprint = one.of(&user, &Secret::new(secret.clone()));
            assert_eq!(fingerprint, one.of(&user, &Secret::new(secret.clone())));
            assert_ne!(fingerprint, other.of(&user, &Secret::new(secret.clone())));
            let pair = seen
                .entry(fingerprint)
                .or_insert((user.clone(), secret.clone()));
            assert_eq!(*pair, (user, secret));
        }
        assert_ne!(
            one.of("a\0b", &Secret::new("c".into())),
            one.of("a", &Secret::new("b\0c".into()))
        );
    }

    #[test]
    fn the_cache_is_bounded() {
        let mut verified = Verified::default();
        let keys = Fingerprints::new();
        for i in 0..(MAX_VERIFIED + 10) {
            verified.remember(keys.of(&i.to_string(), &Secret::new("s".into())));
            assert!(verified.fingerprints.len() <= MAX_VERIFIED);
        }
        let last = keys.of(&(MAX_VERIFIED + 9).to_string(), &Secret::new("s".into()));
        assert!(verified.contains(&last));
    }
}
