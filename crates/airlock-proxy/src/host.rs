//! Target hosts as the job names them, and the allowlist rules they are matched against.
//!
//! A target host is normalized once (ASCII lower case, one trailing dot removed) and then is
//! exactly one of: a DNS name, a canonical dotted-quad IPv4 literal, or a bracketed IPv6
//! literal. A host whose last label is numeric (`2130706433`, `127.1`, `0x7f.1`,
//! `017700000001`, `0177.0.0.1`) but that is not a canonical dotted quad is **refused
//! outright**, never canonicalized: those are the forms `inet_aton` and URL parsers read
//! as IPv4, no real top-level domain is numeric, and refusing them means no later layer
//! (the resolver, a connect) ever sees them.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use airlock_core::policy::HostPattern;

/// The ports an allowlist entry without a port admits: plain HTTP and HTTPS.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// Longest DNS name, in bytes (RFC 1035).
const NAME_MAX_BYTES: usize = 253;
/// Longest DNS label, in bytes.
const LABEL_MAX_BYTES: usize = 63;

/// A normalized target host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TargetHost {
    /// A DNS name: lower case, no trailing dot, labels of `[a-z0-9-]`.
    Name(String),
    /// A canonical dotted-quad IPv4 literal.
    V4(Ipv4Addr),
    /// A bracketed IPv6 literal (without zone).
    V6(Ipv6Addr),
}

impl TargetHost {
    /// Parses a host as it appears in a request target (`example.com`, `1.2.3.4`,
    /// `[::1]`). The error says why the host is refused.
    pub fn parse(raw: &str) -> Result<Self, HostError> {
        if let Some(inner) = raw.strip_prefix('[') {
            let inner = inner.strip_suffix(']').ok_or(HostError::Malformed)?;
            return inner
                .parse::<Ipv6Addr>()
                .map(TargetHost::V6)
                .map_err(|_| HostError::Malformed);
        }
        let lower = raw.to_ascii_lowercase();
        let name = lower.strip_suffix('.').unwrap_or(&lower);
        if !is_dns_name(name) {
            return Err(HostError::Malformed);
        }
        if ends_in_number(name) {
            return name
                .parse::<Ipv4Addr>()
                .map(TargetHost::V4)
                .map_err(|_| HostError::NonCanonicalNumeric);
        }
        Ok(TargetHost::Name(name.to_owned()))
    }

    /// The literal address, for IP-literal hosts.
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            TargetHost::Name(_) => None,
            TargetHost::V4(v4) => Some(IpAddr::V4(*v4)),
            TargetHost::V6(v6) => Some(IpAddr::V6(*v6)),
        }
    }

    /// The host as it goes into a `Host` header or an authority: IPv6 in brackets.
    pub fn authority(&self, port: u16) -> String {
        let default = 80;
        match (self, port == default) {
            (TargetHost::V6(v6), true) => format!("[{v6}]"),
            (TargetHost::V6(v6), false) => format!("[{v6}]:{port}"),
            (host, true) => host.to_string(),
            (host, false) => format!("{host}:{port}"),
        }
    }
}

impl TargetHost {
    /// `host:port`, IPv6 in brackets, the port always written (for messages).
    pub fn authority_with_port(&self, port: u16) -> String {
        match self {
            TargetHost::V6(v6) => format!("[{v6}]:{port}"),
            host => format!("{host}:{port}"),
        }
    }
}

impl fmt::Display for TargetHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetHost::Name(name) => f.write_str(name),
            TargetHost::V4(v4) => write!(f, "{v4}"),
            TargetHost::V6(v6) => write!(f, "{v6}"),
        }
    }
}

/// Why a target host is refused before any policy check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostError {
    /// Not a DNS name, dotted quad or bracketed IPv6 literal.
    Malformed,
    /// A numeric host in a form other than the canonical dotted quad.
    NonCanonicalNumeric,
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HostError::Malformed => "not a host name or IP address",
            HostError::NonCanonicalNumeric => {
                "numeric host in a non-canonical form (write IPv4 as a.b.c.d)"
            }
        })
    }
}

/// True for 1-253 bytes of labels of 1-63 `[a-z0-9-]` (already lower case).
fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_MAX_BYTES
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= LABEL_MAX_BYTES
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// True when the last label is a number as IPv4 parsers read it: all decimal digits, or
/// `0x` followed by hex digits (WHATWG URL "ends in a number").
fn ends_in_number(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    match last.strip_prefix("0x") {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => false,
    }
}

