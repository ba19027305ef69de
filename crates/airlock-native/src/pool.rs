//! Warm sandboxes: Python jobs for a long-running server start in a sandbox that was built
//! ahead of time, with the interpreter already loaded.
//!
//! A warm sandbox is an ordinary sandbox (its own job directory, cgroup, namespaces, uid
//! 65534, seccomp) whose program is a small bootstrap run by the job's own interpreter
//! with the job's own flags, environment and limits. The bootstrap blocks reading the
//! control pipe ([`CONTROL_FD`](crate::plan::CONTROL_FD)). Delivering a job writes its
//! files into `/work`, sends its arguments on that pipe and closes it; the bootstrap then
//! runs `/work/<file>` as `__main__`, as `python3 -I /work/<file>` would (the bootstrap
//! and its message are every backend's: `airlock_core::warm::python`). Each warm sandbox
//! runs one job and is torn down like any other; the pool (`airlock_core::warm`, shared
//! with the container backends) starts a replacement in the background. A job the template
//! does not fit (other limits, environment, network, `/out`, language) runs in a fresh
//! sandbox as always.
//!
//! What is the native backend's own is how a sandbox starts: with `[native] zygote`, forked
//! from the pool's zygote ([`crate::zygote`]), which this side of the pool starts, replaces
//! once dead or past the idle lifetime (backing off while its starts fail), and removes
//! once retired and childless; from scratch when there is no zygote, when it has as many
//! children as it may, or when a fork fails. The zygote changes how fast a sandbox is
//! ready, never whether.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_cgroup::{CpuPriority, JobCgroup};
use airlock_core::warm::python::{self, WarmStdin};
use airlock_core::warm::{REFILL_BACKOFF_MIN, WarmPool, WarmPoolConfig, WarmSandboxes};
use airlock_core::{
    BackendKind, BoxFuture, Capabilities, JobId, JobSpec, OutputTap, RunReport, Teardown,
    WarmPoolStats,
};

use crate::backend::NativeBackend;
use crate::error::NativeError;
use crate::launch::Launched;
use crate::plan::{CONTROL_FD, IdMapping};
use crate::teardown::teardown;
use crate::zygote::{SessionMounts, ZYGOTE_CHILDREN_MAX, Zygote};
use airlock_host::jobdir::{JobDir, WorkBacking};

/// Longest wait before a zygote is started again after its start failed.
const ZYGOTE_RETRY_MAX: Duration = Duration::from_secs(300);

/// The native backend with a pool of warm sandboxes for one language's jobs.
pub type PooledNative = WarmPool<NativeWarm>;

/// How a pool of warm native sandboxes is kept.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Sandboxes kept ready ([native] warm_pool).
    pub size: usize,
    /// Longest a sandbox (or a zygote) waits before it is replaced ([native] warm_idle).
    pub idle_max: Duration,
    /// Modules each warm interpreter, or the zygote, imports ([native] warm_preload).
    pub preload: Vec<String>,
    /// Whether sandboxes are forked from a zygote ([native] zygote).
    pub zygote: bool,
    /// Most sandboxes one zygote forks before it is replaced ([native] zygote_forks).
    pub zygote_forks: u32,
    /// Most sandboxes ever started, `None` for no bound: `airlock run --warm` starts one,
    /// for its one job, and no replacement after it.
    pub starts_max: Option<u64>,
}

