//! airlock-conformance holds no code: its integration tests (`tests/all.rs`) are one suite
//! of hostile and faulty jobs run against every backend the host offers, through the real
//! `airlock` binary. It must never be a dependency of anything.
#![forbid(unsafe_code)]
