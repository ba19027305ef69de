//! Errors of setting telemetry up.

/// Telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// An OTLP exporter could not be built (a malformed endpoint or header).
    #[error("building the OTLP {signal} exporter")]
    BuildExporter {
        /// `traces`, `metrics` or `logs`.
        signal: &'static str,
        /// Why.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` asks for a transport this build does not have.
    #[error(
        "OTEL_EXPORTER_OTLP_PROTOCOL={0:?} is not supported: airlock exports OTLP over HTTP (http/protobuf)"
    )]
    UnsupportedProtocol(String),
}