/// Keeps `config.size` sandboxes started for jobs like `template` (a job of the pool's
/// language with the policy's defaults), starting them in the background; one unused for
/// `config.idle_max` is torn down and replaced. Must be called inside a tokio runtime.
pub fn start(
    backend: Arc<NativeBackend>,
    template: JobSpec,
    config: PoolConfig,
) -> Result<PooledNative, NativeError> {
    let PoolConfig {
        size,
        idle_max,
        preload,
        zygote,
        zygote_forks,
        starts_max,
    } = config;
    if let Some(reason) = python::unsupported_template(&template) {
        return Err(NativeError::Unsupported {
            control: "warm pool",
            reason,
        });
    }
    let zygote = zygote && {
        let root = matches!(backend.id_mapping(), IdMapping::Root { .. });
        if !root {
            tracing::warn!(
                "[native] zygote needs a root airlock; warm sandboxes start from scratch"
            );
        }
        root
    };
    let argv = python::warm_argv(&template, &preload, CONTROL_FD).unwrap_or_default();
    let sandboxes = NativeWarm {
        backend,
        template,
        argv,
        preload,
        idle_max,
        zygote,
        zygote_forks: u64::from(zygote_forks.max(1)),
        zygotes: Mutex::new(Zygotes::default()),
        counters: ZygoteCounters::default(),
    };
    let config = WarmPoolConfig {
        size,
        idle_max,
        starts_max,
    };
    Ok(WarmPool::start(Arc::new(sandboxes), config))
}

/// How the native backend's warm sandboxes start (forked from a zygote or from scratch),
/// wait and take their job: the pool's side of [`PooledNative`].
pub struct NativeWarm {
    backend: Arc<NativeBackend>,
    template: JobSpec,
    /// The warm program of a sandbox started from scratch: the template's interpreter and
    /// flags running the bootstrap.
    argv: Vec<String>,
    /// Modules each warm interpreter, or the zygote, imports ([native] warm_preload).
    preload: Vec<String>,
    /// Past it a zygote is replaced, as a waiting sandbox is.
    idle_max: Duration,
    /// Whether sandboxes are forked from a zygote ([native] zygote).
    zygote: bool,
    /// Past this many forks a zygote is replaced, as past the idle lifetime: its children
    /// share its layout and hash secret, and this bounds how many do.
    zygote_forks: u64,
    zygotes: Mutex<Zygotes>,
    counters: ZygoteCounters,
}

/// The zygote's figures (the pool counts the rest).
#[derive(Default)]
struct ZygoteCounters {
    forked_hits: AtomicU64,
    forked: AtomicU64,
    fork_failed: AtomicU64,
    zygotes_started: AtomicU64,
    zygotes_failed: AtomicU64,
    zygotes_lost: AtomicU64,
}

/// The pool's zygotes ([native] zygote): the one it forks from, and those retired
/// (idle past their lifetime, or dead) whose children still run.
#[derive(Default)]
struct Zygotes {
    active: Option<Arc<Zygote>>,
    /// Children the active zygote was taken for (forks tried), since it started.
    active_forks: u64,
    retired: Vec<Arc<Zygote>>,
    /// No new zygote is started before this, after one failed to start.
    retry_at: Option<Instant>,
    backoff: Duration,
}

impl std::fmt::Debug for NativeWarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeWarm")
            .field("language", &self.template.language)
            .field("zygote", &self.zygote)
            .finish_non_exhaustive()
    }
}

/// A started sandbox waiting for its job.
pub struct WaitingSandbox {
    name: String,
    launched: Launched,
    jobdir: JobDir,
    cgroup: Option<JobCgroup>,
    /// The zygote it was forked from, kept until the sandbox is removed: its template
    /// sandbox must outlive every child.
    zygote: Option<Arc<Zygote>>,
    /// Forked at once for a job that found none ready, rather than ahead of it.
    for_job: bool,
    /// The job's files are in place already (a session's, written before its fork).
    job_written: bool,
}

