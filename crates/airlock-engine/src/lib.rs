//! airlock-engine runs one job end to end: it checks the request against the policy,
//! hands it to a backend, turns the backend's report into the observation, and writes the
//! audit line. It is the one crate that knows every backend; it holds no sandboxing code.
#![forbid(unsafe_code)]

pub mod audit;
pub mod backends;
pub mod doctor;
pub mod error;
pub mod images;
pub mod out_dir;
pub mod redaction;
pub mod seccomp;
pub mod sessions;
pub mod teardowns;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tracing::Instrument;

use crate::teardowns::{PendingTeardown, Teardowns};

use airlock_core::audit::{AuditContext, AuditRecord};
use airlock_core::policy::{BUILTIN_ORIGIN, Policy};
use airlock_core::{
    Backend, BackendError, BackendKind, ErrorKind, JobId, JobRequest, JobResult, Observation,
    StreamKind,
};

pub use audit::AuditLog;
pub use error::EngineError;

/// A policy and where it came from (relative paths in it resolve against its directory).
#[derive(Debug, Clone)]
pub struct LoadedPolicy {
    /// The policy.
    pub policy: Policy,
    /// The file it was read from; `None` for the built-in policy.
    pub path: Option<PathBuf>,
}

impl LoadedPolicy {
    /// The built-in policy.
    pub fn builtin() -> Self {
        Self {
            policy: Policy::builtin(),
            path: None,
        }
    }

    /// Reads and validates a policy file.
    pub fn from_file(path: &Path) -> Result<Self, EngineError> {
        let text = std::fs::read_to_string(path).map_err(|source| EngineError::ReadPolicy {
            path: path.to_owned(),
            source,
        })?;
        let policy = Policy::from_toml(&text, &path.display().to_string())?;
        // The policy's own rules are checked now, so a bad regex stops the policy at load
        // rather than a job after it ran.
        airlock_redact::Redactor::new(&airlock_redact::RedactionConfig {
            builtin: false,
            extra: policy.redaction.extra.clone(),
            exact: policy.redaction.exact.clone(),
        })
        .map_err(|source| EngineError::Redaction {
            origin: path.display().to_string(),
            source: Box::new(source),
        })?;
        Ok(Self {
            policy,
            path: Some(path.to_owned()),
        })
    }

    /// Where the audit log goes: an absolute path as is; a relative one against the policy
    /// file's directory, or for the built-in policy against the state directory.
    pub fn audit_path(&self) -> PathBuf {
        let configured = &self.policy.audit.path;
        if configured.is_absolute() {
            return configured.clone();
        }
        let base = match &self.path {
            Some(file) => file
                .parent()
                .map(Path::to_owned)
                .unwrap_or_else(|| PathBuf::from(".")),
            None => state_dir(),
        };
        base.join(configured)
    }

    /// Where errors say the policy came from.
    pub fn origin(&self) -> String {
        self.path
            .as_ref()
            .map_or_else(|| BUILTIN_ORIGIN.to_owned(), |p| p.display().to_string())
    }
}

/// What a job's audit line knows of its request before it is resolved: who sent it, when,
/// its language and sizes.
fn request_context(
    request: &JobRequest,
    tenant: Option<String>,
    received_at: SystemTime,
) -> AuditContext {
    AuditContext {
        received_at: Some(received_at),
        tenant,
        language: Some(request.language.clone()),
        source_bytes: request.source.len() as u64,
        input_files: request.files.len() as u64,
        ..Default::default()
    }
}

/// Adds to `context` what resolving the request fixed: the source's hash, the limits and
/// the network.
fn note_spec(context: &mut AuditContext, spec: &airlock_core::JobSpec) {
    context.source_sha256 = Some(spec.source_sha256.clone());
    context.limits = Some(spec.limits.clone());
    context.network = Some(spec.network);
}

/// A job accepted into a server's queue ([`Engine::accept_queued`]): its id, when it was
/// received, and its write-ahead record, withdrawn if it is dropped unrun.
#[derive(Debug)]
pub struct QueuedJob {
    id: JobId,
    received_at: SystemTime,
    accepted: Option<audit::Accepted>,
}

impl QueuedJob {
    /// The id the job runs (and is audited) with.
    pub fn id(&self) -> &JobId {
        &self.id
    }
}

impl Drop for QueuedJob {
    fn drop(&mut self) {
        if let Some(accepted) = self.accepted.take() {
            accepted.withdraw();
        }
    }
}

