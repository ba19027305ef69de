//! A job's span tree: the `execute_tool run_code` span (a `tracing` span of the engine's,
//! bridged), its phase children built from the times the backend reports, one span per
//! egress request from the proxy's records, and the audit record as a log record.
//!
//! Only ids, sizes, counts, outcomes and limits go out: never source, stdin, output or
//! file contents, and never an egress request's path.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, Severity};
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use airlock_core::Acquire;
use airlock_core::audit::AuditRecord;
use airlock_core::observation::Observation;
use airlock_core::policy::Limits;

use crate::setup::active;

/// What the engine knows of a job besides its observation.
#[derive(Debug, Clone, Copy, Default)]
pub struct JobFacts<'a> {
    /// The effective limits, once the request passed the policy.
    pub limits: Option<&'a Limits>,
    /// The egress proxy's records (proxy mode), one per request or tunnel.
    pub connections: &'a [serde_json::Value],
}

/// When each phase of a job happened, as far as the engine knows.
#[derive(Debug, Clone, Copy)]
pub struct Phases {
    /// When the engine received the job.
    pub received: SystemTime,
    /// Sandbox construction before the program started (the backend's figure).
    pub setup: Duration,
    /// The program's wall time (the backend's figure).
    pub run: Duration,
    /// How the job got its sandbox: a warm one, one forked for it, or built fresh.
    pub acquire: Acquire,
    /// Rendering the observation: capture caps, redaction of output and `/out` files.
    pub output: Option<(SystemTime, SystemTime)>,
}

/// The span name the GenAI conventions give a tool execution: `execute_tool {tool}`.
pub const JOB_SPAN_NAME: &str = "execute_tool run_code";

/// Makes `span` (the engine's job span, declared with empty `otel.name` and `otel.kind`
/// fields) the `execute_tool run_code` span, continuing the current caller's trace and
/// naming its tool call. Call right after creating the span, before it is entered.
pub fn start_job_span(span: &tracing::Span) {
    if active().is_none() {
        return;
    }
    span.record("otel.name", JOB_SPAN_NAME);
    span.record("otel.kind", "internal");
    span.set_attribute("gen_ai.operation.name", "execute_tool");
    span.set_attribute("gen_ai.tool.name", "run_code");
    if let Some(caller) = crate::caller::current_caller() {
        if caller.context.span().span_context().is_valid() {
            let _ = span.set_parent(caller.context.clone());
        }
        if let Some(id) = caller.tool_call_id {
            span.set_attribute("gen_ai.tool.call.id", id);
        }
        if let Some(id) = caller.session_id {
            span.set_attribute("airlock.session.id", id);
        }
    }
}

/// Records the job's outcome on `span` and emits its phase and egress children.
pub fn finish_job_span(
    span: &tracing::Span,
    observation: &Observation,
    facts: JobFacts<'_>,
    phases: Option<Phases>,
) {
    let Some(active) = active() else {
        return;
    };
    for kv in job_attributes(observation, facts.limits) {
        span.set_attribute(kv.key, kv.value);
    }
    if let Some(error) = &observation.error {
        span.set_attribute("error.type", error.kind.to_string());
        span.set_status(Status::error(error.kind.to_string()));
    }
    let parent = span.context();
    if !parent.span().span_context().is_valid() {
        return;
    }
    let caller = crate::caller::current_caller();
    if let Some((entered, admitted)) = caller.as_ref().and_then(|c| c.queued) {
        child(active, &parent, "queue wait", entered, admitted, Vec::new());
    }
    if let Some(phases) = phases {
        span.set_attribute("airlock.acquire", phases.acquire.as_str());
        let acquired = phases.received + phases.setup;
        child(
            active,
            &parent,
            "sandbox acquire",
            phases.received,
            acquired,
            vec![
                KeyValue::new("airlock.sandbox.setup_ms", millis(phases.setup)),
                KeyValue::new("airlock.acquire", phases.acquire.as_str()),
            ],
        );
        let ran = acquired + phases.run;
        child(
            active,
            &parent,
            "run",
            acquired,
            ran,
            vec![
                KeyValue::new(
                    "airlock.exit_code",
                    i64::from(observation.exit_code.unwrap_or(-1)),
                ),
                KeyValue::new("airlock.outcome", observation.outcome.as_str()),
            ],
        );
        if let Some((start, end)) = phases.output {
            child(
                active,
                &parent,
                "output",
                start,
                end,
                vec![
                    KeyValue::new(
                        "airlock.output.stdout_bytes",
                        observation.stdout_bytes as i64,
                    ),
                    KeyValue::new(
                        "airlock.output.stderr_bytes",
                        observation.stderr_bytes as i64,
                    ),
                    KeyValue::new("airlock.output.redactions", observation.redactions as i64),
                    KeyValue::new("airlock.out.files_released", observation.files.len() as i64),
                    KeyValue::new(
                        "airlock.out.files_rejected",
                        observation.rejected_files.len() as i64,
                    ),
                ],
            );
        }
        for record in facts.connections {
            egress_span(active, &parent, acquired, record);
        }
    }
}

