//! Warm sandboxes: Python jobs for a long-running server start in a sandbox that was built
//! ahead of time, with the interpreter already loaded.
//!
//! A warm sandbox is an ordinary sandbox (its own job directory, cgroup, namespaces, uid
//! 65534, seccomp) whose program is a small bootstrap run by the job's own interpreter
//! with the job's own flags, environment and limits. The bootstrap blocks reading the
//! control pipe ([`CONTROL_FD`](crate::plan::CONTROL_FD)). Delivering a job writes its
//! files into `/work`, sends its arguments on that pipe and closes it; the bootstrap then
//! runs `/work/<file>` as `__main__`, as `python3 -I /work/<file>` would. Each warm
//! sandbox runs one job and is torn down like any other; the pool starts a replacement in
//! the background. A job the template does not fit (other limits, environment, network,
//! `/out`, language) runs in a fresh sandbox as always.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_cgroup::{CpuPriority, JobCgroup};
use airlock_core::policy::NetworkMode;
use airlock_core::{
    Backend, BackendError, BackendKind, BoxFuture, Capabilities, JobId, JobSpec, OutputTap,
    RunReport, Teardown, WarmPoolStats,
};
use tokio::sync::Notify;

use crate::backend::{Launched, NativeBackend, teardown};
use crate::error::NativeError;
use crate::zygote::{ZYGOTE_CHILDREN_MAX, Zygote};
use airlock_host::jobdir::JobDir;

/// The bootstrap a warm sandbox's interpreter runs (`python3 <flags> -c BOOTSTRAP`):
/// [`PYTHON_RUN_JOB`] and its call.
pub const PYTHON_BOOTSTRAP: &str = concat!(include_str!("run_job.py"), "_airlock_run()\n");

/// The job runner of a warm sandbox's bootstrap and of a zygote's children, defining
/// `_airlock_run()`.
///
/// It reads the job's `argv` (script path first, NUL-separated) from descriptor 6 until
/// end-of-file, closes it, makes `__main__` look as it does for a script (its namespace
/// emptied but for `__builtins__`), and runs the script there. An uncaught exception is
/// printed without the bootstrap's own frame and exits 1, as for a script; `SystemExit`
/// passes through. Everything it names is local, so nothing of it is left in `__main__`.
pub const PYTHON_RUN_JOB: &str = include_str!("run_job.py");

/// Longest wait between attempts when warm sandboxes fail to start.
const REFILL_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Most sandboxes the refill starts at once.
const REFILL_BATCH_MAX: usize = 8;
/// First wait after a failed start.
const REFILL_BACKOFF_MIN: Duration = Duration::from_millis(250);
/// Longest wait at shutdown for the refill to end.
const SHUTDOWN_REFILL_WAIT: Duration = Duration::from_secs(30);
/// Longest wait before a zygote is started again after its start failed.
const ZYGOTE_RETRY_MAX: Duration = Duration::from_secs(300);

/// A started sandbox waiting for its job.
struct Warm {
    name: String,
    /// When it became ready; past the pool's idle lifetime it is replaced.
    ready_at: Instant,
    launched: Launched,
    jobdir: JobDir,
    cgroup: Option<JobCgroup>,
    /// The zygote it was forked from, kept until the sandbox is removed: its template
    /// sandbox must outlive every child.
    zygote: Option<Arc<Zygote>>,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    unfit: AtomicU64,
    started: AtomicU64,
    failed: AtomicU64,
    discarded: AtomicU64,
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
    retired: Vec<Arc<Zygote>>,
    /// No new zygote is started before this, after one failed to start.
    retry_at: Option<Instant>,
    backoff: Duration,
}

struct Shared {
    backend: Arc<NativeBackend>,
    template: JobSpec,
    /// Modules each warm interpreter imports while it waits ([native] warm_preload).
    preload: Vec<String>,
    size: usize,
    idle_max: Duration,
    ready: Mutex<VecDeque<Warm>>,
    wake: Notify,
    closed: AtomicBool,
    counters: Counters,
    /// Whether sandboxes are forked from a zygote ([native] zygote).
    zygote: bool,
    zygotes: Mutex<Zygotes>,
    starts_max: Option<u64>,
}

