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

use futures_util::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::RestoreOutcome;
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{
    EventStore, ServerSseMessage, SessionId, SessionManager,
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
