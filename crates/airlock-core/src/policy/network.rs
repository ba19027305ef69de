//! `[network]`: network mode, allowlist, secrets, reviewed package indexes, the trust roots
//! of the proxy's own TLS, and egress proxy limits.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::is_env_name;
use crate::units::{ByteSize, duration_serde};

/// Network access of jobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkPolicy {
    /// `none` or `proxy`.
    pub mode: NetworkMode,
    /// `host[:port]` entries the proxy may reach (`*.` wildcards allowed).
    pub allow: Vec<String>,
    /// Address ranges (CIDR, e.g. `127.0.0.1/32`) the proxy may connect to although they
    /// are in a blocked range (loopback, private, link-local, ...). Empty by default.
    pub allow_ranges: Vec<String>,
    /// Names the proxy resolves from this table instead of DNS (like curl's `--resolve`),
    /// e.g. an internal API: `{ "api.internal" = ["10.1.2.3"] }`. The answers are still
    /// checked against the blocked ranges.
    pub hosts: BTreeMap<String, Vec<std::net::IpAddr>>,
    /// Secrets the job sees only as placeholders; the proxy substitutes the real value in
    /// requests to the secret's hosts.
    pub secrets: Vec<SecretSpec>,
    /// PEM files of trust roots the proxy accepts, besides the host's, when it verifies the
    /// certificate of an upstream whose TLS it intercepts (an internal CA). They are also
    /// in the job's CA bundle. Absolute paths.
    pub extra_roots: Vec<PathBuf>,
    /// Reviewed package indexes the job may install from through the proxy.
    pub packages: PackagesPolicy,
    /// Bounds on the proxy's work for one job.
    pub limits: ProxyLimits,
}

impl NetworkPolicy {
    /// Checks the allowlist, host table, ranges, secrets and proxy limits; returns the field
    /// name and reason.
    pub(super) fn check(&self) -> Result<(), (String, String)> {
        for entry in &self.allow {
            HostPattern::from_str(entry).map_err(|reason| ("allow".to_owned(), reason))?;
        }
        for name in self.hosts.keys() {
            match HostPattern::from_str(name) {
                Ok(p) if p.port.is_none() && !p.host.starts_with("*.") => {}
                _ => {
                    return Err((
                        "hosts".to_owned(),
                        format!("{name:?} must be a plain host name"),
                    ));
                }
            }
        }
        for range in &self.allow_ranges {
            parse_cidr(range).map_err(|reason| ("allow_ranges".to_owned(), reason))?;
        }
        for (i, secret) in self.secrets.iter().enumerate() {
            let field = format!("secrets[{i}]");
            if !is_env_name(&secret.env) || !is_env_name(&secret.value_env) {
                return Err((field, "env and value_env must be variable names".to_owned()));
            }
            if secret.placeholder.len() < 8 || secret.placeholder.contains('\0') {
                return Err((
                    field,
                    "placeholder must be at least 8 characters (it is searched for in requests)"
                        .to_owned(),
                ));
            }
            if secret.hosts.is_empty() {
                return Err((field, "hosts must name where the secret may go".to_owned()));
            }
            for host in &secret.hosts {
                HostPattern::from_str(host).map_err(|reason| (field.clone(), reason))?;
            }
            if secret.substitute.is_empty() {
                return Err((
                    field,
                    "substitute must name at least one place (headers, query, body)".to_owned(),
                ));
            }
        }
        for (i, path) in self.extra_roots.iter().enumerate() {
            if !path.is_absolute() {
                return Err((
                    format!("extra_roots[{i}]"),
                    format!("{} is not an absolute path", path.display()),
                ));
            }
        }
        self.packages
            .check()
            .map_err(|(field, reason)| (format!("packages.{field}"), reason))?;
        if self.limits.connections == 0 {
            return Err((
                "limits.connections".to_owned(),
                "must be at least 1".to_owned(),
            ));
        }
        Ok(())
    }
}

