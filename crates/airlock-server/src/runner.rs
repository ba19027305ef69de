//! Admission and execution: a fixed number of jobs in flight, a bounded queue, per-tenant
//! bounds on both shared fairly (crate::fair), one engine per distinct policy, and the shutdown phases that first refuse
//! queued jobs and then kill running ones.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use airlock_core::{
    Backend, BackendError, BackendKind, BoxFuture, ErrorKind, JobRequest, JobResult, Observation,
    Policy, WarmPoolStats,
};
use airlock_engine::sessions::{
    SessionCall, SessionError, SessionInfo, SessionManager, SessionRunResult,
};
use airlock_engine::{AuditLog, Engine, LoadedPolicy, OutputSink};
use tokio::sync::watch;

use crate::auth::TenantConfig;
use crate::error::ServerError;
use crate::fair::{Acquire, FairSlots, QueueRefusal, SlotPermit, TenantBounds};
use crate::metrics::Metrics;

/// A job may run this much longer than its policy's wall-time ceiling (sandbox setup and
/// teardown) before the server kills it anyway.
pub const JOB_DEADLINE_SLACK: Duration = Duration::from_secs(30);

/// Where the server is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Taking jobs.
    Serving,
    /// Shutting down: no new or queued job starts; running ones may finish.
    Draining,
    /// Shutting down, the grace period is over: running jobs are killed.
    Killing,
}

/// Why a job was not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The queue is full.
    QueueFull,
    /// The job waited longer than the queue allows.
    QueueTimeout,
    /// The server is shutting down.
    ShuttingDown,
    /// The tenant already has `limit` jobs waiting, the most its policy's
    /// `admission.max_queued_per_tenant` allows.
    TenantQueueFull {
        /// The tenant's bound.
        limit: u32,
    },
}

impl Refusal {
    /// A short name (metrics label).
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::QueueFull => "queue_full",
            Refusal::QueueTimeout => "queue_timeout",
            Refusal::ShuttingDown => "shutting_down",
            Refusal::TenantQueueFull { .. } => "tenant_queue_full",
        }
    }

    /// For a human.
    pub fn message(self) -> String {
        match self {
            Refusal::QueueFull => {
                "every job slot is busy and the server's queue is full; retry later".to_owned()
            }
            Refusal::QueueTimeout => "the job waited too long for a slot; retry later".to_owned(),
            Refusal::ShuttingDown => "airlock is shutting down".to_owned(),
            Refusal::TenantQueueFull { limit } => format!(
                "this tenant already has {limit} jobs waiting for a slot, the most its policy \
                 allows (admission.max_queued_per_tenant = {limit}); retry later"
            ),
        }
    }
}

/// Sizes of the admission control.
#[derive(Debug, Clone)]
pub struct Admission {
    /// Jobs running at once.
    pub max_in_flight: usize,
    /// Jobs waiting for a slot.
    pub queue: usize,
    /// Longest wait for a slot.
    pub queue_wait_max: Duration,
}

/// A policy and the engine that runs jobs under it.
struct PolicyEngine {
    engine: Arc<Engine>,
    policy: Arc<Policy>,
    /// The engines of the policy's E2B templates that have their own root or memory
    /// (`[e2b.templates.NAME] rootfs`, `memory`), by template name.
    templates: HashMap<String, Arc<Engine>>,
}

struct TenantState {
    engine: Arc<PolicyEngine>,
    /// The tokens file's `max_in_flight` for the tenant.
    max_in_flight: Option<usize>,
}

/// Makes the backend for a policy.
pub type BackendFactory =
    dyn Fn(&LoadedPolicy) -> Result<Arc<dyn Backend>, BackendError> + Send + Sync;

/// The backend `kind` for a policy (the engine knows how to open each), with the
/// policy's warm sandboxes kept started: a server lives long enough to use them.
pub fn open_backend(
    kind: BackendKind,
    loaded: &LoadedPolicy,
) -> Result<Arc<dyn Backend>, BackendError> {
    airlock_engine::backends::open_with(
        kind,
        loaded,
        airlock_engine::backends::OpenOptions {
            warm_pool: true,
            ..Default::default()
        },
    )
}

