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
use airlock_host::jobdir::JobDir;

/// The bootstrap a warm sandbox's interpreter runs (`python3 <flags> -c BOOTSTRAP`).
///
/// It reads the job's `argv` (script path first, NUL-separated) from descriptor 6 until
/// end-of-file, closes it, makes `__main__` look as it does for a script (its namespace
/// emptied but for `__builtins__`), and runs the script there. An uncaught exception is
/// printed without the bootstrap's own frame and exits 1, as for a script; `SystemExit`
/// passes through. Everything it names is local, so nothing of it is left in `__main__`.
pub const PYTHON_BOOTSTRAP: &str = r#"def _airlock_run():
    import os, sys
    chunks = []
    while True:
        chunk = os.read(6, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(6)
    message = b"".join(chunks)
    if not message:
        os._exit(0)
    argv = [os.fsdecode(a) for a in message.split(b"\0")]
    path = argv[0]
    sys.argv = argv
    sys.orig_argv = sys.orig_argv[:-2] + argv
    import __main__
    SourceFileLoader = sys.modules["_frozen_importlib_external"].SourceFileLoader
    namespace = __main__.__dict__
    builtins = namespace["__builtins__"]
    namespace.clear()
    namespace.update(__name__="__main__", __doc__=None, __package__=None,
                     __loader__=SourceFileLoader("__main__", path), __spec__=None,
                     __annotations__={}, __builtins__=builtins, __file__=path,
                     __cached__=None)
    del builtins, chunks, chunk, message, argv, __main__, SourceFileLoader
    try:
        with open(path, "rb") as source:
            code = compile(source.read(), path, "exec", dont_inherit=True)
    except SyntaxError as e:
        e.__traceback__ = None
        sys.excepthook(type(e), e, None)
        sys.exit(1)
    try:
        exec(code, namespace)
    except SystemExit:
        raise
    except BaseException as e:
        e.__traceback__ = e.__traceback__.tb_next
        sys.excepthook(type(e), e, e.__traceback__)
        sys.exit(1)
_airlock_run()
"#;

/// Longest wait between attempts when warm sandboxes fail to start.
const REFILL_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Most sandboxes the refill starts at once.
const REFILL_BATCH_MAX: usize = 8;
/// First wait after a failed start.
const REFILL_BACKOFF_MIN: Duration = Duration::from_millis(250);

/// A started sandbox waiting for its job.
struct Warm {
    name: String,
    /// When it became ready; past the pool's idle lifetime it is replaced.
    ready_at: Instant,
    launched: Launched,
    jobdir: JobDir,
    cgroup: Option<JobCgroup>,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    unfit: AtomicU64,
    started: AtomicU64,
    failed: AtomicU64,
    discarded: AtomicU64,
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
}

/// The native backend with a pool of warm sandboxes for one language's jobs.
pub struct PooledNative {
    shared: Arc<Shared>,
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
        size: usize,
        idle_max: Duration,
        preload: Vec<String>,
    ) -> Result<Self, NativeError> {
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
        });
        tokio::spawn(refill(shared.clone()));
        Ok(Self { shared })
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
        let drained: Vec<Warm> = match self.shared.ready.lock() {
            Ok(mut ready) => ready.drain(..).collect(),
            Err(_) => Vec::new(),
        };
        for warm in drained {
            discard(warm).await;
        }
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
        tracing::debug!(job_id = %job.id, sandbox = %warm.name, "job delivered to a warm sandbox");
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
            return Err(e.into());
        }
        let message = control_message(&self.shared.template, job);
        let setup = delivered_at.elapsed();
        let supervised = backend
            .finish(job, launched, tap, None, Some(message))
            .await
            .map(|mut s| {
                s.setup = setup;
                s
            });
        tracing::debug!(job_id = %job.id, sandbox = %name, "job over; tearing down");
        backend
            .conclude(job, supervised, cgroup, jobdir, cpu_before)
            .await
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
/// modules to preload (`{MODULES}`: a Python list of the checked module names). It imports
/// each with the interpreter's own output sent to `/dev/null` and warnings silenced, so
/// nothing of it reaches the job's output; a module that fails to import is skipped.
pub const PYTHON_PRELOAD: &str = r#"def _airlock_preload(names):
    import importlib, os, sys, warnings
    null = os.open(os.devnull, os.O_WRONLY)
    saved = [os.dup(1), os.dup(2)]
    os.dup2(null, 1)
    os.dup2(null, 2)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name in names:
                try:
                    importlib.import_module(name)
                except Exception:
                    pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved + [null]:
            os.close(fd)
_airlock_preload({MODULES})
del _airlock_preload
"#;

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
        // The names are checked identifiers ([native] warm_preload): as Python string
        // literals they need no escaping.
        let names: Vec<String> = preload.iter().map(|m| format!("\"{m}\"")).collect();
        let preamble = PYTHON_PRELOAD.replace("{MODULES}", &format!("[{}]", names.join(", ")));
        argv.push(format!("{preamble}{PYTHON_BOOTSTRAP}"));
    }
    Some(argv)
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

/// Starts one warm sandbox.
async fn launch_warm(shared: &Shared) -> Result<Warm, NativeError> {
    let backend = &shared.backend;
    let template = &shared.template;
    let name = format!("warm-{}", JobId::generate().as_str());
    let ids = backend.id_mapping();
    let jobdir = JobDir::create_empty(backend.runtime_dir(), &name, &ids)?;
    let cgroup = backend.create_cgroup(&name, template)?;
    // Built and kept at the lowest CPU priority, so that a job running meanwhile is never
    // slowed by the sandbox being made for the next one. Only speed depends on it.
    if let Some(cgroup) = &cgroup
        && let Err(e) = cgroup.set_cpu_priority(CpuPriority::Background)
    {
        tracing::warn!(sandbox = %name, error = %e,
            "cannot lower a warm sandbox's CPU priority; it starts at normal priority");
    }
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
    match backend.launch(&name, &plan, true).await {
        Ok(launched) => Ok(Warm {
            name,
            ready_at: Instant::now(),
            launched,
            jobdir,
            cgroup,
        }),
        Err(e) => {
            let _ = tokio::task::spawn_blocking(move || teardown(cgroup, jobdir)).await;
            Err(e)
        }
    }
}

async fn discard(warm: Warm) {
    let Warm {
        name,
        launched,
        jobdir,
        cgroup,
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
        let (have, oldest) = match shared.ready.lock() {
            Ok(ready) => (ready.len(), ready.front().map(|w| w.ready_at)),
            Err(_) => break,
        };
        if have >= shared.size {
            // Asleep until a job takes one or the oldest reaches its idle lifetime.
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
        for _ in 0..(shared.size - have).min(REFILL_BATCH_MAX) {
            let shared = shared.clone();
            starts.spawn(async move { launch_warm(&shared).await });
        }
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
}
