//! airlock-mcp owns airlock's Model Context Protocol tool server: one `run_code` tool
//! whose result is the observation JSON (`isError` when `ok` is false), served over stdio
//! (`airlock mcp`) or as a service the HTTP server mounts at `/mcp` (streamable HTTP).
//! It turns tool calls into jobs and hands them to an [`Executor`]; it must not run jobs
//! itself, decide admission or authentication (the executor and the HTTP server do), or
//! write anything but MCP messages to stdout. A call the client gives up on (cancelled,
//! timed out, disconnected, stdin closed) drops its job's future, which the executor
//! turns into a kill: an abandoned call never keeps its slot.
#![forbid(unsafe_code)]

pub mod error;
pub mod resources;
pub mod tasks;
pub mod tool;

use std::sync::Arc;

use airlock_core::request::RunRequest;
use airlock_core::units::format_duration;
use airlock_core::{BoxFuture, ErrorKind, JobRequest, JobResult, Observation, Policy};
use airlock_engine::Engine;
use airlock_engine::sessions::{SessionCall, SessionError, SessionInfo, SessionRunResult};
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
    ContentBlock, ErrorCode, GetTaskParams, GetTaskResult, Implementation,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate, ServerCapabilities, ServerConfig, Tool, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

pub use error::McpError;
pub use resources::OutResources;
pub use tasks::TaskStore;
pub use tool::{RunCodeArguments, TOOL_NAME};

/// The tenant a request was authenticated as. The HTTP server puts it in the request's
/// extensions; the tool reads it from there (it never sees the token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticatedTenant(pub String);

/// Runs jobs for the tool: admission, the tenant's policy and engine.
pub trait Executor: Send + Sync + 'static {
    /// The policy jobs of `tenant` run under (for the tool's description and schema).
    fn policy(&self, tenant: Option<&str>) -> Arc<Policy>;

    /// Whether this executor keeps sessions (`airlock serve`'s does; `airlock mcp` on
    /// stdio keeps none). Where it does not, the session tools and `run_code`'s `session`
    /// are not offered, whatever the policy says: a model is not offered what would be
    /// refused.
    fn keeps_sessions(&self) -> bool {
        false
    }

    /// Runs one job and returns its result: the observation (an `error` observation when
    /// it could not run, including when the executor is busy or shutting down) and the
    /// files it released from `/out`, which the tool inlines when the call asks for them.
    ///
    /// Dropping the future must kill the job, free its slot and still audit it: that is
    /// how a cancelled or abandoned call ends its job.
    fn run(&self, request: JobRequest, tenant: Option<String>) -> BoxFuture<'_, JobResult>;

    /// Opens a session for `tenant` (`session_start`). The default keeps none.
    fn session_start(
        &self,
        tenant: Option<String>,
    ) -> BoxFuture<'_, Result<SessionInfo, SessionError>> {
        let _ = tenant;
        Box::pin(async { Err(no_sessions()) })
    }

    /// Runs one call in a session `tenant` owns (`run_code` with `session`).
    fn session_run(
        &self,
        tenant: Option<String>,
        id: String,
        call: SessionCall,
    ) -> BoxFuture<'_, Result<SessionRunResult, SessionError>> {
        let _ = (tenant, id, call);
        Box::pin(async { Err(no_sessions()) })
    }

    /// Ends a session `tenant` owns (`session_end`).
    fn session_end(
        &self,
        tenant: Option<String>,
        id: String,
    ) -> BoxFuture<'_, Result<(), SessionError>> {
        let _ = (tenant, id);
        Box::pin(async { Err(no_sessions()) })
    }
}

fn no_sessions() -> SessionError {
    SessionError::Unsupported(
        "this MCP server keeps no sessions (use airlock serve's /mcp)".to_owned(),
    )
}

/// The tool that opens a session.
pub const SESSION_START_TOOL: &str = "session_start";
/// The tool that ends a session.
pub const SESSION_END_TOOL: &str = "session_end";

/// The session tools, listed when `policy` enables sessions: closed input schemas, like
/// `run_code`'s.
pub fn session_tools(policy: &Policy) -> Vec<Tool> {
    if !policy.sessions.enabled {
        return Vec::new();
    }
    let closed = |properties: Value, required: Value| match serde_json::json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false
    }) {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(serde_json::Map::new()),
    };
    let s = &policy.sessions;
    vec![
        Tool::new(
            SESSION_START_TOOL,
            format!(
                "Open a session and get its id; pass it as run_code's `session` to keep state \
                 between calls ({what}). It ends with session_end, after {idle} without a call, \
                 and at {ttl} at the latest; at most {max} open at once.",
                what = match s.mode {
                    airlock_core::policy::SessionMode::Workspace =>
                        "files in /work persist; each call is still a fresh sandbox",
                    airlock_core::policy::SessionMode::Kernel =>
                        "a Python interpreter whose variables persist, like a notebook; the last expression's value is returned",
                },
                idle = format_duration(s.idle),
                ttl = format_duration(s.ttl),
                max = s.max_per_tenant,
            ),
            closed(serde_json::json!({}), serde_json::json!([])),
        ),
        Tool::new(
            SESSION_END_TOOL,
            "End a session: its sandbox and every file in it are destroyed.",
            closed(
                serde_json::json!({"session": {"type": "string", "description": "The id session_start returned."}}),
                serde_json::json!(["session"]),
            ),
        ),
    ]
}

