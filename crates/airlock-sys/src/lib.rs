//! airlock-sys owns every `unsafe` block of airlock: small, documented wrappers over the
//! Linux syscalls the sandbox needs (fork, namespaces, mounts, fd passing, installing the
//! seccomp filters, network interfaces). The seccomp policy itself, and its compilation,
//! are data of the safe crate airlock-seccomp. It makes no policy decisions and holds no state: callers decide
//! what to do, this crate only does it soundly. Each unsafe block carries a `// SAFETY:`
//! comment. Calls that rustix already wraps safely (capabilities, uid switching, rlimits,
//! pivot_root, pidfds) are used from rustix directly by the callers.

pub mod mount;
pub mod net;
pub mod process;
pub mod seccomp;

#[cfg(feature = "probe")]
pub mod probe;
