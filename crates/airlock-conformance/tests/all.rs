#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The conformance suite: one set of hostile and faulty jobs, run through the real
//! `airlock` binary against every backend the host offers. Each check is one test per
//! backend, named `suite::<area>::<backend>::<check>`, so one backend's run is
//! `cargo nextest run -p airlock-conformance -E 'test(/::docker::/)'`. The `kube` backend's
//! run needs the fake cluster running (`scripts/ci/kube.sh` starts it and runs
//! `-E 'test(/::kube::/)'`).

mod suite;
