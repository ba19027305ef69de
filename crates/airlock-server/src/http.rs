//! The HTTP API: routes, authentication, request bounds, status codes, SSE.

use airlock_mcp::tool::ToolSchemaFormat;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use airlock_core::{ErrorKind, JobRequest, JobResult, Observation, Outcome};
use airlock_engine::{OutputEvent, OutputSink};
use airlock_mcp::AuthenticatedTenant;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use futures_util::StreamExt;
use http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderValue, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::{
    ErrorBody, Health, OutputChunk, RunRequest, SessionBody, SessionFile, SessionFiles,
    SessionRunRequest, SessionRunResponse,
};
use crate::auth::{TokensFile, bearer_token};
use crate::metrics::ExpositionFormat;
use crate::runner::{Phase, Refusal, Runner};
use airlock_core::observation::WorkspaceFileRelease;
use airlock_engine::sessions::SessionError;
use axum::extract::Path;

/// Output events buffered for one streamed run. When a client reads slower than the job
/// writes, later chunks are dropped (the final observation still has all kept output).
pub const SSE_BUFFER_EVENTS: usize = 256;
/// Seconds a client is told to wait after a 429.
pub const RETRY_AFTER_SECS: u64 = 1;
/// Interval of SSE keep-alive comments.
pub const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// What the routes share.
#[derive(Clone)]
pub struct AppState {
    /// Admission and engines.
    pub runner: Arc<Runner>,
    /// The tokens; `None` when the server runs without authentication (loopback only).
    pub tokens: Option<Arc<TokensFile>>,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Longest time to receive a request body.
    pub body_timeout: Duration,
    /// The server's phase.
    pub phase: watch::Receiver<Phase>,
    /// Tasks running streamed jobs (waited for at shutdown).
    pub tasks: TaskTracker,
    /// The OpenAPI document, rendered once.
    pub openapi: Bytes,
    /// The E2B API (docs/e2b.md).
    pub e2b: airlock_e2b::E2b,
}

/// What the E2B API needs of this server: its tokens (an E2B API key is an airlock
/// token), sessions, engines and body bounds.
pub struct E2bServerHost {
    /// Admission and engines.
    pub runner: Arc<Runner>,
    /// The tokens; `None` without authentication.
    pub tokens: Option<Arc<TokensFile>>,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Longest time to receive a request body.
    pub body_timeout: Duration,
}

impl airlock_e2b::E2bHost for E2bServerHost {
    fn tenant(&self, api_key: Option<&str>) -> Result<Option<String>, ()> {
        let Some(tokens) = &self.tokens else {
            return Ok(None);
        };
        match api_key.and_then(|key| tokens.authenticate(key)) {
            Some(tenant) => Ok(Some(tenant.name.clone())),
            None => {
                self.runner.metrics().rejected("unauthorized");
                Err(())
            }
        }
    }

    fn sessions(&self) -> Result<Arc<airlock_engine::sessions::SessionManager>, SessionError> {
        self.runner.sessions()
    }

    fn engine(&self, tenant: Option<&str>) -> Arc<airlock_engine::Engine> {
        self.runner.session_engine(tenant)
    }

    fn template_engine(&self, tenant: Option<&str>, template: &str) -> Arc<airlock_engine::Engine> {
        self.runner.template_engine(tenant, template)
    }

    fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
    }

    fn body_timeout(&self) -> Duration {
        self.body_timeout
    }
}

/// Sends E2B's in-sandbox requests (the `E2b-Sandbox-Id` header, or a Host of
/// `{port}-{sandboxID}.{domain}`) to the E2B API, before the web-page checks: those
/// requests carry the sandbox's access token in a header of their own, which no page can
/// send without a CORS preflight this server never grants.
async fn route_e2b_sandbox_requests(
    State(e2b): State<airlock_e2b::E2b>,
    request: Request,
    next: Next,
) -> Response {
    match airlock_e2b::sandbox_target(request.headers()) {
        Some(target) => airlock_e2b::serve_sandbox(e2b, target, request).await,
        None => next.run(request).await,
    }
}

/// A JSON response.
fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    let mut response = (status, body).into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn to_json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_else(|e| {
        format!(
            "{{\"ok\":false,\"outcome\":\"error\",\"error\":{{\"kind\":\"internal\",\"message\":{:?}}}}}",
            format!("encode the response: {e}")
        )
        .into_bytes()
    })
}

/// An error response in the DESIGN error shape.
pub fn error_response(status: StatusCode, kind: ErrorKind, message: impl Into<String>) -> Response {
    json_response(status, to_json(&ErrorBody::new(kind, message)))
}

fn refusal_response(state: &AppState, refusal: Refusal) -> Response {
    match refusal {
        Refusal::QueueFull | Refusal::QueueTimeout | Refusal::TenantQueueFull { .. } => {
            let mut response = error_response(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorKind::BackendUnavailable,
                refusal.message(),
            );
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
            response
        }
        Refusal::ShuttingDown => {
            let _ = state;
            error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorKind::BackendUnavailable,
                refusal.message(),
            )
        }
    }
}

