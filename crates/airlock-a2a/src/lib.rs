//! airlock-a2a presents airlock as an A2A agent (the agent-to-agent protocol, revision
//! 1.0, JSON-RPC binding): an Agent Card with one `run_code` skill, and `SendMessage`,
//! `SendStreamingMessage`, `GetTask` and `CancelTask`. A message's code becomes a job on
//! the same [`Executor`] MCP uses (so the same request model, admission, tenant and
//! audit); the observation comes back as the task's artifacts; a cancel drops the job's
//! future, which kills the job. It must not authenticate (the HTTP server's layer does and
//! puts the tenant in the request's extensions) nor run jobs itself.
#![forbid(unsafe_code)]

pub mod card;
pub mod tasks;

use std::sync::Arc;

use airlock_core::request::{RunRequest, TOOL_DOOR};
use airlock_core::{ErrorKind, JobResult, Observation, Outcome, Policy};
use airlock_mcp::{AuthenticatedTenant, Executor};
use axum::extract::{Request, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use futures_util::StreamExt;
use serde_json::{Map, Value, json};

pub use tasks::{TaskState, Tasks};

/// The path of the JSON-RPC endpoint.
pub const RPC_PATH: &str = "/a2a";

/// The A2A protocol revision served.
pub const PROTOCOL_VERSION: &str = "1.0";

/// JSON-RPC and A2A error codes (A2A 1.0, section "JSON-RPC error codes").
pub mod codes {
    /// The body is not JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// Not a JSON-RPC request.
    pub const INVALID_REQUEST: i64 = -32600;
    /// No such method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Bad parameters.
    pub const INVALID_PARAMS: i64 = -32602;
    /// The server failed.
    pub const INTERNAL: i64 = -32603;
    /// No such task (or not the caller's).
    pub const TASK_NOT_FOUND: i64 = -32001;
    /// The task already ended.
    pub const TASK_NOT_CANCELABLE: i64 = -32002;
    /// Push notifications are not offered.
    pub const PUSH_NOTIFICATION_NOT_SUPPORTED: i64 = -32003;
    /// A method airlock does not offer.
    pub const UNSUPPORTED_OPERATION: i64 = -32004;
    /// A part airlock cannot run.
    pub const CONTENT_TYPE_NOT_SUPPORTED: i64 = -32005;
}

/// A JSON-RPC error.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// Its code ([`codes`]).
    pub code: i64,
    /// What went wrong, for the caller.
    pub message: String,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// The A2A agent: the executor jobs run on and the tasks it keeps.
#[derive(Clone)]
pub struct A2aAgent {
    executor: Arc<dyn Executor>,
    tasks: Arc<Tasks>,
    authenticated: bool,
    max_body_bytes: usize,
}

impl std::fmt::Debug for A2aAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("A2aAgent").finish_non_exhaustive()
    }
}

fn tenant_of(request: &Request) -> Option<String> {
    request
        .extensions()
        .get::<AuthenticatedTenant>()
        .map(|t| t.0.clone())
}

/// The message's code as a run request: a `data` part holding the run request's fields
/// (`code`, `language`, `files`, `timeout_s`, `return_files`), or else the text parts
/// joined, run in the policy's default language with `/out` returned.
fn run_request(message: &Value) -> Result<RunRequest, RpcError> {
    let parts = message
        .get("parts")
        .and_then(Value::as_array)
        .ok_or_else(|| RpcError::new(codes::INVALID_PARAMS, "message.parts: missing"))?;
    if let Some(data) = parts.iter().find_map(|p| p.get("data")) {
        let Value::Object(object) = data.clone() else {
            return Err(RpcError::new(
                codes::INVALID_PARAMS,
                "a data part must be an object with the run request's fields (code, language, files, timeout_s, return_files)",
            ));
        };
        return RunRequest::from_door(&TOOL_DOOR, object, &[])
            .map_err(|e| RpcError::new(codes::INVALID_PARAMS, format!("data part: {e}")));
    }
    let texts: Vec<&str> = parts
        .iter()
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect();
    if texts.is_empty() {
        return Err(RpcError::new(
            codes::CONTENT_TYPE_NOT_SUPPORTED,
            "the message has no code: send it as a text part, or as a data part {\"code\": ..., \"language\": ...}",
        ));
    }
    let mut object = Map::new();
    object.insert("code".to_owned(), Value::String(texts.join("\n")));
    object.insert("return_files".to_owned(), Value::Bool(true));
    RunRequest::from_door(&TOOL_DOOR, object, &[])
        .map_err(|e| RpcError::new(codes::INVALID_PARAMS, e.to_string()))
}

