//! MCP sessions over streamable HTTP, bounded.
//!
//! Clients on MCP protocol versions before 2026-07-28 (the official `mcp` Python SDK, the
//! Agents SDK, langchain-mcp-adapters, CrewAI's adapter) cancel a call with a
//! `notifications/cancelled` sent on a POST of its own, and leave the call's connection
//! open. Only a session can route that notification to the call it names, so `/mcp` keeps
//! sessions for them; newer clients are served statelessly and cancel by closing the
//! connection. Sessions are memory the server holds for a client, so their number is
//! capped and an idle one ends on its own.

use std::sync::Arc;
use std::time::Duration;

use airlock_mcp::{Executor, RunCodeServer};
use futures_util::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{
    EventStore, ServerSseMessage, SessionId, SessionManager,
};
use rmcp::transport::streamable_http_server::{
    RestoreOutcome, StreamableHttpServerConfig, StreamableHttpService,
};

/// Most MCP sessions open at once; a client past it is refused until one ends.
pub const MAX_MCP_SESSIONS: usize = 1024;

/// A session without any request for this long ends (its client reconnects with a new one).
pub const MCP_SESSION_IDLE: Duration = Duration::from_secs(10 * 60);

/// Time a new session has to send `initialize`.
const MCP_SESSION_INIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why an MCP session operation failed.
#[derive(Debug, thiserror::Error)]
pub enum McpSessionError {
    /// [`MAX_MCP_SESSIONS`] are open.
    #[error("{MAX_MCP_SESSIONS} MCP sessions are open; close one (DELETE /mcp) or wait")]
    TooMany,
    /// The session store's own error.
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
}

/// rmcp's in-memory sessions with a cap on their number and an idle timeout.
#[derive(Debug)]
pub struct BoundedSessions {
    inner: LocalSessionManager,
    max: usize,
}

impl BoundedSessions {
    /// At most `max` sessions, each ending after [`MCP_SESSION_IDLE`] without requests.
    pub fn new(max: usize) -> Self {
        let mut inner = LocalSessionManager::default();
        inner.session_config.keep_alive = Some(MCP_SESSION_IDLE);
        inner.session_config.init_timeout = Some(MCP_SESSION_INIT_TIMEOUT);
        Self { inner, max }
    }

    /// Sessions open now.
    pub async fn len(&self) -> usize {
        self.inner.sessions.read().await.len()
    }

    /// Whether no session is open.
    pub async fn is_empty(&self) -> bool {
        self.len().await == 0
    }
}

impl Default for BoundedSessions {
    fn default() -> Self {
        Self::new(MAX_MCP_SESSIONS)
    }
}

impl SessionManager for BoundedSessions {
    type Error = McpSessionError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        // An ended session is removed by rmcp's worker task, so the count is of live ones.
        // Check and insert are not one step: concurrent creations may pass the cap by the
        // number of requests in flight, which the server's own request limits bound.
        if self.len().await >= self.max {
            tracing::warn!(max = self.max, "MCP session refused: too many open");
            return Err(McpSessionError::TooMany);
        }
        Ok(self.inner.create_session().await?)
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        Ok(self.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_stream(id, message).await?)
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.resume(id, last_event_id).await?)
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        Ok(self.inner.restore_session(id).await?)
    }

    fn event_store(&self) -> Option<Arc<dyn EventStore>> {
        self.inner.event_store()
    }
}

/// What a closed connection cancels: a `tools/call` in a session, whose answer the client
/// can no longer receive.
struct PendingCall {
    sessions: Arc<BoundedSessions>,
    session: SessionId,
    request_id: serde_json::Value,
}

