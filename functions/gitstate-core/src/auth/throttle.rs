//! The login throttle: failures counted per user name and per client address; past a budget,
//! refused for a while that doubles with every failure.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Failures per user name that cost nothing extra.
pub const FREE_USER_FAILURES: u32 = 5;
/// Failures per client address that cost nothing extra: more, since several users (a CI fleet
/// behind one NAT) may share an address.
pub const FREE_ADDRESS_FAILURES: u32 = 20;
/// How long a user or address is refused after its first failure over the budget; doubling with
/// every further failure.
pub(super) const FIRST_BLOCK: Duration = Duration::from_secs(1);
pub(super) const MAX_BLOCK: Duration = Duration::from_secs(60);
/// A failure count is forgotten after this long without a new failure.
pub(super) const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
/// Bounds on what a process remembers, so a flood cannot grow memory without end.
pub(super) const MAX_TRACKED: usize = 10_000;

/// Whole seconds for a `Retry-After` header: rounded up, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

pub(super) struct Throttle {
    failures: HashMap<String, (u32, Instant)>,
    /// At most this many keys are tracked; when full, the least recent are evicted.
    capacity: usize,
    /// Set when an entry was evicted before it was forgotten: until then an untracked key may be
    /// one that lost its count, so it is refused (fail closed) instead of starting afresh.
    saturated_until: Option<Instant>,
}

impl Default for Throttle {
    fn default() -> Self {
        Self::with_capacity(MAX_TRACKED)
    }
}

/// The throttle key of a client address: IPv6 by its /64 (one host holds a whole /64), IPv4 and
/// IPv4-mapped IPv6 by the address.
pub(super) fn address_key(ip: IpAddr) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => format!("addr\0{v4}"),
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !u128::from(u64::MAX);
            format!("addr\0{}/64", std::net::Ipv6Addr::from(prefix))
        }
    }
}

impl Throttle {
    pub(super) fn with_capacity(capacity: usize) -> Self {
        Self {
            failures: HashMap::new(),
            capacity: capacity.max(8),
            saturated_until: None,
        }
    }

    fn count(&mut self, key: &str) -> Option<(u32, Instant)> {
        match self.failures.get(key) {
            Some((_, last)) if last.elapsed() > FORGET_AFTER => {
                self.failures.remove(key);
                None
            }
            Some(&(n, last)) => Some((n, last)),
            None => None,
        }
    }

    /// How much longer the worst of `keys` is refused (`None`: not refused). Keys are
    /// `user\0<name>` or `addr\0<ip>`; each has its own failure budget. While the table is
    /// saturated, a key it does not hold is refused.
    pub(super) fn blocked(&mut self, keys: &[String]) -> Option<Duration> {
        let saturated = self
            .saturated_until
            .and_then(|until| until.checked_duration_since(Instant::now()))
            .filter(|d| !d.is_zero());
        if saturated.is_none() {
            self.saturated_until = None;
        }
        keys.iter()
            .filter_map(|key| {
                let free = if key.starts_with("addr\0") {
                    FREE_ADDRESS_FAILURES
                } else {
                    FREE_USER_FAILURES
                };
                let Some((n, last)) = self.count(key) else {
                    return saturated.map(|d| d.min(MAX_BLOCK));
                };
                let over = n.checked_sub(free)?;
                let block = FIRST_BLOCK
                    .saturating_mul(1u32 << over.min(10))
                    .min(MAX_BLOCK);
                block.checked_sub(last.elapsed()).filter(|d| !d.is_zero())
            })
            .max()
    }

    pub(super) fn failed(&mut self, keys: &[String]) {
        for key in keys {
            if !self.failures.contains_key(key) && self.failures.len() >= self.capacity {
                self.make_room();
            }
            let entry = self
                .failures
                .entry(key.clone())
                .or_insert((0, Instant::now()));
            *entry = (entry.0.saturating_add(1), Instant::now());
        }
    }

    /// Forget what is due; if the table is still full, evict the least recent eighth and stay
    /// saturated until the evicted entries would have been forgotten anyway.
    fn make_room(&mut self) {
        self.failures
            .retain(|_, (_, last)| last.elapsed() <= FORGET_AFTER);
        if self.failures.len() < self.capacity {
            return;
        }
        let mut by_age: Vec<(Instant, String)> = self
            .failures
            .iter()
            .map(|(key, &(_, last))| (last, key.clone()))
            .collect();
        let evict = (self.capacity / 8).max(1);
        by_age.select_nth_unstable_by_key(evict - 1, |(last, _)| *last);
        let mut newest_evicted = None;
        for (last, key) in by_age.into_iter().take(evict) {
            self.failures.remove(&key);
            newest_evicted = newest_evicted.max(Some(last));
        }
        if let Some(last) = newest_evicted {
            let until = last + FORGET_AFTER;
            self.saturated_until = self.saturated_until.max(Some(until));
            tracing::warn!(
                tracked = self.failures.len(),
                "login throttle table saturated: refusing untracked users and addresses"
            );
        }
    }

    pub(super) fn succeeded(&mut self, key: &str) {
        self.failures.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng as _;

    #[test]
    fn failures_over_the_budget_block_for_a_doubling_while() {
        let mut throttle = Throttle::default();
        let user = vec!["user\0x".to_owned()];
        for _ in 0..FREE_USER_FAILURES {
            assert_eq!(throttle.blocked(&user), None);
            throttle.failed(&user);
        }
        let first = throttle.blocked(&user).expect("blocked");
        assert!(first <= FIRST_BLOCK && first > FIRST_BLOCK / 2, "{first:?}");
        throttle.failed(&user);
        assert!(throttle.blocked(&user).expect("blocked") > FIRST_BLOCK);
        for _ in 0..20 {
            throttle.failed(&user);
        }
        assert!(throttle.blocked(&user).expect("blocked") <= MAX_BLOCK);
        throttle.succeeded(&user[0]);
        assert_eq!(throttle.blocked(&user), None);
        // An address has a larger budget than a user name.
        let address = vec!["addr\x00127.0.0.1".to_owned()];
        for _ in 0..FREE_ADDRESS_FAILURES {
            assert_eq!(throttle.blocked(&address), None);
            throttle.failed(&address);
        }
        assert!(throttle.blocked(&address).is_some());
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }

    #[test]
    fn ipv6_addresses_are_keyed_by_their_64_and_mapped_ipv4_by_the_address() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(64);
        let net: u128 = 0x2001_0db8_0001_0002 << 64;
        for _ in 0..200 {
            let a = net | u128::from(rand::Rng::random::<u64>(&mut rng));
            let b = net | u128::from(rand::Rng::random::<u64>(&mut rng));
            assert_eq!(
                address_key(IpAddr::from(std::net::Ipv6Addr::from(a))),
                address_key(IpAddr::from(std::net::Ipv6Addr::from(b)))
            );
            let other = a ^ (1 << (64 + rand::Rng::random_range(&mut rng, 0..64)));
            assert_ne!(
                address_key(IpAddr::from(std::net::Ipv6Addr::from(a))),
                address_key(IpAddr::from(std::net::Ipv6Addr::from(other)))
            );
            let v4 = std::net::Ipv4Addr::from(rand::Rng::random::<u32>(&mut rng));
            assert_eq!(
                address_key(IpAddr::from(v4)),
                address_key(IpAddr::from(v4.to_ipv6_mapped()))
            );
        }
    }
}