/// How a pool of warm sandboxes is kept.
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
    /// Most sandboxes ever started, `None` for no bound: `airlock run --warm` starts one,
    /// for its one job, and no replacement after it.
    pub starts_max: Option<u64>,
}

/// The native backend with a pool of warm sandboxes for one language's jobs.
pub struct PooledNative {
    shared: Arc<Shared>,
    /// The refill task, awaited at shutdown so that nothing it is starting is left behind.
    refill: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for PooledNative {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledNative")
            .field("language", &self.shared.template.language)
            .field("size", &self.shared.size)
            .finish_non_exhaustive()
    }
}

impl PooledNative {
    /// Keeps `size` sandboxes started for jobs like `template` (a job of the pool's
    /// language with the policy's defaults), starting them in the background; one unused
    /// for `idle_max` is torn down and replaced. Must be called inside a tokio runtime.
    pub fn start(
        backend: Arc<NativeBackend>,
        template: JobSpec,
        config: PoolConfig,
    ) -> Result<Self, NativeError> {
        let PoolConfig {
            size,
            idle_max,
            preload,
            zygote,
            starts_max,
        } = config;
        if template.network != NetworkMode::None {
            return Err(NativeError::Unsupported {
                control: "warm pool",
                reason: "warm sandboxes have no network; the template job asks for the proxy"
                    .into(),
            });
        }
        let program = template
            .argv
            .first()
            .map(|p| p.rsplit('/').next().unwrap_or(p));
        if !program.is_some_and(|p| p.starts_with("python")) {
            return Err(NativeError::Unsupported {
                control: "warm pool",
                reason: format!(
                    "warm sandboxes start a Python interpreter; the {} command is {:?}",
                    template.language, template.argv
                ),
            });
        }
        if warm_argv(&template, &preload).is_none() {
            return Err(NativeError::Unsupported {
                control: "warm pool",
                reason: format!(
                    "the {} command {:?} does not end with the source file",
                    template.language, template.argv
                ),
            });
        }
        let zygote = zygote && {
            let root = matches!(backend.id_mapping(), crate::plan::IdMapping::Root { .. });
            if !root {
                tracing::warn!(
                    "[native] zygote needs a root airlock; warm sandboxes start from scratch"
                );
            }
            root
        };
        let shared = Arc::new(Shared {
            backend,
            template,
            preload,
            size,
            idle_max,
            ready: Mutex::new(VecDeque::with_capacity(size)),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
            counters: Counters::default(),
            zygote,
            zygotes: Mutex::new(Zygotes::default()),
            starts_max,
        });
        let refill = tokio::spawn(refill(shared.clone()));
        Ok(Self {
            shared,
            refill: Mutex::new(Some(refill)),
        })
    }

    /// The pool's figures.
    pub fn stats(&self) -> WarmPoolStats {
        let c = &self.shared.counters;
        WarmPoolStats {
            ready: self.ready() as u64,
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            unfit: c.unfit.load(Ordering::Relaxed),
            started: c.started.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            discarded: c.discarded.load(Ordering::Relaxed),
            forked_hits: c.forked_hits.load(Ordering::Relaxed),
            forked: c.forked.load(Ordering::Relaxed),
            fork_failed: c.fork_failed.load(Ordering::Relaxed),
            zygotes_started: c.zygotes_started.load(Ordering::Relaxed),
            zygotes_failed: c.zygotes_failed.load(Ordering::Relaxed),
            zygotes_lost: c.zygotes_lost.load(Ordering::Relaxed),
        }
    }

    /// How many warm sandboxes are ready now.
    pub fn ready(&self) -> usize {
        self.shared.ready.lock().map(|r| r.len()).unwrap_or(0)
    }

