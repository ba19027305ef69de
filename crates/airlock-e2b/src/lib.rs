//! airlock-e2b answers E2B's SDKs: the control plane (`/sandboxes`, `/v2/sandboxes`: create,
//! list, get, kill, timeout, connect) and the in-sandbox API envd serves in an E2B sandbox
//! (`/health`, `/files`, the Connect RPCs `process.Process/*` and
//! `filesystem.Filesystem/*`), as axum routers `airlock serve` mounts on its one listener.
//!
//! An E2B sandbox is an airlock session of the caller's tenant ([`SandboxRegistry`] maps
//! the E2B id to it): its files are the session's `/work` (E2B's `/home/user`), each
//! command is a fresh hardened sandbox over it, and it ends at its E2B timeout, which the
//! session's `ttl` caps. The in-sandbox API is reached by the `E2b-Sandbox-Id` and
//! `E2b-Sandbox-Port` headers or by a Host of `{port}-{sandboxID}.{domain}`
//! ([`sandbox_target`]), and every call there must carry the sandbox's own
//! `X-Access-Token` (its `envdAccessToken`), compared in constant time: knowing another
//! tenant's sandbox id gives nothing. It must not run sandboxes itself (the engine does),
//! check paths itself (`airlock_host::workspace` does), or implement what it refuses:
//! everything E2B has and airlock does not answers "not supported by airlock: ...".
#![forbid(unsafe_code)]

pub mod control;
pub mod envd;
pub mod paths;
pub mod process;
pub mod registry;
pub mod wire;

use std::sync::Arc;

use airlock_engine::Engine;
use airlock_engine::sessions::{SessionError, SessionManager};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode};

pub use registry::{Sandbox, SandboxRegistry};

/// The envd version this server presents. The SDKs gate features on it: stdin (0.3.0),
/// the default user (0.4.0), octet-stream and gzip uploads (0.5.7), all of which this
/// server answers; file metadata (0.6.2) and the newer watch options, which it does not,
/// stay off.
pub const ENVD_VERSION: &str = "0.5.7";
/// The port of envd in an E2B sandbox (commands, files).
pub const ENVD_PORT: u16 = 49983;
/// The port of the code interpreter's Jupyter server in an E2B sandbox.
pub const CODE_INTERPRETER_PORT: u16 = 49999;
/// The header naming the sandbox a data-plane request is for.
pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
/// The header naming the port inside the sandbox.
pub const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";
/// The header carrying the sandbox's `envdAccessToken`.
pub const ACCESS_TOKEN_HEADER: &str = "x-access-token";
/// The header carrying the API key on control-plane calls.
pub const API_KEY_HEADER: &str = "x-api-key";
/// The prefix of E2B API keys (`airlock token new --e2b` mints `e2b_` + hex).
pub const E2B_KEY_PREFIX: &str = "e2b_";

/// What the E2B routes need of the server they are mounted in.
pub trait E2bHost: Send + Sync + 'static {
    /// The tenant of an API key: `Ok(Some(name))`; `Ok(None)` when the server runs
    /// without tokens (loopback only); `Err(())` when the key is missing or not valid.
    #[allow(clippy::result_unit_err)]
    fn tenant(&self, api_key: Option<&str>) -> Result<Option<String>, ()>;
    /// The server's sessions.
    fn sessions(&self) -> Result<Arc<SessionManager>, SessionError>;
    /// The engine (and so the policy) a tenant's sessions run under.
    fn engine(&self, tenant: Option<&str>) -> Arc<Engine>;
    /// The engine the sandboxes of the tenant's E2B template `template` run on: the
    /// template's own when it names a root or memory of its own (`[e2b.templates.NAME]
    /// rootfs`, `memory`), else [`E2bHost::engine`]'s.
    fn template_engine(&self, tenant: Option<&str>, template: &str) -> Arc<Engine> {
        let _ = template;
        self.engine(tenant)
    }
    /// Largest request body.
    fn max_body_bytes(&self) -> usize;
    /// Longest time for a request body to arrive.
    fn body_timeout(&self) -> std::time::Duration;
}

/// The E2B API's state: the server it is mounted in and the sandboxes it made.
#[derive(Clone)]
pub struct E2b {
    /// The server.
    pub host: Arc<dyn E2bHost>,
    /// The sandboxes.
    pub sandboxes: Arc<SandboxRegistry>,
}

impl std::fmt::Debug for E2b {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2b").finish_non_exhaustive()
    }
}

