//! `[limits]`: resource defaults and ceilings, and their checks against [`super::bounds`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::bounds;
use crate::units::{ByteSize, Cpus, duration_serde};

/// Resource limits. In a policy each value is both the default and the ceiling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Wall time from the moment the program starts.
    #[serde(with = "duration_serde")]
    pub timeout: Duration,
    /// Memory (RAM, no swap), page cache and `/tmp` included.
    pub memory: ByteSize,
    /// CPU share.
    pub cpus: Cpus,
    /// Processes and threads.
    pub pids: u32,
    /// Size of the `/tmp` tmpfs.
    pub tmp: ByteSize,
    /// Bytes of stdout kept and returned.
    pub stdout: ByteSize,
    /// Bytes of stderr kept and returned.
    pub stderr: ByteSize,
    /// Total output after which the job is killed as `output_limit`.
    pub flood: ByteSize,
    /// Largest source.
    pub source: ByteSize,
    /// Largest total of input files and stdin.
    pub files: ByteSize,
    /// Most input files.
    pub input_files: u32,
    /// Open file descriptors per process (RLIMIT_NOFILE).
    pub open_files: u32,
    /// Largest file a process may write (RLIMIT_FSIZE).
    pub file_size: ByteSize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(5),
            memory: ByteSize::mib(256),
            cpus: Cpus::from_millis(500),
            pids: 64,
            tmp: ByteSize::mib(16),
            stdout: ByteSize::bytes(8000),
            stderr: ByteSize::bytes(2000),
            flood: ByteSize::mib(64),
            source: ByteSize::mib(1),
            files: ByteSize::mib(16),
            input_files: 64,
            open_files: 256,
            file_size: ByteSize::mib(64),
        }
    }
}

impl Limits {
    /// Checks the limits against [`bounds`] and each other; returns the field name and
    /// reason.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        self.check_bounds()?;
        let kept = self.stdout.as_u64() + self.stderr.as_u64();
        if self.flood.as_u64() < kept {
            return Err((
                "flood",
                format!(
                    "{} is less than stdout + stderr kept ({})",
                    self.flood,
                    ByteSize::bytes(kept)
                ),
            ));
        }
        Ok(())
    }

    /// Checks each value against [`bounds`]; returns the field name and reason.
    pub(crate) fn check_bounds(&self) -> Result<(), (&'static str, String)> {
        use bounds::*;
        check_timeout(self.timeout).map_err(|r| ("timeout", r))?;
        check_memory(self.memory).map_err(|r| ("memory", r))?;
        check_cpus(self.cpus).map_err(|r| ("cpus", r))?;
        check_pids(self.pids).map_err(|r| ("pids", r))?;
        in_range(self.tmp.as_u64(), TMP_MIN_BYTES, TMP_MAX_BYTES).map_err(|r| ("tmp", r))?;
        in_range(self.stdout.as_u64(), 0, STREAM_KEEP_MAX_BYTES).map_err(|r| ("stdout", r))?;
        in_range(self.stderr.as_u64(), 0, STREAM_KEEP_MAX_BYTES).map_err(|r| ("stderr", r))?;
        in_range(self.flood.as_u64(), 1, u64::MAX).map_err(|r| ("flood", r))?;
        in_range(self.source.as_u64(), 1, SOURCE_MAX_BYTES).map_err(|r| ("source", r))?;
        in_range(self.files.as_u64(), 0, FILES_MAX_BYTES).map_err(|r| ("files", r))?;
        in_range(u64::from(self.input_files), 0, INPUT_FILES_MAX_COUNT as u64)
            .map_err(|r| ("input_files", r))?;
        in_range(
            u64::from(self.open_files),
            u64::from(OPEN_FILES_MIN),
            u64::from(OPEN_FILES_MAX),
        )
        .map_err(|r| ("open_files", r))?;
        in_range(self.file_size.as_u64(), 1, u64::MAX).map_err(|r| ("file_size", r))?;
        Ok(())
    }
}

fn in_range(value: u64, min: u64, max: u64) -> Result<(), String> {
    if value < min {
        Err(format!("{value} is below the minimum {min}"))
    } else if value > max {
        Err(format!("{value} is above the maximum {max}"))
    } else {
        Ok(())
    }
}

pub(crate) fn check_timeout(value: Duration) -> Result<(), String> {
    if value < bounds::TIMEOUT_MIN || value > bounds::TIMEOUT_MAX {
        return Err(format!(
            "{} is outside {}..{}",
            crate::units::format_duration(value),
            crate::units::format_duration(bounds::TIMEOUT_MIN),
            crate::units::format_duration(bounds::TIMEOUT_MAX)
        ));
    }
    Ok(())
}

pub(crate) fn check_memory(value: ByteSize) -> Result<(), String> {
    if value.as_u64() < bounds::MEMORY_MIN_BYTES || value.as_u64() > bounds::MEMORY_MAX_BYTES {
        return Err(format!(
            "{value} is outside {}..{}",
            ByteSize::bytes(bounds::MEMORY_MIN_BYTES),
            ByteSize::bytes(bounds::MEMORY_MAX_BYTES)
        ));
    }
    Ok(())
}

pub(crate) fn check_cpus(value: Cpus) -> Result<(), String> {
    if value.millis() < bounds::CPUS_MIN_MILLIS || value.millis() > bounds::CPUS_MAX_MILLIS {
        return Err(format!(
            "{value} is outside {}..{}",
            Cpus::from_millis(bounds::CPUS_MIN_MILLIS),
            Cpus::from_millis(bounds::CPUS_MAX_MILLIS)
        ));
    }
    Ok(())
}

pub(crate) fn check_pids(value: u32) -> Result<(), String> {
    if value == 0 || value > bounds::PIDS_MAX {
        return Err(format!("{value} is outside 1..{}", bounds::PIDS_MAX));
    }
    Ok(())
}
