//! The probe's report: what a job could see and do. The probe binary writes one as a single
//! JSON object; tests read it back with [`ProbeReport::from_json`] and judge it. The probe
//! itself judges nothing.

use std::collections::BTreeMap;

use airlock_sys::probe::{Attempt, DangerousCall};
use serde::{Deserialize, Serialize};

use crate::names::{errno_name, signal_name};

/// Version of the report's shape; bumped on any change that old readers would misread.
pub const REPORT_VERSION: u32 = 1;

/// Everything the probe found out, one field per area.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeReport {
    /// [`REPORT_VERSION`] of the probe that wrote this report.
    pub version: u32,
    /// Who and where the probe is.
    pub identity: Identity,
    /// Capabilities and hardening from `/proc/self/status`; `None` when unreadable.
    pub status: Option<ProcStatus>,
    /// Mount checks keyed by path (`/`, `/work`, `/tmp`, `/proc`, `/dev`, `/usr`, `/etc`).
    pub mounts: BTreeMap<String, MountCheck>,
    /// Creating a file in each directory (`/`, `/work`, `/usr`, `/etc`, `/tmp`, `/dev`):
    /// `ok` (the file was removed again) or the errno.
    pub writes: BTreeMap<String, Outcome>,
    /// Writing an executable script to `/tmp` and running it.
    pub tmp_exec: TmpExec,
    /// Filling `/tmp` (only with `--fill-tmp`).
    pub fill_tmp: Option<FillTmp>,
    /// Network interfaces and the canary connection.
    pub network: Network,
    /// Host paths that must (not) be visible.
    pub paths: Paths,
    /// Every environment variable, name to value (lossy UTF-8).
    pub env: BTreeMap<String, String>,
    /// Each [`DangerousCall`] by its [`DangerousCall::name`].
    pub syscalls: BTreeMap<String, Outcome>,
    /// Resource limits.
    pub rlimits: Rlimits,
    /// Things the probe could not do cleanly (a file it could not remove, a file it could
    /// not read), in plain words.
    pub notes: Vec<String>,
}

impl ProbeReport {
    /// Parses a report as the probe prints it.
    pub fn from_json(json: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json)
    }

    /// The report as one line of JSON.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }

    /// The outcome of one dangerous call, if the probe tried it.
    pub fn syscall(&self, call: DangerousCall) -> Option<&Outcome> {
        self.syscalls.get(call.name())
    }
}

/// How a syscall, file operation or connection ended.
///
/// In JSON: `{"ok": 3}`, `{"errno": "EPERM"}`, `{"signal": "SIGSYS"}`, `{"error": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It worked; the value is the syscall's return value, the number of bytes written or
    /// an exit code, as the field says (0 where there is nothing to say).
    Ok(i64),
    /// It failed with this errno (`"EPERM"`).
    Errno(String),
    /// The process that tried it was killed by this signal (`"SIGSYS"`).
    Signal(String),
    /// The probe could not make the attempt, or it failed without an errno.
    Error(String),
}

impl Outcome {
    /// `Errno` with the given name: `Outcome::errno("EPERM")`.
    pub fn errno(name: &str) -> Self {
        Self::Errno(name.to_owned())
    }

    /// Whether it worked.
    pub fn is_ok(&self) -> bool {
        matches!(self, Self::Ok(_))
    }

    /// The errno name, if it failed with one.
    pub fn errno_name(&self) -> Option<&str> {
        match self {
            Self::Errno(name) => Some(name),
            Self::Ok(_) | Self::Signal(_) | Self::Error(_) => None,
        }
    }

    /// From an I/O error: its errno if it has one, else its message.
    pub fn from_io_error(error: &std::io::Error) -> Self {
        match error.raw_os_error() {
            Some(errno) => Self::Errno(errno_name(errno)),
            None if error.kind() == std::io::ErrorKind::TimedOut => Self::errno("ETIMEDOUT"),
            None => Self::Error(error.to_string()),
        }
    }
}

impl From<Attempt> for Outcome {
    fn from(attempt: Attempt) -> Self {
        match attempt {
            Attempt::Returned(value) => Self::Ok(value),
            Attempt::Failed(errno) => Self::Errno(errno_name(errno.raw_os_error())),
            Attempt::Killed(signal) => Self::Signal(signal_name(signal)),
            Attempt::TimedOut => Self::Error("attempt timed out".to_owned()),
            Attempt::Harness { step, errno } => Self::Error(format!(
                "probe could not {step}: {}",
                errno_name(errno.raw_os_error())
            )),
        }
    }
}

/// Who and where the probe is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    /// Real user id.
    pub uid: u32,
    /// Real group id.
    pub gid: u32,
    /// Effective user id.
    pub euid: u32,
    /// Effective group id.
    pub egid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// The probe's pid as it sees it.
    pub pid: i32,
    /// The parent's pid; 0 when the parent is outside the probe's pid namespace.
    pub ppid: i32,
    /// `uname` node name.
    pub hostname: String,
    /// Numeric entries in `/proc` (processes visible); `None` when `/proc` is unreadable.
    pub visible_processes: Option<usize>,
}

