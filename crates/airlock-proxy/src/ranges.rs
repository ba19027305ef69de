//! Which addresses the proxy refuses to connect to, as reviewed data.
//!
//! The rule is "public unicast only": every range below is refused unless the policy's
//! `allow_ranges` names it. The list follows the IANA special-purpose registries (RFC 6890
//! and its updates) and the ranges codex-rs's `network-proxy` treats as non-public, and
//! goes further on IPv6, where everything outside global unicast `2000::/3` is refused.
//!
//! Addresses that embed an IPv4 address are judged by what they would reach:
//! - IPv4-mapped `::ffff:a.b.c.d` *is* the IPv4 address (a dual-stack socket connects to
//!   it over IPv4), so it is canonicalized to `a.b.c.d` before any check and before the
//!   connect;
//! - NAT64 `64:ff9b::/96` and 6to4 `2002::/16` carry an IPv4 address that a translator or
//!   relay would reach: they are refused when that embedded address is refused;
//! - IPv4-compatible `::a.b.c.d` (deprecated by RFC 4291), local-use NAT64 `64:ff9b:1::/48`
//!   and Teredo `2001::/32` are refused outright.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One refused address range and why it is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockedRange {
    /// The first address of the range.
    pub network: IpAddr,
    /// The prefix length.
    pub prefix: u8,
    /// What the range is.
    pub name: &'static str,
}

impl BlockedRange {
    const fn v4(octets: [u8; 4], prefix: u8, name: &'static str) -> Self {
        Self {
            network: IpAddr::V4(Ipv4Addr::new(octets[0], octets[1], octets[2], octets[3])),
            prefix,
            name,
        }
    }

    const fn v6(segments: [u16; 8], prefix: u8, name: &'static str) -> Self {
        let [a, b, c, d, e, f, g, h] = segments;
        Self {
            network: IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)),
            prefix,
            name,
        }
    }

    /// True when `ip` lies in this range (same family, same prefix).
    pub fn contains(&self, ip: IpAddr) -> bool {
        cidr_contains(self.network, self.prefix, ip)
    }
}

impl fmt::Display for BlockedRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} ({})", self.network, self.prefix, self.name)
    }
}

/// Refused IPv4 ranges.
pub const BLOCKED_V4: &[BlockedRange] = &[
    BlockedRange::v4([0, 0, 0, 0], 8, "\"this network\", RFC 1122"),
    BlockedRange::v4([10, 0, 0, 0], 8, "private, RFC 1918"),
    BlockedRange::v4(
        [100, 64, 0, 0],
        10,
        "shared address space / CGNAT, RFC 6598",
    ),
    BlockedRange::v4([127, 0, 0, 0], 8, "loopback"),
    BlockedRange::v4([169, 254, 0, 0], 16, "link-local, cloud metadata, RFC 3927"),
    BlockedRange::v4([172, 16, 0, 0], 12, "private, RFC 1918"),
    BlockedRange::v4([192, 0, 0, 0], 24, "IETF protocol assignments, RFC 6890"),
    BlockedRange::v4([192, 0, 2, 0], 24, "documentation TEST-NET-1, RFC 5737"),
    BlockedRange::v4([192, 88, 99, 0], 24, "6to4 relay anycast, RFC 7526"),
    BlockedRange::v4([192, 168, 0, 0], 16, "private, RFC 1918"),
    BlockedRange::v4([198, 18, 0, 0], 15, "benchmarking, RFC 2544"),
    BlockedRange::v4([198, 51, 100, 0], 24, "documentation TEST-NET-2, RFC 5737"),
    BlockedRange::v4([203, 0, 113, 0], 24, "documentation TEST-NET-3, RFC 5737"),
    BlockedRange::v4([224, 0, 0, 0], 4, "multicast"),
    BlockedRange::v4([240, 0, 0, 0], 4, "reserved, and 255.255.255.255 broadcast"),
];

