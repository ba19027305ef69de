//! Errors of the testkit library.

use std::path::PathBuf;

/// What went wrong reading `/proc` files or finding the probe.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field the report needs is not in `/proc/self/status`.
    #[error("/proc/self/status has no {field} field")]
    StatusFieldMissing {
        /// The field's name.
        field: &'static str,
    },
    /// A field of `/proc/self/status` does not parse.
    #[error("/proc/self/status field {field} is not valid: {value:?}")]
    StatusFieldInvalid {
        /// The field's name.
        field: &'static str,
        /// Its value.
        value: String,
    },
    /// A line of `/proc/self/mountinfo` does not parse.
    #[error("mountinfo line does not parse: {line:?}")]
    MountInfoLine {
        /// The line.
        line: String,
    },
    /// The probe binary is not where [`crate::probe_path`] looked.
    #[error(
        "airlock-probe not found at {path}; build it first: cargo build -p airlock-testkit --bin airlock-probe (or set AIRLOCK_PROBE)"
    )]
    ProbeNotBuilt {
        /// Where it was expected.
        path: PathBuf,
    },
}
