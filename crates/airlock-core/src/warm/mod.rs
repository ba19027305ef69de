//! The warm pool: sandboxes started ahead of their jobs, for a long-running server. One
//! pool for every backend; a backend supplies only how its sandboxes start, wait, are
//! handed a job and are removed ([`WarmSandboxes`]: a native sandbox with its interpreter
//! blocked on a pipe, a container with its interpreter blocked on its stdin).
//!
//! The rules every backend's warm sandboxes follow here:
//! - each runs exactly one job, then is removed like any sandbox; never reused;
//! - a job the template does not fit ([`WarmSandboxes::fits`]) runs in a fresh sandbox
//!   (counted `unfit`), as does one that finds none ready (`miss`), unless the backend can
//!   start one for it at once for less than a fresh run costs
//!   ([`WarmSandboxes::start_for_job`]: a fork of the native zygote; `started_for_job`);
//! - a sandbox found dead, or waiting longer than the idle lifetime, is discarded and
//!   replaced; one whose CPU priority cannot be raised for its job is discarded and the job
//!   runs fresh;
//! - refills start after a job's removal (or when the pool is empty), in the background,
//!   all missing ones together up to [`REFILL_BATCH_MAX`], backing off while starts fail;
//! - shutdown (or dropping the pool) stops refilling and removes every waiting sandbox;
//! - what a backend keeps besides its sandboxes (the native backend's zygote, which its
//!   sandboxes are forked from) is looked after by the refill too ([`WarmSandboxes::upkeep`])
//!   and removed last ([`WarmSandboxes::close`]).

pub mod python;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::backend::{
    Backend, BackendError, BackendKind, BoxFuture, Capabilities, OutputTap, Teardown, WarmPoolStats,
};
use crate::job::JobSpec;
use crate::observation::{Acquire, RunReport};

/// Longest wait between attempts when warm sandboxes fail to start.
pub const REFILL_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Most sandboxes the refill starts at once.
pub const REFILL_BATCH_MAX: usize = 8;
/// First wait after a failed start.
pub const REFILL_BACKOFF_MIN: Duration = Duration::from_millis(250);

/// How a pool is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmPoolConfig {
    /// Sandboxes kept ready (`warm_pool`).
    pub size: usize,
    /// Longest a sandbox waits before it is replaced (`warm_idle`).
    pub idle_max: Duration,
    /// Most sandboxes ever started, `None` for no bound: `airlock run --warm` starts one,
    /// for its one job, and no replacement after it.
    pub starts_max: Option<u64>,
}

/// What a backend gives the pool: how one of its sandboxes is started ahead of a job, told
/// alive, raised to a job's CPU priority, handed its job, and removed.
pub trait WarmSandboxes: Send + Sync + 'static {
    /// A started sandbox waiting for its job.
    type Warm: Send + 'static;
    /// The backend's failure.
    type Error: std::fmt::Display + Into<BackendError> + Send + 'static;

    /// The backend jobs run on.
    fn kind(&self) -> BackendKind;

    /// What the backend supports here.
    fn capabilities(&self) -> Capabilities;

    /// Whether `job` runs exactly as in a fresh sandbox when delivered to a warm one.
    fn fits(&self, job: &JobSpec) -> bool;

    /// Starts one sandbox, at the lowest CPU priority the backend offers.
    fn start(&self) -> BoxFuture<'_, Result<Self::Warm, Self::Error>>;

    /// Starts one sandbox for a job that found none ready, at the job's CPU priority, when
    /// the backend can do that for less than a fresh sandbox costs the job (the native
    /// backend forks one from its zygote); `None` when it cannot now, and the job runs
    /// fresh. Under a steady load the refills, at the lowest priority, fall behind, and
    /// every job that misses would otherwise pay a whole sandbox and interpreter start.
    fn start_for_job(&self) -> Option<BoxFuture<'_, Result<Self::Warm, Self::Error>>> {
        None
    }

    /// Starts a sandbox of its own for a job no waiting sandbox can take because parts of
    /// its sandbox are its session's (a kernel session's `/work` and `/tmp`, bound when the
    /// sandbox is built), when the backend can build it for less than a fresh one costs
    /// (the native backend forks it from its zygote with the session's mounts); `None`
    /// when it cannot, and the job runs fresh. The job's own files are in place once the
    /// start has returned (its delivery writes none).
    fn start_for_session<'a>(
        &'a self,
        _job: &'a JobSpec,
    ) -> Option<BoxFuture<'a, Result<Self::Warm, Self::Error>>> {
        None
    }

    /// Whether a start may be dropped part-way, at shutdown: true when dropping its future
    /// removes all it had made (the native backend's guards kill and remove synchronously);
    /// false when a request to a daemon could still complete after the drop (a container
    /// created just after its guard looked for it), so shutdown waits for the starts under
    /// way and removes what they made.
    fn starts_cancel_safe(&self) -> bool;

    /// The sandbox's name, for the log.
    fn name(warm: &Self::Warm) -> &str;

    /// Whether the sandbox is still running.
    fn is_alive(&self, warm: &mut Self::Warm) -> bool;

    /// Gives a sandbox taken for a job the job's normal CPU priority; the error says why
    /// it could not (the sandbox is then discarded and the job runs in a fresh one).
    fn raise_priority(&self, warm: &Self::Warm) -> Result<(), String>;

    /// Runs `job` in the sandbox, its wall time counted from the delivery, and returns once
    /// the report is complete, leaving the sandbox's removal to the [`Teardown`] (as
    /// [`Backend::run_then_teardown`]).
    fn deliver<'a>(
        &'a self,
        job: &'a JobSpec,
        tap: Option<OutputTap>,
        warm: Self::Warm,
    ) -> BoxFuture<'a, Result<(RunReport, Teardown), Self::Error>>;

    /// Removes a sandbox that will run no job.
    fn discard(&self, warm: Self::Warm) -> BoxFuture<'_, ()>;

    /// Runs `job` in a fresh sandbox, as the backend does without a pool.
    fn run_fresh<'a>(
        &'a self,
        job: &'a JobSpec,
        tap: Option<OutputTap>,
    ) -> BoxFuture<'a, Result<(RunReport, Teardown), Self::Error>>;

    /// Looks after what the backend keeps for its starts besides the sandboxes (the native
    /// zygote: replaced once dead or past the idle lifetime, a retired one removed once its
    /// last child is gone). The refill runs it before every round, full pool or not; at
    /// shutdown it is dropped part-way when starts are cancel-safe, else waited for.
    fn upkeep(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// When [`WarmSandboxes::upkeep`] is next due though no job comes (a zygote reaching
    /// its idle lifetime), if ever.
    fn upkeep_due(&self) -> Option<Instant> {
        None
    }

    /// Removes what the backend keeps besides the sandboxes, with whatever of it is left
    /// (the pool's end, after every waiting sandbox was removed). Called at most twice.
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// Adds the backend's own figures (the zygote's) to the pool's.
    fn add_stats(&self, _stats: &mut WarmPoolStats) {}
}

