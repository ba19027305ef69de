#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! Integration tests of `airlock serve` and `airlock mcp`: the real `airlock` binary (it
//! re-executes itself as the sandbox init, so the server cannot run inside the test
//! process), the real native backend, real HTTP on 127.0.0.1.
//!
//! The binary is found next to the test executable (`target/<profile>/airlock`) or at
//! `$AIRLOCK_BIN`. Cargo does not build another crate's binary for these tests: run
//! `cargo build -p airlock-cli` first (`cargo nextest run --workspace` does it).

mod suite;