/// The result of a session operation that failed, in the error observation's shape.
fn session_error_result(error: &SessionError, policy: &Policy) -> CallToolResult {
    observation_result(&airlock_engine::early_error(
        error.kind(),
        error.to_string(),
        &policy.version,
    ))
}

/// A result that is only an observation (a job that never ran has no files).
pub fn observation_only(observation: Observation) -> JobResult {
    JobResult {
        observation,
        files: Vec::new(),
        connections: Vec::new(),
    }
}

/// The tool as `tools/list` shows it under `policy`: the description, the closed
/// `inputSchema` and the observation as `outputSchema` (standalone, no references).
pub fn tool_for(policy: &Policy) -> Tool {
    let output_schema = match airlock_core::schema::observation_schema() {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    Tool::new(
        TOOL_NAME,
        tool::mcp_description(policy),
        tool::input_schema(policy),
    )
    .with_raw_output_schema(Arc::new(output_schema))
}

/// How long an MCP client should wait for a `run_code` call under `policy` before giving
/// up: the wall-time limit plus [`tool::CALL_SETUP_ALLOWANCE`] for sandbox setup and
/// teardown. A shorter client timeout turns a job that runs to its limit into a client
/// error instead of the `timeout` observation.
pub fn client_timeout(policy: &Policy) -> std::time::Duration {
    policy.limits.timeout + tool::CALL_SETUP_ALLOWANCE
}

/// How long a client may cache `tools/list`: the tools change only with the policy, which
/// changes only when the server restarts with another.
pub const TOOLS_LIST_TTL_MS: u64 = 5 * 60 * 1000;

/// The MCP server: a handler with one tool.
#[derive(Clone)]
pub struct RunCodeServer {
    executor: Arc<dyn Executor>,
    resources: Arc<OutResources>,
    tasks: Arc<TaskStore>,
}

impl std::fmt::Debug for RunCodeServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunCodeServer").finish_non_exhaustive()
    }
}

impl RunCodeServer {
    /// A server whose tool runs jobs on `executor`, with a store of its own for the jobs'
    /// `/out` files.
    pub fn new(executor: Arc<dyn Executor>) -> Self {
        Self::with_resources(executor, Arc::default())
    }

    /// A server whose jobs' `/out` files are kept in `resources`, which the servers of
    /// every MCP session of one endpoint share (a file is read back on a later request,
    /// not necessarily in the same session).
    pub fn with_resources(executor: Arc<dyn Executor>, resources: Arc<OutResources>) -> Self {
        Self::with_stores(executor, resources, Arc::default())
    }

    /// A server whose jobs' `/out` files are kept in `resources` and whose tasks in
    /// `tasks`, both shared by every MCP session of one endpoint (a task is polled on
    /// later requests, in another session or statelessly).
    pub fn with_stores(
        executor: Arc<dyn Executor>,
        resources: Arc<OutResources>,
        tasks: Arc<TaskStore>,
    ) -> Self {
        Self {
            executor,
            resources,
            tasks,
        }
    }

