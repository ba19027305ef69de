//! What the proxy reports: one [`ConnectionRecord`] per request or tunnel, allowed or
//! denied, and a [`ProxySummary`] when it stops. Both serialize for the audit log.

use std::fmt;
use std::net::IpAddr;

use serde::Serialize;

/// The policy decision on one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// The target passed every check; the proxy dialled it (see `error` for how that went).
    Allowed,
    /// The proxy refused before dialling anything; or, for a request body carrying a
    /// secret's real value toward a host outside its scope, cut the body off before the
    /// value went out (then `resolved` and `bytes_up` show what was sent before).
    Denied {
        /// A short reason, also sent to the job in the refusal's body.
        reason: String,
    },
}

/// A limit of the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// Requests and tunnels over the proxy's life (`network.limits.connections`).
    Connections,
    /// Bytes exchanged with upstreams, both directions (`network.limits.bytes`).
    Bytes,
    /// Resolving and connecting to an upstream (`network.limits.connect_timeout`).
    ConnectTimeout,
    /// No traffic on a connection (`network.limits.idle_timeout`).
    IdleTimeout,
    /// The request line and headers ([`MAX_REQUEST_HEAD_BYTES`](crate::MAX_REQUEST_HEAD_BYTES)).
    RequestHeadSize,
}

impl fmt::Display for LimitKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LimitKind::Connections => "connection limit",
            LimitKind::Bytes => "byte limit",
            LimitKind::ConnectTimeout => "connect timeout",
            LimitKind::IdleTimeout => "idle timeout",
            LimitKind::RequestHeadSize => "request header size limit",
        })
    }
}

/// One request (plain HTTP) or tunnel (CONNECT), for the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConnectionRecord {
    /// `CONNECT`, `GET`, ...; empty when the request could not be parsed.
    pub method: String,
    /// The target host as normalized (or as sent, when it was refused as malformed).
    pub host: String,
    /// The target port (0 when unknown).
    pub port: u16,
    /// The address the proxy connected to (pinned: the one it checked).
    pub resolved: Option<IpAddr>,
    /// Allowed or denied, with the reason.
    #[serde(flatten)]
    pub verdict: Verdict,
    /// The HTTP status the job got: the proxy's own (200 for an open tunnel, 403, 502,
    /// ...), or the upstream's for a forwarded request.
    pub status: Option<u16>,
    /// Why an allowed connection failed or ended early, if it did.
    pub error: Option<String>,
    /// The limit that refused or ended this connection, if one did.
    pub limit: Option<LimitKind>,
    /// Bytes sent to the upstream.
    pub bytes_up: u64,
    /// Bytes received from the upstream.
    pub bytes_down: u64,
    /// When the request arrived, in milliseconds since the proxy started.
    pub started_ms: u64,
    /// How long it lasted, in milliseconds.
    pub duration_ms: u64,
    /// Set only on the one record that stands for the requests refused once the
    /// connection limit was used up: how many there were.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<u64>,
    /// How many times the real value of a secret (or one of its encodings) was replaced
    /// by its placeholder in this response's headers and body.
    #[serde(skip_serializing_if = "is_zero")]
    pub secrets_scrubbed: u64,
    /// How many placeholders of secrets were replaced by their real values in this
    /// request (header values, query, body). The count only, never a value.
    #[serde(skip_serializing_if = "is_zero")]
    pub secrets_substituted: u64,
    /// Set on a tunnel whose TLS the proxy terminated (a secret's host, a package index or
    /// a host it named), and on each request made inside it (those are records of their
    /// own; their bytes count in the tunnel's record).
    #[serde(skip_serializing_if = "is_false")]
    pub intercepted: bool,
    /// The request's path (without the query), on requests to a package index and to the
    /// hosts it named: what was fetched. At most [`RECORD_PATH_MAX_BYTES`] bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The job-side variables (`env`) of the secrets whose placeholder this request carried
    /// toward a host outside their scope: sent on unchanged, and listed here.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unbound_placeholders: Vec<String>,
}

