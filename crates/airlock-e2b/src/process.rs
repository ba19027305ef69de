//! envd's process service: `Start` runs a command as a fresh hardened sandbox (the
//! engine's job, language `bash`) over the sandbox's workspace and streams its output as
//! Connect events while it runs: `start{pid}`, `data{stdout|stderr}`…, `keepalive`, then
//! `end{exitCode, exited, status, error}` and the end of the stream. `SendSignal` kills a
//! command (its whole sandbox); `List` names the running ones. A command never outlives
//! the policy's wall time, whether the SDK waits on it or runs it in the background.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use airlock_core::policy::NetworkMode;
use airlock_core::{JobRequest, LimitsRequest, NetworkRequest, Observation, Outcome, StreamKind};
use airlock_engine::{OutputEvent, OutputSink};
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use base64::Engine as _;
use bytes::Bytes;
use futures_util::StreamExt as _;
use http::header::CONTENT_TYPE;
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};

use crate::E2b;
use crate::registry::{RunningCommand, Sandbox, audit};
use crate::wire::{
    CONNECT_JSON_STREAM, ConnectCode, END_STREAM_FLAG, RpcError, envelope, single_message,
    stream_response,
};

/// The language commands run as (`/bin/bash -l -c CMD` in E2B).
pub const COMMAND_LANGUAGE: &str = "bash";
/// Keep-alive interval when the client names none (the SDKs send 50 s).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(50);
/// Frames buffered toward a slow client.
const FRAME_BUFFER: usize = 256;

#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct ProcessConfig {
    cmd: String,
    args: Vec<String>,
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct StartRequest {
    process: ProcessConfig,
    pty: Option<serde_json::Value>,
    stdin: Option<bool>,
    tag: Option<String>,
}

/// A POSIX shell single-quoted word.
pub fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// The directory a command starts in, inside its sandbox: E2B's home, `/work` and relative
/// paths are the workspace's (`/work/...`); any other absolute path is that directory of
/// the sandbox's own root (`/`, `/tmp`), which the command could `cd` to itself, so
/// nothing outside the sandbox is reachable through it (the Agents SDK's E2B client
/// prepares its workspace with `cwd="/"`). `..` is refused everywhere.
fn command_dir(cwd: Option<&str>) -> Result<String, crate::wire::ApiError> {
    let Some(cwd) = cwd.filter(|c| !c.is_empty()) else {
        return Ok(crate::paths::WORK.to_owned());
    };
    match crate::paths::to_workspace(cwd) {
        Ok(rel) if rel.is_empty() => Ok(crate::paths::WORK.to_owned()),
        Ok(rel) => Ok(format!("{}/{rel}", crate::paths::WORK)),
        Err(refused) => {
            // What the workspace's own rules refuse there stays refused.
            let in_workspace = [crate::paths::E2B_HOME, crate::paths::WORK]
                .iter()
                .any(|dir| cwd == *dir || cwd.starts_with(&format!("{dir}/")));
            let elsewhere_in_sandbox = cwd.starts_with('/')
                && !in_workspace
                && !cwd.split('/').any(|s| s == "..")
                && !cwd.contains('\0');
            if elsewhere_in_sandbox {
                Ok(cwd.to_owned())
            } else {
                Err(refused)
            }
        }
    }
}

/// The bash script of a command: E2B's `/bin/bash -l -c CMD` is CMD itself; anything
/// else is its argv, quoted and exec'd. Its directory ([`command_dir`]) is entered first.
fn script(config: &ProcessConfig, dir: &str) -> String {
    let is_bash = matches!(config.cmd.as_str(), "/bin/bash" | "bash" | "/bin/sh" | "sh");
    let body = match config.args.as_slice() {
        [flag, c, cmd] if is_bash && flag == "-l" && c == "-c" => cmd.clone(),
        [c, cmd] if is_bash && c == "-c" => cmd.clone(),
        args => std::iter::once(&config.cmd)
            .chain(args)
            .map(|w| shell_quote(w))
            .collect::<Vec<_>>()
            .join(" ")
            .replacen("", "exec ", 1),
    };
    let cd = format!("cd {} || exit 1\n", shell_quote(dir));
    format!("{cd}{body}\n")
}

/// What the stream forwards.
enum Event {
    Output(OutputEvent),
    Done(Box<Observation>),
}

fn header<'a>(request: &'a Request, name: &str) -> Option<&'a str> {
    request.headers().get(name).and_then(|v| v.to_str().ok())
}

fn event_frame(event: serde_json::Value) -> Bytes {
    envelope(
        0,
        serde_json::json!({"event": event}).to_string().as_bytes(),
    )
}

