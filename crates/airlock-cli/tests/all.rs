#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End-to-end tests of the `airlock` binary against the real native sandbox.
//! One integration binary per crate; the cases live in `suite/`.

mod suite;