/// The task's artifacts for a job's result: the observation (a `data` part), stdout and
/// stderr (text parts, when not empty) and each `/out` file inlined (a `raw` part).
pub fn artifacts(result: &JobResult) -> Vec<Value> {
    let observation = &result.observation;
    let mut artifacts = vec![json!({
        "artifactId": "observation",
        "name": "observation",
        "description": "airlock's observation of the job (ok, outcome, exit_code, stdout, stderr, files, limits)",
        "parts": [{"data": serde_json::to_value(observation).unwrap_or(Value::Null), "mediaType": "application/json"}],
    })];
    for (name, text) in [
        ("stdout", &observation.stdout),
        ("stderr", &observation.stderr),
    ] {
        if !text.is_empty() {
            artifacts.push(json!({
                "artifactId": name, "name": name,
                "parts": [{"text": text, "mediaType": "text/plain"}],
            }));
        }
    }
    for (listed, released) in observation.files.iter().zip(&result.files) {
        if listed.path != released.path || listed.content_base64.is_none() {
            continue;
        }
        artifacts.push(json!({
            "artifactId": format!("out/{}", listed.path),
            "name": listed.path,
            "parts": [{
                "raw": base64::engine::general_purpose::STANDARD.encode(&released.content),
                "filename": listed.path,
                "mediaType": listed.media_type,
            }],
        }));
    }
    artifacts
}

/// The terminal state of a job: `completed` when it ran (whatever its exit; the
/// observation says how it went), `failed` when it could not run.
pub fn final_state(observation: &Observation) -> TaskState {
    if observation.outcome == Outcome::Error {
        TaskState::Failed
    } else {
        TaskState::Completed
    }
}

/// One line for the task's status message.
fn summary(observation: &Observation) -> String {
    match (
        &observation.outcome,
        observation.exit_code,
        &observation.error,
    ) {
        (Outcome::Error, _, Some(error)) => format!("the job could not run: {}", error.message),
        (Outcome::Exited, Some(code), _) => format!("the program exited with code {code}"),
        (outcome, _, _) => format!(
            "the job ended: {}",
            serde_json::to_value(outcome)
                .unwrap_or_default()
                .as_str()
                .unwrap_or("?")
        ),
    }
}

impl A2aAgent {
    /// An agent whose jobs run on `executor`; `authenticated` says whether callers need a
    /// bearer token (the card says so). A request body past `max_body_bytes` is refused.
    pub fn new(executor: Arc<dyn Executor>, authenticated: bool, max_body_bytes: usize) -> Self {
        Self {
            executor,
            tasks: Arc::new(Tasks::default()),
            authenticated,
            max_body_bytes,
        }
    }

    /// The policy a tenant's jobs run under.
    pub fn policy(&self, tenant: Option<&str>) -> Arc<Policy> {
        self.executor.policy(tenant)
    }

