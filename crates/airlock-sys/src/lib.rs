//! airlock-sys owns every `unsafe` block of airlock: small, documented wrappers over the
//! Linux syscalls the sandbox needs (fork, namespaces, mounts, capabilities, rlimits,
//! seccomp, pidfds). It makes no policy decisions and holds no state: callers decide what to
//! do, this crate only does it safely. Each unsafe block carries a `// SAFETY:` comment.

pub mod seccomp;

#[cfg(feature = "probe")]
pub mod probe;
