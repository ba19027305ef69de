//! The backend: checks the image, prepares the job directory (and `/out`), creates,
//! attaches to and starts the container, runs it through the supervision core
//! (`airlock_core::supervise`: bounded output, wall time, the output flood) with the attach
//! stream as its output and a kill request as its kill, reads how it ended, and removes it.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_core::policy::{NetworkMode, Policy, RootfsSpec};
use airlock_core::supervise::{
    Chunk, JobOutput, Kill, OutputSource, Sandbox, Supervision, supervise,
};
use airlock_core::{
    Backend, BackendError, BackendKind, BoxFuture, Capabilities, JobSpec, OutputTap, RunReport,
    StreamKind, Teardown, Termination,
};
use airlock_host::ids::IdMapping;
use airlock_host::jobdir::{JobDir, RuntimeDir};
use airlock_host::out::OutCaps;
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, KillContainerOptions, WaitContainerOptions,
};
use futures_core::Stream;
use tokio::io::AsyncWriteExt;
use tokio::sync::OnceCell;

use crate::Flavor;
use crate::cleanup::{self, ContainerGuard};
use crate::error::DockerError;
use crate::image::{self, CheckedImage};
use crate::outdir::OutMount;
use crate::spec::{self, ContainerPlan, JOB_UID};
use crate::tcp::{HostFacts, TcpAccounting, V1Groups};

