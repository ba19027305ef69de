//! Warm containers: a Python job for a long-running server starts in a container that was
//! created and started ahead of it, its interpreter already loaded.
//!
//! A warm container is a cold job's container, built by the same spec builder from the
//! pool's template job (read-only root, no network, capabilities dropped,
//! `no-new-privileges`, the seccomp profile, the limits, on v1 its TCP memory group,
//! `/tmp`, `/work`, the labels the sweep finds it by). What differs is how it waits
//! ([`crate::spec::ContainerPlan::warm_argv`]): its program is the job's interpreter with
//! the job's flags and environment running the bootstrap of `airlock_core::warm::python`,
//! which blocks reading its stdin (attached before the start, as a cold job's output is);
//! and it waits at `CpuShares` 2, the smallest share the engines take.
//!
//! Delivering a job writes its files into the container's `/work` (a host directory bound
//! into it), writes the container's cgroup back to the kernel's default CPU share (what a
//! cold container has: the engines cannot, since runsc has no `update`), then sends the
//! framed message and the job's stdin on the container's stdin and closes it. From there
//! the job runs, and is supervised, measured and removed, exactly as a cold job's container
//! (`DockerBackend::supervise_started`), its wall time counted from the delivery; on
//! Docker and Podman its output and end come without the daemon (docs/docker.md). The pool
//! itself (hits, refills, idle lifetime, shutdown, metrics) is every backend's:
//! [`airlock_core::warm::WarmPool`].

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use airlock_cgroup::{CpuPriority, Hierarchy};
use airlock_core::warm::python::{self, WarmOutput, WarmStdin};
use airlock_core::warm::{WarmPool, WarmPoolConfig, WarmSandboxes};
use airlock_core::{
    Backend, BackendKind, BoxFuture, Capabilities, JobId, JobSpec, OutputTap, RunReport, Teardown,
    WarmPoolStats,
};
use airlock_host::exits::ExitEvents;
use airlock_host::jobdir::{JobDir, WorkBacking};
use tokio::io::unix::AsyncFd;

use crate::Flavor;
use crate::backend::{AbortOnDrop, DockerBackend, JOB_IDS, next};
use crate::error::DockerError;
use crate::handoff::OutputHandoff;
use crate::image::CheckedImage;
use crate::launch::{ContainerFiles, Started};
use crate::spec;
use crate::supervise::{EndSource, ReportedEnd, stopped};
use crate::teardown::Leftovers;

/// A container backend with a pool of warm containers for one language's jobs.
pub type PooledContainers = WarmPool<WarmContainers>;

/// Keeps `config.size` containers started for jobs like `template` (a job of the pool's
/// language with the policy's defaults), starting them in the background; one unused for
/// `config.idle_max` is removed and replaced. Must be called inside a tokio runtime.
pub fn start(
    backend: Arc<DockerBackend>,
    template: JobSpec,
    config: WarmPoolConfig,
) -> Result<PooledContainers, DockerError> {
    let flavor = backend.config().flavor;
    let refuse = |reason: String| DockerError::WarmPool {
        backend: flavor.as_str(),
        reason,
    };
    if let Some(reason) = python::unsupported_template(&template) {
        return Err(refuse(reason));
    }
    let mut template = template;
    if template.filesystem.out.enabled {
        // /out is a tmpfs mounted for each job: a warm container has none, and jobs that
        // ask for it run in a fresh one. With /out on by default that is every job.
        tracing::warn!(backend = %flavor,
            "the policy gives jobs /out, which warm containers do not have: such jobs run in fresh containers");
        template.filesystem.out.enabled = false;
    }
    // Where the containers' cgroups are, to give a delivered job its CPU share.
    let hierarchy = Hierarchy::detect()
        .map_err(|e| refuse(format!("read the host's cgroup hierarchies: {e}")))?;
    let argv = python::warm_argv(&template, &[], 0).unwrap_or_default();
    let exits = match flavor {
        // The container's first process is the job's own interpreter, a host process.
        Flavor::Docker | Flavor::Podman => match ExitEvents::shared() {
            Ok(exits) => Some(exits),
            Err(reason) => {
                tracing::info!(backend = %flavor, %reason,
                    "warm containers learn of their jobs' ends from the daemon (slower)");
                None
            }
        },
        // Its first process is gVisor's sandbox, and a host socket does not connect from
        // inside it (runsc's --host-uds is off by default): its jobs end through the daemon.
        Flavor::Gvisor => None,
    };
    let containers = WarmContainers {
        backend,
        template,
        argv,
        hierarchy,
        exits,
        kernel_ends: AtomicU64::new(0),
        engine_ends: AtomicU64::new(0),
    };
    Ok(WarmPool::start(Arc::new(containers), config))
}