/// Capability sets and hardening flags from `/proc/self/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcStatus {
    /// `CapInh`.
    pub cap_inh: u64,
    /// `CapPrm`.
    pub cap_prm: u64,
    /// `CapEff`.
    pub cap_eff: u64,
    /// `CapBnd`.
    pub cap_bnd: u64,
    /// `CapAmb`.
    pub cap_amb: u64,
    /// `NoNewPrivs`.
    pub no_new_privs: bool,
    /// `Seccomp`: 0 none, 1 strict, 2 filter.
    pub seccomp: u8,
    /// `Seccomp_filters`: number of filters installed (Linux 5.9+; `None` before).
    pub seccomp_filters: Option<u32>,
}

/// One path's mount as the probe sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountCheck {
    /// Whether the path exists (`stat` succeeds).
    pub exists: bool,
    /// `ST_RDONLY` from `statvfs`; `None` when `statvfs` fails.
    pub read_only: Option<bool>,
    /// `ST_NOEXEC`.
    pub noexec: Option<bool>,
    /// `ST_NOSUID`.
    pub nosuid: Option<bool>,
    /// `ST_NODEV`.
    pub nodev: Option<bool>,
    /// Filesystem type of the mount holding the path, from `/proc/self/mountinfo`.
    pub fs_type: Option<String>,
    /// Mount point of that mount.
    pub mount_point: Option<String>,
    /// Its mount source (device or pseudo name).
    pub source: Option<String>,
}

/// Writing a `#!/bin/sh` script to `/tmp` with mode 0755 and executing it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TmpExec {
    /// Writing the script: `ok` or the errno.
    pub write: Outcome,
    /// Executing it: `ok` with the exit code, or the errno (`EACCES` on a noexec mount;
    /// `ENOENT` when it was executable but `/bin/sh` is missing). `None` if the write failed.
    pub exec: Option<Outcome>,
}

/// Writing 1 MiB chunks to a file in `/tmp` until an error (or the probe's own cap).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FillTmp {
    /// Bytes written before the error.
    pub bytes_written: u64,
    /// The error that stopped it (`ENOSPC`, `EFBIG`, ...); `None` when the probe stopped at
    /// its cap without an error.
    pub error: Option<Outcome>,
    /// The cap, in bytes.
    pub cap_bytes: u64,
}

/// What the network looks like.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    /// Interface names from `/proc/net/dev`; `None` when unreadable.
    pub interfaces: Option<Vec<String>>,
    /// The `--canary` connection, if one was asked for.
    pub canary: Option<Canary>,
}

/// A TCP connection attempt to the `--canary HOST:PORT` address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Canary {
    /// The address as given.
    pub target: String,
    /// `ok` (connected) or the errno (`ENETUNREACH`, `ECONNREFUSED`, `ETIMEDOUT`, ...).
    pub result: Outcome,
}

/// Host paths the sandbox should (not) show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Paths {
    /// Whether each path exists (`lstat` succeeds).
    pub exists: BTreeMap<String, bool>,
    /// Lines in `/etc/passwd`; `None` when unreadable.
    pub passwd_lines: Option<usize>,
    /// Entries of `/etc`, sorted; `None` when unreadable.
    pub etc_entries: Option<Vec<String>>,
    /// Entries of `/dev`, sorted; `None` when unreadable.
    pub dev_entries: Option<Vec<String>>,
}

/// One resource limit; `None` means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rlimit {
    /// Soft limit.
    pub soft: Option<u64>,
    /// Hard limit.
    pub hard: Option<u64>,
}

/// The resource limits the probe reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rlimits {
    /// `RLIMIT_NOFILE` (open files).
    pub nofile: Rlimit,
    /// `RLIMIT_FSIZE` (bytes).
    pub fsize: Rlimit,
    /// `RLIMIT_CORE` (bytes).
    pub core: Rlimit,
    /// `RLIMIT_NPROC` (processes of the uid).
    pub nproc: Rlimit,
    /// `RLIMIT_CPU` (seconds).
    pub cpu: Rlimit,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::io::Errno;

    #[test]
    fn outcome_json_shape() {
        let json = |outcome: &Outcome| serde_json::to_string(outcome).unwrap_or_default();
        assert_eq!(json(&Outcome::Ok(3)), r#"{"ok":3}"#);
        assert_eq!(json(&Outcome::errno("EPERM")), r#"{"errno":"EPERM"}"#);
        assert_eq!(
            json(&Outcome::Signal("SIGSYS".to_owned())),
            r#"{"signal":"SIGSYS"}"#
        );
    }

    #[test]
    fn attempts_become_outcomes() {
        assert_eq!(
            Outcome::from(Attempt::Failed(Errno::PERM)),
            Outcome::errno("EPERM")
        );
        assert_eq!(
            Outcome::from(Attempt::Killed(libc::SIGSYS)),
            Outcome::Signal("SIGSYS".to_owned())
        );
        assert_eq!(Outcome::from(Attempt::Returned(0)), Outcome::Ok(0));
    }

    #[test]
    fn io_errors_become_outcomes() {
        let refused = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert_eq!(
            Outcome::from_io_error(&refused),
            Outcome::errno("ECONNREFUSED")
        );
        let timed_out = std::io::Error::from(std::io::ErrorKind::TimedOut);
        assert_eq!(
            Outcome::from_io_error(&timed_out),
            Outcome::errno("ETIMEDOUT")
        );
    }
}
