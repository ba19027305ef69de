//! Nothing of a job outlives it: killing a container, removing it (also when the job's
//! future is dropped: the container guard) and then what came with it (`/out`, its v1
//! memory group, the job directory).
//!
//! Only containers labelled `airlock.managed=true` are ever listed or removed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use airlock_core::Teardown;
use airlock_host::jobdir::JobDir;
use bollard::Docker;
use bollard::query_parameters::{KillContainerOptions, RemoveContainerOptions};

use crate::engine::connect;
use crate::error::DockerError;
use crate::outdir::OutMount;
use crate::tcp::TcpAccounting;

/// Longest wait for a container's removal when it happens on drop.
pub const DROP_REMOVE_TIMEOUT: Duration = Duration::from_secs(15);

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

/// Kills the container with SIGKILL. Whether it stopped is the wait stream's to say.
pub(crate) async fn kill(docker: &Docker, name: &str) {
    let options = KillContainerOptions {
        signal: "SIGKILL".to_owned(),
    };
    if let Err(e) = docker.kill_container(name, Some(options)).await {
        // 409: it stopped by itself meanwhile.
        tracing::debug!(container = %name, error = %e, "kill");
    }
}

/// What is left of a job's sandbox once it ran: the container, its v1 memory group and
/// the job directory.
pub(crate) struct Leftovers {
    pub(crate) docker: Docker,
    pub(crate) tcp: TcpAccounting,
    /// Removes the container if this is dropped before [`Leftovers::remove`].
    pub(crate) guard: ContainerGuard,
    pub(crate) created_id: Option<String>,
    pub(crate) name: String,
    pub(crate) jobdir: JobDir,
}

impl Leftovers {
    /// The removal of what is left of job `job_id`'s sandbox, off the reply path.
    pub(crate) fn teardown(self, job_id: String) -> Teardown {
        Teardown::new(async move {
            match self.remove(None).await {
                Ok(()) => tracing::debug!(job_id = %job_id, "container removed"),
                Err(e) => tracing::warn!(job_id = %job_id, error = %e, "container not removed"),
            }
        })
    }

    /// Removes the container, then unmounts `/out` if it is still mounted, then removes the
    /// group and the directory. The first error is the container's removal.
    pub(crate) async fn remove(self, out: Option<OutMount>) -> Result<(), DockerError> {
        let removed = self.guard.remove(&self.docker).await;
        drop(out);
        // The runtime removes the group with the container it started; one that never
        // started leaves airlock's empty group behind.
        if let (TcpAccounting::V1(groups), Some(id)) = (&self.tcp, &self.created_id)
            && let Err(e) = groups.remove(id)
        {
            tracing::warn!(container = %self.name, error = %e, "cannot remove the container's memory cgroup");
        }
        if let Err(e) = self.jobdir.remove() {
            tracing::warn!(error = %e, "cannot remove the job directory");
        }
        removed
    }
}
