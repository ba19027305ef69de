//! The Engine API backend: its configuration, opening it, checking a job against it, and
//! the run of one job, which strings the phases each file holds (the same names in every
//! backend crate): `launch.rs` (connect to the daemon, create, attach to and start the
//! container, the egress proxy), `supervise.rs` (the running container under the
//! supervision core, then its report), `teardown.rs` (killing and removing the container
//! and what came with it), `host_checks.rs` (what connecting checks of the host) and
//! `sweep.rs` (what a dead instance left).

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use airlock_core::policy::{NetworkMode, Policy, RootfsSpec};
use airlock_core::{
    Backend, BackendError, BackendKind, BoxFuture, Capabilities, JobSpec, OutputTap, RunReport,
    Teardown,
};
use airlock_host::ids::IdMapping;
use airlock_host::jobdir::{JobDir, RuntimeDir, WorkBacking};
use airlock_host::out::OutCaps;
use bollard::Docker;
use futures_core::Stream;
use tokio::sync::OnceCell;

use crate::Flavor;
use crate::error::DockerError;
use crate::image::{self, CheckedImage};
use crate::launch::ContainerFiles;
use crate::outdir::OutMount;
use crate::spec::JOB_UID;
use crate::tcp::TcpAccounting;

/// Longest time from creating the container to the program's start (gVisor boots a
/// kernel; a busy daemon queues).
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for the container to stop after it was killed.
pub const KILL_GRACE: Duration = Duration::from_secs(10);
/// Longest wait for the output stream to end once the container stopped.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for the daemon's version handshake.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How a backend is set up.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// Docker, Podman or gVisor.
    pub flavor: Flavor,
    /// The daemon's unix socket.
    pub socket: PathBuf,
    /// The OCI runtime; `None` for the daemon's default.
    pub runtime: Option<String>,
    /// Where job directories are created.
    pub runtime_dir: PathBuf,
}

impl DockerConfig {
    /// The configuration a policy asks for; the Docker socket may come from `DOCKER_HOST`
    /// ([`crate::engine::socket`]).
    pub fn from_policy(policy: &Policy, flavor: Flavor) -> Result<Self, DockerError> {
        let docker = &policy.docker;
        let runtime = match flavor {
            Flavor::Docker => Some(docker.runtime.clone()),
            Flavor::Gvisor => Some(docker.gvisor_runtime.clone()),
            Flavor::Podman => Some(docker.podman_runtime.clone()).filter(|r| !r.is_empty()),
        };
        Ok(Self {
            flavor,
            socket: crate::engine::socket(docker, flavor)?.path,
            runtime,
            runtime_dir: default_runtime_dir(),
        })
    }
}

/// `/run/airlock-docker` as root, else `$XDG_RUNTIME_DIR/airlock-docker` or
/// `<tmp>/airlock-docker-<uid>`. Never inside the native backend's runtime directory,
/// whose sweep would take this one for a stale job.
pub fn default_runtime_dir() -> PathBuf {
    let euid = rustix::process::geteuid();
    if euid.is_root() {
        return PathBuf::from("/run/airlock-docker");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("airlock-docker"),
        _ => std::env::temp_dir().join(format!("airlock-docker-{}", euid.as_raw())),
    }
}

/// The Engine API backend.
pub struct DockerBackend {
    pub(crate) config: DockerConfig,
    pub(crate) runtime_dir: RuntimeDir,
    pub(crate) boot_id: String,
    pub(crate) seccomp_profile: String,
    pub(crate) nproc_ceiling: Option<i64>,
    /// Connected, version negotiated, runtime checked, stale containers swept: once.
    pub(crate) ready: OnceCell<Ready>,
}

impl std::fmt::Debug for DockerBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerBackend")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The daemon once connected: its client and what it can give.
pub(crate) struct Ready {
    pub(crate) docker: Docker,
    /// Whether `/out` can be given: airlock is root and the daemon is not rootless, so a
    /// tmpfs airlock mounts on the host is what the container sees.
    pub(crate) out_dir: bool,
    /// How the containers' TCP socket buffers are held to their memory limit.
    pub(crate) tcp: TcpAccounting,
}