impl NetworkPolicy {
    /// Whether the proxy terminates the TLS of some hosts, so that each job needs a CA of
    /// its own, trusted inside the sandbox: when a secret is bound to a host (the proxy
    /// puts its value into that host's requests) or a package index is named (the proxy
    /// lists what was fetched from it).
    pub fn intercepts_tls(&self) -> bool {
        !self.secrets.is_empty() || self.packages.is_configured()
    }
}

/// A secret kept on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretSpec {
    /// The environment variable the job sees, holding the placeholder.
    pub env: String,
    /// The placeholder text the job sees and sends.
    pub placeholder: String,
    /// Where the real value comes from: the executor's environment variable of this name.
    pub value_env: String,
    /// `host[:port]` patterns the real value may be sent to.
    pub hosts: Vec<String>,
    /// Where in a request toward those hosts the placeholder is replaced: header values
    /// only unless the policy names more.
    #[serde(default = "default_substitute")]
    pub substitute: Vec<SubstitutePlace>,
}

fn default_substitute() -> Vec<SubstitutePlace> {
    vec![SubstitutePlace::Headers]
}

/// A part of a request where a secret's placeholder may be replaced by its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SubstitutePlace {
    /// Header values (`Authorization: Bearer PLACEHOLDER`).
    Headers,
    /// The query string of the request target (the value percent-encoded).
    Query,
    /// The request body, as it streams (its length then changes, so it is sent chunked).
    Body,
}

/// `[network.packages]`: package indexes reachable through the proxy, for `pip install`
/// and `npm install`. The index's host is allowed without an `allow` entry; the hosts its
/// pages link to for files (`https://` links only) are allowed as it names them, during
/// the job. The proxy intercepts the TLS of all of them, so that each download is an audit
/// line of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PackagesPolicy {
    /// pip's index, a simple repository API over `https://`
    /// (`https://pypi.org/simple`, or a mirror): the job's `PIP_INDEX_URL`.
    pub index: Option<String>,
    /// npm's registry over `https://` (`https://registry.npmjs.org`): the job's
    /// `npm_config_registry`.
    pub npm_registry: Option<String>,
    /// Whether pip must check every file against a hash the requirements name
    /// (`PIP_REQUIRE_HASHES=1` in the job's environment).
    pub require_hashes: bool,
}

impl Default for PackagesPolicy {
    fn default() -> Self {
        Self {
            index: None,
            npm_registry: None,
            require_hashes: true,
        }
    }
}

impl PackagesPolicy {
    /// Whether any index is named.
    pub fn is_configured(&self) -> bool {
        self.index.is_some() || self.npm_registry.is_some()
    }

    /// The named indexes' URLs.
    pub fn urls(&self) -> impl Iterator<Item = &str> {
        self.index
            .iter()
            .chain(&self.npm_registry)
            .map(String::as_str)
    }

    fn check(&self) -> Result<(), (String, String)> {
        for (field, url) in [("index", &self.index), ("npm_registry", &self.npm_registry)] {
            if let Some(url) = url {
                parse_https_url(url).map_err(|reason| (field.to_owned(), reason))?;
            }
        }
        Ok(())
    }
}

/// An `https://` URL's host (lower case, a name or an IPv4 address) and port (443 unless
/// it names one). User information, a fragment and `*.` hosts are refused.
pub fn parse_https_url(url: &str) -> Result<(String, u16), String> {
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(|| format!("{url:?} is not an https:// URL"))?;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    if url.contains('#') || authority.contains('@') {
        return Err(format!("{url:?}: no user information or fragment"));
    }
    if url.bytes().any(|b| !(0x21..0x7f).contains(&b)) {
        return Err(format!("{url:?}: only printable ASCII, no spaces"));
    }
    let pattern =
        HostPattern::from_str(authority).map_err(|reason| format!("{url:?}: {reason}"))?;
    if pattern.host.starts_with("*.") {
        return Err(format!("{url:?}: the host must be a name, not a wildcard"));
    }
    Ok((pattern.host, pattern.port.unwrap_or(443)))
}

