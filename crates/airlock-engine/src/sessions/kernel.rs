//! A kernel session's one job: starting it, a call's order and its answer (output
//! streamed as it is written, rich results, the error), code contexts.

use std::io::Read;

use base64::Engine as _;

use super::*;
use crate::OutputEvent;

/// A code context of a kernel session: its own globals and working directory in the
/// session's one kernel.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KernelContext {
    /// The context's id (`default`, or one [`SessionManager::create_context`] made).
    pub id: String,
    /// Its language: `python`.
    pub language: String,
    /// Its working directory in the sandbox (`/work` or below).
    pub cwd: String,
}

/// A context as the host keeps it: restarting one is a new generation, which the driver
/// sees at the context's next call and answers with fresh globals.
#[derive(Debug, Clone)]
pub(super) struct ContextState {
    pub(super) info: KernelContext,
    pub(super) generation: u64,
}

impl ContextState {
    pub(super) fn new(id: &str, cwd: &str) -> Self {
        Self {
            info: KernelContext {
                id: id.to_owned(),
                language: "python".to_owned(),
                cwd: cwd.to_owned(),
            },
            generation: 0,
        }
    }
}

/// One result of a kernel call, in the shape E2B's code interpreter gives one: each
/// format the object has, binary ones (`png`, `jpeg`, `pdf`) base64-encoded. Every text
/// format is redacted as a job's released text files are; an image with a secret-shaped
/// string in it is withheld (its format missing, the reason in `observation.files_rejected`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct RichResult {
    /// `repr()` (or IPython's pretty form) of the object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// `_repr_html_`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    /// `_repr_markdown_`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub markdown: Option<String>,
    /// `_repr_svg_`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub svg: Option<String>,
    /// PNG, base64 (`_repr_png_`, a matplotlib figure).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub png: Option<String>,
    /// JPEG, base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jpeg: Option<String>,
    /// PDF, base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pdf: Option<String>,
    /// `_repr_latex_`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latex: Option<String>,
    /// `_repr_json_`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json: Option<serde_json::Value>,
    /// `_repr_javascript_`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub javascript: Option<String>,
    /// Whether this is the value of the cell's last expression (else a `display()`
    /// output or a figure).
    pub is_main_result: bool,
}

/// What a streaming call sends as it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionEvent {
    /// A piece of stdout or stderr, as a job's stream gives it.
    Output(OutputEvent),
    /// A result of a kernel call, in order: a `display()` output or figure as the cell
    /// makes it, the main result and the figures left open once the call has ended.
    Result(Box<RichResult>),
}

/// Receives a call's [`SessionEvent`]s.
pub type SessionSink = Arc<dyn Fn(SessionEvent) + Send + Sync>;

/// Checks a context's working directory: `/work` or a path below it that a user's file
/// could have (never the kernel's own files).
pub(super) fn check_cwd(cwd: &str, policy: &airlock_core::Policy) -> Result<String, SessionError> {
    let workdir = airlock_core::job::WORKDIR;
    let cwd = cwd.trim_end_matches('/');
    if cwd == workdir || cwd.is_empty() && workdir == "/" {
        return Ok(workdir.to_owned());
    }
    let Some(rel) = cwd.strip_prefix(&format!("{workdir}/")) else {
        return Err(SessionError::Invalid(format!(
            "cwd {cwd:?}: a context's working directory is {workdir} or below it"
        )));
    };
    check_session_path(rel, policy)?;
    Ok(cwd.to_owned())
}

/// The output file of a call the driver writes as the call runs, read as it grows.
struct Tail {
    rel: String,
    stream: StreamKind,
    file: Option<std::fs::File>,
}

impl Tail {
    /// Sends what was written since the last look to `tap`.
    fn pump(&mut self, session: &Session, tap: &airlock_core::OutputTap) {
        if self.file.is_none() {
            self.file = session
                .with_workspace(|ws| ws.open_file(&self.rel))
                .ok()
                .flatten();
        }
        let Some(file) = self.file.as_mut() else {
            return;
        };
        let mut buf = [0u8; 64 * 1024];
        loop {
            match file.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => tap(self.stream, &buf[..n]),
            }
        }
    }
}

