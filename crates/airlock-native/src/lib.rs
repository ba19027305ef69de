//! airlock-native: the native Linux backend. The supervisor side (spawning the sandbox,
//! cgroup limits, wall-time kill, bounded capture, teardown) runs inside the async
//! executor; the sandbox side (namespaces, mounts, privilege drop, seccomp, exec) runs in a
//! freshly executed single-threaded helper ([`init::main`], of the airlock-init crate, built
//! also as a small static executable carried inside airlock: `init_program.rs`), never in
//! the async process.
//! Every `unsafe` operation goes through airlock-sys.
#![forbid(unsafe_code)]

pub mod backend;
pub mod doctor;
mod elf;
mod error;
mod handoff;
mod helper;
mod host_checks;
mod init_program;
mod launch;
pub mod minimal_root;
mod mount_plan;
/// See [`init_program::start_early`].
pub use init_program::start_early as start_making_init_early;
pub mod pool;
pub mod provider;
mod supervise;
mod sweep;
mod teardown;
pub mod zygote;

// The init and its plan live in airlock-init (also built as the static init executable);
// here under their former paths, which the supervisor's modules and the CLI use.
pub use airlock_init::{init, plan};

pub use backend::{NativeBackend, NativeConfig};
pub use error::NativeError;
pub use pool::{NativeWarm, PoolConfig, PooledNative};
pub use provider::NativeProvider;
