//! `[network]`: network mode, allowlist, secrets and egress proxy limits.

use std::collections::BTreeMap;
use std::fmt;
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
        }
        if self.limits.connections == 0 {
            return Err((
                "limits.connections".to_owned(),
                "must be at least 1".to_owned(),
            ));
        }
        Ok(())
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
}
