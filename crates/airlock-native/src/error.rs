//! The native backend's error type.

use std::path::PathBuf;

use airlock_core::{BackendError, ErrorKind};

/// What can go wrong on the supervisor side of the native backend.
#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    /// The host lacks a control the sandbox needs.
    #[error("{control}: {reason}")]
    Unsupported {
        /// The missing control, e.g. "cgroup".
        control: &'static str,
        /// Why, and how to fix it.
        reason: String,
    },
    /// The job asks for something this backend does not offer yet.
    #[error("{feature} is not available on the native backend: {reason}")]
    FeatureUnavailable {
        /// The feature.
        feature: &'static str,
        /// Why.
        reason: String,
    },
    /// Preparing the job's directories on the host failed.
    #[error(transparent)]
    Host(#[from] airlock_host::HostError),
    /// Setting up the cgroup failed.
    #[error("cgroup")]
    Cgroup(#[from] airlock_cgroup::CgroupError),
    /// Reading the rootfs failed.
    #[error("rootfs {path}")]
    Rootfs {
        /// The rootfs path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Compiling the seccomp policy failed.
    #[error("seccomp policy")]
    Seccomp(#[from] airlock_seccomp::SeccompError),
    /// Starting the sandbox helper failed.
    #[error("start sandbox helper {path}")]
    SpawnHelper {
        /// The helper binary.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Talking to the sandbox helper failed.
    #[error("sandbox helper: {0}")]
    Helper(String),
    /// A sandbox setup step failed.
    #[error("sandbox setup failed at {step}: {detail}")]
    Setup {
        /// The step.
        step: String,
        /// The OS error number.
        errno: Option<i32>,
        /// The explanation.
        detail: String,
    },
    /// Preparing the minimal host root (`rootfs = "host"`) failed.
    #[error("minimal host root: {step} {path}")]
    MinimalRoot {
        /// What was being done.
        step: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A warm pool's zygote could not start, or could not fork a child.
    #[error("zygote: {step}: {detail}")]
    Zygote {
        /// What was being done.
        step: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// The interpreter is not in the rootfs.
    #[error("{detail} (is the language installed in this rootfs?)")]
    InterpreterMissing {
        /// The explanation.
        detail: String,
    },
}

impl NativeError {
    /// The public kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            NativeError::Unsupported { .. }
            | NativeError::FeatureUnavailable { .. }
            | NativeError::Rootfs { .. }
            | NativeError::MinimalRoot { .. } => ErrorKind::BackendUnavailable,
            NativeError::InterpreterMissing { .. } => ErrorKind::InvalidInput,
            NativeError::Host(e) => e.kind(),
            NativeError::Cgroup(_)
            | NativeError::Seccomp(_)
            | NativeError::SpawnHelper { .. }
            | NativeError::Helper(_)
            | NativeError::Zygote { .. }
            | NativeError::Setup { .. } => ErrorKind::Internal,
        }
    }
}

impl From<NativeError> for BackendError {
    fn from(err: NativeError) -> Self {
        let kind = err.kind();
        // The full chain, since error sources carry the OS reason.
        BackendError::new(kind, airlock_core::error::chain(&err))
    }
}
