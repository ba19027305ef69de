//! OpenTelemetry for airlock (issue 33): OTLP export of each job's span tree, of the
//! server's metrics and of the audit record as a log record, and the W3C context a caller
//! hands in (HTTP headers, an MCP request's `_meta`, the environment of `airlock run`).
//!
//! Export is on only when the standard `OTEL_EXPORTER_OTLP_*` variables or a policy's
//! `[telemetry]` section name an endpoint; otherwise nothing is built and every hook here
//! is one atomic load. Exporting runs on the SDK's own threads: a collector that is down
//! or slow never delays or fails a job. This crate never sees source, stdin, output or
//! file contents: the hooks take sizes, counts, ids and outcomes only.
#![forbid(unsafe_code)]

mod caller;
mod error;
mod job;
mod metrics;
mod operation;
mod setup;

pub use caller::{Caller, TOOL_CALL_ID_HEADER, carry, current_caller, with_caller};
pub use error::TelemetryError;
pub use job::{
    JobFacts, Phases, emit_audit_record, finish_job_span, job_teardown_span, start_job_span,
};
pub use metrics::register_openmetrics_source;
pub use opentelemetry::KeyValue;
pub use operation::Operation;
pub use setup::{Settings, Telemetry, enabled};
