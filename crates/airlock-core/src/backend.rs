//! The one interface every backend implements.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

use crate::doctor::Check;
use crate::error::ErrorKind;
use crate::job::JobSpec;
use crate::observation::RunReport;
use crate::policy::Policy;

/// A boxed, sendable future (keeps [`Backend`] object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Which backend ran a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Linux namespaces, seccomp and cgroups, no daemon.
    Native,
    /// The Docker Engine API with runc.
    Docker,
    /// Podman's Docker-compatible API.
    Podman,
    /// Docker with the runsc (gVisor) runtime.
    Gvisor,
    /// A Pod per job on Kubernetes.
    Kube,
}

impl BackendKind {
    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            BackendKind::Native => "native",
            BackendKind::Docker => "docker",
            BackendKind::Podman => "podman",
            BackendKind::Gvisor => "gvisor",
            BackendKind::Kube => "kube",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(match text {
            "native" => BackendKind::Native,
            "docker" => BackendKind::Docker,
            "podman" => BackendKind::Podman,
            "gvisor" => BackendKind::Gvisor,
            "kube" => BackendKind::Kube,
            other => {
                return Err(format!(
                    "unknown backend {other:?} (native, docker, podman, gvisor, kube)"
                ));
            }
        })
    }
}

/// What a backend can do on this host, as data: the engine, doctor and sessions ask this
/// (through the backend's [`Provider`]) instead of matching on the kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// The backend.
    pub backend: BackendKind,
    /// Whether the egress proxy mode is available.
    pub network_proxy: bool,
    /// Whether `/out` is available.
    pub out_dir: bool,
    /// Whether OCI image rootfs is available.
    pub image_rootfs: bool,
    /// Whether a job's `/work` can be a host directory that outlives it (a session's
    /// workspace): workspace sessions need it.
    pub host_workdir: bool,
    /// Whether a session's Python kernel can run as one long job whose calls the host
    /// hands over through its workspace: kernel sessions need it.
    pub kernel_sessions: bool,
    /// Whether the backend keeps an image store `airlock image load` can load into.
    pub image_store: bool,
}

impl Capabilities {
    /// A backend that can do nothing beyond running a job (a test's fake, a backend this
    /// build lacks).
    pub const fn bare(backend: BackendKind) -> Self {
        Self {
            backend,
            network_proxy: false,
            out_dir: false,
            image_rootfs: false,
            host_workdir: false,
            kernel_sessions: false,
            image_store: false,
        }
    }
}

/// How a backend is opened.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Keep the policy's warm sandboxes (`[native] warm_pool`, `[docker] warm_pool`,
    /// `gvisor_warm_pool`, `podman_warm_pool`) started ahead of jobs (for a long-running
    /// server; a single `airlock run` would only waste them). Needs a tokio runtime.
    pub warm_pool: bool,
    /// Build the warm sandboxes for this job rather than for the policy's defaults in
    /// `warm_language`, and keep at least one (`airlock run --warm`, which puts a single
    /// job through the warm path for tests and diagnosis). Only with `warm_pool`.
    pub warm_template: Option<crate::job::JobRequest>,
}

/// A backend before it is opened: how to open it, its checks of this host for `airlock
/// doctor`, its image store and what it can do. One per backend kind; the engine holds the
/// one list of them and asks it instead of matching on the kind.
pub trait Provider: Send + Sync {
    /// The backend kind this provides.
    fn kind(&self) -> BackendKind;

    /// What the backend can do (under `policy`, on this host).
    fn capabilities(&self, policy: &Policy) -> Capabilities;

    /// Opens the backend for `policy`. An error (usually `backend_unavailable`) is what
    /// jobs then end with.
    fn open(
        &self,
        policy: &Policy,
        options: OpenOptions,
    ) -> Result<std::sync::Arc<dyn Backend>, BackendError>;

    /// Its checks of this host (or daemon, or cluster) against `policy`, for `airlock
    /// doctor`, which then runs one real job through it.
    fn host_checks<'a>(&'a self, policy: &'a Policy) -> BoxFuture<'a, Vec<Check>>;

    /// Loads an image archive into the backend's image store and checks that it holds
    /// `tag` as `expected_id`. The default: the backend has no image store.
    fn load_image<'a>(
        &'a self,
        policy: &'a Policy,
        archive: Vec<u8>,
        tag: &'a str,
        expected_id: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let _ = (policy, archive, tag, expected_id);
        let kind = self.kind();
        Box::pin(async move {
            Err(BackendError::new(
                ErrorKind::InvalidInput,
                format!("the {kind} backend has no image store to load into; use docker or podman"),
            ))
        })
    }
}

/// A backend's failure to run a job (not the job's own failure).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BackendError {
    /// Its public class.
    pub kind: ErrorKind,
    /// What went wrong.
    pub message: String,
}

impl BackendError {
    /// A new error.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamKind {
    /// The program's stdout.
    Stdout,
    /// The program's stderr.
    Stderr,
}

/// Receives output as it is read, already capped: only bytes that will also be kept in the
/// observation are passed on, so a flood never reaches a client either.
pub type OutputTap = std::sync::Arc<dyn Fn(StreamKind, &[u8]) + Send + Sync>;

