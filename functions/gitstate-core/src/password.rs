//! Secrets and their argon2id hashes: making tokens, hashing them, checking hashes.

use std::sync::Mutex;

use argon2::password_hash::{Output, PasswordHash, Salt, SaltString};
use argon2::{Algorithm, Argon2, Block, Params, PasswordHasher as _, Version};
use base64::Engine as _;

/// OWASP's minimum for argon2id: 19 MiB of memory, two passes, one lane.
pub const MIN_MEMORY_KIB: u32 = 19 * 1024;
pub const MIN_PASSES: u32 = 2;
/// The most a hash may ask for: 1 GiB of memory, ten passes, sixteen lanes. A hash above this
/// (`m=4194304`) would make every check, and the dummy check of unknown users, allocate gigabytes
/// and abort the process.
pub const MAX_MEMORY_KIB: u32 = 1024 * 1024;
pub const MAX_PASSES: u32 = 10;
pub const MAX_LANES: u32 = 16;

/// The memory (KiB) one argon2 check may take in a process that has `process_bytes`: half of it
/// (the rest is the process's own), never above [`MAX_MEMORY_KIB`] nor below [`MIN_MEMORY_KIB`]
/// (a process too small for OWASP's minimum still checks one hash at a time).
pub fn hash_memory_budget(process_bytes: u64) -> u32 {
    let half_kib = process_bytes / 2 / 1024;
    u32::try_from(half_kib)
        .unwrap_or(u32::MAX)
        .clamp(MIN_MEMORY_KIB, MAX_MEMORY_KIB)
}

/// The memory (KiB) a PHC hash asks for, when it is one.
pub fn memory_kib(phc: &str) -> Option<u32> {
    let hash = PasswordHash::new(phc).ok()?;
    Params::try_from(&hash).ok().map(|p| p.m_cost())
}

/// Checks a secret against a stored PHC hash. A trait so tests can count the calls to the real
/// verifier; production uses [`Argon2id`].
pub trait PasswordVerifier: Send + Sync + 'static {
    fn verify(&self, phc: &str, secret: &[u8]) -> bool;
}

/// argon2id verification with the parameters written in the hash itself.
#[derive(Debug, Default, Clone, Copy)]
pub struct Argon2id;

impl PasswordVerifier for Argon2id {
    /// As the argon2 crate's own `verify_password`, but in memory kept between checks
    /// ([`with_blocks`]); the outputs are compared in constant time (`Output`'s equality).
    fn verify(&self, phc: &str, secret: &[u8]) -> bool {
        let Ok(hash) = PasswordHash::new(phc) else {
            return false;
        };
        let (Some(salt), Some(expected)) = (hash.salt, hash.hash) else {
            return false;
        };
        let (Ok(algorithm), Ok(version), Ok(params)) = (
            Algorithm::try_from(hash.algorithm),
            hash.version
                .map(Version::try_from)
                .transpose()
                .map(Option::unwrap_or_default),
            Params::try_from(&hash),
        ) else {
            return false;
        };
        let mut salt_bytes = [0u8; Salt::MAX_LENGTH];
        let Ok(salt) = salt.decode_b64(&mut salt_bytes) else {
            return false;
        };
        let mut computed = vec![0u8; params.output_len().unwrap_or(Params::DEFAULT_OUTPUT_LEN)];
        let argon2 = Argon2::new(algorithm, version, params.clone());
        with_blocks(params.block_count(), |blocks| {
            argon2.hash_password_into_with_memory(secret, salt, &mut computed, blocks)
        })
        .is_ok()
            && Output::new(&computed).is_ok_and(|computed| computed == expected)
    }
}

/// argon2's working memory, kept between checks: one buffer per check running at the same time
/// (the hashing slots bound how many), each as large as the largest hash it served. Allocating
/// and freeing 19 MiB or more per check made the allocator keep every freed block resident
/// (glibc raises its mmap threshold to the size of a freed mapping), so a flood of checks grew
/// the process far past what the checks running at once need (BENCHMARKS.md, "Under attack").
/// argon2 overwrites every block in its first pass, so a buffer needs no clearing between uses.
static BLOCKS: Mutex<Vec<Vec<Block>>> = Mutex::new(Vec::new());