    /// Runs one `run_code` call of a client that speaks the tasks extension: the job
    /// runs in a task of its own; if it ends within `[mcp] task_after` the result is the
    /// answer, else a task the client polls with `tasks/get` (and stops with
    /// `tasks/cancel`, which kills the job). A caller at its `tasks_per_tenant` bound is
    /// refused with an error observation before anything runs.
    pub async fn call_as_task(
        &self,
        arguments: Option<Value>,
        tenant: Option<String>,
        caller: airlock_telemetry::Caller,
        gone: CancellationToken,
    ) -> Result<CallToolResponse, ErrorData> {
        let policy = self.executor.policy(tenant.as_deref());
        let reservation =
            match self
                .tasks
                .reserve(tenant.as_deref(), &policy.mcp, client_timeout(&policy))
            {
                Ok(reservation) => reservation,
                Err(refusal) => {
                    return Ok(observation_result(&airlock_engine::early_error(
                        ErrorKind::PolicyDenied,
                        refusal.to_string(),
                        &policy.version,
                    ))
                    .into());
                }
            };
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        let server = self.clone();
        let id = reservation.id.clone();
        let cancel = reservation.cancel.clone();
        // Not tied to this request: the job outlives the answer when it becomes a task.
        // Dropping `server.call` (on `tasks/cancel` or when the store closes) kills it.
        tokio::spawn(airlock_telemetry::with_caller(caller, async move {
            tokio::select! {
                result = server.call(arguments, tenant) => server.tasks.complete(&id, &result),
                () = cancel.cancelled() => {
                    tracing::info!(task = %id, "run_code task cancelled: its job was killed");
                }
            }
            let _ = done.send(());
        }));
        // A zero `task_after` means always a task, even for a job that ends at once.
        let direct = !policy.mcp.task_after.is_zero();
        if direct {
            tokio::select! {
                _ = tokio::time::timeout(policy.mcp.task_after, finished) => {}
                () = gone.cancelled() => {
                    self.tasks.withdraw(&reservation.id);
                    return Err(ErrorData::new(
                        ErrorCode::INTERNAL_ERROR,
                        "the call was cancelled; its job was killed",
                        None,
                    ));
                }
            }
        }
        match self.tasks.publish(&reservation.id, direct) {
            Some(tasks::Publication::Finished(result)) => Ok(result.into()),
            Some(tasks::Publication::Task(task)) => Ok(CallToolResponse::Task(task)),
            None => Err(ErrorData::internal_error(
                "the call's task vanished before it was answered",
                None,
            )),
        }
    }

    /// The tools as `tools/list` shows them to `tenant`, always in the same order.
    pub fn tools(&self, tenant: Option<&str>) -> Vec<Tool> {
        let mut tools = vec![self.tool(tenant)];
        tools.extend(session_tools(&self.offered_policy(tenant)));
        tools
    }

    /// The policy as the tools offer it to `tenant`: sessions off where the executor
    /// keeps none.
    fn offered_policy(&self, tenant: Option<&str>) -> Arc<Policy> {
        let policy = self.executor.policy(tenant);
        if policy.sessions.enabled && !self.executor.keeps_sessions() {
            let mut offered = (*policy).clone();
            offered.sessions.enabled = false;
            return Arc::new(offered);
        }
        policy
    }

    /// The tool as `tools/list` shows it to `tenant`.
    pub fn tool(&self, tenant: Option<&str>) -> Tool {
        tool_for(&self.offered_policy(tenant))
    }

    /// Runs one call's arguments as a job and shapes the result; with `return_files`, the
    /// files released from `/out` come back inline within the policy's cap.
    pub async fn call(&self, arguments: Option<Value>, tenant: Option<String>) -> CallToolResult {
        let policy = self.offered_policy(tenant.as_deref());
        let (request, return_files) = match RunCodeArguments::parse(arguments, &policy) {
            Ok(RunCodeArguments {
                request,
                session: Some(session),
            }) => {
                return self
                    .call_in_session(request, session, tenant, &policy)
                    .await;
            }
            Ok(RunCodeArguments { request, .. }) => {
                let return_files = request.return_files;
                (request.into_job(&policy), return_files)
            }
            Err(e) => (Err(e), false),
        };
        let mut result = match request {
            Ok(request) => self.executor.run(request, tenant.clone()).await,
            Err(e) => observation_only(airlock_engine::early_error(
                ErrorKind::InvalidInput,
                format!("arguments: {e}"),
                &policy.version,
            )),
        };
        if !return_files {
            return observation_result(&result.observation);
        }
        result.inline_files(policy.filesystem.out.mcp_inline_bytes.as_u64());
        let links = self.resources.keep(
            tenant.as_deref(),
            &result.observation.job_id,
            &result.observation.files,
            &result.files,
        );
        files_result(&result.observation, &links)
    }

    async fn call_in_session(
        &self,
        request: RunRequest,
        id: String,
        tenant: Option<String>,
        policy: &Policy,
    ) -> CallToolResult {
        let refuse = |message: &str| {
            observation_result(&airlock_engine::early_error(
                ErrorKind::InvalidInput,
                message,
                &policy.version,
            ))
        };
        if !request.files.is_empty() || request.return_files {
            return refuse(
                "arguments: files and return_files do not apply to a session call: the session's /work keeps the files the code writes",
            );
        }
        let timeout = match request
            .timeout_s
            .map(|s| airlock_core::request::seconds("timeout_s", s))
            .transpose()
        {
            Ok(t) => t,
            Err(e) => return refuse(&format!("arguments: {e}")),
        };
        let Some(code) = request.code else {
            return refuse("arguments: code: missing");
        };
        let call = SessionCall {
            code,
            language: request.language,
            timeout,
            ..SessionCall::default()
        };
        match self.executor.session_run(tenant, id, call).await {
            Err(e) => session_error_result(&e, policy),
            Ok(result) => {
                let mut value = serde_json::to_value(&result.observation).unwrap_or_default();
                // The observation's schema is open: the session's part rides beside it.
                value["session"] = serde_json::json!({
                    "id": result.session_id,
                    "call": result.call,
                    "value": result.value,
                    "error": result.error,
                    "kernel_restarted": result.kernel_restarted,
                });
                // A chart is for the model to see: an image block of its own, and not its
                // base64 a second time in the JSON.
                let mut images = Vec::new();
                if let Some(files) = value["files"].as_array_mut() {
                    for file in files {
                        if file["media_type"] == "image/png"
                            && let Some(Value::String(data)) = file
                                .as_object_mut()
                                .and_then(|f| f.remove("content_base64"))
                        {
                            images.push(rmcp::model::ContentBlock::image(data, "image/png"));
                        }
                    }
                }
                let mut answer = if result.observation.ok && result.error.is_none() {
                    CallToolResult::structured(value)
                } else {
                    CallToolResult::structured_error(value)
                };
                answer.content.extend(images);
                answer
            }
        }
    }