impl PendingCall {
    /// Tells the session the call is cancelled, as the client's own
    /// `notifications/cancelled` would: the tool's handler sees its cancellation token
    /// fire and the job is killed.
    fn cancel(self) {
        let notification = serde_json::json!({
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": self.request_id, "reason": "the client closed its connection"},
        });
        let Ok(message) = serde_json::from_value::<ClientJsonRpcMessage>(notification) else {
            return;
        };
        tokio::spawn(async move {
            if let Err(e) = self.sessions.accept_message(&self.session, message).await {
                // The session ended with the connection: its calls ended with it.
                tracing::debug!(error = %e, "cancel of a disconnected MCP call not delivered");
            }
        });
    }
}

/// A response body that cancels its call when dropped before its end.
struct CancelOnDrop {
    inner: axum::body::Body,
    pending: Option<PendingCall>,
}

impl axum::body::HttpBody for CancelOnDrop {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let std::task::Poll::Ready(None) = polled {
            // Delivered whole: nothing to cancel.
            self.pending = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(pending) = self.pending.take() {
            pending.cancel();
        }
    }
}

/// Middleware for `/mcp`: a `tools/call` in a session whose client closes the connection
/// before the answer is cancelled. Sessions outlive connections (a client may resume a
/// stream), so rmcp does not treat a closed connection as a cancellation; airlock does,
/// since a job whose answer nobody will read must not keep its slot. Stateless calls need
/// nothing: there the closed connection drops the call itself.
pub async fn cancel_on_disconnect(
    sessions: Arc<BoundedSessions>,
    max_body_bytes: usize,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let session = request
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(SessionId::from);
    let Some(session) = session.filter(|_| request.method() == http::Method::POST) else {
        return next.run(request).await;
    };
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, max_body_bytes).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return crate::http::error_response(
                http::StatusCode::PAYLOAD_TOO_LARGE,
                airlock_core::ErrorKind::InvalidInput,
                format!(
                    "the request body is larger than this server's limit of {max_body_bytes} \
                     bytes (airlock serve --max-body)"
                ),
            );
        }
    };
    let request_id = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .filter(|message| message["method"] == "tools/call")
        .and_then(|message| message.get("id").cloned());
    let response = next
        .run(axum::extract::Request::from_parts(
            parts,
            axum::body::Body::from(bytes),
        ))
        .await;
    let Some(request_id) = request_id else {
        return response;
    };
    let (parts, body) = response.into_parts();
    let body = CancelOnDrop {
        inner: body,
        pending: Some(PendingCall {
            sessions,
            session,
            request_id,
        }),
    };
    axum::response::Response::from_parts(parts, axum::body::Body::new(body))
}

/// The `/mcp` route: rmcp's streamable-HTTP service over [`BoundedSessions`], with
/// [`cancel_on_disconnect`] and [`session_end_is_no_content`] around it. Authentication is
/// the caller's layer. `cancel` ends every MCP call (shutdown).
pub fn mcp_router<S: Clone + Send + Sync + 'static>(
    executor: Arc<dyn Executor>,
    cancel: tokio_util::sync::CancellationToken,
    max_body_bytes: usize,
) -> axum::Router<S> {
    // rmcp's own Host check is off: the server's `refuse_web_pages` checks Host and Origin
    // on every route, /mcp included, with the listening port; with tokens a page cannot
    // call in anyway, and real host names must work. Sessions are kept for clients of
    // protocol versions before 2026-07-28, whose cancellations arrive on a POST of their
    // own (see the module's doc); newer ones are served statelessly.
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(true)
        .with_json_response(true)
        .with_cancellation_token(cancel.clone())
        .with_max_request_body_bytes(max_body_bytes)
        .disable_allowed_hosts();
    let sessions = Arc::new(BoundedSessions::default());
    // One store of jobs' /out files for every session: a file is read back on a later
    // request, in another session or statelessly.
    let resources = Arc::new(airlock_mcp::OutResources::default());
    // One store of tasks too, each owned by the tenant that made it: a task is polled on
    // later requests. Shutdown cancels the running ones (their jobs are killed).
    let tasks = Arc::new(airlock_mcp::TaskStore::new(cancel.clone()));
    let service = StreamableHttpService::new(
        move || {
            Ok(RunCodeServer::with_stores(
                executor.clone(),
                resources.clone(),
                tasks.clone(),
            ))
        },
        sessions.clone(),
        config,
    );
    axum::Router::new()
        .route_service("/mcp", service)
        .layer(axum::middleware::from_fn(move |request, next| {
            cancel_on_disconnect(sessions.clone(), max_body_bytes, request, next)
        }))
        .layer(axum::middleware::from_fn(session_end_is_no_content))
}