/// The status of an observation: 200 when the job ran, whatever its exit; else from the
/// error kind.
pub fn observation_status(observation: &Observation, phase: Phase) -> StatusCode {
    if observation.outcome != Outcome::Error {
        return StatusCode::OK;
    }
    match observation.error.as_ref().map(|e| e.kind) {
        Some(ErrorKind::InvalidInput) => StatusCode::BAD_REQUEST,
        Some(ErrorKind::PolicyDenied) => StatusCode::FORBIDDEN,
        Some(ErrorKind::Unauthorized) => StatusCode::UNAUTHORIZED,
        Some(ErrorKind::BackendUnavailable) => StatusCode::SERVICE_UNAVAILABLE,
        // A job killed by a shutdown: the client may retry elsewhere.
        Some(ErrorKind::Internal) if phase == Phase::Killing => StatusCode::SERVICE_UNAVAILABLE,
        Some(ErrorKind::Internal) | None => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// Requires a valid bearer token when a tokens file is configured, and records the tenant.
async fn require_token(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(tokens) = &state.tokens else {
        return next.run(request).await;
    };
    let tenant = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .and_then(|token| tokens.authenticate(token))
        .map(|t| t.name.clone());
    match tenant {
        Some(tenant) => {
            request.extensions_mut().insert(AuthenticatedTenant(tenant));
            next.run(request).await
        }
        None => {
            state.runner.metrics().rejected("unauthorized");
            let mut response = error_response(
                StatusCode::UNAUTHORIZED,
                ErrorKind::Unauthorized,
                "a valid bearer token is required (Authorization: Bearer <token>); the server's \
                 operator mints one with `airlock token new --tenant NAME --tokens-file FILE`",
            );
            response
                .headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
    }
}

/// `stream=true|false` from the query string; other query parameters are ignored.
fn stream_param(query: Option<&str>) -> Result<bool, String> {
    let mut stream = false;
    for pair in query.unwrap_or("").split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name == "stream" {
            stream = match value {
                "true" | "1" => true,
                "false" | "0" | "" => false,
                other => return Err(format!("stream={other:?}: expected true or false")),
            };
        }
    }
    Ok(stream)
}

/// Reads the body within the size and time bounds.
async fn read_body(state: &AppState, request: Request) -> Result<Bytes, Response> {
    let too_large = || {
        let mut response = error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::InvalidInput,
            format!(
                "the request body is larger than this server's limit of {} bytes \
                 (airlock serve --max-body)",
                state.max_body_bytes
            ),
        );
        // The rest of the body is not read: the connection cannot be reused.
        response
            .headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        state.runner.metrics().rejected("body_too_large");
        response
    };
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > state.max_body_bytes as u64) {
        return Err(too_large());
    }
    let body = Limited::new(request.into_body(), state.max_body_bytes);
    match tokio::time::timeout(state.body_timeout, body.collect()).await {
        Err(_) => {
            state.runner.metrics().rejected("body_timeout");
            let mut response = error_response(
                StatusCode::REQUEST_TIMEOUT,
                ErrorKind::InvalidInput,
                format!(
                    "the request body did not arrive within {} s",
                    state.body_timeout.as_secs_f64()
                ),
            );
            response
                .headers_mut()
                .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
            Err(response)
        }
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Ok(Err(e)) => Err(error_response(
            StatusCode::BAD_REQUEST,
            ErrorKind::InvalidInput,
            format!("read the request body: {e}"),
        )),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

/// `POST /v1/runs`.
async fn post_run(
    State(state): State<AppState>,
    tenant: Option<Extension<AuthenticatedTenant>>,
    request: Request,
) -> Response {
    let tenant = tenant.map(|Extension(t)| t.0);
    let stream = match stream_param(request.uri().query()) {
        Ok(stream) => stream,
        Err(message) => {
            return error_response(StatusCode::BAD_REQUEST, ErrorKind::InvalidInput, message);
        }
    };
    let mut caller = caller_of(request.headers());
    // The body's Content-Type was checked to be application/json (`refuse_web_pages`):
    // `curl -d` and Python's urllib label bodies as forms by default, but accepting a
    // form type would let any web page POST a job without a CORS preflight.
    let body = match read_body(&state, request).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let policy = state.runner.policy(tenant.as_deref());
    let job = match RunRequest::from_json(&body)
        .and_then(|r| r.into_job(&policy))
        .map_err(|e| format!("the body is not a valid run request: {e}"))
    {
        Ok(job) => job,
        Err(message) => {
            state.runner.metrics().rejected("bad_request");
            return error_response(StatusCode::BAD_REQUEST, ErrorKind::InvalidInput, message);
        }
    };
    // A request the policy refuses is answered (and audited) without taking a slot.
    if let Some(refused) = state.runner.refuse_early(tenant.as_deref(), &job).await {
        let status = observation_status(&refused.observation, *state.phase.borrow());
        return json_response(status, to_json(&refused.observation));
    }
    let entered_queue = std::time::SystemTime::now();
    let admitted = match state.runner.admit_job(tenant.as_deref(), Some(&job)).await {
        Ok(admitted) => admitted,
        Err(refusal) => return refusal_response(&state, refusal),
    };
    caller.queued = Some((entered_queue, std::time::SystemTime::now()));
    let inline_cap = inline_cap(&admitted, &job);
    if stream {
        return stream_run(&state, admitted, job, inline_cap, caller);
    }
    // The job runs in its own task: if the client goes away (this future is dropped), the
    // guard fires, the job is killed through the engine and still audited.
    let gone = CancellationToken::new();
    let guard = gone.clone().drop_guard();
    let task = state
        .tasks
        .spawn(airlock_telemetry::with_caller(caller, async move {
            admitted.run_until(job, None, gone.cancelled_owned()).await
        }));
    let result = match task.await {
        Ok(result) => result,
        Err(e) => {
            tracing::error!(error = %e, "job task failed");
            return error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorKind::Internal,
                "the job's task failed",
            );
        }
    };
    drop(guard.disarm());
    let observation = finish(result, inline_cap);
    let status = observation_status(&observation, *state.phase.borrow());
    tracing::info!(tenant = tenant.as_deref().unwrap_or("-"), job_id = %observation.job_id,
        outcome = observation.outcome.as_str(), status = status.as_u16(), "run");
    json_response(status, to_json(&observation))
}

/// The decoded bytes of `/out` files a job may return inline: the policy's
/// `out.inline_bytes` when the request asked for its files (`return_files`), else none.
fn inline_cap(admitted: &crate::runner::Admitted, job: &JobRequest) -> Option<u64> {
    job.out
        .then(|| admitted.policy().filesystem.out.inline_bytes.as_u64())
}

/// The observation to send: with the released files' content inlined when asked.
fn finish(mut result: JobResult, inline_cap: Option<u64>) -> Observation {
    if let Some(cap) = inline_cap {
        let inlined = result.inline_files(cap);
        tracing::debug!(job_id = %result.observation.job_id, inlined,
            listed = result.observation.files.len(), "files returned inline");
    }
    result.observation
}

fn chunk_event(event: &OutputEvent) -> Event {
    let stream = match event.stream {
        airlock_core::StreamKind::Stdout => "stdout",
        airlock_core::StreamKind::Stderr => "stderr",
    };
    Event::default().event(stream).data(
        String::from_utf8(to_json(&OutputChunk {
            text: event.text.clone(),
        }))
        .unwrap_or_default(),
    )
}

/// The caller's W3C trace context (`traceparent`, `tracestate`, `baggage`) and tool call
/// id (`Airlock-Tool-Call-Id`), for the job's span; empty unless telemetry is on.
fn caller_of(headers: &http::HeaderMap) -> airlock_telemetry::Caller {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    airlock_telemetry::Caller::from_carrier(header)
        .with_tool_call_id(header(airlock_telemetry::TOOL_CALL_ID_HEADER))
}

/// Runs an admitted job, answering with server-sent events: output chunks, then the
/// observation. A client that goes away kills the job.
fn stream_run(
    state: &AppState,
    admitted: crate::runner::Admitted,
    job: JobRequest,
    inline_cap: Option<u64>,
    caller: airlock_telemetry::Caller,
) -> Response {
    let (tx, rx) = mpsc::channel::<Event>(SSE_BUFFER_EVENTS);
    let chunk_tx = tx.clone();
    let gap = Arc::new(AtomicBool::new(false));
    let sink: OutputSink = Arc::new(move |event: OutputEvent| {
        // Never block the job on a slow client: once a chunk does not fit, stop streaming
        // chunks (the client still gets an in-order prefix, and the full observation).
        if gap.load(Ordering::Relaxed) {
            return;
        }
        if chunk_tx.try_send(chunk_event(&event)).is_err() {
            gap.store(true, Ordering::Relaxed);
        }
    });
    let closed = tx.clone();
    let phase = state.phase.clone();
    state
        .tasks
        .spawn(airlock_telemetry::with_caller(caller, async move {
            // A client that goes away (the stream is dropped) kills the job, which is audited.
            let gone = async move { closed.closed().await };
            let observation = finish(admitted.run_until(job, Some(sink), gone).await, inline_cap);
            tracing::info!(job_id = %observation.job_id, outcome = observation.outcome.as_str(),
            status = observation_status(&observation, *phase.borrow()).as_u16(), "run (streamed)");
            let event = Event::default()
                .event("observation")
                .data(String::from_utf8(to_json(&observation)).unwrap_or_default());
            let _ = tx.send(event).await;
        }));
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<Event, Infallible>);
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(SSE_KEEP_ALIVE))
        .into_response()
}