/// Longest time from creating the container to the program's start (gVisor boots a
/// kernel; a busy daemon queues).
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for the container to stop after it was killed.
pub const KILL_GRACE: Duration = Duration::from_secs(10);
/// Longest wait for the output stream to end once the container stopped.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for the daemon's version handshake.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Exit codes above this (up to 128 + 64) mean "killed by signal (code - 128)": the Engine
/// API reports only an exit code, and runtimes report a signal death as 128 + N.
pub const SIGNAL_EXIT_BASE: i64 = 128;
/// SIGKILL.
const SIGKILL: i32 = 9;
/// The highest signal number.
pub const SIGNAL_MAX: i64 = 64;
/// runsc must load the OCI seccomp profile into the sandbox, or the job runs without one.
pub const GVISOR_SECCOMP_FLAG: &str = "--oci-seccomp";

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
    config: DockerConfig,
    runtime_dir: RuntimeDir,
    boot_id: String,
    seccomp_profile: String,
    nproc_ceiling: Option<i64>,
    /// Connected, version negotiated, runtime checked, stale containers swept: once.
    ready: OnceCell<Ready>,
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
    out_dir: bool,
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
        let runtime = match config.flavor {
            Flavor::Gvisor => crate::seccomp::OciRuntime::Gvisor,
            Flavor::Docker | Flavor::Podman => crate::seccomp::OciRuntime::Runc,
        };
        let profile = crate::seccomp::docker_profile(crate::seccomp::POLICY_JSON, runtime)
            .map_err(DockerError::Seccomp)?;
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
            boot_id: cleanup::boot_id(),
            seccomp_profile,
            nproc_ceiling,
            ready: OnceCell::new(),
        })
    }

    /// The backend's configuration.
    pub fn config(&self) -> &DockerConfig {
        &self.config
    }

    pub(crate) async fn ready(&self) -> Result<&Ready, DockerError> {
        self.ready.get_or_try_init(|| self.connect()).await
    }

    async fn connect(&self) -> Result<Ready, DockerError> {
        let backend = self.config.flavor.as_str();
        let socket = self.config.socket.clone();
        let docker = cleanup::connect(&socket).map_err(|source| DockerError::Connect {
            backend,
            socket: socket.clone(),
            source,
        })?;
        let docker = match tokio::time::timeout(CONNECT_TIMEOUT, docker.negotiate_version()).await {
            Ok(Ok(docker)) => docker,
            Ok(Err(source)) => {
                return Err(DockerError::Version {
                    backend,
                    socket,
                    source,
                });
            }
            Err(_) => {
                return Err(DockerError::Version {
                    backend,
                    socket,
                    source: bollard::errors::Error::RequestTimeoutError,
                });
            }
        };
        let info = docker.info().await.map_err(|source| DockerError::Version {
            backend,
            socket: self.config.socket.clone(),
            source,
        })?;
        if let Some(runtime) = &self.config.runtime
            && self.config.flavor == Flavor::Podman
        {
            // Podman's Docker-compatible API runs every container with the service's
            // default runtime and ignores the one a request names (seen with podman 4.3:
            // HostConfig.Runtime "runsc" ran runc). The runtime holds only as the default.
            let default = info.default_runtime.clone().unwrap_or_default();
            if &default != runtime {
                return Err(DockerError::RuntimeNotHonoured {
                    runtime: runtime.clone(),
                    default,
                });
            }
        }
        if let Some(runtime) = &self.config.runtime {
            let runtimes = info.runtimes.clone().unwrap_or_default();
            match runtimes.get(runtime) {
                None if !runtimes.is_empty() || self.config.flavor != Flavor::Podman => {
                    let mut available: Vec<&str> = runtimes.keys().map(String::as_str).collect();
                    available.sort_unstable();
                    return Err(DockerError::RuntimeMissing {
                        runtime: runtime.clone(),
                        available: available.join(", "),
                        fix: "register it in the daemon's config (daemon.json \"runtimes\") or change [docker] in the policy",
                    });
                }
                Some(registered) if self.config.flavor == Flavor::Gvisor => {
                    let args = registered.runtime_args.clone().unwrap_or_default();
                    if !args.iter().any(|a| a == GVISOR_SECCOMP_FLAG) {
                        return Err(DockerError::RuntimeMissing {
                            runtime: format!("{runtime} {GVISOR_SECCOMP_FLAG}"),
                            available: format!("{runtime} with runtimeArgs {args:?}"),
                            fix: "add \"--oci-seccomp\" to the runtime's runtimeArgs in daemon.json, or jobs would run without a seccomp filter",
                        });
                    }
                }
                _ => {}
            }
        }
        let rootless = info
            .security_options
            .iter()
            .flatten()
            .any(|o| o.contains("rootless"));
        let out_dir = rustix::process::geteuid().is_root() && !rootless;
        let tcp = tcp_accounting(self.config.flavor, &info)?;
        match cleanup::sweep(&docker, &self.runtime_dir, &tcp).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "swept stale containers of airlock"),
            Err(e) => tracing::warn!(error = %e, "cannot sweep stale containers"),
        }
        Ok(Ready {
            docker,
            out_dir,
            tcp,
        })
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
        let jobdir =
            JobDir::create(&self.runtime_dir, job, &JOB_IDS).map_err(DockerError::JobDir)?;
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

    /// Creates the empty read-only file in the job directory `sandbox` that hides device
    /// nodes ([`spec::GVISOR_HIDDEN_DEVICE_NODES`]).
    pub(crate) fn create_empty_file(&self, sandbox: &str) -> Result<PathBuf, DockerError> {
        let path = self.runtime_dir.path().join(sandbox).join(EMPTY_FILE_NAME);
        create_empty_file(&path).map_err(|source| DockerError::EmptyFile {
            path: path.clone(),
            source,
        })?;
        Ok(path)
    }

    /// Binds the proxy's socket in the network namespace of the started (and gated)
    /// container and serves the proxy on it.
    async fn start_proxy(
        &self,
        docker: &Docker,
        name: &str,
        config: Arc<airlock_proxy::ProxyConfig>,
    ) -> Result<airlock_proxy::ProxyHandle, DockerError> {
        let failed = |reason: String| DockerError::Proxy {
            container: name.to_owned(),
            reason,
        };
        let pid = container_pid(docker, name).await.map_err(failed)?;
        let listener = crate::netns::listen_in_netns_of(pid, airlock_core::job::PROXY_PORT)
            .await
            .map_err(|e| failed(format!("bind in the container's network namespace: {e}")))?;
        // The pid was the container's when the namespace was opened only if it still is.
        if container_pid(docker, name).await.map_err(failed)? != pid {
            return Err(failed(
                "the container's process changed while binding".into(),
            ));
        }
        airlock_proxy::spawn(listener, config).map_err(|e| failed(e.to_string()))
    }

    /// Creates the container of `sandbox` for `job` (a warm one when `warm_argv` is given)
    /// with `jobdir`'s `work/` at `/work`, sets up its v1 memory group, attaches to it and
    /// starts it. Returns what is to be removed after it (the container, whatever came of
    /// the start, its group and the directory) and how the start went.
    pub(crate) async fn start_container(
        &self,
        job: &JobSpec,
        ready: &Ready,
        files: &ContainerFiles<'_>,
        jobdir: JobDir,
        sandbox: &str,
        warm_argv: Option<&[String]>,
    ) -> (Leftovers, Result<Started, DockerError>) {
        let name = spec::container_name(sandbox);
        let guard = ContainerGuard::new(&self.config.socket, &name);
        let mut created_id = None;
        let started = self
            .create_and_start(
                job,
                ready,
                files,
                &jobdir.work(),
                sandbox,
                warm_argv,
                &mut created_id,
            )
            .await;
        let leftovers = Leftovers {
            docker: ready.docker.clone(),
            tcp: ready.tcp.clone(),
            guard,
            created_id,
            name,
            jobdir,
        };
        (leftovers, started)
    }

    /// [`DockerBackend::start_container`]'s steps; `created_id` receives the container's
    /// id as soon as it exists, for the removal.
    #[allow(clippy::too_many_arguments)]
    async fn create_and_start(
        &self,
        job: &JobSpec,
        ready: &Ready,
        files: &ContainerFiles<'_>,
        workdir: &std::path::Path,
        sandbox: &str,
        warm_argv: Option<&[String]>,
        created_id: &mut Option<String>,
    ) -> Result<Started, DockerError> {
        let docker = &ready.docker;
        let name = spec::container_name(sandbox);
        let name = name.as_str();
        let v1_groups = match &ready.tcp {
            TcpAccounting::V1(groups) => Some(groups),
            TcpAccounting::Inherent => None,
        };
        let cgroup_parent = v1_groups.map(V1Groups::cgroup_parent);
        let body = spec::container_body(
            job,
            &ContainerPlan {
                flavor: self.config.flavor,
                image_id: &files.image.id,
                workdir,
                out_dir: files.out.map(OutMount::path),
                runtime: self.config.runtime.as_deref(),
                boot_id: &self.boot_id,
                seccomp_profile: &self.seccomp_profile,
                empty_file: files.empty_file,
                trust_bundle: files.trust_bundle,
                nproc_ceiling: self.nproc_ceiling,
                proxy_port: (job.network == NetworkMode::Proxy)
                    .then_some(airlock_core::job::PROXY_PORT),
                cgroup_parent: cgroup_parent.as_deref(),
                sandbox,
                warm_argv,
            },
        );
        let has_stdin = body.open_stdin == Some(true);
        let setup_started = Instant::now();
        let setup = async {
            let created = docker
                .create_container(
                    Some(CreateContainerOptions {
                        name: Some(name.to_owned()),
                        platform: String::new(),
                    }),
                    body,
                )
                .await
                .map_err(engine("create", name))?;
            *created_id = Some(created.id.clone());
            // Before anything of the container runs: the kernel charges a socket to its
            // group only if the group's TCP limit was set when the socket was made.
            if let Some(groups) = v1_groups {
                let limit = job.limits.memory.as_u64();
                let id = created.id.clone();
                let groups = groups.clone();
                tokio::task::spawn_blocking(move || {
                    groups
                        .create(&id, limit)
                        .map_err(|e| (groups.group_dir(&id), e))
                })
                .await
                .map_err(|e| DockerError::Task(format!("cgroup task: {e}")))?
                .map_err(|(path, source)| DockerError::TcpGroup {
                    container: name.to_owned(),
                    path,
                    source,
                })?;
            }
            // Attach before start, so no output is missed.
            let attached = docker
                .attach_container(
                    name,
                    Some(AttachContainerOptions {
                        stream: true,
                        stdout: true,
                        stderr: true,
                        stdin: has_stdin,
                        logs: false,
                        detach_keys: None,
                    }),
                )
                .await
                .map_err(engine("attach to", name))?;
            docker
                .start_container(name, None)
                .await
                .map_err(engine("start", name))?;
            Ok::<_, DockerError>(attached)
        };
        let attached = match tokio::time::timeout(SETUP_TIMEOUT, setup).await {
            Ok(result) => result?,
            Err(_) => {
                return Err(DockerError::Deadline {
                    container: name.to_owned(),
                    step: "start",
                    seconds: SETUP_TIMEOUT.as_secs(),
                });
            }
        };
        let started_at = Instant::now();
        // The first process's host pid: a warm container's CPU share is raised through its
        // cgroup, and on v1 its memory group is checked.
        let pid = if v1_groups.is_some() || warm_argv.is_some() {
            match container_pid(docker, name).await {
                Ok(pid) => Some(pid),
                // It already ended: nothing of it runs unbounded any more.
                Err(e) => {
                    tracing::debug!(container = %name, error = %e, "no pid to check the cgroups of");
                    None
                }
            }
        } else {
            None
        };
        if let (Some(groups), Some(id), Some(pid)) = (v1_groups, created_id.as_deref(), pid) {
            // The daemon chose the group from the parent airlock gave; had it chosen
            // another, the job's sockets would be unbounded: it is removed (with the
            // container, by the caller) rather than run on.
            groups
                .check_member(pid, id)
                .map_err(|reason| DockerError::TcpGroupNotUsed {
                    container: name.to_owned(),
                    reason,
                })?;
        }
        let setup = started_at.saturating_duration_since(setup_started);
        tracing::debug!(
            sandbox,
            setup_ms = setup.as_millis() as u64,
            "container started"
        );
        Ok(Started {
            output: attached.output,
            input: attached.input,
            started_at,
            setup,
            pid,
        })
    }

    /// Runs a cold job's started container to its end: the egress proxy in proxy mode,
    /// then the job's stdin and [`DockerBackend::supervise_started`].
    #[allow(clippy::too_many_arguments)]
    async fn run_started(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
        ready: &Ready,
        image: &CheckedImage,
        name: &str,
        started: Started,
        proxy_config: Option<Arc<airlock_proxy::ProxyConfig>>,
    ) -> Result<RunReport, DockerError> {
        // Proxy mode: bind the proxy's socket in the container's own network namespace,
        // serve it, then release the program (it waits for one line on stdin).
        let proxy = match &proxy_config {
            Some(config) => Some(
                self.start_proxy(&ready.docker, name, config.clone())
                    .await?,
            ),
            None => None,
        };
        let mut stdin_bytes = Vec::new();
        if proxy.is_some() {
            stdin_bytes.push(b'\n');
        }
        if let Some(bytes) = &job.stdin {
            stdin_bytes.extend_from_slice(bytes);
        }
        let mut report = self
            .supervise_started(job, tap, ready, image, name, started, stdin_bytes)
            .await?;
        report.network = match proxy {
            Some(proxy) => Some(proxy.shutdown().await.into_report()),
            None => None,
        };
        Ok(report)
    }

    /// Runs a started container's job to its end through the supervision core, its wall
    /// time from `started.started_at`: writes `stdin_bytes` to its stdin and closes it,
    /// reads its output, kills it at a limit, and reads how it ended.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn supervise_started(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
        ready: &Ready,
        image: &CheckedImage,
        name: &str,
        started: Started,
        stdin_bytes: Vec<u8>,
    ) -> Result<RunReport, DockerError> {
        let docker = &ready.docker;
        let Started {
            output,
            mut input,
            started_at,
            setup,
            ..
        } = started;
        // The writer holds the attach connection's write half: a job that never reads its
        // input would keep the connection (and the daemon's delivery of its output to it)
        // open past this job, so it ends with the job.
        let _stdin_writer = if stdin_bytes.is_empty() {
            drop(input);
            None
        } else {
            Some(AbortOnDrop(tokio::spawn(async move {
                // The job may exit without reading its input.
                let _ = input.write_all(&stdin_bytes).await;
                let _ = input.shutdown().await;
            })))
        };

        let wait: Pin<Box<dyn Stream<Item = _> + Send>> = Box::pin(docker.wait_container(
            name,
            Some(WaitContainerOptions {
                condition: "not-running".to_owned(),
            }),
        ));
        let supervised = supervise(
            Supervision::of(job, started_at, DRAIN_TIMEOUT),
            ContainerSandbox { docker, name, wait },
            AttachSource {
                output,
                job_id: job.id.as_str(),
            },
            JobOutput::new(&job.limits, tap),
        )
        .await?;
        tracing::debug!(job_id = %job.id, "container stopped and its output drained");
        let limit_hit = supervised.limit_hit;
        let state = docker
            .inspect_container(name, None)
            .await
            .map_err(engine("inspect", name))?
            .state
            .unwrap_or_default();
        tracing::debug!(job_id = %job.id, "container state read");
        let termination = match state.exit_code {
            Some(code) if code > SIGNAL_EXIT_BASE && code <= SIGNAL_EXIT_BASE + SIGNAL_MAX => {
                Termination::Signaled((code - SIGNAL_EXIT_BASE) as i32)
            }
            Some(code) => Termination::Exited(i32::try_from(code).unwrap_or(i32::MAX)),
            None => Termination::Unknown,
        };
        let mut oom_kills = u64::from(state.oom_killed.unwrap_or(false));
        // Podman 4.3 on cgroup v1 does not report OOMKilled. The job's pid 1 ignores
        // SIGKILL from inside its namespace, so a SIGKILL airlock did not send came from
        // the kernel: the OOM killer.
        // gVisor's kernel may kill the job itself when it runs out of memory, before the
        // host cgroup's OOM killer acts, and the daemon then sees no OOM either.
        if matches!(self.config.flavor, Flavor::Podman | Flavor::Gvisor)
            && limit_hit.is_none()
            && termination == Termination::Signaled(SIGKILL)
        {
            oom_kills = oom_kills.max(1);
        }
        Ok(RunReport {
            termination,
            limit_hit,
            oom_kills,
            stdout: supervised.stdout,
            stderr: supervised.stderr,
            duration: supervised.duration,
            setup,
            cpu_time: None,
            peak_memory_bytes: None,
            image_digest: Some(image.digest.clone()),
            degraded: Vec::new(),
            out_files: Vec::new(),
            out_rejected: Vec::new(),
            network: None,
        })
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

/// What a container is made of besides its job directory: its image, the empty file that
/// hides devices, the job's CA bundle when the proxy intercepts TLS, and `/out` when
/// enabled.
pub(crate) struct ContainerFiles<'a> {
    pub(crate) image: &'a CheckedImage,
    pub(crate) empty_file: &'a std::path::Path,
    pub(crate) trust_bundle: Option<&'a std::path::Path>,
    pub(crate) out: Option<&'a OutMount>,
}

