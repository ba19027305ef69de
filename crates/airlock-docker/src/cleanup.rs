//! Nothing of a job outlives it: the container guard, which removes a job's container when
//! the job's future is dropped (SIGINT/SIGTERM, a server shutting down), and the sweep of
//! stale containers and job directories that airlock processes killed outright left.
//!
//! Only containers labelled `airlock.managed=true` are ever listed or removed.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use airlock_host::jobdir::RuntimeDir;
use bollard::Docker;
use bollard::query_parameters::{ListContainersOptions, RemoveContainerOptions};

use crate::error::DockerError;
use crate::spec::{LABEL_BOOT, LABEL_JOB, LABEL_MANAGED};
use crate::tcp::TcpAccounting;

/// Longest wait for a container's removal when it happens on drop.
pub const DROP_REMOVE_TIMEOUT: Duration = Duration::from_secs(15);
/// Client timeout, in seconds, of the connections the guard and the sweep open.
pub const CLIENT_TIMEOUT_SECS: u64 = 30;

/// Force-removes a container (killing it if it runs) with its anonymous volumes. A
/// container that is already gone is not an error.
///
/// A daemon may fail a removal that races the container's own end: Podman 4.3 answers 500
/// "could not be stopped ... container state improper: stopped" when the container exits
/// between its state check and its kill (seen removing warm containers at shutdown). The
/// removal is tried again, at most [`REMOVE_ATTEMPTS`] times in all, [`REMOVE_RETRY_PAUSE`]
/// apart; the last error is returned.
pub async fn remove(docker: &Docker, name: &str) -> Result<(), DockerError> {
    let mut attempt = 1;
    loop {
        match remove_once(docker, name).await {
            Err(e) if attempt < REMOVE_ATTEMPTS => {
                tracing::debug!(container = %name, error = %e, attempt, "removal failed; trying again");
                tokio::time::sleep(REMOVE_RETRY_PAUSE).await;
                attempt += 1;
            }
            done => return done,
        }
    }
}

/// How many times [`remove`] asks the daemon before it gives up.
pub const REMOVE_ATTEMPTS: u32 = 5;
/// The pause between two attempts of [`remove`].
pub const REMOVE_RETRY_PAUSE: Duration = Duration::from_millis(200);

async fn remove_once(docker: &Docker, name: &str) -> Result<(), DockerError> {
    let options = RemoveContainerOptions {
        force: true,
        v: true,
        link: false,
    };
    match docker.remove_container(name, Some(options)).await {
        Ok(()) => Ok(()),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(()),
        // 409: removal already in progress (by the sweep of another airlock).
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 409,
            message,
        }) if message.contains("already in progress") => Ok(()),
        Err(source) => Err(DockerError::Engine {
            operation: "remove",
            container: name.to_owned(),
            source,
        }),
    }
}

/// Removes a job's container if the job's future is dropped before it did so itself.
///
/// The removal cannot be left to a spawned task: the CLI's runtime ends right after the
/// engine returns, and tasks would die with it. Drop runs it on a thread of its own with a
/// private runtime and connection, and waits up to [`DROP_REMOVE_TIMEOUT`].
#[derive(Debug)]
pub struct ContainerGuard {
    socket: PathBuf,
    name: Option<String>,
}

impl ContainerGuard {
    /// A guard for the container `name` (which may not exist yet: removing a container
    /// that does not exist is fine).
    pub fn new(socket: &Path, name: &str) -> Self {
        Self {
            socket: socket.to_owned(),
            name: Some(name.to_owned()),
        }
    }

    /// Removes the container now and disarms the guard.
    pub async fn remove(mut self, docker: &Docker) -> Result<(), DockerError> {
        match self.name.take() {
            Some(name) => remove(docker, &name).await,
            None => Ok(()),
        }
    }
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        let Some(name) = self.name.take() else {
            return;
        };
        tracing::info!(container = %name, "job interrupted: removing its container");
        let socket = self.socket.clone();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("airlock-docker-remove".into())
            .spawn(move || {
                let result = remove_blocking(&socket, &name);
                let _ = done_tx.send(result);
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the container removal thread");
            return;
        }
        match done_rx.recv_timeout(DROP_REMOVE_TIMEOUT) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot remove an interrupted job's container")
            }
            Err(_) => tracing::error!("removing an interrupted job's container timed out"),
        }
    }
}

fn remove_blocking(socket: &Path, name: &str) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    runtime.block_on(async {
        let docker = connect(socket).map_err(|e| e.to_string())?;
        remove(&docker, name).await.map_err(|e| e.to_string())
    })
}

/// A client for the socket (no request is made yet). API version 1.41 is the newest the
/// daemons of Debian 12 speak (Docker 20.10, Podman 4.3); [`crate::backend`] negotiates.
pub fn connect(socket: &Path) -> Result<Docker, bollard::errors::Error> {
    Docker::connect_with_unix(
        &socket.to_string_lossy(),
        CLIENT_TIMEOUT_SECS,
        bollard::API_DEFAULT_VERSION,
    )
}

/// This host's boot id, telling containers of this boot from those of an earlier one.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
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
    let containers = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
        .map_err(DockerError::ListContainers)?;
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