/// A started sandbox and when it became ready.
struct Ready<W> {
    warm: W,
    /// Past the pool's idle lifetime it is replaced.
    ready_at: Instant,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    unfit: AtomicU64,
    started: AtomicU64,
    failed: AtomicU64,
    discarded: AtomicU64,
    started_for_jobs: AtomicU64,
    started_for_sessions: AtomicU64,
}

struct Shared<S: WarmSandboxes> {
    sandboxes: Arc<S>,
    size: usize,
    idle_max: Duration,
    starts_max: Option<u64>,
    ready: Mutex<VecDeque<Ready<S::Warm>>>,
    wake: Notify,
    closed: AtomicBool,
    /// Told once, at shutdown: the refill abandons the starts under way rather than wait
    /// for them.
    stop: Notify,
    counters: Counters,
}

/// A backend with a pool of sandboxes started ahead of its jobs.
pub struct WarmPool<S: WarmSandboxes> {
    shared: Arc<Shared<S>>,
    /// The refill task, which [`WarmPool::shutdown`] waits for: it removes the sandboxes
    /// it still holds or is starting.
    refill: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl<S: WarmSandboxes> std::fmt::Debug for WarmPool<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmPool")
            .field("backend", &self.shared.sandboxes.kind())
            .field("size", &self.shared.size)
            .finish_non_exhaustive()
    }
}

impl<S: WarmSandboxes> WarmPool<S> {
    /// Keeps `config.size` sandboxes started, starting them in the background; one unused
    /// for `config.idle_max` is removed and replaced. Must be called inside a tokio runtime.
    pub fn start(sandboxes: Arc<S>, config: WarmPoolConfig) -> Self {
        let WarmPoolConfig {
            size,
            idle_max,
            starts_max,
        } = config;
        let shared = Arc::new(Shared {
            sandboxes,
            size,
            idle_max,
            starts_max,
            ready: Mutex::new(VecDeque::with_capacity(size)),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
            stop: Notify::new(),
            counters: Counters::default(),
        });
        let refill = tokio::spawn(refill(shared.clone()));
        Self {
            shared,
            refill: Mutex::new(Some(refill)),
        }
    }

    /// The backend's side of the pool.
    pub fn sandboxes(&self) -> &Arc<S> {
        &self.shared.sandboxes
    }

    /// The pool's figures.
    pub fn stats(&self) -> WarmPoolStats {
        let c = &self.shared.counters;
        let mut stats = WarmPoolStats {
            ready: self.ready() as u64,
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            unfit: c.unfit.load(Ordering::Relaxed),
            started: c.started.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            discarded: c.discarded.load(Ordering::Relaxed),
            started_for_jobs: c.started_for_jobs.load(Ordering::Relaxed),
            started_for_sessions: c.started_for_sessions.load(Ordering::Relaxed),
            ..WarmPoolStats::default()
        };
        self.shared.sandboxes.add_stats(&mut stats);
        stats
    }

