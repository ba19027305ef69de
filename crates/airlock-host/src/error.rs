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
    /// A session workspace could not be created, mounted or removed.
    #[error("session workspace {path}: {op}")]
    Workspace {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A path in a session workspace is refused or cannot be used.
    #[error("{path:?} in the session's /work: {reason}")]
    WorkspaceFile {
        /// The path relative to `/work`, as asked.
        path: String,
        /// Why.
        reason: String,
        /// What the error is to the caller.
        kind: ErrorKind,
    },
    /// No regular file at that path in a session workspace.
    #[error("{path:?}: no such file in the session's /work")]
    WorkspaceMissing {
        /// The path relative to `/work`, as asked.
        path: String,
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
            HostError::WorkspaceFile { kind, .. } => *kind,
            HostError::WorkspaceMissing { .. } => ErrorKind::InvalidInput,
            HostError::CreateJobDir { .. }
            | HostError::WriteInput { .. }
            | HostError::Workspace { .. } => ErrorKind::Internal,
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