/// Runs jobs for the HTTP API and the MCP tool.
pub struct Runner {
    default: Arc<PolicyEngine>,
    tenants: HashMap<String, TenantState>,
    slots: Arc<FairSlots>,
    admission: Admission,
    in_flight: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    phase: watch::Receiver<Phase>,
    /// Open sessions; started on first use (its reaper needs the runtime).
    sessions: std::sync::OnceLock<Result<Arc<SessionManager>, String>>,
    sessions_root: PathBuf,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("admission", &self.admission)
            .field("tenants", &self.tenants.len())
            .finish_non_exhaustive()
    }
}

/// The engine of one policy (no templates of its own).
fn open_engine(
    loaded: LoadedPolicy,
    kind: BackendKind,
    backends: &BackendFactory,
) -> Result<Engine, ServerError> {
    let audit = AuditLog::open(&loaded.audit_path(), loaded.policy.audit.fsync)
        .map_err(ServerError::OpenAudit)?;
    let backend = backends(&loaded);
    if let Err(e) = &backend {
        tracing::error!(policy = %loaded.origin(), kind = %e.kind, error = %e.message,
            "backend unavailable: jobs under this policy will fail with backend_unavailable");
    }
    Ok(Engine::new(loaded.policy, kind, backend, audit))
}

fn build_engine(
    loaded: LoadedPolicy,
    kind: BackendKind,
    backends: &BackendFactory,
) -> Result<PolicyEngine, ServerError> {
    let mut templates = HashMap::new();
    for name in loaded.policy.e2b.templates.keys() {
        let derived = loaded
            .policy
            .for_e2b_template(name, &loaded.origin())
            .map_err(|e| ServerError::LoadPolicy(e.into()))?;
        if let Some(policy) = derived {
            // The same audit log (the path is the policy file's): a template's sandboxes
            // are audited with the policy's, their lines naming the template.
            let template = LoadedPolicy {
                policy,
                path: loaded.path.clone(),
            };
            tracing::info!(template = %name, rootfs = %template.policy.filesystem.rootfs,
                memory = %template.policy.limits.memory, "E2B template with its own engine");
            templates.insert(
                name.clone(),
                Arc::new(open_engine(template, kind, backends)?),
            );
        }
    }
    let policy = Arc::new(loaded.policy.clone());
    Ok(PolicyEngine {
        engine: Arc::new(open_engine(loaded, kind, backends)?),
        policy,
        templates,
    })
}

