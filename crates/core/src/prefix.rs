//! Address-family-agnostic arithmetic on prefixes, so IPAM and NAT never special-case IPv4.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// The address family of a prefix or address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// IPv4 (32-bit addresses).
    V4,
    /// IPv6 (128-bit addresses).
    V6,
}

impl Family {
    /// The family of `net`.
    pub fn of(net: &IpNet) -> Self {
        match net {
            IpNet::V4(_) => Family::V4,
            IpNet::V6(_) => Family::V6,
        }
    }

    /// Number of bits in an address of this family.
    pub fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// An address as an unsigned integer, wide enough for both families.
pub fn addr_to_u128(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The inverse of [`addr_to_u128`] for the given family.
pub fn u128_to_addr(family: Family, value: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(value as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

/// First and last address of `net`, inclusive, as integers.
pub fn span(net: &IpNet) -> (u128, u128) {
    let start = addr_to_u128(net.network());
    let end = addr_to_u128(net.broadcast());
    (start, end)
}

/// Whether two prefixes share at least one address (same family only).
pub fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    if Family::of(a) != Family::of(b) {
        return false;
    }
    let (a0, a1) = span(a);
    let (b0, b1) = span(b);
    a0 <= b1 && b0 <= a1
}

/// Whether `net` has no host bits set (e.g. `10.244.0.0/16`, not `10.244.1.0/16`).
pub fn is_canonical(net: &IpNet) -> bool {
    net.trunc() == *net
}

/// Builds the prefix of `family` starting at integer `start` with length `len`.
pub fn prefix_at(family: Family, start: u128, len: u8) -> IpNet {
    match u128_to_addr(family, start) {
        IpAddr::V4(a) => IpNet::V4(Ipv4Net::new(a, len).expect("length checked by caller")),
        IpAddr::V6(a) => IpNet::V6(Ipv6Net::new(a, len).expect("length checked by caller")),
    }
}

/// Number of addresses in a prefix of length `len` in `family`, saturating for `::/0`.
pub fn block_size(family: Family, len: u8) -> u128 {
    let host_bits = u32::from(family.bits() - len);
    1u128.checked_shl(host_bits).unwrap_or(u128::MAX)
}

/// Translates `addr` from prefix `from` into prefix `to` keeping the host part
/// (the stateless prefix translation a NAT rule applies). Both prefixes must have the
/// same family and length, and `addr` must lie in `from`.
pub fn translate(addr: IpAddr, from: &IpNet, to: &IpNet) -> Option<IpAddr> {
    if !from.contains(&addr) || from.prefix_len() != to.prefix_len() {
        return None;
    }
    if Family::of(from) != Family::of(to) {
        return None;
    }
    let family = Family::of(from);
    let host_mask = block_size(family, from.prefix_len()).wrapping_sub(1);
    let host = addr_to_u128(addr) & host_mask;
    Some(u128_to_addr(family, addr_to_u128(to.network()) | host))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn overlap_table() {
        let cases = [
            ("10.0.0.0/8", "10.244.0.0/16", true),
            ("10.244.0.0/16", "10.0.0.0/8", true),
            ("10.244.0.0/16", "10.245.0.0/16", false),
            ("10.244.0.0/16", "10.244.255.0/24", true),
            ("10.244.0.0/16", "fd00::/8", false),
            ("fd00::/8", "fd00:1::/32", true),
        ];
        for (a, b, want) in cases {
            assert_eq!(overlaps(&net(a), &net(b)), want, "{a} vs {b}");
        }
    }

    #[test]
    fn translate_keeps_host_part() {
        let cases = [
            (
                "10.244.3.7",
                "10.244.0.0/16",
                "10.1.0.0/16",
                Some("10.1.3.7"),
            ),
            ("10.245.3.7", "10.244.0.0/16", "10.1.0.0/16", None),
            ("10.244.3.7", "10.244.0.0/16", "10.1.0.0/24", None),
            ("fd00::5", "fd00::/64", "fd01::/64", Some("fd01::5")),
        ];
        for (addr, from, to, want) in cases {
            let got = translate(addr.parse().unwrap(), &net(from), &net(to));
            assert_eq!(got, want.map(|w| w.parse().unwrap()), "{addr} {from}->{to}");
        }
    }

    #[test]
    fn block_size_handles_full_width() {
        assert_eq!(block_size(Family::V4, 24), 256);
        assert_eq!(block_size(Family::V4, 0), 1 << 32);
        assert_eq!(block_size(Family::V6, 0), u128::MAX);
    }
}