    async fn call_session_tool(
        &self,
        name: &str,
        arguments: Option<Value>,
        tenant: Option<String>,
    ) -> CallToolResult {
        let policy = self.offered_policy(tenant.as_deref());
        let arguments = arguments.unwrap_or(Value::Object(Default::default()));
        let bad = |message: String| {
            observation_result(&airlock_engine::early_error(
                ErrorKind::InvalidInput,
                message,
                &policy.version,
            ))
        };
        let Some(object) = arguments.as_object() else {
            return bad("arguments: expected an object".to_owned());
        };
        if name == SESSION_START_TOOL {
            if let Some(key) = object.keys().next() {
                return bad(format!(
                    "arguments: unknown field {key:?}; session_start takes none"
                ));
            }
            return match self.executor.session_start(tenant).await {
                Ok(info) => CallToolResult::structured(serde_json::json!({"session": info})),
                Err(e) => session_error_result(&e, &policy),
            };
        }
        if let Some(key) = object.keys().find(|k| *k != "session") {
            return bad(format!("arguments: unknown field {key:?}"));
        }
        let Some(id) = object.get("session").and_then(Value::as_str) else {
            return bad("arguments: session (a string) is required".to_owned());
        };
        match self.executor.session_end(tenant, id.to_owned()).await {
            Ok(()) => CallToolResult::structured(serde_json::json!({"ended": id})),
            Err(e) => session_error_result(&e, &policy),
        }
    }

    /// Like [`RunCodeServer::call`], but when `cancelled` completes first the call is
    /// dropped, which kills its job; `None` then.
    pub async fn call_until(
        &self,
        arguments: Option<Value>,
        tenant: Option<String>,
        cancelled: impl std::future::Future<Output = ()>,
    ) -> Option<CallToolResult> {
        tokio::select! {
            result = self.call(arguments, tenant) => Some(result),
            () = cancelled => None,
        }
    }
}

/// The tool result of an observation: the observation JSON as text and as structured
/// content, `isError` when `ok` is false.
pub fn observation_result(observation: &Observation) -> CallToolResult {
    let value = serde_json::to_value(observation).unwrap_or_else(|e| {
        serde_json::json!({
            "ok": false, "outcome": "error",
            "error": {"kind": "internal", "message": format!("encode the observation: {e}")}
        })
    });
    if observation.ok {
        CallToolResult::structured(value)
    } else {
        CallToolResult::structured_error(value)
    }
}

/// Media types a client shows as pictures: a small one comes back as an image block.
const IMAGE_TYPES: &[&str] = &["image/png", "image/jpeg", "image/gif", "image/webp"];

/// The tool result of a job that released files: [`observation_result`], with each file
/// inlined within the MCP budget moved out of the JSON into an image block when it is a
/// picture, and each kept file not inlined (`links`, in `files[]`'s order) as a
/// `resource_link`.
pub fn files_result(observation: &Observation, links: &[Option<String>]) -> CallToolResult {
    let mut result = observation_result(observation);
    let mut blocks = Vec::new();
    if let Some(files) = result
        .structured_content
        .as_mut()
        .and_then(|v| v.get_mut("files"))
        .and_then(Value::as_array_mut)
    {
        for file in files.iter_mut() {
            let image = file["media_type"]
                .as_str()
                .filter(|t| IMAGE_TYPES.contains(t))
                .map(str::to_owned);
            if let Some(media_type) = image
                && let Some(Value::String(data)) = file
                    .as_object_mut()
                    .and_then(|f| f.remove("content_base64"))
            {
                blocks.push(ContentBlock::image(data, media_type));
            }
        }
    }
    // The text block is the JSON as the model reads it: without the pictures' base64,
    // which the image blocks carry.
    if !blocks.is_empty()
        && let Some(value) = &result.structured_content
    {
        result.content = vec![ContentBlock::text(value.to_string())];
    }
    // A link block only for a file the result does not carry: frameworks that flatten a
    // result's blocks into one string (the Agents SDK, CrewAI) then still hand the model
    // the observation JSON alone whenever every file fit. Every kept file, linked or not,
    // reads back at its URI (the template, `job_id` and `path`).
    for (file, link) in observation.files.iter().zip(links) {
        if file.content_base64.is_some() {
            continue;
        }
        if let Some(uri) = link {
            blocks.push(ContentBlock::resource_link(
                Resource::new(uri.clone(), file.path.clone())
                    .with_mime_type(file.media_type.clone())
                    .with_size(file.bytes),
            ));
        }
    }
    result.content.extend(blocks);
    result
}

