//! Sessions: state across one tenant's calls, bounded and explicit (`[sessions]` in the
//! policy, off by default).
//!
//! A session belongs to the tenant that opened it and is invisible to every other (asked
//! by another tenant it does not exist); it never outlives the policy's `ttl` and is
//! destroyed after `idle` without a call. Its `/work` is a host-side tmpfs of
//! `workspace_bytes` ([`airlock_host::workspace`]), bound at `/work` in its sandboxes.
//!
//! - `workspace` mode: every call is an ordinary fresh job (the engine's run, the policy's
//!   limits, its own audit line) whose `/work` is the session's; files carry state,
//!   processes never do (each call's sandbox is destroyed with everything in it).
//! - `kernel` mode: one job per session runs [`KERNEL_DRIVER`], a small Python loop
//!   inside the sandbox, for the session's `ttl`; the session's memory, CPU and process
//!   limits are that job's and so hold across all calls. A call is a file the host writes
//!   into the workspace; the driver runs it in its globals and writes the call's stdout,
//!   stderr and result back as files, which the host reads as untrusted job output
//!   (capped, never through a link, rendered and redacted as a job's stdout and stderr).
//!   A call past its wall time is interrupted by the driver; if it has not stopped after
//!   `interrupt_grace` the host kills the whole job. A kernel that died (killed, out of
//!   memory) is replaced by a fresh one at the next call, which says so in
//!   `kernel_restarted`: it is never replaced silently.
//!
//! Every call is an audit line with the session id (`"event": "session_call"`), and so are
//! the session's start and end (`session_start`, `session_end` with the reason: `delete`,
//! `ttl`, `idle`, `shutdown`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant, SystemTime};

use airlock_core::observation::{LimitHit, Termination};
use airlock_core::policy::{SessionMode, SessionsPolicy};
use airlock_core::supervise::JobOutput;
use airlock_core::{
    BackendKind, ErrorKind, JobId, JobRequest, LimitsRequest, Observation, Outcome, RunReport,
    StreamKind,
};
use airlock_host::HostError;
use airlock_host::workspace::{Workspace, WorkspaceEntry};
use tokio::sync::{oneshot, watch};

use crate::Engine;
use crate::teardowns::PendingTeardown;

/// The Python program a kernel session's sandbox runs: reads calls from
/// `/work/.airlock/call-N.py` (started by `call-N.go`, a JSON object with the call's wall
/// time in seconds and whether the value's HTML is wanted), runs them in one set of globals
/// with the last expression's value returned like a notebook cell's, and writes
/// `out-N.stdout`, `out-N.stderr`, the call's files (open matplotlib figures as PNGs, the
/// value's HTML) in `files-N/`, `res-N.json`, then `res-N.done`. Trusted by nobody: it
/// runs inside the sandbox with the call's code.
pub const KERNEL_DRIVER: &str = include_str!("kernel_driver.py");

/// The directory of the kernel protocol's files, inside the workspace; the files API
/// refuses names under it.
pub const CONTROL_DIR: &str = ".airlock";

/// Most bytes of a call's result record (`res-N.json`) the host reads.
const RESULT_MAX_BYTES: u64 = 64 * 1024;
/// Longest text of a cell's value returned.
pub const VALUE_MAX_BYTES: usize = 8000;
/// How often the host looks for a call's result.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// How long a new kernel may take to start its interpreter.
const KERNEL_START_TIMEOUT: Duration = Duration::from_secs(20);
/// How often the reaper looks for sessions past `ttl` or `idle`.
const REAP_INTERVAL: Duration = Duration::from_millis(250);
/// Largest file the files API moves in or out of a session, whatever the workspace size.
pub const FILE_MAX_BYTES: u64 = 16 << 20;

/// Why a session call or operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The tenant's policy does not enable sessions.
    #[error("sessions are disabled by the policy ([sessions] enabled = false)")]
    Disabled,
    /// No such session for this tenant (another tenant's session is not found either).
    #[error("no session {0:?}")]
    NotFound(String),
    /// The tenant holds `max_per_tenant` sessions already.
    #[error("this tenant already holds {max} sessions, the policy's max_per_tenant")]
    TooMany {
        /// The policy's `max_per_tenant`.
        max: u32,
    },
    /// The session cannot run here (backend, language).
    #[error("{0}")]
    Unsupported(String),
    /// The request is malformed.
    #[error("{0}")]
    Invalid(String),
    /// A workspace operation failed.
    #[error(transparent)]
    Workspace(#[from] HostError),
    /// The kernel could not be started.
    #[error("the session's kernel did not start: {0}")]
    KernelStart(String),
}

