//! airlock-mcp owns airlock's Model Context Protocol tool server: one `run_code` tool
//! whose result is the observation JSON (`isError` when `ok` is false), served over stdio
//! (`airlock mcp`) or as a service the HTTP server mounts at `/mcp` (streamable HTTP).
//! It turns tool calls into jobs and hands them to an [`Executor`]; it must not run jobs
//! itself, decide admission or authentication (the executor and the HTTP server do), or
//! write anything but MCP messages to stdout.
#![forbid(unsafe_code)]

pub mod error;
pub mod tool;

use std::sync::Arc;

use airlock_core::{BoxFuture, ErrorKind, JobRequest, Observation, Policy};
use airlock_engine::Engine;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;

pub use error::McpError;
pub use tool::{RunCodeFile, RunCodeParams, TOOL_NAME};

/// The tenant a request was authenticated as. The HTTP server puts it in the request's
/// extensions; the tool reads it from there (it never sees the token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticatedTenant(pub String);

/// Runs jobs for the tool: admission, the tenant's policy and engine.
pub trait Executor: Send + Sync + 'static {
    /// The policy jobs of `tenant` run under (for the tool's description and schema).
    fn policy(&self, tenant: Option<&str>) -> Arc<Policy>;

    /// Runs one job and returns its observation (an `error` observation when it could not
    /// run, including when the executor is busy or shutting down).
    fn run(&self, request: JobRequest, tenant: Option<String>) -> BoxFuture<'_, Observation>;
}

/// The MCP server: a handler with one tool.
#[derive(Clone)]
pub struct RunCodeServer {
    executor: Arc<dyn Executor>,
}

impl std::fmt::Debug for RunCodeServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunCodeServer").finish_non_exhaustive()
    }
}

impl RunCodeServer {
    /// A server whose tool runs jobs on `executor`.
    pub fn new(executor: Arc<dyn Executor>) -> Self {
        Self { executor }
    }

    /// The tool as `tools/list` shows it to `tenant`.
    pub fn tool(&self, tenant: Option<&str>) -> Tool {
        let policy = self.executor.policy(tenant);
        Tool::new(
            TOOL_NAME,
            tool::description(&policy),
            tool::input_schema(&policy),
        )
    }

    /// Runs one call's arguments as a job and shapes the result.
    pub async fn call(&self, arguments: Option<Value>, tenant: Option<String>) -> CallToolResult {
        let params: Result<RunCodeParams, _> =
            serde_json::from_value(arguments.unwrap_or(Value::Object(Default::default())));
        let request = match params {
            Ok(params) => params.into_request(&self.executor.policy(tenant.as_deref())),
            Err(e) => Err((ErrorKind::InvalidInput, format!("arguments: {e}"))),
        };
        let observation = match request {
            Ok(request) => self.executor.run(request, tenant).await,
            Err((kind, message)) => {
                let version = self.executor.policy(tenant.as_deref()).version.clone();
                airlock_engine::early_error(kind, message, &version)
            }
        };
        observation_result(&observation)
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

/// The tenant of an MCP request that came over HTTP, if the server authenticated one.
fn tenant_of(context: &RequestContext<RoleServer>) -> Option<String> {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<AuthenticatedTenant>())
        .map(|t| t.0.clone())
}

impl ServerHandler for RunCodeServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("airlock", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "airlock runs code in a disposable, hardened sandbox. Call run_code with a \
                 language and the complete program; read stdout, stderr and outcome from the \
                 JSON result.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tenant = tenant_of(&context);
        Ok(ListToolsResult::with_all_items(vec![
            self.tool(tenant.as_deref()),
        ]))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        (name == TOOL_NAME).then(|| self.tool(None))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
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
        let result = self
            .call(request.arguments.map(Value::Object), tenant)
            .await;
        Ok(result.into())
    }
}

/// Serves MCP on stdin/stdout until the client closes stdin.
pub async fn serve_stdio(executor: Arc<dyn Executor>) -> Result<(), McpError> {
    let service = RunCodeServer::new(executor)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| McpError::StartSession(Box::new(e)))?;
    service
        .waiting()
        .await
        .map_err(|e| McpError::ServeSession(Box::new(e)))?;
    Ok(())
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

    fn run(&self, request: JobRequest, tenant: Option<String>) -> BoxFuture<'_, Observation> {
        Box::pin(async move {
            let refuse = |message: &str| {
                airlock_engine::early_error(
                    ErrorKind::BackendUnavailable,
                    message,
                    &self.policy.version,
                )
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
            let task = tokio::spawn(async move {
                let interrupt = async move {
                    tokio::select! {
                        reason = interrupted(shutdown) => reason,
                        _ = gone => "the call was cancelled".to_owned(),
                    }
                };
                let result = engine.run_until(request, tenant, interrupt, None).await;
                drop(permit);
                result
            });
            match task.await {
                Ok(result) => result.observation,
                Err(e) => airlock_engine::early_error(
                    ErrorKind::Internal,
                    format!("the job's task failed: {e}"),
                    &self.policy.version,
                ),
            }
        })
    }
}
