//! airlock-redact replaces secret-shaped strings in job output with `[REDACTED:<rule id>]`
//! before the output reaches the agent: cloud keys, AI-provider and forge tokens, private key
//! blocks, JWTs, passwords in connection strings, and whatever the policy adds (extra regexes,
//! exact values). It owns the rules (data under `policy/redaction/`, embedded at build time),
//! their keyword prefilter, and the chunk-boundary handling of streams. It is pure: no I/O, no
//! `unsafe`, no logging (it sees secrets), and only the `regex` and `aho-corasick` crates'
//! linear-time engines, so every call is linear in its input. It must not decide what output is kept or how it is escaped: the caller
//! passes the already bounded, escaped text.
//!
//! # The dialect
//! Rules and the policy's extra regexes are compiled by the `regex` crate over bytes with
//! Unicode mode off: `\w`, `\d`, `\s`, `\b` and `(?i)` are ASCII-only, and every class or `.`
//! matches one byte (`(?u:...)` turns Unicode back on for a group). Unicode word boundaries
//! would make the lazy DFA give up on non-ASCII output and fall back to a slower engine.
//!
//! # Semantics
//! - Each rule replaces its `secret_group` (the whole match by default), and only when the
//!   secret's Shannon entropy reaches the rule's `entropy`, if it has one.
//! - Overlapping matches are merged: the union is replaced, so no fragment survives. The
//!   marker names the earliest match (ties: the longer, then the rule listed first).
//! - Markers are never rewritten, and a call re-scans its own output until nothing changes
//!   (at most [`MAX_PASSES`]), so redacting redacted text changes nothing.
//! - [`StreamRedactor`] catches a secret split across chunks; see its module docs for how much
//!   it holds back and why.
#![forbid(unsafe_code)]

mod entropy;
mod error;
mod prefilter;
mod redactor;
mod rules;
mod span;
mod stream;

pub use error::RedactError;
pub use redactor::{EXACT_MIN_BYTES, MAX_PASSES, Redacted, RedactionConfig, Redactor, RuleInfo};
pub use span::MARKER_PREFIX;
pub use stream::{
    STREAM_CONTEXT_BYTES, STREAM_HOLDBACK_BYTES, STREAM_MAX_PENDING_BYTES, STREAM_SCAN_STEP_BYTES,
    STREAM_TAIL_MARGIN_BYTES, StreamRedactor,
};