impl NativeWarm {
    /// Starts one warm sandbox: forked from the zygote when there is one that can take
    /// another child, from scratch otherwise (and when the fork fails).
    async fn launch_warm(&self) -> Result<WaitingSandbox, NativeError> {
        if let Some(zygote) = self.zygote_to_fork_from() {
            match self.launch_forked(zygote).await {
                Ok(warm) => {
                    self.counters.forked.fetch_add(1, Ordering::Relaxed);
                    return Ok(warm);
                }
                Err(e) => {
                    self.counters.fork_failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e,
                        "cannot fork a warm sandbox from the zygote; starting one from scratch");
                }
            }
        }
        let (name, jobdir, cgroup) = self.prepare_sandbox(CpuPriority::Background)?;
        let backend = &self.backend;
        let mut plan = match backend.plan(&self.template, &jobdir, cgroup.as_ref(), None) {
            Ok(plan) => plan,
            Err(e) => {
                let _ = tokio::task::spawn_blocking(move || teardown(cgroup, jobdir)).await;
                return Err(e);
            }
        };
        plan.job_id.clone_from(&name);
        plan.argv.clone_from(&self.argv);
        plan.control_fd = true;
        let launched = backend
            .launch(&name, &plan, true, jobdir.work_mount())
            .await;
        ready_or_removed(name, jobdir, cgroup, launched, None).await
    }

    /// Forks one warm sandbox from `zygote`.
    async fn launch_forked(&self, zygote: Arc<Zygote>) -> Result<WaitingSandbox, NativeError> {
        let (name, jobdir, cgroup) = self.prepare_sandbox(CpuPriority::Background)?;
        let send_out_dir = self.template.filesystem.out.enabled;
        let launched = zygote
            .fork(&name, &jobdir, cgroup.as_ref(), send_out_dir)
            .await;
        ready_or_removed(name, jobdir, cgroup, launched, Some(zygote)).await
    }

    /// Forks a sandbox for a job that found none ready, at the job's CPU priority: its
    /// cgroup at normal priority from the start, and the zygote's raised to it while it
    /// forks (a job waits on it now; a refill's forks, queued before, go at that priority
    /// too, which only brings their sandboxes sooner). About a millisecond of the zygote
    /// and a few of the child's setup, against a whole sandbox and interpreter start.
    async fn fork_for_job(&self, zygote: Arc<Zygote>) -> Result<WaitingSandbox, NativeError> {
        let (name, jobdir, cgroup) = self.prepare_sandbox(CpuPriority::Normal)?;
        let send_out_dir = self.template.filesystem.out.enabled;
        let launched = {
            let _raised = zygote.raised_for_a_job();
            zygote
                .fork(&name, &jobdir, cgroup.as_ref(), send_out_dir)
                .await
        };
        let mut sandbox = ready_or_removed(name, jobdir, cgroup, launched, Some(zygote)).await?;
        sandbox.for_job = true;
        Ok(sandbox)
    }

    /// Forks a sandbox for a session's job (its kernel: a workspace call has `/out`, which
    /// no pool's sandbox has) with the session's mounts: the child attaches a detached
    /// copy of the session's workspace at `/work`, and of its own `/tmp` at `/tmp` when it
    /// keeps one (a fresh sandbox binds the same two by path), and takes the CPU-time limit
    /// of the job's own wall time. The job's files are written first, not at delivery:
    /// writing them hands the workspace to the job's uid, which the child's job process
    /// needs before it can enter `/work`. At the job's CPU priority, as
    /// [`NativeWarm::fork_for_job`].
    async fn fork_for_session(
        &self,
        zygote: Arc<Zygote>,
        job: &JobSpec,
    ) -> Result<WaitingSandbox, NativeError> {
        let work = job.workspace.clone().ok_or_else(|| NativeError::Zygote {
            step: "fork for a session",
            detail: "the job has no session workspace".into(),
        })?;
        let (name, jobdir, cgroup) =
            self.prepare_sandbox_with(CpuPriority::Normal, WorkBacking::Directory)?;
        let ids = self.backend.id_mapping();
        let job_files = job.clone();
        let written = tokio::task::spawn_blocking(move || {
            let written = jobdir.write_job(&job_files, &ids);
            (written, jobdir)
        })
        .await;
        let jobdir = match written {
            Ok((Ok(()), jobdir)) => jobdir,
            Ok((Err(e), jobdir)) => {
                let _ = tokio::task::spawn_blocking(move || teardown(cgroup, jobdir)).await;
                return Err(e.into());
            }
            Err(join) => return Err(NativeError::Helper(format!("write task: {join}"))),
        };
        let send_out_dir = self.template.filesystem.out.enabled;
        let own = SessionMounts {
            work,
            tmp: job.session_tmp.clone(),
            cpu_rlimit_secs: crate::launch::cpu_rlimit_secs(job),
            kernel: job.session_kernel,
        };
        let launched = {
            let _raised = zygote.raised_for_a_job();
            zygote
                .fork_with(&name, &jobdir, cgroup.as_ref(), send_out_dir, Some(&own))
                .await
        };
        let mut sandbox = ready_or_removed(name, jobdir, cgroup, launched, Some(zygote)).await?;
        sandbox.for_job = true;
        sandbox.job_written = true;
        Ok(sandbox)
    }

    /// A sandbox's job directory and cgroup, the cgroup at `priority`: a warm sandbox is
    /// built and kept at the lowest, so that a job running meanwhile is never slowed by
    /// the sandbox being made for the next one. Only speed depends on it.
    fn prepare_sandbox(
        &self,
        priority: CpuPriority,
    ) -> Result<(String, JobDir, Option<JobCgroup>), NativeError> {
        self.prepare_sandbox_with(priority, self.backend.work_backing(&self.template))
    }

    /// [`NativeWarm::prepare_sandbox`] with the job directory's `/work` backed as `backing`.
    fn prepare_sandbox_with(
        &self,
        priority: CpuPriority,
        backing: WorkBacking,
    ) -> Result<(String, JobDir, Option<JobCgroup>), NativeError> {
        let backend = &self.backend;
        let name = format!("warm-{}", JobId::generate().as_str());
        let jobdir =
            JobDir::create_empty(backend.runtime_dir(), &name, &backend.id_mapping(), backing)?;
        let cgroup = match backend.create_cgroup(&name, &self.template) {
            Ok(cgroup) => cgroup,
            Err(e) => {
                if let Err(removed) = jobdir.remove() {
                    tracing::warn!(sandbox = %name, error = %removed, "cannot remove a job directory");
                }
                return Err(e);
            }
        };
        if priority == CpuPriority::Background
            && let Some(cgroup) = &cgroup
            && let Err(e) = cgroup.set_cpu_priority(priority)
        {
            tracing::warn!(sandbox = %name, error = %e,
                "cannot lower a warm sandbox's CPU priority; it starts at normal priority");
        }
        Ok((name, jobdir, cgroup))
    }

    /// The active zygote, taken for one more child, unless there is none or it has as many
    /// as it may. Taken under the lock every child's hold is taken under, so that a batch of
    /// starts never takes more than [`ZYGOTE_CHILDREN_MAX`].
    fn zygote_to_fork_from(&self) -> Option<Arc<Zygote>> {
        self.zygote_to_fork_from_below(ZYGOTE_CHILDREN_MAX as usize)
    }

    /// [`NativeWarm::zygote_to_fork_from`] while the zygote has fewer than `children`.
    fn zygote_to_fork_from_below(&self, children: usize) -> Option<Arc<Zygote>> {
        let mut zygotes = self.zygotes.lock().ok()?;
        // Its forks spent: sandboxes start from scratch until the upkeep replaces it.
        if zygotes.active_forks >= self.zygote_forks {
            return None;
        }
        let active = zygotes.active.as_ref()?;
        let active = (children_of(active) < children).then(|| active.clone())?;
        zygotes.active_forks += 1;
        Some(active)
    }

    /// Keeps a zygote to fork from: the active one while it can fork, is younger than the
    /// idle lifetime and has forks left ([native] zygote_forks); otherwise it is retired (a dead one counted as lost) and a new one
    /// started, unless the last start failed too recently. Sandboxes start from scratch
    /// while there is none.
    async fn keep_zygote(&self) {
        let retire = {
            let Ok(mut zygotes) = self.zygotes.lock() else {
                return;
            };
            match zygotes.active.take() {
                Some(active)
                    if active.is_usable()
                        && active.started_at().elapsed() <= self.idle_max
                        && zygotes.active_forks < self.zygote_forks =>
                {
                    zygotes.active = Some(active);
                    return;
                }
                Some(active) => {
                    if active.is_usable() && zygotes.active_forks >= self.zygote_forks {
                        tracing::debug!(zygote = %active.name(), forks = zygotes.active_forks,
                            "the zygote forked as many sandboxes as it may; replaced");
                    } else if active.is_usable() {
                        tracing::debug!(zygote = %active.name(), "the zygote outlived its idle lifetime; replaced");
                    } else {
                        self.counters.zygotes_lost.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(zygote = %active.name(), said = %active.said(),
                            "the zygote died; replaced (sandboxes start from scratch meanwhile)");
                    }
                    zygotes.retired.push(active.clone());
                    Some(active)
                }
                None => None,
            }
        };
        if let Some(zygote) = retire {
            zygote.retire().await;
        }
        if self
            .zygotes
            .lock()
            .ok()
            .and_then(|z| z.retry_at)
            .is_some_and(|at| Instant::now() < at)
        {
            return;
        }
        match Zygote::start(&self.backend, &self.template, &self.preload).await {
            Ok(zygote) => {
                self.counters
                    .zygotes_started
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(zygote = %zygote.name(), "zygote started");
                if let Ok(mut zygotes) = self.zygotes.lock() {
                    zygotes.active = Some(zygote);
                    zygotes.active_forks = 0;
                    zygotes.retry_at = None;
                    zygotes.backoff = REFILL_BACKOFF_MIN;
                }
            }
            Err(e) => {
                self.counters.zygotes_failed.fetch_add(1, Ordering::Relaxed);
                let Ok(mut zygotes) = self.zygotes.lock() else {
                    return;
                };
                let backoff = zygotes.backoff.max(REFILL_BACKOFF_MIN);
                zygotes.retry_at = Some(Instant::now() + backoff);
                zygotes.backoff = (backoff * 2).min(ZYGOTE_RETRY_MAX);
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64,
                    "cannot start a zygote; warm sandboxes start from scratch meanwhile");
            }
        }
    }

    /// Removes the retired zygotes none of whose children is left.
    async fn remove_idle_zygotes(&self) {
        let done: Vec<Arc<Zygote>> = match self.zygotes.lock() {
            Ok(mut zygotes) => {
                let (done, alive) = std::mem::take(&mut zygotes.retired)
                    .into_iter()
                    .partition(|z| children_of(z) == 0);
                zygotes.retired = alive;
                done
            }
            Err(_) => Vec::new(),
        };
        for zygote in done {
            zygote.remove().await;
        }
    }

    /// Removes every zygote, with whatever children are left.
    async fn remove_zygotes(&self) {
        let all: Vec<Arc<Zygote>> = match self.zygotes.lock() {
            Ok(mut zygotes) => zygotes
                .active
                .take()
                .into_iter()
                .chain(std::mem::take(&mut zygotes.retired))
                .collect(),
            Err(_) => Vec::new(),
        };
        for zygote in all {
            zygote.remove().await;
        }
    }

    async fn deliver_to(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
        warm: WaitingSandbox,
    ) -> Result<(RunReport, Teardown), NativeError> {
        let backend = &self.backend;
        let delivered_at = Instant::now();
        let WaitingSandbox {
            name,
            launched,
            jobdir,
            cgroup,
            zygote,
            for_job,
            job_written,
        } = warm;
        if zygote.is_some() && !for_job {
            self.counters.forked_hits.fetch_add(1, Ordering::Relaxed);
        }
        // The job's files, then the CPU the sandbox used while waiting (left out of the
        // job's figure). Blocking work, off the async threads.
        let ids = backend.id_mapping();
        let job_files = job.clone();
        let prepared = tokio::task::spawn_blocking(move || {
            let written = if job_written {
                Ok(())
            } else {
                jobdir.write_job(&job_files, &ids)
            };
            let cpu_before = cgroup
                .as_ref()
                .and_then(|c| c.stats().ok())
                .and_then(|s| s.cpu_time)
                .unwrap_or_default();
            (written, cpu_before, jobdir, cgroup)
        })
        .await;
        let (written, cpu_before, jobdir, cgroup) = match prepared {
            Ok(prepared) => prepared,
            Err(join) => {
                launched.kill().await;
                return Err(NativeError::Helper(format!("deliver task: {join}")));
            }
        };
        if let Err(e) = written {
            launched.kill().await;
            let _ = tokio::task::spawn_blocking(move || teardown(cgroup, jobdir)).await;
            drop(zygote);
            return Err(e.into());
        }
        // The sandbox's own stdin pipe carries the job's input, as in a fresh sandbox; a
        // fresh sandbox without input has /dev/null there, read-only.
        let stdin = match job.stdin {
            Some(_) => WarmStdin::Keep,
            None => WarmStdin::DevNullReadOnly,
        };
        let message =
            python::control_message(&self.template, job, stdin, python::WarmOutput::Inherited);
        let setup = delivered_at.elapsed();
        tracing::debug!(job_id = %job.id, sandbox = %name, forked = zygote.is_some(),
            sandbox_cpu_us = cpu_before.as_micros() as u64,
            "CPU the sandbox used before its job (left out of the job's)");
        let supervised = backend
            .finish(job, launched, tap, None, Some(message))
            .await
            .map(|mut s| {
                s.setup = setup;
                s
            });
        tracing::debug!(job_id = %job.id, sandbox = %name, "job over; tearing down");
        let (report, removal) = backend
            .conclude(job, supervised, cgroup, jobdir, cpu_before)
            .await?;
        // A forked sandbox's zygote (its template) is released once the sandbox is gone.
        Ok((
            report,
            Teardown::new(async move {
                removal.run().await;
                drop(zygote);
            }),
        ))
    }
}