/// Runs jobs in sandboxes. One trait for every backend; one conformance suite checks them.
pub trait Backend: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// What it supports here.
    fn capabilities(&self) -> Capabilities;

    /// Runs one job in a fresh sandbox and returns as soon as the report is complete: every
    /// process of the job is gone and its output and `/out` are drained. When `tap` is
    /// given, kept output is also passed to it as it is read. What is left of the sandbox
    /// (its cgroup, mounts, job directory, container or pod) is removed by the returned
    /// [`Teardown`], which the caller must run before it reuses the job's slot or reports
    /// itself idle; a backend with nothing separable to remove returns
    /// [`Teardown::none`]. On an error the sandbox is removed before this returns.
    fn run_then_teardown<'a>(
        &'a self,
        job: &'a JobSpec,
        tap: Option<OutputTap>,
    ) -> BoxFuture<'a, Result<(RunReport, Teardown), BackendError>>;

    /// Like [`Backend::run_then_teardown`], but destroys the sandbox before returning.
    fn run<'a>(
        &'a self,
        job: &'a JobSpec,
        tap: Option<OutputTap>,
    ) -> BoxFuture<'a, Result<RunReport, BackendError>> {
        Box::pin(async move { Teardown::removed(self.run_then_teardown(job, tap).await).await })
    }

    /// Releases what the backend holds between jobs (sandboxes started ahead of time),
    /// before a server exits. Nothing by default.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// The warm pool's figures, when the backend keeps sandboxes started ahead of jobs.
    fn warm_pool(&self) -> Option<WarmPoolStats> {
        None
    }
}

/// The removal of a finished job's sandbox, split off the reply path by
/// [`Backend::run_then_teardown`]. Dropping it without running it still removes the
/// sandbox, synchronously, through the drop guards of what it holds; a process that dies
/// first leaves a stale sandbox that the backend sweeps at its next start.
#[must_use = "a teardown that is never run leaves the removal to drop guards"]
pub struct Teardown(Option<BoxFuture<'static, ()>>);

impl Teardown {
    /// Nothing left to remove.
    pub fn none() -> Self {
        Self(None)
    }

    /// A removal that `work` performs.
    pub fn new(work: impl Future<Output = ()> + Send + 'static) -> Self {
        Self(Some(Box::pin(work)))
    }

    /// Whether there is anything to remove.
    pub fn is_none(&self) -> bool {
        self.0.is_none()
    }

    /// The report of a [`Backend::run_then_teardown`] result once its removal has run:
    /// what [`Backend::run`] returns.
    pub async fn removed<E>(ran: Result<(RunReport, Teardown), E>) -> Result<RunReport, E> {
        let (report, teardown) = ran?;
        teardown.run().await;
        Ok(report)
    }

    /// Removes what is left of the sandbox.
    pub async fn run(self) {
        if let Some(work) = self.0 {
            work.await;
        }
    }
}

impl fmt::Debug for Teardown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Teardown(pending)"
        } else {
            "Teardown(none)"
        })
    }
}

/// Figures of a pool of sandboxes started ahead of their jobs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WarmPoolStats {
    /// Sandboxes ready now.
    pub ready: u64,
    /// Jobs that ran in a warm sandbox.
    pub hits: u64,
    /// Jobs the pool fits that found no warm sandbox ready (they started one of their own).
    pub misses: u64,
    /// Jobs the pool does not fit (other language, limits, environment, network, `/out`).
    pub unfit: u64,
    /// Warm sandboxes started.
    pub started: u64,
    /// Warm sandboxes that failed to start.
    pub failed: u64,
    /// Warm sandboxes discarded without a job: found dead while waiting, idle past the
    /// pool's lifetime, or their CPU priority not raised for a job.
    pub discarded: u64,
    /// Of the misses, jobs that ran in a sandbox started for them at once (forked from the
    /// native zygote) rather than in a fresh one.
    pub started_for_jobs: u64,
    /// Of the unfit, session jobs (a kernel session's kernel) that ran in a sandbox started
    /// for them with the session's mounts (forked from the native zygote) rather than in a
    /// fresh one.
    pub started_for_sessions: u64,
    /// Of the hits, jobs that ran in a sandbox forked from a zygote (`[native] zygote`).
    pub forked_hits: u64,
    /// Of the sandboxes started, those forked from a zygote.
    pub forked: u64,
    /// Forks that failed (the slot was then filled by a sandbox started from scratch).
    pub fork_failed: u64,
    /// Zygotes started.
    pub zygotes_started: u64,
    /// Zygotes that failed to start.
    pub zygotes_failed: u64,
    /// Zygotes that died or became unusable while serving (each replaced).
    pub zygotes_lost: u64,
    /// Warm container jobs whose end the kernel told (a pidfd and the process events),
    /// without waiting for the container engine.
    pub container_ends_from_kernel: u64,
    /// Warm container jobs whose end the container engine told (gVisor, no process
    /// events on this host, or a job the events cannot tell the status of).
    pub container_ends_from_engine: u64,
}

impl WarmPoolStats {
    /// The sum of two pools' figures.
    pub fn add(&mut self, other: &WarmPoolStats) {
        self.ready += other.ready;
        self.hits += other.hits;
        self.misses += other.misses;
        self.unfit += other.unfit;
        self.started += other.started;
        self.failed += other.failed;
        self.discarded += other.discarded;
        self.started_for_jobs += other.started_for_jobs;
        self.started_for_sessions += other.started_for_sessions;
        self.forked_hits += other.forked_hits;
        self.forked += other.forked;
        self.fork_failed += other.fork_failed;
        self.zygotes_started += other.zygotes_started;
        self.zygotes_failed += other.zygotes_failed;
        self.zygotes_lost += other.zygotes_lost;
        self.container_ends_from_kernel += other.container_ends_from_kernel;
        self.container_ends_from_engine += other.container_ends_from_engine;
    }
}