/// The tenant of an MCP request that came over HTTP, if the server authenticated one.
/// The caller's W3C trace context from the request's `_meta` (`traceparent`,
/// `tracestate`, `baggage`, as MCP carries them) and the request id as the tool call id.
fn caller_of(context: &RequestContext<RoleServer>) -> airlock_telemetry::Caller {
    airlock_telemetry::Caller::from_carrier(|key| {
        context
            .meta
            .get(key)
            .and_then(Value::as_str)
            .map(str::to_owned)
    })
    .with_tool_call_id(Some(context.id.to_string()))
}

fn tenant_of(context: &RequestContext<RoleServer>) -> Option<String> {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<AuthenticatedTenant>())
        .map(|t| t.0.clone())
}

impl ServerHandler for RunCodeServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("airlock", env!("CARGO_PKG_VERSION")))
        .with_instructions({
            let policy = self.executor.policy(None);
            format!(
                "airlock runs code in a disposable, hardened sandbox. Call run_code with \
                     the complete program (language defaults to {language}); read stdout, \
                     stderr and outcome from the JSON result. Set return_files to get the files \
                     written under /out back: small ones inline, larger ones as resource \
                     links (read them with resources/read). A call takes up to the wall-time limit \
                     plus sandbox setup: set the client's request timeout to at least \
                     {timeout} (the OpenAI Agents SDK's client_session_timeout_seconds \
                     defaults to 5 s, too short). A cancelled call kills its job. A client \
                     that declares the io.modelcontextprotocol/tasks extension gets a task \
                     instead when the job runs past {task_after}: poll tasks/get for the \
                     result; tasks/cancel kills the job.",
                language = policy.default_language(),
                timeout = format_duration(client_timeout(&policy)),
                task_after = format_duration(policy.mcp.task_after),
            )
        })
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tenant = tenant_of(&context);
        // The tools depend on the tenant's policy: cached by this client only.
        Ok(
            ListToolsResult::with_all_items(self.tools(tenant.as_deref()))
                .with_ttl_ms(TOOLS_LIST_TTL_MS)
                .with_cache_scope(CacheScope::Private),
        )
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let tenant = tenant_of(&context);
        let resources = self
            .resources
            .list(tenant.as_deref())
            .into_iter()
            .map(|r| {
                let name = r.uri.rsplit_once("/out/").map_or("", |(_, p)| p).to_owned();
                Resource::new(r.uri.clone(), name)
                    .with_mime_type(r.media_type.clone())
                    .with_size(r.content.len() as u64)
            })
            .collect();
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new(resources::URI_TEMPLATE, "job output file").with_description(
                format!(
                    "A file a run_code job with return_files wrote to /out, readable by the \
                     caller that ran the job for {} after it ended.",
                    format_duration(resources::OUT_RESOURCE_TTL)
                ),
            ),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        use base64::Engine as _;
        let tenant = tenant_of(&context);
        let Some(file) = self.resources.read(tenant.as_deref(), &request.uri) else {
            return Err(ErrorData::resource_not_found(
                format!(
                    "no such resource {:?}: job files are readable only by the caller that \
                     ran the job, for {} after it ended",
                    request.uri,
                    format_duration(resources::OUT_RESOURCE_TTL)
                ),
                None,
            ));
        };
        let textual = file.media_type.starts_with("text/") || file.media_type == "application/json";
        let contents = match String::from_utf8(file.content) {
            Ok(text) if textual => ResourceContents::text(text, file.uri),
            Ok(text) => ResourceContents::blob(
                base64::engine::general_purpose::STANDARD.encode(text.as_bytes()),
                file.uri,
            ),
            Err(bytes) => ResourceContents::blob(
                base64::engine::general_purpose::STANDARD.encode(bytes.as_bytes()),
                file.uri,
            ),
        }
        .with_mime_type(file.media_type);
        Ok(ReadResourceResult::new(vec![contents]).into())
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        if name == TOOL_NAME {
            return Some(self.tool(None));
        }
        session_tools(&self.offered_policy(None))
            .into_iter()
            .find(|t| t.name == name)
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let tenant = tenant_of(&context);
        self.tasks
            .get(tenant.as_deref(), &request.task_id)
            .map(GetTaskResult::new)
            .map_err(|e| ErrorData::invalid_params(e.to_string(), None))
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let tenant = tenant_of(&context);
        self.tasks
            .cancel(tenant.as_deref(), &request.task_id)
            .map_err(|e| ErrorData::invalid_params(e.to_string(), None))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        // No run_code task asks for input: every response is for a key that is not
        // outstanding, which the extension says to ignore; an unknown task is an error.
        let tenant = tenant_of(&context);
        if self.tasks.exists(tenant.as_deref(), &request.task_id) {
            Ok(())
        } else {
            Err(ErrorData::invalid_params(
                tasks::TaskError::NotFound(request.task_id).to_string(),
                None,
            ))
        }
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name == SESSION_START_TOOL || request.name == SESSION_END_TOOL {
            let tenant = tenant_of(&context);
            let arguments = request.arguments.map(Value::Object);
            return tokio::select! {
                result = self.call_session_tool(&request.name, arguments, tenant) => Ok(result.into()),
                () = context.ct.cancelled() => Err(ErrorData::new(
                    ErrorCode::INTERNAL_ERROR,
                    "the call was cancelled",
                    None,
                )),
            };
        }
        if request.name != TOOL_NAME {
            return Err(ErrorData::invalid_params(
                format!(
                    "unknown tool {:?}; the only tool is {TOOL_NAME}",
                    request.name
                ),
                None,
            ));
        }
        let tenant = tenant_of(&context);
        let caller = caller_of(&context);
        if context
            .client_capabilities()
            .is_some_and(|capabilities| capabilities.supports_tasks())
        {
            return self
                .call_as_task(
                    request.arguments.map(Value::Object),
                    tenant,
                    caller,
                    context.ct.clone(),
                )
                .await;
        }
        // rmcp cancels `context.ct` on `notifications/cancelled`, when a streamable-HTTP
        // client disconnects, and when the session ends; it does not drop the handler, so
        // the call is raced against it here.
        match airlock_telemetry::with_caller(
            caller,
            self.call_until(
                request.arguments.map(Value::Object),
                tenant,
                context.ct.cancelled(),
            ),
        )
        .await
        {
            Some(result) => Ok(result.into()),
            None => {
                tracing::info!("run_code call cancelled by the client: its job was killed");
                Err(ErrorData::new(
                    ErrorCode::INTERNAL_ERROR,
                    "the call was cancelled; its job was killed",
                    None,
                ))
            }
        }
    }
}

