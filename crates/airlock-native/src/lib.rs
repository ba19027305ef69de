//! airlock-native: the native Linux backend. The supervisor side (spawning the sandbox,
//! cgroup limits, wall-time kill, bounded capture, teardown) runs inside the async
//! executor; the sandbox side (namespaces, mounts, privilege drop, seccomp, exec) runs in a
//! freshly executed single-threaded helper ([`init::main`], built also as a small static
//! executable carried inside airlock: `init_program.rs`), never in the async process.
//! Every `unsafe` operation goes through airlock-sys.
#![forbid(unsafe_code)]

pub mod backend;
pub mod doctor;
mod elf;
mod error;
mod handoff;
mod helper;
pub mod init;
mod init_program;
pub mod minimal_root;
mod mount_plan;
pub mod plan;
/// See [`init_program::start_early`].
pub use init_program::start_early as start_making_init_early;
pub mod pool;
pub mod zygote;

pub use backend::{NativeBackend, NativeConfig};
pub use error::NativeError;
pub use pool::{NativeWarm, PoolConfig, PooledNative};