/// Refused IPv6 ranges, named; anything outside [`GLOBAL_UNICAST_V6`] is refused as well.
pub const BLOCKED_V6: &[BlockedRange] = &[
    BlockedRange::v6([0, 0, 0, 0, 0, 0, 0, 0], 128, "unspecified"),
    BlockedRange::v6([0, 0, 0, 0, 0, 0, 0, 1], 128, "loopback"),
    BlockedRange::v6(
        [0, 0, 0, 0, 0, 0, 0, 0],
        96,
        "IPv4-compatible, deprecated, RFC 4291",
    ),
    BlockedRange::v6(
        [0x64, 0xff9b, 1, 0, 0, 0, 0, 0],
        48,
        "local-use NAT64, RFC 8215",
    ),
    BlockedRange::v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64, "discard-only, RFC 6666"),
    BlockedRange::v6(
        [0x2001, 0, 0, 0, 0, 0, 0, 0],
        23,
        "IETF protocol assignments: Teredo, benchmarking, ORCHID, RFC 6890",
    ),
    BlockedRange::v6(
        [0x2001, 0xdb8, 0, 0, 0, 0, 0, 0],
        32,
        "documentation, RFC 3849",
    ),
    BlockedRange::v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, "documentation, RFC 9637"),
    BlockedRange::v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "unique local, RFC 4193"),
    BlockedRange::v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "link-local"),
    BlockedRange::v6(
        [0xfec0, 0, 0, 0, 0, 0, 0, 0],
        10,
        "site-local, deprecated, RFC 3879",
    ),
    BlockedRange::v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "multicast"),
];

/// IPv6 global unicast: the only IPv6 space the proxy may reach (less [`BLOCKED_V6`]).
pub const GLOBAL_UNICAST_V6: BlockedRange =
    BlockedRange::v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3, "global unicast");

/// The well-known NAT64 prefix; the last 32 bits are the IPv4 address reached.
const NAT64: BlockedRange = BlockedRange::v6(
    [0x64, 0xff9b, 0, 0, 0, 0, 0, 0],
    96,
    "NAT64 well-known prefix, RFC 6052",
);

/// The 6to4 prefix; bits 16..48 are the IPv4 address of the relay reached.
const SIX_TO_FOUR: BlockedRange =
    BlockedRange::v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16, "6to4, RFC 3056");

/// The range outside global unicast, for the refusal message.
const NOT_GLOBAL_V6: BlockedRange = BlockedRange::v6(
    [0, 0, 0, 0, 0, 0, 0, 0],
    0,
    "outside global unicast 2000::/3",
);

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockReason {
    /// The refused range the address (or the IPv4 address it embeds) is in.
    pub range: &'static BlockedRange,
    /// The IPv6 translation prefix through which the address embeds that IPv4 address.
    pub via: Option<&'static BlockedRange>,
}

impl fmt::Display for BlockReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.via {
            None => write!(f, "{}", self.range),
            Some(via) => write!(f, "{} embedding {}", via, self.range),
        }
    }
}

/// The address a connect would reach: IPv4-mapped IPv6 becomes its IPv4 address.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        IpAddr::V4(_) => ip,
    }
}

/// Why `ip` is refused, or `None` for a public unicast address. Ignores `allow_ranges`:
/// see [`AllowedRanges::check`] for the full decision.
pub fn blocked_reason(ip: IpAddr) -> Option<BlockReason> {
    match canonical_ip(ip) {
        IpAddr::V4(v4) => blocked_v4(v4).map(|range| BlockReason { range, via: None }),
        IpAddr::V6(v6) => blocked_v6(v6),
    }
}

fn blocked_v4(ip: Ipv4Addr) -> Option<&'static BlockedRange> {
    BLOCKED_V4.iter().find(|r| r.contains(IpAddr::V4(ip)))
}

fn blocked_v6(ip: Ipv6Addr) -> Option<BlockReason> {
    let addr = IpAddr::V6(ip);
    let bits = u128::from(ip);
    if NAT64.contains(addr) {
        let embedded = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
        return blocked_v4(embedded).map(|range| BlockReason {
            range,
            via: Some(&NAT64),
        });
    }
    if SIX_TO_FOUR.contains(addr) {
        let embedded = Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32);
        return blocked_v4(embedded).map(|range| BlockReason {
            range,
            via: Some(&SIX_TO_FOUR),
        });
    }
    if let Some(range) = BLOCKED_V6.iter().find(|r| r.contains(addr)) {
        return Some(BlockReason { range, via: None });
    }
    if !GLOBAL_UNICAST_V6.contains(addr) {
        return Some(BlockReason {
            range: &NOT_GLOBAL_V6,
            via: None,
        });
    }
    None
}