    /// Whether `job` may run in one of the pool's sandboxes.
    pub fn fits(&self, job: &JobSpec) -> bool {
        fits(&self.shared.template, job)
    }

    /// Stops refilling and tears down every warm sandbox.
    pub async fn shutdown(&self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
        // The refill ends once the sandboxes it is starting are ready or failed, and
        // removes them; a zygote still importing its preload is not waited for past this.
        let refill = self.refill.lock().ok().and_then(|mut r| r.take());
        if let Some(refill) = refill
            && tokio::time::timeout(SHUTDOWN_REFILL_WAIT, refill)
                .await
                .is_err()
        {
            tracing::warn!(
                "the warm pool's refill did not end in time; the next start sweeps what it left"
            );
        }
        let drained: Vec<Warm> = match self.shared.ready.lock() {
            Ok(mut ready) => ready.drain(..).collect(),
            Err(_) => Vec::new(),
        };
        for warm in drained {
            discard(warm).await;
        }
        remove_zygotes(&self.shared).await;
    }

    /// Runs `job`: in a warm sandbox when it fits and one is ready, else in a fresh one.
    pub async fn run_job_with(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
    ) -> Result<RunReport, NativeError> {
        Teardown::removed(self.run_job_then_teardown(job, tap).await).await
    }

    /// Like [`PooledNative::run_job_with`], leaving the sandbox's removal to the returned
    /// [`Teardown`]; the refill is woken once that removal is done, so that starting the
    /// next sandbox competes neither with the job nor with its cleanup.
    pub async fn run_job_then_teardown(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
    ) -> Result<(RunReport, Teardown), NativeError> {
        let shared = &self.shared;
        if !fits(&shared.template, job) {
            shared.counters.unfit.fetch_add(1, Ordering::Relaxed);
            return shared.backend.run_job_then_teardown(job, tap).await;
        }
        let Some(warm) = self.take().await else {
            shared.counters.misses.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(job_id = %job.id, "no warm sandbox ready; starting one for the job");
            return shared.backend.run_job_then_teardown(job, tap).await;
        };
        // The sandbox waited in the background; the job runs at normal priority, or in a
        // fresh sandbox if that cannot be had.
        if let Some(cgroup) = &warm.cgroup
            && let Err(e) = cgroup.set_cpu_priority(CpuPriority::Normal)
        {
            tracing::warn!(sandbox = %warm.name, error = %e,
                "cannot give a warm sandbox normal CPU priority; the job starts in a fresh one");
            shared.counters.discarded.fetch_add(1, Ordering::Relaxed);
            discard(warm).await;
            shared.wake.notify_one();
            return shared.backend.run_job_then_teardown(job, tap).await;
        }
        shared.counters.hits.fetch_add(1, Ordering::Relaxed);
        if warm.zygote.is_some() {
            shared.counters.forked_hits.fetch_add(1, Ordering::Relaxed);
        }
        tracing::debug!(job_id = %job.id, sandbox = %warm.name, forked = warm.zygote.is_some(),
            "job delivered to a warm sandbox");
        match self.deliver(job, tap, warm).await {
            Ok((report, removal)) => {
                let shared = self.shared.clone();
                let teardown = Teardown::new(async move {
                    removal.run().await;
                    shared.wake.notify_one();
                });
                Ok((report, teardown))
            }
            Err(e) => {
                shared.wake.notify_one();
                Err(e)
            }
        }
    }

    /// The oldest ready sandbox that is still alive. The refill is woken when the pool is
    /// empty, and otherwise only once the job is over, so that starting the replacement
    /// does not compete with the job for the CPU.
    async fn take(&self) -> Option<Warm> {
        let shared = &self.shared;
        loop {
            let next = shared.ready.lock().ok().and_then(|mut r| r.pop_front());
            let Some(mut warm) = next else {
                shared.wake.notify_one();
                return None;
            };
            if warm.ready_at.elapsed() > shared.idle_max {
                tracing::debug!(sandbox = %warm.name, "a warm sandbox outlived its idle lifetime; discarded");
            } else if warm.launched.is_alive() {
                return Some(warm);
            } else {
                tracing::warn!(sandbox = %warm.name, "a warm sandbox died while waiting; discarded");
            }
            shared.counters.discarded.fetch_add(1, Ordering::Relaxed);
            discard(warm).await;
            shared.wake.notify_one();
        }
    }

