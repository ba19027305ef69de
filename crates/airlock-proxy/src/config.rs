//! What one proxy instance enforces: built once per job from the policy and the job's
//! allowlist, then shared read-only by every connection.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use airlock_core::policy::{
    HostPattern, NetworkMode, NetworkPolicy, ProxyLimits, SubstitutePlace, parse_cidr,
    parse_https_url,
};
use rustls::crypto::CryptoProvider;

use crate::ca::JobCa;
use crate::error::ProxyError;
use crate::host::{HostRule, TargetHost};
use crate::ranges::AllowedRanges;
use crate::trust::TrustRoots;

/// A hook called with every address right before the proxy connects to it; returning
/// `false` refuses that connect (it is then reported as a failed connect). For tests that
/// must prove an address is never dialled, and for embedders that want a last check.
pub type ConnectGate = Arc<dyn Fn(SocketAddr) -> bool + Send + Sync>;

/// Everything one proxy instance enforces.
pub struct ProxyConfig {
    allow: Vec<HostRule>,
    allow_ranges: AllowedRanges,
    secrets: Vec<Secret>,
    packages: Vec<PackageIndex>,
    limits: ProxyLimits,
    resolver: Resolver,
    connect_gate: Option<ConnectGate>,
    /// The job's CA and the roots of the proxy's TLS, when some host's TLS is intercepted.
    interception: Option<Interception>,
}

/// What intercepting TLS takes: the job's CA, the roots upstreams are verified against,
/// and the job's CA bundle. No `Debug` of the CA: its key must never be printed.
pub(crate) struct Interception {
    pub(crate) ca: JobCa,
    pub(crate) roots: TrustRoots,
    pub(crate) bundle: String,
    pub(crate) provider: Arc<CryptoProvider>,
}

/// A reviewed package index of `[network.packages]`: its host is allowed and intercepted,
/// and its answers name the file hosts that are allowed next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageIndex {
    /// The index's host.
    pub host: TargetHost,
    /// Its port.
    pub port: u16,
}

