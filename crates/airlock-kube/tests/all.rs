//! airlock-kube's integration tests: generated objects (invariants, property tests, the
//! Pod Security profile, golden manifests), the wrapper run by a real shell, and the
//! protocol against a mocked API server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