/// The tenant sessions belong to: the token's, or `-` on a server without tokens.
fn session_tenant(tenant: &Option<Extension<AuthenticatedTenant>>) -> String {
    crate::runner::session_tenant(tenant.as_ref().map(|Extension(t)| t.0.as_str()))
}

/// A session route's failure, answered as [`session_error_response`] does: lets a handler
/// whose every failure is the session manager's use `?`.
struct SessionFailure(SessionError);

impl From<SessionError> for SessionFailure {
    fn from(error: SessionError) -> Self {
        Self(error)
    }
}

impl IntoResponse for SessionFailure {
    fn into_response(self) -> Response {
        session_error_response(&self.0)
    }
}

fn session_error_response(error: &SessionError) -> Response {
    let status = match error {
        SessionError::NotFound(_) => StatusCode::NOT_FOUND,
        e if e.is_missing_file() => StatusCode::NOT_FOUND,
        SessionError::TooMany { .. } => StatusCode::TOO_MANY_REQUESTS,
        SessionError::Disabled | SessionError::Unsupported(_) | SessionError::Denied(_) => {
            StatusCode::FORBIDDEN
        }
        SessionError::Invalid(_) => StatusCode::BAD_REQUEST,
        SessionError::KernelStart(_) => StatusCode::SERVICE_UNAVAILABLE,
        SessionError::Workspace(e) => match e.kind() {
            ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        },
    };
    let kind = match error {
        SessionError::NotFound(_) => ErrorKind::InvalidInput,
        other => other.kind(),
    };
    error_response(status, kind, error.to_string())
}