    /// How many warm sandboxes are ready now.
    pub fn ready(&self) -> usize {
        self.shared.ready.lock().map(|r| r.len()).unwrap_or(0)
    }

    /// Whether `job` may run in one of the pool's sandboxes.
    pub fn fits(&self, job: &JobSpec) -> bool {
        self.shared.sandboxes.fits(job)
    }

    /// Stops refilling and removes every waiting sandbox, those being started and what the
    /// backend keeps besides them, before it returns.
    pub async fn shutdown(&self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
        self.shared.stop.notify_one();
        // Either this or the refill task, woken, takes each ready sandbox and removes it;
        // the task abandons the starts under way (each start's own guards remove what it
        // had made) and removes those that were up. Both are done when this returns.
        let drained = drain(&self.shared);
        tracing::debug!(waiting = drained.len(), "warm pool shutting down");
        for ready in drained {
            self.shared.sandboxes.discard(ready.warm).await;
        }
        let refill = self.refill.lock().ok().and_then(|mut task| task.take());
        if let Some(refill) = refill
            && let Err(e) = refill.await
        {
            tracing::warn!(error = %e, "the warm pool's refill task failed");
        }
        // The refill closed the backend's side as it ended; again in case it had failed.
        self.shared.sandboxes.close().await;
    }

    /// Runs `job`: in a warm sandbox when it fits and one is ready, else in a fresh one.
    pub async fn run_job_with(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
    ) -> Result<RunReport, S::Error> {
        Teardown::removed(self.run_job_then_teardown(job, tap).await).await
    }

    /// Like [`WarmPool::run_job_with`], leaving the sandbox's removal to the returned
    /// [`Teardown`]; the refill is woken once that removal is done, so that starting the
    /// next sandbox competes neither with the job nor with its cleanup.
    pub async fn run_job_then_teardown(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
    ) -> Result<(RunReport, Teardown), S::Error> {
        let shared = &self.shared;
        let sandboxes = &shared.sandboxes;
        if !sandboxes.fits(job) {
            shared.counters.unfit.fetch_add(1, Ordering::Relaxed);
            if let Some(start) = sandboxes.start_for_session(job) {
                match start.await {
                    Ok(warm) => {
                        shared
                            .counters
                            .started_for_sessions
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(job_id = %job.id, sandbox = %S::name(&warm),
                            "a session's job runs in a sandbox started for it with the session's mounts");
                        return self.deliver(job, tap, warm, Acquire::Fork).await;
                    }
                    Err(e) => {
                        tracing::warn!(job_id = %job.id, error = %e,
                            "cannot start a sandbox for a session's job; it runs in a fresh one");
                    }
                }
            }
            return sandboxes.run_fresh(job, tap).await;
        }
        let Some(warm) = self.take().await else {
            shared.counters.misses.fetch_add(1, Ordering::Relaxed);
            return self.run_missed(job, tap).await;
        };
        // The sandbox waited in the background; the job runs at normal priority, or in a
        // fresh sandbox if that cannot be had.
        if let Err(e) = sandboxes.raise_priority(&warm) {
            tracing::warn!(sandbox = %S::name(&warm), error = %e,
                "cannot give a warm sandbox normal CPU priority; the job starts in a fresh one");
            shared.counters.discarded.fetch_add(1, Ordering::Relaxed);
            sandboxes.discard(warm).await;
            shared.wake.notify_one();
            return sandboxes.run_fresh(job, tap).await;
        }
        shared.counters.hits.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(job_id = %job.id, sandbox = %S::name(&warm), "job delivered to a warm sandbox");
        self.deliver(job, tap, warm, Acquire::Warm).await
    }

    /// Runs a job that found no sandbox ready: in one the backend starts for it at once,
    /// if it can, else (and if that start fails) in a fresh one.
    async fn run_missed(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
    ) -> Result<(RunReport, Teardown), S::Error> {
        let shared = &self.shared;
        let sandboxes = &shared.sandboxes;
        let Some(start) = sandboxes.start_for_job() else {
            tracing::debug!(job_id = %job.id, "no warm sandbox ready; the job runs in a fresh one");
            return sandboxes.run_fresh(job, tap).await;
        };
        match start.await {
            Ok(warm) => {
                shared
                    .counters
                    .started_for_jobs
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(job_id = %job.id, sandbox = %S::name(&warm),
                    "no warm sandbox ready; the job runs in one started for it");
                self.deliver(job, tap, warm, Acquire::Fork).await
            }
            Err(e) => {
                tracing::warn!(job_id = %job.id, error = %e,
                    "cannot start a sandbox for a job that found none ready; it runs in a fresh one");
                sandboxes.run_fresh(job, tap).await
            }
        }
    }