    /// Starts the job of `message` as a task of `tenant`; returns its id.
    fn start(&self, params: &Value, tenant: Option<String>) -> Result<String, RpcError> {
        let message = params
            .get("message")
            .ok_or_else(|| RpcError::new(codes::INVALID_PARAMS, "params.message: missing"))?;
        if message
            .get("taskId")
            .and_then(Value::as_str)
            .is_some_and(|t| !t.is_empty())
        {
            return Err(RpcError::new(
                codes::UNSUPPORTED_OPERATION,
                "each message is a new job: a task takes no further messages (omit taskId)",
            ));
        }
        let policy = self.executor.policy(tenant.as_deref());
        let request = run_request(message)?;
        let return_files = request.return_files;
        let context_id = message
            .get("contextId")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty())
            .map_or_else(|| uuid::Uuid::now_v7().to_string(), str::to_owned);
        let (id, cancel) = self
            .tasks
            .insert(tenant.clone(), context_id, message.clone())
            .map_err(|e| RpcError::new(codes::INTERNAL, e))?;
        let executor = self.executor.clone();
        let tasks = self.tasks.clone();
        let task_id = id.clone();
        tokio::spawn(async move {
            let job = match request.into_job(&policy) {
                Ok(job) => job,
                Err(e) => {
                    let observation = airlock_engine::early_error(
                        ErrorKind::InvalidInput,
                        format!("message: {e}"),
                        &policy.version,
                    );
                    tasks.finish(
                        &task_id,
                        TaskState::Failed,
                        summary(&observation),
                        artifacts(&airlock_mcp::observation_only(observation)),
                    );
                    return;
                }
            };
            // Dropping the run's future kills the job (the Executor's contract): a cancel
            // ends the select with the job still running, which drops it.
            tokio::select! {
                mut result = executor.run(job, tenant) => {
                    if return_files {
                        result.inline_files(policy.filesystem.out.inline_bytes.as_u64());
                    }
                    let state = final_state(&result.observation);
                    tasks.finish(&task_id, state, summary(&result.observation), artifacts(&result));
                }
                () = cancel.cancelled() => {
                    tracing::info!(task = %task_id, "A2A task cancelled: its job was killed");
                }
            }
        });
        Ok(id)
    }

    /// Handles one JSON-RPC request body; `None` for a streaming request (see
    /// [`A2aAgent::stream`]).
    pub async fn handle(&self, body: &Value, tenant: Option<String>) -> Result<Value, RpcError> {
        let method = body
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let params = body
            .get("params")
            .cloned()
            .unwrap_or(Value::Object(Map::new()));
        match method {
            "SendMessage" => {
                let id = self.start(&params, tenant.clone())?;
                let immediately = params
                    .pointer("/configuration/returnImmediately")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                if !immediately {
                    self.tasks.wait_final(&id).await;
                }
                let task = self
                    .tasks
                    .get(&id, tenant.as_deref())
                    .ok_or_else(|| RpcError::new(codes::TASK_NOT_FOUND, "the task expired"))?;
                Ok(json!({"task": task}))
            }
            "GetTask" => {
                let id = task_id(&params)?;
                self.tasks
                    .get(id, tenant.as_deref())
                    .ok_or_else(|| not_found(id))
            }
            "CancelTask" => {
                let id = task_id(&params)?;
                match self.tasks.cancel(id, tenant.as_deref()) {
                    tasks::Cancel::NotFound => Err(not_found(id)),
                    tasks::Cancel::AlreadyFinal(state) => Err(RpcError::new(
                        codes::TASK_NOT_CANCELABLE,
                        format!("task {id} already ended ({})", state.as_str()),
                    )),
                    tasks::Cancel::Cancelled(task) => Ok(task),
                }
            }
            "CreateTaskPushNotificationConfig"
            | "GetTaskPushNotificationConfig"
            | "ListTaskPushNotificationConfigs"
            | "DeleteTaskPushNotificationConfig" => Err(RpcError::new(
                codes::PUSH_NOTIFICATION_NOT_SUPPORTED,
                "airlock sends no push notifications: poll GetTask or use SendStreamingMessage",
            )),
            "ListTasks" | "SubscribeToTask" | "GetExtendedAgentCard" => Err(RpcError::new(
                codes::UNSUPPORTED_OPERATION,
                format!(
                    "{method} is not offered: SendMessage, SendStreamingMessage, GetTask and CancelTask are"
                ),
            )),
            "" => Err(RpcError::new(
                codes::INVALID_REQUEST,
                "not a JSON-RPC request: method missing",
            )),
            other => Err(RpcError::new(
                codes::METHOD_NOT_FOUND,
                format!("no method {other:?}"),
            )),
        }
    }

    /// `SendStreamingMessage`: the task as it starts, then each artifact, then its final
    /// status, each as a JSON-RPC response on the SSE stream. Closing the stream does not
    /// cancel the task (CancelTask does).
    pub fn stream(
        &self,
        rpc_id: Value,
        params: &Value,
        tenant: Option<String>,
    ) -> Result<impl futures_util::Stream<Item = Value> + Send + 'static, RpcError> {
        let id = self.start(params, tenant.clone())?;
        let first = self.tasks.get(&id, tenant.as_deref());
        let tasks = self.tasks.clone();
        let envelope =
            move |result: Value| json!({"jsonrpc": "2.0", "id": rpc_id.clone(), "result": result});
        let start = futures_util::stream::iter(first.map(|task| envelope(json!({"task": task}))));
        let rest = futures_util::stream::once(async move {
            tasks.wait_final(&id).await;
            let Some(task) = tasks.get(&id, tenant.as_deref()) else {
                return Vec::new();
            };
            let context = task["contextId"].clone();
            let mut events: Vec<Value> = task["artifacts"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|artifact| {
                    envelope(json!({"artifactUpdate": {
                        "taskId": id, "contextId": context, "artifact": artifact,
                        "append": false, "lastChunk": true,
                    }}))
                })
                .collect();
            events.push(envelope(json!({"statusUpdate": {
                "taskId": id, "contextId": context, "status": task["status"],
            }})));
            events
        })
        .flat_map(futures_util::stream::iter);
        Ok(start.chain(rest))
    }
}

