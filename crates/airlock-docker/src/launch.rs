//! Launching a container: connecting to the daemon (once per backend), creating the
//! container of a job (or a warm one) with its files, its v1 memory group, attaching to it
//! and starting it; binding the egress proxy in its network namespace.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_core::JobSpec;
use airlock_core::policy::NetworkMode;
use airlock_host::jobdir::JobDir;
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::query_parameters::{AttachContainerOptions, CreateContainerOptions};
use futures_core::Stream;

use crate::Flavor;
use crate::backend::{CONNECT_TIMEOUT, DockerBackend, Ready, SETUP_TIMEOUT, engine};
use crate::error::DockerError;
use crate::host_checks::{GVISOR_SECCOMP_FLAG, tcp_accounting};
use crate::image::CheckedImage;
use crate::outdir::OutMount;
use crate::spec::{self, ContainerPlan};
use crate::tcp::{TcpAccounting, V1Groups};
use crate::teardown::{ContainerGuard, Leftovers};

impl DockerBackend {
    pub(crate) async fn ready(&self) -> Result<&Ready, DockerError> {
        self.ready.get_or_try_init(|| self.connect()).await
    }

    async fn connect(&self) -> Result<Ready, DockerError> {
        let backend = self.config.flavor.as_str();
        let socket = self.config.socket.clone();
        let docker = crate::engine::connect(&socket).map_err(|source| DockerError::Connect {
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
        match crate::sweep::sweep(&docker, &self.runtime_dir, &tcp).await {
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
    pub(crate) async fn start_proxy(
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
    pub(crate) output:
        Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
    pub(crate) input: Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    /// When the start returned: a cold job's wall time counts from here.
    pub(crate) started_at: Instant,
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