/// Starts the session's kernel job and waits for its interpreter to be ready.
pub(super) async fn start_kernel(
    session: &Arc<Session>,
    state: &mut CallState,
    first_call: u64,
) -> Result<(), SessionError> {
    let (control, bell) = session.with_workspace(|ws| {
        ws.remove_file(&format!("{CONTROL_DIR}/ready"))?;
        ws.make_dir(CONTROL_DIR)?;
        let control = ws.open_dir(CONTROL_DIR)?;
        // Made anew for each kernel: the last one's may have been replaced by its job.
        let bell = ws
            .make_fifo(&format!("{CONTROL_DIR}/{WAKE_FIFO}"))
            .map_err(|e| tracing::debug!(session = %session.id, error = %e, "no wake-up FIFO: the kernel polls"))
            .ok()
            .map(super::wake::KernelBell::new);
        Ok((control, bell))
    })?;
    // Watched before the job starts, so that its `ready` is seen.
    let watched = control
        .as_ref()
        .zip(session.control_watch.as_ref())
        .and_then(|(control, watch)| watch.watch(control, session.woken.clone()));
    let request = JobRequest {
        language: "python".to_owned(),
        source: KERNEL_DRIVER.as_bytes().to_vec(),
        args: vec![first_call.to_string()],
        workspace: Some(session.workspace_path.clone()),
        session_tmp: session.tmp_path.clone(),
        session_kernel: true,
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
        _watched: watched,
        bell,
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
        session.pause().await;
    }
    state.kernel = Some(kernel);
    state.kernel_started = true;
    Ok(())
}

pub(super) async fn stop_kernel(mut kernel: Kernel, reason: &str) {
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

/// Longest line of `shown-N.jsonl` (one result's record) the host reads.
const ANNOUNCED_LINE_MAX_BYTES: usize = 64 * 1024;

/// The results a kernel call announces while it runs (`shown-N.jsonl`: each `display()`
/// output and `plt.show()` figure, as it is made), read as the file grows and sent to the
/// call's sink at once, each format file scanned as a released `/out` file is, within the
/// policy's `/out` caps. What is not sent here (past a cap, a malformed line) comes with
/// the call's end as before; the end skips the ones sent.
struct Announced {
    rel: String,
    files: String,
    file: Option<std::fs::File>,
    pending: Vec<u8>,
    /// Results sent so far (the first ones of the call's results, in order).
    sent: usize,
    files_sent: u32,
    bytes_sent: u64,
    /// A cap or a malformed record ended the announcements of this call.
    stopped: bool,
}

impl Announced {
    fn new(shown: String, files: String) -> Self {
        Self {
            rel: shown,
            files,
            file: None,
            pending: Vec::new(),
            sent: 0,
            files_sent: 0,
            bytes_sent: 0,
            stopped: false,
        }
    }

    /// Sends the results announced since the last look.
    fn pump(
        &mut self,
        session: &Session,
        engine: &Engine,
        sink: &SessionSink,
        redact: &dyn Fn(&str, usize) -> String,
    ) {
        if self.stopped {
            return;
        }
        if self.file.is_none() {
            self.file = session
                .with_workspace(|ws| ws.open_file(&self.rel))
                .ok()
                .flatten();
        }
        let Some(file) = self.file.as_mut() else {
            return;
        };
        let mut buf = [0u8; 16 * 1024];
        loop {
            match file.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
            }
            if self.pending.len() > ANNOUNCED_LINE_MAX_BYTES * 4 {
                break;
            }
        }
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let record = serde_json::from_slice::<serde_json::Value>(&line).ok();
            let Some(result) = record.and_then(|r| self.result(session, engine, &r, redact)) else {
                self.stopped = true;
                return;
            };
            self.sent += 1;
            sink(SessionEvent::Result(Box::new(result)));
        }
        if self.pending.len() > ANNOUNCED_LINE_MAX_BYTES {
            self.stopped = true;
        }
    }

    /// The result of one announced record, its format files read from the call's
    /// `files-N/` and released as `/out` files are; `None` when the record is not one
    /// the driver writes or a cap is reached (the rest then come with the call's end).
    fn result(
        &mut self,
        session: &Session,
        engine: &Engine,
        record: &serde_json::Value,
        redact: &dyn Fn(&str, usize) -> String,
    ) -> Option<RichResult> {
        if record["is_main_result"].as_bool() != Some(false) {
            return None;
        }
        let caps = out_caps(engine.policy());
        let mut released = Vec::new();
        for key in FILE_FORMATS {
            let Some(name) = record["formats"][key].as_str() else {
                continue;
            };
            // The driver's own names only (`display-3.html`, `figure-1.png`).
            let plain = !name.is_empty()
                && name.len() <= 64
                && !name.starts_with('.')
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !plain || self.files_sent >= caps.max_files {
                return None;
            }
            let content = session
                .with_workspace(|ws| {
                    ws.read_file(&format!("{}/{name}", self.files), caps.max_file_bytes)
                })
                .ok()?;
            let size = content.len() as u64;
            if self.bytes_sent + size > caps.max_bytes {
                return None;
            }
            self.files_sent += 1;
            self.bytes_sent += size;
            // A format the scan withholds (a secret in an image) is left out, as at the end.
            if let airlock_core::observation::WorkspaceFileRelease::Released { content, .. } =
                engine.release_workspace_file(name, content)
            {
                released.push(airlock_core::ReleasedFile {
                    path: name.to_owned(),
                    content,
                });
            }
        }
        Some(rich_result(record, &released, redact))
    }
}