impl E2b {
    /// The E2B API over `host`, with its reaper (sandboxes past their timeout are killed)
    /// running on the current tokio runtime.
    pub fn start(host: Arc<dyn E2bHost>) -> Self {
        let sandboxes = Arc::new(SandboxRegistry::default());
        tokio::spawn(registry::reap_loop(
            Arc::downgrade(&sandboxes),
            host.clone(),
        ));
        Self { host, sandboxes }
    }

    /// Kills every sandbox (server shutdown).
    pub async fn shutdown(&self) {
        self.sandboxes.kill_all(self.host.as_ref()).await;
    }
}

/// Where a data-plane request goes: a sandbox and a port inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxTarget {
    /// The E2B sandbox id.
    pub sandbox_id: String,
    /// The port (49983 envd, 49999 the code interpreter).
    pub port: u16,
}

/// Whether a sandbox id has E2B's shape (and so can be routed): 1-64 of `[a-z0-9]`.
pub fn is_sandbox_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// The sandbox a request is for, when it is a data-plane request: by the
/// `E2b-Sandbox-Id` header (and `E2b-Sandbox-Port`, envd's when absent), else by a Host
/// of `{port}-{sandboxID}.{domain}` (E2B's host routing behind a wildcard-DNS proxy).
pub fn sandbox_target(headers: &HeaderMap) -> Option<SandboxTarget> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(id) = header(SANDBOX_ID_HEADER) {
        let port = header(SANDBOX_PORT_HEADER)
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(ENVD_PORT);
        return Some(SandboxTarget {
            sandbox_id: id.trim().to_owned(),
            port,
        });
    }
    let host = header(http::header::HOST.as_str())?;
    let host = host.rsplit_once(':').map_or(host, |(name, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            name
        } else {
            host
        }
    });
    let (first, domain) = host.split_once('.')?;
    let (port, id) = first.split_once('-')?;
    if domain.is_empty() || port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let id = id.to_ascii_lowercase();
    is_sandbox_id(&id).then_some(SandboxTarget {
        sandbox_id: id,
        port: port.parse().ok()?,
    })
}

/// Serves a data-plane request (one [`sandbox_target`] found a target for): checks the
/// sandbox and its access token, then routes by port and path.
pub fn serve_sandbox(
    e2b: E2b,
    target: SandboxTarget,
    request: Request,
) -> impl std::future::Future<Output = Response> + Send {
    serve_sandbox_inner(e2b, target, request)
}

async fn serve_sandbox_inner(e2b: E2b, target: SandboxTarget, request: Request) -> Response {
    match target.port {
        ENVD_PORT => envd::serve(e2b, target, request).await,
        CODE_INTERPRETER_PORT => envd::serve_code_interpreter(e2b, target, request).await,
        other => wire::ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!(
                "The sandbox {} port is not open: airlock serves envd ({ENVD_PORT}) and the code interpreter ({CODE_INTERPRETER_PORT}), not {other}",
                target.sandbox_id
            ),
        )
        .into_response(),
    }
}

/// A new random secret of `bytes` random bytes, hex.
pub fn random_hex(bytes: usize) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(hex::encode(buf))
}

/// A new API key in E2B's shape: `e2b_` and 64 hex digits (32 random bytes).
pub fn generate_api_key() -> std::io::Result<String> {
    Ok(format!("{E2B_KEY_PREFIX}{}", random_hex(32)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn requests_route_by_header_or_by_host() {
        let by_header = sandbox_target(&headers(&[
            ("E2b-Sandbox-Id", "abc123"),
            ("E2b-Sandbox-Port", "49999"),
            ("host", "127.0.0.1:8700"),
        ]));
        assert_eq!(
            by_header,
            Some(SandboxTarget {
                sandbox_id: "abc123".into(),
                port: 49999
            })
        );
        let default_port = sandbox_target(&headers(&[("E2b-Sandbox-Id", "abc123")])).unwrap();
        assert_eq!(default_port.port, ENVD_PORT);
        let by_host = sandbox_target(&headers(&[(
            "host",
            "49983-abc123.sandbox.example.com:443",
        )]))
        .unwrap();
        assert_eq!(by_host.sandbox_id, "abc123");
        assert_eq!(by_host.port, 49983);
        for control in [
            "127.0.0.1:8700",
            "api.example.com",
            "localhost",
            "x-abc.example.com",
            "49983-.example.com",
            "49983-abc",
            "49983-a_b.example.com",
        ] {
            assert_eq!(
                sandbox_target(&headers(&[("host", control)])),
                None,
                "{control}"
            );
        }
    }

    #[test]
    fn api_keys_have_e2b_shape() {
        let key = generate_api_key().unwrap();
        let hex_part = key.strip_prefix("e2b_").unwrap();
        assert_eq!(hex_part.len(), 64);
        assert!(
            hex_part
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_ne!(key, generate_api_key().unwrap());
    }
}