/// The span the sandbox's removal after the reply logs in. Export off: the job's own span,
/// as ever. Export on: a `job` span of its own (so its log lines still read
/// `job{job_id=…}`), exported as `sandbox teardown`, a root linked to the job's span: it
/// outlives the job's span.
pub fn job_teardown_span(job_span: &tracing::Span, job_id: &str) -> tracing::Span {
    if active().is_none() {
        return job_span.clone();
    }
    let span = tracing::info_span!(
        target: "airlock_telemetry",
        parent: None,
        "job",
        job_id = %job_id,
        otel.name = "sandbox teardown",
        otel.kind = "internal",
    );
    span.set_attribute("airlock.job.id", job_id.to_owned());
    span.follows_from(job_span);
    span
}

/// The audit record as a log record with the same fields, in the job span's trace.
pub fn emit_audit_record(record: &AuditRecord, span: &tracing::Span) {
    let Some(active) = active() else {
        return;
    };
    let mut log = active.logger.create_log_record();
    log.set_event_name("airlock.audit.job");
    log.set_timestamp(SystemTime::now());
    log.set_severity_number(Severity::Info);
    log.set_severity_text("INFO");
    log.set_body(AnyValue::from("job"));
    if let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(record) {
        for (key, value) in fields {
            log.add_attribute(format!("airlock.{key}"), any_value(value));
        }
    }
    let context = span.context();
    let span_context = context.span().span_context().clone();
    if span_context.is_valid() {
        log.set_trace_context(
            span_context.trace_id(),
            span_context.span_id(),
            Some(span_context.trace_flags()),
        );
    }
    active.logger.emit(log);
}

fn any_value(value: serde_json::Value) -> AnyValue {
    match value {
        serde_json::Value::Null => AnyValue::from(""),
        serde_json::Value::Bool(b) => AnyValue::from(b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => AnyValue::from(i),
            None => AnyValue::from(n.as_f64().unwrap_or_default()),
        },
        serde_json::Value::String(s) => AnyValue::from(s),
        // Nested values (limits, network counts) as their JSON text: the same fields.
        other => AnyValue::from(other.to_string()),
    }
}

fn job_attributes(observation: &Observation, limits: Option<&Limits>) -> Vec<KeyValue> {
    let mut attributes = vec![
        KeyValue::new("airlock.job.id", observation.job_id.as_str().to_owned()),
        KeyValue::new("airlock.backend", observation.backend.to_string()),
        KeyValue::new("airlock.outcome", observation.outcome.as_str()),
        KeyValue::new("airlock.policy.version", observation.policy_version.clone()),
        KeyValue::new("airlock.stdout.bytes", observation.stdout_bytes as i64),
        KeyValue::new("airlock.stderr.bytes", observation.stderr_bytes as i64),
        KeyValue::new("airlock.stdout.truncated", observation.stdout_truncated),
        KeyValue::new("airlock.stderr.truncated", observation.stderr_truncated),
        KeyValue::new("airlock.redactions", observation.redactions as i64),
        KeyValue::new("airlock.duration_ms", observation.duration_ms as i64),
        KeyValue::new("airlock.out.files_released", observation.files.len() as i64),
    ];
    if let Some(code) = observation.exit_code {
        attributes.push(KeyValue::new("airlock.exit_code", i64::from(code)));
    }
    if let Some(signal) = &observation.signal {
        attributes.push(KeyValue::new("airlock.signal", signal.clone()));
    }
    if let Some(digest) = &observation.image_digest {
        attributes.push(KeyValue::new("airlock.image.digest", digest.clone()));
    }
    if let Some(cpu) = observation.cpu_ms {
        attributes.push(KeyValue::new("airlock.cpu_ms", cpu as i64));
    }
    if let Some(peak) = observation.peak_memory_bytes {
        attributes.push(KeyValue::new("airlock.peak_memory_bytes", peak as i64));
    }
    if !observation.degraded.is_empty() {
        attributes.push(KeyValue::new(
            "airlock.degraded",
            opentelemetry::Value::Array(
                observation
                    .degraded
                    .iter()
                    .map(|d| opentelemetry::StringValue::from(d.clone()))
                    .collect::<Vec<_>>()
                    .into(),
            ),
        ));
    }
    if let Some(network) = &observation.network
        && let Ok(serde_json::Value::Object(counts)) = serde_json::to_value(network)
    {
        for (key, value) in counts {
            if let Some(n) = value.as_i64() {
                attributes.push(KeyValue::new(format!("airlock.network.{key}"), n));
            }
        }
    }
    if let Some(limits) = limits
        && let Ok(serde_json::Value::Object(values)) = serde_json::to_value(limits)
    {
        for (key, value) in values {
            let value = match value {
                serde_json::Value::Number(n) => match n.as_i64() {
                    Some(i) => opentelemetry::Value::I64(i),
                    None => opentelemetry::Value::F64(n.as_f64().unwrap_or_default()),
                },
                serde_json::Value::String(s) => opentelemetry::Value::String(s.into()),
                serde_json::Value::Bool(b) => opentelemetry::Value::Bool(b),
                other => opentelemetry::Value::String(other.to_string().into()),
            };
            attributes.push(KeyValue::new(format!("airlock.limits.{key}"), value));
        }
    }
    attributes
}