/// The state of the call's context, made on first use (the default one at `/work`).
fn context_of<'a>(
    state: &'a mut CallState,
    call: &SessionCall,
) -> Result<&'a mut ContextState, SessionError> {
    let name = call.context.as_deref().unwrap_or(DEFAULT_CONTEXT);
    if name == DEFAULT_CONTEXT && !state.contexts.contains_key(DEFAULT_CONTEXT) {
        state.contexts.insert(
            DEFAULT_CONTEXT.to_owned(),
            ContextState::new(DEFAULT_CONTEXT, airlock_core::job::WORKDIR),
        );
    }
    state
        .contexts
        .get_mut(name)
        .ok_or_else(|| SessionError::Invalid(format!("no code context {name:?} in this session")))
}

/// The formats of a result record that are files the driver wrote, and how each is
/// given: text (redacted by the release), base64, or JSON.
const FILE_FORMATS: [&str; 9] = [
    "html",
    "markdown",
    "svg",
    "png",
    "jpeg",
    "pdf",
    "latex",
    "json",
    "javascript",
];

/// A result record of the driver's, with its formats read from the call's released
/// files (`files`: path and content after the release's caps and redaction).
fn rich_result(
    record: &serde_json::Value,
    files: &[airlock_core::ReleasedFile],
    redact: &dyn Fn(&str, usize) -> String,
) -> RichResult {
    let mut result = RichResult {
        text: record["text"].as_str().map(|t| redact(t, VALUE_MAX_BYTES)),
        is_main_result: record["is_main_result"].as_bool().unwrap_or(false),
        ..RichResult::default()
    };
    for key in FILE_FORMATS {
        let Some(name) = record["formats"][key].as_str() else {
            continue;
        };
        // A format whose file the release refused (a cap, a secret in an image) is left
        // out; the reason is in the observation's rejected files.
        let Some(file) = files.iter().find(|f| f.path == name) else {
            continue;
        };
        let text = || String::from_utf8_lossy(&file.content).into_owned();
        let base64 = || base64::engine::general_purpose::STANDARD.encode(&file.content);
        match key {
            "html" => result.html = Some(text()),
            "markdown" => result.markdown = Some(text()),
            "svg" => result.svg = Some(text()),
            "latex" => result.latex = Some(text()),
            "javascript" => result.javascript = Some(text()),
            "png" => result.png = Some(base64()),
            "jpeg" => result.jpeg = Some(base64()),
            "pdf" => result.pdf = Some(base64()),
            "json" => result.json = serde_json::from_slice(&file.content).ok(),
            _ => {}
        }
    }
    result
}

