//! `[audit]`: where the audit log is written.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditPolicy {
    /// The JSONL file. A relative path is resolved against the policy file's directory,
    /// or for the built-in policy against airlock's state directory.
    pub path: PathBuf,
    /// Whether each line is flushed to disk (fdatasync) before the job's result is returned.
    pub fsync: bool,
}

impl Default for AuditPolicy {
    fn default() -> Self {
        Self {
            path: PathBuf::from("audit.jsonl"),
            fsync: true,
        }
    }
}

impl AuditPolicy {
    /// Checks the log path; returns the field name and reason.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        if self.path.as_os_str().is_empty() {
            return Err(("path", "must not be empty".to_owned()));
        }
        Ok(())
    }
}