/// Serves MCP on stdin/stdout until the client closes stdin.
pub async fn serve_stdio(executor: Arc<dyn Executor>) -> Result<(), McpError> {
    let (stdin, stdout) = rmcp::transport::stdio();
    serve_io(executor, stdin, stdout).await
}

/// Serves MCP on a byte stream pair (newline-delimited JSON-RPC) until `input` ends.
///
/// The end of `input` means the client is gone: the calls still running are cancelled at
/// once (their jobs killed), rather than after rmcp's grace period for finishing
/// handlers, so a client that exits mid-call frees its slots immediately.
pub async fn serve_io<R, W>(
    executor: Arc<dyn Executor>,
    input: R,
    output: W,
) -> Result<(), McpError>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let session = CancellationToken::new();
    let input = EndSignal {
        inner: input,
        ended: session.clone(),
    };
    // The client's tasks die with it: nobody is left to poll them.
    let tasks = Arc::new(TaskStore::new(session.clone()));
    let service = RunCodeServer::with_stores(executor, Arc::default(), tasks)
        .serve_with_ct((input, output), session)
        .await
        .map_err(|e| McpError::StartSession(Box::new(e)))?;
    service
        .waiting()
        .await
        .map_err(|e| McpError::ServeSession(Box::new(e)))?;
    Ok(())
}

/// A reader that cancels `ended` when its input reaches the end (or fails).
struct EndSignal<R> {
    inner: R,
    ended: CancellationToken,
}

impl<R: AsyncRead + Unpin> AsyncRead for EndSignal<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        match &polled {
            std::task::Poll::Ready(Ok(()))
                if buf.filled().len() == before && buf.remaining() > 0 =>
            {
                self.ended.cancel();
            }
            std::task::Poll::Ready(Err(_)) => self.ended.cancel(),
            _ => {}
        }
        polled
    }
}

/// An [`Executor`] over one engine with a fixed number of jobs at a time (for stdio, where
/// there is one client and no tenants). Jobs are killed when `interrupt` fires.
pub struct EngineExecutor {
    engine: Arc<Engine>,
    policy: Arc<Policy>,
    slots: Arc<tokio::sync::Semaphore>,
    max_in_flight: u32,
    interrupt: tokio::sync::watch::Receiver<Option<String>>,
}

