//! Redaction of job output, built from the policy: the built-in rules, the policy's extra
//! regexes and exact values, the values of the executor's environment variables it names,
//! and the real values of the egress proxy's secrets (which a job must never see, even if
//! an upstream echoes them back).

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use airlock_core::capture::{StreamRenderer, cut_at_most};
use airlock_core::{OutputTap, Policy, StreamKind};
use airlock_redact::{RedactionConfig, Redactor, StreamRedactor};

/// A redactor being built in the background (compiling the rules takes tens of
/// milliseconds, which overlaps with the job instead of delaying it).
#[derive(Clone)]
pub struct PendingRedactor {
    cell: Arc<OnceLock<Result<&'static Redactor, String>>>,
}

impl std::fmt::Debug for PendingRedactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingRedactor")
            .field("ready", &self.cell.get().is_some())
            .finish()
    }
}

impl PendingRedactor {
    /// Starts building the redactor for `policy`.
    pub fn start(policy: &Policy) -> Self {
        let config = config_for(policy);
        let cell = Arc::new(OnceLock::new());
        let target = cell.clone();
        let build = move || {
            // Leaked on purpose: one redactor per engine, and engines live as long as the
            // process; streaming needs it for 'static output taps.
            let built = Redactor::new(&config)
                .map(|r| &*Box::leak(Box::new(r)))
                .map_err(|e| format!("redaction: {e}"));
            let _ = target.set(built);
        };
        if std::thread::Builder::new()
            .name("airlock-redact-build".into())
            .spawn(build.clone())
            .is_err()
        {
            build();
        }
        Self { cell }
    }

    /// The redactor, waiting for it to be built.
    pub fn get(&self) -> Result<&'static Redactor, String> {
        self.cell.wait().clone()
    }
}

/// The redaction configuration of a policy, with environment values resolved now.
fn config_for(policy: &Policy) -> RedactionConfig {
    let mut exact = policy.redaction.exact.clone();
    let env_names = policy
        .redaction
        .exact_env
        .iter()
        .chain(policy.network.secrets.iter().map(|s| &s.value_env));
    for name in env_names {
        if let Ok(value) = std::env::var(name)
            && value.len() >= airlock_redact::EXACT_MIN_BYTES
        {
            exact.push(value);
        }
    }
    RedactionConfig {
        builtin: policy.redaction.builtin,
        extra: policy.redaction.extra.clone(),
        exact,
    }
}

/// Per-stream state of streaming redaction: render, redact with a holdback, and stop at
/// the stream's cap.
pub struct StreamState {
    renderer: StreamRenderer,
    redactor: Option<StreamRedactor<'static>>,
    emitted: usize,
    cap: usize,
}

impl StreamState {
    /// A stream shown up to `cap` bytes.
    pub fn new(redactor: Option<&'static Redactor>, cap: usize) -> Self {
        Self {
            renderer: StreamRenderer::default(),
            redactor: redactor.map(Redactor::stream),
            emitted: 0,
            cap,
        }
    }

    /// The text to emit for a raw chunk (possibly empty: held back or past the cap).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        let text = self.renderer.push(bytes);
        let text = match &mut self.redactor {
            // Whole lines go out at once (a client watching a job sees its progress); a
            // token cut short by a read stays held back until it is complete.
            Some(r) => {
                let mut out = r.push(&text);
                out.push_str(&r.flush_idle());
                out
            }
            None => text,
        };
        self.limit(text)
    }

    /// The rest, at the end of the stream.
    pub fn finish(&mut self) -> String {
        let text = std::mem::take(&mut self.renderer).finish();
        let text = match &mut self.redactor {
            Some(r) => {
                let mut out = r.push(&text);
                out.push_str(&r.finish());
                out
            }
            None => text,
        };
        self.limit(text)
    }

    fn limit(&mut self, text: String) -> String {
        let room = self.cap.saturating_sub(self.emitted);
        if text.len() <= room {
            self.emitted += text.len();
            return text;
        }
        // The stream ends here: a later, shorter piece must not follow the gap of what
        // was cut (a marker or escape dropped whole).
        self.emitted = self.cap;
        text[..cut_at_most(&text, room)].to_owned()
    }
}

/// Streaming of one job's output to a sink: rendered, redacted, cut at the caps.
pub struct Streaming {
    sink: crate::OutputSink,
    pending: PendingRedactor,
    caps: [usize; 2],
    streams: Arc<Mutex<[Option<StreamState>; 2]>>,
}

impl Streaming {
    /// Streams to `sink`, showing at most `caps` bytes of stdout and stderr.
    pub fn new(sink: crate::OutputSink, pending: PendingRedactor, caps: [usize; 2]) -> Self {
        Self {
            sink,
            pending,
            caps,
            streams: Arc::new(Mutex::new([None, None])),
        }
    }

    fn emit(sink: &crate::OutputSink, kind: StreamKind, text: String) {
        if !text.is_empty() {
            sink(crate::OutputEvent { stream: kind, text });
        }
    }

    /// The backend's tap.
    pub fn tap(&self) -> OutputTap {
        let (sink, pending, caps, streams) = (
            self.sink.clone(),
            self.pending.clone(),
            self.caps,
            self.streams.clone(),
        );
        Arc::new(move |kind: StreamKind, bytes: &[u8]| {
            let index = stream_index(kind);
            let text = {
                let mut streams = streams.lock().unwrap_or_else(PoisonError::into_inner);
                let state = streams[index].get_or_insert_with(|| {
                    // Output is never streamed unredacted: a redactor that failed to build
                    // withholds the stream (the observation reports the error).
                    StreamState::new(pending.get().ok(), caps[index])
                });
                if state.redactor.is_none() {
                    return;
                }
                state.push(bytes)
            };
            Self::emit(&sink, kind, text);
        })
    }

    /// Emits what redaction held back, once the job is over.
    pub fn flush(&self) {
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        for (index, kind) in [(0, StreamKind::Stdout), (1, StreamKind::Stderr)] {
            if let Some(state) = streams[index].as_mut()
                && state.redactor.is_some()
            {
                let text = state.finish();
                Self::emit(&self.sink, kind, text);
            }
        }
    }
}

fn stream_index(kind: StreamKind) -> usize {
    match kind {
        StreamKind::Stdout => 0,
        StreamKind::Stderr => 1,
    }
}
