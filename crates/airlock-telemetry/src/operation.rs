//! Spans of the operations a door performs around jobs: a session's call, an E2B command
//! (envd's `process.Start`) or code cell (the code interpreter's `/execute`). Each is a
//! span in the caller's trace, and the job it runs (if any) is its child.
//!
//! Like the job's, these carry ids, counts and outcomes, never a command's or a cell's
//! text. With export off nothing is built: [`Operation::start`] is one atomic load.

use std::borrow::Cow;

use opentelemetry::trace::{SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue};

use airlock_core::Observation;

use crate::caller::Caller;
use crate::setup::active;

/// One operation's span, ended by [`Operation::end`] (or when dropped).
#[derive(Debug, Default)]
pub struct Operation {
    /// The context holding the span; `None` when export is off.
    context: Option<Context>,
}

impl Operation {
    /// Starts `name`'s span as a child of `parent`'s trace context (a new trace when it
    /// has none), with `attributes`.
    pub fn start(name: &'static str, parent: &Caller, attributes: Vec<KeyValue>) -> Self {
        let Some(active) = active() else {
            return Self::default();
        };
        let span = active
            .tracer
            .span_builder(Cow::Borrowed(name))
            .with_kind(SpanKind::Internal)
            .with_attributes(attributes)
            .start_with_context(&active.tracer, &parent.context);
        Self {
            context: Some(parent.context.with_span(span)),
        }
    }

    /// `caller` with this span as its trace context, so that a job run under it is its
    /// child; `caller` unchanged when export is off.
    pub fn child_caller(&self, mut caller: Caller) -> Caller {
        if let Some(context) = &self.context {
            caller.context = context.clone();
        }
        caller
    }

    /// Adds an attribute.
    pub fn set(&self, attribute: KeyValue) {
        if let Some(context) = &self.context {
            context.span().set_attribute(attribute);
        }
    }

    /// Marks the operation failed: `error.type` and an error status.
    pub fn fail(&self, error_type: &str) {
        if let Some(context) = &self.context {
            let span = context.span();
            span.set_attribute(KeyValue::new("error.type", error_type.to_owned()));
            span.set_status(Status::error(error_type.to_owned()));
        }
    }

    /// Records the job `observation` it ran: its id, outcome and exit code, and its error
    /// kind as `error.type` when it did not run.
    pub fn record_job(&self, observation: &Observation) {
        if self.context.is_none() {
            return;
        }
        self.set(KeyValue::new(
            "airlock.job.id",
            observation.job_id.as_str().to_owned(),
        ));
        self.set(KeyValue::new(
            "airlock.outcome",
            observation.outcome.as_str(),
        ));
        if let Some(code) = observation.exit_code {
            self.set(KeyValue::new("airlock.exit_code", i64::from(code)));
        }
        if let Some(error) = &observation.error {
            self.fail(&error.kind.to_string());
        }
    }

    /// Ends the span now.
    pub fn end(self) {
        if let Some(context) = &self.context {
            context.span().end();
        }
    }
}