/// Bytes and copies of the native backend's prepared minimal roots under the host's
/// cache (`/metrics`; `airlock doctor` reports the same). Walks the cache: call it off
/// the async threads, and not on every request.
pub fn root_cache_usage() -> (u64, u64) {
    airlock_native::minimal_root::cache_usage(&airlock_native::minimal_root::cache_dir())
}

/// airlock's state directory: `$AIRLOCK_STATE_DIR`, else `/var/lib/airlock` for root,
/// else `$XDG_STATE_HOME/airlock`, else `~/.local/state/airlock`. Defined once, in the
/// image store's crate, which needs it without the engine.
pub fn state_dir() -> PathBuf {
    airlock_host::state_dir()
}

/// The error of the audit line a later start writes for a job whose process died first.
const INTERRUPTED_MESSAGE: &str = "interrupted: the airlock process that accepted this job ended before the job did; its sandbox was removed";

/// Runs jobs: policy check, backend, observation, audit.
pub struct Engine {
    policy: Policy,
    backend_kind: BackendKind,
    backend: Result<Arc<dyn Backend>, BackendError>,
    audit: AuditLog,
    redactor: redaction::PendingRedactor,
    teardowns: Teardowns,
}

/// Longest wait at [`Engine::shutdown`] for the sandboxes of finished jobs to be removed.
pub const SHUTDOWN_TEARDOWN_WAIT: Duration = Duration::from_secs(30);

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("policy_version", &self.policy.version)
            .field("backend", &self.backend_kind)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine. `backend` may be the error of a backend that could not start: every job
    /// then ends as that error (and is still audited).
    pub fn new(
        policy: Policy,
        backend_kind: BackendKind,
        backend: Result<Arc<dyn Backend>, BackendError>,
        audit: AuditLog,
    ) -> Self {
        // The backend's own startup sweep removed what a dead instance left; its jobs'
        // lines are written here, so none it accepted goes unaudited.
        match audit.settle_interrupted() {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                jobs = n,
                log = %audit.path().display(),
                "audited jobs a dead airlock process had accepted as interrupted"
            ),
            Err(e) => tracing::error!(error = %e, source = ?std::error::Error::source(&e),
                "jobs a dead airlock process had accepted are not audited yet"),
        }
        Self {
            redactor: redaction::PendingRedactor::start(&policy),
            policy,
            backend_kind,
            backend,
            audit,
            teardowns: Teardowns::new(),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The backend jobs run on.
    pub fn backend_kind(&self) -> BackendKind {
        self.backend_kind
    }

    /// What the engine's backend can do (its provider's answer under this policy).
    pub fn capabilities(&self) -> airlock_core::Capabilities {
        backends::provider(self.backend_kind).capabilities(&self.policy)
    }

    /// The audit log.
    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// Appends the audit line of something the host handed back from a session's
    /// workspace (a file read, a listing whose names were redacted), whichever API asked:
    /// `line` (an object with its `event`) gets the time, the session and its tenant. A
    /// line that cannot be written is logged; the read has happened either way.
    pub fn audit_workspace_access(
        &self,
        session_id: &str,
        tenant: &str,
        mut line: serde_json::Value,
    ) {
        line["time"] =
            serde_json::json!(airlock_core::audit::format_rfc3339_millis(SystemTime::now()));
        line["session_id"] = serde_json::json!(session_id);
        line["tenant"] = serde_json::json!(tenant);
        if let Err(e) = self.audit.append_line(&format!("{line}\n")) {
            tracing::error!(session = %session_id, error = %e, "workspace access audit line not written");
        }
    }

    /// Turns a report into the observation: rendering, caps and the policy's redaction.
    /// Every job's report goes through here, and so does each call of a kernel session,
    /// whose output the host reads from the session's sandbox as it would a job's.
    pub fn render(&self, id: JobId, report: airlock_core::RunReport) -> JobResult {
        match self.redactor.get() {
            Ok(redactor) => report.into_result(
                id,
                self.backend_kind,
                &self.policy.version,
                &|before, text, after| {
                    let redacted = redactor.redact_between(before, &text, after);
                    (redacted.text, redacted.count)
                },
            ),
            Err(message) => JobResult {
                observation: Observation::error(
                    id,
                    self.backend_kind,
                    &self.policy.version,
                    ErrorKind::Internal,
                    // Never show output that could not be redacted.
                    format!("{message}; the job ran but its output is withheld"),
                ),
                files: Vec::new(),
                connections: Vec::new(),
            },
        }
    }

    /// Redacts one text with the policy's rules; `None` when the redactor could not be
    /// built (the text must then not be shown).
    pub fn redact(&self, text: &str) -> Option<(String, u64)> {
        let redactor = self.redactor.get().ok()?;
        let redacted = redactor.redact_between("", text, "");
        Some((redacted.text, redacted.count))
    }

    /// What the host may hand back of a file it read from a job's workspace (a session's
    /// `/work`, the E2B file routes): scanned with the policy's rules exactly as a `/out`
    /// file is ([`airlock_core::observation::release_workspace_file`]). Withheld when the
    /// redactor could not be built: nothing leaves unscanned.
    pub fn release_workspace_file(
        &self,
        path: &str,
        content: Vec<u8>,
    ) -> airlock_core::observation::WorkspaceFileRelease {
        match self.redactor.get() {
            Ok(redactor) => airlock_core::observation::release_workspace_file(
                path,
                content,
                &|before, text, after| {
                    let redacted = redactor.redact_between(before, &text, after);
                    (redacted.text, redacted.count)
                },
            ),
            Err(message) => airlock_core::observation::WorkspaceFileRelease::Withheld {
                reason: format!("{message}; files are not handed back unscanned"),
                secrets: 0,
            },
        }
    }

    /// A name of a workspace listing as it may be shown (escaped, redacted) and the
    /// number of secrets replaced; `None` when the redactor could not be built (the name
    /// must then not be shown).
    pub fn shown_workspace_name(&self, name: &str) -> Option<(String, u64)> {
        let redactor = self.redactor.get().ok()?;
        Some(airlock_core::observation::shown_workspace_name(
            name,
            &|before, text, after| {
                let redacted = redactor.redact_between(before, &text, after);
                (redacted.text, redacted.count)
            },
        ))
    }

    /// The backend's warm pool figures, when it keeps one.
    pub fn warm_pool(&self) -> Option<airlock_core::WarmPoolStats> {
        self.backend.as_ref().ok().and_then(|b| b.warm_pool())
    }

    /// The removals of finished jobs' sandboxes still under way.
    pub fn teardowns(&self) -> &Teardowns {
        &self.teardowns
    }

    /// Waits (up to [`SHUTDOWN_TEARDOWN_WAIT`]) for the sandboxes of finished jobs to be
    /// removed, then releases what the backend holds between jobs (warm sandboxes), before
    /// exiting.
    pub async fn shutdown(&self) {
        if !self.teardowns.wait_idle(SHUTDOWN_TEARDOWN_WAIT).await {
            tracing::warn!(
                pending = self.teardowns.pending(),
                "sandboxes of finished jobs not yet removed at shutdown; the next start sweeps them"
            );
        }
        if let Ok(backend) = &self.backend {
            backend.shutdown().await;
        }
    }

    /// Runs one job and returns its observation and released files. Never fails: every
    /// failure is an observation with `outcome: "error"`.
    pub async fn run(&self, request: JobRequest) -> JobResult {
        self.run_with(request, None).await
    }

    /// Like [`Engine::run`], recording `tenant` in the audit line.
    pub async fn run_with(&self, request: JobRequest, tenant: Option<String>) -> JobResult {
        self.run_until(request, tenant, std::future::pending(), None)
            .await
    }

    /// Like [`Engine::run_with`], but when `interrupt` completes first (a signal, a server
    /// shutdown) the job is killed and its sandbox removed, and the observation is an
    /// `internal` error naming the reason. The job is audited either way. Returns once the
    /// sandbox is removed.
    pub async fn run_until(
        &self,
        request: JobRequest,
        tenant: Option<String>,
        interrupt: impl std::future::Future<Output = String>,
        sink: Option<OutputSink>,
    ) -> JobResult {
        let (result, teardown) = self.run_detached(request, tenant, interrupt, sink).await;
        teardown.wait().await;
        result
    }

    /// Like [`Engine::run_until`], but returns as soon as the observation is complete (the
    /// job's processes are gone, its output and `/out` drained), with the removal of its
    /// sandbox still under way in the returned [`PendingTeardown`]. A caller that admits
    /// jobs holds the job's slot until that removal is done.
    pub async fn run_detached(
        &self,
        request: JobRequest,
        tenant: Option<String>,
        interrupt: impl std::future::Future<Output = String>,
        sink: Option<OutputSink>,
    ) -> (JobResult, PendingTeardown) {
        self.run_detached_with(request, tenant, None, interrupt, sink)
            .await
    }

    /// Accepts a job that is about to wait in a server's queue: writes its write-ahead
    /// record now, so that should the process die while the job waits, the next start's
    /// sweep gives it its one `interrupted` line as it does a running job's. Run it with
    /// [`Engine::run_detached_queued`]; dropped unrun (a queue timeout, a shutdown, a
    /// client gone), its record is withdrawn: the caller answered with a refusal, and the
    /// job has no line, as one refused at the door. `None` when the policy refuses the
    /// request (the run answers that) or the record cannot be written (the run refuses
    /// the job then, naming the audit log).
    pub fn accept_queued(&self, request: &JobRequest, tenant: Option<&str>) -> Option<QueuedJob> {
        let received_at = SystemTime::now();
        let spec = request.clone().resolve(&self.policy).ok()?;
        let mut context = request_context(request, tenant.map(str::to_owned), received_at);
        note_spec(&mut context, &spec);
        let line = self.interrupted_line(context, &spec.id);
        match self.audit.accept(&line) {
            Ok(accepted) => Some(QueuedJob {
                id: spec.id,
                received_at,
                accepted: Some(accepted),
            }),
            Err(e) => {
                tracing::warn!(error = %e, "queued job's write-ahead record not written");
                None
            }
        }
    }

    /// The line an accepted job's write-ahead record holds: the one the log gets should
    /// this process end before the job does.
    fn interrupted_line(&self, context: AuditContext, id: &JobId) -> AuditRecord {
        AuditRecord::new(
            context,
            &Observation::error(
                id.clone(),
                self.backend_kind,
                &self.policy.version,
                ErrorKind::Internal,
                INTERRUPTED_MESSAGE,
            ),
        )
    }

    /// Like [`Engine::run_detached`], for a job accepted while it waited in a queue
    /// ([`Engine::accept_queued`]): it keeps the id, the time received and the write-ahead
    /// record it was given there.
    pub async fn run_detached_queued(
        &self,
        request: JobRequest,
        tenant: Option<String>,
        queued: Option<QueuedJob>,
        interrupt: impl std::future::Future<Output = String>,
        sink: Option<OutputSink>,
    ) -> (JobResult, PendingTeardown) {
        self.run_detached_inner(request, tenant, None, queued, interrupt, sink)
            .await
    }

    /// Like [`Engine::run_detached`]; a `wall_time` replaces the resolved one after the
    /// request passed the policy's checks. Only the session manager sets it: a kernel
    /// session's one job lives for the session's `ttl`, and a call never outlives it.
    pub(crate) async fn run_detached_with(
        &self,
        request: JobRequest,
        tenant: Option<String>,
        wall_time: Option<std::time::Duration>,
        interrupt: impl std::future::Future<Output = String>,
        sink: Option<OutputSink>,
    ) -> (JobResult, PendingTeardown) {
        self.run_detached_inner(request, tenant, wall_time, None, interrupt, sink)
            .await
    }

    async fn run_detached_inner(
        &self,
        request: JobRequest,
        tenant: Option<String>,
        wall_time: Option<std::time::Duration>,
        mut queued: Option<QueuedJob>,
        interrupt: impl std::future::Future<Output = String>,
        sink: Option<OutputSink>,
    ) -> (JobResult, PendingTeardown) {
        let received_at = queued
            .as_ref()
            .map_or_else(SystemTime::now, |q| q.received_at);
        let started = Instant::now();
        let mut context = request_context(&request, tenant, received_at);
        let version = self.policy.version.clone();
        let error_result = |observation: Observation| JobResult {
            observation,
            files: Vec::new(),
            connections: Vec::new(),
        };
        let mut teardown = PendingTeardown::done();
        let mut accepted = None;
        let mut job_span_for_audit = None;
        let mut phases = None;
        let result = match request.resolve(&self.policy) {
            Err(e) => {
                tracing::info!(kind = %e.kind(), error = %e, "request refused");
                error_result(Observation::error(
                    JobId::generate(),
                    self.backend_kind,
                    &version,
                    e.kind(),
                    e.to_string(),
                ))
            }
            Ok(mut spec) => 'job: {
                if let Some(wall_time) = wall_time {
                    spec.limits.timeout = wall_time;
                }
                let preaccepted = queued.as_mut().and_then(|q| {
                    let record = q.accepted.take()?;
                    Some((q.id.clone(), record))
                });
                if let Some((id, _)) = &preaccepted {
                    spec.id = id.clone();
                }
                note_spec(&mut context, &spec);
                // Write-ahead: the job runs only once its end is sure to be audited, by
                // this process or, should it die first, by the next start's sweep.
                let interrupted_line = self.interrupted_line(context.clone(), &spec.id);
                let accepting = match preaccepted {
                    // Accepted while queued: its record is already written.
                    Some((_, record)) => Ok(record),
                    None => self.audit.accept(&interrupted_line),
                };
                match accepting {
                    Ok(record) => accepted = Some(record),
                    Err(e) => {
                        let reason = match &e {
                            EngineError::Audit { path, source } => {
                                format!("{}: {source}", path.display())
                            }
                            other => other.to_string(),
                        };
                        tracing::error!(%reason, "job refused: the audit log cannot be written");
                        break 'job error_result(Observation::error(
                            spec.id.clone(),
                            self.backend_kind,
                            &version,
                            ErrorKind::BackendUnavailable,
                            format!(
                                "refused: the audit log cannot be written ({reason}); no job runs unaudited until it can"
                            ),
                        ));
                    }
                }
                let streaming = sink.clone().map(|sink| {
                    redaction::Streaming::new(
                        sink,
                        self.redactor.clone(),
                        [
                            airlock_core::supervise::cap_bytes(spec.limits.stdout),
                            airlock_core::supervise::cap_bytes(spec.limits.stderr),
                        ],
                    )
                });
                // Instrumented, never entered: an entered guard held across the await
                // below stays on this thread's span stack while other tasks run on it,
                // and their lines would carry this job's id.
                let span = tracing::info_span!(
                    "job",
                    job_id = %spec.id,
                    backend = %self.backend_kind,
                    // Named for OpenTelemetry only when it exports (so log lines stay
                    // as they were otherwise): `execute_tool run_code`.
                    otel.name = tracing::field::Empty,
                    otel.kind = tracing::field::Empty,
                );
                airlock_telemetry::start_job_span(&span);
                job_span_for_audit = Some(span.clone());
                let teardown = &mut teardown;
                let job_span = span.clone();
                let phases = &mut phases;
                let limits = spec.limits.clone();
                let mut interrupted = false;
                let result = async { match &self.backend {
                    Err(e) => error_result(Observation::error(
                        spec.id.clone(),
                        self.backend_kind,
                        &version,
                        e.kind,
                        e.message.clone(),
                    )),
                    Ok(backend) => match tokio::select! {
                        result = backend.run_then_teardown(&spec, streaming.as_ref().map(redaction::Streaming::tap)) => {
                            if let Some(streaming) = &streaming {
                                streaming.flush();
                            }
                            result.map(|(report, removal)| {
                                let teardown_span =
                                    airlock_telemetry::job_teardown_span(&job_span, spec.id.as_str());
                                *teardown = self.teardowns.start(removal, teardown_span);
                                report
                            })
                        }
                        // Dropping the backend's future kills the sandbox and removes it.
                        // A client that gives up (its own timeout, a cancel) is ordinary:
                        // logged as what it is, not as a failure of airlock's.
                        reason = interrupt => {
                            tracing::info!(%reason, "job interrupted; it was killed");
                            interrupted = true;
                            Err(BackendError::new(
                                ErrorKind::Internal,
                                format!("interrupted ({reason}); the job was killed"),
                            ))
                        }
                    } {
                        Ok(report) => {
                            context.setup = report.setup;
                            let (setup, run, acquire) =
                                (report.setup, report.duration, report.acquire);
                            let render_started = SystemTime::now();
                            let result = self.render(spec.id.clone(), report);
                            *phases = Some(airlock_telemetry::Phases {
                                received: received_at,
                                setup,
                                run,
                                acquire,
                                output: Some((render_started, SystemTime::now())),
                            });
                            result
                        }
                        Err(e) => {
                            if !interrupted {
                                tracing::warn!(kind = %e.kind, error = %e.message, "job failed to run");
                            }
                            error_result(Observation::error(
                                spec.id.clone(),
                                self.backend_kind,
                                &version,
                                e.kind,
                                e.message,
                            ))
                        }
                    },
                } }
                .instrument(span.clone())
                .await;
                airlock_telemetry::finish_job_span(
                    &span,
                    &result.observation,
                    airlock_telemetry::JobFacts {
                        limits: Some(&limits),
                        connections: &result.connections,
                    },
                    *phases,
                );
                result
            }
        };
        context.total = started.elapsed();
        for record in &result.connections {
            let line = airlock_core::audit::connection_line(&result.observation.job_id, record);
            if let Err(e) = self.audit.append_line(&line) {
                tracing::error!(error = %e, "audit line of a connection not written");
            }
        }
        let record = AuditRecord::new(context, &result.observation);
        airlock_telemetry::emit_audit_record(
            &record,
            job_span_for_audit
                .as_ref()
                .unwrap_or(&tracing::Span::none()),
        );
        let written = match accepted {
            Some(accepted) => self.audit.settle(accepted, &record),
            None => self.audit.append(&record),
        };
        if let Err(e) = written {
            // The job ran; losing its result would not make the log whole again.
            tracing::error!(error = %e, source = ?std::error::Error::source(&e), "audit line not written");
        }
        (result, teardown)
    }
}

