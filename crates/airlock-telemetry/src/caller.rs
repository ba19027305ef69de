//! The caller's side of a job: the W3C trace context it handed in and its tool call id,
//! carried from the door (HTTP handler, MCP call, `airlock run`) to the engine in a task
//! local, so no request type changes for telemetry.

use std::collections::HashMap;
use std::future::Future;
use std::time::SystemTime;

use opentelemetry::propagation::{Extractor, TextMapCompositePropagator, TextMapPropagator as _};
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};

/// The HTTP header a caller names its tool call with (`gen_ai.tool.call.id`).
pub const TOOL_CALL_ID_HEADER: &str = "airlock-tool-call-id";

/// Longest tool call id kept; a longer one is cut (it is the caller's text).
const MAX_TOOL_CALL_ID_BYTES: usize = 256;

/// The W3C carrier keys read, in every door.
const CARRIER_KEYS: [&str; 3] = ["traceparent", "tracestate", "baggage"];

/// Who asked for a job, as telemetry sees it.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    /// The caller's trace context (empty when none came, or it was malformed).
    pub context: opentelemetry::Context,
    /// `gen_ai.tool.call.id`: an MCP request id, or the HTTP header's value.
    pub tool_call_id: Option<String>,
    /// When the job entered admission and when it got its slot (the server's doors).
    pub queued: Option<(SystemTime, SystemTime)>,
    /// `airlock.session.id`, for a session's call.
    pub session_id: Option<String>,
}

struct MapCarrier<'a>(&'a HashMap<String, String>);

impl Extractor for MapCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

impl Caller {
    /// A caller from W3C carrier values, looked up by lower-case key (`traceparent`,
    /// `tracestate`, `baggage`): HTTP headers, `_meta` members, environment variables.
    /// Free when export is off: nothing is parsed.
    pub fn from_carrier(lookup: impl Fn(&str) -> Option<String>) -> Self {
        if crate::setup::active().is_none() {
            return Self::default();
        }
        let values: HashMap<String, String> = CARRIER_KEYS
            .iter()
            .filter_map(|k| lookup(k).map(|v| ((*k).to_owned(), v)))
            .collect();
        if values.is_empty() {
            return Self::default();
        }
        let propagator = TextMapCompositePropagator::new(vec![
            Box::new(TraceContextPropagator::new()),
            Box::new(BaggagePropagator::new()),
        ]);
        Self {
            context: propagator.extract(&MapCarrier(&values)),
            ..Self::default()
        }
    }

    /// Sets the tool call id, cut to a bounded length.
    pub fn with_tool_call_id(mut self, id: Option<String>) -> Self {
        self.tool_call_id = id.map(|mut id| {
            if id.len() > MAX_TOOL_CALL_ID_BYTES {
                let mut end = MAX_TOOL_CALL_ID_BYTES;
                while !id.is_char_boundary(end) {
                    end -= 1;
                }
                id.truncate(end);
            }
            id
        });
        self
    }
}

tokio::task_local! {
    static CALLER: Caller;
}

/// Runs `future` with `caller` as the current caller.
pub fn with_caller<F: Future>(caller: Caller, future: F) -> impl Future<Output = F::Output> {
    CALLER.scope(caller, future)
}

/// `future` with the current caller (if any) carried into it: wrap a future handed to
/// `tokio::spawn`, which would otherwise lose it.
pub fn carry<F: Future>(future: F) -> impl Future<Output = F::Output> {
    CALLER.scope(current_caller().unwrap_or_default(), future)
}

/// The current caller, when a door set one.
pub fn current_caller() -> Option<Caller> {
    CALLER.try_with(Caller::clone).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_tool_call_id_is_cut_on_a_character_boundary() {
        let id = format!("{}é", "a".repeat(MAX_TOOL_CALL_ID_BYTES - 1));
        let caller = Caller::default().with_tool_call_id(Some(id));
        let kept = caller.tool_call_id.unwrap();
        assert_eq!(kept, "a".repeat(MAX_TOOL_CALL_ID_BYTES - 1));
    }

    #[tokio::test]
    async fn the_caller_is_carried_into_a_spawned_task() {
        let caller = Caller::default().with_tool_call_id(Some("call_1".to_owned()));
        let seen = with_caller(caller, async {
            tokio::spawn(carry(async { current_caller() }))
                .await
                .unwrap()
        })
        .await;
        assert_eq!(seen.unwrap().tool_call_id.as_deref(), Some("call_1"));
        assert!(current_caller().is_none());
    }
}
