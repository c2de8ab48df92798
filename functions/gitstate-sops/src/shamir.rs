//! Shamir's secret sharing as sops does it for key groups: each byte of the secret is the
//! constant term of its own random polynomial over GF(2^8) (the AES field, x^8+x^4+x^3+x+1) of
//! degree `threshold - 1`; share `i` (0-based) holds every polynomial's value at x = i + 1, then
//! that x as its last byte. A share is one byte longer than the secret.

use rand::RngCore;
use zeroize::Zeroizing;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShamirError {
    #[error("a threshold of {threshold} over {parts} parts (need 2 ≤ threshold ≤ parts ≤ 255)")]
    Shape { parts: usize, threshold: usize },
    #[error("shares must be at least 2, of one length of at least 2 bytes, with distinct x")]
    Shares,
}

/// Product in GF(2^8) modulo x^8+x^4+x^3+x+1.
fn mul(mut a: u8, mut b: u8) -> u8 {
    let mut product = 0;
    while b != 0 {
        if b & 1 != 0 {
            product ^= a;
        }
        let carry = a & 0x80 != 0;
        a <<= 1;
        if carry {
            a ^= 0x1b;
        }
        b >>= 1;
    }
    product
}

/// Inverse of a non-zero element: a^254.
fn inverse(a: u8) -> u8 {
    let mut result = 1;
    let mut power = a;
    let mut exponent = 254u8;
    while exponent != 0 {
        if exponent & 1 != 0 {
            result = mul(result, power);
        }
        power = mul(power, power);
        exponent >>= 1;
    }
    result
}

/// Split `secret` into `parts` shares of which any `threshold` give it back.
pub fn split(
    secret: &[u8],
    parts: usize,
    threshold: usize,
    rng: &mut dyn RngCore,
) -> Result<Vec<Zeroizing<Vec<u8>>>, ShamirError> {
    if threshold < 2 || parts < threshold || parts > 255 || secret.is_empty() {
        return Err(ShamirError::Shape { parts, threshold });
    }
    let mut shares: Vec<Zeroizing<Vec<u8>>> = (0..parts)
        .map(|i| {
            let mut share = Zeroizing::new(vec![0; secret.len() + 1]);
            share[secret.len()] = (i + 1) as u8;
            share
        })
        .collect();
    let mut coefficients = Zeroizing::new(vec![0u8; threshold]);
    for (at, byte) in secret.iter().enumerate() {
        coefficients[0] = *byte;
        rng.fill_bytes(&mut coefficients[1..]);
        for share in shares.iter_mut() {
            let x = share[secret.len()];
            // Horner, from the highest coefficient down
            let y = coefficients
                .iter()
                .rev()
                .fold(0u8, |acc, c| mul(acc, x) ^ c);
            share[at] = y;
        }
    }
    Ok(shares)
}

/// The secret behind `shares` (Lagrange interpolation at x = 0). Fewer shares than the
/// threshold give a wrong secret, not an error: the caller's MAC check catches it.
pub fn combine(shares: &[&[u8]]) -> Result<Zeroizing<Vec<u8>>, ShamirError> {
    let Some(first) = shares.first() else {
        return Err(ShamirError::Shares);
    };
    let len = first.len();
    if shares.len() < 2 || len < 2 || shares.iter().any(|s| s.len() != len) {
        return Err(ShamirError::Shares);
    }
    let xs: Vec<u8> = shares.iter().map(|s| s[len - 1]).collect();
    for (i, x) in xs.iter().enumerate() {
        if *x == 0 || xs[..i].contains(x) {
            return Err(ShamirError::Shares);
        }
    }
    // the Lagrange basis at 0 of each share, shared by every byte
    let basis: Vec<u8> = (0..xs.len())
        .map(|i| {
            (0..xs.len())
                .filter(|j| *j != i)
                .fold(1u8, |acc, j| mul(acc, mul(xs[j], inverse(xs[i] ^ xs[j]))))
        })
        .collect();
    let mut secret = Zeroizing::new(vec![0u8; len - 1]);
    for (at, byte) in secret.iter_mut().enumerate() {
        *byte = shares
            .iter()
            .zip(&basis)
            .fold(0u8, |acc, (share, b)| acc ^ mul(share[at], *b));
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn field_inverse_holds_for_every_element() {
        for a in 1..=255u8 {
            assert_eq!(mul(a, inverse(a)), 1, "{a}");
        }
        // the AES field's known product
        assert_eq!(mul(0x57, 0x83), 0xc1);
    }

    /// Generated secrets, part counts and thresholds: every subset of at least `threshold`
    /// shares gives the secret back; one share fewer gives something else (checked where the
    /// secret is long enough that a chance match is impossible).
    #[test]
    fn any_threshold_subset_combines() {
        let mut rng = StdRng::seed_from_u64(0x5ba3_1e55);
        for _ in 0..300 {
            let parts = rng.random_range(2..7);
            let threshold = rng.random_range(2..=parts);
            let len = rng.random_range(1..40);
            let secret: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            let shares = split(&secret, parts, threshold, &mut rng).expect("splits");
            assert!(shares.iter().all(|s| s.len() == len + 1));
            let mut order: Vec<usize> = (0..parts).collect();
            for _ in 0..4 {
                for i in (1..order.len()).rev() {
                    order.swap(i, rng.random_range(0..=i));
                }
                let take = rng.random_range(threshold..=parts);
                let picked: Vec<&[u8]> = order[..take].iter().map(|i| &shares[*i][..]).collect();
                assert_eq!(combine(&picked).expect("combines").as_slice(), secret);
                if threshold > 2 && len >= 16 {
                    let fewer: Vec<&[u8]> = picked[..threshold - 1].to_vec();
                    assert_ne!(combine(&fewer).expect("combines").as_slice(), secret);
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_refused() {
        let mut rng = StdRng::seed_from_u64(1);
        for (parts, threshold) in [(3, 1), (2, 3), (256, 2), (1, 1)] {
            assert!(split(b"k", parts, threshold, &mut rng).is_err());
        }
        assert!(split(b"", 2, 2, &mut rng).is_err());
        let a = [1u8, 1];
        let b = [2u8, 1];
        assert!(combine(&[&a]).is_err());
        assert!(combine(&[&a, &b]).is_err(), "same x twice");
        assert!(combine(&[&a, &[1u8, 0]]).is_err(), "x = 0");
        assert!(combine(&[&a, &[1u8, 2, 3]]).is_err(), "lengths differ");
    }
}
