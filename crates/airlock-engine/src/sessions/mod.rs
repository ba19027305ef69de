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
//!   The kernel holds code contexts (globals and a cwd each; `kernel.rs`), returns results
//!   in E2B's shape, and streams a call's output as it is written
//!   ([`SessionManager::run_streaming`]). A call with [`SessionCall::workspace`] runs as a
//!   workspace call does, over the same `/work`, while the kernel keeps its state.
//!
//! Every call is an audit line with the session id (`"event": "session_call"`), and so are
//! the session's start and end (`session_start`, `session_end` with the reason: `delete`,
//! `ttl`, `idle`, `shutdown`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant, SystemTime};

use airlock_core::observation::{LimitHit, Termination};
use airlock_core::policy::{SessionMode, SessionsPolicy};
use airlock_core::supervise::JobOutput;
use airlock_core::{
    ErrorKind, JobId, JobRequest, LimitsRequest, Observation, Outcome, RunReport, StreamKind,
};
use airlock_host::HostError;
use airlock_host::workspace::{Workspace, WorkspaceEntry};
use tokio::sync::{oneshot, watch};

use crate::Engine;
use crate::teardowns::PendingTeardown;

mod kernel;
mod wake;
pub use kernel::{KernelContext, RichResult, SessionEvent, SessionSink};
use kernel::{run_kernel_call, start_kernel, stop_kernel};

/// The Python program a kernel session's sandbox runs: reads calls from
/// `/work/.airlock/call-N.py` (started by `call-N.go`, a JSON object with the call's wall
/// time in seconds, its code context, that context's cwd and generation, the contexts to
/// forget, the call's environment, and whether the value's rich formats are wanted), runs
/// each in its context's globals (through IPython's input transformations where the root
/// has IPython) with the last expression's value returned like a notebook cell's, and
/// writes `out-N.stdout`, `out-N.stderr` as the code prints, the results' formats
/// (`display()` outputs, figures, the value's) as files in `files-N/`, `res-N.json` (status,
/// value, error with traceback, results, execution count), then `res-N.done`. Trusted by
/// nobody: it runs inside the sandbox with the call's code.
pub const KERNEL_DRIVER: &str = include_str!("../kernel_driver.py");

/// The directory of the kernel protocol's files, inside the workspace; the files API
/// refuses names under it.
pub const CONTROL_DIR: &str = ".airlock";

/// The kernel's wake-up FIFO in [`CONTROL_DIR`] ([`wake`]); the driver knows the name.
const WAKE_FIFO: &str = "wake";

/// Most bytes of a call's result record (`res-N.json`) the host reads.
const RESULT_MAX_BYTES: u64 = 64 * 1024;
/// Longest text of a cell's value returned.
pub const VALUE_MAX_BYTES: usize = 8000;
/// How often the host looks for a call's result.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// How long a new kernel may take to start its interpreter. Generous: on a loaded host
/// (a build beside the server) importing the charts packages took over 20 s; a kernel that
/// does start is far more use to the caller than a refusal, and a dead one is reported at
/// once whatever this says.
const KERNEL_START_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the reaper looks for sessions past `ttl` or `idle`.
const REAP_INTERVAL: Duration = Duration::from_millis(250);
/// Largest file the files API moves in or out of a session, whatever the workspace size.
pub const FILE_MAX_BYTES: u64 = 16 << 20;
/// Longest traceback of a cell's error returned.
pub const TRACEBACK_MAX_BYTES: usize = 16_000;
/// Most code contexts a kernel session holds, the default one included.
pub const CONTEXTS_MAX: usize = 16;
/// The name of a session's own `/tmp` beside its workspace: `<id>-tmp` (a session id is a
/// UUID, which never ends so).
const TMP_SUFFIX: &str = "-tmp";
/// The context a kernel call runs in unless it names another.
pub const DEFAULT_CONTEXT: &str = "default";

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
    /// The call asks for what the policy does not allow (an environment variable).
    #[error("{0}")]
    Denied(String),
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
            SessionError::Unsupported(_) | SessionError::Denied(_) => ErrorKind::PolicyDenied,
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