impl SessionError {
    /// Whether this is a file of the session's /work that does not exist.
    pub fn is_missing_file(&self) -> bool {
        matches!(
            self,
            SessionError::Workspace(HostError::WorkspaceMissing { .. })
        )
    }

    /// The public error kind (the HTTP layer maps `NotFound` and `TooMany` itself).
    pub fn kind(&self) -> ErrorKind {
        match self {
            SessionError::Disabled | SessionError::TooMany { .. } => ErrorKind::PolicyDenied,
            SessionError::NotFound(_) | SessionError::Invalid(_) => ErrorKind::InvalidInput,
            SessionError::Unsupported(_) => ErrorKind::PolicyDenied,
            SessionError::Workspace(e) => e.kind(),
            SessionError::KernelStart(_) => ErrorKind::BackendUnavailable,
        }
    }
}

/// What a caller sees of a session.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SessionInfo {
    /// The session's id.
    pub id: String,
    /// `workspace` or `kernel`.
    pub mode: SessionMode,
    /// When it was opened (RFC 3339).
    pub created_at: String,
    /// When it ends at the latest (RFC 3339).
    pub expires_at: String,
    /// Seconds without a call after which it is destroyed.
    pub idle_timeout_s: u64,
    /// Calls made so far.
    pub calls: u64,
}

/// One call in a session.
#[derive(Debug, Clone, Default)]
pub struct SessionCall {
    /// The code.
    pub code: String,
    /// The language (`workspace` mode; a kernel runs Python only). `None`: the policy's
    /// default language.
    pub language: Option<String>,
    /// The call's wall time; `None`: the policy's.
    pub timeout: Option<Duration>,
    /// Kernel mode: also return the HTML of the cell's value when it has one (a pandas
    /// DataFrame's table), as the file `value.html`.
    pub html: bool,
}

/// The error a kernel call raised.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CellError {
    /// The exception's class name.
    pub name: String,
    /// Its message (redacted).
    pub value: String,
}

/// What a call returns.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SessionRunResult {
    /// The session.
    pub session_id: String,
    /// The call's number in the session, from 1.
    pub call: u64,
    /// The call's observation: the job's (workspace mode), or the call's own in the shape
    /// of one (kernel mode: stdout, stderr, outcome, duration).
    pub observation: Observation,
    /// Kernel mode: the repr of the cell's last expression, when it is not `None`
    /// (redacted, at most [`VALUE_MAX_BYTES`]).
    pub value: Option<String>,
    /// Kernel mode: the exception the call raised.
    pub error: Option<CellError>,
    /// Kernel mode: set when the kernel had died since the last call and this call ran
    /// in a fresh one (every variable is gone; the files in `/work` remain); the reason.
    pub kernel_restarted: Option<String>,
}

/// A running kernel: the session's one job.
struct Kernel {
    /// Sending kills the job (the engine removes its sandbox).
    kill: Option<oneshot::Sender<String>>,
    /// The job's observation once it ended.
    done: watch::Receiver<Option<Observation>>,
    task: tokio::task::JoinHandle<()>,
}

struct CallState {
    kernel: Option<Kernel>,
    /// Why the kernel died, until the next call reports it.
    died: Option<String>,
    /// The removal of the last workspace call's sandbox: a call's answer does not wait
    /// for it, the next call and the session's end do (a session holds at most one
    /// sandbox, live or being removed).
    removal: Option<PendingTeardown>,
}

struct Session {
    id: String,
    tenant: String,
    engine: Arc<Engine>,
    policy: SessionsPolicy,
    created: Instant,
    created_at: SystemTime,
    last_used: Mutex<Instant>,
    calls: Mutex<u64>,
    workspace: Mutex<Option<Workspace>>,
    workspace_path: PathBuf,
    /// Calls one at a time; held by a call for its whole life.
    state: tokio::sync::Mutex<CallState>,
    /// Set when the session is ending: a call in progress stops at once.
    ending: watch::Sender<Option<String>>,
}