fn data_frame(stream: StreamKind, text: &str) -> Bytes {
    let name = match stream {
        StreamKind::Stdout => "stdout",
        StreamKind::Stderr => "stderr",
    };
    let encoded = base64::engine::general_purpose::STANDARD.encode(text.as_bytes());
    event_frame(serde_json::json!({"data": {name: encoded}}))
}

/// The `end` event of an observation.
fn end_event(observation: &Observation) -> serde_json::Value {
    let exit_code = observation.exit_code.unwrap_or(-1);
    match observation.outcome {
        Outcome::Exited => serde_json::json!({"end": {
            "exitCode": exit_code, "exited": true, "status": format!("exit status {exit_code}"),
        }}),
        Outcome::Timeout => serde_json::json!({"end": {
            "exitCode": exit_code, "exited": false, "status": "signal: killed",
            "error": format!("the command passed its wall time ({} ms, the policy's ceiling or the request's deadline) and was killed", observation.duration_ms),
        }}),
        Outcome::Oom => serde_json::json!({"end": {
            "exitCode": exit_code, "exited": false, "status": "signal: killed",
            "error": "the command's sandbox ran out of memory (the policy's memory limit) and was killed",
        }}),
        Outcome::OutputLimit => serde_json::json!({"end": {
            "exitCode": exit_code, "exited": false, "status": "signal: killed",
            "error": "the command wrote more than the policy's flood limit and was killed",
        }}),
        Outcome::Killed => serde_json::json!({"end": {
            "exitCode": exit_code, "exited": false,
            "status": format!("signal: {}", observation.signal.as_deref().unwrap_or("killed")),
        }}),
        Outcome::Error => serde_json::json!({"end": {
            "exitCode": -1, "exited": false, "status": "signal: killed",
            "error": observation.error.as_ref().map_or("the command did not run", |e| e.message.as_str()),
        }}),
    }
}

/// `process.Process/Start`. The command is an `e2b command` span in the trace of the
/// request's `traceparent` (docs/telemetry.md), its job the span's child.
pub async fn start(e2b: E2b, sandbox: Arc<Sandbox>, request: Request) -> Response {
    let caller = crate::envd::caller_of(&request, &sandbox);
    let operation = airlock_telemetry::Operation::start(
        "e2b command",
        &caller,
        crate::envd::span_attributes(&sandbox),
    );
    match prepare(&e2b, &sandbox, request).await {
        Ok(prepared) => run(e2b, sandbox, prepared, operation, caller),
        Err(e) => {
            operation.fail(e.code.as_str());
            operation.end();
            e.stream_response()
        }
    }
}

struct Prepared {
    job: JobRequest,
    /// Whether the job's wall time is the client's deadline (shorter than the policy's):
    /// a command it kills ends the stream with Connect's `deadline_exceeded`, which the
    /// SDKs raise as their timeout error, as envd does.
    client_deadline: bool,
    engine: Arc<airlock_engine::Engine>,
    keepalive: Duration,
    cmd: String,
    args: Vec<String>,
}

async fn prepare(e2b: &E2b, sandbox: &Sandbox, request: Request) -> Result<Prepared, RpcError> {
    let content_type = header(&request, CONTENT_TYPE.as_str()).unwrap_or("");
    if !content_type.starts_with(CONNECT_JSON_STREAM) {
        return Err(RpcError::new(
            ConnectCode::InvalidArgument,
            format!(
                "content type {content_type:?}: airlock answers Connect streams with the JSON codec ({CONNECT_JSON_STREAM}) only"
            ),
        ));
    }
    let deadline = header(&request, "connect-timeout-ms")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_millis);
    let keepalive = header(&request, "keepalive-ping-interval")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_KEEPALIVE, |s| Duration::from_secs(s.clamp(1, 300)));
    let body = crate::envd::read_body(e2b, request).await?;
    let message = single_message(&body)?;
    let order: StartRequest = serde_json::from_slice(message)
        .map_err(|e| RpcError::new(ConnectCode::InvalidArgument, format!("the message: {e}")))?;
    if order.pty.as_ref().is_some_and(|p| !p.is_null()) {
        return Err(RpcError::unsupported("PTY (terminals)"));
    }
    if order.stdin == Some(true) {
        return Err(RpcError::unsupported(
            "stdin to a command (commands.run(..., stdin=True))",
        ));
    }
    if order.tag.is_some() {
        return Err(RpcError::unsupported("tagged processes"));
    }
    if order.process.cmd.is_empty() {
        return Err(RpcError::new(
            ConnectCode::InvalidArgument,
            "the process needs a cmd",
        ));
    }
    let dir = command_dir(order.process.cwd.as_deref())?;
    let sessions = e2b
        .host
        .sessions()
        .map_err(|e| RpcError::from(crate::control::session_error(&e)))?;
    // The session's engine: the template's (its own root and memory, when it names them).
    let (engine, dirs) = sessions
        .job_workspace(&sandbox.session_tenant, &sandbox.session_id)
        .map_err(|e| RpcError::from(crate::control::session_error(&e)))?;
    let policy = engine.policy();
    if policy.language(COMMAND_LANGUAGE).is_none() {
        return Err(RpcError::new(
            ConnectCode::InvalidArgument,
            format!(
                "commands run as the policy's {COMMAND_LANGUAGE:?} language, which this policy does not define"
            ),
        ));
    }
    let mut env = sandbox.envs.clone();
    env.extend(order.process.envs.clone());
    for name in env.keys() {
        if !policy.env.allow.iter().any(|a| a == name) {
            return Err(RpcError::new(
                ConnectCode::InvalidArgument,
                format!(
                    "environment variable {name:?} is not allowed by the policy's [env] allow list"
                ),
            ));
        }
    }
    let ceiling = policy.limits.timeout;
    let timeout = deadline
        .filter(|d| *d < ceiling)
        .map(|d| d.max(airlock_core::policy::bounds::TIMEOUT_MIN));
    let job = JobRequest {
        language: COMMAND_LANGUAGE.to_owned(),
        source: script(&order.process, &dir).into_bytes(),
        limits: LimitsRequest {
            timeout,
            ..Default::default()
        },
        network: NetworkRequest {
            mode: if sandbox.internet {
                NetworkRequest::default().mode
            } else {
                NetworkMode::None
            },
            ..Default::default()
        },
        env,
        workspace: Some(dirs.workspace),
        // The sandbox's own /tmp, as on E2B: what one command leaves there the next sees.
        session_tmp: dirs.tmp,
        ..Default::default()
    };
    Ok(Prepared {
        client_deadline: timeout.is_some(),
        job,
        engine,
        keepalive,
        cmd: order.process.cmd,
        args: order.process.args,
    })
}