/// How a session is opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionOptions {
    /// A kernel session's kernel starts at its first kernel call instead of at once (an
    /// E2B sandbox that may only ever run commands never pays for one). A kernel that
    /// cannot start then fails that call, not the session's opening.
    pub lazy_kernel: bool,
    /// The session keeps a `/tmp` of its own across its sandboxes (an E2B sandbox's, whose
    /// `/tmp` persists between commands on E2B): a second host-side tmpfs of the policy's
    /// `[limits] tmp` size and the session's `workspace_files`, beside its workspace and
    /// outside `/work`, bound at `/tmp` in every sandbox of the session (its kernel, its
    /// calls, the jobs run over [`SessionManager::job_workspace`]) and destroyed with the
    /// session. Nothing of it is ever handed back by the host. `false`: each sandbox's
    /// `/tmp` is a fresh tmpfs, as a job's.
    pub persistent_tmp: bool,
}

/// The host-side directories a job run over a session uses
/// ([`SessionManager::job_workspace`]).
#[derive(Debug, Clone)]
pub struct SessionDirs {
    /// Its `/work`.
    pub workspace: PathBuf,
    /// Its own `/tmp` ([`SessionOptions::persistent_tmp`]), if it keeps one.
    pub tmp: Option<PathBuf>,
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
    /// Kernel mode: also return the rich formats of the cell's value when it has them
    /// (a pandas DataFrame's HTML table as the file `value.html`, `_repr_png_` as
    /// `value.png`, ...), in `results` and as files. `display()` outputs and figures
    /// come back whatever this says.
    pub html: bool,
    /// Kernel mode: the code context the call runs in (its own globals and working
    /// directory); `None`: the `default` context.
    pub context: Option<String>,
    /// Environment of this call only (kernel mode: set while it runs, then restored);
    /// each name must be one the policy's `[env] allow` lists, as for a job.
    pub env: BTreeMap<String, String>,
    /// Runs the call as a fresh job over the session's `/work` even in a kernel session
    /// (E2B's `commands.run` beside its `run_code`): the kernel keeps its state, the call
    /// gets a sandbox of its own with the policy's limits and its own audit line.
    pub workspace: bool,
}

/// The error a kernel call raised.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CellError {
    /// The exception's class name.
    pub name: String,
    /// Its message (redacted).
    pub value: String,
    /// The traceback from the cell's own frames on (redacted, at most
    /// [`TRACEBACK_MAX_BYTES`]).
    pub traceback: String,
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
    /// Kernel mode: the call's results in order (each `display()` output, each figure,
    /// then the cell's value as the main result), in E2B's shape.
    pub results: Vec<RichResult>,
    /// Kernel mode: the context's execution count after this call (1 for its first).
    pub execution_count: Option<u64>,
}

/// A running kernel: the session's one job.
struct Kernel {
    /// Sending kills the job (the engine removes its sandbox).
    kill: Option<oneshot::Sender<String>>,
    /// The job's observation once it ended.
    done: watch::Receiver<Option<Observation>>,
    task: tokio::task::JoinHandle<()>,
    /// The watch on its control directory that wakes the host's waits (none: they poll).
    _watched: Option<wake::Watched>,
    /// The host's end of its wake-up FIFO (none: the driver polls).
    bell: Option<wake::KernelBell>,
}