/// `POST /v1/sessions`: opens a session (body: `{}` or empty).
async fn post_session(
    State(state): State<AppState>,
    tenant: Option<Extension<AuthenticatedTenant>>,
    request: Request,
) -> Response {
    let body = match read_body(&state, request).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    if !body.iter().all(u8::is_ascii_whitespace) {
        match serde_json::from_slice::<serde_json::Value>(&body) {
            Ok(serde_json::Value::Object(map)) if map.is_empty() => {}
            _ => {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    ErrorKind::InvalidInput,
                    "the body must be {} (a session takes its settings from the policy)",
                );
            }
        }
    }
    if *state.phase.borrow() != Phase::Serving {
        return refusal_response(&state, Refusal::ShuttingDown);
    }
    let name = session_tenant(&tenant);
    let manager = match state.runner.sessions() {
        Ok(m) => m,
        Err(e) => return session_error_response(&e),
    };
    let engine = state
        .runner
        .session_engine(tenant.as_ref().map(|Extension(t)| t.0.as_str()));
    match manager.create(engine, &name).await {
        Ok(info) => json_response(StatusCode::CREATED, to_json(&SessionBody::from(info))),
        Err(e) => session_error_response(&e),
    }
}

/// `GET /v1/sessions/{id}`.
async fn get_session(
    State(state): State<AppState>,
    tenant: Option<Extension<AuthenticatedTenant>>,
    Path(id): Path<String>,
) -> Result<Response, SessionFailure> {
    let info = state
        .runner
        .sessions()?
        .get(&session_tenant(&tenant), &id)?;
    Ok(json_response(
        StatusCode::OK,
        to_json(&SessionBody::from(info)),
    ))
}

