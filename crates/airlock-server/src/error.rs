//! The server's error type: what can stop it from starting or serving. Jobs never end
//! here: every job ends as an observation.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Why the server cannot start or keep serving.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The tokens file cannot be read.
    #[error("read tokens file {path}")]
    ReadTokens {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The tokens file is not valid.
    #[error("tokens file {path}: {reason}")]
    ParseTokens {
        /// The path.
        path: PathBuf,
        /// What is wrong, naming the key.
        reason: String,
    },
    /// A policy (the server's or a tenant's) cannot be loaded.
    #[error("load policy")]
    LoadPolicy(#[source] airlock_engine::EngineError),
    /// An audit log cannot be opened.
    #[error("open audit log")]
    OpenAudit(#[source] airlock_engine::EngineError),
    /// The server would listen beyond loopback without authentication.
    #[error(
        "refusing to listen on {addr} without a tokens file: anyone who can reach it could run \
         code. Give --tokens FILE (see `airlock token new`), or listen on 127.0.0.1"
    )]
    UnauthenticatedNonLoopback {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// The listening socket cannot be bound.
    #[error("listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// A signal handler cannot be installed.
    #[error("install signal handlers")]
    Signals(#[source] std::io::Error),
    /// The tokens file is not safe to add a token to.
    #[error("tokens file {path}: {reason}")]
    UnsafeTokensFile {
        /// The path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The tokens file cannot be written.
    #[error("write tokens file {path}")]
    WriteTokens {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The random source cannot be read (for new tokens).
    #[error("read random bytes")]
    Random(#[source] std::io::Error),
}