fn with_blocks<T>(count: usize, hash: impl FnOnce(&mut [Block]) -> T) -> T {
    let mut blocks = BLOCKS
        .lock()
        .ok()
        .and_then(|mut pool| pool.pop())
        .unwrap_or_default();
    if blocks.len() < count {
        blocks.resize(count, Block::default());
    }
    let out = hash(&mut blocks);
    if let Ok(mut pool) = BLOCKS.lock() {
        pool.push(blocks);
    }
    out
}

#[derive(Debug, thiserror::Error)]
pub enum HashError {
    #[error("not an argon2id PHC hash string (what `gitstate hash-password` prints)")]
    NotPhc,
    #[error("algorithm {0} is not argon2id")]
    Algorithm(String),
    #[error("argon2 version {0} is not 19 (0x13)")]
    Version(u32),
    #[error("parameters m={m},t={t} are weaker than the minimum m={MIN_MEMORY_KIB},t={MIN_PASSES}")]
    Weak { m: u32, t: u32 },
    #[error(
        "parameters m={m},t={t},p={p} exceed the maximum m={MAX_MEMORY_KIB},t={MAX_PASSES},p={MAX_LANES}"
    )]
    Costly { m: u32, t: u32, p: u32 },
    #[error(
        "m={m} KiB is more than one argon2 check may take in this process ({budget} KiB, half of \
         its memory: AWS_LAMBDA_FUNCTION_MEMORY_SIZE on Lambda)"
    )]
    Memory { m: u32, budget: u32 },
    #[error("hashing failed: {0}")]
    Hashing(String),
}

/// Whether a hash's parameters stay within the ceiling.
fn within_ceiling(params: &Params) -> bool {
    params.m_cost() <= MAX_MEMORY_KIB
        && params.t_cost() <= MAX_PASSES
        && params.p_cost() <= MAX_LANES
}

/// Accept only argon2id hashes at least as strong as OWASP's minimum and no costlier than the
/// ceiling.
pub fn check_phc(phc: &str) -> Result<(), HashError> {
    let hash = PasswordHash::new(phc).map_err(|_| HashError::NotPhc)?;
    if hash.algorithm.as_str() != "argon2id" {
        return Err(HashError::Algorithm(hash.algorithm.as_str().to_owned()));
    }
    if let Some(version) = hash.version.filter(|v| *v != 0x13) {
        return Err(HashError::Version(version));
    }
    let params = Params::try_from(&hash).map_err(|_| HashError::NotPhc)?;
    let (m, t) = (params.m_cost(), params.t_cost());
    if m < MIN_MEMORY_KIB || t < MIN_PASSES {
        return Err(HashError::Weak { m, t });
    }
    if !within_ceiling(&params) {
        let p = params.p_cost();
        return Err(HashError::Costly { m, t, p });
    }
    if hash.hash.is_none() {
        return Err(HashError::NotPhc);
    }
    Ok(())
}

/// The component-wise strongest (memory KiB, passes, lanes) among `hashes`, never below the
/// minimum: a dummy hash with these costs at least as much to check as any of them. Hashes
/// above the ceiling ([`check_phc`] refuses them) are left out.
pub fn strongest_params<'a>(hashes: impl Iterator<Item = &'a str>) -> (u32, u32, u32) {
    hashes
        .filter_map(|phc| {
            let hash = PasswordHash::new(phc).ok()?;
            Params::try_from(&hash).ok().filter(within_ceiling)
        })
        .fold((MIN_MEMORY_KIB, MIN_PASSES, 1), |(m, t, p), params| {
            (
                m.max(params.m_cost()),
                t.max(params.t_cost()),
                p.max(params.p_cost()),
            )
        })
}

/// Hash a secret with argon2id at the minimum parameters and a fresh random salt.
pub fn hash_secret(secret: &[u8]) -> Result<String, HashError> {
    let params = Params::new(MIN_MEMORY_KIB, MIN_PASSES, 1, None)
        .map_err(|e| HashError::Hashing(e.to_string()))?;
    let hasher = Argon2::new(Algorithm::Argon2id, Version::V0x13, params);
    let salt_bytes: [u8; 16] = rand::random();
    let salt =
        SaltString::encode_b64(&salt_bytes).map_err(|e| HashError::Hashing(e.to_string()))?;
    hasher
        .hash_password(secret, &salt)
        .map(|hash| hash.to_string())
        .map_err(|e| HashError::Hashing(e.to_string()))
}