/// `DELETE /v1/sessions/{id}`.
async fn delete_session(
    State(state): State<AppState>,
    tenant: Option<Extension<AuthenticatedTenant>>,
    Path(id): Path<String>,
) -> Result<Response, SessionFailure> {
    let manager = state.runner.sessions()?;
    manager.delete(&session_tenant(&tenant), &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /v1/sessions/{id}/runs`.
async fn post_session_run(
    State(state): State<AppState>,
    tenant: Option<Extension<AuthenticatedTenant>>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    let caller = caller_of(request.headers());
    let stream = match stream_param(request.uri().query()) {
        Ok(stream) => stream,
        Err(message) => {
            return error_response(StatusCode::BAD_REQUEST, ErrorKind::InvalidInput, message);
        }
    };
    let body = match read_body(&state, request).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let call = match airlock_core::request::read_json::<SessionRunRequest>(&body)
        .and_then(SessionRunRequest::into_call)
        .map_err(|e| format!("the body is not a valid session run request: {e}"))
    {
        Ok(call) => call,
        Err(message) => {
            return error_response(StatusCode::BAD_REQUEST, ErrorKind::InvalidInput, message);
        }
    };
    if *state.phase.borrow() != Phase::Serving {
        return refusal_response(&state, Refusal::ShuttingDown);
    }
    let manager = match state.runner.sessions() {
        Ok(m) => m,
        Err(e) => return session_error_response(&e),
    };
    let name = session_tenant(&tenant);
    if stream {
        // An unknown session is a 404 before the stream starts.
        if let Err(e) = manager.get(&name, &id) {
            return session_error_response(&e);
        }
        return stream_session_run(&state, manager, name, id, call, caller);
    }
    // In its own task: a client that goes away does not cut a call in half (the call is
    // bounded by its wall time and the session's ttl either way).
    let task = state
        .tasks
        .spawn(airlock_telemetry::with_caller(caller, async move {
            manager.run(&name, &id, call).await
        }));
    match task.await {
        Ok(Ok(result)) => {
            let response = SessionRunResponse::from(result);
            let status = observation_status(&response.observation, *state.phase.borrow());
            // A call refused before it ran (a bad variable name, a wall time above the
            // ceiling) answers as /v1/runs does: its error observation is the error body.
            if status == StatusCode::OK {
                json_response(status, to_json(&response))
            } else {
                json_response(status, to_json(&response.observation))
            }
        }
        Ok(Err(e)) => session_error_response(&e),
        Err(e) => error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorKind::Internal,
            format!("the session call's task failed: {e}"),
        ),
    }
}

/// Runs a session call, answering with server-sent events: `stdout` and `stderr` chunks
/// as the code writes them (as a streamed job's), `result` events (a kernel call's
/// results, once it ended), then `session_run` with the whole answer, or `error` with an
/// error body. A client that goes away does not cut the call in half.
fn stream_session_run(
    state: &AppState,
    manager: Arc<airlock_engine::sessions::SessionManager>,
    tenant: String,
    id: String,
    call: airlock_engine::sessions::SessionCall,
    caller: airlock_telemetry::Caller,
) -> Response {
    use airlock_engine::sessions::{SessionEvent, SessionSink};
    let (tx, rx) = mpsc::channel::<Event>(SSE_BUFFER_EVENTS);
    let event_tx = tx.clone();
    let gap = Arc::new(AtomicBool::new(false));
    let sink: SessionSink = Arc::new(move |event: SessionEvent| {
        let event = match event {
            SessionEvent::Output(output) => {
                // As for a job: a slow client gets an in-order prefix of the output.
                if gap.load(Ordering::Relaxed) {
                    return;
                }
                chunk_event(&output)
            }
            SessionEvent::Result(result) => Event::default().event("result").data(
                String::from_utf8(to_json(&crate::api::RichResultBody::from(*result)))
                    .unwrap_or_default(),
            ),
        };
        if event_tx.try_send(event).is_err() {
            gap.store(true, Ordering::Relaxed);
        }
    });
    state
        .tasks
        .spawn(airlock_telemetry::with_caller(caller, async move {
            let event = match manager.run_streaming(&tenant, &id, call, Some(sink)).await {
                Ok(result) => Event::default().event("session_run").data(
                    String::from_utf8(to_json(&SessionRunResponse::from(result)))
                        .unwrap_or_default(),
                ),
                Err(e) => {
                    let kind = match &e {
                        SessionError::NotFound(_) => ErrorKind::InvalidInput,
                        other => other.kind(),
                    };
                    Event::default().event("error").data(
                        String::from_utf8(to_json(&ErrorBody::new(kind, e.to_string())))
                            .unwrap_or_default(),
                    )
                }
            };
            let _ = tx.send(event).await;
        }));
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<Event, Infallible>);
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(SSE_KEEP_ALIVE))
        .into_response()
}

/// `POST /v1/sessions/{id}/contexts`: makes a code context in a kernel session.
async fn post_session_context(
    State(state): State<AppState>,
    tenant: Option<Extension<AuthenticatedTenant>>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    let body = match read_body(&state, request).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let asked = if body.is_empty() {
        crate::api::CreateContextRequest::default()
    } else {
        match serde_json::from_slice::<crate::api::CreateContextRequest>(&body) {
            Ok(asked) => asked,
            Err(e) => {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    ErrorKind::InvalidInput,
                    format!("the body is not a valid context request: {e}"),
                );
            }
        }
    };
    let manager = match state.runner.sessions() {
        Ok(m) => m,
        Err(e) => return session_error_response(&e),
    };
    match manager
        .create_context(
            &session_tenant(&tenant),
            &id,
            asked.cwd.as_deref(),
            asked.language.as_deref(),
        )
        .await
    {
        Ok(context) => json_response(
            StatusCode::CREATED,
            to_json(&crate::api::KernelContextBody::from(context)),
        ),
        Err(e) => session_error_response(&e),
    }
}

/// `GET /v1/sessions/{id}/contexts`.
async fn list_session_contexts(
    State(state): State<AppState>,
    tenant: Option<Extension<AuthenticatedTenant>>,
    Path(id): Path<String>,
) -> Result<Response, SessionFailure> {
    let manager = state.runner.sessions()?;
    let contexts: Vec<crate::api::KernelContextBody> = manager
        .list_contexts(&session_tenant(&tenant), &id)
        .await?
        .into_iter()
        .map(Into::into)
        .collect();
    Ok(json_response(
        StatusCode::OK,
        to_json(&serde_json::json!({ "contexts": contexts })),
    ))
}

/// `POST /v1/sessions/{id}/contexts/{context}/restart`.
async fn restart_session_context(
    state: State<AppState>,
    tenant: Option<Extension<AuthenticatedTenant>>,
    Path((id, context)): Path<(String, String)>,
) -> Result<Response, SessionFailure> {
    on_session_context(state, tenant, id, context, ContextAction::Restart).await
}

/// `DELETE /v1/sessions/{id}/contexts/{context}`.
async fn delete_session_context(
    state: State<AppState>,
    tenant: Option<Extension<AuthenticatedTenant>>,
    Path((id, context)): Path<(String, String)>,
) -> Result<Response, SessionFailure> {
    on_session_context(state, tenant, id, context, ContextAction::Remove).await
}

/// What a client asks of one of a session's code contexts.
#[derive(Clone, Copy)]
enum ContextAction {
    Restart,
    Remove,
}

/// Restarts or removes a context: 204, or the session error's answer.
async fn on_session_context(
    State(state): State<AppState>,
    tenant: Option<Extension<AuthenticatedTenant>>,
    id: String,
    context: String,
    action: ContextAction,
) -> Result<Response, SessionFailure> {
    let manager = state.runner.sessions()?;
    let tenant = session_tenant(&tenant);
    match action {
        ContextAction::Restart => manager.restart_context(&tenant, &id, &context).await?,
        ContextAction::Remove => manager.remove_context(&tenant, &id, &context).await?,
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /v1/sessions/{id}/files`: every name escaped and redacted as `/out`'s are (a file
/// named after a key is listed as `[REDACTED:…]`); the secrets replaced are counted in the
/// audit log.
async fn list_session_files(
    State(state): State<AppState>,
    tenant: Option<Extension<AuthenticatedTenant>>,
    Path(id): Path<String>,
) -> Response {
    let manager = match state.runner.sessions() {
        Ok(m) => m,
        Err(e) => return session_error_response(&e),
    };
    let files = match manager.list_files(&session_tenant(&tenant), &id) {
        Ok(files) => files,
        Err(e) => return session_error_response(&e),
    };
    let engine = state
        .runner
        .session_engine(tenant.as_ref().map(|Extension(t)| t.0.as_str()));
    let mut shown = Vec::with_capacity(files.len());
    let mut redactions = 0;
    for file in files {
        let Some((path, count)) = engine.shown_workspace_name(&file.path) else {
            return error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorKind::Internal,
                "redaction is unavailable; the session's file names are withheld",
            );
        };
        redactions += count;
        shown.push(SessionFile {
            path,
            bytes: file.bytes,
        });
    }
    if redactions > 0 {
        audit_session_files(
            &engine,
            &session_tenant(&tenant),
            &id,
            serde_json::json!({"event": "session_files_listed", "redactions": redactions}),
        );
    }
    json_response(StatusCode::OK, to_json(&SessionFiles { files: shown }))
}

/// `GET /v1/sessions/{id}/files/{path}`: the file's bytes, scanned as a `/out` file is:
/// text with its secrets replaced (`X-Airlock-Redactions` says how many), a binary with a
/// secret-shaped string in it, or a file named like a secret, withheld (403, the reason in
/// the error). Every read is an audit line with its count.
async fn get_session_file(
    State(state): State<AppState>,
    tenant: Option<Extension<AuthenticatedTenant>>,
    Path((id, path)): Path<(String, String)>,
) -> Response {
    let manager = match state.runner.sessions() {
        Ok(m) => m,
        Err(e) => return session_error_response(&e),
    };
    let bytes = match manager.read_file(&session_tenant(&tenant), &id, &path) {
        Ok(bytes) => bytes,
        Err(e) => return session_error_response(&e),
    };
    let engine = state
        .runner
        .session_engine(tenant.as_ref().map(|Extension(t)| t.0.as_str()));
    let read = bytes.len() as u64;
    let shown_path = engine
        .shown_workspace_name(&path)
        .map(|(shown, _)| shown)
        .unwrap_or_default();
    let line = |redactions: u64, withheld: Option<&str>| {
        serde_json::json!({
            "event": "session_file_read",
            "path": shown_path,
            "bytes": read,
            "redactions": redactions,
            "withheld": withheld,
        })
    };
    match engine.release_workspace_file(&path, bytes) {
        WorkspaceFileRelease::Released {
            content,
            redactions,
        } => {
            audit_session_files(
                &engine,
                &session_tenant(&tenant),
                &id,
                line(redactions, None),
            );
            let mut response = (StatusCode::OK, content).into_response();
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            response
                .headers_mut()
                .insert(REDACTIONS_HEADER, HeaderValue::from(redactions));
            response
        }
        WorkspaceFileRelease::Withheld { reason, secrets } => {
            audit_session_files(
                &engine,
                &session_tenant(&tenant),
                &id,
                line(secrets, Some(&reason)),
            );
            error_response(
                StatusCode::FORBIDDEN,
                ErrorKind::PolicyDenied,
                format!("{shown_path}: withheld: {reason}"),
            )
        }
    }
}

/// The header of a session file read that counts the secrets replaced in it.
const REDACTIONS_HEADER: &str = "x-airlock-redactions";

/// Appends an audit line about what the host handed back from a session's workspace.
fn audit_session_files(
    engine: &airlock_engine::Engine,
    tenant: &str,
    id: &str,
    line: serde_json::Value,
) {
    engine.audit_workspace_access(id, tenant, line);
}

/// `PUT /v1/sessions/{id}/files/{path}`: the body is the file's bytes.
async fn put_session_file(
    State(state): State<AppState>,
    tenant: Option<Extension<AuthenticatedTenant>>,
    Path((id, path)): Path<(String, String)>,
    request: Request,
) -> Response {
    let body = match read_body(&state, request).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let manager = match state.runner.sessions() {
        Ok(m) => m,
        Err(e) => return session_error_response(&e),
    };
    match manager.write_file(&session_tenant(&tenant), &id, &path, &body) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => session_error_response(&e),
    }
}