pub(super) async fn run_kernel_call(
    session: &Arc<Session>,
    state: &mut CallState,
    number: u64,
    call: SessionCall,
    wall: Duration,
    sink: Option<SessionSink>,
) -> Result<SessionRunResult, SessionError> {
    if let Some(language) = &call.language
        && language != "python"
    {
        return Err(SessionError::Invalid(format!(
            "language {language:?}: a kernel session runs python only; run other languages in a workspace session"
        )));
    }
    let engine = session.engine.clone();
    if let Err(e) = airlock_core::job::resolve_env(&call.env, engine.policy()) {
        return Err(match e.kind() {
            ErrorKind::PolicyDenied => SessionError::Denied(e.to_string()),
            _ => SessionError::Invalid(e.to_string()),
        });
    }
    let context = context_of(state, &call)?.clone();
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
        // A fresh kernel has no context's globals left to forget.
        state.forget.clear();
        let first = !state.kernel_started;
        start_kernel(session, state, number).await?;
        if first {
            // A lazy session's first kernel: nothing was lost.
            session.audit(serde_json::json!({"event": "session_kernel_started"}));
        } else {
            session.audit(serde_json::json!({"event": "session_kernel_restarted", "reason": why}));
            restarted = Some(why);
        }
    }
    let call_id = JobId::generate();
    let control = |name: &str| format!("{CONTROL_DIR}/{name}-{number}");
    let forget = std::mem::take(&mut state.forget);
    session.with_workspace(|ws| {
        ws.write_file(&format!("{}.py", control("call")), call.code.as_bytes())?;
        let order = serde_json::json!({
            "timeout": wall.as_secs_f64(),
            "html": call.html,
            "context": context.info.id,
            "cwd": context.info.cwd,
            "generation": context.generation,
            "forget": forget,
            "env": call.env,
        });
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
    if let Some(bell) = &kernel.bell {
        bell.ring();
    }
    let mut ending_rx = session.ending.subscribe();
    // The call's output as it is written: the same rendering, redaction and caps as a
    // job's stream.
    let limits = &engine.policy().limits;
    let streaming = sink.clone().map(|sink| {
        let output: crate::OutputSink = Arc::new(move |event| sink(SessionEvent::Output(event)));
        crate::redaction::Streaming::new(
            output,
            engine.redactor.clone(),
            [
                airlock_core::supervise::cap_bytes(limits.stdout),
                airlock_core::supervise::cap_bytes(limits.stderr),
            ],
        )
    });
    let tap = streaming.as_ref().map(crate::redaction::Streaming::tap);
    let mut tails = [
        (StreamKind::Stdout, "stdout"),
        (StreamKind::Stderr, "stderr"),
    ]
    .map(|(stream, ext)| Tail {
        rel: format!("{}.{ext}", control("out")),
        stream,
        file: None,
    });
    let redact = |text: &str, max: usize| -> String {
        let cut = airlock_core::capture::cut_at_most(text, max);
        engine
            .redact(&text[..cut])
            .map(|(t, _)| t)
            .unwrap_or_else(|| "[withheld: redaction unavailable]".to_owned())
    };
    let mut announced = Announced::new(format!("{}.jsonl", control("shown")), control("files"));
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
        if let Some(tap) = &tap {
            for tail in &mut tails {
                tail.pump(session, tap);
            }
        }
        if let Some(sink) = &sink {
            announced.pump(session, &engine, sink, &redact);
        }
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
        session.pause().await;
    };
    if let Some(streaming) = &streaming {
        streaming.flush();
    }
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
    let mut record = serde_json::Value::Null;
    if matches!(ended, Ended::Result) {
        // The call's figures and rich formats are its /out: the same caps, the same scan
        // for secrets, listed in the observation with their media types.
        let files = session.with_workspace(|ws| ws.open_dir(&control("files")));
        if let Ok(Some(dir)) = files {
            let released = airlock_host::out::release(&dir, out_caps(engine.policy()));
            report.out_files = released.files;
            report.out_rejected = released.rejected;
        }
        record = session
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
    }
    match ended {
        Ended::Result => {}
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
        ws.remove_file(&format!("{}.jsonl", control("shown")))?;
        ws.remove_dir_all(&control("files"))
    });
    let mut result = engine.render(call_id, report);
    let value = record["value"].as_str().map(|v| redact(v, VALUE_MAX_BYTES));
    let error = record["error"]["name"].as_str().map(|name| CellError {
        name: redact(name, 256),
        value: redact(record["error"]["value"].as_str().unwrap_or(""), 2000),
        traceback: redact(
            record["error"]["traceback"].as_str().unwrap_or(""),
            TRACEBACK_MAX_BYTES,
        ),
    });
    let results: Vec<RichResult> = record["results"]
        .as_array()
        .map(|records| {
            records
                .iter()
                .map(|r| rich_result(r, &result.files, &redact))
                .collect()
        })
        .unwrap_or_default();
    if let Some(sink) = &sink {
        // The ones announced while the call ran were sent then: they are its first.
        for r in results.iter().skip(announced.sent) {
            sink(SessionEvent::Result(Box::new(r.clone())));
        }
    }
    result.inline_files(engine.policy().filesystem.out.inline_bytes.as_u64());
    Ok(SessionRunResult {
        session_id: session.id.clone(),
        call: number,
        observation: result.observation,
        value,
        error,
        kernel_restarted: restarted,
        results,
        execution_count: record["execution_count"].as_u64(),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The modules a kernel imports before it is ready and in its warm-up are the list a
    /// zygote keeps for the sandboxes it forks for kernels: nothing the driver needs at once
    /// is left out (its start would import it), nothing else is kept.
    #[test]
    fn the_kernels_start_imports_are_the_modules_a_zygote_keeps_for_it() {
        let driver = super::KERNEL_DRIVER;
        let warm_up = driver
            .split("def _warm_up():")
            .nth(1)
            .and_then(|rest| rest.split("\ndef ").next())
            .expect("the driver has _warm_up");
        let top_level = driver.lines().filter(|l| l.starts_with("import "));
        let in_warm_up = warm_up
            .lines()
            .map(str::trim_start)
            .filter(|l| l.starts_with("import "));
        let imported: BTreeSet<&str> = top_level
            .chain(in_warm_up)
            .flat_map(|l| l["import ".len()..].split(','))
            .map(str::trim)
            .collect();
        let kept: BTreeSet<&str> = airlock_core::warm::python::KERNEL_MODULES
            .iter()
            .copied()
            .collect();
        assert_eq!(imported, kept);
    }
}