impl WarmSandboxes for NativeWarm {
    type Warm = WaitingSandbox;
    type Error = NativeError;

    fn kind(&self) -> BackendKind {
        BackendKind::Native
    }

    fn capabilities(&self) -> Capabilities {
        airlock_core::Backend::capabilities(self.backend.as_ref())
    }

    fn fits(&self, job: &JobSpec) -> bool {
        python::fits(&self.template, job)
    }

    fn start(&self) -> BoxFuture<'_, Result<WaitingSandbox, NativeError>> {
        Box::pin(self.launch_warm())
    }

    fn start_for_job(&self) -> Option<BoxFuture<'_, Result<WaitingSandbox, NativeError>>> {
        // Only a fork is cheaper than the fresh run the job would get otherwise.
        let zygote = self.zygote_to_fork_from()?;
        Some(Box::pin(async move {
            let forked = self.fork_for_job(zygote).await;
            match &forked {
                Ok(_) => self.counters.forked.fetch_add(1, Ordering::Relaxed),
                Err(_) => self.counters.fork_failed.fetch_add(1, Ordering::Relaxed),
            };
            forked
        }))
    }

    fn start_for_session<'a>(
        &'a self,
        job: &'a JobSpec,
    ) -> Option<BoxFuture<'a, Result<WaitingSandbox, NativeError>>> {
        if !python::fits_session(&self.template, job) {
            return None;
        }
        // A kernel holds its child for the session's life: sessions take at most half of
        // a zygote's children, so that they never take the room of the pool's jobs.
        let zygote = self.zygote_to_fork_from_below(ZYGOTE_CHILDREN_MAX as usize / 2)?;
        Some(Box::pin(async move {
            let forked = self.fork_for_session(zygote, job).await;
            match &forked {
                Ok(_) => self.counters.forked.fetch_add(1, Ordering::Relaxed),
                Err(_) => self.counters.fork_failed.fetch_add(1, Ordering::Relaxed),
            };
            forked
        }))
    }

    fn starts_cancel_safe(&self) -> bool {
        // The helper (or a forked child's pidfd hold) is killed on drop, and the cgroup and
        // the job directory removed; a zygote being started is removed the same way, and a
        // child a dropped fork left in the zygote's template goes with the template.
        true
    }

    fn name(warm: &WaitingSandbox) -> &str {
        &warm.name
    }

    fn is_alive(&self, warm: &mut WaitingSandbox) -> bool {
        warm.launched.is_alive()
    }

    fn raise_priority(&self, warm: &WaitingSandbox) -> Result<(), String> {
        match &warm.cgroup {
            Some(cgroup) => cgroup
                .set_cpu_priority(CpuPriority::Normal)
                .map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    fn deliver<'a>(
        &'a self,
        job: &'a JobSpec,
        tap: Option<OutputTap>,
        warm: WaitingSandbox,
    ) -> BoxFuture<'a, Result<(RunReport, Teardown), NativeError>> {
        Box::pin(self.deliver_to(job, tap, warm))
    }

    fn discard(&self, warm: WaitingSandbox) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let WaitingSandbox {
                name,
                launched,
                jobdir,
                cgroup,
                zygote,
                for_job: _,
                job_written: _,
            } = warm;
            launched.kill().await;
            match tokio::task::spawn_blocking(move || teardown(cgroup, jobdir)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(sandbox = %name, error = %e, "cannot tear down a warm sandbox")
                }
                Err(e) => tracing::warn!(sandbox = %name, error = %e, "teardown task failed"),
            }
            drop(zygote);
        })
    }

    fn run_fresh<'a>(
        &'a self,
        job: &'a JobSpec,
        tap: Option<OutputTap>,
    ) -> BoxFuture<'a, Result<(RunReport, Teardown), NativeError>> {
        Box::pin(self.backend.run_job_then_teardown(job, tap))
    }

    fn upkeep(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.remove_idle_zygotes().await;
            // Started with the pool, and replaced once past its idle lifetime or dead.
            if self.zygote {
                self.keep_zygote().await;
            }
        })
    }

    fn upkeep_due(&self) -> Option<Instant> {
        let zygotes = self.zygotes.lock().ok()?;
        let active = zygotes.active.as_ref()?;
        if zygotes.active_forks >= self.zygote_forks {
            return Some(Instant::now());
        }
        Some(active.started_at() + self.idle_max)
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.remove_zygotes())
    }

    fn add_stats(&self, stats: &mut WarmPoolStats) {
        let c = &self.counters;
        stats.forked_hits = c.forked_hits.load(Ordering::Relaxed);
        stats.forked = c.forked.load(Ordering::Relaxed);
        stats.fork_failed = c.fork_failed.load(Ordering::Relaxed);
        stats.zygotes_started = c.zygotes_started.load(Ordering::Relaxed);
        stats.zygotes_failed = c.zygotes_failed.load(Ordering::Relaxed);
        stats.zygotes_lost = c.zygotes_lost.load(Ordering::Relaxed);
    }
}

/// The warm sandbox `launched` started, or, when it did not start, its job directory and
/// cgroup removed and the error.
async fn ready_or_removed(
    name: String,
    jobdir: JobDir,
    cgroup: Option<JobCgroup>,
    launched: Result<Launched, NativeError>,
    zygote: Option<Arc<Zygote>>,
) -> Result<WaitingSandbox, NativeError> {
    match launched {
        Ok(launched) => Ok(WaitingSandbox {
            name,
            launched,
            jobdir,
            cgroup,
            zygote,
            for_job: false,
            job_written: false,
        }),
        Err(e) => {
            let _ = tokio::task::spawn_blocking(move || teardown(cgroup, jobdir)).await;
            Err(e)
        }
    }
}

/// How many children of `zygote` are alive (waiting, running, or being forked): every
/// holder of it but the pool.
fn children_of(zygote: &Arc<Zygote>) -> usize {
    Arc::strong_count(zygote).saturating_sub(1)
}