impl Session {
    fn info(&self) -> SessionInfo {
        SessionInfo {
            id: self.id.clone(),
            mode: self.policy.mode,
            created_at: airlock_core::audit::format_rfc3339_millis(self.created_at),
            expires_at: airlock_core::audit::format_rfc3339_millis(
                self.created_at + self.policy.ttl,
            ),
            idle_timeout_s: self.policy.idle.as_secs(),
            calls: *self.calls.lock().unwrap_or_else(PoisonError::into_inner),
        }
    }

    fn remaining(&self) -> Duration {
        self.policy.ttl.saturating_sub(self.created.elapsed())
    }

    fn touch(&self) {
        *self
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    fn audit(&self, line: serde_json::Value) {
        let mut line = line;
        line["time"] =
            serde_json::json!(airlock_core::audit::format_rfc3339_millis(SystemTime::now()));
        line["session_id"] = serde_json::json!(self.id);
        line["tenant"] = serde_json::json!(self.tenant);
        line["mode"] = serde_json::json!(self.policy.mode.as_str());
        if let Err(e) = self.engine.audit().append_line(&format!("{line}\n")) {
            tracing::error!(session = %self.id, error = %e, "session audit line not written");
        }
    }

    fn with_workspace<T>(
        &self,
        f: impl FnOnce(&Workspace) -> Result<T, HostError>,
    ) -> Result<T, SessionError> {
        let guard = self
            .workspace
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match guard.as_ref() {
            Some(ws) => Ok(f(ws)?),
            None => Err(SessionError::NotFound(self.id.clone())),
        }
    }
}

/// Holds every open session of a server (or an MCP server), and reaps them.
pub struct SessionManager {
    root: PathBuf,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
}

impl std::fmt::Debug for SessionManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionManager")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// The default directory session workspaces are mounted under: `/run/airlock-sessions`
/// as root, else below the user's runtime directory.
pub fn default_root() -> PathBuf {
    let runtime = airlock_host::jobdir::RuntimeDir::default_path();
    let name = format!(
        "{}-sessions",
        runtime
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("airlock")
    );
    runtime.with_file_name(name)
}

impl SessionManager {
    /// A manager whose workspaces live under `root` (created mode 0711: a sandbox's init,
    /// an unprivileged uid when airlock is root, must traverse it to bind a workspace),
    /// with its reaper running on the current tokio runtime.
    pub fn start(root: &Path) -> Result<Arc<Self>, SessionError> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let err = |source: std::io::Error| HostError::Workspace {
            op: "create the sessions directory",
            path: root.to_owned(),
            source,
        };
        match std::fs::DirBuilder::new().mode(0o711).create(root) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(err(e).into()),
        }
        let meta = std::fs::symlink_metadata(root).map_err(err)?;
        if !meta.is_dir() {
            return Err(err(std::io::Error::other("not a directory")).into());
        }
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o711)).map_err(err)?;
        match airlock_host::workspace::sweep_stale(root) {
            Ok(swept) if !swept.is_empty() => {
                tracing::info!(
                    count = swept.len(),
                    "removed session workspaces a dead server left"
                );
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot sweep stale session workspaces"),
        }
        let manager = Arc::new(Self {
            root: root.to_owned(),
            sessions: Mutex::new(HashMap::new()),
        });
        let weak = Arc::downgrade(&manager);
        tokio::spawn(reap_loop(weak));
        Ok(manager)
    }

    fn lookup(&self, tenant: &str, id: &str) -> Result<Arc<Session>, SessionError> {
        let sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        match sessions.get(id) {
            // Another tenant's session is as absent as one that never was.
            Some(s) if s.tenant == tenant => Ok(s.clone()),
            _ => Err(SessionError::NotFound(id.to_owned())),
        }
    }

    /// Open sessions of a tenant.
    pub fn count(&self, tenant: &str) -> usize {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter(|s| s.tenant == tenant)
            .count()
    }

    /// Opens a session for `tenant` under `engine`'s policy.
    pub async fn create(
        &self,
        engine: Arc<Engine>,
        tenant: &str,
    ) -> Result<SessionInfo, SessionError> {
        let policy = engine.policy().sessions.clone();
        if !policy.enabled {
            return Err(SessionError::Disabled);
        }
        match engine.backend_kind() {
            BackendKind::Native | BackendKind::Docker | BackendKind::Podman => {}
            other => {
                return Err(SessionError::Unsupported(format!(
                    "sessions need a backend that binds a host directory at /work (native, docker, podman), not {other}"
                )));
            }
        }
        if policy.mode == SessionMode::Kernel {
            if engine.policy().language("python").is_none() {
                return Err(SessionError::Unsupported(
                    "kernel sessions need the policy's python language".to_owned(),
                ));
            }
            if engine.backend_kind() != BackendKind::Native {
                return Err(SessionError::Unsupported(format!(
                    "kernel sessions run on the native backend only, not {}",
                    engine.backend_kind()
                )));
            }
        }
        let id = JobId::generate().to_string();
        {
            // Counted and reserved under one lock, so two creates cannot both pass.
            let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
            let held = sessions.values().filter(|s| s.tenant == tenant).count();
            if held >= policy.max_per_tenant as usize {
                return Err(SessionError::TooMany {
                    max: policy.max_per_tenant,
                });
            }
            let path = self.root.join(&id);
            let workspace = Workspace::create(
                &self.root,
                &id,
                policy.workspace_bytes.as_u64(),
                policy.workspace_files,
            )?;
            let session = Arc::new(Session {
                id: id.clone(),
                tenant: tenant.to_owned(),
                engine,
                policy: policy.clone(),
                created: Instant::now(),
                created_at: SystemTime::now(),
                last_used: Mutex::new(Instant::now()),
                calls: Mutex::new(0),
                workspace: Mutex::new(Some(workspace)),
                workspace_path: path,
                state: tokio::sync::Mutex::new(CallState {
                    kernel: None,
                    died: None,
                    removal: None,
                }),
                ending: watch::channel(None).0,
            });
            sessions.insert(id.clone(), session);
        }
        let session = self.lookup(tenant, &id)?;
        session.audit(serde_json::json!({"event": "session_start"}));
        if policy.mode == SessionMode::Kernel {
            let mut state = session.state.lock().await;
            if let Err(e) = start_kernel(&session, &mut state, 0).await {
                drop(state);
                self.end(&id, "kernel_start_failed").await;
                return Err(e);
            }
        }
        tracing::info!(session = %id, tenant, mode = policy.mode.as_str(), "session opened");
        Ok(session.info())
    }

    /// The session, when `tenant` owns it.
    pub fn get(&self, tenant: &str, id: &str) -> Result<SessionInfo, SessionError> {
        Ok(self.lookup(tenant, id)?.info())
    }

    /// Ends the session `tenant` owns.
    pub async fn delete(&self, tenant: &str, id: &str) -> Result<(), SessionError> {
        self.lookup(tenant, id)?;
        self.end(id, "delete").await;
        Ok(())
    }

    /// Ends every session (server shutdown).
    pub async fn shutdown(&self) {
        let ids: Vec<String> = self
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        for id in ids {
            self.end(&id, "shutdown").await;
        }
    }

    /// Removes the session, stops a call in progress, kills the kernel, destroys the
    /// workspace with everything in it, and writes the `session_end` line.
    async fn end(&self, id: &str, reason: &str) {
        let Some(session) = self
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id)
        else {
            return;
        };
        session.ending.send_replace(Some(reason.to_owned()));
        let mut state = session.state.lock().await;
        if let Some(kernel) = state.kernel.take() {
            stop_kernel(kernel, reason).await;
        }
        if let Some(removal) = state.removal.take() {
            removal.wait().await;
        }
        drop(state);
        let workspace = session
            .workspace
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let removed = match workspace {
            Some(ws) => ws.destroy().map_err(|e| e.to_string()),
            None => Ok(()),
        };
        if let Err(e) = &removed {
            tracing::error!(session = %id, error = %e, "session workspace not removed");
        }
        let calls = *session.calls.lock().unwrap_or_else(PoisonError::into_inner);
        session.audit(serde_json::json!({
            "event": "session_end",
            "reason": reason,
            "calls": calls,
            "lifetime_ms": session.created.elapsed().as_millis() as u64,
            "workspace_removed": removed.is_ok(),
        }));
        tracing::info!(session = %id, reason, "session ended");
    }

    /// Ends sessions past `ttl`, and idle ones (a call in progress is never idle).
    async fn reap(&self) {
        let due: Vec<(String, &'static str)> = self
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter_map(|s| {
                if s.created.elapsed() >= s.policy.ttl {
                    return Some((s.id.clone(), "ttl"));
                }
                let idle = s
                    .last_used
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .elapsed();
                (idle >= s.policy.idle && s.state.try_lock().is_ok())
                    .then(|| (s.id.clone(), "idle"))
            })
            .collect();
        for (id, reason) in due {
            self.end(&id, reason).await;
        }
    }

    /// Writes a file into the session's `/work`.
    pub fn write_file(
        &self,
        tenant: &str,
        id: &str,
        path: &str,
        content: &[u8],
    ) -> Result<(), SessionError> {
        let session = self.lookup(tenant, id)?;
        check_user_path(path)?;
        if content.len() as u64 > FILE_MAX_BYTES {
            return Err(SessionError::Invalid(format!(
                "the file is {} bytes, more than the cap of {FILE_MAX_BYTES}",
                content.len()
            )));
        }
        session.touch();
        session.with_workspace(|ws| ws.write_file(path, content))
    }

    /// Reads a file of the session's `/work`.
    pub fn read_file(&self, tenant: &str, id: &str, path: &str) -> Result<Vec<u8>, SessionError> {
        let session = self.lookup(tenant, id)?;
        check_user_path(path)?;
        session.touch();
        session.with_workspace(|ws| ws.read_file(path, FILE_MAX_BYTES))
    }

    /// Lists the regular files of the session's `/work` (not the kernel's own).
    pub fn list_files(&self, tenant: &str, id: &str) -> Result<Vec<WorkspaceEntry>, SessionError> {
        let session = self.lookup(tenant, id)?;
        session.touch();
        let max = session.policy.workspace_files as usize;
        let mut files = session.with_workspace(|ws| ws.list(max))?;
        files.retain(|f| !f.path.starts_with(&format!("{CONTROL_DIR}/")));
        Ok(files)
    }

    /// Runs one call in the session.
    pub async fn run(
        &self,
        tenant: &str,
        id: &str,
        call: SessionCall,
    ) -> Result<SessionRunResult, SessionError> {
        let session = self.lookup(tenant, id)?;
        let mut state = session.state.lock().await;
        // The session may have ended while this call waited for the previous one.
        if session.ending.borrow().is_some() {
            return Err(SessionError::NotFound(id.to_owned()));
        }
        // Past its ttl (the reaper has not come by yet), or too close to it for a call's
        // shortest wall time: the session is over. Without this a call in that gap found
        // the kernel dead of the ttl and tried to start another with no time left.
        if session.remaining() < airlock_core::policy::bounds::TIMEOUT_MIN {
            drop(state);
            self.end(id, "ttl").await;
            return Err(SessionError::NotFound(id.to_owned()));
        }
        session.touch();
        let number = {
            let mut calls = session.calls.lock().unwrap_or_else(PoisonError::into_inner);
            *calls += 1;
            *calls
        };
        let engine = session.engine.clone();
        let ceiling = engine.policy().limits.timeout;
        let asked = call.timeout.unwrap_or(ceiling);
        if asked > ceiling {
            return Err(SessionError::Invalid(format!(
                "the call's wall time {} is above the policy's ceiling of {}",
                airlock_core::units::format_duration(asked),
                airlock_core::units::format_duration(ceiling)
            )));
        }
        if asked < airlock_core::policy::bounds::TIMEOUT_MIN {
            return Err(SessionError::Invalid(format!(
                "the call's wall time must be at least {}",
                airlock_core::units::format_duration(airlock_core::policy::bounds::TIMEOUT_MIN)
            )));
        }
        // No call outlives the session.
        let wall = asked.min(session.remaining());
        let started = Instant::now();
        let result = match session.policy.mode {
            SessionMode::Workspace => {
                if let Some(removal) = state.removal.take() {
                    removal.wait().await;
                }
                let (result, removal) = run_workspace_call(&session, number, call, wall).await;
                state.removal = Some(removal);
                result
            }
            SessionMode::Kernel => run_kernel_call(&session, &mut state, number, call, wall).await,
        };
        session.touch();
        drop(state);
        let mut line = serde_json::json!({
            "event": "session_call",
            "call": number,
            "total_ms": started.elapsed().as_millis() as u64,
        });
        match &result {
            Ok(r) => {
                line["job_id"] = serde_json::json!(r.observation.job_id);
                line["outcome"] = serde_json::json!(r.observation.outcome);
                line["error_kind"] =
                    serde_json::json!(r.observation.error.as_ref().map(|e| e.kind));
                line["redactions"] = serde_json::json!(r.observation.redactions);
                line["kernel_restarted"] = serde_json::json!(r.kernel_restarted.is_some());
            }
            Err(e) => {
                line["outcome"] = serde_json::json!("error");
                line["error_kind"] = serde_json::json!(e.kind());
            }
        }
        session.audit(line);
        result
    }
}