/// A container that has started, attached before its start.
pub(crate) struct Started {
    output: Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
    input: Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    /// When the start returned: a cold job's wall time counts from here.
    started_at: Instant,
    /// From the creation to the start.
    pub(crate) setup: Duration,
    /// The host pid of its first process, when it was read (warm containers, and on v1
    /// for the memory group's check).
    pub(crate) pid: Option<u32>,
}

impl Started {
    /// The same container, its job's wall time counted from now (a warm container's
    /// delivery), `setup` the time the delivery took before.
    pub(crate) fn delivered(self, setup: Duration) -> Self {
        Self {
            started_at: Instant::now(),
            setup,
            ..self
        }
    }
}

/// The empty read-only file in each job directory that hides device nodes
/// ([`spec::GVISOR_HIDDEN_DEVICE_NODES`]).
const EMPTY_FILE_NAME: &str = "empty";

/// Creates an empty file nobody may write (mode 0444).
fn create_empty_file(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(path)
        .map(drop)
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

/// A container as the supervision core sees it: it ends when the daemon's wait stream
/// says it stopped, and is killed with a kill request.
struct ContainerSandbox<'a> {
    docker: &'a Docker,
    name: &'a str,
    wait: Pin<
        Box<
            dyn Stream<
                    Item = Result<bollard::models::ContainerWaitResponse, bollard::errors::Error>,
                > + Send,
        >,
    >,
}