impl Runner {
    /// Builds one engine per distinct policy (the server's, and each tenant's own), each
    /// with a backend of `kind` made by `backends`.
    pub fn new(
        default_policy: LoadedPolicy,
        kind: BackendKind,
        tenants: &[TenantConfig],
        admission: Admission,
        metrics: Arc<Metrics>,
        phase: watch::Receiver<Phase>,
        backends: &BackendFactory,
    ) -> Result<Self, ServerError> {
        let default = Arc::new(build_engine(default_policy, kind, backends)?);
        let mut by_path: HashMap<PathBuf, Arc<PolicyEngine>> = HashMap::new();
        let mut states = HashMap::new();
        for tenant in tenants {
            let engine = match &tenant.policy {
                None => default.clone(),
                Some(path) => {
                    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
                    match by_path.get(&key) {
                        Some(engine) => engine.clone(),
                        None => {
                            let loaded =
                                LoadedPolicy::from_file(path).map_err(ServerError::LoadPolicy)?;
                            let engine = Arc::new(build_engine(loaded, kind, backends)?);
                            by_path.insert(key, engine.clone());
                            engine
                        }
                    }
                }
            };
            states.insert(
                tenant.name.clone(),
                TenantState {
                    engine,
                    max_in_flight: tenant.max_in_flight,
                },
            );
        }
        Ok(Self {
            default,
            tenants: states,
            slots: FairSlots::new(admission.max_in_flight.max(1), admission.queue),
            admission,
            in_flight: Arc::new(AtomicUsize::new(0)),
            metrics,
            phase,
            sessions: std::sync::OnceLock::new(),
            sessions_root: std::env::var_os("AIRLOCK_SESSIONS_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(airlock_engine::sessions::default_root),
        })
    }

    /// The session manager, started on first use.
    pub fn sessions(&self) -> Result<Arc<SessionManager>, SessionError> {
        self.sessions
            .get_or_init(|| SessionManager::start(&self.sessions_root).map_err(|e| e.to_string()))
            .clone()
            .map_err(SessionError::Unsupported)
    }

    /// The engine a tenant's sessions run on.
    pub fn session_engine(&self, tenant: Option<&str>) -> Arc<Engine> {
        self.state(tenant).0.engine.clone()
    }

    /// The engine the sandboxes of a tenant's E2B template run on: the template's own
    /// (its root, its memory) when it has one, else the tenant's session engine.
    pub fn template_engine(&self, tenant: Option<&str>, template: &str) -> Arc<Engine> {
        let policy_engine = &self.state(tenant).0;
        policy_engine
            .templates
            .get(template)
            .unwrap_or(&policy_engine.engine)
            .clone()
    }

    /// Ends every open session (server shutdown).
    pub async fn shutdown_sessions(&self) {
        if let Some(Ok(manager)) = self.sessions.get() {
            manager.shutdown().await;
        }
    }

    /// Each distinct engine once (tenants may share one).
    fn engines(&self) -> Vec<&Arc<PolicyEngine>> {
        let mut engines: Vec<&Arc<PolicyEngine>> = vec![&self.default];
        for tenant in self.tenants.values() {
            if !engines.iter().any(|e| Arc::ptr_eq(e, &tenant.engine)) {
                engines.push(&tenant.engine);
            }
        }
        engines
    }

    /// Releases what every engine's backend holds between jobs (warm sandboxes), once no
    /// job runs any more.
    pub async fn shutdown_backends(&self) {
        for engine in self.engines() {
            engine.engine.shutdown().await;
            for template in engine.templates.values() {
                template.shutdown().await;
            }
        }
    }

    /// The health of each distinct audit log's writes.
    pub fn audit_health(&self) -> Vec<airlock_engine::audit::AuditHealth> {
        self.engines()
            .iter()
            .map(|e| e.engine.audit().health())
            .collect()
    }

    /// The warm pools' figures summed, when any policy keeps warm sandboxes.
    pub fn warm_pool_stats(&self) -> Option<WarmPoolStats> {
        let mut total: Option<WarmPoolStats> = None;
        let engines = self.engines();
        let all = engines
            .iter()
            .flat_map(|e| std::iter::once(&e.engine).chain(e.templates.values()));
        for stats in all.filter_map(|e| e.warm_pool()) {
            total.get_or_insert_with(WarmPoolStats::default).add(&stats);
        }
        total
    }

    /// The sizes of admission control.
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// Jobs running now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Jobs waiting now.
    pub fn queued(&self) -> usize {
        self.slots.waiting()
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    fn state(&self, tenant: Option<&str>) -> (&Arc<PolicyEngine>, TenantBounds) {
        match tenant.and_then(|t| self.tenants.get(t)) {
            Some(state) => {
                let policy = &state.engine.policy.admission;
                let from_policy =
                    usize::try_from(policy.max_in_flight_per_tenant).unwrap_or(usize::MAX);
                (
                    &state.engine,
                    TenantBounds {
                        max_running: state
                            .max_in_flight
                            .map_or(from_policy, |n| n.min(from_policy)),
                        max_waiting: usize::try_from(policy.max_queued_per_tenant)
                            .unwrap_or(usize::MAX),
                    },
                )
            }
            // Without tokens there is one caller: only the server's own sizes bound it.
            None => (&self.default, TenantBounds::UNBOUNDED),
        }
    }

    /// The policy jobs of `tenant` run under.
    pub fn policy(&self, tenant: Option<&str>) -> Arc<Policy> {
        self.state(tenant).0.policy.clone()
    }

    fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// Waits for a job slot (and the tenant's own), in the bounded queue when none is free.
    pub async fn admit(&self, tenant: Option<&str>) -> Result<Admitted, Refusal> {
        self.admit_job(tenant, None).await
    }

    /// Like [`Runner::admit`], for `request`: when it has to wait in the queue, its
    /// write-ahead audit record is written before it waits (so a server killed meanwhile
    /// still leaves its one `interrupted` line), and it runs under the id given there.
    pub async fn admit_job(
        &self,
        tenant: Option<&str>,
        request: Option<&JobRequest>,
    ) -> Result<Admitted, Refusal> {
        let result = self.admit_inner(tenant, request).await;
        if let Err(refusal) = &result {
            self.metrics.rejected(refusal.as_str());
        }
        result
    }

    async fn admit_inner(
        &self,
        tenant: Option<&str>,
        request: Option<&JobRequest>,
    ) -> Result<Admitted, Refusal> {
        if self.phase() != Phase::Serving {
            return Err(Refusal::ShuttingDown);
        }
        let (engine, bounds) = self.state(tenant);
        let started = Instant::now();
        let acquired = self
            .slots
            .try_acquire(tenant.unwrap_or(""), bounds)
            .map_err(|refusal| match refusal {
                QueueRefusal::ServerQueueFull => Refusal::QueueFull,
                QueueRefusal::TenantQueueFull => Refusal::TenantQueueFull {
                    limit: engine.policy.admission.max_queued_per_tenant,
                },
            })?;
        let mut queued_job = None;
        let permit = match acquired {
            Acquire::Granted(permit) => permit,
            Acquire::Queued(waiting) => {
                let _queued = QueueGauge::enter(&self.metrics);
                // Dropped with this future if the job leaves the queue unrun: its record
                // is withdrawn then.
                queued_job = request.and_then(|r| engine.engine.accept_queued(r, tenant));
                let mut phase = self.phase.clone();
                tokio::select! {
                    permit = waiting.granted() => permit,
                    _ = phase.wait_for(|p| *p != Phase::Serving) => return Err(Refusal::ShuttingDown),
                    _ = tokio::time::sleep(self.admission.queue_wait_max) => return Err(Refusal::QueueTimeout),
                }
            }
        };
        self.metrics.waited(started.elapsed().as_secs_f64());
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.metrics.in_flight().inc();
        Ok(Admitted {
            in_flight: self.in_flight.clone(),
            metrics: self.metrics.clone(),
            phase: self.phase.clone(),
            engine: engine.clone(),
            tenant: tenant.map(str::to_owned),
            queued: queued_job,
            _permit: permit,
        })
    }

    /// When the policy refuses `request` outright, its (audited) error observation,
    /// produced without taking a slot; `None` when it must be admitted and run.
    pub async fn refuse_early(
        &self,
        tenant: Option<&str>,
        request: &JobRequest,
    ) -> Option<JobResult> {
        let (engine, _) = self.state(tenant);
        if request.clone().resolve(&engine.policy).is_ok() {
            return None;
        }
        let result = engine
            .engine
            .run_until(
                request.clone(),
                tenant.map(str::to_owned),
                std::future::pending(),
                None,
            )
            .await;
        self.metrics.job_finished(&result.observation, 0.0);
        Some(result)
    }

    /// Admits and runs one job.
    pub async fn run(
        &self,
        tenant: Option<&str>,
        request: JobRequest,
        sink: Option<OutputSink>,
    ) -> Result<JobResult, Refusal> {
        Ok(self
            .admit_job(tenant, Some(&request))
            .await?
            .run(request, sink)
            .await)
    }
}

/// Counts a job in the queue-depth gauge while it waits.
struct QueueGauge {
    metrics: Arc<Metrics>,
}

impl QueueGauge {
    fn enter(metrics: &Arc<Metrics>) -> Self {
        metrics.queue_depth().inc();
        Self {
            metrics: metrics.clone(),
        }
    }
}

impl Drop for QueueGauge {
    fn drop(&mut self) {
        self.metrics.queue_depth().dec();
    }
}

/// A job that holds its slots. Dropping it (unused, or mid-run) releases them.
pub struct Admitted {
    in_flight: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    phase: watch::Receiver<Phase>,
    engine: Arc<PolicyEngine>,
    tenant: Option<String>,
    /// The write-ahead record written while the job waited in the queue.
    queued: Option<airlock_engine::QueuedJob>,
    _permit: SlotPermit,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.metrics.in_flight().dec();
    }
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("tenant", &self.tenant)
            .finish_non_exhaustive()
    }
}

