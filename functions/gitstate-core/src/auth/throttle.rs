//! The login throttle. Failures count against what a client controls: its address (IPv6 by its
//! /64) and the pair of the user name it tried with that address; never against a user name
//! alone, so nobody can lock a user out from somewhere else. Past a budget, a key is refused for
//! a while that doubles with every further failure.
//!
//! Each table holds a bounded number of keys. When one is full, the keys with the fewest
//! failures (the oldest among equals) are forgotten to make room: a key the table does not hold
//! is never refused, so filling the table harms no one but the keys that filled it.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Failures of one user name from one address before the pair is refused.
pub const FREE_PAIR_FAILURES: u32 = 5;
/// Failures from one address (every user name, malformed headers included) before it is
/// refused: more, since several users (a CI fleet behind one NAT) may share an address.
pub const FREE_ADDRESS_FAILURES: u32 = 20;
/// How long a key is refused after its first failure over the budget; doubling with every
/// further failure up to the key's maximum.
pub(super) const FIRST_BLOCK: Duration = Duration::from_secs(1);
/// The longest refusal of a (user name, address) pair: only that name from that address waits.
pub const MAX_PAIR_BLOCK: Duration = Duration::from_secs(15 * 60);
/// The longest refusal of an address: shorter, since an address may be a NAT shared by many.
pub const MAX_ADDRESS_BLOCK: Duration = Duration::from_secs(60);
/// A failure count is forgotten after this long without a new failure.
pub const FORGET_AFTER: Duration = Duration::from_secs(60 * 60);
/// Keys each table holds (about 2.5 MB each when full).
pub const MAX_TRACKED: usize = 65_536;

/// Whole seconds for a `Retry-After` header: rounded up, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

/// The throttle key of a client address: IPv6 by its /64 (one host holds a whole /64), IPv4 and
/// IPv4-mapped IPv6 by the address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressKey {
    V4(u32),
    V6Prefix(u64),
}

impl AddressKey {
    pub fn of(ip: IpAddr) -> Self {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Self::V4(u32::from(v4)),
            IpAddr::V6(v6) => Self::V6Prefix((u128::from(v6) >> 64) as u64),
        }
    }

    /// Bytes that tell keys apart, for keyed hashes.
    pub(super) fn bytes(self) -> [u8; 9] {
        let mut out = [0u8; 9];
        match self {
            Self::V4(v4) => {
                out[0] = 4;
                out[1..5].copy_from_slice(&v4.to_be_bytes());
            }
            Self::V6Prefix(prefix) => {
                out[0] = 6;
                out[1..].copy_from_slice(&prefix.to_be_bytes());
            }
        }
        out
    }
}

/// A keyed hash of a user name and an address key: fixed size whatever name a client sends.
pub(super) type PairKey = [u8; 16];

#[derive(Debug, Clone, Copy)]
struct Entry {
    failures: u32,
    last: Instant,
}

/// Failure counts of one kind of key, with that kind's budget.
pub(super) struct Table<K> {
    entries: HashMap<K, Entry>,
    capacity: usize,
    free: u32,
    max_block: Duration,
}

impl<K: Hash + Eq + Clone> Table<K> {
    pub(super) fn new(capacity: usize, free: u32, max_block: Duration) -> Self {
        Self {
            entries: HashMap::new(),
            capacity: capacity.max(8),
            free,
            max_block,
        }
    }

    /// How much longer `key` is refused at `now` (`None`: not refused). With `free` failures
    /// it is refused for [`FIRST_BLOCK`] after the last, twice that after one more, and so on.
    fn blocked(&mut self, key: &K, now: Instant) -> Option<Duration> {
        let entry = *self.entries.get(key)?;
        let quiet = now.saturating_duration_since(entry.last);
        if quiet > FORGET_AFTER {
            self.entries.remove(key);
            return None;
        }
        let over = entry.failures.checked_sub(self.free)?;
        let block = FIRST_BLOCK
            .saturating_mul(1u32 << over.min(20))
            .min(self.max_block);
        block.checked_sub(quiet).filter(|d| !d.is_zero())
    }