fn task_id(params: &Value) -> Result<&str, RpcError> {
    params
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::new(codes::INVALID_PARAMS, "params.id (the task id): missing"))
}

fn not_found(id: &str) -> RpcError {
    RpcError::new(
        codes::TASK_NOT_FOUND,
        format!(
            "no task {id:?} (a task is kept for 15 minutes after it ends, for the caller that sent it)"
        ),
    )
}

fn rpc_error(id: Value, error: &RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": error.code, "message": error.message}})
}

/// `POST /a2a`: one JSON-RPC request (batches are not part of A2A).
pub async fn post_rpc(State(agent): State<A2aAgent>, request: Request) -> Response {
    let tenant = tenant_of(&request);
    let body = match axum::body::to_bytes(request.into_body(), agent.max_body_bytes).await {
        Ok(body) => body,
        Err(e) => {
            let error = RpcError::new(codes::INVALID_REQUEST, format!("read the body: {e}"));
            return axum::Json(rpc_error(Value::Null, &error)).into_response();
        }
    };
    let body: Value = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(e) => {
            let error = RpcError::new(codes::PARSE_ERROR, format!("the body is not JSON: {e}"));
            return axum::Json(rpc_error(Value::Null, &error)).into_response();
        }
    };
    let id = body.get("id").cloned().unwrap_or(Value::Null);
    if body.get("method").and_then(Value::as_str) == Some("SendStreamingMessage") {
        let params = body.get("params").cloned().unwrap_or_default();
        return match agent.stream(id.clone(), &params, tenant) {
            Ok(events) => Sse::new(events.map(|event| {
                Ok::<_, std::convert::Infallible>(Event::default().data(event.to_string()))
            }))
            .keep_alive(KeepAlive::default())
            .into_response(),
            Err(error) => axum::Json(rpc_error(id, &error)).into_response(),
        };
    }
    match agent.handle(&body, tenant).await {
        Ok(result) => {
            axum::Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
        }
        Err(error) => axum::Json(rpc_error(id, &error)).into_response(),
    }
}

/// `GET /.well-known/agent-card.json`: the card, its interface URL on the host the caller
/// reached.
pub async fn get_card(State(agent): State<A2aAgent>, request: Request) -> Response {
    let host = request
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1")
        .to_owned();
    let scheme = request
        .headers()
        .get("x-forwarded-proto")
        .and_then(|h| h.to_str().ok())
        .filter(|p| *p == "https")
        .unwrap_or("http");
    let url = format!("{scheme}://{host}{RPC_PATH}");
    let policy = agent.policy(None);
    axum::Json(card::agent_card(&url, &policy, agent.authenticated)).into_response()
}

/// The JSON-RPC route ([`RPC_PATH`]); the caller authenticates it.
pub fn rpc_router<S: Clone + Send + Sync + 'static>(agent: A2aAgent) -> axum::Router<S> {
    axum::Router::new()
        .route(RPC_PATH, axum::routing::post(post_rpc))
        .with_state(agent)
}

/// The Agent Card's route, public (a client reads it before it has a token).
pub fn card_router<S: Clone + Send + Sync + 'static>(agent: A2aAgent) -> axum::Router<S> {
    axum::Router::new()
        .route(card::CARD_PATH, axum::routing::get(get_card))
        .with_state(agent)
}