struct CallState {
    kernel: Option<Kernel>,
    /// Why the kernel died, until the next call reports it.
    died: Option<String>,
    /// Whether a kernel was ever started (a lazy session's first kernel call starts one
    /// without calling it a restart).
    kernel_started: bool,
    /// Kernel mode: the code contexts by id (the default one made at the first call).
    contexts: BTreeMap<String, kernel::ContextState>,
    /// Contexts removed since the last call: the driver drops their globals then.
    forget: Vec<String>,
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
    /// Its own `/tmp` ([`SessionOptions::persistent_tmp`]).
    tmp: Mutex<Option<Workspace>>,
    tmp_path: Option<PathBuf>,
    /// Calls one at a time; held by a call for its whole life.
    state: tokio::sync::Mutex<CallState>,
    /// Set when the session is ending: a call in progress stops at once.
    ending: watch::Sender<Option<String>>,
    /// Notified when the kernel wrote a file the host waits for ([`wake`]).
    woken: Arc<tokio::sync::Notify>,
    /// The manager's inotify instance, when it has one.
    control_watch: Option<Arc<wake::ControlWatch>>,
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

    /// Waits until the kernel may have written what the host waits for: woken by its
    /// control directory's watch, or after [`POLL_INTERVAL`] (the fallback, and the pace
    /// a call's streamed output is read at).
    async fn pause(&self) {
        let _ = tokio::time::timeout(POLL_INTERVAL, self.woken.notified()).await;
    }
}

/// Holds every open session of a server (or an MCP server), and reaps them.
pub struct SessionManager {
    root: PathBuf,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// One inotify instance for every kernel's control directory ([`wake`]), made with
    /// the first kernel session (none at all for a server that never has one).
    control_watch: std::sync::OnceLock<Option<(Arc<wake::ControlWatch>, tokio::task::AbortHandle)>>,
}

