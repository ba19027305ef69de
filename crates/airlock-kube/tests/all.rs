//! airlock-kube's integration tests: generated objects (invariants, property tests, the
//! Pod Security profile, golden manifests), the wrapper run by a real shell, the protocol
//! against a mocked API server, and `airlock kube install`, `airlock doctor` and the
//! janitor against the fake API server (`airlock_testkit::fake_cluster`, through
//! `suite/fake.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
