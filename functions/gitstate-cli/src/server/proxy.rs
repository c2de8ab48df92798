//! Reverse proxies in front of `gitstate serve` (`GITSTATE_TRUSTED_PROXIES`): whose address a
//! request counts under in the login throttle.
//!
//! Behind a proxy every request comes from the proxy's address, so a stranger's failed logins
//! would throttle every client's. A trusted proxy appends the address it received the request
//! from to `X-Forwarded-For`; entries further left were written by whoever sent the request and
//! prove nothing. So the client is the nearest entry, read from the right, that is not itself a
//! trusted proxy. A connection from anyone else is its own address, whatever it sends.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::HeaderMap;
use ipnet::IpNet;

/// The header proxies append the client's address to.
const FORWARDED_FOR: &str = "x-forwarded-for";

/// The trusted proxies' blocks.
#[derive(Debug, Clone, Default)]
pub struct Proxies(Arc<[IpNet]>);

impl Proxies {
    pub fn new(blocks: &[IpNet]) -> Self {
        Self(blocks.into())
    }

    /// Whether `ip` is a trusted proxy.
    pub(super) fn trusts(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|block| block.contains(&ip))
    }

    /// The client a request from `peer` with `headers` is counted as: `peer` unless it is a
    /// trusted proxy; then the nearest address in `X-Forwarded-For` that is not one (an entry
    /// that is not an address ends the walk at the hop before it).
    pub(super) fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut client = peer.to_canonical();
        if !self.trusts(client) {
            return client;
        }
        let entries: Vec<&str> = headers
            .get_all(FORWARDED_FOR)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .collect();
        for entry in entries.iter().rev() {
            let Some(hop) = address(entry.trim()) else {
                break;
            };
            client = hop;
            if !self.trusts(hop) {
                break;
            }
        }
        client
    }
}

/// An `X-Forwarded-For` entry: an address, with a port or in brackets as some proxies write it.
fn address(entry: &str) -> Option<IpAddr> {
    let ip = entry
        .parse::<IpAddr>()
        .or_else(|_| entry.parse::<SocketAddr>().map(|s| s.ip()))
        .or_else(|_| {
            entry
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
        })
        .ok()?;
    Some(ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn headers(values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for value in values {
            map.append(FORWARDED_FOR, value.parse().expect("header value"));
        }
        map
    }

    fn proxies() -> Proxies {
        Proxies::new(&[
            "10.0.0.0/8".parse().expect("block"),
            "fd00::/8".parse().expect("block"),
        ])
    }

    /// Generated chains: whatever a client writes on the left and however many trusted proxies
    /// appended on the right, the client is the entry the first untrusted hop was given; a peer
    /// that is not a trusted proxy is itself, whatever it sends.
    #[test]
    fn the_client_is_the_nearest_untrusted_hop_and_nobody_else_is_believed() {
        let proxies = proxies();
        let mut rng = StdRng::seed_from_u64(27);
        let untrusted = |rng: &mut StdRng| -> IpAddr {
            if rng.random_bool(0.5) {
                IpAddr::from([198, 51, 100, rng.random()])
            } else {
                format!("2001:db8::{:x}", rng.random::<u16>())
                    .parse()
                    .expect("v6")
            }
        };
        for _ in 0..500 {
            let forged: Vec<String> = (0..rng.random_range(0..4))
                .map(|_| untrusted(&mut rng).to_string())
                .collect();
            let client = untrusted(&mut rng);
            let hops: Vec<String> = (0..rng.random_range(0..3))
                .map(|i| format!("10.1.{i}.{}", rng.random::<u8>()))
                .collect();
            let mut chain = forged.clone();
            chain.push(match rng.random_range(0..3) {
                0 if client.is_ipv4() => format!("{client}:{}", rng.random::<u16>()),
                1 if client.is_ipv6() => format!("[{client}]"),
                _ => client.to_string(),
            });
            chain.extend(hops);
            // One header, or the entries split over several.
            let split = rng.random_range(0..=chain.len());
            let (left, right) = chain.split_at(split);
            let values: Vec<String> = [left.join(", "), right.join(",")]
                .into_iter()
                .filter(|v| !v.is_empty())
                .collect();
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            let map = headers(&values);
            let peer = IpAddr::from([10, 9, 9, 9]);
            assert_eq!(proxies.client(peer, &map), client, "{chain:?}");
            let stranger = untrusted(&mut rng);
            assert_eq!(proxies.client(stranger, &map), stranger, "{chain:?}");
        }
    }

    #[test]
    fn without_a_usable_header_the_proxy_is_the_client() {
        let proxies = proxies();
        let peer: IpAddr = "10.0.0.7".parse().expect("ip");
        assert_eq!(proxies.client(peer, &HeaderMap::new()), peer);
        // All trusted: the farthest hop read.
        let map = headers(&["10.2.0.1, 10.3.0.1"]);
        assert_eq!(
            proxies.client(peer, &map),
            "10.2.0.1".parse::<IpAddr>().expect("ip")
        );
        // Garbage ends the walk at the hop before it.
        let map = headers(&["198.51.100.1, not-an-address, 10.3.0.1"]);
        assert_eq!(
            proxies.client(peer, &map),
            "10.3.0.1".parse::<IpAddr>().expect("ip")
        );
        // An IPv4-mapped peer is the IPv4 address it maps.
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().expect("ip");
        let map = headers(&["198.51.100.1"]);
        assert_eq!(
            proxies.client(mapped, &map),
            "198.51.100.1".parse::<IpAddr>().expect("ip")
        );
        assert!(Proxies::default().client(peer, &map) == peer);
    }
}
