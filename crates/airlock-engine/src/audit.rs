//! The audit log: one JSON line per job, appended with a single write, optionally synced.
//! Kept apart from tracing so no log-level setting can drop a record.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use airlock_core::audit::AuditRecord;

use crate::error::EngineError;

/// An open audit log.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    fsync: bool,
    file: Mutex<File>,
}

impl AuditLog {
    /// Opens (creating if needed) the log for appending. Mode 0600: the log names tenants
    /// and hashes, which are nobody else's business.
    pub fn open(path: &Path, fsync: bool) -> Result<Self, EngineError> {
        let err = |source| EngineError::Audit {
            path: path.to_owned(),
            source,
        };
        if let Some(parent) = path.parent()
            && !parent.as_os_str().is_empty()
        {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(err)?;
        }
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)
            .map_err(err)?;
        Ok(Self {
            path: path.to_owned(),
            fsync,
            file: Mutex::new(file),
        })
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one job record.
    pub fn append(&self, record: &AuditRecord) -> Result<(), EngineError> {
        self.append_line(&record.to_json_line())
    }

    /// Appends one line (already JSON, newline-terminated).
    pub fn append_line(&self, line: &str) -> Result<(), EngineError> {
        let err = |source| EngineError::Audit {
            path: self.path.clone(),
            source,
        };
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // One write call with O_APPEND: lines from concurrent writers never interleave.
        file.write_all(line.as_bytes()).map_err(err)?;
        if self.fsync {
            file.sync_data().map_err(err)?;
        }
        Ok(())
    }
}
