//! Building the three OTLP pipelines (traces, metrics, logs) from the standard variables,
//! and the process-wide handles the job hooks use.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::logs::SdkLoggerProvider;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;

use crate::error::TelemetryError;

/// The instrumentation scope of everything airlock exports.
pub(crate) const SCOPE: &str = "airlock";

/// The variables that turn export on (any one of them).
const ENDPOINT_VARS: [&str; 4] = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
];

/// How long shutting down waits for the last batches to go out: a collector that never
/// answers must not hold the process's exit longer than this.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(3);

/// What a policy's `[telemetry]` section may set; the standard variables win over it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// The OTLP/HTTP base URL (`http://collector:4318`); the signal paths (`/v1/traces`,
    /// …) are appended, as for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: Option<String>,
    /// `service.name`, when `OTEL_SERVICE_NAME` is unset.
    pub service_name: Option<String>,
}

/// The handles the job hooks use, set once when export is on.
pub(crate) struct Active {
    pub(crate) tracer: opentelemetry_sdk::trace::SdkTracer,
    pub(crate) logger: opentelemetry_sdk::logs::SdkLogger,
    pub(crate) meters: SdkMeterProvider,
}

static ACTIVE: OnceLock<Active> = OnceLock::new();

/// The export handles, or `None` when export is off (one atomic load).
pub(crate) fn active() -> Option<&'static Active> {
    ACTIVE.get()
}

/// Whether the environment asks for export: an OTLP endpoint variable is set and
/// `OTEL_SDK_DISABLED` is not `true`.
pub fn enabled(settings: &Settings) -> bool {
    if std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return false;
    }
    settings.endpoint.is_some() || ENDPOINT_VARS.iter().any(|v| env_set(v))
}

fn env_set(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.trim().is_empty())
}

/// The running exporters; [`Telemetry::shutdown`] flushes them.
pub struct Telemetry {
    tracers: SdkTracerProvider,
    meters: SdkMeterProvider,
    loggers: SdkLoggerProvider,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

impl Telemetry {
    /// Starts export when [`enabled`]; `Ok(None)` otherwise. Call once, before the job
    /// path runs; `service` names the command (`airlock serve`, …) in the resource.
    pub fn start(settings: &Settings, command: &str) -> Result<Option<Self>, TelemetryError> {
        if !enabled(settings) {
            return Ok(None);
        }
        for var in [
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
            "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL",
        ] {
            if let Ok(protocol) = std::env::var(var)
                && !protocol.trim().is_empty()
                && protocol.trim() != "http/protobuf"
            {
                return Err(TelemetryError::UnsupportedProtocol(protocol));
            }
        }
        let mut resource = Resource::builder()
            .with_attribute(KeyValue::new("process.command", command.to_owned()))
            .with_attribute(KeyValue::new(
                "service.version",
                env!("CARGO_PKG_VERSION").to_owned(),
            ));
        // The SDK's detectors read OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the
        // policy's name applies only where neither names the service.
        if !env_set("OTEL_SERVICE_NAME") {
            let from_attributes = std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| {
                a.split(',')
                    .any(|kv| kv.trim().starts_with("service.name="))
            });
            if !from_attributes {
                resource = resource.with_service_name(
                    settings
                        .service_name
                        .clone()
                        .unwrap_or_else(|| "airlock".to_owned()),
                );
            }
        }
        let resource = resource.build();
        let endpoint = |path: &str, var: &str| -> Option<String> {
            if env_set(var) || env_set("OTEL_EXPORTER_OTLP_ENDPOINT") {
                return None;
            }
            settings
                .endpoint
                .as_ref()
                .map(|base| format!("{}/{path}", base.trim_end_matches('/')))
        };

        let mut spans = opentelemetry_otlp::SpanExporter::builder().with_http();
        if let Some(url) = endpoint("v1/traces", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            spans = spans.with_endpoint(url);
        }
        let spans = spans
            .build()
            .map_err(|source| TelemetryError::BuildExporter {
                signal: "traces",
                source,
            })?;
        let mut metrics = opentelemetry_otlp::MetricExporter::builder().with_http();
        if let Some(url) = endpoint("v1/metrics", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") {
            metrics = metrics.with_endpoint(url);
        }
        let metrics = metrics
            .build()
            .map_err(|source| TelemetryError::BuildExporter {
                signal: "metrics",
                source,
            })?;
        let mut logs = opentelemetry_otlp::LogExporter::builder().with_http();
        if let Some(url) = endpoint("v1/logs", "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT") {
            logs = logs.with_endpoint(url);
        }
        let logs = logs
            .build()
            .map_err(|source| TelemetryError::BuildExporter {
                signal: "logs",
                source,
            })?;

        // Batching processors and the periodic reader export from threads of their own,
        // with bounded queues that drop when full: a job only ever enqueues.
        let tracers = SdkTracerProvider::builder()
            .with_resource(resource.clone())
            .with_batch_exporter(spans)
            .build();
        let meters = SdkMeterProvider::builder()
            .with_resource(resource.clone())
            .with_reader(PeriodicReader::builder(metrics).build())
            .build();
        let loggers = SdkLoggerProvider::builder()
            .with_resource(resource)
            .with_batch_exporter(logs)
            .build();
        let tracer = tracers.tracer(SCOPE);
        let logger = opentelemetry::logs::LoggerProvider::logger(&loggers, SCOPE);
        // A second start in one process keeps the first's handles.
        let _ = ACTIVE.set(Active {
            tracer,
            logger,
            meters: meters.clone(),
        });
        Ok(Some(Self {
            tracers,
            meters,
            loggers,
        }))
    }

    /// The `tracing` layer that makes the engine's job span (and only spans of airlock's
    /// engine and this crate: not every HTTP request or log line) an OpenTelemetry span.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        use tracing_subscriber::Layer as _;
        tracing_opentelemetry::layer()
            .with_tracer(self.tracers.tracer(SCOPE))
            .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                meta.is_span()
                    && (meta.target().starts_with("airlock_engine")
                        || meta.target().starts_with("airlock_telemetry"))
            }))
    }

    /// Flushes and stops the exporters, waiting at most a few seconds for each.
    pub fn shutdown(self) {
        let _ = self.tracers.shutdown_with_timeout(SHUTDOWN_TIMEOUT);
        let _ = self.meters.shutdown_with_timeout(SHUTDOWN_TIMEOUT);
        let _ = self.loggers.shutdown_with_timeout(SHUTDOWN_TIMEOUT);
    }
}