impl DockerBackend {
    /// A backend. Nothing is asked of the daemon until the first job (the engine opens
    /// backends synchronously); the socket must exist now.
    pub fn new(config: DockerConfig) -> Result<Self, DockerError> {
        if !config.socket.exists() {
            return Err(DockerError::Connect {
                backend: config.flavor.as_str(),
                socket: config.socket.clone(),
                source: bollard::errors::Error::SocketNotFoundError(
                    config.socket.display().to_string(),
                ),
            });
        }
        let runtime_dir = RuntimeDir::open(&config.runtime_dir).map_err(DockerError::JobDir)?;
        let profile = crate::seccomp::profile_for(config.flavor).map_err(DockerError::Seccomp)?;
        // Docker takes the profile's JSON in the request; Podman's compatible API takes a
        // path on the daemon's host (which is this host: the socket is local).
        let seccomp_profile = match config.flavor {
            Flavor::Docker | Flavor::Gvisor => profile,
            Flavor::Podman => {
                let path = config.runtime_dir.with_extension("seccomp.json");
                write_atomically(&path, profile.as_bytes()).map_err(|source| {
                    DockerError::WriteProfile {
                        path: path.clone(),
                        source,
                    }
                })?;
                path.display().to_string()
            }
        };
        let nproc_ceiling = (config.flavor == Flavor::Podman).then(pid_max);
        Ok(Self {
            config,
            runtime_dir,
            boot_id: crate::sweep::boot_id(),
            seccomp_profile,
            nproc_ceiling,
            ready: OnceCell::new(),
        })
    }

    /// The backend's configuration.
    pub fn config(&self) -> &DockerConfig {
        &self.config
    }

    fn check_supported(&self, job: &JobSpec, ready: &Ready) -> Result<(), DockerError> {
        let backend = self.config.flavor.as_str();
        if job.network == NetworkMode::Proxy && self.config.flavor == Flavor::Gvisor {
            return Err(DockerError::FeatureUnavailable {
                backend,
                feature: "network mode proxy",
                reason: "gVisor's network stack is its own: airlock cannot place the proxy's \
                         socket on the sandbox's loopback; use the docker or native backend"
                    .into(),
            });
        }
        if job.filesystem.out.enabled && !ready.out_dir {
            return Err(DockerError::FeatureUnavailable {
                backend,
                feature: "/out",
                reason: "it needs airlock running as root next to a rootful daemon, to mount a size-capped tmpfs the container binds; this daemon is rootless or airlock is not root".into(),
            });
        }
        Ok(())
    }

    /// Runs one job and removes its container.
    pub async fn run_job(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
    ) -> Result<RunReport, DockerError> {
        Teardown::removed(self.run_job_then_teardown(job, tap).await).await
    }

    /// Like [`DockerBackend::run_job`], but returns once the container has exited (its
    /// processes die with its pid namespace) and `/out` is released, leaving the removal of
    /// the container, its v1 memory group and the job directory to the returned
    /// [`Teardown`] (see [`Backend::run_then_teardown`]). On an error they are removed
    /// before this returns.
    pub async fn run_job_then_teardown(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
    ) -> Result<(RunReport, Teardown), DockerError> {
        let (ready, image) = self.checked(job).await?;

        // Dropped in reverse: the container first, then /out, then the directory.
        let jobdir = JobDir::create(&self.runtime_dir, job, &JOB_IDS, WorkBacking::Directory)
            .map_err(DockerError::JobDir)?;
        let empty_file = self.create_empty_file(job.id.as_str())?;
        let jobdir_path = self.runtime_dir.path().join(job.id.as_str());
        let out = if job.filesystem.out.enabled {
            Some(OutMount::mount(
                &jobdir_path.join("out"),
                job.filesystem.out.max_bytes.as_u64(),
                job.filesystem.out.max_files,
            )?)
        } else {
            None
        };
        let proxy_config = match job.network {
            NetworkMode::Proxy => Some(Arc::new(
                airlock_proxy::ProxyConfig::from_policy(
                    &job.network_policy,
                    &job.network_allow,
                    |name| std::env::var(name).ok(),
                )
                .map_err(|e| DockerError::ProxyConfig(e.to_string()))?,
            )),
            NetworkMode::None => None,
        };
        // The job's CA bundle, bound over the image's own when the proxy intercepts TLS.
        let trust_bundle = match proxy_config.as_ref().and_then(|c| c.trust_bundle_pem()) {
            Some(pem) => Some(
                jobdir
                    .write_trust_bundle(pem)
                    .map_err(DockerError::JobDir)?,
            ),
            None => None,
        };
        let files = ContainerFiles {
            image: &image,
            empty_file: &empty_file,
            trust_bundle: trust_bundle.as_deref(),
            out: out.as_ref(),
        };
        let (leftovers, started) = self
            .start_container(job, ready, &files, jobdir, job.id.as_str(), None)
            .await;
        let ran = match started {
            Ok(started) => {
                self.run_started(
                    job,
                    tap,
                    ready,
                    &image,
                    &leftovers.name,
                    started,
                    proxy_config,
                )
                .await
            }
            Err(e) => Err(e),
        };
        let mut report = match ran {
            Ok(report) => report,
            Err(e) => {
                // The container may still run: it goes before /out is unmounted.
                let _ = leftovers.remove(out).await;
                return Err(e);
            }
        };
        // The container has exited and its processes died with its pid namespace, so
        // nothing writes to /out any more.
        if let Some(out) = out {
            let caps = OutCaps {
                max_files: job.filesystem.out.max_files,
                max_bytes: job.filesystem.out.max_bytes.as_u64(),
                max_file_bytes: job.filesystem.out.max_file_bytes.as_u64(),
            };
            let released = tokio::task::spawn_blocking(move || out.release(caps))
                .await
                .map_err(|e| DockerError::Task(format!("release task: {e}")))
                .and_then(|released| released);
            match released {
                Ok(released) => {
                    report.out_files = released.files;
                    report.out_rejected = released.rejected;
                }
                Err(e) => {
                    let _ = leftovers.remove(None).await;
                    return Err(e);
                }
            }
        }
        Ok((report, leftovers.teardown(job.id.to_string())))
    }