/// A piece of a job's output while it runs: escaped like the observation's text, and only
/// from the part the observation keeps.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OutputEvent {
    /// `stdout` or `stderr`.
    pub stream: StreamKind,
    /// The text.
    pub text: String,
}

/// Receives [`OutputEvent`]s as a job runs.
pub type OutputSink = Arc<dyn Fn(OutputEvent) + Send + Sync>;

/// The error observation for a job that never reached the engine (for example, the
/// policy file itself is unreadable).
pub fn early_error(
    kind: ErrorKind,
    message: impl Into<String>,
    policy_version: &str,
) -> Observation {
    Observation::error(
        JobId::generate(),
        BackendKind::Native,
        policy_version,
        kind,
        message,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::{BoxFuture, Capabilities, JobSpec, OutputTap, RunReport};

    struct Refusing;
    impl Backend for Refusing {
        fn kind(&self) -> BackendKind {
            BackendKind::Native
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities::bare(BackendKind::Native)
        }
        fn run_then_teardown<'a>(
            &'a self,
            _job: &'a JobSpec,
            _tap: Option<OutputTap>,
        ) -> BoxFuture<'a, Result<(RunReport, airlock_core::Teardown), BackendError>> {
            Box::pin(async { Err(BackendError::new(ErrorKind::BackendUnavailable, "down")) })
        }
    }

    /// Jobs exit 0 at once; each sandbox's removal ends when the test sets `removed`.
    struct SlowRemoval {
        removed: Arc<tokio::sync::Notify>,
    }
    impl Backend for SlowRemoval {
        fn kind(&self) -> BackendKind {
            BackendKind::Native
        }
        fn capabilities(&self) -> Capabilities {
            Refusing.capabilities()
        }
        fn run_then_teardown<'a>(
            &'a self,
            _job: &'a JobSpec,
            _tap: Option<OutputTap>,
        ) -> BoxFuture<'a, Result<(RunReport, airlock_core::Teardown), BackendError>> {
            let removed = self.removed.clone();
            Box::pin(async move {
                let report = RunReport::ended(airlock_core::Termination::Exited(0), Duration::ZERO);
                Ok((
                    report,
                    airlock_core::Teardown::new(async move { removed.notified().await }),
                ))
            })
        }
    }

    #[tokio::test]
    async fn run_waits_for_the_removal_run_detached_does_not_and_shutdown_does() {
        let dir = tempfile::tempdir().unwrap();
        let removed = Arc::new(tokio::sync::Notify::new());
        let engine = Arc::new(Engine::new(
            Policy::builtin(),
            BackendKind::Native,
            Ok(Arc::new(SlowRemoval {
                removed: removed.clone(),
            })),
            AuditLog::open(&dir.path().join("audit.jsonl"), true).unwrap(),
        ));
        let request = || JobRequest {
            language: "python".into(),
            source: b"pass".to_vec(),
            ..Default::default()
        };
        // Detached: the observation comes while the removal is still under way.
        let (result, pending) = engine
            .run_detached(request(), None, std::future::pending(), None)
            .await;
        assert!(result.observation.ok, "{:?}", result.observation);
        assert_eq!(engine.teardowns().pending(), 1);
        assert!(!pending.is_done());
        // Shutdown waits for it.
        let shutdown = {
            let engine = engine.clone();
            tokio::spawn(async move { engine.shutdown().await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !shutdown.is_finished(),
            "shutdown did not wait for the removal"
        );
        removed.notify_one();
        pending.wait().await;
        shutdown.await.unwrap();
        assert_eq!(engine.teardowns().pending(), 0);
        // Attached: `run` returns only after the removal.
        let run = {
            let engine = engine.clone();
            tokio::spawn(async move { engine.run(request()).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!run.is_finished(), "run did not wait for the removal");
        removed.notify_one();
        assert!(run.await.unwrap().observation.ok);
        assert_eq!(engine.teardowns().pending(), 0);
    }

    /// Jobs exit 0; each fills the file system of `fill` (the audit log's) to the brim
    /// while it runs, when asked to.
    struct FillingDisk {
        fill: Option<PathBuf>,
        runs: Arc<std::sync::atomic::AtomicUsize>,
    }
    impl Backend for FillingDisk {
        fn kind(&self) -> BackendKind {
            BackendKind::Native
        }
        fn capabilities(&self) -> Capabilities {
            Refusing.capabilities()
        }
        fn run_then_teardown<'a>(
            &'a self,
            _job: &'a JobSpec,
            _tap: Option<OutputTap>,
        ) -> BoxFuture<'a, Result<(RunReport, airlock_core::Teardown), BackendError>> {
            self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if let Some(path) = &self.fill {
                fill_to_the_brim(path);
            }
            Box::pin(async {
                let report = RunReport::ended(airlock_core::Termination::Exited(0), Duration::ZERO);
                Ok((report, airlock_core::Teardown::new(async {})))
            })
        }
    }

    fn fill_to_the_brim(path: &Path) {
        use std::io::Write as _;
        let mut file = std::fs::File::create(path).unwrap();
        let chunk = [0x55u8; 4096];
        while file.write_all(&chunk).is_ok() {}
        while file.write_all(&chunk[..1]).is_ok() {}
        assert_eq!(
            file.write_all(b"x").unwrap_err().raw_os_error(),
            Some(28),
            "not full"
        );
    }

    /// A small tmpfs, unmounted on drop.
    struct SmallTmpfs(tempfile::TempDir);
    impl SmallTmpfs {
        fn mount() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let status = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=256k,mode=0700", "airlock-test"])
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(status.success(), "mount tmpfs");
            Self(dir)
        }
        fn path(&self) -> &Path {
            self.0.path()
        }
    }
    impl Drop for SmallTmpfs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg(self.0.path())
                .status();
        }
    }

    fn job_lines(log: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(log)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
            .collect()
    }

    fn python(source: &str) -> JobRequest {
        JobRequest {
            language: "python".into(),
            source: source.as_bytes().to_vec(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_full_disk_refuses_jobs_naming_the_path_and_they_resume_when_it_recovers() {
        airlock_testkit::require!(
            airlock_testkit::require::is_root(),
            "mounting a tmpfs needs root"
        );
        let disk = SmallTmpfs::mount();
        let log = disk.path().join("audit.jsonl");
        let filler = disk.path().join("filler");
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let engine = Engine::new(
            Policy::builtin(),
            BackendKind::Native,
            Ok(Arc::new(FillingDisk {
                fill: Some(filler.clone()),
                runs: runs.clone(),
            })),
            AuditLog::open(&log, true).unwrap(),
        );
        // The first job is accepted, and fills the disk while it runs: its line cannot be
        // written, so its write-ahead record stays.
        let first = engine.run(python("1")).await.observation;
        assert!(first.ok, "{first:?}");
        assert!(!engine.audit().health().writable);
        assert_eq!(engine.audit().health().unsettled, 1);
        assert!(engine.audit().health().write_failures >= 1);
        // Then nothing runs: refused, naming the path, the backend never called.
        let refused = engine.run(python("2")).await.observation;
        assert_eq!(
            refused.error.as_ref().map(|e| e.kind),
            Some(ErrorKind::BackendUnavailable)
        );
        let message = &refused.error.as_ref().unwrap().message;
        assert!(
            message.contains(&log.display().to_string()) && message.contains("No space left"),
            "{message}"
        );
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(job_lines(&log).is_empty());
        // Space again: the first job's line goes first, then the next job runs.
        std::fs::remove_file(&filler).unwrap();
        let engine = Engine {
            backend: Ok(Arc::new(FillingDisk {
                fill: None,
                runs: runs.clone(),
            })),
            ..engine
        };
        let third = engine.run(python("3")).await.observation;
        assert!(third.ok, "{third:?}");
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);
        let lines = job_lines(&log);
        let ids: Vec<&str> = lines
            .iter()
            .map(|l| l["job_id"].as_str().unwrap())
            .collect();
        assert_eq!(
            ids,
            [first.job_id.as_str(), third.job_id.as_str()],
            "{lines:#?}"
        );
        assert!(
            lines
                .iter()
                .all(|l| l["outcome"] == "exited" && l.get("interrupted").is_none())
        );
        let health = engine.audit().health();
        assert!(health.writable && health.unsettled == 0, "{health:?}");
        assert_eq!(
            std::fs::read_dir(engine.audit().accepted_dir())
                .unwrap()
                .count(),
            0
        );
    }

    fn engine(dir: &Path) -> Engine {
        Engine::new(
            Policy::builtin(),
            BackendKind::Native,
            Ok(Arc::new(Refusing)),
            AuditLog::open(&dir.join("audit.jsonl"), true).unwrap(),
        )
    }

    #[tokio::test]
    async fn refused_requests_are_audited_without_their_source() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(dir.path());
        let obs = engine
            .run(JobRequest {
                language: "cobol".into(),
                source: b"SECRET-SOURCE".to_vec(),
                ..Default::default()
            })
            .await
            .observation;
        assert_eq!(obs.error.as_ref().unwrap().kind, ErrorKind::InvalidInput);
        let log = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
        assert_eq!(log.lines().count(), 1);
        assert!(!log.contains("SECRET-SOURCE"));
        let line: serde_json::Value = serde_json::from_str(log.trim()).unwrap();
        assert_eq!(line["job_id"], serde_json::json!(obs.job_id));
        assert_eq!(line["error_kind"], "invalid_input");
    }

    #[tokio::test]
    async fn backend_errors_become_error_observations() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(dir.path());
        let obs = engine
            .run(JobRequest {
                language: "python".into(),
                source: b"print(1)".to_vec(),
                ..Default::default()
            })
            .await
            .observation;
        assert_eq!(obs.outcome, airlock_core::Outcome::Error);
        assert_eq!(
            obs.error.as_ref().unwrap().kind,
            ErrorKind::BackendUnavailable
        );
        let log = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
        let line: serde_json::Value = serde_json::from_str(log.trim()).unwrap();
        assert!(
            line["source_sha256"]
                .as_str()
                .unwrap()
                .starts_with("sha256:")
        );
    }

    #[test]
    fn streaming_renders_redacts_and_joins_split_characters() {
        let events = Arc::new(std::sync::Mutex::new(Vec::new()));
        let collected = events.clone();
        let sink: OutputSink = Arc::new(move |e: OutputEvent| collected.lock().unwrap().push(e));
        let pending = redaction::PendingRedactor::start(&Policy::builtin());
        let streaming = redaction::Streaming::new(sink, pending, [8000, 2000]);
        let tap = streaming.tap();
        let secret = "sk-ant-api03-".to_owned() + &"a1B2".repeat(24);
        let bytes = format!("ok ✓\x1b key={secret}\n").into_bytes();
        for chunk in bytes.chunks(7) {
            tap(StreamKind::Stdout, chunk);
        }
        tap(StreamKind::Stderr, b"err");
        streaming.flush();
        let events = events.lock().unwrap().clone();
        let stdout: String = events
            .iter()
            .filter(|e| e.stream == StreamKind::Stdout)
            .map(|e| e.text.as_str())
            .collect();
        let stderr: String = events
            .iter()
            .filter(|e| e.stream == StreamKind::Stderr)
            .map(|e| e.text.as_str())
            .collect();
        assert_eq!(stdout, "ok ✓\\x1b key=[REDACTED:anthropic-api-key]\n");
        assert_eq!(stderr, "err");
    }

    #[test]
    fn streaming_stops_at_the_cap() {
        let events = Arc::new(std::sync::Mutex::new(String::new()));
        let collected = events.clone();
        let sink: OutputSink =
            Arc::new(move |e: OutputEvent| collected.lock().unwrap().push_str(&e.text));
        let pending = redaction::PendingRedactor::start(&Policy::builtin());
        let streaming = redaction::Streaming::new(sink, pending, [10, 10]);
        let tap = streaming.tap();
        tap(StreamKind::Stdout, &[b'x'; 100]);
        streaming.flush();
        assert_eq!(events.lock().unwrap().as_str(), "xxxxxxxxxx");
    }

    #[test]
    fn audit_paths_resolve_against_the_policy_file() {
        let loaded = LoadedPolicy {
            policy: Policy::builtin(),
            path: Some(PathBuf::from("/etc/airlock/policy.toml")),
        };
        assert_eq!(
            loaded.audit_path(),
            PathBuf::from("/etc/airlock/audit.jsonl")
        );
    }
}
