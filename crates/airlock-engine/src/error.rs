//! The engine's error type.

use std::path::PathBuf;

/// What can go wrong around a job (not inside it).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The policy file cannot be read.
    #[error("read policy {path}")]
    ReadPolicy {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The policy file is invalid.
    #[error(transparent)]
    Policy(#[from] airlock_core::Error),
    /// The policy's redaction rules do not compile.
    #[error("policy {origin}: redaction")]
    Redaction {
        /// Where the policy came from.
        origin: String,
        /// The rule error (names the offending extra regex or exact value by index).
        source: Box<airlock_redact::RedactError>,
    },
    /// The audit log cannot be opened or written.
    #[error("audit log {path}")]
    Audit {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}