/// A fresh random token: 256 bits, URL-safe, with a prefix that secret scanners can match.
pub fn generate_token() -> String {
    let bytes: [u8; 32] = rand::random();
    format!(
        "gst_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Generated hashes over every parameter a PHC string can carry (algorithm, version, memory,
    /// passes, lanes, salt and output lengths), kept small to be quick: the verifier agrees with
    /// the argon2 crate's own `verify_password` on the right secret, a wrong one and a hash with
    /// one changed output byte, whatever buffer the previous check left.
    #[test]
    fn verification_agrees_with_the_argon2_crate_over_generated_hashes() {
        use argon2::password_hash::PasswordVerifier as _;
        use rand::{Rng as _, SeedableRng as _};
        let mut rng = rand::rngs::StdRng::seed_from_u64(24);
        for case in 0..150 {
            let algorithm = [Algorithm::Argon2id, Algorithm::Argon2i, Algorithm::Argon2d]
                [rng.random_range(0..3)];
            let version = [Version::V0x10, Version::V0x13][rng.random_range(0..2)];
            let lanes = rng.random_range(1..=4);
            let params = Params::new(
                rng.random_range(8 * lanes..=256),
                rng.random_range(1..=3),
                lanes,
                Some(rng.random_range(10..=64)),
            )
            .expect("params");
            let salt: Vec<u8> = (0..rng.random_range(8..=48))
                .map(|_| rng.random())
                .collect();
            let salt = SaltString::encode_b64(&salt).expect("salt");
            let secret: Vec<u8> = (0..rng.random_range(1..=40))
                .map(|_| rng.random())
                .collect();
            let phc = Argon2::new(algorithm, version, params)
                .hash_password(&secret, &salt)
                .expect("hash")
                .to_string();
            let mut wrong = secret.clone();
            wrong[rng.random_range(0..secret.len())] ^= 1 << rng.random_range(0..8);
            let mut tampered = phc.clone().into_bytes();
            let at = tampered.len() - 1 - rng.random_range(0..8);
            tampered[at] = if tampered[at] == b'A' { b'B' } else { b'A' };
            let tampered = String::from_utf8(tampered).expect("ascii");
            for (phc, secret) in [(&phc, &secret), (&phc, &wrong), (&tampered, &secret)] {
                let oracle = PasswordHash::new(phc)
                    .is_ok_and(|h| Argon2::default().verify_password(secret, &h).is_ok());
                assert_eq!(Argon2id.verify(phc, secret), oracle, "case {case}: {phc}");
            }
            assert!(Argon2id.verify(&phc, &secret), "case {case}: {phc}");
        }
    }

    #[test]
    fn hash_then_verify() {
        let token = generate_token();
        assert_eq!(token.len(), 4 + 43);
        let phc = hash_secret(token.as_bytes()).expect("hash");
        assert!(phc.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{phc}");
        check_phc(&phc).expect("strong enough");
        assert!(Argon2id.verify(&phc, token.as_bytes()));
        assert!(!Argon2id.verify(&phc, b"wrong"));
        assert!(!Argon2id.verify("not a hash", token.as_bytes()));
    }

    #[test]
    fn strongest_params_take_the_maximum_of_each() {
        let a = "$argon2id$v=19$m=65536,t=2,p=1$c29tZXNhbHQ$RdescudvJCsgt3ub+b+dWRWJTmaaJObG";
        let b = "$argon2id$v=19$m=19456,t=4,p=2$c29tZXNhbHQ$RdescudvJCsgt3ub+b+dWRWJTmaaJObG";
        assert_eq!(strongest_params([a, b].into_iter()), (65536, 4, 2));
        assert_eq!(
            strongest_params(std::iter::empty()),
            (MIN_MEMORY_KIB, MIN_PASSES, 1)
        );
        assert_eq!(
            strongest_params(["garbage"].into_iter()),
            (MIN_MEMORY_KIB, MIN_PASSES, 1)
        );
    }

    /// Every parameter at the ceiling is accepted, one above it is refused (alone or with the
    /// others at their extremes), and the dummy hash never takes a refused hash's costs.
    #[test]
    fn refuses_hashes_above_the_ceiling() {
        let phc = |m: u32, t: u32, p: u32| {
            format!("$argon2id$v=19$m={m},t={t},p={p}$c29tZXNhbHQ$RdescudvJCsgt3ub+b+dWRWJTmaaJObG")
        };
        let top = (MAX_MEMORY_KIB, MAX_PASSES, MAX_LANES);
        check_phc(&phc(top.0, top.1, top.2)).expect("the ceiling itself is fine");
        for (m, t, p) in [
            (MAX_MEMORY_KIB + 1, MIN_PASSES, 1),
            (4 * 1024 * 1024, MIN_PASSES, 1),
            (MIN_MEMORY_KIB, MAX_PASSES + 1, 1),
            (MIN_MEMORY_KIB, u32::MAX, 1),
            (MIN_MEMORY_KIB, MIN_PASSES, MAX_LANES + 1),
            (MAX_MEMORY_KIB + 1, MAX_PASSES + 1, MAX_LANES + 1),
        ] {
            let hash = phc(m, t, p);
            match check_phc(&hash) {
                Err(HashError::Costly { .. }) => {}
                // parameters argon2 itself refuses (e.g. too many passes) are not PHC at all
                Err(HashError::NotPhc) => {}
                other => panic!("{hash}: {other:?}"),
            }
            assert_eq!(
                strongest_params([hash.as_str()].into_iter()),
                (MIN_MEMORY_KIB, MIN_PASSES, 1),
                "{hash}"
            );
        }
        assert!(matches!(
            check_phc(&phc(4 * 1024 * 1024, 2, 1)),
            Err(HashError::Costly { m: 4194304, .. })
        ));
    }

    /// Generated process sizes: the budget is half the memory within [minimum, ceiling], and a
    /// hash over the budget is refused by the policy check while one within passes.
    #[test]
    fn the_memory_budget_is_half_the_process_within_bounds() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x3e3);
        for _ in 0..2000 {
            let bytes: u64 = match rng.random_range(0..3) {
                0 => rng.random_range(0..(64u64 << 20)),
                1 => rng.random_range(0..(8u64 << 30)),
                _ => rng.random(),
            };
            let budget = hash_memory_budget(bytes);
            assert!((MIN_MEMORY_KIB..=MAX_MEMORY_KIB).contains(&budget));
            let half = bytes / 2048;
            if (u64::from(MIN_MEMORY_KIB)..=u64::from(MAX_MEMORY_KIB)).contains(&half) {
                assert_eq!(u64::from(budget), half);
            }
        }
        // The Lambda default, 1,024 MB: 512 MiB a check.
        assert_eq!(hash_memory_budget(1024 << 20), 512 * 1024);
        let phc = |m: u32| {
            format!("$argon2id$v=19$m={m},t=2,p=1$c29tZXNhbHQ$RdescudvJCsgt3ub+b+dWRWJTmaaJObG")
        };
        assert_eq!(memory_kib(&phc(65536)), Some(65536));
        assert_eq!(memory_kib("garbage"), None);
    }

    #[test]
    fn refuses_weak_or_foreign_hashes() {
        let weak = "$argon2id$v=19$m=4096,t=3,p=1$c29tZXNhbHQ$RdescudvJCsgt3ub+b+dWRWJTmaaJObG";
        assert!(matches!(
            check_phc(weak),
            Err(HashError::Weak { m: 4096, t: 3 })
        ));
        let argon2i = "$argon2i$v=19$m=19456,t=2,p=1$c29tZXNhbHQ$RdescudvJCsgt3ub+b+dWRWJTmaaJObG";
        assert!(matches!(check_phc(argon2i), Err(HashError::Algorithm(_))));
        assert!(matches!(check_phc("plaintext"), Err(HashError::NotPhc)));
        assert!(matches!(
            check_phc("$2y$10$abcdefghijklmnopqrstuv"),
            Err(HashError::NotPhc | HashError::Algorithm(_))
        ));
    }
}
