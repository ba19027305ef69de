//! The sweep of stale containers and job directories that airlock processes killed
//! outright left, when a backend first connects.
//!
//! Only containers labelled `airlock.managed=true` are ever listed or removed.

use std::collections::{BTreeSet, HashMap};

use airlock_host::jobdir::RuntimeDir;
use bollard::Docker;
use bollard::query_parameters::ListContainersOptions;

use crate::error::DockerError;
use crate::spec::{LABEL_BOOT, LABEL_JOB, LABEL_MANAGED};
use crate::tcp::TcpAccounting;
use crate::teardown::remove;

/// This host's boot id, telling containers of this boot from those of an earlier one.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// How many times the listing is asked for before the sweep gives up.
const LIST_ATTEMPTS: u32 = 10;
/// The pause between two attempts.
const LIST_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Lists airlock's containers. Podman's Docker-compatible API reports a container it is
/// cleaning up as state `stopped`, which the Engine API's schema (and so bollard) does not
/// know: the whole listing then fails to parse. That state lasts moments, so the listing
/// is asked for again.
async fn list_with_retries(
    docker: &Docker,
    filters: HashMap<String, Vec<String>>,
) -> Result<Vec<bollard::models::ContainerSummary>, DockerError> {
    let mut attempt = 1;
    loop {
        let listed = docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters.clone()),
                ..Default::default()
            }))
            .await;
        match listed {
            Ok(containers) => return Ok(containers),
            Err(e @ bollard::errors::Error::JsonDataError { .. }) if attempt < LIST_ATTEMPTS => {
                tracing::debug!(error = %e, attempt, "the container listing did not parse; asking again");
            }
            Err(e) => return Err(DockerError::ListContainers(e)),
        }
        attempt += 1;
        tokio::time::sleep(LIST_RETRY_PAUSE).await;
    }
}

/// Whether a container of airlock is stale: created during another boot (no airlock of
/// then still runs), or during this boot by a job whose directory is gone or unlocked
/// (its airlock process died). A live job holds its directory's lock from before its
/// container is created until after it is removed.
pub fn is_stale(
    labels: &HashMap<String, String>,
    boot: &str,
    live_jobs: &BTreeSet<String>,
) -> bool {
    if labels.get(LABEL_MANAGED).map(String::as_str) != Some("true") {
        return false;
    }
    if labels.get(LABEL_BOOT).map(String::as_str) != Some(boot) {
        return true;
    }
    match labels.get(LABEL_JOB) {
        Some(job) => !live_jobs.contains(job),
        None => true,
    }
}

/// Removes stale containers of airlock from the daemon, then stale job directories
/// (unmounting a left-over `/out`) and the memory cgroups airlock created for containers
/// that are gone ([`crate::tcp`]). Returns how many containers were removed.
pub async fn sweep(
    docker: &Docker,
    runtime: &RuntimeDir,
    tcp: &TcpAccounting,
) -> Result<usize, DockerError> {
    let _sweeping = {
        let runtime = runtime.clone();
        match tokio::task::spawn_blocking(move || runtime.lock_for_sweep()).await {
            Ok(Ok(lock)) => lock,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot take the runtime directory's sweep lock");
                return Ok(0);
            }
            Err(e) => {
                tracing::warn!(error = %e, "the sweep lock's task failed");
                return Ok(0);
            }
        }
    };
    // The groups are read before the containers are listed: a group is created after its
    // container, so every group read here whose container is live is in the listing.
    let groups = match tcp {
        TcpAccounting::V1(groups) => Some((groups, groups.group_ids())),
        TcpAccounting::Inherent => None,
    };
    let boot = boot_id();
    let filters = HashMap::from([("label".to_owned(), vec![format!("{LABEL_MANAGED}=true")])]);
    let containers = list_with_retries(docker, filters).await?;
    let all_dirs: BTreeSet<String> = runtime.job_dirs().unwrap_or_default().into_iter().collect();
    let stale_dirs: BTreeSet<String> = runtime
        .stale_jobs()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let live: BTreeSet<String> = all_dirs.difference(&stale_dirs).cloned().collect();
    let mut removed = 0;
    let mut kept = BTreeSet::new();
    for container in containers {
        let labels = container.labels.unwrap_or_default();
        let Some(id) = container.id else { continue };
        if !is_stale(&labels, &boot, &live) {
            kept.insert(id);
            continue;
        }
        tracing::info!(container = %id, job = ?labels.get(LABEL_JOB), "removing a stale container of airlock");
        match remove(docker, &id).await {
            Ok(()) => removed += 1,
            Err(e) => {
                tracing::warn!(container = %id, error = %e, "cannot remove a stale container")
            }
        }
    }
    if let Some((groups, ids)) = groups {
        for id in ids.into_iter().filter(|id| !kept.contains(id)) {
            // A group with a process left in it cannot be removed (EBUSY): nothing is
            // taken from a running container.
            if let Err(e) = groups.remove(&id) {
                tracing::warn!(container = %id, error = %e, "cannot remove a stale container's memory cgroup");
            }
        }
    }
    for name in stale_dirs {
        crate::outdir::unmount_stale(&runtime.path().join(&name).join("out"));
        if let Err(e) = runtime.remove_job_dir(&name) {
            tracing::warn!(job = %name, error = %e, "cannot remove a stale job directory");
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn only_airlocks_dead_jobs_are_stale() {
        let live = BTreeSet::from(["live".to_owned()]);
        let ours = |job: &str| {
            labels(&[
                (LABEL_MANAGED, "true"),
                (LABEL_BOOT, "b1"),
                (LABEL_JOB, job),
            ])
        };
        assert!(!is_stale(&ours("live"), "b1", &live));
        assert!(is_stale(&ours("dead"), "b1", &live));
        assert!(is_stale(&ours("live"), "b0", &live), "an earlier boot's");
        assert!(
            !is_stale(&labels(&[(LABEL_JOB, "dead")]), "b1", &live),
            "not airlock's"
        );
        assert!(!is_stale(
            &labels(&[(LABEL_MANAGED, "false"), (LABEL_BOOT, "b1")]),
            "b1",
            &live
        ));
    }
}