/// How a container backend's warm containers start, wait and take their job: the pool's
/// side of [`PooledContainers`].
pub struct WarmContainers {
    backend: Arc<DockerBackend>,
    template: JobSpec,
    /// The warm program: the template's interpreter and flags running the bootstrap, which
    /// reads its job from descriptor 0.
    argv: Vec<String>,
    hierarchy: Hierarchy,
    /// The kernel's process events, when this host gives them to airlock and the engine
    /// runs the container's first process on the host (docs/docker.md, "How a warm
    /// container's job ends"): its jobs' ends come from there, not from the daemon.
    exits: Option<Arc<ExitEvents>>,
    /// Delivered jobs whose end the kernel told, and the daemon told.
    kernel_ends: AtomicU64,
    engine_ends: AtomicU64,
}

impl std::fmt::Debug for WarmContainers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmContainers")
            .field("backend", &self.backend.config().flavor)
            .field("language", &self.template.language)
            .finish_non_exhaustive()
    }
}

/// A started container waiting for its job.
pub struct WaitingContainer {
    /// Its name as a sandbox (`warm-<uuid>`): its job directory's and `airlock.job` label's.
    sandbox: String,
    started: Started,
    image: CheckedImage,
    /// The container, its v1 memory group and its job directory; the guard in it removes
    /// the container if this is dropped.
    leftovers: Leftovers,
    /// How it is known to be still alive, and so how its job's end will be learned.
    liveness: Liveness,
}

/// How a waiting container is known to be alive.
enum Liveness {
    /// Its first process, held by a pidfd: its job's end comes from the kernel.
    Pidfd(WaitingReport),
    /// The daemon's wait, in a task: `exited` is set once the daemon reports it stopped.
    Daemon {
        exited: Arc<AtomicBool>,
        _watch: AbortOnDrop,
    },
}

/// A waiting container's side of [`ReportedEnd`]: the watch and the output's handoff
/// start at delivery.
struct WaitingReport {
    /// Its first process's host pid, and a pidfd of it.
    pid: u32,
    pidfd: AsyncFd<OwnedFd>,
}

/// Whether the process of `pidfd` has exited (the pidfd is readable).
fn has_exited(pidfd: BorrowedFd<'_>) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        &pidfd,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero)).map_or(true, |ready| ready > 0)
}

/// A pidfd of `pid`, the first process of container `id`, checked to be that container's
/// (its cgroup names the id) once the pidfd holds it.
fn container_pidfd(pid: u32, id: &str) -> Result<AsyncFd<OwnedFd>, String> {
    let raw = rustix::process::Pid::from_raw(i32::try_from(pid).map_err(|_| "bad pid")?)
        .ok_or("pid 0")?;
    let pidfd = rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty())
        .map_err(|e| format!("pidfd_open: {e}"))?;
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_err(|e| format!("read its cgroup: {e}"))?;
    if !cgroup.contains(id) || has_exited(pidfd.as_fd()) {
        return Err(format!("process {pid} is no longer container {id}'s"));
    }
    airlock_sys::process::async_owned_fd(pidfd, tokio::io::Interest::READABLE)
        .map_err(|e| format!("register the pidfd: {e}"))
}