impl EngineExecutor {
    /// Runs at most `max_in_flight` jobs at once on `engine`; when `interrupt` holds a
    /// reason, running jobs are killed with it and new ones refused.
    pub fn new(
        engine: Arc<Engine>,
        max_in_flight: usize,
        interrupt: tokio::sync::watch::Receiver<Option<String>>,
    ) -> Self {
        let max_in_flight = u32::try_from(max_in_flight.clamp(1, 1 << 16)).unwrap_or(1);
        Self {
            policy: Arc::new(engine.policy().clone()),
            engine,
            slots: Arc::new(tokio::sync::Semaphore::new(max_in_flight as usize)),
            max_in_flight,
            interrupt,
        }
    }

    /// Completes when no job is running (and keeps new ones from starting meanwhile).
    pub async fn wait_idle(&self) {
        let _all = self.slots.acquire_many(self.max_in_flight).await;
    }
}

/// Completes with the reason once `rx` holds one.
pub async fn interrupted(mut rx: tokio::sync::watch::Receiver<Option<String>>) -> String {
    loop {
        if let Some(reason) = rx.borrow_and_update().clone() {
            return reason;
        }
        if rx.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

impl Executor for EngineExecutor {
    fn policy(&self, _tenant: Option<&str>) -> Arc<Policy> {
        self.policy.clone()
    }

    fn run(&self, request: JobRequest, tenant: Option<String>) -> BoxFuture<'_, JobResult> {
        Box::pin(async move {
            let refuse = |message: &str| {
                observation_only(airlock_engine::early_error(
                    ErrorKind::BackendUnavailable,
                    message,
                    &self.policy.version,
                ))
            };
            if self.interrupt.borrow().is_some() {
                return refuse("airlock is shutting down");
            }
            let permit = tokio::select! {
                permit = self.slots.clone().acquire_owned() => permit,
                _ = interrupted(self.interrupt.clone()) => return refuse("airlock is shutting down"),
            };
            let Ok(permit) = permit else {
                return refuse("airlock is shutting down");
            };
            // The job runs in its own task: if this call is dropped (the client cancelled
            // or went away), `_alive` is dropped too, which interrupts the job through
            // the engine, so it is killed and still audited.
            let (_alive, gone) = tokio::sync::oneshot::channel::<()>();
            let engine = self.engine.clone();
            let shutdown = self.interrupt.clone();
            let task = tokio::spawn(airlock_telemetry::carry(async move {
                let interrupt = async move {
                    tokio::select! {
                        reason = interrupted(shutdown) => reason,
                        _ = gone => "the call was cancelled".to_owned(),
                    }
                };
                let (result, teardown) =
                    engine.run_detached(request, tenant, interrupt, None).await;
                // The slot is free once the sandbox is removed; the reply does not wait.
                tokio::spawn(async move {
                    teardown.wait().await;
                    drop(permit);
                });
                result
            }));
            match task.await {
                Ok(result) => result,
                Err(e) => observation_only(airlock_engine::early_error(
                    ErrorKind::Internal,
                    format!("the job's task failed: {e}"),
                    &self.policy.version,
                )),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::observation::{NetworkCounts, OutputFile, RejectedFile};
    use airlock_core::{BackendKind, JobId, Outcome};
    use serde_json::json;

    /// Keywords that only annotate. Any other keyword the validator below does not
    /// implement fails the check, so it cannot pass a schema it does not understand.
    const ANNOTATIONS: &[&str] = &["description", "title", "format", "default"];

    /// Errors of `value` against `schema` (the subset of JSON Schema 2020-12 the
    /// observation's schema is written in).
    fn violations(schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
        let Some(schema) = schema.as_object() else {
            errors.push(format!("{at}: schema is not an object"));
            return;
        };
        for (keyword, rule) in schema {
            match keyword.as_str() {
                k if ANNOTATIONS.contains(&k) => {}
                "type" => {
                    let types: Vec<&str> = match rule {
                        Value::String(t) => vec![t.as_str()],
                        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                        _ => vec![],
                    };
                    let matches = |t: &str| match t {
                        "object" => value.is_object(),
                        "array" => value.is_array(),
                        "string" => value.is_string(),
                        "boolean" => value.is_boolean(),
                        "null" => value.is_null(),
                        "integer" => value.is_i64() || value.is_u64(),
                        "number" => value.is_number(),
                        _ => false,
                    };
                    if !types.iter().any(|t| matches(t)) {
                        errors.push(format!("{at}: {value} is not of type {rule}"));
                    }
                }
                "enum" => {
                    if !rule.as_array().is_some_and(|v| v.contains(value)) {
                        errors.push(format!("{at}: {value} not in {rule}"));
                    }
                }
                "minimum" => {
                    if let (Some(min), Some(v)) = (rule.as_f64(), value.as_f64())
                        && v < min
                    {
                        errors.push(format!("{at}: {v} < {min}"));
                    }
                }
                "required" => {
                    if let Some(object) = value.as_object() {
                        for name in rule.as_array().into_iter().flatten() {
                            let name = name.as_str().unwrap_or_default();
                            if !object.contains_key(name) {
                                errors.push(format!("{at}: {name} missing"));
                            }
                        }
                    }
                }
                "properties" => {
                    if let (Some(properties), Some(object)) = (rule.as_object(), value.as_object())
                    {
                        for (name, sub) in properties {
                            if let Some(v) = object.get(name) {
                                violations(sub, v, &format!("{at}.{name}"), errors);
                            }
                        }
                    }
                }
                "items" => {
                    for (i, item) in value.as_array().into_iter().flatten().enumerate() {
                        violations(rule, item, &format!("{at}[{i}]"), errors);
                    }
                }
                other => errors.push(format!("{at}: keyword {other} not understood")),
            }
        }
    }

    fn check(schema: &Value, value: &Value) {
        let mut errors = Vec::new();
        violations(schema, value, "$", &mut errors);
        assert!(errors.is_empty(), "{errors:#?}\n{value:#}");
    }

    fn full_observation() -> Observation {
        let mut o = Observation::error(
            JobId::generate(),
            BackendKind::Docker,
            "v1",
            ErrorKind::Internal,
            "",
        );
        o.ok = true;
        o.outcome = Outcome::Exited;
        o.exit_code = Some(0);
        o.error = None;
        o.stdout = "hi\n".to_owned();
        o.cpu_ms = Some(3);
        o.peak_memory_bytes = Some(1 << 20);
        o.image_digest = Some(format!("sha256:{}", "a".repeat(64)));
        o.files = vec![OutputFile {
            path: "plot.png".to_owned(),
            bytes: 3,
            sha256: "b".repeat(64),
            media_type: "image/png".to_owned(),
            redactions: 0,
            content_base64: Some("AAEC".to_owned()),
        }];
        o.rejected_files = vec![RejectedFile {
            path: "link".to_owned(),
            reason: "symlink".to_owned(),
        }];
        o.degraded = vec!["memory: RLIMIT_AS".to_owned()];
        o.network = Some(NetworkCounts {
            connections: 2,
            denied: 1,
            bytes_up: 10,
            bytes_down: 20,
            limit_hit: None,
            secrets_substituted: 0,
            secrets_scrubbed: 0,
        });
        o
    }

    #[test]
    fn the_tool_declares_the_observation_as_its_output_schema() {
        let tool = serde_json::to_value(tool_for(&Policy::builtin())).unwrap();
        assert_eq!(tool["name"], TOOL_NAME);
        assert_eq!(tool["inputSchema"]["type"], "object");
        let output = &tool["outputSchema"];
        // rmcp drops (and clients refuse) an outputSchema whose root is not an object.
        assert_eq!(output["type"], "object");
        assert!(
            !output.to_string().contains("$ref"),
            "references in {output}"
        );
        let required: Vec<&str> = output["required"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for key in ["ok", "outcome", "stdout", "stderr", "files", "job_id"] {
            assert!(required.contains(&key), "{key} not required: {required:?}");
        }
    }

    #[test]
    fn every_result_shape_validates_against_the_output_schema() {
        let schema = airlock_core::schema::observation_schema();
        let mut killed = full_observation();
        killed.ok = false;
        killed.outcome = Outcome::Killed;
        killed.exit_code = None;
        killed.signal = Some("SIGKILL".to_owned());
        let shapes = [
            full_observation(),
            killed,
            airlock_engine::early_error(ErrorKind::PolicyDenied, "too long", "v1"),
        ];
        for observation in shapes {
            let result = observation_result(&observation);
            let structured = result.structured_content.clone().unwrap();
            check(&schema, &structured);
            assert_eq!(result.is_error, Some(!observation.ok));
        }
        // The validator does fail: a missing field and a wrong enum value.
        let mut errors = Vec::new();
        let broken = json!({"ok": true, "outcome": "exploded"});
        violations(&schema, &broken, "$", &mut errors);
        assert!(
            errors.iter().any(|e| e.contains("stdout missing")),
            "{errors:?}"
        );
        assert!(errors.iter().any(|e| e.contains("exploded")), "{errors:?}");
    }

    #[test]
    fn instructions_name_the_client_timeout() {
        assert_eq!(
            client_timeout(&Policy::builtin()),
            std::time::Duration::from_secs(35)
        );
        let text = tool::description(&Policy::builtin());
        assert!(text.contains("35s"), "{text}");
    }
}