/// Middleware for `/mcp`: a `DELETE` that ended a session answers 204 No Content, not
/// rmcp's 202 Accepted. The official `mcp` Python client (1.x and 2.x) takes only 200 or
/// 204 as a successful termination and logs `Session termination failed: 202` on every
/// close otherwise; the session is gone either way, and 204 says exactly that.
pub async fn session_end_is_no_content(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let delete = request.method() == http::Method::DELETE;
    let response = next.run(request).await;
    if !delete || response.status() != http::StatusCode::ACCEPTED {
        return response;
    }
    let (mut parts, _) = response.into_parts();
    parts.status = http::StatusCode::NO_CONTENT;
    parts.headers.remove(http::header::CONTENT_LENGTH);
    parts.headers.remove(http::header::CONTENT_TYPE);
    axum::response::Response::from_parts(parts, axum::body::Body::empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::{BoxFuture, JobRequest, JobResult, Policy};
    use tower::ServiceExt;

    /// An executor that is never asked to run a job (the tests here only manage sessions).
    struct NoJobs(Arc<Policy>);

    impl Executor for NoJobs {
        fn policy(&self, _tenant: Option<&str>) -> Arc<Policy> {
            self.0.clone()
        }
        fn run(&self, request: JobRequest, _tenant: Option<String>) -> BoxFuture<'_, JobResult> {
            let version = self.0.version.clone();
            Box::pin(async move {
                airlock_mcp::observation_only(airlock_engine::early_error(
                    airlock_core::ErrorKind::Internal,
                    format!("no job runs here ({} bytes)", request.source.len()),
                    &version,
                ))
            })
        }
    }

    fn router() -> axum::Router {
        mcp_router(
            Arc::new(NoJobs(Arc::new(Policy::builtin()))),
            tokio_util::sync::CancellationToken::new(),
            1 << 20,
        )
    }

    async fn send(
        router: &axum::Router,
        method: http::Method,
        session: Option<&str>,
        body: Option<serde_json::Value>,
    ) -> axum::response::Response {
        let mut request = http::Request::builder()
            .method(method)
            .uri("/mcp")
            .header("host", "127.0.0.1")
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("mcp-protocol-version", "2025-06-18");
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        let body = body.map_or_else(axum::body::Body::empty, |b| {
            axum::body::Body::from(b.to_string())
        });
        router
            .clone()
            .oneshot(request.body(body).unwrap())
            .await
            .unwrap()
    }

    /// Issue 30 item 5: rmcp answers a session's DELETE with 202, which the official
    /// Python client logs as a failed termination; /mcp answers 204, and the session is
    /// gone.
    #[tokio::test]
    async fn ending_a_session_answers_204_and_ends_it() {
        let router = router();
        let initialize = serde_json::json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "0"}}
        });
        let response = send(&router, http::Method::POST, None, Some(initialize)).await;
        let status = response.status();
        let headers = response.headers().clone();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        assert_eq!(status, http::StatusCode::OK, "{body:?}");
        let session = headers
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .unwrap()
            .to_owned();
        let response = send(&router, http::Method::DELETE, Some(&session), None).await;
        assert_eq!(response.status(), http::StatusCode::NO_CONTENT);
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        assert!(body.is_empty());
        // The session is gone: a request in it is refused.
        let list = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
        let again = send(&router, http::Method::POST, Some(&session), Some(list)).await;
        assert_eq!(again.status(), http::StatusCode::NOT_FOUND);
    }
}