fn child(
    active: &crate::setup::Active,
    parent: &Context,
    name: &'static str,
    start: SystemTime,
    end: SystemTime,
    attributes: Vec<KeyValue>,
) {
    let mut span = active
        .tracer
        .span_builder(Cow::Borrowed(name))
        .with_kind(SpanKind::Internal)
        .with_start_time(start)
        .with_attributes(attributes)
        .start_with_context(&active.tracer, parent);
    span.end_with_timestamp(end.max(start));
}

/// One egress request or tunnel: host, port, the verdict and its reason, bytes, secrets
/// scrubbed. Its start is the proxy's offset from the sandbox's start (approximate: the
/// proxy starts with the sandbox).
fn egress_span(
    active: &crate::setup::Active,
    parent: &Context,
    sandbox_started: SystemTime,
    record: &serde_json::Value,
) {
    let text = |k: &str| {
        record
            .get(k)
            .and_then(serde_json::Value::as_str)
            .unwrap_or("")
    };
    let number = |k: &str| {
        record
            .get(k)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    };
    let method = text("method");
    let verdict = text("verdict");
    let name = if method == "CONNECT" {
        "egress CONNECT".to_owned()
    } else {
        format!(
            "egress {}",
            if method.is_empty() { "request" } else { "HTTP" }
        )
    };
    let mut attributes = vec![
        KeyValue::new("server.address", text("host").to_owned()),
        KeyValue::new("server.port", number("port") as i64),
        KeyValue::new("http.request.method", method.to_owned()),
        KeyValue::new("airlock.egress.verdict", verdict.to_owned()),
        KeyValue::new("airlock.egress.bytes_up", number("bytes_up") as i64),
        KeyValue::new("airlock.egress.bytes_down", number("bytes_down") as i64),
        KeyValue::new(
            "airlock.egress.secrets_scrubbed",
            number("secrets_scrubbed") as i64,
        ),
        KeyValue::new(
            "airlock.egress.secrets_substituted",
            number("secrets_substituted") as i64,
        ),
        KeyValue::new(
            "airlock.egress.unbound_placeholders",
            record
                .get("unbound_placeholders")
                .and_then(serde_json::Value::as_array)
                .map_or(0, Vec::len) as i64,
        ),
        KeyValue::new(
            "airlock.egress.intercepted",
            record
                .get("intercepted")
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(false),
        ),
    ];
    if let Some(status) = record.get("status").and_then(serde_json::Value::as_u64) {
        attributes.push(KeyValue::new("http.response.status_code", status as i64));
    }
    let reason = text("reason");
    if !reason.is_empty() {
        attributes.push(KeyValue::new("airlock.egress.reason", reason.to_owned()));
    }
    if let Some(limit) = record.get("limit").and_then(serde_json::Value::as_str) {
        attributes.push(KeyValue::new("airlock.egress.limit", limit.to_owned()));
    }
    let start = sandbox_started + Duration::from_millis(number("started_ms"));
    let end = start + Duration::from_millis(number("duration_ms"));
    let mut span = active
        .tracer
        .span_builder(name)
        .with_kind(SpanKind::Client)
        .with_start_time(start)
        .with_attributes(attributes)
        .start_with_context(&active.tracer, parent);
    if verdict == "denied" {
        span.set_status(Status::error(
            if reason.is_empty() { "denied" } else { reason }.to_owned(),
        ));
    }
    span.end_with_timestamp(end);
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
