//! The startup sweep: what jobs of a dead native supervisor left (cgroups, job
//! directories) is removed when a backend opens.

use airlock_host::jobdir::RuntimeDir;

use airlock_cgroup::CgroupManager;

/// How old an empty job cgroup with no job directory here must be before a sweep removes it:
/// a group another supervisor made a moment ago is empty until its helper joins it.
const ORPHANED_GROUP_MIN_AGE: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes what jobs of a crashed supervisor left behind: their cgroups (killing what
/// still runs there) and their directories. A live job's directory is locked by its
/// supervisor and exists for as long as its cgroup does, so neither is ever touched.
pub(crate) fn sweep_stale_jobs(runtime: &RuntimeDir, cgroups: Option<&CgroupManager>) {
    let _sweeping = match runtime.lock_for_sweep() {
        Ok(lock) => lock,
        Err(e) => {
            tracing::warn!(error = %e, "cannot take the runtime directory's sweep lock");
            return;
        }
    };
    let stale = match runtime.stale_jobs() {
        Ok(stale) => stale,
        Err(e) => {
            tracing::warn!(error = %e, "cannot scan the runtime directory for stale jobs");
            return;
        }
    };
    for name in &stale {
        if let Some(cgroups) = cgroups
            && let Err(e) = cgroups.remove_stale_job(name)
        {
            tracing::warn!(job = %name, error = %e, "cannot remove a stale job's cgroup");
            continue;
        }
        if let Err(e) = runtime.remove_job_dir(name) {
            tracing::warn!(job = %name, error = %e, "cannot remove a stale job directory");
        }
    }
    // Groups first, directories second: a job's directory is created before its cgroup and
    // removed after it, so a group listed here whose directory is missing afterwards is
    // truly orphaned, never a job being created right now.
    let Some(cgroups) = cgroups else {
        return;
    };
    let Ok(groups) = cgroups.job_groups() else {
        return;
    };
    let live: std::collections::BTreeSet<String> =
        runtime.job_dirs().unwrap_or_default().into_iter().collect();
    // Such a group may also be a live job of another airlock with another runtime directory
    // under the same cgroup parent: it is removed only when empty and old, never killed.
    for name in groups.iter().filter(|g| !live.contains(*g)) {
        match cgroups.remove_orphaned_group(name, ORPHANED_GROUP_MIN_AGE) {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(job = %name, "a job cgroup of no job here is in use or new: left")
            }
            Err(e) => {
                tracing::warn!(job = %name, error = %e, "cannot remove an orphaned job cgroup");
            }
        }
    }
}