impl Sandbox for ContainerSandbox<'_> {
    type Exit = ();
    type Error = DockerError;

    async fn wait(&mut self) -> Result<(), DockerError> {
        // Ok, an error carrying a non-zero exit code, or the stream's end: either way it
        // stopped; how is read from the container's state afterwards.
        let _ = next(&mut self.wait).await;
        Ok(())
    }

    fn kill(&mut self) -> Kill {
        let docker = self.docker.clone();
        let name = self.name.to_owned();
        // The daemon may not answer the request until it has delivered the output the
        // job wrote meanwhile: the core keeps reading while it is pending.
        Kill::Started {
            request: Box::pin(async move { kill(&docker, &name).await }),
            grace: KILL_GRACE,
        }
    }
}

/// Kills the container with SIGKILL. Whether it stopped is the wait stream's to say.
async fn kill(docker: &Docker, name: &str) {
    let options = KillContainerOptions {
        signal: "SIGKILL".to_owned(),
    };
    if let Err(e) = docker.kill_container(name, Some(options)).await {
        // 409: it stopped by itself meanwhile.
        tracing::debug!(container = %name, error = %e, "kill");
    }
}

/// The attach stream as the supervision core reads it.
struct AttachSource<'a> {
    output: Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
    job_id: &'a str,
}