impl Admitted {
    /// The policy the job runs under.
    pub fn policy(&self) -> &Policy {
        &self.engine.policy
    }

    /// Runs the job. It is killed (and its sandbox removed) when the server reaches
    /// [`Phase::Killing`], or when it outlives its policy's ceiling by
    /// [`JOB_DEADLINE_SLACK`].
    pub async fn run(self, request: JobRequest, sink: Option<OutputSink>) -> JobResult {
        self.run_until(request, sink, std::future::pending()).await
    }

    /// Like [`Admitted::run`], also killing the job when `client_gone` completes. Use
    /// this rather than dropping the future: a killed job is still audited.
    pub async fn run_until(
        mut self,
        request: JobRequest,
        sink: Option<OutputSink>,
        client_gone: impl std::future::Future<Output = ()>,
    ) -> JobResult {
        let deadline = self.engine.policy.limits.timeout + JOB_DEADLINE_SLACK;
        let mut phase = self.phase.clone();
        let interrupt = async move {
            tokio::select! {
                _ = phase.wait_for(|p| *p == Phase::Killing) => "server shutdown".to_owned(),
                _ = tokio::time::sleep(deadline) => "the server's deadline for the job".to_owned(),
                () = client_gone => "the client went away".to_owned(),
            }
        };
        let started = Instant::now();
        let (result, teardown) = self
            .engine
            .engine
            .run_detached_queued(
                request,
                self.tenant.clone(),
                self.queued.take(),
                interrupt,
                sink,
            )
            .await;
        self.metrics
            .job_finished(&result.observation, started.elapsed().as_secs_f64());
        // The reply goes now; the job's slot and its count in `jobs_in_flight` are given
        // back only once its sandbox is removed.
        if teardown.is_done() {
            drop(self);
        } else {
            tokio::spawn(async move {
                teardown.wait().await;
                drop(self);
            });
        }
        result
    }
}