/// `GET /v1/health`.
async fn get_health(State(state): State<AppState>) -> Response {
    let phase = *state.phase.borrow();
    let admission = state.runner.admission();
    let health = Health {
        status: if phase == Phase::Serving {
            "ok"
        } else {
            "draining"
        }
        .to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        jobs_in_flight: state.runner.in_flight() as u64,
        queue_depth: state.runner.queued() as u64,
        max_in_flight: admission.max_in_flight as u64,
        max_queue: admission.queue as u64,
    };
    let status = if phase == Phase::Serving {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(status, to_json(&health))
}

/// `GET /metrics`: Prometheus text 0.0.4, or OpenMetrics when `Accept` prefers it.
async fn get_metrics(State(state): State<AppState>, headers: http::HeaderMap) -> Response {
    if let Some(stats) = state.runner.warm_pool_stats() {
        state.runner.metrics().warm_pool(stats);
    }
    state.runner.metrics().audit(&state.runner.audit_health());
    if state.runner.metrics().root_cache_due() {
        // A walk of the cache's tree: off the async threads.
        if let Ok((bytes, copies)) =
            tokio::task::spawn_blocking(airlock_engine::root_cache_usage).await
        {
            state.runner.metrics().root_cache(bytes, copies);
        }
    }
    let format = ExpositionFormat::negotiate(
        headers
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok()),
    );
    let mut response = state.runner.metrics().render(format).into_response();
    let response_headers = response.headers_mut();
    response_headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    response_headers.insert(http::header::VARY, HeaderValue::from_static("accept"));
    response
}

