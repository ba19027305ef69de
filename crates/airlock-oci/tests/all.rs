//! airlock-oci's integration tests, one binary (`tests/suite/`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