    /// Delivers `job` to `warm`, which it got as `acquire` says; the refill is woken once
    /// the sandbox is removed.
    async fn deliver(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
        warm: S::Warm,
        acquire: Acquire,
    ) -> Result<(RunReport, Teardown), S::Error> {
        let shared = &self.shared;
        match shared.sandboxes.deliver(job, tap, warm).await {
            Ok((mut report, removal)) => {
                report.acquire = acquire;
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
    async fn take(&self) -> Option<S::Warm> {
        let shared = &self.shared;
        loop {
            let next = shared.ready.lock().ok().and_then(|mut r| r.pop_front());
            let Some(mut ready) = next else {
                shared.wake.notify_one();
                return None;
            };
            let name = S::name(&ready.warm).to_owned();
            if ready.ready_at.elapsed() > shared.idle_max {
                tracing::debug!(sandbox = %name, "a warm sandbox outlived its idle lifetime; discarded");
            } else if shared.sandboxes.is_alive(&mut ready.warm) {
                return Some(ready.warm);
            } else {
                tracing::warn!(sandbox = %name, "a warm sandbox died while waiting; discarded");
            }
            shared.counters.discarded.fetch_add(1, Ordering::Relaxed);
            shared.sandboxes.discard(ready.warm).await;
            shared.wake.notify_one();
        }
    }
}

impl<S: WarmSandboxes> Drop for WarmPool<S> {
    fn drop(&mut self) {
        // The refill task sees this and ends, removing what is still ready.
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
        self.shared.stop.notify_one();
    }
}

impl<S: WarmSandboxes> Backend for WarmPool<S> {
    fn kind(&self) -> BackendKind {
        self.shared.sandboxes.kind()
    }

    fn capabilities(&self) -> Capabilities {
        self.shared.sandboxes.capabilities()
    }

    fn run_then_teardown<'a>(
        &'a self,
        job: &'a JobSpec,
        tap: Option<OutputTap>,
    ) -> BoxFuture<'a, Result<(RunReport, Teardown), BackendError>> {
        Box::pin(async move {
            self.run_job_then_teardown(job, tap)
                .await
                .map_err(Into::into)
        })
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(WarmPool::shutdown(self))
    }

    fn warm_pool(&self) -> Option<WarmPoolStats> {
        Some(self.stats())
    }
}

/// Every ready sandbox, taken out of the pool.
fn drain<S: WarmSandboxes>(shared: &Shared<S>) -> Vec<Ready<S::Warm>> {
    match shared.ready.lock() {
        Ok(mut ready) => ready.drain(..).collect(),
        Err(_) => Vec::new(),
    }
}

/// The ready sandboxes past the idle lifetime, taken out of the pool (the oldest are first).
fn expired<S: WarmSandboxes>(shared: &Shared<S>) -> Vec<Ready<S::Warm>> {
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
async fn refill<S: WarmSandboxes>(shared: Arc<Shared<S>>) {
    let mut backoff = REFILL_BACKOFF_MIN;
    loop {
        if shared.closed.load(Ordering::SeqCst) {
            break;
        }
        for ready in expired(&shared) {
            tracing::debug!(sandbox = %S::name(&ready.warm), "a warm sandbox outlived its idle lifetime; replaced");
            shared.counters.discarded.fetch_add(1, Ordering::Relaxed);
            shared.sandboxes.discard(ready.warm).await;
        }
        if shared.sandboxes.starts_cancel_safe() {
            tokio::select! {
                () = shared.sandboxes.upkeep() => {}
                () = shared.stop.notified() => break,
            }
        } else {
            shared.sandboxes.upkeep().await;
        }
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
            // Asleep until a job takes one, the oldest reaches its idle lifetime or the
            // backend's upkeep is due.
            let due = oldest
                .map(|oldest| oldest + shared.idle_max)
                .into_iter()
                .chain(shared.sandboxes.upkeep_due())
                .min();
            match due {
                Some(due) => {
                    let due = tokio::time::Instant::from_std(due);
                    let _ = tokio::time::timeout_at(due, shared.wake.notified()).await;
                }
                None => shared.wake.notified().await,
            }
            continue;
        }
        // The missing sandboxes start together: on the native backend moving a process
        // into a cgroup makes the kernel wait for an RCU grace period while it holds off
        // every fork and exit on the host, once per burst of moves rather than per move,
        // so a batch costs one such pause instead of one per sandbox; a daemon starts
        // containers side by side.
        let mut starts = tokio::task::JoinSet::new();
        for _ in 0..(shared.size - have).min(REFILL_BATCH_MAX).min(allowed) {
            let sandboxes = shared.sandboxes.clone();
            starts.spawn(async move { sandboxes.start().await });
        }
        let mut failed = false;
        let mut closed = false;
        loop {
            let joined = tokio::select! {
                joined = starts.join_next() => joined,
                () = shared.stop.notified(), if !closed => {
                    // Shutting down: a start under way is dropped where the backend's
                    // guards then remove what it had made, else waited for; what comes up
                    // is removed below.
                    closed = true;
                    if shared.sandboxes.starts_cancel_safe() {
                        starts.abort_all();
                    }
                    continue;
                }
            };
            let Some(joined) = joined else { break };
            match joined {
                Ok(Ok(warm)) => {
                    shared.counters.started.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(sandbox = %S::name(&warm), "warm sandbox ready");
                    if closed || shared.closed.load(Ordering::SeqCst) {
                        closed = true;
                        shared.sandboxes.discard(warm).await;
                        continue;
                    }
                    let ready = Ready {
                        warm,
                        ready_at: Instant::now(),
                    };
                    match shared.ready.lock() {
                        Ok(mut queue) => queue.push_back(ready),
                        Err(_) => closed = true,
                    }
                }
                Ok(Err(e)) => {
                    failed = true;
                    shared.counters.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64,
                        "cannot start a warm sandbox");
                }
                Err(e) if e.is_cancelled() => {}
                Err(e) => {
                    failed = true;
                    shared.counters.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64,
                        "a warm sandbox's start task failed");
                }
            }
        }
        if closed {
            break;
        }
        if failed {
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = shared.stop.notified() => break,
            }
            backoff = (backoff * 2).min(REFILL_BACKOFF_MAX);
        } else {
            backoff = REFILL_BACKOFF_MIN;
        }
    }
    for ready in drain(&shared) {
        shared.sandboxes.discard(ready.warm).await;
    }
    shared.sandboxes.close().await;
}