/// Bounds on the egress proxy, per job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyLimits {
    /// Connections over the job's life.
    pub connections: u32,
    /// Bytes through the proxy in both directions.
    pub bytes: ByteSize,
    /// Time to connect to an upstream.
    #[serde(with = "duration_serde")]
    pub connect_timeout: Duration,
    /// A connection with no traffic this long is closed.
    #[serde(with = "duration_serde")]
    pub idle_timeout: Duration,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        Self {
            connections: 64,
            bytes: ByteSize::mib(64),
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// How a job reaches the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// A fresh network namespace with only `lo`.
    #[default]
    None,
    /// Only the allowlisting egress proxy.
    Proxy,
}

impl fmt::Display for NetworkMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NetworkMode::None => "none",
            NetworkMode::Proxy => "proxy",
        })
    }
}

/// An allowlist entry: `host[:port]`, the host possibly starting with `*.`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    /// Lower-case host, or `*.suffix`.
    pub host: String,
    /// The port, if the entry names one.
    pub port: Option<u16>,
}

impl FromStr for HostPattern {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (host, port) = match text.rsplit_once(':') {
            Some((host, port)) if !host.contains(':') => {
                let port: u16 = port
                    .parse()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| format!("{text:?}: bad port {port:?}"))?;
                (host, Some(port))
            }
            _ => (text, None),
        };
        let labels = host.strip_prefix("*.").unwrap_or(host);
        let valid = !labels.is_empty()
            && labels.len() <= 253
            && labels.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if !valid {
            return Err(format!(
                "{text:?} is not a host name, *.domain or IPv4 address"
            ));
        }
        Ok(HostPattern {
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

/// Parses `a.b.c.d/n` or `v6::/n` into an address and a prefix length.
pub fn parse_cidr(text: &str) -> Result<(std::net::IpAddr, u8), String> {
    let (addr, len) = text
        .split_once('/')
        .ok_or_else(|| format!("{text:?} is not a CIDR range (write e.g. 127.0.0.1/32)"))?;
    let addr: std::net::IpAddr = addr
        .parse()
        .map_err(|_| format!("{text:?}: {addr:?} is not an IP address"))?;
    let len: u8 = len
        .parse()
        .map_err(|_| format!("{text:?}: bad prefix length {len:?}"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if len > max {
        return Err(format!("{text:?}: prefix length above {max}"));
    }
    Ok((addr, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn host_patterns() {
        assert_eq!(
            "PyPI.org:443".parse::<HostPattern>().unwrap(),
            HostPattern {
                host: "pypi.org".into(),
                port: Some(443)
            }
        );
        assert!("*.pythonhosted.org:443".parse::<HostPattern>().is_ok());
        assert!("evil.com:0".parse::<HostPattern>().is_err());
        assert!("a b".parse::<HostPattern>().is_err());
    }

    #[test]
    fn package_index_urls() {
        assert_eq!(
            parse_https_url("https://PyPI.org/simple").unwrap(),
            ("pypi.org".to_owned(), 443)
        );
        assert_eq!(
            parse_https_url("https://mirror.test:8443/pypi/simple/").unwrap(),
            ("mirror.test".to_owned(), 8443)
        );
        for bad in [
            "http://pypi.org/simple",
            "https://user:pw@pypi.org/simple",
            "https://*.pypi.org/simple",
            "https://pypi.org/simple#x",
            "https:///simple",
            "https://py pi.org/",
        ] {
            assert!(parse_https_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn secrets_substitute_in_headers_unless_told_otherwise() {
        let spec: SecretSpec = toml::from_str(
            "env = \"T\"\nplaceholder = \"placeholder-1\"\nvalue_env = \"V\"\nhosts = [\"a.test\"]",
        )
        .unwrap();
        assert_eq!(spec.substitute, vec![SubstitutePlace::Headers]);
        let spec: SecretSpec = toml::from_str(
            "env = \"T\"\nplaceholder = \"placeholder-1\"\nvalue_env = \"V\"\nhosts = [\"a.test\"]\nsubstitute = [\"query\", \"body\"]",
        )
        .unwrap();
        assert_eq!(
            spec.substitute,
            vec![SubstitutePlace::Query, SubstitutePlace::Body]
        );
    }
}