    fn failed(&mut self, key: K, now: Instant) {
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            self.make_room(now);
        }
        let entry = self.entries.entry(key).or_insert(Entry {
            failures: 0,
            last: now,
        });
        entry.failures = entry.failures.saturating_add(1);
        entry.last = now;
    }

    fn forget(&mut self, key: &K) {
        self.entries.remove(key);
    }

    /// Drop what is due; if the table is still full, forget the eighth with the fewest
    /// failures, the oldest first among equals.
    fn make_room(&mut self, now: Instant) {
        self.entries
            .retain(|_, e| now.saturating_duration_since(e.last) <= FORGET_AFTER);
        if self.entries.len() < self.capacity {
            return;
        }
        let mut ranked: Vec<(u32, Instant, K)> = self
            .entries
            .iter()
            .map(|(key, e)| (e.failures, e.last, key.clone()))
            .collect();
        let evict = (self.capacity / 8).max(1);
        ranked.select_nth_unstable_by_key(evict - 1, |(failures, last, _)| (*failures, *last));
        for (_, _, key) in ranked.into_iter().take(evict) {
            self.entries.remove(&key);
        }
        tracing::warn!(
            tracked = self.entries.len(),
            forgotten = evict,
            "login throttle table full: forgot the keys with the fewest failures"
        );
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Both tables.
pub(super) struct Throttle {
    pub(super) addresses: Table<AddressKey>,
    pub(super) pairs: Table<PairKey>,
}

impl Default for Throttle {
    fn default() -> Self {
        Self::with_capacity(MAX_TRACKED)
    }
}

impl Throttle {
    pub(super) fn with_capacity(capacity: usize) -> Self {
        Self {
            addresses: Table::new(capacity, FREE_ADDRESS_FAILURES, MAX_ADDRESS_BLOCK),
            pairs: Table::new(capacity, FREE_PAIR_FAILURES, MAX_PAIR_BLOCK),
        }
    }

    /// How much longer the worse of the address and the pair is refused (`None`: neither is).
    pub(super) fn blocked(
        &mut self,
        address: Option<AddressKey>,
        pair: Option<&PairKey>,
    ) -> Option<Duration> {
        let now = Instant::now();
        let address = address.and_then(|a| self.addresses.blocked(&a, now));
        let pair = pair.and_then(|p| self.pairs.blocked(p, now));
        address.max(pair)
    }

    pub(super) fn failed(&mut self, address: Option<AddressKey>, pair: Option<PairKey>) {
        let now = Instant::now();
        if let Some(address) = address {
            self.addresses.failed(address, now);
        }
        if let Some(pair) = pair {
            self.pairs.failed(pair, now);
        }
    }

    /// A success clears the pair (a user who mistyped from this address), not the address.
    pub(super) fn succeeded(&mut self, pair: &PairKey) {
        self.pairs.forget(pair);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn failures_over_the_budget_block_for_a_doubling_while() {
        let mut throttle = Throttle::default();
        let pair = [7u8; 16];
        for _ in 0..FREE_PAIR_FAILURES {
            assert_eq!(throttle.blocked(None, Some(&pair)), None);
            throttle.failed(None, Some(pair));
        }
        let first = throttle.blocked(None, Some(&pair)).expect("blocked");
        assert!(first <= FIRST_BLOCK && first > FIRST_BLOCK / 2, "{first:?}");
        throttle.failed(None, Some(pair));
        assert!(throttle.blocked(None, Some(&pair)).expect("blocked") > FIRST_BLOCK);
        for _ in 0..40 {
            throttle.failed(None, Some(pair));
        }
        let longest = throttle.blocked(None, Some(&pair)).expect("blocked");
        assert!(longest <= MAX_PAIR_BLOCK && longest > MAX_ADDRESS_BLOCK);
        throttle.succeeded(&pair);
        assert_eq!(throttle.blocked(None, Some(&pair)), None);
        // An address has a larger budget and a shorter longest block.
        let address = AddressKey::of(IpAddr::from([127, 0, 0, 1]));
        for _ in 0..FREE_ADDRESS_FAILURES {
            assert_eq!(throttle.blocked(Some(address), None), None);
            throttle.failed(Some(address), None);
        }
        assert!(throttle.blocked(Some(address), None).is_some());
        for _ in 0..40 {
            throttle.failed(Some(address), None);
        }
        assert!(throttle.blocked(Some(address), None).expect("blocked") <= MAX_ADDRESS_BLOCK);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }

    #[test]
    fn ipv6_addresses_are_keyed_by_their_64_and_mapped_ipv4_by_the_address() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(64);
        let net: u128 = 0x2001_0db8_0001_0002 << 64;
        for _ in 0..200 {
            let a = net | u128::from(rng.random::<u64>());
            let b = net | u128::from(rng.random::<u64>());
            let v6 = |x: u128| AddressKey::of(IpAddr::from(std::net::Ipv6Addr::from(x)));
            assert_eq!(v6(a), v6(b));
            let other = a ^ (1 << (64 + rng.random_range(0..64)));
            assert_ne!(v6(a), v6(other));
            let v4 = std::net::Ipv4Addr::from(rng.random::<u32>());
            assert_eq!(
                AddressKey::of(IpAddr::from(v4)),
                AddressKey::of(IpAddr::from(v4.to_ipv6_mapped()))
            );
            assert_ne!(AddressKey::of(IpAddr::from(v4)).bytes(), v6(a).bytes());
        }
    }

    /// Generated runs of failures, successes and checks over a small set of keys, against a
    /// model that forgets nothing: the table never exceeds its capacity; a key that never failed
    /// (or whose failures the table forgot) is never refused; a key is refused only when the
    /// model says its failures are over the budget; while the table never had to forget, it
    /// refuses exactly what the model does; and what it forgets to make room has no more
    /// failures than what it keeps.
    #[test]
    fn generated_runs_stay_bounded_and_never_refuse_clean_keys() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x7ab1e);
        for run in 0..300 {
            let capacity: usize = rng.random_range(8..40);
            let keys: u32 = rng.random_range(4..(capacity as u32 * 3));
            let mut table: Table<u32> = Table::new(capacity, 3, Duration::from_secs(60));
            let mut model: HashMap<u32, u32> = HashMap::new();
            let start = Instant::now();
            let mut evicted_any = false;
            for step in 0..400u64 {
                let now = start + Duration::from_millis(step);
                let key = rng.random_range(0..keys);
                match rng.random_range(0..10) {
                    0 => {
                        table.forget(&key);
                        model.remove(&key);
                    }
                    1..=5 => {
                        let before: Vec<(u32, u32)> = table
                            .entries
                            .iter()
                            .map(|(k, e)| (*k, e.failures))
                            .collect();
                        table.failed(key, now);
                        *model.entry(key).or_default() += 1;
                        let gone: Vec<(u32, u32)> = before
                            .iter()
                            .filter(|(k, _)| !table.entries.contains_key(k))
                            .copied()
                            .collect();
                        if !gone.is_empty() {
                            evicted_any = true;
                            let most_forgotten = gone.iter().map(|(_, n)| *n).max();
                            let least_kept = before
                                .iter()
                                .filter(|(k, _)| table.entries.contains_key(k) && *k != key)
                                .map(|(_, n)| *n)
                                .min();
                            if let (Some(f), Some(k)) = (most_forgotten, least_kept) {
                                assert!(
                                    f <= k,
                                    "run {run}: forgot a key with {f} failures, kept one with {k}"
                                );
                            }
                            for (k, _) in gone {
                                model.remove(&k);
                            }
                        }
                    }
                    _ => {
                        let refused = table.blocked(&key, now).is_some();
                        let failures = model.get(&key).copied().unwrap_or(0);
                        if failures == 0 {
                            assert!(!refused, "run {run}: a clean key was refused");
                        }
                        if refused {
                            assert!(failures >= 3, "run {run}: refused within its budget");
                        }
                        // Every step is 1 ms apart: any key over the budget is still blocked.
                        if !evicted_any {
                            assert_eq!(refused, failures >= 3, "run {run} step {step}");
                        }
                    }
                }
                assert!(table.len() <= capacity);
            }
        }
    }

    /// Failures are forgotten after a quiet hour, and a block ends when its time is up.
    #[test]
    fn blocks_end_and_counts_are_forgotten() {
        let mut table: Table<u8> = Table::new(8, 2, Duration::from_secs(60));
        let start = Instant::now();
        for _ in 0..2 {
            table.failed(1, start);
        }
        assert!(table.blocked(&1, start).is_some());
        assert_eq!(table.blocked(&1, start + FIRST_BLOCK), None);
        table.failed(1, start + FIRST_BLOCK);
        assert!(table.blocked(&1, start + FIRST_BLOCK).expect("blocked") > FIRST_BLOCK);
        assert_eq!(table.blocked(&1, start + FORGET_AFTER * 2), None);
        assert_eq!(table.len(), 0, "forgotten");
    }
}