/// The job a backend's warm sandboxes are built for: `request` (`airlock run --warm`'s
/// job), else an empty program in the pool's `language` with every default of the policy.
pub fn template_job(
    policy: &crate::Policy,
    request: Option<crate::JobRequest>,
    language: &str,
) -> Result<crate::JobSpec, crate::BackendError> {
    if let Some(request) = request {
        return request.resolve(policy).map_err(|e| {
            crate::BackendError::new(
                crate::ErrorKind::PolicyDenied,
                format!("the warm sandbox's job is refused by the policy: {e}"),
            )
        });
    }
    crate::JobRequest {
        language: language.to_owned(),
        ..Default::default()
    }
    .resolve(policy)
    .map_err(|e| {
        crate::BackendError::new(
            crate::ErrorKind::BackendUnavailable,
            format!("the warm pool's template job is refused by the policy: {e}"),
        )
    })
}

/// A pool's size as opened with `options`, from the policy's `size` for it, and the bound
/// on its starts: one job (`airlock run --warm`) gets one sandbox and no replacement after
/// it. `None` when no pool is to be kept.
pub fn pool_size(size: u32, options: &crate::OpenOptions) -> Option<(usize, Option<u64>)> {
    let single_job = options.warm_template.is_some();
    let size = if single_job { size.max(1) } else { size };
    (options.warm_pool && size > 0).then_some((size as usize, single_job.then_some(1)))
}

#[cfg(test)]
mod tests {
    //! The pool's rules against a fake backend whose sandboxes are ids: which sandbox a job
    //! got, which were discarded, which are still up.
    use super::*;
    use crate::observation::Termination;
    use crate::{BackendError, ErrorKind, JobRequest, Policy};
    use pretty_assertions::assert_eq;
    use std::collections::BTreeSet;

    /// Long enough for anything these tests wait for on a loaded machine; they wait for
    /// states, never measure time.
    const PATIENCE: Duration = Duration::from_secs(20);

    #[derive(Debug)]
    struct FakeError;