fn run(
    e2b: E2b,
    sandbox: Arc<Sandbox>,
    prepared: Prepared,
    operation: airlock_telemetry::Operation,
    caller: airlock_telemetry::Caller,
) -> Response {
    let pid = sandbox.next_pid();
    operation.set(airlock_telemetry::KeyValue::new(
        "airlock.e2b.pid",
        i64::from(pid),
    ));
    let (kill_tx, kill_rx) = oneshot::channel::<String>();
    sandbox
        .commands
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(
            pid,
            RunningCommand {
                cmd: prepared.cmd,
                args: prepared.args,
                kill: Some(kill_tx),
            },
        );
    let (events_tx, mut events_rx) = mpsc::unbounded_channel::<Event>();
    let sink: OutputSink = {
        let events_tx = events_tx.clone();
        Arc::new(move |event: OutputEvent| {
            let _ = events_tx.send(Event::Output(event));
        })
    };
    // The job runs to its end whether or not the client stays (a background command),
    // within the policy's wall time; a kill ends it sooner.
    {
        let sandbox = sandbox.clone();
        let e2b = e2b.clone();
        let engine = prepared.engine;
        let job = prepared.job;
        let caller = operation.child_caller(caller);
        tokio::spawn(airlock_telemetry::with_caller(caller, async move {
            let result = engine
                .run_until(
                    job,
                    sandbox.tenant.clone(),
                    async move {
                        kill_rx
                            .await
                            .unwrap_or_else(|_| "the sandbox ended".to_owned())
                    },
                    Some(sink),
                )
                .await;
            sandbox
                .commands
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&pid);
            let observation = result.observation;
            audit(
                e2b.host.as_ref(),
                &sandbox,
                serde_json::json!({
                    "event": "e2b_command",
                    "pid": pid,
                    "job_id": observation.job_id,
                    "outcome": observation.outcome,
                    "exit_code": observation.exit_code,
                    "duration_ms": observation.duration_ms,
                }),
            );
            operation.record_job(&observation);
            operation.end();
            let _ = events_tx.send(Event::Done(Box::new(observation)));
        }));
    }
    let (frames_tx, frames_rx) = mpsc::channel::<Bytes>(FRAME_BUFFER);
    let keepalive = prepared.keepalive;
    let client_deadline = prepared.client_deadline;
    tokio::spawn(async move {
        if frames_tx
            .send(event_frame(serde_json::json!({"start": {"pid": pid}})))
            .await
            .is_err()
        {
            return;
        }
        let mut tick = tokio::time::interval(keepalive);
        tick.tick().await;
        loop {
            let frame = tokio::select! {
                event = events_rx.recv() => match event {
                    Some(Event::Output(output)) => data_frame(output.stream, &output.text),
                    Some(Event::Done(observation)) => {
                        if client_deadline && observation.outcome == Outcome::Timeout {
                            let end = RpcError::new(
                                ConnectCode::DeadlineExceeded,
                                format!("the command passed the request's deadline ({} ms) and was killed", observation.duration_ms),
                            );
                            let _ = frames_tx.send(envelope(END_STREAM_FLAG, serde_json::json!({"error": end.to_json()}).to_string().as_bytes())).await;
                            return;
                        }
                        let _ = frames_tx.send(event_frame(end_event(&observation))).await;
                        let _ = frames_tx.send(envelope(END_STREAM_FLAG, b"{}")).await;
                        return;
                    }
                    None => {
                        let end = RpcError::new(ConnectCode::Internal, "the command's job ended without an answer");
                        let _ = frames_tx.send(envelope(END_STREAM_FLAG, serde_json::json!({"error": end.to_json()}).to_string().as_bytes())).await;
                        return;
                    }
                },
                _ = tick.tick() => event_frame(serde_json::json!({"keepalive": {}})),
            };
            if frames_tx.send(frame).await.is_err() {
                // The client left: the command goes on (as a background one) until its
                // end or a kill; nobody reads its output.
                return;
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(frames_rx)
        .map(Ok::<Bytes, std::convert::Infallible>);
    stream_response(Body::from_stream(stream))
}

/// `process.Process/SendSignal`: any signal kills the command's whole sandbox.
pub fn send_signal(
    sandbox: &Sandbox,
    body: serde_json::Value,
) -> Result<serde_json::Value, RpcError> {
    let pid = body
        .pointer("/process/pid")
        .and_then(serde_json::Value::as_u64)
        .and_then(|p| u32::try_from(p).ok())
        .ok_or_else(|| {
            RpcError::new(
                ConnectCode::InvalidArgument,
                "the message needs process.pid (tags are not supported by airlock)",
            )
        })?;
    let signal = body.get("signal").map_or_else(
        || "SIGKILL".to_owned(),
        |s| s.to_string().trim_matches('"').to_owned(),
    );
    if sandbox.kill_command(pid, &format!("killed by {signal} from the client")) {
        Ok(serde_json::json!({}))
    } else {
        Err(RpcError::new(
            ConnectCode::NotFound,
            format!("process with pid {pid} not found"),
        ))
    }
}

/// `process.Process/List`.
pub fn list(sandbox: &Sandbox) -> serde_json::Value {
    let commands = sandbox
        .commands
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let mut processes: Vec<serde_json::Value> = commands
        .iter()
        .map(|(pid, c)| {
            serde_json::json!({
                "pid": pid,
                "config": {"cmd": c.cmd, "args": c.args, "envs": {}, "cwd": crate::paths::E2B_HOME},
            })
        })
        .collect();
    processes.sort_by_key(|p| p["pid"].as_u64());
    serde_json::json!({"processes": processes})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2b_bash_commands_become_the_script_others_are_quoted() {
        let e2b_style = ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-l".into(), "-c".into(), "echo hi && ls".into()],
            ..Default::default()
        };
        assert_eq!(
            script(&e2b_style, "/work"),
            "cd '/work' || exit 1\necho hi && ls\n"
        );
        let argv = ProcessConfig {
            cmd: "printf".into(),
            args: vec!["%s".into(), "it's".into()],
            ..Default::default()
        };
        assert_eq!(
            script(&argv, &command_dir(Some("/home/user/sub dir")).unwrap()),
            "cd '/work/sub dir' || exit 1\nexec 'printf' '%s' 'it'\\''s'\n"
        );
    }

    #[test]
    fn a_command_starts_in_the_workspace_or_a_directory_of_its_own_sandbox() {
        for (cwd, dir) in [
            (None, "/work"),
            (Some(""), "/work"),
            (Some("/home/user"), "/work"),
            (Some("~/a"), "/work/a"),
            (Some("a/b"), "/work/a/b"),
            (Some("/work/a"), "/work/a"),
            (Some("/"), "/"),
            (Some("/tmp"), "/tmp"),
        ] {
            assert_eq!(command_dir(cwd).unwrap(), dir, "{cwd:?}");
        }
        for refused in [
            "/tmp/../etc",
            "/home/user/../x",
            "../x",
            "a/../../b",
            "/work/.airlock/x",
        ] {
            assert!(command_dir(Some(refused)).is_err(), "{refused}");
        }
    }

    #[test]
    fn end_events_carry_the_exit() {
        let mut obs = airlock_engine::early_error(airlock_core::ErrorKind::Internal, "x", "t");
        obs.outcome = Outcome::Exited;
        obs.exit_code = Some(3);
        let end = end_event(&obs);
        assert_eq!(end["end"]["exitCode"], 3);
        assert_eq!(end["end"]["exited"], true);
        let frame = data_frame(StreamKind::Stdout, "hi");
        let payload: serde_json::Value = serde_json::from_slice(&frame[5..]).unwrap();
        assert_eq!(payload["event"]["data"]["stdout"], "aGk=");
    }
}