/// The tenant sessions belong to: the token's, or `-` on a server without tokens.
pub fn session_tenant(tenant: Option<&str>) -> String {
    tenant.unwrap_or("-").to_owned()
}

/// A refusal as the error observation the MCP tool returns.
pub fn refusal_observation(refusal: Refusal, policy_version: &str) -> Observation {
    airlock_engine::early_error(
        ErrorKind::BackendUnavailable,
        refusal.message(),
        policy_version,
    )
}

impl airlock_mcp::Executor for Runner {
    fn policy(&self, tenant: Option<&str>) -> Arc<Policy> {
        Runner::policy(self, tenant)
    }

    fn keeps_sessions(&self) -> bool {
        true
    }

    fn session_start(
        &self,
        tenant: Option<String>,
    ) -> BoxFuture<'_, Result<SessionInfo, SessionError>> {
        Box::pin(async move {
            if self.phase() != Phase::Serving {
                return Err(SessionError::Unsupported(Refusal::ShuttingDown.message()));
            }
            let manager = self.sessions()?;
            let engine = self.session_engine(tenant.as_deref());
            manager
                .create(engine, &session_tenant(tenant.as_deref()))
                .await
        })
    }

    fn session_run(
        &self,
        tenant: Option<String>,
        id: String,
        call: SessionCall,
    ) -> BoxFuture<'_, Result<SessionRunResult, SessionError>> {
        Box::pin(async move {
            if self.phase() != Phase::Serving {
                return Err(SessionError::Unsupported(Refusal::ShuttingDown.message()));
            }
            let manager = self.sessions()?;
            let name = session_tenant(tenant.as_deref());
            // In its own task: a cancelled MCP call does not cut a session call in half.
            tokio::spawn(async move { manager.run(&name, &id, call).await })
                .await
                .map_err(|e| {
                    SessionError::Unsupported(format!("the session call's task failed: {e}"))
                })?
        })
    }

    fn session_end(
        &self,
        tenant: Option<String>,
        id: String,
    ) -> BoxFuture<'_, Result<(), SessionError>> {
        Box::pin(async move {
            let manager = self.sessions()?;
            manager
                .delete(&session_tenant(tenant.as_deref()), &id)
                .await
        })
    }

    fn run(&self, request: JobRequest, tenant: Option<String>) -> BoxFuture<'_, JobResult> {
        Box::pin(async move {
            let entered_queue = std::time::SystemTime::now();
            let admitted = match self.admit_job(tenant.as_deref(), Some(&request)).await {
                Ok(admitted) => admitted,
                Err(refusal) => {
                    return airlock_mcp::observation_only(refusal_observation(
                        refusal,
                        &Runner::policy(self, tenant.as_deref()).version,
                    ));
                }
            };
            let mut caller = airlock_telemetry::current_caller().unwrap_or_default();
            caller.queued = Some((entered_queue, std::time::SystemTime::now()));
            // The job runs in its own task: if the MCP call is dropped (client gone,
            // request cancelled), the guard fires and the job is killed and still audited.
            let gone = tokio_util::sync::CancellationToken::new();
            let guard = gone.clone().drop_guard();
            let task = tokio::spawn(airlock_telemetry::with_caller(caller, async move {
                admitted
                    .run_until(request, None, gone.cancelled_owned())
                    .await
            }));
            let result = match task.await {
                Ok(result) => result,
                Err(e) => airlock_mcp::observation_only(airlock_engine::early_error(
                    ErrorKind::Internal,
                    format!("the job's task failed: {e}"),
                    &Runner::policy(self, tenant.as_deref()).version,
                )),
            };
            drop(guard.disarm());
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::{Capabilities, JobSpec, RunReport};

    /// A backend whose jobs take `delay` and exit 0.
    struct Sleepy {
        delay: Duration,
    }

    /// A backend whose jobs exit at once and whose sandboxes are removed only when the
    /// test opens the job's gate (one per job, in order).
    struct SlowRemoval {
        gates: std::sync::Mutex<Vec<tokio::sync::oneshot::Receiver<()>>>,
    }

    impl Backend for SlowRemoval {
        fn kind(&self) -> BackendKind {
            BackendKind::Native
        }
        fn capabilities(&self) -> Capabilities {
            Sleepy {
                delay: Duration::ZERO,
            }
            .capabilities()
        }
        fn run_then_teardown<'a>(
            &'a self,
            job: &'a JobSpec,
            tap: Option<airlock_core::OutputTap>,
        ) -> BoxFuture<'a, Result<(RunReport, airlock_core::Teardown), BackendError>> {
            Box::pin(async move {
                let sleepy = Sleepy {
                    delay: Duration::ZERO,
                };
                let report = sleepy.run(job, tap).await?;
                let gate = self.gates.lock().unwrap().remove(0);
                let teardown = airlock_core::Teardown::new(async move {
                    let _ = gate.await;
                });
                Ok((report, teardown))
            })
        }
    }

    impl Backend for Sleepy {
        fn kind(&self) -> BackendKind {
            BackendKind::Native
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities::bare(BackendKind::Native)
        }
        fn run_then_teardown<'a>(
            &'a self,
            _job: &'a JobSpec,
            _tap: Option<airlock_core::OutputTap>,
        ) -> BoxFuture<'a, Result<(RunReport, airlock_core::Teardown), BackendError>> {
            Box::pin(async move {
                tokio::time::sleep(self.delay).await;
                let report = RunReport::ended(airlock_core::Termination::Exited(0), self.delay);
                Ok((report, airlock_core::Teardown::none()))
            })
        }
    }

    fn runner(
        dir: &std::path::Path,
        admission: Admission,
        tenants: &[TenantConfig],
    ) -> (Arc<Runner>, watch::Sender<Phase>) {
        let mut policy = LoadedPolicy::builtin();
        policy.policy.audit.path = dir.join("audit.jsonl");
        let (tx, rx) = watch::channel(Phase::Serving);
        let factory = |_: &LoadedPolicy| -> Result<Arc<dyn Backend>, BackendError> {
            Ok(Arc::new(Sleepy {
                delay: Duration::from_millis(200),
            }))
        };
        let runner = Runner::new(
            policy,
            BackendKind::Native,
            tenants,
            admission,
            Arc::new(Metrics::new()),
            rx,
            &factory,
        )
        .unwrap();
        (Arc::new(runner), tx)
    }

    fn job() -> JobRequest {
        JobRequest {
            language: "python".into(),
            source: b"pass".to_vec(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_burst_beyond_slots_and_queue_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (runner, _tx) = runner(
            dir.path(),
            Admission {
                max_in_flight: 2,
                queue: 3,
                queue_wait_max: Duration::from_secs(30),
            },
            &[],
        );
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let runner = runner.clone();
            tasks.push(tokio::spawn(
                async move { runner.run(None, job(), None).await },
            ));
        }
        let mut ran = 0;
        let mut full = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(result) => {
                    assert!(result.observation.ok);
                    ran += 1;
                }
                Err(Refusal::QueueFull) => full += 1,
                Err(other) => panic!("{other:?}"),
            }
        }
        assert_eq!((ran, full), (5, 3));
        assert_eq!(runner.queued(), 0);
        assert_eq!(runner.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_tenant_limit_serialises_its_jobs() {
        let dir = tempfile::tempdir().unwrap();
        let tenants = [TenantConfig {
            name: "t".into(),
            policy: None,
            max_in_flight: Some(1),
        }];
        let (runner, _tx) = runner(
            dir.path(),
            Admission {
                max_in_flight: 4,
                queue: 10,
                queue_wait_max: Duration::from_secs(30),
            },
            &tenants,
        );
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let runner = runner.clone();
            tasks.push(tokio::spawn(async move {
                runner.run(Some("t"), job(), None).await
            }));
        }
        for task in tasks {
            assert!(task.await.unwrap().unwrap().observation.ok);
        }
        assert!(started.elapsed() >= Duration::from_millis(600));
        let log = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
        assert_eq!(log.matches("\"tenant\":\"t\"").count(), 3);
    }

    #[tokio::test]
    async fn draining_refuses_queued_jobs_and_killing_interrupts_running_ones() {
        let dir = tempfile::tempdir().unwrap();
        let (runner, tx) = runner(
            dir.path(),
            Admission {
                max_in_flight: 1,
                queue: 5,
                queue_wait_max: Duration::from_secs(30),
            },
            &[],
        );
        let admitted = runner.admit(None).await.unwrap();
        let queued = {
            let runner = runner.clone();
            tokio::spawn(async move { runner.admit(None).await.map(|_| ()) })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(runner.queued(), 1);
        tx.send(Phase::Draining).unwrap();
        assert_eq!(queued.await.unwrap(), Err(Refusal::ShuttingDown));
        let running = admitted.run(job(), None);
        tx.send(Phase::Killing).unwrap();
        let obs = running.await.observation;
        assert_eq!(obs.error.unwrap().kind, ErrorKind::Internal);
    }

    #[tokio::test]
    async fn a_result_does_not_wait_for_its_sandbox_removal_but_the_slot_does() {
        let dir = tempfile::tempdir().unwrap();
        let mut policy = LoadedPolicy::builtin();
        policy.policy.audit.path = dir.path().join("audit.jsonl");
        let (_tx, rx) = watch::channel(Phase::Serving);
        let (open_first, first) = tokio::sync::oneshot::channel();
        let (open_second, second) = tokio::sync::oneshot::channel();
        let gates = std::sync::Mutex::new(vec![first, second]);
        let backend: Arc<dyn Backend> = Arc::new(SlowRemoval { gates });
        let factory = move |_: &LoadedPolicy| -> Result<Arc<dyn Backend>, BackendError> {
            Ok(backend.clone())
        };
        let runner = Arc::new(
            Runner::new(
                policy,
                BackendKind::Native,
                &[],
                Admission {
                    max_in_flight: 1,
                    queue: 5,
                    queue_wait_max: Duration::from_secs(30),
                },
                Arc::new(Metrics::new()),
                rx,
                &factory,
            )
            .unwrap(),
        );
        let result = tokio::time::timeout(Duration::from_secs(10), runner.run(None, job(), None))
            .await
            .expect("the reply waited for the sandbox's removal")
            .unwrap();
        assert!(result.observation.ok);
        // Still counted, and its slot still taken, until the removal is done.
        assert_eq!(runner.in_flight(), 1);
        let next = {
            let runner = runner.clone();
            tokio::spawn(async move { runner.run(None, job(), None).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            runner.queued(),
            1,
            "the second job took a slot still being cleaned"
        );
        open_first.send(()).unwrap();
        let second = tokio::time::timeout(Duration::from_secs(10), next)
            .await
            .expect("the slot was not given back after the removal")
            .unwrap()
            .unwrap();
        assert!(second.observation.ok);
        open_second.send(()).unwrap();
        let start = Instant::now();
        while runner.in_flight() != 0 {
            assert!(start.elapsed() < Duration::from_secs(10), "never idle");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(runner.queued(), 0);
    }
}
