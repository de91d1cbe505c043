//! The client's address as login throttling counts it. `X-Forwarded-For` is honoured only from
//! peers in the trusted-proxy list (`--trusted-proxies`, CIDRs): the address is the right-most
//! hop that is not itself a trusted proxy, so a client cannot pick its own address by sending the
//! header, and behind an ingress every client is not one address. IPv6 clients are counted per
//! /64 (one subscriber holds a whole /64), IPv4 clients per address.

use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

/// One CIDR block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    net: IpAddr,
    prefix: u8,
}

impl Block {
    fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, canonical(ip)) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, what a dual-stack socket reports) as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The proxies whose `X-Forwarded-For` is believed (empty: none, the socket's peer counts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<Block>);

impl TrustedProxies {
    /// Every peer (the old `TF_TRUST_FORWARDED_FOR=true`): the left-most forwarded hop counts.
    /// Safe only when every connection comes through a proxy that overwrites the header.
    pub fn everyone() -> Self {
        Self(vec![
            Block {
                net: IpAddr::from([0, 0, 0, 0]),
                prefix: 0,
            },
            Block {
                net: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                prefix: 0,
            },
        ])
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `ip` is in one of the blocks (the gateway also uses the type for the peers whose
    /// `traceparent` it adopts).
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|b| b.contains(ip))
    }

    /// The client behind `peer`: `peer` itself unless it is a trusted proxy; then the right-most
    /// `X-Forwarded-For` hop (`forwarded`: the header values in order) that is not trusted, or the
    /// left-most when all are. A hop that is not an address ends the walk at the hop after it.
    pub fn client<'a>(&self, peer: IpAddr, forwarded: impl Iterator<Item = &'a str>) -> IpAddr {
        let mut client = canonical(peer);
        if !self.trusts(client) {
            return client;
        }
        let hops: Vec<&str> = forwarded.flat_map(|v| v.split(',')).collect();
        for hop in hops.iter().rev() {
            let Ok(ip) = hop.trim().parse::<IpAddr>() else {
                break;
            };
            client = canonical(ip);
            if !self.trusts(client) {
                break;
            }
        }
        client
    }
}

impl FromStr for TrustedProxies {
    type Err = String;

    /// Comma- or space-separated CIDRs (`10.0.0.0/8, fd00::/8`); a bare address is a /32 or /128.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut blocks = Vec::new();
        for part in s.split([',', ' ']).map(str::trim).filter(|p| !p.is_empty()) {
            let (addr, prefix) = part.split_once('/').unwrap_or((part, ""));
            let net: IpAddr = addr
                .parse()
                .map_err(|_| format!("`{part}` is not an address or CIDR block"))?;
            let max = if net.is_ipv4() { 32 } else { 128 };
            let prefix = if prefix.is_empty() {
                max
            } else {
                prefix
                    .parse::<u8>()
                    .ok()
                    .filter(|p| *p <= max)
                    .ok_or_else(|| format!("`{part}` has a bad prefix length"))?
            };
            blocks.push(Block {
                net: canonical(net),
                prefix,
            });
        }
        Ok(Self(blocks))
    }
}

/// What the per-address counts are keyed by: an IPv4 address, or an IPv6 address's /64.
pub fn throttle_key(ip: IpAddr) -> String {
    match canonical(ip) {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let mut o = v6.octets();
            o[8..].fill(0);
            format!("{}/64", Ipv6Addr::from(o))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_blocks_and_refuses_nonsense() {
        let t: TrustedProxies = "10.0.0.0/8, 192.168.1.7 fd00::/8".parse().unwrap();
        assert!(t.trusts(ip("10.200.3.4")));
        assert!(t.trusts(ip("192.168.1.7")));
        assert!(!t.trusts(ip("192.168.1.8")));
        assert!(t.trusts(ip("fd12::1")));
        assert!(t.trusts(ip("::ffff:10.1.1.1")), "IPv4-mapped peers");
        assert!(!t.trusts(ip("2001:db8::1")));
        assert!("10.0.0.0/33".parse::<TrustedProxies>().is_err());
        assert!("ingress".parse::<TrustedProxies>().is_err());
        assert!("".parse::<TrustedProxies>().unwrap().is_empty());
    }

    #[test]
    fn forwarded_for_counts_only_from_a_trusted_peer() {
        let t: TrustedProxies = "10.0.0.0/8".parse().unwrap();
        let xff = ["203.0.113.9, 10.0.0.3"];
        // From the ingress: the right-most untrusted hop.
        assert_eq!(t.client(ip("10.0.0.2"), xff.into_iter()), ip("203.0.113.9"));
        // A client cannot choose its address by prepending hops.
        let spoofed = ["1.2.3.4, 198.51.100.7"];
        assert_eq!(
            t.client(ip("10.0.0.2"), spoofed.into_iter()),
            ip("198.51.100.7")
        );
        // From anyone else the header is ignored.
        assert_eq!(
            t.client(ip("198.51.100.1"), xff.into_iter()),
            ip("198.51.100.1")
        );
        // No header, or garbage: the proxy itself.
        assert_eq!(t.client(ip("10.0.0.2"), std::iter::empty()), ip("10.0.0.2"));
        assert_eq!(
            t.client(ip("10.0.0.2"), ["junk"].into_iter()),
            ip("10.0.0.2")
        );
        // Nothing trusted: the peer.
        let none = TrustedProxies::default();
        assert_eq!(none.client(ip("10.0.0.2"), xff.into_iter()), ip("10.0.0.2"));
        // Everyone trusted (the old switch): the left-most hop.
        assert_eq!(
            TrustedProxies::everyone().client(ip("10.0.0.2"), xff.into_iter()),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn ipv6_clients_count_per_64() {
        assert_eq!(
            throttle_key(ip("2001:db8:1:2:aaaa::1")),
            throttle_key(ip("2001:db8:1:2:bbbb::9"))
        );
        assert_eq!(throttle_key(ip("2001:db8:1:2::5")), "2001:db8:1:2::/64");
        assert_ne!(
            throttle_key(ip("2001:db8:1:3::1")),
            throttle_key(ip("2001:db8:1:2::1"))
        );
        assert_eq!(throttle_key(ip("::ffff:192.0.2.1")), "192.0.2.1");
    }
}