impl OutputSource<DockerError> for AttachSource<'_> {
    async fn next_chunk(&mut self) -> Result<Option<Chunk>, DockerError> {
        loop {
            return Ok(match next(&mut self.output).await {
                Some(Ok(LogOutput::StdOut { message } | LogOutput::Console { message })) => {
                    Some((StreamKind::Stdout, message.to_vec()))
                }
                Some(Ok(LogOutput::StdErr { message })) => {
                    Some((StreamKind::Stderr, message.to_vec()))
                }
                Some(Ok(LogOutput::StdIn { .. })) => continue,
                Some(Err(e)) => {
                    tracing::warn!(job_id = self.job_id, error = %e, "output stream failed");
                    None
                }
                None => None,
            });
        }
    }
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

impl Backend for DockerBackend {
    fn kind(&self) -> BackendKind {
        self.config.flavor.kind()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: self.config.flavor.kind(),
            network_proxy: self.config.flavor != Flavor::Gvisor,
            out_dir: rustix::process::geteuid().is_root(),
            image_rootfs: true,
        }
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

/// How this daemon's containers get their TCP buffers charged, from what it reports and
/// what this host has; refused when they cannot be.
pub(crate) fn tcp_accounting(
    flavor: Flavor,
    info: &bollard::models::SystemInfo,
) -> Result<TcpAccounting, DockerError> {
    let unbounded = |reason: String| DockerError::TcpUnbounded {
        backend: flavor.as_str(),
        reason,
    };
    // Unreadable files read as empty: the plan then refuses for a missing mount.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let version = info.cgroup_version.as_ref().map(|v| v.to_string());
    let driver = info.cgroup_driver.as_ref().map(|d| d.to_string());
    let accounting = crate::tcp::plan(
        flavor,
        &HostFacts {
            cgroup_version: version.as_deref(),
            cgroup_driver: driver.as_deref(),
            mountinfo: &mountinfo,
            cmdline: &cmdline,
            root: rustix::process::geteuid().is_root(),
        },
    )
    .map_err(unbounded)?;
    if let TcpAccounting::V1(groups) = &accounting
        && !groups.kernel_accounts_tcp()
    {
        return Err(unbounded(format!(
            "no {} in the v1 memory hierarchy: this kernel does not charge TCP buffers to \
             memory cgroups (CONFIG_MEMCG_KMEM off), so a job's sockets could pin memory \
             far past its limit; use cgroup v2",
            crate::tcp::TCP_LIMIT_FILE
        )));
    }
    Ok(accounting)
}

/// The host pid of a running container's first process.
async fn container_pid(docker: &Docker, name: &str) -> Result<u32, String> {
    let state = docker
        .inspect_container(
            name,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .map_err(|e| format!("inspect: {e}"))?
        .state
        .unwrap_or_default();
    match (state.running, state.pid) {
        (Some(true), Some(pid)) if pid > 0 => {
            u32::try_from(pid).map_err(|_| format!("bad pid {pid}"))
        }
        _ => Err("the container is not running".to_owned()),
    }
}