    /// The daemon, connected and swept, and the job's image, checked against its pin; the
    /// job refused when this backend cannot give what it asks.
    pub(crate) async fn checked(
        &self,
        job: &JobSpec,
    ) -> Result<(&Ready, CheckedImage), DockerError> {
        let backend = self.config.flavor.as_str();
        let (reference, digest) = match &job.filesystem.rootfs {
            RootfsSpec::Image { reference, digest } => (reference.as_str(), digest.as_str()),
            other => {
                return Err(DockerError::NotAnImage {
                    backend,
                    rootfs: format!("{other:?}"),
                });
            }
        };
        let ready = self.ready().await?;
        self.check_supported(job, ready)?;
        let image = image::check(&ready.docker, backend, reference, digest).await?;
        Ok((ready, image))
    }

    /// The runtime directory job directories are made in.
    pub(crate) fn runtime_dir(&self) -> &RuntimeDir {
        &self.runtime_dir
    }
}

/// The job's uid and gid, which own its input files.
pub(crate) const JOB_IDS: IdMapping = IdMapping::Rootless {
    host_uid: JOB_UID,
    host_gid: JOB_UID,
};

/// Maps the daemon's failure of `operation` on `container` to [`DockerError::Engine`].
pub(crate) fn engine(
    operation: &'static str,
    container: &str,
) -> impl FnOnce(bollard::errors::Error) -> DockerError + use<> {
    let container = container.to_owned();
    move |source| DockerError::Engine {
        operation,
        container,
        source,
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename.
fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// The host's `kernel.pid_max`: as RLIMIT_NPROC, no limit beyond the pids cgroup.
fn pid_max() -> i64 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32768)
}

/// A task aborted when its handle is dropped: with the job's future, whoever drops it.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The next item of a stream.
pub(crate) async fn next<S: Stream + Unpin + ?Sized>(stream: &mut S) -> Option<S::Item> {
    std::future::poll_fn(|cx| Pin::new(&mut *stream).poll_next(cx)).await
}

impl Backend for DockerBackend {
    fn kind(&self) -> BackendKind {
        self.config.flavor.kind()
    }

    fn capabilities(&self) -> Capabilities {
        crate::provider::capabilities(self.config.flavor)
    }

    fn run_then_teardown<'a>(
        &'a self,
        job: &'a JobSpec,
        tap: Option<OutputTap>,
    ) -> BoxFuture<'a, Result<(RunReport, Teardown), BackendError>> {
        Box::pin(async move {
            self.run_job_then_teardown(job, tap)
                .await
                .map_err(BackendError::from)
        })
    }
}

/// Opens the backend of `kind` for a policy, as an `Arc<dyn Backend>`.
pub fn open(policy: &Policy, flavor: Flavor) -> Result<Arc<dyn Backend>, BackendError> {
    let backend = DockerBackend::new(DockerConfig::from_policy(policy, flavor)?)?;
    Ok(Arc::new(backend))
}
