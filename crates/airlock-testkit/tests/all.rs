//! The integration tests of airlock-testkit, in one binary.

#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
