//! The MCP crate's error type.

/// What can go wrong while serving MCP (not inside a job: jobs end as observations).
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The MCP session could not be set up (handshake failed, transport closed early).
    #[error("start MCP session")]
    StartSession(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The MCP session ended with an error.
    #[error("serve MCP session")]
    ServeSession(#[source] Box<dyn std::error::Error + Send + Sync>),
}
