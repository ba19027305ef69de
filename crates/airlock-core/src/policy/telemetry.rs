//! `[telemetry]`: where OpenTelemetry export goes when the standard `OTEL_*` variables do
//! not say (docs/telemetry.md). Absent, export is off unless those variables turn it on.

use serde::{Deserialize, Serialize};

/// OTLP export of traces, metrics and the audit record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryPolicy {
    /// The collector's OTLP/HTTP base URL (`http://127.0.0.1:4318`); the signal paths are
    /// appended. `OTEL_EXPORTER_OTLP_ENDPOINT` and the per-signal variables win over it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// `service.name`, when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES`
    /// names the service (default `airlock`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
}

/// Longest endpoint or service name accepted.
const TELEMETRY_TEXT_MAX_BYTES: usize = 2048;

impl TelemetryPolicy {
    /// Checks the endpoint's scheme and the lengths; returns the field name and reason.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        if let Some(endpoint) = &self.endpoint {
            let scheme_ok = endpoint.starts_with("http://") || endpoint.starts_with("https://");
            if !scheme_ok || endpoint.len() > TELEMETRY_TEXT_MAX_BYTES {
                return Err((
                    "endpoint",
                    format!(
                        "must be an http:// or https:// URL of at most {TELEMETRY_TEXT_MAX_BYTES} bytes (OTLP over HTTP)"
                    ),
                ));
            }
        }
        if let Some(name) = &self.service_name
            && (name.trim().is_empty() || name.len() > TELEMETRY_TEXT_MAX_BYTES)
        {
            return Err((
                "service_name",
                format!("must be 1-{TELEMETRY_TEXT_MAX_BYTES} bytes"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::Policy;

    #[test]
    fn telemetry_section_parses_renders_and_rejects_other_schemes() {
        let p = Policy::from_toml(
            "version = \"t\"\n[telemetry]\nendpoint = \"http://127.0.0.1:4318\"\nservice_name = \"sandbox\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(
            p.telemetry.endpoint.as_deref(),
            Some("http://127.0.0.1:4318")
        );
        assert_eq!(Policy::from_toml(&p.to_toml(), "t").unwrap(), p);
        let e = Policy::from_toml(
            "version = \"t\"\n[telemetry]\nendpoint = \"grpc://collector:4317\"\n",
            "t",
        )
        .unwrap_err();
        assert!(e.to_string().contains("telemetry.endpoint"), "{e}");
        assert!(Policy::from_toml("version = \"t\"\n[telemetry]\nsampler = 1\n", "t").is_err());
    }
}
