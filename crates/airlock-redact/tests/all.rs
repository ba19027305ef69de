#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The integration binary of airlock-redact: every rule kind on realistic output, a corpus of
//! ordinary output that must stay untouched, streams split at every point, properties
//! (idempotence, no fragment survives), policy values, and hostile inputs.

mod suite;