/// `GET /v1/openapi.json`.
async fn get_openapi(State(state): State<AppState>) -> Response {
    json_response(StatusCode::OK, state.openapi.to_vec())
}

/// `format=chat|responses` from the query string (chat when absent); `strict=true` is
/// accepted for clients that send it: the schema is always strict.
fn format_param(query: Option<&str>) -> Result<ToolSchemaFormat, String> {
    let mut format = ToolSchemaFormat::default();
    for pair in query.unwrap_or("").split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "format" => format = value.parse()?,
            "strict" if !matches!(value, "true" | "1" | "") => {
                return Err(format!(
                    "strict={value:?}: the tool schema is always strict"
                ));
            }
            _ => {}
        }
    }
    Ok(format)
}

/// `GET /v1/tool-schema[?format=chat|responses]`: the strict function-calling schema.
async fn get_tool_schema(
    State(state): State<AppState>,
    tenant: Option<Extension<AuthenticatedTenant>>,
    uri: axum::http::Uri,
) -> Response {
    let format = match format_param(uri.query()) {
        Ok(format) => format,
        Err(message) => {
            return error_response(StatusCode::BAD_REQUEST, ErrorKind::InvalidInput, message);
        }
    };
    let tenant = tenant.map(|Extension(t)| t.0);
    let policy = state.runner.policy(tenant.as_deref());
    json_response(
        StatusCode::OK,
        to_json(&airlock_mcp::tool::function_schema(&policy, format)),
    )
}

async fn not_found() -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        ErrorKind::InvalidInput,
        "no such endpoint (see /v1/openapi.json)",
    )
}

async fn method_not_allowed() -> Response {
    error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        ErrorKind::InvalidInput,
        "method not allowed on this endpoint (see /v1/openapi.json)",
    )
}

/// Refuses, before anything else runs, what a web page could send: on a server without
/// tokens (`unauthenticated_port` is its listening port) a `Host` that is not its loopback
/// address or a foreign `Origin` (403, `policy_denied`); on every server a POST body not
/// labelled `application/json` (415, `invalid_input`), so a page must preflight.
async fn refuse_web_pages(
    State((unauthenticated_port, metrics)): State<(Option<u16>, Arc<crate::metrics::Metrics>)>,
    request: Request,
    next: Next,
) -> Response {
    if let Some((reason, refused)) = web_page_refusal(&request, unauthenticated_port) {
        metrics.rejected(reason);
        return refused;
    }
    next.run(request).await
}

