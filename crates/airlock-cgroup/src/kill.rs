//! The kill sweep for hosts without `cgroup.kill` (v1, v2 before Linux 5.14).
//!
//! For each listed pid: open a pidfd (which pins that one process), then check that
//! `/proc/<pid>/cgroup` still names the group, then signal through the pidfd. If the pid was
//! reused after `cgroup.procs` was read, the check fails and nothing is sent; if it is reused
//! after the pidfd was opened, the pinned process is dead and the signal fails with `ESRCH`.

use std::path::Path;
use std::thread;
use std::time::Duration;

use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};

use crate::manager::{GroupDir, HierarchyKey};
use crate::{CgroupError, KILL_SWEEP_MAX_ROUNDS, KILL_SWEEP_PAUSE_MS, fs};

/// The pids listed in a group's `cgroup.procs`; none when the group directory is gone.
fn members(dir: &GroupDir) -> Result<Vec<i32>, CgroupError> {
    let path = dir.dir.join("cgroup.procs");
    if !dir.dir.exists() {
        return Ok(Vec::new());
    }
    fs::read_pids(&path)
}

/// How many processes the groups list in all.
pub(crate) fn count_members(dirs: &[GroupDir]) -> Result<usize, CgroupError> {
    let mut n = 0;
    for d in dirs {
        n += members(d)?.len();
    }
    Ok(n)
}

/// SIGKILLs every verified member until the groups are empty or [`KILL_SWEEP_MAX_ROUNDS`]
/// rounds are done.
pub(crate) fn sweep(dirs: &[GroupDir]) -> Result<(), CgroupError> {
    for round in 0..KILL_SWEEP_MAX_ROUNDS {
        let mut listed = 0;
        for d in dirs {
            for pid in members(d)? {
                listed += 1;
                kill_if_member(pid, d)?;
            }
        }
        if listed == 0 {
            return Ok(());
        }
        tracing::trace!(round, listed, "kill sweep");
        // Until the group empties, or at most one whole pause.
        let pause_end = std::time::Instant::now() + Duration::from_millis(KILL_SWEEP_PAUSE_MS);
        let mut attempt = 0;
        while count_members(dirs)? > 0 && std::time::Instant::now() < pause_end {
            thread::sleep(crate::backoff(attempt, KILL_SWEEP_PAUSE_MS));
            attempt += 1;
        }
    }
    let remaining = count_members(dirs)?;
    if remaining == 0 {
        return Ok(());
    }
    Err(CgroupError::KillIncomplete {
        path: dirs.first().map(|d| d.dir.clone()).unwrap_or_default(),
        remaining,
        rounds: KILL_SWEEP_MAX_ROUNDS,
    })
}

/// SIGKILLs every verified member once, without waiting for any to leave; returns how
/// many were signalled.
pub(crate) fn signal_once(dirs: &[GroupDir]) -> Result<usize, CgroupError> {
    let mut signalled = 0;
    for d in dirs {
        for pid in members(d)? {
            if kill_if_member(pid, d)? {
                signalled += 1;
            }
        }
    }
    Ok(signalled)
}

/// Sends SIGKILL to `pid` only if it is verifiably in `dir`. `Ok(false)` when it was not
/// signalled (gone, or not a member).
fn kill_if_member(pid: i32, dir: &GroupDir) -> Result<bool, CgroupError> {
    // Pid 0 and negative values never name one process.
    let Some(raw) = Pid::from_raw(pid).filter(|_| pid > 0) else {
        return Ok(false);
    };
    let pidfd = match pidfd_open(raw, PidfdFlags::empty()) {
        Ok(fd) => fd,
        Err(Errno::SRCH) => return Ok(false),
        Err(source) => return Err(CgroupError::PidfdOpen { pid, source }),
    };
    let proc_cgroup = Path::new("/proc").join(pid.to_string()).join("cgroup");
    let Ok(text) = std::fs::read_to_string(&proc_cgroup) else {
        // The process exited between the pidfd and the read.
        return Ok(false);
    };
    if !is_member(&text, &dir.key, &dir.hierarchy_path) {
        tracing::debug!(pid, group = %dir.hierarchy_path, "listed pid is not in the group; not signalled");
        return Ok(false);
    }
    match pidfd_send_signal(&pidfd, Signal::KILL) {
        Ok(()) => Ok(true),
        Err(Errno::SRCH) => Ok(false),
        Err(source) => Err(CgroupError::Signal { pid, source }),
    }
}

/// Whether a `/proc/<pid>/cgroup` text puts the process exactly in `hierarchy_path` of the
/// hierarchy `key`.
pub(crate) fn is_member(proc_pid_cgroup: &str, key: &HierarchyKey, hierarchy_path: &str) -> bool {
    proc_pid_cgroup.lines().any(|line| {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(list), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            return false;
        };
        let right_hierarchy = match key {
            HierarchyKey::Unified => id == "0" && list.is_empty(),
            HierarchyKey::V1(controller) => list.split(',').any(|c| c == *controller),
        };
        right_hierarchy && path == hierarchy_path
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROC: &str = "\
9:name=systemd:/
8:pids:/airlock/job-1
4:memory:/process_api/x/airlock/job-1
2:cpu,cpuacct:/airlock/job-1
0::/airlock/job-1
";

    #[test]
    fn membership_is_exact_and_per_hierarchy() {
        let mem = HierarchyKey::V1("memory");
        assert!(is_member(PROC, &mem, "/process_api/x/airlock/job-1"));
        assert!(!is_member(PROC, &mem, "/airlock/job-1"));
        assert!(!is_member(PROC, &mem, "/process_api/x/airlock/job-10"));
        assert!(!is_member(PROC, &mem, "/process_api/x/airlock"));
        assert!(is_member(
            PROC,
            &HierarchyKey::V1("cpuacct"),
            "/airlock/job-1"
        ));
        assert!(is_member(PROC, &HierarchyKey::Unified, "/airlock/job-1"));
        assert!(!is_member(
            "0::/other\n",
            &HierarchyKey::Unified,
            "/airlock/job-1"
        ));
        assert!(!is_member("", &HierarchyKey::V1("pids"), "/airlock/job-1"));
        // A v1 line is never taken for the unified one.
        assert!(!is_member("8:pids:/a\n", &HierarchyKey::Unified, "/a"));
    }
}