    impl std::fmt::Display for FakeError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("fake failure")
        }
    }

    impl From<FakeError> for BackendError {
        fn from(_: FakeError) -> Self {
            BackendError::new(ErrorKind::Internal, "fake failure")
        }
    }

    struct FakeWarm {
        id: u64,
        name: String,
        alive: Arc<AtomicBool>,
    }

    /// Removes a sandbox whose start is dropped before it is up, as a backend's guards do
    /// (a container's removal, a helper killed on drop).
    struct StartGuard<'a> {
        fake: &'a Fake,
        id: Option<u64>,
    }

    impl Drop for StartGuard<'_> {
        fn drop(&mut self) {
            if let Some(id) = self.id.take() {
                self.fake.remove(id);
                self.fake.abandoned.lock().unwrap().push(id);
            }
        }
    }

    #[derive(Default)]
    struct Fake {
        next: AtomicU64,
        /// Sandboxes started and not yet removed, and a handle to kill each.
        up: Mutex<Vec<(u64, Arc<AtomicBool>)>>,
        discarded: Mutex<Vec<u64>>,
        /// Sandboxes whose start was dropped (and removed by its guard).
        abandoned: Mutex<Vec<u64>>,
        /// The sandbox each delivered job got.
        delivered: Mutex<Vec<u64>>,
        fresh: AtomicU64,
        raise_fails: AtomicBool,
        /// How long a start takes.
        start_delay: Duration,
        /// Whether a start may be dropped part-way (its guard removes it).
        cancel_safe: bool,
        /// Rounds of the refill (each runs the upkeep first).
        upkeeps: AtomicU64,
        /// How often the upkeep is due without a job, if ever.
        upkeep_every: Option<Duration>,
        closes: AtomicU64,
        /// Whether a job that finds none ready gets one started for it: `Some(true)` starts
        /// succeed, `Some(false)` fail, `None` there is no such start.
        start_for_job: Option<bool>,
        /// The sandboxes started for jobs.
        started_for_jobs: Mutex<Vec<u64>>,
    }

    impl Fake {
        fn up(&self) -> BTreeSet<u64> {
            self.up.lock().unwrap().iter().map(|(id, _)| *id).collect()
        }

        fn remove(&self, id: u64) {
            self.up.lock().unwrap().retain(|(up, _)| *up != id);
        }

        fn kill(&self, id: u64) {
            let up = self.up.lock().unwrap();
            let (_, alive) = up.iter().find(|(up, _)| *up == id).unwrap();
            alive.store(false, Ordering::SeqCst);
        }
    }

    fn report() -> RunReport {
        RunReport::ended(Termination::Exited(0), Duration::ZERO)
    }

    impl WarmSandboxes for Fake {
        type Warm = FakeWarm;
        type Error = FakeError;

        fn kind(&self) -> BackendKind {
            BackendKind::Native
        }

        fn capabilities(&self) -> Capabilities {
            Capabilities::bare(BackendKind::Native)
        }

        fn fits(&self, job: &JobSpec) -> bool {
            job.language == "python"
        }

        fn start(&self) -> BoxFuture<'_, Result<FakeWarm, FakeError>> {
            Box::pin(async move {
                // Up from the start's first step, as a container is once created.
                let id = self.next.fetch_add(1, Ordering::SeqCst);
                let alive = Arc::new(AtomicBool::new(true));
                self.up.lock().unwrap().push((id, alive.clone()));
                let mut guard = StartGuard {
                    fake: self,
                    id: Some(id),
                };
                tokio::time::sleep(self.start_delay).await;
                guard.id = None;
                Ok(FakeWarm {
                    id,
                    name: format!("warm-{id}"),
                    alive,
                })
            })
        }

        fn start_for_job(&self) -> Option<BoxFuture<'_, Result<FakeWarm, FakeError>>> {
            let succeeds = self.start_for_job?;
            Some(Box::pin(async move {
                if !succeeds {
                    return Err(FakeError);
                }
                let id = self.next.fetch_add(1, Ordering::SeqCst);
                let alive = Arc::new(AtomicBool::new(true));
                self.up.lock().unwrap().push((id, alive.clone()));
                self.started_for_jobs.lock().unwrap().push(id);
                Ok(FakeWarm {
                    id,
                    name: format!("for-job-{id}"),
                    alive,
                })
            }))
        }

        fn starts_cancel_safe(&self) -> bool {
            self.cancel_safe
        }

        fn name(warm: &FakeWarm) -> &str {
            &warm.name
        }

        fn is_alive(&self, warm: &mut FakeWarm) -> bool {
            warm.alive.load(Ordering::SeqCst)
        }

        fn raise_priority(&self, _: &FakeWarm) -> Result<(), String> {
            if self.raise_fails.load(Ordering::SeqCst) {
                Err("refused".into())
            } else {
                Ok(())
            }
        }

        fn deliver<'a>(
            &'a self,
            _: &'a JobSpec,
            _: Option<OutputTap>,
            warm: FakeWarm,
        ) -> BoxFuture<'a, Result<(RunReport, Teardown), FakeError>> {
            Box::pin(async move {
                self.delivered.lock().unwrap().push(warm.id);
                self.remove(warm.id);
                Ok((report(), Teardown::none()))
            })
        }

        fn discard(&self, warm: FakeWarm) -> BoxFuture<'_, ()> {
            Box::pin(async move {
                self.discarded.lock().unwrap().push(warm.id);
                self.remove(warm.id);
            })
        }

        fn run_fresh<'a>(
            &'a self,
            _: &'a JobSpec,
            _: Option<OutputTap>,
        ) -> BoxFuture<'a, Result<(RunReport, Teardown), FakeError>> {
            Box::pin(async move {
                self.fresh.fetch_add(1, Ordering::SeqCst);
                Ok((report(), Teardown::none()))
            })
        }

        fn upkeep(&self) -> BoxFuture<'_, ()> {
            Box::pin(async move {
                self.upkeeps.fetch_add(1, Ordering::SeqCst);
            })
        }

        fn upkeep_due(&self) -> Option<Instant> {
            self.upkeep_every.map(|every| Instant::now() + every)
        }

        fn close(&self) -> BoxFuture<'_, ()> {
            Box::pin(async move {
                self.closes.fetch_add(1, Ordering::SeqCst);
            })
        }

        fn add_stats(&self, stats: &mut WarmPoolStats) {
            stats.zygotes_started = self.upkeeps.load(Ordering::SeqCst);
        }
    }

    fn job(language: &str) -> JobSpec {
        JobRequest {
            language: language.into(),
            source: b"pass".to_vec(),
            ..Default::default()
        }
        .resolve(&Policy::builtin())
        .unwrap()
    }

    fn config(size: usize, idle_max: Duration) -> WarmPoolConfig {
        WarmPoolConfig {
            size,
            idle_max,
            starts_max: None,
        }
    }

    async fn until(what: &str, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !check() {
            assert!(Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_job_takes_the_oldest_ready_sandbox_and_it_is_replaced_after() {
        let fake = Arc::new(Fake::default());
        let pool = WarmPool::start(fake.clone(), config(2, Duration::from_secs(600)));
        until("two ready", || pool.ready() == 2).await;
        let report = pool.run_job_with(&job("python"), None).await.unwrap();
        assert_eq!(report.acquire, Acquire::Warm);
        assert_eq!(*fake.delivered.lock().unwrap(), vec![0]);
        until("the replacement", || pool.ready() == 2).await;
        assert_eq!(fake.up(), BTreeSet::from([1, 2]));
        pool.run_job_with(&job("python"), None).await.unwrap();
        assert_eq!(*fake.delivered.lock().unwrap(), vec![0, 1], "never reused");
        let stats = pool.stats();
        assert_eq!((stats.hits, stats.misses, stats.unfit), (2, 0, 0));
        assert_eq!(fake.fresh.load(Ordering::SeqCst), 0);
        pool.shutdown().await;
    }

    #[tokio::test]
    async fn unfit_jobs_and_jobs_finding_none_ready_run_fresh() {
        let fake = Arc::new(Fake {
            start_delay: Duration::from_secs(3600),
            ..Fake::default()
        });
        let pool = WarmPool::start(fake.clone(), config(1, Duration::from_secs(600)));
        let unfit = pool.run_job_with(&job("sh"), None).await.unwrap();
        let missed = pool.run_job_with(&job("python"), None).await.unwrap();
        assert_eq!(
            (unfit.acquire, missed.acquire),
            (Acquire::Fresh, Acquire::Fresh)
        );
        let stats = pool.stats();
        assert_eq!((stats.hits, stats.misses, stats.unfit), (0, 1, 1));
        assert_eq!(fake.fresh.load(Ordering::SeqCst), 2);
        assert!(fake.delivered.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_job_finding_none_ready_runs_in_one_started_for_it_where_the_backend_can() {
        for succeeds in [true, false] {
            let fake = Arc::new(Fake {
                start_delay: Duration::from_secs(3600),
                start_for_job: Some(succeeds),
                ..Fake::default()
            });
            let pool = WarmPool::start(fake.clone(), config(1, Duration::from_secs(600)));
            let missed = pool.run_job_with(&job("python"), None).await.unwrap();
            let expected = if succeeds {
                Acquire::Fork
            } else {
                Acquire::Fresh
            };
            assert_eq!(missed.acquire, expected);
            // An unfit job never gets one: it would not run as in a fresh sandbox.
            let unfit = pool.run_job_with(&job("sh"), None).await.unwrap();
            assert_eq!(unfit.acquire, Acquire::Fresh);
            let stats = pool.stats();
            assert_eq!((stats.hits, stats.misses, stats.unfit), (0, 1, 1));
            let started = fake.started_for_jobs.lock().unwrap().clone();
            if succeeds {
                assert_eq!(*fake.delivered.lock().unwrap(), started);
                assert_eq!(started.len(), 1);
                assert_eq!(stats.started_for_jobs, 1);
                assert_eq!(fake.fresh.load(Ordering::SeqCst), 1, "the unfit one");
                assert!(!fake.up().contains(&started[0]), "removed after its job");
            } else {
                // A failed start costs the job nothing but the attempt: it runs fresh.
                assert!(fake.delivered.lock().unwrap().is_empty());
                assert_eq!(stats.started_for_jobs, 0);
                assert_eq!(fake.fresh.load(Ordering::SeqCst), 2);
            }
            pool.shutdown().await;
        }
    }

    #[tokio::test]
    async fn a_dead_sandbox_is_discarded_and_never_gets_a_job() {
        let fake = Arc::new(Fake::default());
        let pool = WarmPool::start(fake.clone(), config(2, Duration::from_secs(600)));
        until("two ready", || pool.ready() == 2).await;
        fake.kill(0);
        pool.run_job_with(&job("python"), None).await.unwrap();
        assert_eq!(*fake.delivered.lock().unwrap(), vec![1]);
        assert_eq!(*fake.discarded.lock().unwrap(), vec![0]);
        assert_eq!(pool.stats().discarded, 1);
        until("refilled", || pool.ready() == 2).await;
        pool.shutdown().await;
    }

    #[tokio::test]
    async fn a_sandbox_whose_priority_cannot_be_raised_is_discarded_and_the_job_runs_fresh() {
        let fake = Arc::new(Fake::default());
        let pool = WarmPool::start(fake.clone(), config(1, Duration::from_secs(600)));
        until("one ready", || pool.ready() == 1).await;
        fake.raise_fails.store(true, Ordering::SeqCst);
        pool.run_job_with(&job("python"), None).await.unwrap();
        assert!(fake.delivered.lock().unwrap().is_empty());
        assert_eq!(*fake.discarded.lock().unwrap(), vec![0]);
        assert_eq!(fake.fresh.load(Ordering::SeqCst), 1);
        let stats = pool.stats();
        assert_eq!((stats.hits, stats.discarded), (0, 1));
        pool.shutdown().await;
    }

    #[tokio::test]
    async fn a_sandbox_idle_past_its_lifetime_is_replaced_without_a_job() {
        let fake = Arc::new(Fake::default());
        let pool = WarmPool::start(fake.clone(), config(1, Duration::from_millis(50)));
        until("the first replaced", || {
            fake.discarded.lock().unwrap().contains(&0) && pool.ready() == 1
        })
        .await;
        assert!(!fake.up().contains(&0));
        assert!(fake.delivered.lock().unwrap().is_empty());
        pool.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_removes_the_waiting_sandboxes_and_those_still_starting() {
        for (wait_for_ready, cancel_safe) in [(false, true), (false, false), (true, true)] {
            // Cancel-safe starts that never end unless abandoned: a shutdown that waited
            // for them would never return. The others end, and are waited for.
            let fake = Arc::new(Fake {
                start_delay: if cancel_safe && !wait_for_ready {
                    Duration::from_secs(3600)
                } else {
                    Duration::from_millis(50)
                },
                cancel_safe,
                ..Fake::default()
            });
            let pool = WarmPool::start(fake.clone(), config(3, Duration::from_secs(600)));
            if wait_for_ready {
                until("three ready", || pool.ready() == 3).await;
            } else {
                until("three starting", || fake.up().len() == 3).await;
            }
            pool.shutdown().await;
            // Whatever had started, the refill's or the shutdown's removal took it, or the
            // abandoned start's guard, before shutdown returned.
            assert_eq!(fake.up(), BTreeSet::new(), "ready first: {wait_for_ready}");
            let removed =
                fake.discarded.lock().unwrap().len() + fake.abandoned.lock().unwrap().len();
            assert_eq!(removed as u64, fake.next.load(Ordering::SeqCst));
            let abandoned = fake.abandoned.lock().unwrap().len();
            if cancel_safe && !wait_for_ready {
                assert!(abandoned > 0, "the starts under way were waited for");
            }
            if !cancel_safe {
                assert_eq!(abandoned, 0, "a start that is not cancel-safe was dropped");
            }
            assert_eq!(pool.ready(), 0);
        }
    }

    #[tokio::test]
    async fn no_more_sandboxes_start_than_the_bound() {
        for starts_max in [Some(1), None] {
            let fake = Arc::new(Fake::default());
            let config = WarmPoolConfig {
                starts_max,
                ..config(1, Duration::from_secs(600))
            };
            let pool = WarmPool::start(fake.clone(), config);
            until("one ready", || pool.ready() == 1).await;
            pool.run_job_with(&job("python"), None).await.unwrap();
            // Two more rounds of the refill: every start of the first is over once the
            // second's upkeep runs (a job finding none ready wakes it).
            let rounds = fake.upkeeps.load(Ordering::SeqCst);
            until("a round after the job", || {
                fake.upkeeps.load(Ordering::SeqCst) > rounds
            })
            .await;
            pool.run_job_with(&job("python"), None).await.unwrap();
            until("the round after that", || {
                fake.upkeeps.load(Ordering::SeqCst) > rounds + 1
            })
            .await;
            let started = fake.next.load(Ordering::SeqCst);
            match starts_max {
                Some(max) => assert_eq!(started, max, "no replacement past the bound"),
                None => assert!(started >= 2, "unbounded, the first was replaced"),
            }
            pool.shutdown().await;
        }
    }

    #[tokio::test]
    async fn the_backends_upkeep_runs_when_due_and_its_state_goes_last() {
        let fake = Arc::new(Fake {
            upkeep_every: Some(Duration::from_millis(20)),
            ..Fake::default()
        });
        let pool = WarmPool::start(fake.clone(), config(1, Duration::from_secs(600)));
        until("one ready", || pool.ready() == 1).await;
        // The pool is full and no job comes: only the upkeep's own deadline wakes it.
        let rounds = fake.upkeeps.load(Ordering::SeqCst);
        until("upkeep without a job", || {
            fake.upkeeps.load(Ordering::SeqCst) > rounds + 2
        })
        .await;
        assert!(
            pool.stats().zygotes_started > rounds + 2,
            "the backend's figures"
        );
        assert_eq!(fake.closes.load(Ordering::SeqCst), 0);
        pool.shutdown().await;
        assert!(fake.closes.load(Ordering::SeqCst) >= 1);
        assert_eq!(fake.up(), BTreeSet::new());
    }
}