async fn reap_loop(manager: Weak<SessionManager>) {
    loop {
        tokio::time::sleep(REAP_INTERVAL).await;
        let Some(manager) = manager.upgrade() else {
            return;
        };
        manager.reap().await;
    }
}

fn check_user_path(path: &str) -> Result<(), SessionError> {
    airlock_core::job::check_relative_path(path).map_err(SessionError::Invalid)?;
    if path == CONTROL_DIR || path.starts_with(&format!("{CONTROL_DIR}/")) {
        return Err(SessionError::Invalid(format!(
            "{CONTROL_DIR}/ is the session's own"
        )));
    }
    Ok(())
}

/// Resolves when the session starts ending, with the reason.
async fn ending(session: &Session) -> String {
    let mut rx = session.ending.subscribe();
    loop {
        if let Some(reason) = rx.borrow_and_update().clone() {
            return format!("the session ended ({reason})");
        }
        if rx.changed().await.is_err() {
            return "the session ended".to_owned();
        }
    }
}

async fn run_workspace_call(
    session: &Session,
    number: u64,
    call: SessionCall,
    wall: Duration,
) -> (Result<SessionRunResult, SessionError>, PendingTeardown) {
    let engine = &session.engine;
    let language = call
        .language
        .unwrap_or_else(|| engine.policy().default_language().to_owned());
    let request = JobRequest {
        language,
        source: call.code.into_bytes(),
        limits: LimitsRequest {
            timeout: call.timeout,
            ..Default::default()
        },
        workspace: Some(session.workspace_path.clone()),
        // What the call saves in /out (a chart, a table) comes back with its answer.
        out: true,
        ..Default::default()
    };
    let (mut result, removal) = engine
        .run_detached_with(
            request,
            Some(session.tenant.clone()),
            Some(wall),
            ending(session),
            None,
        )
        .await;
    result.inline_files(engine.policy().filesystem.out.inline_bytes.as_u64());
    let answer = SessionRunResult {
        session_id: session.id.clone(),
        call: number,
        observation: result.observation,
        value: None,
        error: None,
        kernel_restarted: None,
    };
    (Ok(answer), removal)
}