/// Longest path kept in a record, in bytes.
pub const RECORD_PATH_MAX_BYTES: usize = 1024;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl ConnectionRecord {
    pub(crate) fn new(method: String, started_ms: u64) -> Self {
        Self {
            method,
            host: String::new(),
            port: 0,
            resolved: None,
            verdict: Verdict::Allowed,
            status: None,
            error: None,
            limit: None,
            bytes_up: 0,
            bytes_down: 0,
            started_ms,
            duration_ms: 0,
            refused: None,
            secrets_scrubbed: 0,
            secrets_substituted: 0,
            intercepted: false,
            path: None,
            unbound_placeholders: Vec::new(),
        }
    }
}

/// What happened over the proxy's life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct ProxySummary {
    /// Every request and tunnel, in the order they ended.
    pub connections: Vec<ConnectionRecord>,
    /// Requests refused after the connection limit was reached; they have no record of
    /// their own, so that the records stay bounded: the audit gets one record with their
    /// number ([`ProxySummary::into_report`]).
    pub refused_after_limit: u64,
    /// Connects attempted to upstream addresses.
    pub upstream_connects: u64,
    /// Bytes sent to upstreams.
    pub bytes_up: u64,
    /// Bytes received from upstreams.
    pub bytes_down: u64,
    /// The first limit of the proxy as a whole (connections or bytes) that was reached.
    pub limit_hit: Option<LimitKind>,
}

impl ProxySummary {
    /// The observation's totals and the audit records (one per request or tunnel).
    pub fn into_report(self) -> airlock_core::observation::NetworkReport {
        let (allowed, denied) = self.counts();
        airlock_core::observation::NetworkReport {
            counts: airlock_core::observation::NetworkCounts {
                connections: (allowed + denied) as u64 + self.refused_after_limit,
                denied: denied as u64 + self.refused_after_limit,
                bytes_up: self.bytes_up,
                bytes_down: self.bytes_down,
                limit_hit: self.limit_hit.map(|l| l.to_string()),
                secrets_substituted: self.connections.iter().map(|r| r.secrets_substituted).sum(),
                secrets_scrubbed: self.connections.iter().map(|r| r.secrets_scrubbed).sum(),
            },
            connections: self
                .connections
                .iter()
                .filter_map(|record| serde_json::to_value(record).ok())
                .chain(self.refused_after_limit_record())
                .collect(),
        }
    }

    /// The audit record of the requests refused once the connection limit was used up:
    /// one record for all of them, with their number, so that a job opening connections
    /// in a loop cannot grow the audit log without bound, and none goes unaudited.
    fn refused_after_limit_record(&self) -> Option<serde_json::Value> {
        if self.refused_after_limit == 0 {
            return None;
        }
        let mut record = ConnectionRecord::new(String::new(), 0);
        record.verdict = Verdict::Denied {
            reason: LimitKind::Connections.to_string(),
        };
        record.status = Some(429);
        record.limit = Some(LimitKind::Connections);
        record.refused = Some(self.refused_after_limit);
        serde_json::to_value(record).ok()
    }

    /// The number of allowed and denied records.
    pub fn counts(&self) -> (usize, usize) {
        let allowed = self
            .connections
            .iter()
            .filter(|r| r.verdict == Verdict::Allowed)
            .count();
        (allowed, self.connections.len() - allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_serialize_flat_for_the_audit_log() {
        let mut record = ConnectionRecord::new("CONNECT".to_owned(), 12);
        record.host = "metadata.test".to_owned();
        record.port = 443;
        record.verdict = Verdict::Denied {
            reason: "169.254.169.254 is in blocked range 169.254.0.0/16".to_owned(),
        };
        record.status = Some(403);
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "method": "CONNECT",
                "host": "metadata.test",
                "port": 443,
                "resolved": null,
                "verdict": "denied",
                "reason": "169.254.169.254 is in blocked range 169.254.0.0/16",
                "status": 403,
                "error": null,
                "limit": null,
                "bytes_up": 0,
                "bytes_down": 0,
                "started_ms": 12,
                "duration_ms": 0,
            })
        );
        record.verdict = Verdict::Allowed;
        record.limit = Some(LimitKind::IdleTimeout);
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["verdict"], "allowed");
        assert_eq!(json["limit"], "idle_timeout");
        assert!(json.get("reason").is_none());
    }
}