impl WarmContainers {
    /// Creates and starts one warm container.
    async fn start_one(&self) -> Result<WaitingContainer, DockerError> {
        let backend = &self.backend;
        let (ready, image) = backend.checked(&self.template).await?;
        let sandbox = format!("warm-{}", JobId::generate().as_str());
        let jobdir = JobDir::create_empty(
            backend.runtime_dir(),
            &sandbox,
            &JOB_IDS,
            WorkBacking::Directory,
        )
        .map_err(DockerError::JobDir)?;
        let empty_file = backend.create_empty_file(&sandbox)?;
        let files = ContainerFiles {
            image: &image,
            empty_file: &empty_file,
            // A warm container has no network, so no proxy and no CA bundle of its own.
            trust_bundle: None,
            out: None,
        };
        let (leftovers, started) = backend
            .start_container(
                &self.template,
                ready,
                &files,
                jobdir,
                &sandbox,
                Some(&self.argv),
            )
            .await;
        let started = match started {
            Ok(started) if started.pid.is_some() => started,
            Ok(_) => {
                let _ = leftovers.remove(None).await;
                return Err(DockerError::WarmStart {
                    container: spec::container_name(&sandbox),
                    reason: "stopped as soon as it started",
                });
            }
            Err(e) => {
                let _ = leftovers.remove(None).await;
                return Err(e);
            }
        };
        // Its first process held by a pidfd, its job's end then the kernel's to tell; else
        // (no process events here, or the engine's pids are not this host's) the daemon
        // says when it stops. Either way one that dies while it waits is discarded, never
        // handed a job.
        let held = match (&self.exits, started.pid, leftovers.created_id.as_deref()) {
            (Some(_), Some(pid), Some(id)) => container_pidfd(pid, id)
                .map_err(|reason| {
                    tracing::debug!(container = %leftovers.name, %reason,
                        "its job's end will come from the daemon");
                })
                .ok()
                .map(|pidfd| WaitingReport { pid, pidfd }),
            _ => None,
        };
        let liveness = match held {
            Some(report) => Liveness::Pidfd(report),
            None => {
                let exited = Arc::new(AtomicBool::new(false));
                let mut wait = stopped(&ready.docker, &leftovers.name);
                let flag = exited.clone();
                let watch = AbortOnDrop(tokio::spawn(async move {
                    let _ = next(&mut wait).await;
                    flag.store(true, Ordering::SeqCst);
                }));
                Liveness::Daemon {
                    exited,
                    _watch: watch,
                }
            }
        };
        Ok(WaitingContainer {
            sandbox,
            started,
            image,
            leftovers,
            liveness,
        })
    }

    /// Runs `job` in `warm`: its files, then the message and its stdin.
    async fn deliver_to(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
        warm: WaitingContainer,
    ) -> Result<(RunReport, Teardown), DockerError> {
        let delivered_at = Instant::now();
        let WaitingContainer {
            sandbox,
            started,
            image,
            leftovers,
            liveness,
            ..
        } = warm;
        // Watched from before its job can run: its exit cannot come earlier.
        let watched = match (liveness, &self.exits) {
            (Liveness::Pidfd(WaitingReport { pid, pidfd }), Some(exits)) => {
                let watch = exits.watch(pid);
                if has_exited(pidfd.get_ref().as_fd()) {
                    // It died since it was found alive: the job gets a fresh container.
                    tracing::warn!(sandbox = %sandbox,
                        "the warm container stopped before its job came; the job runs in a fresh one");
                    let _ = leftovers.remove(None).await;
                    return self.backend.run_job_then_teardown(job, tap).await;
                }
                Some((pid, pidfd, watch))
            }
            _ => None,
        };
        // The job's files, written where the container sees its /work. Blocking work, off
        // the async threads.
        let job_files = job.clone();
        let written = tokio::task::spawn_blocking(move || {
            let written = leftovers.jobdir.write_job(&job_files, &JOB_IDS);
            (written, leftovers)
        })
        .await;
        let leftovers = match written {
            Ok((Ok(()), leftovers)) => leftovers,
            Ok((Err(e), leftovers)) => {
                let _ = leftovers.remove(None).await;
                return Err(DockerError::JobDir(e));
            }
            // The task's panic dropped the leftovers: their guard removed the container.
            Err(e) => return Err(DockerError::Task(format!("deliver task: {e}"))),
        };
        // After the job's files, whose names cannot be the socket's (it has the reserved
        // prefix).
        let reported = watched.and_then(|(pid, pidfd, watch)| {
            match OutputHandoff::listen(&leftovers.jobdir.work()) {
                Ok(handoff) => Some(ReportedEnd {
                    pid,
                    pidfd,
                    watch,
                    handoff,
                }),
                Err(e) => {
                    tracing::warn!(sandbox = %sandbox, error = %e,
                        "cannot listen for the output handoff; this job's output and end come through the daemon");
                    None
                }
            }
        });
        let output = match reported {
            Some(_) => WarmOutput::Handed,
            None => WarmOutput::Inherited,
        };
        let mut stdin = python::control_message(&self.template, job, self.stdin_mode(job), output);
        if let Some(bytes) = &job.stdin {
            stdin.extend_from_slice(bytes);
        }
        let ready = match self.backend.ready().await {
            Ok(ready) => ready,
            Err(e) => {
                let _ = leftovers.remove(None).await;
                return Err(e);
            }
        };
        tracing::debug!(job_id = %job.id, sandbox = %sandbox, "job delivered to a warm container");
        let started = started.delivered(delivered_at.elapsed());
        let ran = self
            .backend
            .supervise_started(
                job,
                tap,
                ready,
                &image,
                &leftovers.name,
                started,
                stdin,
                reported,
            )
            .await
            .map(|(report, source)| {
                match source {
                    EndSource::Kernel => &self.kernel_ends,
                    EndSource::Engine => &self.engine_ends,
                }
                .fetch_add(1, Ordering::Relaxed);
                report
            });
        match ran {
            Ok(report) => Ok((report, leftovers.teardown(job.id.to_string()))),
            Err(e) => {
                let _ = leftovers.remove(None).await;
                Err(e)
            }
        }
    }