/// One allowlist entry, compiled for matching.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRule {
    host: RuleHost,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum RuleHost {
    /// Exactly this name.
    Exact(String),
    /// Any name with at least one more label in front of this suffix (`*.suffix`).
    Subdomains(String),
    /// Exactly this IPv4 literal.
    Ip(Ipv4Addr),
}

impl HostRule {
    /// Compiles a policy entry. Refuses numeric entries that are not canonical IPv4
    /// (`2130706433`, `127.1`) and wildcards over numbers (`*.0.1`): such an entry would
    /// either never match or match an address written in another form.
    pub fn new(pattern: &HostPattern) -> Result<Self, String> {
        let host = if let Some(suffix) = pattern.host.strip_prefix("*.") {
            if ends_in_number(suffix) {
                return Err("a wildcard must cover a domain, not a number".to_owned());
            }
            RuleHost::Subdomains(suffix.to_owned())
        } else {
            match TargetHost::parse(&pattern.host) {
                Ok(TargetHost::Name(name)) => RuleHost::Exact(name),
                Ok(TargetHost::V4(v4)) => RuleHost::Ip(v4),
                Ok(TargetHost::V6(_)) | Err(HostError::Malformed) => {
                    return Err("not a host name or IPv4 address".to_owned());
                }
                Err(HostError::NonCanonicalNumeric) => {
                    return Err("a numeric host must be a canonical a.b.c.d".to_owned());
                }
            }
        };
        Ok(Self {
            host,
            port: pattern.port,
        })
    }

    /// True when this rule admits `host:port`. Without a port in the entry, only
    /// [`DEFAULT_PORTS`] are admitted. Wildcards match names only, never IP literals.
    pub fn matches(&self, host: &TargetHost, port: u16) -> bool {
        let port_ok = match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        };
        port_ok
            && match (&self.host, host) {
                (RuleHost::Exact(rule), TargetHost::Name(name)) => rule == name,
                (RuleHost::Subdomains(suffix), TargetHost::Name(name)) => name
                    .strip_suffix(suffix.as_str())
                    .and_then(|front| front.strip_suffix('.'))
                    .is_some_and(|front| !front.is_empty()),
                (RuleHost::Ip(rule), TargetHost::V4(v4)) => rule == v4,
                _ => false,
            }
    }
}