    async fn deliver(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
        warm: Warm,
    ) -> Result<(RunReport, Teardown), NativeError> {
        let backend = &self.shared.backend;
        let delivered_at = Instant::now();
        let Warm {
            name,
            launched,
            jobdir,
            cgroup,
            zygote,
            ..
        } = warm;
        // The job's files, then the CPU the sandbox used while waiting (left out of the
        // job's figure). Blocking work, off the async threads.
        let ids = backend.id_mapping();
        let job_files = job.clone();
        let prepared = tokio::task::spawn_blocking(move || {
            let written = jobdir.write_job(&job_files, &ids);
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
        let message = control_message(&self.shared.template, job);
        let setup = delivered_at.elapsed();
        tracing::debug!(job_id = %job.id, sandbox = %name,
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

impl Drop for PooledNative {
    fn drop(&mut self) {
        // The refill task sees this and ends, tearing down what is still ready.
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
    }
}

impl Backend for PooledNative {
    fn kind(&self) -> BackendKind {
        BackendKind::Native
    }

    fn capabilities(&self) -> Capabilities {
        self.shared.backend.capabilities()
    }

    fn run<'a>(
        &'a self,
        job: &'a JobSpec,
        tap: Option<OutputTap>,
    ) -> BoxFuture<'a, Result<RunReport, BackendError>> {
        Box::pin(async move {
            self.run_job_with(job, tap)
                .await
                .map_err(BackendError::from)
        })
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

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(PooledNative::shutdown(self))
    }

    fn warm_pool(&self) -> Option<WarmPoolStats> {
        Some(self.stats())
    }
}

/// What a warm sandbox's interpreter runs before the bootstrap when the policy names
/// modules to preload: it defines `_airlock_preload(names)`, which imports each with the
/// interpreter's own output sent to `/dev/null` and warnings silenced, so nothing of it
/// reaches the job's output; a module that fails to import is skipped.
pub const PYTHON_PRELOAD: &str = include_str!("preload.py");

/// The warm sandbox's argv: the template's interpreter and flags, then `-c BOOTSTRAP`
/// (after the preload, when there is one) in place of the source file. `None` unless the
/// template ends with the source file.
fn warm_argv(template: &JobSpec, preload: &[String]) -> Option<Vec<String>> {
    let (script, flags) = template.argv.split_last()?;
    if *script != format!("{}/{}", airlock_core::job::WORKDIR, template.source_file) {
        return None;
    }
    let mut argv = flags.to_vec();
    argv.push("-c".to_owned());
    if preload.is_empty() {
        argv.push(PYTHON_BOOTSTRAP.to_owned());
    } else {
        argv.push(format!(
            "{PYTHON_PRELOAD}_airlock_preload({})\ndel _airlock_preload\n{PYTHON_BOOTSTRAP}",
            python_module_list(preload)
        ));
    }
    Some(argv)
}

/// `preload` as a Python list literal. The names are checked identifiers ([native]
/// warm_preload), which need no escaping as string literals.
pub(crate) fn python_module_list(preload: &[String]) -> String {
    let names: Vec<String> = preload.iter().map(|m| format!("\"{m}\"")).collect();
    format!("[{}]", names.join(", "))
}

/// Whether `job` runs the same way in a sandbox built for `template`: same interpreter
/// and flags, environment, filesystem, network (none), and the limits the kernel enforces
/// inside the sandbox. Its wall time may be shorter (the kill is the supervisor's); the
/// output caps are the supervisor's too and may differ.
pub fn fits(template: &JobSpec, job: &JobSpec) -> bool {
    let flags = template.argv.len().saturating_sub(1);
    let (t, j) = (&template.limits, &job.limits);
    job.language == template.language
        && job.source_file == template.source_file
        && job.argv.len() > flags
        && job.argv[..=flags] == template.argv[..]
        && job.argv.iter().all(|a| !a.contains('\0'))
        && job.env == template.env
        && job.network == NetworkMode::None
        // A session's /work is bound when the sandbox is built; a warm one has its own.
        && job.workspace.is_none()
        && job.filesystem == template.filesystem
        && j.memory == t.memory
        && j.cpus == t.cpus
        && j.pids == t.pids
        && j.tmp == t.tmp
        && j.open_files == t.open_files
        && j.file_size == t.file_size
        && j.timeout <= t.timeout
}

/// The script path and the job's arguments, NUL-separated (the bootstrap's `sys.argv`).
fn control_message(template: &JobSpec, job: &JobSpec) -> Vec<u8> {
    let flags = template.argv.len().saturating_sub(1);
    job.argv[flags..].join("\0").into_bytes()
}

/// Starts one warm sandbox: forked from `zygote` when there is one that can take another
/// child, from scratch otherwise (and when the fork fails: the zygote changes how fast a
/// sandbox is ready, never whether).
async fn launch_warm(shared: &Shared, zygote: Option<Arc<Zygote>>) -> Result<Warm, NativeError> {
    if let Some(zygote) = zygote
        && children_of(&zygote) < ZYGOTE_CHILDREN_MAX as usize
    {
        match launch_forked(shared, zygote).await {
            Ok(warm) => {
                shared.counters.forked.fetch_add(1, Ordering::Relaxed);
                return Ok(warm);
            }
            Err(e) => {
                shared.counters.fork_failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "cannot fork a warm sandbox from the zygote; starting one from scratch");
            }
        }
    }
    let (name, jobdir, cgroup) = prepare_sandbox(shared, "warm")?;
    let backend = &shared.backend;
    let template = &shared.template;
    let mut plan = match backend.plan(template, &jobdir, cgroup.as_ref(), None) {
        Ok(plan) => plan,
        Err(e) => {
            let _ = tokio::task::spawn_blocking(move || teardown(cgroup, jobdir)).await;
            return Err(e);
        }
    };
    plan.job_id.clone_from(&name);
    plan.argv = warm_argv(template, &shared.preload).unwrap_or_default();
    plan.control_fd = true;
    let launched = backend.launch(&name, &plan, true).await;
    ready_or_removed(name, jobdir, cgroup, launched, None).await
}

/// The warm sandbox `launched` started, or, when it did not start, its job directory and
/// cgroup removed and the error.
async fn ready_or_removed(
    name: String,
    jobdir: JobDir,
    cgroup: Option<JobCgroup>,
    launched: Result<Launched, NativeError>,
    zygote: Option<Arc<Zygote>>,
) -> Result<Warm, NativeError> {
    match launched {
        Ok(launched) => Ok(Warm {
            name,
            ready_at: Instant::now(),
            launched,
            jobdir,
            cgroup,
            zygote,
        }),
        Err(e) => {
            let _ = tokio::task::spawn_blocking(move || teardown(cgroup, jobdir)).await;
            Err(e)
        }
    }
}

/// A warm sandbox's job directory and cgroup, the cgroup at the lowest CPU priority: it is
/// built and kept so, so that a job running meanwhile is never slowed by the sandbox being
/// made for the next one. Only speed depends on it.
fn prepare_sandbox(
    shared: &Shared,
    kind: &str,
) -> Result<(String, JobDir, Option<JobCgroup>), NativeError> {
    let backend = &shared.backend;
    let name = format!("{kind}-{}", JobId::generate().as_str());
    let jobdir = JobDir::create_empty(backend.runtime_dir(), &name, &backend.id_mapping())?;
    let cgroup = match backend.create_cgroup(&name, &shared.template) {
        Ok(cgroup) => cgroup,
        Err(e) => {
            if let Err(removed) = jobdir.remove() {
                tracing::warn!(sandbox = %name, error = %removed, "cannot remove a job directory");
            }
            return Err(e);
        }
    };
    if let Some(cgroup) = &cgroup
        && let Err(e) = cgroup.set_cpu_priority(CpuPriority::Background)
    {
        tracing::warn!(sandbox = %name, error = %e,
            "cannot lower a warm sandbox's CPU priority; it starts at normal priority");
    }
    Ok((name, jobdir, cgroup))
}

/// Forks one warm sandbox from `zygote`.
async fn launch_forked(shared: &Shared, zygote: Arc<Zygote>) -> Result<Warm, NativeError> {
    let (name, jobdir, cgroup) = prepare_sandbox(shared, "warm")?;
    let send_out_dir = shared.template.filesystem.out.enabled;
    let launched = zygote
        .fork(&name, &jobdir, cgroup.as_ref(), send_out_dir)
        .await;
    ready_or_removed(name, jobdir, cgroup, launched, Some(zygote)).await
}

/// How many children of `zygote` are alive (waiting, running, or being forked): every
/// holder of it but the pool.
fn children_of(zygote: &Arc<Zygote>) -> usize {
    Arc::strong_count(zygote).saturating_sub(1)
}

/// The zygote to fork from: the active one while it can fork and is younger than the idle
/// lifetime; otherwise it is retired (a dead one counted as lost) and a new one started,
/// unless the last start failed too recently. `None` while there is none: sandboxes are
/// then started from scratch.
async fn current_zygote(shared: &Shared) -> Option<Arc<Zygote>> {
    let retire = {
        let Ok(mut zygotes) = shared.zygotes.lock() else {
            return None;
        };
        match zygotes.active.take() {
            Some(active)
                if active.is_usable() && active.started_at().elapsed() <= shared.idle_max =>
            {
                zygotes.active = Some(active.clone());
                return Some(active);
            }
            Some(active) => {
                if active.is_usable() {
                    tracing::debug!(zygote = %active.name(), "the zygote outlived its idle lifetime; replaced");
                } else {
                    shared.counters.zygotes_lost.fetch_add(1, Ordering::Relaxed);
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
    if shared
        .zygotes
        .lock()
        .ok()
        .and_then(|z| z.retry_at)
        .is_some_and(|at| Instant::now() < at)
    {
        return None;
    }
    match Zygote::start(&shared.backend, &shared.template, &shared.preload).await {
        Ok(zygote) => {
            shared
                .counters
                .zygotes_started
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(zygote = %zygote.name(), "zygote started");
            if let Ok(mut zygotes) = shared.zygotes.lock() {
                zygotes.active = Some(zygote.clone());
                zygotes.retry_at = None;
                zygotes.backoff = REFILL_BACKOFF_MIN;
            }
            Some(zygote)
        }
        Err(e) => {
            shared
                .counters
                .zygotes_failed
                .fetch_add(1, Ordering::Relaxed);
            let Ok(mut zygotes) = shared.zygotes.lock() else {
                return None;
            };
            let backoff = zygotes.backoff.max(REFILL_BACKOFF_MIN);
            zygotes.retry_at = Some(Instant::now() + backoff);
            zygotes.backoff = (backoff * 2).min(ZYGOTE_RETRY_MAX);
            tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64,
                "cannot start a zygote; warm sandboxes start from scratch meanwhile");
            None
        }
    }
}

/// Removes the retired zygotes none of whose children is left.
async fn remove_idle_zygotes(shared: &Shared) {
    let done: Vec<Arc<Zygote>> = match shared.zygotes.lock() {
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

/// Removes every zygote, with whatever children are left (shutdown).
async fn remove_zygotes(shared: &Shared) {
    let all: Vec<Arc<Zygote>> = match shared.zygotes.lock() {
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

async fn discard(warm: Warm) {
    let Warm {
        name,
        launched,
        jobdir,
        cgroup,
        zygote,
        ..
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
}

/// The ready sandboxes past the idle lifetime, taken out of the pool (the oldest are first).
fn expired(shared: &Shared) -> Vec<Warm> {
    let Ok(mut ready) = shared.ready.lock() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    while ready
        .front()
        .is_some_and(|w| w.ready_at.elapsed() > shared.idle_max)
    {
        out.extend(ready.pop_front());
    }
    out
}

/// Keeps the pool full, starting what is missing in batches, backing off while starts fail.
async fn refill(shared: Arc<Shared>) {
    let mut backoff = REFILL_BACKOFF_MIN;
    loop {
        if shared.closed.load(Ordering::SeqCst) {
            break;
        }
        for warm in expired(&shared) {
            tracing::debug!(sandbox = %warm.name, "a warm sandbox outlived its idle lifetime; replaced");
            shared.counters.discarded.fetch_add(1, Ordering::Relaxed);
            discard(warm).await;
        }
        remove_idle_zygotes(&shared).await;
        // Started with the pool, and replaced once past its idle lifetime or dead.
        let zygote = if shared.zygote {
            current_zygote(&shared).await
        } else {
            None
        };
        let (have, oldest) = match shared.ready.lock() {
            Ok(ready) => (ready.len(), ready.front().map(|w| w.ready_at)),
            Err(_) => break,
        };
        let attempts = shared.counters.started.load(Ordering::Relaxed)
            + shared.counters.failed.load(Ordering::Relaxed);
        let allowed = shared
            .starts_max
            .map_or(usize::MAX, |max| max.saturating_sub(attempts) as usize);
        if have >= shared.size || allowed == 0 {
            // Asleep until a job takes one or the oldest sandbox (or the zygote) reaches
            // its idle lifetime.
            let oldest = oldest
                .into_iter()
                .chain(zygote.as_ref().map(|z| z.started_at()))
                .min();
            drop(zygote);
            match oldest {
                Some(oldest) => {
                    let expiry = tokio::time::Instant::from_std(oldest + shared.idle_max);
                    let _ = tokio::time::timeout_at(expiry, shared.wake.notified()).await;
                }
                None => shared.wake.notified().await,
            }
            continue;
        }
        // The missing sandboxes start together: moving a process into a cgroup makes the
        // kernel wait for an RCU grace period while it holds off every fork and exit on
        // the host, once per burst of moves rather than per move, so a batch costs one
        // such pause instead of one per sandbox.
        let mut starts = tokio::task::JoinSet::new();
        for _ in 0..(shared.size - have).min(REFILL_BATCH_MAX).min(allowed) {
            let shared = shared.clone();
            let zygote = zygote.clone();
            starts.spawn(async move { launch_warm(&shared, zygote).await });
        }
        drop(zygote);
        let mut failed = false;
        let mut closed = false;
        while let Some(joined) = starts.join_next().await {
            let started =
                joined.unwrap_or_else(|e| Err(NativeError::Helper(format!("start task: {e}"))));
            match started {
                Ok(warm) => {
                    shared.counters.started.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(sandbox = %warm.name, "warm sandbox ready");
                    if closed || shared.closed.load(Ordering::SeqCst) {
                        closed = true;
                        discard(warm).await;
                        continue;
                    }
                    match shared.ready.lock() {
                        Ok(mut ready) => ready.push_back(warm),
                        Err(_) => closed = true,
                    }
                }
                Err(e) => {
                    failed = true;
                    shared.counters.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64,
                        "cannot start a warm sandbox");
                }
            }
        }
        if closed {
            break;
        }
        if failed {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(REFILL_BACKOFF_MAX);
        } else {
            backoff = REFILL_BACKOFF_MIN;
        }
    }
    let drained: Vec<Warm> = match shared.ready.lock() {
        Ok(mut ready) => ready.drain(..).collect(),
        Err(_) => Vec::new(),
    };
    for warm in drained {
        discard(warm).await;
    }
    remove_zygotes(&shared).await;
}
