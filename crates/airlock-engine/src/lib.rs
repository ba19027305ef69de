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

/// airlock's state directory: `$AIRLOCK_STATE_DIR`, else `/var/lib/airlock` for root,
/// else `$XDG_STATE_HOME/airlock`, else `~/.local/state/airlock`. Defined once, in the
/// image store's crate, which needs it without the engine.
pub fn state_dir() -> PathBuf {
    airlock_host::state_dir()
}

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

    /// The audit log.
    pub fn audit(&self) -> &AuditLog {
        &self.audit
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
        let received_at = SystemTime::now();
        let started = Instant::now();
        let mut context = AuditContext {
            received_at: Some(received_at),
            tenant,
            language: Some(request.language.clone()),
            source_bytes: request.source.len() as u64,
            input_files: request.files.len() as u64,
            ..Default::default()
        };
        let version = self.policy.version.clone();
        let error_result = |observation: Observation| JobResult {
            observation,
            files: Vec::new(),
            connections: Vec::new(),
        };
        let mut teardown = PendingTeardown::done();
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
            Ok(mut spec) => {
                if let Some(wall_time) = wall_time {
                    spec.limits.timeout = wall_time;
                }
                context.source_sha256 = Some(spec.source_sha256.clone());
                context.limits = Some(spec.limits.clone());
                context.network = Some(spec.network);
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
                let span =
                    tracing::info_span!("job", job_id = %spec.id, backend = %self.backend_kind);
                let teardown = &mut teardown;
                let job_span = span.clone();
                async { match &self.backend {
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
                                *teardown = self.teardowns.start(removal, job_span);
                                report
                            })
                        }
                        // Dropping the backend's future kills the sandbox and removes it.
                        reason = interrupt => Err(BackendError::new(
                            ErrorKind::Internal,
                            format!("interrupted ({reason}); the job was killed"),
                        )),
                    } {
                        Ok(report) => {
                            context.setup = report.setup;
                            self.render(spec.id.clone(), report)
                        }
                        Err(e) => {
                            tracing::warn!(kind = %e.kind, error = %e.message, "job failed to run");
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
                .instrument(span)
                .await
            }
        };
        context.total = started.elapsed();
        for record in &result.connections {
            let line = airlock_core::audit::connection_line(&result.observation.job_id, record);
            if let Err(e) = self.audit.append_line(&line) {
                tracing::error!(error = %e, "audit line of a connection not written");
            }
        }
        if let Err(e) = self
            .audit
            .append(&AuditRecord::new(context, &result.observation))
        {
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
            Capabilities {
                backend: BackendKind::Native,
                network_proxy: false,
                out_dir: false,
                image_rootfs: false,
            }
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