impl fmt::Display for HostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            RuleHost::Exact(name) => f.write_str(name)?,
            RuleHost::Subdomains(suffix) => write!(f, "*.{suffix}")?,
            RuleHost::Ip(v4) => write!(f, "{v4}")?,
        }
        match self.port {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rule(text: &str) -> HostRule {
        HostRule::new(&text.parse::<HostPattern>().unwrap()).unwrap()
    }

    fn name(text: &str) -> TargetHost {
        TargetHost::parse(text).unwrap()
    }

    #[test]
    fn hosts_normalize() {
        assert_eq!(name("Example.COM."), TargetHost::Name("example.com".into()));
        assert_eq!(name("127.0.0.1"), TargetHost::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(name("127.0.0.1."), TargetHost::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(name("[::1]"), TargetHost::V6(Ipv6Addr::LOCALHOST));
        assert_eq!(name("1a.example"), TargetHost::Name("1a.example".into()));
        assert_eq!(name("0x.example"), TargetHost::Name("0x.example".into()));
    }

    #[test]
    fn alternative_ip_encodings_are_refused() {
        for raw in [
            "2130706433",
            "017700000001",
            "0x7f000001",
            "0x7F.1",
            "0x7f.0.0.1",
            "127.1",
            "127.0.1",
            "0177.0.0.1",
            "127.000.000.001",
            "127.0.0.01",
            "0",
            "a.b.123",
            "example.0x1f",
            "example.0x",
            "1.2.3.4.5",
            "169.254.43518",
        ] {
            assert_eq!(
                TargetHost::parse(raw),
                Err(HostError::NonCanonicalNumeric),
                "{raw}"
            );
        }
    }

    #[test]
    fn malformed_hosts_are_refused() {
        for raw in [
            "",
            ".",
            "a..b",
            "a b",
            "exa_mple.com",
            "ex%41mple.com",
            "[::1",
            "[fe80::1%25eth0]",
            "::1",
            "bücher.de",
            "user@host",
            &"a".repeat(64),
            &format!("{}.com", "a.".repeat(130)),
        ] {
            assert_eq!(TargetHost::parse(raw), Err(HostError::Malformed), "{raw}");
        }
    }

    #[test]
    fn wildcards_cover_subdomains_not_the_apex() {
        let r = rule("*.example.com");
        assert!(r.matches(&name("a.example.com"), 443));
        assert!(r.matches(&name("a.b.example.com"), 80));
        assert!(r.matches(&name("A.Example.Com."), 443));
        assert!(!r.matches(&name("example.com"), 443));
        assert!(!r.matches(&name("badexample.com"), 443));
        assert!(!r.matches(&name("a.example.com.evil"), 443));
    }

    #[test]
    fn ports_default_to_http_and_https() {
        let r = rule("pypi.org");
        assert!(r.matches(&name("pypi.org"), 80));
        assert!(r.matches(&name("pypi.org"), 443));
        assert!(!r.matches(&name("pypi.org"), 22));
        assert!(!r.matches(&name("pypi.org"), 8080));
        let r = rule("pypi.org:8443");
        assert!(r.matches(&name("pypi.org"), 8443));
        assert!(!r.matches(&name("pypi.org"), 443));
    }

    #[test]
    fn ip_rules_match_the_literal_only() {
        let r = rule("127.0.0.1:8080");
        assert!(r.matches(&name("127.0.0.1"), 8080));
        assert!(!r.matches(&name("localhost"), 8080));
        assert!(!r.matches(&name("[::ffff:127.0.0.1]"), 8080));
        assert!(TargetHost::parse("127.1").is_err());
    }

    #[test]
    fn numeric_rules_are_refused() {
        for bad in ["2130706433", "127.1", "0x7f.1", "*.0.1", "*.0x1"] {
            let pattern = bad.parse::<HostPattern>().unwrap();
            assert!(HostRule::new(&pattern).is_err(), "{bad}");
        }
    }

    #[test]
    fn authority_brackets_ipv6_and_omits_port_80() {
        assert_eq!(name("a.test").authority(80), "a.test");
        assert_eq!(name("a.test").authority(8080), "a.test:8080");
        assert_eq!(name("[::1]").authority(8080), "[::1]:8080");
        assert_eq!(name("[::1]").authority(80), "[::1]");
    }

    fn label() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9-]{0,10}"
    }

    proptest! {
        #[test]
        fn wildcard_matches_exactly_the_strict_subdomains(
            suffix in proptest::collection::vec(label(), 1..4),
            front in proptest::collection::vec(label(), 0..3),
            other in proptest::collection::vec(label(), 1..5),
            upper in any::<bool>(),
            dot in any::<bool>(),
        ) {
            let suffix = suffix.join(".");
            let r = rule(&format!("*.{suffix}"));
            let mut host = if front.is_empty() { suffix.clone() } else { format!("{}.{suffix}", front.join(".")) };
            if upper { host = host.to_ascii_uppercase(); }
            if dot { host.push('.'); }
            prop_assert_eq!(r.matches(&name(&host), 443), !front.is_empty());
            let other = other.join(".");
            let expected = other.ends_with(&format!(".{suffix}"));
            prop_assert_eq!(r.matches(&name(&other), 443), expected);
        }

        #[test]
        fn exact_rule_matches_only_its_name_and_ports(
            host in proptest::collection::vec(label(), 1..4),
            other in proptest::collection::vec(label(), 1..4),
            port in any::<u16>(),
            rule_port in proptest::option::of(1u16..),
        ) {
            let host = host.join(".");
            let other = other.join(".");
            let text = match rule_port { Some(p) => format!("{host}:{p}"), None => host.clone() };
            let r = rule(&text);
            let port_ok = match rule_port { Some(p) => p == port, None => port == 80 || port == 443 };
            prop_assert_eq!(r.matches(&name(&host), port), port_ok);
            prop_assert_eq!(r.matches(&name(&host.to_ascii_uppercase()), port), port_ok);
            prop_assert_eq!(r.matches(&name(&other), port), port_ok && other == host);
        }

        #[test]
        fn numeric_forms_never_parse_as_names(n in any::<u32>(), parts in 1usize..4) {
            // Decimal, octal and hex spellings of the same address, in 1 to 3 parts.
            let forms = [format!("{n}"), format!("0{n:o}"), format!("0x{n:x}")];
            for form in forms {
                let host = if parts == 1 { form.clone() } else { format!("{}.{form}", vec!["1"; parts - 1].join(".")) };
                match TargetHost::parse(&host) {
                    Ok(TargetHost::V4(v4)) => prop_assert_eq!(v4.to_string(), host),
                    Ok(other) => prop_assert!(false, "{host} parsed as {other:?}"),
                    Err(_) => {}
                }
            }
        }
    }
}
