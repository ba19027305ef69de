//! airlock-init: the sandbox init, the fresh single-threaded process that builds a native
//! sandbox from its plan and runs the job ([`init::main`]), and the plan itself
//! ([`plan::SandboxPlan`], the events the init reports), which the supervisor in
//! airlock-native writes and the init reads.
//!
//! A library crate of its own so that the security-critical code shows in the dependency
//! graph and is checked as a crate: two programs run it, built from this one source, so the
//! sandbox is the same step by step whichever builds it:
//! - this package's `airlock-init` executable, small and statically linked, which
//!   airlock-native's `build.rs` builds and the airlock binary carries and executes from a
//!   sealed memfd (`crates/airlock-native/src/init_program.rs`);
//! - the airlock binary itself, re-executed with [`plan::INIT_ARG`], where the kernel refuses
//!   to execute a memfd.
//!
//! Every dependency here is compiled a second time, statically, for that executable: keep
//! them few. No `unsafe` here either: that lives in airlock-sys.
#![forbid(unsafe_code)]

pub mod init;
pub mod plan;