/// The refusal of a request a web page could have sent, and its metrics reason.
fn web_page_refusal(
    request: &Request,
    unauthenticated_port: Option<u16>,
) -> Option<(&'static str, Response)> {
    let header = |name| {
        request
            .headers()
            .get(name)
            .map(|v: &HeaderValue| v.to_str().unwrap_or("\u{fffd}"))
    };
    if let Some(port) = unauthenticated_port {
        let host = header(http::header::HOST)
            .or_else(|| request.uri().authority().map(http::uri::Authority::as_str));
        if let Err(message) = crate::local::check_host(host, port)
            .and_then(|()| crate::local::check_origin(header(http::header::ORIGIN)))
        {
            return Some((
                "foreign_host",
                error_response(StatusCode::FORBIDDEN, ErrorKind::PolicyDenied, message),
            ));
        }
    }
    if request.method() == http::Method::POST
        && let Err(message) = crate::local::require_json(header(CONTENT_TYPE))
    {
        return Some((
            "not_json",
            error_response(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorKind::InvalidInput,
                message,
            ),
        ));
    }
    None
}

/// The router: the API, `/mcp`, and the layers every request goes through.
/// `unauthenticated_port` is the listening port of a server without tokens, whose
/// requests must come from loopback callers ([`crate::local`]).
pub fn router(
    state: AppState,
    mcp_cancel: CancellationToken,
    unauthenticated_port: Option<u16>,
) -> Router {
    let executor: Arc<dyn airlock_mcp::Executor> = state.runner.clone();
    let a2a = airlock_a2a::A2aAgent::new(
        executor.clone(),
        state.tokens.is_some(),
        state.max_body_bytes,
    );
    let mcp = crate::mcp_sessions::mcp_router(executor, mcp_cancel, state.max_body_bytes);
    let protected = Router::new()
        .route("/v1/runs", post(post_run))
        .route("/v1/sessions", post(post_session))
        .route("/v1/sessions/{id}", get(get_session).delete(delete_session))
        .route("/v1/sessions/{id}/runs", post(post_session_run))
        .route("/v1/sessions/{id}/files", get(list_session_files))
        .route(
            "/v1/sessions/{id}/contexts",
            get(list_session_contexts).post(post_session_context),
        )
        .route(
            "/v1/sessions/{id}/contexts/{context}",
            axum::routing::delete(delete_session_context),
        )
        .route(
            "/v1/sessions/{id}/contexts/{context}/restart",
            post(restart_session_context),
        )
        .route(
            "/v1/sessions/{id}/files/{*path}",
            get(get_session_file).put(put_session_file),
        )
        .route("/v1/tool-schema", get(get_tool_schema))
        .route("/metrics", get(get_metrics))
        .merge(mcp)
        .merge(airlock_a2a::rpc_router(a2a.clone()))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_token,
        ));
    let public = Router::new()
        .route("/v1/health", get(get_health))
        .route("/v1/openapi.json", get(get_openapi))
        .merge(airlock_a2a::card_router(a2a));
    protected
        .merge(public)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state.clone())
        .merge(airlock_e2b::control::router(state.e2b.clone()))
        .layer(axum::middleware::from_fn_with_state(
            (unauthenticated_port, state.runner.metrics().clone()),
            refuse_web_pages,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.e2b.clone(),
            route_e2b_sandbox_requests,
        ))
        .layer(
            tower_http::trace::TraceLayer::new_for_http()
                .make_span_with(
                    tower_http::trace::DefaultMakeSpan::new().level(tracing::Level::INFO),
                )
                .on_response(
                    tower_http::trace::DefaultOnResponse::new().level(tracing::Level::INFO),
                ),
        )
        // Outermost: whatever logs a request sees Authorization as "Sensitive".
        .layer(
            tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer::new([
                AUTHORIZATION,
                http::HeaderName::from_static("x-api-key"),
                http::HeaderName::from_static("x-access-token"),
                http::HeaderName::from_static("e2b-traffic-access-token"),
            ]),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_parameter() {
        assert_eq!(stream_param(None), Ok(false));
        assert_eq!(format_param(None), Ok(ToolSchemaFormat::Chat));
        assert_eq!(
            format_param(Some("format=responses&strict=true")),
            Ok(ToolSchemaFormat::Responses)
        );
        assert!(format_param(Some("format=xml")).is_err());
        assert!(format_param(Some("strict=false")).is_err());
        assert_eq!(stream_param(Some("stream=true")), Ok(true));
        assert_eq!(stream_param(Some("x=1&stream=1")), Ok(true));
        assert_eq!(stream_param(Some("stream=false")), Ok(false));
        assert!(stream_param(Some("stream=yes")).is_err());
    }
}