/// True when `ip` is inside `network/prefix` (both of the same family).
pub fn cidr_contains(network: IpAddr, prefix: u8, ip: IpAddr) -> bool {
    match (network, ip) {
        (IpAddr::V4(net), IpAddr::V4(ip)) => {
            let prefix = u32::from(prefix.min(32));
            let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
            u32::from(net) & mask == u32::from(ip) & mask
        }
        (IpAddr::V6(net), IpAddr::V6(ip)) => {
            let prefix = u32::from(prefix.min(128));
            let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
            u128::from(net) & mask == u128::from(ip) & mask
        }
        _ => false,
    }
}

/// The policy's `allow_ranges`: blocked ranges the proxy may reach all the same.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedRanges(Vec<(IpAddr, u8)>);

impl AllowedRanges {
    /// Wraps parsed `(address, prefix)` pairs (see `airlock_core::policy::parse_cidr`).
    /// IPv4-mapped IPv6 ranges are kept as written and so match nothing: write IPv4 ranges
    /// in IPv4 notation.
    pub fn new(ranges: Vec<(IpAddr, u8)>) -> Self {
        Self(ranges)
    }

    /// The ranges.
    pub fn ranges(&self) -> &[(IpAddr, u8)] {
        &self.0
    }

    /// True when the canonical form of `ip` lies in one of the ranges.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical_ip(ip);
        self.0
            .iter()
            .any(|(net, len)| cidr_contains(*net, *len, ip))
    }

    /// The full decision for one address: `Ok` with the canonical address to connect to,
    /// or why it is refused.
    pub fn check(&self, ip: IpAddr) -> Result<IpAddr, BlockReason> {
        let ip = canonical_ip(ip);
        if self.contains(ip) {
            return Ok(ip);
        }
        match blocked_reason(ip) {
            Some(reason) => Err(reason),
            None => Ok(ip),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn named_addresses_are_refused() {
        for s in [
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "100.64.0.1",
            "100.100.100.200", // Alibaba metadata
            "127.0.0.1",
            "127.255.255.254",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.170",
            "192.0.2.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::127.0.0.1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.1.2.3",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
            "2002:7f00:1::1",
            "2002:a9fe:a9fe::",
            "2001::1",
            "2001:db8::1",
            "3fff::1",
            "fc00::1",
            "fd00:ec2::254", // AWS IPv6 metadata
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "100::1",
            "::ffff:0:7f00:1", // IPv4-translated, RFC 2765
            "4000::1",
        ] {
            assert!(blocked_reason(ip(s)).is_some(), "{s} is not refused");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for s in [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.215.14",
            "100.63.255.255",
            "100.128.0.0",
            "172.32.0.1",
            "192.0.3.1",
            "223.255.255.255",
            "2606:4700::1111",
            "2a00:1450::1",
            "::ffff:1.1.1.1",
            "64:ff9b::101:101",
            "2002:101:101::1",
        ] {
            assert_eq!(blocked_reason(ip(s)), None, "{s} is refused");
        }
    }

    #[test]
    fn reasons_name_the_range() {
        let reason = blocked_reason(ip("169.254.169.254")).unwrap();
        assert_eq!(
            reason.to_string(),
            "169.254.0.0/16 (link-local, cloud metadata, RFC 3927)"
        );
        let reason = blocked_reason(ip("64:ff9b::a9fe:a9fe")).unwrap();
        assert!(reason.to_string().contains("NAT64"), "{reason}");
        assert!(reason.to_string().contains("169.254.0.0/16"), "{reason}");
    }

    #[test]
    fn allowed_ranges_open_exactly_their_range() {
        let allowed = AllowedRanges::new(vec![(ip("127.0.0.1"), 32)]);
        assert_eq!(allowed.check(ip("127.0.0.1")), Ok(ip("127.0.0.1")));
        assert_eq!(allowed.check(ip("::ffff:127.0.0.1")), Ok(ip("127.0.0.1")));
        assert!(allowed.check(ip("127.0.0.2")).is_err());
        assert!(allowed.check(ip("::1")).is_err());
        assert!(allowed.check(ip("64:ff9b::7f00:1")).is_err());
        assert!(allowed.check(ip("169.254.169.254")).is_err());
    }

    #[test]
    fn cidr_edges() {
        assert!(cidr_contains(ip("0.0.0.0"), 0, ip("255.1.2.3")));
        assert!(cidr_contains(ip("::"), 0, ip("ffff::1")));
        assert!(!cidr_contains(ip("10.0.0.0"), 8, ip("::ffff:10.0.0.1")));
        assert!(cidr_contains(ip("1.2.3.4"), 32, ip("1.2.3.4")));
        assert!(!cidr_contains(ip("1.2.3.4"), 32, ip("1.2.3.5")));
    }

    fn in_range(range: &BlockedRange, offset: u128) -> IpAddr {
        match range.network {
            IpAddr::V4(net) => {
                let host_bits = 32 - u32::from(range.prefix);
                let mask = if host_bits == 32 {
                    u32::MAX
                } else {
                    (1u32 << host_bits) - 1
                };
                IpAddr::V4(Ipv4Addr::from(u32::from(net) | (offset as u32 & mask)))
            }
            IpAddr::V6(net) => {
                let host_bits = 128 - u32::from(range.prefix);
                let mask = if host_bits == 128 {
                    u128::MAX
                } else {
                    (1u128 << host_bits) - 1
                };
                IpAddr::V6(Ipv6Addr::from(u128::from(net) | (offset & mask)))
            }
        }
    }

    proptest! {
        #[test]
        fn every_address_of_a_blocked_v4_range_is_refused(
            index in 0..BLOCKED_V4.len(),
            offset in any::<u128>(),
        ) {
            let addr = in_range(&BLOCKED_V4[index], offset);
            prop_assert!(blocked_reason(addr).is_some(), "{addr}");
            let IpAddr::V4(v4) = addr else { unreachable!() };
            // Its IPv4-mapped, NAT64 and 6to4 forms too.
            let mapped = IpAddr::V6(v4.to_ipv6_mapped());
            prop_assert!(blocked_reason(mapped).is_some(), "{mapped}");
            let nat64 = IpAddr::V6(Ipv6Addr::from((0x64_ff9bu128 << 96) | u128::from(u32::from(v4))));
            prop_assert!(blocked_reason(nat64).is_some(), "{nat64}");
            let six = IpAddr::V6(Ipv6Addr::from((0x2002u128 << 112) | (u128::from(u32::from(v4)) << 80) | (offset & 0xffff_ffff_ffff_ffff_ffff)));
            prop_assert!(blocked_reason(six).is_some(), "{six}");
            let compat = IpAddr::V6(Ipv6Addr::from(u128::from(u32::from(v4))));
            prop_assert!(blocked_reason(compat).is_some(), "{compat}");
        }

        #[test]
        fn every_address_of_a_blocked_v6_range_is_refused(
            index in 0..BLOCKED_V6.len(),
            offset in any::<u128>(),
        ) {
            let addr = in_range(&BLOCKED_V6[index], offset);
            prop_assert!(blocked_reason(addr).is_some(), "{addr}");
        }

        #[test]
        fn blocked_unless_allow_listed(addr in any::<IpAddr>(), len in 0u8..=32, extra in any::<u32>()) {
            let none = AllowedRanges::default();
            prop_assert_eq!(none.check(addr).is_err(), blocked_reason(addr).is_some());
            // A range around the address opens it, whatever it is.
            let canonical = canonical_ip(addr);
            let prefix = match canonical { IpAddr::V4(_) => len, IpAddr::V6(_) => len * 4 };
            let allowed = AllowedRanges::new(vec![(canonical, prefix)]);
            prop_assert_eq!(allowed.check(addr), Ok(canonical));
            // A range elsewhere changes nothing for this address.
            let other = IpAddr::V4(Ipv4Addr::from(extra));
            if !cidr_contains(other, 32, canonical) {
                let elsewhere = AllowedRanges::new(vec![(other, 32)]);
                prop_assert_eq!(elsewhere.check(addr).is_err(), blocked_reason(addr).is_some());
            }
        }

        #[test]
        fn outside_global_unicast_everything_v6_is_refused(bits in any::<u128>()) {
            let v6 = Ipv6Addr::from(bits);
            let addr = IpAddr::V6(v6);
            if !GLOBAL_UNICAST_V6.contains(addr) && !NAT64.contains(addr) && v6.to_ipv4_mapped().is_none() {
                prop_assert!(blocked_reason(addr).is_some(), "{addr}");
            }
        }
    }
}
