//! Ending a native sandbox: killing what is left of its processes (its cgroup), then
//! removing the cgroup and the job directory.

use airlock_host::jobdir::JobDir;

use airlock_cgroup::{JobCgroup, JobStats};

use crate::backend::TEARDOWN_WAIT;
use crate::error::NativeError;

/// What is known once a job's processes were ended.
pub(crate) struct Ended {
    /// The cgroup's accounting (`None` without a cgroup).
    pub(crate) stats: Option<JobStats>,
    /// Whether every process of the job is known gone: the group emptied within
    /// [`TEARDOWN_WAIT`], or the job's pid namespace ended ([`end_remaining_plumbing`]).
    pub(crate) all_gone: bool,
}

/// Kills every process left in the job's cgroup, waits for the group to empty and reads
/// its accounting. Without a cgroup the processes ended with the init's pid namespace.
pub(crate) fn end_processes(cgroup: Option<&JobCgroup>) -> Result<Ended, NativeError> {
    let Some(cgroup) = cgroup else {
        return Ok(Ended {
            stats: None,
            all_gone: true,
        });
    };
    let killed = cgroup.kill_all();
    let all_gone = cgroup.wait_empty(TEARDOWN_WAIT).unwrap_or(false);
    let stats = cgroup.stats();
    killed?;
    Ok(Ended {
        stats: Some(stats?),
        all_gone,
    })
}

/// For a job whose pid namespace is gone (every process of it killed and reaped by the
/// kernel): kills what is left in its cgroup, the sandbox's own processes outside that
/// namespace (a forked sandbox's leader, whose exit tears the namespaces down), without
/// waiting for them to leave, and reads the accounting. The removal then waits for the
/// group to empty ([`JobCgroup::remove`]), off the reply's path.
pub(crate) fn end_remaining_plumbing(cgroup: Option<&JobCgroup>) -> Result<Ended, NativeError> {
    let Some(cgroup) = cgroup else {
        return Ok(Ended {
            stats: None,
            all_gone: true,
        });
    };
    let killed = cgroup.kill_now();
    let stats = cgroup.stats();
    killed?;
    Ok(Ended {
        stats: Some(stats?),
        all_gone: true,
    })
}

/// Removes the cgroup and the job directory of a sandbox whose processes were ended.
pub(crate) fn remove_sandbox(cgroup: Option<JobCgroup>, jobdir: JobDir) -> Result<(), NativeError> {
    let removed = cgroup.map(JobCgroup::remove).transpose();
    if let Err(e) = jobdir.remove() {
        tracing::warn!(error = %e, "cannot remove job directory");
    }
    removed?;
    Ok(())
}

/// [`remove_sandbox`] off the async threads.
pub(crate) async fn removal(cgroup: Option<JobCgroup>, jobdir: JobDir) -> Result<(), NativeError> {
    tokio::task::spawn_blocking(move || remove_sandbox(cgroup, jobdir))
        .await
        .map_err(|join| NativeError::Helper(format!("removal task: {join}")))?
}

/// Ends the processes and removes the sandbox in one go, for sandboxes that never ran a
/// job (a warm sandbox discarded, or one that failed to start).
pub(crate) fn teardown(
    cgroup: Option<JobCgroup>,
    jobdir: JobDir,
) -> Result<Option<JobStats>, NativeError> {
    let ended = end_processes(cgroup.as_ref());
    let removed = remove_sandbox(cgroup, jobdir);
    let ended = ended?;
    removed?;
    Ok(ended.stats)
}
