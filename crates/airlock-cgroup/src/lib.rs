//! airlock-cgroup: per-job cgroups on v1 and v2 hosts behind one interface.
//!
//! This crate owns everything airlock does with cgroupfs: detecting the host's hierarchies
//! ([`Hierarchy`]), choosing and preparing the parent of the job groups ([`CgroupManager`]),
//! creating one group per job with its memory (no swap), CPU quota and PIDs limits, killing
//! every process in it, reading its statistics and removing it ([`JobCgroup`]). It must not
//! spawn or join job processes itself (the sandbox helper writes to
//! [`JobCgroup::join_files`]), must never signal a process that is not verifiably in the job's
//! group, and must not hard-code where cgroupfs is mounted outside [`Hierarchy::detect`]: every
//! other function takes its paths from a [`Hierarchy`], so all of it runs on a fake tree too.
//! No `unsafe`: pidfds come from rustix.

#![forbid(unsafe_code)]

mod error;
mod fs;
mod hierarchy;
mod kill;
mod manager;
mod report;
mod v1;
mod v2;

use std::time::Duration;

pub use error::CgroupError;
pub use hierarchy::Hierarchy;
pub use manager::{CgroupManager, JobCgroup};

/// How a job group competes for the CPU with airlock's other groups
/// ([`JobCgroup::set_cpu_priority`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuPriority {
    /// A running job: the kernel's default share.
    Normal,
    /// Work ahead of a job (a warm sandbox starting or waiting): the smallest share the
    /// kernel offers (`cpu.shares` 2 on v1; `cpu.weight` 1 and `cpu.idle` on v2).
    Background,
}
pub use report::{Finding, HierarchyReport, ParentCheck, Presence};

/// The CPU bandwidth period written with every quota, in microseconds.
pub const CPU_PERIOD_US: u64 = 100_000;
/// The smallest CPU share a job may get: the kernel's minimum quota is 1 ms per period.
pub const MIN_CPU_MILLIS: u32 = 10;
/// Longest accepted job group name.
pub const MAX_JOB_NAME_CHARS: usize = 64;
/// Rounds of "list the group, SIGKILL each verified member" before the sweep gives up.
pub const KILL_SWEEP_MAX_ROUNDS: u32 = 100;
/// Longest pause between sweep rounds, so killed processes can leave the group.
pub const KILL_SWEEP_PAUSE_MS: u64 = 10;
/// Longest poll interval of [`JobCgroup::wait_empty`].
pub const WAIT_POLL_INTERVAL_MS: u64 = 5;

/// The `attempt`th pause of a poll that starts short and doubles up to `cap_ms`: a
/// process that is already exiting leaves its group within microseconds, and a job's
/// teardown should not wait a whole interval for it.
pub(crate) fn backoff(attempt: u32, cap_ms: u64) -> std::time::Duration {
    let micros = 100u64.saturating_mul(1 << attempt.min(16));
    std::time::Duration::from_micros(micros.min(cap_ms * 1000))
}
/// How long [`JobCgroup::remove`] waits for killed processes to leave before `rmdir`.
pub const REMOVE_WAIT_MS: u64 = 2_000;
/// How long the best-effort cleanup in `Drop` waits before `rmdir`.
pub const DROP_WAIT_MS: u64 = 1_000;

/// Which cgroup interface the job groups use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    /// Legacy: one hierarchy per controller (or per co-mounted set).
    V1,
    /// Unified: one hierarchy for all controllers.
    V2,
}

/// The limits of one job's group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobLimits {
    /// Memory limit in bytes; swap is not allowed on top of it.
    pub memory_bytes: u64,
    /// CPU quota in thousandths of a CPU: 500 is half a CPU. At least [`MIN_CPU_MILLIS`].
    pub cpu_millis: u32,
    /// Maximum number of tasks (processes and threads) in the group.
    pub pids_max: u32,
}

impl JobLimits {
    /// Rejects values the kernel would refuse or that cannot run anything.
    pub(crate) fn validate(&self) -> Result<(), CgroupError> {
        if self.memory_bytes == 0 {
            return Err(CgroupError::InvalidLimit {
                limit: "memory_bytes",
                reason: "must be more than 0",
            });
        }
        if self.cpu_millis < MIN_CPU_MILLIS {
            return Err(CgroupError::InvalidLimit {
                limit: "cpu_millis",
                reason: "must be at least 10 (the kernel's 1 ms minimum quota)",
            });
        }
        if self.pids_max == 0 {
            return Err(CgroupError::InvalidLimit {
                limit: "pids_max",
                reason: "must be more than 0",
            });
        }
        Ok(())
    }

    /// The CFS quota in microseconds per [`CPU_PERIOD_US`].
    pub(crate) fn cpu_quota_us(&self) -> u64 {
        u64::from(self.cpu_millis) * CPU_PERIOD_US / 1000
    }
}

/// What a job's group used, read before it is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JobStats {
    /// Highest memory use (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`); `None` where
    /// the kernel does not report it (v2 before Linux 5.19).
    pub peak_memory_bytes: Option<u64>,
    /// Processes the kernel OOM killer killed in the group (0 on v1 kernels before 4.13,
    /// which do not count them).
    pub oom_kills: u64,
    /// CPU time used by the group (v1 `cpuacct.usage`, v2 `cpu.stat` `usage_usec`).
    pub cpu_time: Option<Duration>,
}

/// Where the job groups go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParentSpec {
    /// v1: `airlock` under this process's own cgroup in each hierarchy. v2: `/airlock` when
    /// this process is in the root cgroup; `<own>/jobs` when it is alone in a delegated
    /// cgroup (it moves itself to `<own>/supervisor`); otherwise an error that says how to fix
    /// it.
    Auto,
    /// A path relative to the mount root of each hierarchy (a leading `/` is allowed).
    Path(std::path::PathBuf),
}