/// Starts the session's kernel job and waits for its interpreter to be ready.
async fn start_kernel(
    session: &Arc<Session>,
    state: &mut CallState,
    first_call: u64,
) -> Result<(), SessionError> {
    session.with_workspace(|ws| {
        ws.remove_file(&format!("{CONTROL_DIR}/ready"))?;
        Ok(())
    })?;
    let request = JobRequest {
        language: "python".to_owned(),
        source: KERNEL_DRIVER.as_bytes().to_vec(),
        args: vec![first_call.to_string()],
        workspace: Some(session.workspace_path.clone()),
        ..Default::default()
    };
    let (kill_tx, kill_rx) = oneshot::channel::<String>();
    let (done_tx, done_rx) = watch::channel(None);
    let engine = session.engine.clone();
    let tenant = session.tenant.clone();
    let wall = session.remaining();
    let task = tokio::spawn(async move {
        let (result, removal) = engine
            .run_detached_with(
                request,
                Some(tenant),
                Some(wall),
                async move {
                    kill_rx
                        .await
                        .unwrap_or_else(|_| "the session ended".to_owned())
                },
                None,
            )
            .await;
        // Told before the removal: a dead kernel is reported at once; stop_kernel, which
        // awaits this task, still returns only once its sandbox is gone.
        done_tx.send_replace(Some(result.observation));
        removal.wait().await;
    });
    let kernel = Kernel {
        kill: Some(kill_tx),
        done: done_rx,
        task,
    };
    let deadline = Instant::now() + KERNEL_START_TIMEOUT;
    loop {
        if let Some(obs) = kernel.done.borrow().clone() {
            let why = describe_end(&obs);
            kernel.task.abort();
            return Err(SessionError::KernelStart(why));
        }
        let ready = session
            .with_workspace(|ws| Ok(ws.read_file(&format!("{CONTROL_DIR}/ready"), 64).is_ok()))?;
        if ready {
            break;
        }
        if Instant::now() >= deadline {
            stop_kernel(kernel, "start timeout").await;
            return Err(SessionError::KernelStart(format!(
                "not ready after {}s",
                KERNEL_START_TIMEOUT.as_secs()
            )));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    state.kernel = Some(kernel);
    Ok(())
}

async fn stop_kernel(mut kernel: Kernel, reason: &str) {
    if let Some(kill) = kernel.kill.take() {
        let _ = kill.send(reason.to_owned());
    }
    // The job's future removes its sandbox before it returns.
    let _ = (&mut kernel.task).await;
}

/// The caps a kernel call's files are released under: the policy's `/out` caps.
fn out_caps(policy: &airlock_core::Policy) -> airlock_host::out::OutCaps {
    let out = &policy.filesystem.out;
    airlock_host::out::OutCaps {
        max_files: out.max_files,
        max_bytes: out.max_bytes.as_u64(),
        max_file_bytes: out.max_file_bytes.as_u64(),
    }
}

fn describe_end(obs: &Observation) -> String {
    match (&obs.error, obs.outcome) {
        (Some(e), _) => format!("{}: {}", e.kind, e.message),
        (None, Outcome::Oom) => "the kernel ran out of memory and was killed".to_owned(),
        (None, Outcome::Timeout) => "the kernel reached the session's ttl".to_owned(),
        (None, outcome) => format!(
            "the kernel ended ({}{})",
            serde_json::to_value(outcome)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            obs.signal
                .as_ref()
                .map(|s| format!(", {s}"))
                .or(obs.exit_code.map(|c| format!(", exit code {c}")))
                .unwrap_or_default()
        ),
    }
}

async fn run_kernel_call(
    session: &Arc<Session>,
    state: &mut CallState,
    number: u64,
    call: SessionCall,
    wall: Duration,
) -> Result<SessionRunResult, SessionError> {
    if let Some(language) = &call.language
        && language != "python"
    {
        return Err(SessionError::Invalid(format!(
            "a kernel session runs python, not {language:?}"
        )));
    }
    let mut restarted = None;
    // A kernel that died since the last call is reported, then replaced.
    let dead = match &state.kernel {
        Some(k) => k.done.borrow().clone().map(|obs| describe_end(&obs)),
        None => Some(
            state
                .died
                .clone()
                .unwrap_or_else(|| "the kernel was not running".to_owned()),
        ),
    };
    if let Some(why) = dead {
        if let Some(kernel) = state.kernel.take() {
            stop_kernel(kernel, "replaced").await;
        }
        state.died = None;
        start_kernel(session, state, number).await?;
        session.audit(serde_json::json!({"event": "session_kernel_restarted", "reason": why}));
        restarted = Some(why);
    }
    let engine = session.engine.clone();
    let call_id = JobId::generate();
    let control = |name: &str| format!("{CONTROL_DIR}/{name}-{number}");
    session.with_workspace(|ws| {
        ws.write_file(&format!("{}.py", control("call")), call.code.as_bytes())?;
        let order = serde_json::json!({"timeout": wall.as_secs_f64(), "html": call.html});
        ws.write_file(
            &format!("{}.go", control("call")),
            order.to_string().as_bytes(),
        )
    })?;
    let started = Instant::now();
    let grace = session.policy.interrupt_grace;
    let Some(kernel) = state.kernel.as_mut() else {
        return Err(SessionError::KernelStart("no kernel".to_owned()));
    };
    let mut ending_rx = session.ending.subscribe();
    // The call's end: its result, the kernel's death, the grace after its wall time.
    enum Ended {
        Result,
        KernelDied(Box<Observation>),
        Overran,
        Closed,
    }
    let ended = loop {
        let done = session.with_workspace(|ws| {
            Ok(ws
                .read_file(&format!("{}.done", control("res")), 64)
                .is_ok())
        })?;
        if done {
            break Ended::Result;
        }
        if let Some(obs) = kernel.done.borrow().clone() {
            break Ended::KernelDied(Box::new(obs));
        }
        if started.elapsed() >= wall + grace {
            break Ended::Overran;
        }
        if ending_rx.borrow_and_update().is_some() {
            break Ended::Closed;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    };
    let duration = started.elapsed();
    // The call's output goes through the captures and flood limit every job's does; the
    // files are bounded by the workspace's own size.
    let mut output = JobOutput::new(&engine.policy().limits, None);
    let mut flooded = false;
    for (stream, ext) in [
        (StreamKind::Stdout, "stdout"),
        (StreamKind::Stderr, "stderr"),
    ] {
        let bytes = session
            .with_workspace(|ws| {
                ws.read_file(
                    &format!("{}.{ext}", control("out")),
                    session.policy.workspace_bytes.as_u64(),
                )
            })
            .unwrap_or_default();
        flooded |= output.push(stream, &bytes);
    }
    let (stdout, stderr) = output.finish();
    let mut report = RunReport {
        limit_hit: flooded.then_some(LimitHit::OutputFlood),
        stdout,
        stderr,
        ..RunReport::ended(Termination::Exited(0), duration)
    };
    let mut value = None;
    let mut error = None;
    if matches!(ended, Ended::Result) {
        // The call's figures and HTML are its /out: the same caps, the same scan for
        // secrets, listed in the observation with their media types.
        let files = session.with_workspace(|ws| ws.open_dir(&control("files")));
        if let Ok(Some(dir)) = files {
            let released = airlock_host::out::release(&dir, out_caps(engine.policy()));
            report.out_files = released.files;
            report.out_rejected = released.rejected;
        }
    }
    match ended {
        Ended::Result => {
            let record = session
                .with_workspace(|ws| {
                    ws.read_file(&format!("{}.json", control("res")), RESULT_MAX_BYTES)
                })
                .ok()
                .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
                .unwrap_or_default();
            match record["status"].as_str() {
                Some("ok") => {}
                Some("timeout") => {
                    report.limit_hit = Some(LimitHit::Timeout);
                    report.termination = Termination::Unknown;
                }
                _ => report.termination = Termination::Exited(1),
            }
            let redact = |text: &str, max: usize| -> String {
                let cut = airlock_core::capture::cut_at_most(text, max);
                engine
                    .redact(&text[..cut])
                    .map(|(t, _)| t)
                    .unwrap_or_else(|| "[withheld: redaction unavailable]".to_owned())
            };
            value = record["value"].as_str().map(|v| redact(v, VALUE_MAX_BYTES));
            if let Some(name) = record["error"]["name"].as_str() {
                error = Some(CellError {
                    name: redact(name, 256),
                    value: redact(record["error"]["value"].as_str().unwrap_or(""), 2000),
                });
            }
        }
        Ended::KernelDied(obs) => {
            let why = describe_end(&obs);
            tracing::warn!(session = %session.id, call = number, why = %why, "the session's kernel ended during a call");
            report.termination = Termination::Unknown;
            report.oom_kills = u64::from(obs.outcome == Outcome::Oom);
            if obs.outcome == Outcome::Timeout {
                report.limit_hit = Some(LimitHit::Timeout);
            }
            if let Some(kernel) = state.kernel.take() {
                stop_kernel(kernel, "died").await;
            }
            state.died = Some(why);
        }
        Ended::Overran => {
            // The call did not stop when interrupted: the kernel goes with it.
            report.limit_hit = Some(LimitHit::Timeout);
            report.termination = Termination::Unknown;
            if let Some(kernel) = state.kernel.take() {
                stop_kernel(kernel, "a call overran its wall time").await;
            }
            state.died = Some(format!(
                "call {number} did not stop within {}ms of its wall time; the kernel was killed",
                grace.as_millis()
            ));
        }
        Ended::Closed => {
            return Err(SessionError::NotFound(session.id.clone()));
        }
    }
    // The call's files are the host's to remove; a dead kernel's workspace may be gone.
    let _ = session.with_workspace(|ws| {
        for name in ["call", "res", "out"] {
            for ext in ["py", "go", "json", "done", "stdout", "stderr"] {
                ws.remove_file(&format!("{}.{ext}", control(name)))?;
            }
        }
        ws.remove_dir_all(&control("files"))
    });
    let mut result = engine.render(call_id, report);
    result.inline_files(engine.policy().filesystem.out.inline_bytes.as_u64());
    Ok(SessionRunResult {
        session_id: session.id.clone(),
        call: number,
        observation: result.observation,
        value,
        error,
        kernel_restarted: restarted,
    })
}
