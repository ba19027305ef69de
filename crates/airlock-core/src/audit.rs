//! The audit record (DESIGN S9): one JSON line per job, with the sha256 of the source but
//! never the source, its input or its output.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::backend::BackendKind;
use crate::error::ErrorKind;
use crate::job::JobId;
use crate::observation::{Observation, Outcome};
use crate::policy::{Limits, NetworkMode};

/// One line of the audit log for a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Always `"job"` (connection lines say `"connection"`).
    pub event: String,
    /// When the job was received (RFC 3339, UTC, milliseconds).
    pub time: String,
    /// The job's id.
    pub job_id: JobId,
    /// The backend.
    pub backend: BackendKind,
    /// The image digest, when the rootfs is an image.
    pub image_digest: Option<String>,
    /// The policy version.
    pub policy_version: String,
    /// The tenant, when the job came through the server.
    pub tenant: Option<String>,
    /// The language.
    pub language: Option<String>,
    /// `sha256:` of the source.
    pub source_sha256: Option<String>,
    /// Size of the source.
    pub source_bytes: u64,
    /// Number of input files.
    pub input_files: u64,
    /// Effective limits.
    pub limits: Option<Limits>,
    /// Network mode.
    pub network: Option<NetworkMode>,
    /// How the job ended.
    pub outcome: Outcome,
    /// The error kind, for `outcome = error`.
    pub error_kind: Option<ErrorKind>,
    /// Exit code.
    pub exit_code: Option<i32>,
    /// Signal name.
    pub signal: Option<String>,
    /// Bytes written to stdout.
    pub stdout_bytes: u64,
    /// Bytes written to stderr.
    pub stderr_bytes: u64,
    /// Whether stdout was cut.
    pub stdout_truncated: bool,
    /// Whether stderr was cut.
    pub stderr_truncated: bool,
    /// Redactions made (output and released files).
    pub redactions: u64,
    /// Files released from `/out`.
    pub files_released: u64,
    /// Files of `/out` not released.
    pub files_rejected: u64,
    /// Requests and tunnels through the egress proxy (proxy mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_usage: Option<crate::observation::NetworkCounts>,
    /// The program's wall time.
    pub duration_ms: u64,
    /// Sandbox construction before the program started.
    pub setup_ms: u64,
    /// From receiving the job to its result, teardown included.
    pub total_ms: u64,
    /// CPU time.
    pub cpu_ms: Option<u64>,
    /// Peak memory.
    pub peak_memory_bytes: Option<u64>,
    /// Controls that held only in a weaker form the policy accepted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub degraded: Vec<String>,
    /// Set on the line a later start of airlock wrote for a job whose process died (a
    /// server killed, a crash) after it accepted the job and before its result: the job's
    /// end is unknown, its sandbox was removed by the sweep.
    #[serde(default, skip_serializing_if = "is_false")]
    pub interrupted: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// What the engine knows about a job besides its observation.
#[derive(Debug, Clone, Default)]
pub struct AuditContext {
    /// When the job was received.
    pub received_at: Option<SystemTime>,
    /// The tenant.
    pub tenant: Option<String>,
    /// The language.
    pub language: Option<String>,
    /// `sha256:` of the source.
    pub source_sha256: Option<String>,
    /// Size of the source.
    pub source_bytes: u64,
    /// Number of input files.
    pub input_files: u64,
    /// Effective limits.
    pub limits: Option<Limits>,
    /// Network mode.
    pub network: Option<NetworkMode>,
    /// Sandbox setup time.
    pub setup: Duration,
    /// Total time.
    pub total: Duration,
}

impl AuditRecord {
    /// Builds the record of a finished (or refused) job.
    pub fn new(context: AuditContext, observation: &Observation) -> Self {
        let received = context.received_at.unwrap_or(UNIX_EPOCH);
        Self {
            event: "job".to_owned(),
            time: format_rfc3339_millis(received),
            job_id: observation.job_id.clone(),
            backend: observation.backend,
            image_digest: observation.image_digest.clone(),
            policy_version: observation.policy_version.clone(),
            tenant: context.tenant,
            language: context.language,
            source_sha256: context.source_sha256,
            source_bytes: context.source_bytes,
            input_files: context.input_files,
            limits: context.limits,
            network: context.network,
            outcome: observation.outcome,
            error_kind: observation.error.as_ref().map(|e| e.kind),
            exit_code: observation.exit_code,
            signal: observation.signal.clone(),
            stdout_bytes: observation.stdout_bytes,
            stderr_bytes: observation.stderr_bytes,
            stdout_truncated: observation.stdout_truncated,
            stderr_truncated: observation.stderr_truncated,
            redactions: observation.redactions,
            files_released: observation.files.len() as u64,
            files_rejected: observation.rejected_files.len() as u64,
            network_usage: observation.network.clone(),
            duration_ms: observation.duration_ms,
            setup_ms: millis(context.setup),
            total_ms: millis(context.total),
            cpu_ms: observation.cpu_ms,
            peak_memory_bytes: observation.peak_memory_bytes,
            degraded: observation.degraded.clone(),
            interrupted: false,
        }
    }

    /// The record as one JSON line, newline included.
    pub fn to_json_line(&self) -> String {
        let mut line = serde_json::to_string(self).unwrap_or_else(|e| {
            format!(
                "{{\"job_id\":{:?},\"audit_error\":{:?}}}",
                self.job_id.as_str(),
                e.to_string()
            )
        });
        line.push('\n');
        line
    }
}

/// The audit line of one egress-proxy connection: `{"event":"connection","time":…,
/// "job_id":…, <the proxy's record>}`.
pub fn connection_line(job_id: &JobId, record: &serde_json::Value) -> String {
    let mut line = serde_json::Map::new();
    line.insert("event".into(), "connection".into());
    line.insert(
        "time".into(),
        format_rfc3339_millis(SystemTime::now()).into(),
    );
    line.insert("job_id".into(), job_id.as_str().into());
    if let serde_json::Value::Object(fields) = record {
        for (key, value) in fields {
            line.entry(key.clone()).or_insert_with(|| value.clone());
        }
    }
    let mut text = serde_json::Value::Object(line).to_string();
    text.push('\n');
    text
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Formats a time as `2026-11-29T11:24:03.123Z`.
pub fn format_rfc3339_millis(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day), after Howard Hinnant's algorithm.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observation::Observation;
    use pretty_assertions::assert_eq;

    #[test]
    fn rfc3339_formatting() {
        assert_eq!(
            format_rfc3339_millis(UNIX_EPOCH),
            "1970-01-01T00:00:00.000Z"
        );
        let t = UNIX_EPOCH + Duration::from_millis(1_795_951_443_123);
        assert_eq!(format_rfc3339_millis(t), "2026-11-29T11:24:03.123Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(format_rfc3339_millis(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn audit_line_holds_the_hash_never_the_source() {
        let obs = Observation::error(
            JobId::generate(),
            BackendKind::Native,
            "default-1",
            ErrorKind::PolicyDenied,
            "no",
        );
        let record = AuditRecord::new(
            AuditContext {
                source_sha256: Some("sha256:abc".into()),
                source_bytes: 9,
                ..Default::default()
            },
            &obs,
        );
        let line = record.to_json_line();
        assert!(line.ends_with('\n'));
        assert_eq!(line.matches('\n').count(), 1);
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["source_sha256"], "sha256:abc");
        assert_eq!(value["outcome"], "error");
        assert_eq!(value["error_kind"], "policy_denied");
        assert!(value.get("source").is_none());
        assert!(value.get("stdout").is_none());
    }
}