impl ProxyConfig {
    /// Builds the configuration for one job.
    ///
    /// `allow` is the job's allowlist (already resolved against the policy by
    /// `airlock-core`); each entry must also be in `network.allow`, and an empty list
    /// allows nothing. `env` reads a secret's real value from the executor's environment
    /// (normally `|name| std::env::var(name).ok()`); a missing value is an error, never
    /// an empty secret.
    pub fn from_policy(
        network: &NetworkPolicy,
        allow: &[String],
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ProxyError> {
        if network.mode != NetworkMode::Proxy {
            return Err(ProxyError::CheckMode { mode: network.mode });
        }
        let policy_allow: Vec<HostPattern> = network
            .allow
            .iter()
            .map(|entry| parse_pattern(entry))
            .collect::<Result<_, _>>()?;
        let mut rules = Vec::with_capacity(allow.len());
        for entry in allow {
            let pattern = parse_pattern(entry)?;
            if !policy_allow.contains(&pattern) {
                return Err(ProxyError::CheckAllowEntry {
                    entry: entry.clone(),
                });
            }
            rules.push(
                HostRule::new(&pattern).map_err(|reason| ProxyError::ParseAllowEntry {
                    entry: entry.clone(),
                    reason,
                })?,
            );
        }
        let ranges = network
            .allow_ranges
            .iter()
            .map(|range| {
                parse_cidr(range).map_err(|reason| ProxyError::ParseAllowRange {
                    range: range.clone(),
                    reason,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut secrets: Vec<Secret> = Vec::with_capacity(network.secrets.len());
        for (index, spec) in network.secrets.iter().enumerate() {
            let bad = |reason: String| ProxyError::ParseSecret {
                index,
                value_env: spec.value_env.clone(),
                reason,
            };
            if spec.placeholder.is_empty() || !is_header_safe(&spec.placeholder) {
                return Err(bad(
                    "the placeholder must be printable ASCII (it is searched for in headers)"
                        .to_owned(),
                ));
            }
            if let Some(other) = secrets.iter().find(|s| {
                s.placeholder.contains(&spec.placeholder)
                    || spec.placeholder.contains(&s.placeholder)
            }) {
                return Err(bad(format!(
                    "the placeholder overlaps the placeholder for {}",
                    other.value_env
                )));
            }
            let hosts = spec
                .hosts
                .iter()
                .map(|host| {
                    let pattern = host.parse::<HostPattern>().map_err(&bad)?;
                    HostRule::new(&pattern).map_err(|reason| bad(format!("{host:?}: {reason}")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            if hosts.is_empty() {
                return Err(bad("hosts must name where the secret may go".to_owned()));
            }
            let value = env(&spec.value_env).ok_or_else(|| ProxyError::ReadSecretValue {
                index,
                value_env: spec.value_env.clone(),
            })?;
            let check = |reason| ProxyError::CheckSecretValue {
                index,
                value_env: spec.value_env.clone(),
                reason,
            };
            if value.is_empty() {
                return Err(check("is empty"));
            }
            if !is_header_safe(&value) {
                return Err(check(
                    "holds a control or non-ASCII character (it must fit in a header)",
                ));
            }
            secrets.push(Secret {
                placeholder: spec.placeholder.clone(),
                value: SecretValue(value),
                hosts,
                value_env: spec.value_env.clone(),
                env: spec.env.clone(),
                substitute: spec.substitute.clone(),
            });
        }
        let packages = network
            .packages
            .urls()
            .map(|url| {
                let bad = |reason: String| ProxyError::ParsePackageIndex {
                    url: url.to_owned(),
                    reason,
                };
                let (host, port) = parse_https_url(url).map_err(bad)?;
                let host = TargetHost::parse(&host).map_err(|e| bad(e.to_string()))?;
                Ok(PackageIndex { host, port })
            })
            .collect::<Result<Vec<_>, ProxyError>>()?;
        let interception = if network.intercepts_tls() {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let roots = TrustRoots::load(&network.extra_roots)
                .map_err(|(path, reason)| ProxyError::ReadExtraRoots { path, reason })?;
            let ca = JobCa::generate(provider.clone())
                .map_err(|source| ProxyError::GenerateCa { source })?;
            let bundle = roots.bundle_with(ca.cert_pem());
            Some(Interception {
                ca,
                roots,
                bundle,
                provider,
            })
        } else {
            None
        };
        Ok(Self {
            allow: rules,
            allow_ranges: AllowedRanges::new(ranges),
            secrets,
            packages,
            interception,
            limits: network.limits.clone(),
            resolver: if network.hosts.is_empty() {
                Resolver::System
            } else {
                Resolver::SystemWithHosts(
                    network
                        .hosts
                        .iter()
                        .map(|(name, ips)| (normalize_name(name), ips.clone()))
                        .collect(),
                )
            },
            connect_gate: None,
        })
    }

    /// Replaces the resolver (the default is [`Resolver::System`]).
    pub fn with_resolver(mut self, resolver: Resolver) -> Self {
        self.resolver = resolver;
        self
    }

    /// Installs a [`ConnectGate`].
    pub fn with_connect_gate(mut self, gate: ConnectGate) -> Self {
        self.connect_gate = Some(gate);
        self
    }

    /// The compiled allowlist.
    pub fn allow(&self) -> &[HostRule] {
        &self.allow
    }

    /// The blocked ranges this proxy may reach all the same.
    pub fn allow_ranges(&self) -> &AllowedRanges {
        &self.allow_ranges
    }

    /// The secrets.
    pub fn secrets(&self) -> &[Secret] {
        &self.secrets
    }

    /// The limits.
    pub fn limits(&self) -> &ProxyLimits {
        &self.limits
    }

    /// The resolver.
    pub fn resolver(&self) -> &Resolver {
        &self.resolver
    }

    pub(crate) fn connect_gate(&self) -> Option<&ConnectGate> {
        self.connect_gate.as_ref()
    }

    /// True when an allowlist entry admits `host:port`, or it is a package index's.
    pub fn allows(&self, host: &TargetHost, port: u16) -> bool {
        self.allow.iter().any(|rule| rule.matches(host, port)) || self.is_package_index(host, port)
    }

    /// The package indexes of `[network.packages]`.
    pub fn packages(&self) -> &[PackageIndex] {
        &self.packages
    }

    /// True when `host:port` is a package index's.
    pub fn is_package_index(&self, host: &TargetHost, port: u16) -> bool {
        self.packages
            .iter()
            .any(|index| &index.host == host && index.port == port)
    }

    /// True when the proxy terminates the TLS of a tunnel to `host:port` (a secret's host,
    /// or a package index's) rather than passing it through. Hosts a package index named
    /// for its files are intercepted too; the proxy keeps those itself.
    pub fn intercepts(&self, host: &TargetHost, port: u16) -> bool {
        self.interception.is_some()
            && (self.secrets.iter().any(|s| s.is_for(host, port))
                || self.is_package_index(host, port))
    }

    /// The job's CA bundle (PEM): the host's trust roots, the policy's `extra_roots` and
    /// the job's own CA, for the sandbox to trust at
    /// [`airlock_core::job::TRUST_BUNDLE_PATH`]. `None` when no TLS is intercepted (no
    /// secret, no package index), and the job's own bundle stays.
    pub fn trust_bundle_pem(&self) -> Option<&str> {
        self.interception.as_ref().map(|i| i.bundle.as_str())
    }

    pub(crate) fn interception(&self) -> Option<&Interception> {
        self.interception.as_ref()
    }
}

impl fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("allow", &self.allow)
            .field("allow_ranges", &self.allow_ranges)
            .field("secrets", &self.secrets)
            .field("packages", &self.packages)
            .field("interception", &self.interception.is_some())
            .field("limits", &self.limits)
            .field("resolver", &self.resolver)
            .field("connect_gate", &self.connect_gate.is_some())
            .finish()
    }
}

fn parse_pattern(entry: &str) -> Result<HostPattern, ProxyError> {
    entry
        .parse::<HostPattern>()
        .map_err(|reason| ProxyError::ParseAllowEntry {
            entry: entry.to_owned(),
            reason,
        })
}

/// True for printable ASCII and spaces: what fits in a header value unchanged.
fn is_header_safe(text: &str) -> bool {
    text.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// A secret kept on the host: the job sends `placeholder`; the proxy puts in `value` only
/// on requests to one of `hosts` (plain HTTP, or HTTPS it intercepts), in the places
/// `substitute` names.
#[derive(Debug, Clone)]
pub struct Secret {
    /// What the job sees and sends.
    pub placeholder: String,
    /// The real value. Its `Debug` form is redacted.
    pub value: SecretValue,
    /// Where the real value may go.
    pub hosts: Vec<HostRule>,
    /// The executor variable the value came from (for messages; not secret).
    pub value_env: String,
    /// The job's variable holding the placeholder (for the audit; not secret).
    pub env: String,
    /// Where in a request the placeholder is replaced.
    pub substitute: Vec<SubstitutePlace>,
}

impl Secret {
    /// True when the real value may be sent to `host:port`.
    pub fn is_for(&self, host: &TargetHost, port: u16) -> bool {
        self.hosts.iter().any(|rule| rule.matches(host, port))
    }

    /// True when the placeholder is replaced in `place`.
    pub fn substitutes_in(&self, place: SubstitutePlace) -> bool {
        self.substitute.contains(&place)
    }
}

/// A secret's real value: never printed, never logged.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    /// Wraps a value.
    pub fn new(value: String) -> Self {
        Self(value)
    }

    /// The value itself, for the one place that puts it into a request.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretValue(<{} bytes, redacted>)", self.0.len())
    }
}

/// How the proxy turns names into addresses.
#[derive(Debug, Clone, Default)]
pub enum Resolver {
    /// The host's resolver (`getaddrinfo` through `tokio::net::lookup_host`).
    #[default]
    System,
    /// A fixed table, keyed by lower-case name; a name not in it does not resolve. For
    /// tests: `allowed.test` → `127.0.0.1` without any DNS.
    Static(HashMap<String, Vec<IpAddr>>),
    /// The policy's `[network] hosts` table first, then the host's resolver.
    SystemWithHosts(HashMap<String, Vec<IpAddr>>),
    /// A resolver of the embedding program's own (or a test's), called with the name,
    /// once per request like the others.
    Function(ResolveFn),
}

/// A name-to-addresses function for [`Resolver::Function`]; an `Err` says why the name
/// does not resolve.
#[derive(Clone)]
pub struct ResolveFn(pub Arc<ResolveFnInner>);

/// The function behind a [`ResolveFn`].
pub type ResolveFnInner = dyn Fn(&str) -> Result<Vec<IpAddr>, String> + Send + Sync;

impl fmt::Debug for ResolveFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResolveFn(..)")
    }
}

/// A name as the table keys it: lower case, without a trailing dot.
fn normalize_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::policy::SecretSpec;

    fn network(allow: &[&str]) -> NetworkPolicy {
        NetworkPolicy {
            mode: NetworkMode::Proxy,
            allow: allow.iter().map(|s| (*s).to_owned()).collect(),
            ..NetworkPolicy::default()
        }
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn job_allowlist_must_be_in_the_policy() {
        let net = network(&["pypi.org:443", "*.pythonhosted.org:443"]);
        let config = ProxyConfig::from_policy(&net, &strings(&["pypi.org:443"]), |_| None).unwrap();
        assert_eq!(config.allow().len(), 1);
        let err =
            ProxyConfig::from_policy(&net, &strings(&["evil.com:443"]), |_| None).unwrap_err();
        assert!(matches!(err, ProxyError::CheckAllowEntry { .. }), "{err}");
        let none = ProxyConfig::from_policy(&net, &[], |_| None).unwrap();
        assert!(none.allow().is_empty());
    }

    #[test]
    fn mode_none_is_refused() {
        let mut net = network(&[]);
        net.mode = NetworkMode::None;
        assert!(matches!(
            ProxyConfig::from_policy(&net, &[], |_| None),
            Err(ProxyError::CheckMode { .. })
        ));
    }

    #[test]
    fn numeric_entries_are_refused() {
        let net = network(&["2130706433:80"]);
        let err =
            ProxyConfig::from_policy(&net, &strings(&["2130706433:80"]), |_| None).unwrap_err();
        assert!(matches!(err, ProxyError::ParseAllowEntry { .. }), "{err}");
    }

    fn secret(placeholder: &str, value_env: &str, hosts: &[&str]) -> SecretSpec {
        SecretSpec {
            env: "API_TOKEN".into(),
            placeholder: placeholder.into(),
            value_env: value_env.into(),
            hosts: strings(hosts),
            substitute: vec![SubstitutePlace::Headers],
        }
    }

    #[test]
    fn secrets_read_their_value_and_never_print_it() {
        let mut net = network(&[]);
        net.secrets = vec![secret("airlock-placeholder-1", "REAL", &["api.test:80"])];
        let config = ProxyConfig::from_policy(&net, &[], |name| {
            (name == "REAL").then(|| "s3cr3t-value".to_owned())
        })
        .unwrap();
        assert_eq!(config.secrets()[0].value.expose(), "s3cr3t-value");
        let printed = format!("{config:?}");
        assert!(!printed.contains("s3cr3t-value"), "{printed}");
        assert!(printed.contains("redacted"), "{printed}");
    }

    #[test]
    fn unusable_secrets_are_errors_that_never_quote_the_value() {
        let mut net = network(&[]);
        net.secrets = vec![secret("airlock-placeholder-1", "REAL", &["api.test:80"])];
        assert!(matches!(
            ProxyConfig::from_policy(&net, &[], |_| None),
            Err(ProxyError::ReadSecretValue { .. })
        ));
        let err = ProxyConfig::from_policy(&net, &[], |_| Some("line\r\nInjected: 1".into()))
            .unwrap_err();
        assert!(matches!(err, ProxyError::CheckSecretValue { .. }));
        assert!(!err.to_string().contains("Injected"), "{err}");
        net.secrets
            .push(secret("airlock-placeholder-12", "OTHER", &["b.test"]));
        let err = ProxyConfig::from_policy(&net, &[], |_| Some("v".into())).unwrap_err();
        assert!(matches!(err, ProxyError::ParseSecret { .. }), "{err}");
    }
}
