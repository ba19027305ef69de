//! airlock-host's error type.

use std::path::PathBuf;

use airlock_core::{BackendError, ErrorKind};

/// What can go wrong preparing a job's directories on the host.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// Creating the job directory failed.
    #[error("create job directory {path}")]
    CreateJobDir {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Writing an input file failed.
    #[error("write {path}")]
    WriteInput {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The runtime directory is unsafe or unusable.
    #[error("runtime directory {path}: {reason}")]
    RuntimeDir {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

impl HostError {
    /// The public kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            HostError::RuntimeDir { .. } => ErrorKind::BackendUnavailable,
            HostError::CreateJobDir { .. } | HostError::WriteInput { .. } => ErrorKind::Internal,
        }
    }
}

impl From<HostError> for BackendError {
    fn from(err: HostError) -> Self {
        let kind = err.kind();
        // The full chain, since error sources carry the OS reason.
        let mut message = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        BackendError::new(kind, message)
    }
}