    /// What the job's descriptor 0 becomes: with input, the stdin the message came on (a
    /// pipe, as a cold job with input has); without, what a cold container of this engine
    /// has there: `/dev/null` read-write under runc, and under gVisor a host descriptor
    /// read-only at end-of-file, which the stdin pipe is once closed.
    fn stdin_mode(&self, job: &JobSpec) -> WarmStdin {
        match (self.backend.config().flavor, &job.stdin) {
            (_, Some(_)) | (Flavor::Gvisor, None) => WarmStdin::Keep,
            (Flavor::Docker | Flavor::Podman, None) => WarmStdin::DevNullReadWrite,
        }
    }

    /// Writes the kernel's default CPU share into the cgroup of the container's first
    /// process, after checking that the group is the container's (its id is in its path).
    fn raise(&self, warm: &WaitingContainer) -> Result<(), String> {
        let (Some(pid), Some(id)) = (warm.started.pid, warm.leftovers.created_id.as_deref()) else {
            return Err("the container has no process".into());
        };
        let path = format!("/proc/{pid}/cgroup");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("read {path}: {e}"))?;
        let dir = self
            .hierarchy
            .cpu_dir_of(&text)
            .ok_or_else(|| format!("no cpu cgroup in {path}"))?;
        if !dir.to_string_lossy().contains(id) {
            return Err(format!(
                "process {pid} is in {}, not a group of container {id}",
                dir.display()
            ));
        }
        self.hierarchy
            .set_cpu_priority_of(&dir, CpuPriority::Normal)
            .map_err(|e| airlock_core::error::chain(&e))
    }
}

impl WarmSandboxes for WarmContainers {
    type Warm = WaitingContainer;
    type Error = DockerError;

    fn kind(&self) -> BackendKind {
        self.backend.config().flavor.kind()
    }

    fn capabilities(&self) -> Capabilities {
        self.backend.capabilities()
    }

    fn fits(&self, job: &JobSpec) -> bool {
        // The template has no /out ([`start`]), so neither has a job whose filesystem
        // equals it.
        python::fits(&self.template, job)
    }

    fn start(&self) -> BoxFuture<'_, Result<WaitingContainer, DockerError>> {
        Box::pin(self.start_one())
    }

    fn starts_cancel_safe(&self) -> bool {
        // A create request the daemon is still working on when its future is dropped can
        // make the container after the guard removed nothing: the start is waited for.
        false
    }

    fn name(warm: &WaitingContainer) -> &str {
        &warm.sandbox
    }

    fn is_alive(&self, warm: &mut WaitingContainer) -> bool {
        match &warm.liveness {
            Liveness::Pidfd(report) => !has_exited(report.pidfd.get_ref().as_fd()),
            Liveness::Daemon { exited, .. } => !exited.load(Ordering::SeqCst),
        }
    }

    fn add_stats(&self, stats: &mut WarmPoolStats) {
        stats.container_ends_from_kernel = self.kernel_ends.load(Ordering::Relaxed);
        stats.container_ends_from_engine = self.engine_ends.load(Ordering::Relaxed);
    }

    fn raise_priority(&self, warm: &WaitingContainer) -> Result<(), String> {
        self.raise(warm)
    }

    fn deliver<'a>(
        &'a self,
        job: &'a JobSpec,
        tap: Option<OutputTap>,
        warm: WaitingContainer,
    ) -> BoxFuture<'a, Result<(RunReport, Teardown), DockerError>> {
        Box::pin(self.deliver_to(job, tap, warm))
    }

    fn discard(&self, warm: WaitingContainer) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let sandbox = warm.sandbox;
            if let Err(e) = warm.leftovers.remove(None).await {
                tracing::warn!(sandbox = %sandbox, error = %airlock_core::error::chain(&e),
                    "cannot remove a warm container");
            }
        })
    }

    fn run_fresh<'a>(
        &'a self,
        job: &'a JobSpec,
        tap: Option<OutputTap>,
    ) -> BoxFuture<'a, Result<(RunReport, Teardown), DockerError>> {
        Box::pin(self.backend.run_job_then_teardown(job, tap))
    }
}