impl Drop for SessionManager {
    fn drop(&mut self) {
        if let Some(Some((_, reader))) = self.control_watch.get() {
            reader.abort();
        }
    }
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
            control_watch: std::sync::OnceLock::new(),
        });
        let weak = Arc::downgrade(&manager);
        tokio::spawn(reap_loop(weak));
        Ok(manager)
    }

    /// The manager's inotify instance, made at the first call (on the current runtime).
    fn control_watch(&self) -> Option<Arc<wake::ControlWatch>> {
        self.control_watch
            .get_or_init(wake::ControlWatch::start)
            .as_ref()
            .map(|(watch, _)| watch.clone())
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
        self.create_with(engine, tenant, SessionOptions::default())
            .await
    }

    /// Opens a session for `tenant` under `engine`'s policy, with `options`.
    pub async fn create_with(
        &self,
        engine: Arc<Engine>,
        tenant: &str,
        options: SessionOptions,
    ) -> Result<SessionInfo, SessionError> {
        let policy = engine.policy().sessions.clone();
        if !policy.enabled {
            return Err(SessionError::Disabled);
        }
        let can = engine.capabilities();
        if !can.host_workdir {
            return Err(SessionError::Unsupported(format!(
                "sessions need a backend that binds a host directory at /work, which {} does not",
                engine.backend_kind()
            )));
        }
        if policy.mode == SessionMode::Kernel {
            if engine.policy().language("python").is_none() {
                return Err(SessionError::Unsupported(
                    "kernel sessions need the policy's python language".to_owned(),
                ));
            }
            if !can.kernel_sessions {
                return Err(SessionError::Unsupported(format!(
                    "kernel sessions need a backend that runs a session's kernel, which {} does not",
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
            let tmp = if options.persistent_tmp {
                let name = format!("{id}{TMP_SUFFIX}");
                match Workspace::create(
                    &self.root,
                    &name,
                    engine.policy().limits.tmp.as_u64(),
                    policy.workspace_files,
                ) {
                    Ok(tmp) => Some(tmp),
                    Err(e) => {
                        let _ = workspace.destroy();
                        return Err(e.into());
                    }
                }
            } else {
                None
            };
            let tmp_path = tmp.as_ref().map(|t| t.path().to_owned());
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
                tmp: Mutex::new(tmp),
                tmp_path,
                state: tokio::sync::Mutex::new(CallState {
                    kernel: None,
                    died: None,
                    kernel_started: false,
                    contexts: BTreeMap::new(),
                    forget: Vec::new(),
                    removal: None,
                }),
                ending: watch::channel(None).0,
                woken: Arc::new(tokio::sync::Notify::new()),
                control_watch: (policy.mode == SessionMode::Kernel)
                    .then(|| self.control_watch())
                    .flatten(),
            });
            sessions.insert(id.clone(), session);
        }
        let session = self.lookup(tenant, &id)?;
        session.audit(serde_json::json!({"event": "session_start"}));
        if policy.mode == SessionMode::Kernel && !options.lazy_kernel {
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
        let tmp = session
            .tmp
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let removed = match workspace {
            Some(ws) => ws.destroy().map_err(|e| e.to_string()),
            None => Ok(()),
        }
        .and(match tmp {
            Some(tmp) => tmp.destroy().map_err(|e| e.to_string()),
            None => Ok(()),
        });
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
        check_session_path(path, session.engine.policy())?;
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
        check_session_path(path, session.engine.policy())?;
        session.touch();
        session.with_workspace(|ws| ws.read_file(path, FILE_MAX_BYTES))
    }

    /// Lists the regular files of the session's `/work`: the user's only (not a call's
    /// source, the kernel's driver or its files, none of which has a name a user's file
    /// may have).
    pub fn list_files(&self, tenant: &str, id: &str) -> Result<Vec<WorkspaceEntry>, SessionError> {
        let session = self.lookup(tenant, id)?;
        session.touch();
        let max = session.policy.workspace_files as usize;
        let mut files = session.with_workspace(|ws| ws.list(max))?;
        let policy = session.engine.policy();
        files.retain(|f| airlock_core::job::reserved_path_reason(&f.path, policy).is_none());
        Ok(files)
    }

    /// The session, when `tenant` owns it and it is a kernel session.
    fn kernel_session(&self, tenant: &str, id: &str) -> Result<Arc<Session>, SessionError> {
        let session = self.lookup(tenant, id)?;
        if session.policy.mode != SessionMode::Kernel {
            return Err(SessionError::Unsupported(
                "code contexts are a kernel session's; this is a workspace session".to_owned(),
            ));
        }
        Ok(session)
    }

    /// Makes a code context in the session's kernel: its own globals, its working
    /// directory `cwd` (`/work` or below; `None`: `/work`). Python only.
    pub async fn create_context(
        &self,
        tenant: &str,
        id: &str,
        cwd: Option<&str>,
        language: Option<&str>,
    ) -> Result<KernelContext, SessionError> {
        let session = self.kernel_session(tenant, id)?;
        if let Some(language) = language
            && language != "python"
        {
            return Err(SessionError::Invalid(format!(
                "language {language:?}: the kernel runs python only"
            )));
        }
        let cwd = kernel::check_cwd(
            cwd.unwrap_or(airlock_core::job::WORKDIR),
            session.engine.policy(),
        )?;
        let mut state = session.state.lock().await;
        session.touch();
        // The default context counts once it exists, made or not.
        let held =
            state.contexts.len() + usize::from(!state.contexts.contains_key(DEFAULT_CONTEXT));
        if held >= CONTEXTS_MAX {
            return Err(SessionError::Invalid(format!(
                "this session holds {CONTEXTS_MAX} code contexts, the most it may"
            )));
        }
        let context_id = JobId::generate().to_string();
        let context = kernel::ContextState::new(&context_id, &cwd);
        let info = context.info.clone();
        state.contexts.insert(context_id, context);
        Ok(info)
    }

    /// The session's code contexts, the default one first.
    pub async fn list_contexts(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Vec<KernelContext>, SessionError> {
        let session = self.kernel_session(tenant, id)?;
        let state = session.state.lock().await;
        let mut contexts = vec![
            state
                .contexts
                .get(DEFAULT_CONTEXT)
                .map(|c| c.info.clone())
                .unwrap_or_else(|| {
                    kernel::ContextState::new(DEFAULT_CONTEXT, airlock_core::job::WORKDIR).info
                }),
        ];
        contexts.extend(
            state
                .contexts
                .values()
                .filter(|c| c.info.id != DEFAULT_CONTEXT)
                .map(|c| c.info.clone()),
        );
        Ok(contexts)
    }

    /// Restarts a code context: its next call starts from empty globals (the kernel and
    /// the other contexts are untouched; `/work` stays).
    pub async fn restart_context(
        &self,
        tenant: &str,
        id: &str,
        context: &str,
    ) -> Result<(), SessionError> {
        let session = self.kernel_session(tenant, id)?;
        let mut state = session.state.lock().await;
        session.touch();
        if context == DEFAULT_CONTEXT && !state.contexts.contains_key(DEFAULT_CONTEXT) {
            state.contexts.insert(
                DEFAULT_CONTEXT.to_owned(),
                kernel::ContextState::new(DEFAULT_CONTEXT, airlock_core::job::WORKDIR),
            );
        }
        match state.contexts.get_mut(context) {
            Some(c) => {
                c.generation += 1;
                Ok(())
            }
            None => Err(SessionError::Invalid(format!(
                "no code context {context:?} in this session"
            ))),
        }
    }

    /// Removes a code context (not the default one): its globals are dropped at the
    /// kernel's next call.
    pub async fn remove_context(
        &self,
        tenant: &str,
        id: &str,
        context: &str,
    ) -> Result<(), SessionError> {
        let session = self.kernel_session(tenant, id)?;
        if context == DEFAULT_CONTEXT {
            return Err(SessionError::Invalid(
                "the default code context cannot be removed; restart it instead".to_owned(),
            ));
        }
        let mut state = session.state.lock().await;
        session.touch();
        match state.contexts.remove(context) {
            Some(_) => {
                state.forget.push(context.to_owned());
                Ok(())
            }
            None => Err(SessionError::Invalid(format!(
                "no code context {context:?} in this session"
            ))),
        }
    }

    /// Runs `f` on the session's workspace, for a caller's own file operations (the E2B
    /// filesystem API): `airlock_host::workspace`'s functions keep it below `/work`; the
    /// caller refuses the kernel's own directory ([`check_user_path`]).
    pub fn with_workspace<T>(
        &self,
        tenant: &str,
        id: &str,
        f: impl FnOnce(&Workspace) -> Result<T, HostError>,
    ) -> Result<T, SessionError> {
        let session = self.lookup(tenant, id)?;
        session.touch();
        session.with_workspace(f)
    }

    /// The engine and host-side `/work` of the session, for a caller that runs its own
    /// fresh job over the workspace (an E2B command: streamed, killable); such a job is
    /// the engine's, with its own audit line, outside the session's one-call-at-a-time
    /// order.
    pub fn job_workspace(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<(Arc<Engine>, SessionDirs), SessionError> {
        let session = self.lookup(tenant, id)?;
        session.touch();
        Ok((
            session.engine.clone(),
            SessionDirs {
                workspace: session.workspace_path.clone(),
                tmp: session.tmp_path.clone(),
            },
        ))
    }

    /// Runs one call in the session.
    pub async fn run(
        &self,
        tenant: &str,
        id: &str,
        call: SessionCall,
    ) -> Result<SessionRunResult, SessionError> {
        self.run_streaming(tenant, id, call, None).await
    }

    /// Runs one call in the session, sending its stdout and stderr to `sink` as they are
    /// written (rendered, redacted and capped as a job's stream) and, in a kernel
    /// session, each result in order: a `display()` output or `plt.show()` figure as the
    /// cell makes it (its formats scanned as `/out` files are, within the `/out` caps),
    /// the rest (the main result, figures left open) once the call has ended. The answer is the same as
    /// [`SessionManager::run`]'s.
    pub async fn run_streaming(
        &self,
        tenant: &str,
        id: &str,
        call: SessionCall,
        sink: Option<SessionSink>,
    ) -> Result<SessionRunResult, SessionError> {
        use airlock_telemetry::KeyValue;
        // The call is a span of its own in the caller's trace (docs/telemetry.md), the
        // job of a workspace call its child; never the call's code.
        let caller = airlock_telemetry::current_caller().unwrap_or_default();
        let mut attributes = vec![KeyValue::new("airlock.session.id", id.to_owned())];
        if let Some(context) = &call.context {
            attributes.push(KeyValue::new("airlock.session.context.id", context.clone()));
        }
        let operation = airlock_telemetry::Operation::start("session call", &caller, attributes);
        let result = airlock_telemetry::with_caller(
            operation.child_caller(caller),
            self.run_call(tenant, id, call, sink, &operation),
        )
        .await;
        match &result {
            Ok(answer) => {
                operation.set(KeyValue::new(
                    "airlock.session.call",
                    i64::try_from(answer.call).unwrap_or(i64::MAX),
                ));
                operation.record_job(&answer.observation);
            }
            Err(e) => operation.fail(&e.kind().to_string()),
        }
        operation.end();
        result
    }

    /// [`SessionManager::run_streaming`]'s call, under its span.
    async fn run_call(
        &self,
        tenant: &str,
        id: &str,
        call: SessionCall,
        sink: Option<SessionSink>,
        operation: &airlock_telemetry::Operation,
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
        let in_kernel = session.policy.mode == SessionMode::Kernel && !call.workspace;
        operation.set(airlock_telemetry::KeyValue::new(
            "airlock.session.mode",
            if in_kernel { "kernel" } else { "workspace" },
        ));
        let result = match in_kernel {
            false => {
                if let Some(removal) = state.removal.take() {
                    removal.wait().await;
                }
                let (result, removal) =
                    run_workspace_call(&session, number, call, wall, sink).await;
                state.removal = Some(removal);
                result
            }
            true => run_kernel_call(&session, &mut state, number, call, wall, sink).await,
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

/// Refuses a path a caller may not touch in a session's `/work`: not relative, `..`, or a
/// name of airlock's own (a top-level name starting with
/// [`airlock_core::job::RESERVED_PREFIX`]: the calls' source, the kernel's driver and its
/// directory).
pub fn check_user_path(path: &str) -> Result<(), SessionError> {
    airlock_core::job::check_relative_path(path).map_err(SessionError::Invalid)?;
    let first = path.split('/').next().unwrap_or(path);
    if first.starts_with(airlock_core::job::RESERVED_PREFIX) {
        return Err(SessionError::Invalid(format!(
            "{path:?}: names starting with {:?} are airlock's own (the source file and the kernel's files)",
            airlock_core::job::RESERVED_PREFIX
        )));
    }
    Ok(())
}

/// A path of the session's `/work` the caller may write or read: the rule of a job's input
/// files ([`airlock_core::job::reserved_path_reason`], which also reserves a policy's own
/// language file names), so the source of a call and the kernel's own files never take a
/// user's name.
pub(super) fn check_session_path(
    path: &str,
    policy: &airlock_core::Policy,
) -> Result<(), SessionError> {
    airlock_core::job::check_relative_path(path).map_err(SessionError::Invalid)?;
    if let Some(reason) = airlock_core::job::reserved_path_reason(path, policy) {
        return Err(SessionError::Invalid(reason));
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
    sink: Option<SessionSink>,
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
        session_tmp: session.tmp_path.clone(),
        // What the call saves in /out (a chart, a table) comes back with its answer.
        out: true,
        env: call.env,
        ..Default::default()
    };
    let output_sink: Option<crate::OutputSink> = sink.map(|sink| {
        let sink: crate::OutputSink = Arc::new(move |event| sink(SessionEvent::Output(event)));
        sink
    });
    // The call's job span names its session (docs/telemetry.md).
    let mut caller = airlock_telemetry::current_caller().unwrap_or_default();
    caller.session_id = Some(session.id.to_string());
    let (mut result, removal) = airlock_telemetry::with_caller(
        caller,
        engine.run_detached_with(
            request,
            Some(session.tenant.clone()),
            Some(wall),
            ending(session),
            output_sink,
        ),
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
        results: Vec::new(),
        execution_count: None,
    };
    (Ok(answer), removal)
}
