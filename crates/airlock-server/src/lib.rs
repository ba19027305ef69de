//! airlock-server owns `airlock serve`: the HTTP API (run a job and get its observation,
//! or stream its output as server-sent events), bearer-token authentication against a
//! tokens file of sha256 digests, admission control (jobs in flight, a bounded queue,
//! per-tenant limits), Prometheus metrics, the OpenAPI document, the `run_code` tool schema,
//! MCP over streamable HTTP at `/mcp`, and graceful shutdown. It must not run sandboxes
//! itself (the engine and its backends do), redact output (the engine does), or ever log,
//! count or audit a token or a job's output and environment: tenants, sizes and ids only.
#![forbid(unsafe_code)]

pub mod api;
pub mod auth;
pub mod error;
pub mod fair;
pub mod http;
pub mod listener;
pub mod local;
pub mod mcp_sessions;
pub mod metrics;
pub mod openapi;
pub mod runner;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use airlock_engine::LoadedPolicy;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use auth::TokensFile;
pub use error::ServerError;
pub use listener::ConnLimits;
pub use runner::{Admission, BackendFactory, Phase, Runner, open_backend};

/// Default largest request body: 16 MiB (a 20 MB body is refused with 413).
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 << 20;
/// Default time for a request's headers to arrive.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time for a request's body to arrive.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Default longest write stall before a connection whose client stopped reading is closed.
pub const DEFAULT_WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Default most open connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default grace period for running jobs at shutdown, before they are killed.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// Default longest wait in the queue.
pub const DEFAULT_QUEUE_WAIT_MAX: Duration = Duration::from_secs(60);
/// After jobs are killed at shutdown, how long to wait for their answers to go out.
pub const KILL_WAIT: Duration = Duration::from_secs(15);

/// Everything `airlock serve` is configured with.
#[derive(Debug)]
pub struct ServeConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// The server's policy (tenants without their own use it).
    pub policy: LoadedPolicy,
    /// The backend every job runs on.
    pub backend: airlock_core::BackendKind,
    /// Tokens; `None` serves without authentication, on loopback only.
    pub tokens: Option<TokensFile>,
    /// Jobs in flight, queue size, queue wait.
    pub admission: Admission,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Longest time for a request body to arrive.
    pub body_timeout: Duration,
    /// Connection bounds.
    pub conn: ConnLimits,
    /// How long running jobs may go on after SIGTERM/SIGINT before they are killed.
    pub shutdown_grace: Duration,
}

impl ServeConfig {
    /// A configuration with every default, for `listen` and `policy`.
    pub fn new(listen: SocketAddr, policy: LoadedPolicy) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        Self {
            listen,
            policy,
            backend: airlock_core::BackendKind::Native,
            tokens: None,
            admission: Admission {
                max_in_flight: cpus,
                queue: cpus * 16,
                queue_wait_max: DEFAULT_QUEUE_WAIT_MAX,
            },
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            conn: ConnLimits {
                header_timeout: DEFAULT_HEADER_TIMEOUT,
                write_stall_timeout: DEFAULT_WRITE_STALL_TIMEOUT,
                max_connections: DEFAULT_MAX_CONNECTIONS,
            },
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        }
    }
}

/// Completes on SIGINT or SIGTERM, naming it.
async fn next_signal(
    int: &mut tokio::signal::unix::Signal,
    term: &mut tokio::signal::unix::Signal,
) -> &'static str {
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

/// Runs the server until SIGINT or SIGTERM, then shuts down gracefully: stop accepting,
/// refuse queued jobs, let running jobs finish within the grace period, kill the rest
/// (their sandboxes are removed and they are audited), wait for the answers to go out.
/// `on_listening` gets the bound address (useful with port 0).
pub async fn serve(
    config: ServeConfig,
    backends: &BackendFactory,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<(), ServerError> {
    if config.tokens.is_none() && !config.listen.ip().is_loopback() {
        return Err(ServerError::UnauthenticatedNonLoopback {
            addr: config.listen,
        });
    }
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigint = signal(SignalKind::interrupt()).map_err(ServerError::Signals)?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(ServerError::Signals)?;

    let (phase_tx, phase_rx) = watch::channel(Phase::Serving);
    let metrics = Arc::new(metrics::Metrics::new());
    let tenants = config
        .tokens
        .as_ref()
        .map(|t| t.tenants.clone())
        .unwrap_or_default();
    let runner: Arc<Runner> = Arc::new(Runner::new(
        config.policy,
        config.backend,
        &tenants,
        config.admission,
        metrics,
        phase_rx.clone(),
        backends,
    )?);
    // The same registry `/metrics` renders, read again at each OTLP export (when the
    // OTEL_* variables turned export on): one set of counting, two ways out.
    let weak_runner = Arc::downgrade(&runner);
    airlock_telemetry::register_openmetrics_source(move || {
        weak_runner
            .upgrade()
            .map(|runner| {
                if let Some(stats) = runner.warm_pool_stats() {
                    runner.metrics().warm_pool(stats);
                }
                runner
                    .metrics()
                    .render(metrics::ExpositionFormat::OpenMetrics)
            })
            .unwrap_or_default()
    });
    let tasks = TaskTracker::new();
    let mcp_cancel = CancellationToken::new();
    let tokens = config.tokens.map(Arc::new);
    let e2b = airlock_e2b::E2b::start(Arc::new(http::E2bServerHost {
        runner: runner.clone(),
        tokens: tokens.clone(),
        max_body_bytes: config.max_body_bytes,
        body_timeout: config.body_timeout,
    }));
    let state = http::AppState {
        runner: runner.clone(),
        tokens,
        max_body_bytes: config.max_body_bytes,
        body_timeout: config.body_timeout,
        phase: phase_rx,
        tasks: tasks.clone(),
        openapi: serde_json::to_vec(&openapi::document())
            .unwrap_or_default()
            .into(),
        e2b: e2b.clone(),
    };
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
    let local = listener.local_addr().map_err(|source| ServerError::Bind {
        addr: config.listen,
        source,
    })?;
    // Without tokens, requests must name this loopback address (the port is known only
    // once bound: `--listen 127.0.0.1:0`).
    let unauthenticated_port = state.tokens.is_none().then_some(local.port());
    let app = http::router(state, mcp_cancel.clone(), unauthenticated_port);
    tracing::info!(addr = %local, authenticated = tenants.len(), "listening");
    on_listening(local);

    let signal_name = std::sync::Mutex::new(None);
    let graceful = listener::accept_until(listener, app, config.conn, async {
        let name = next_signal(&mut sigint, &mut sigterm).await;
        if let Ok(mut slot) = signal_name.lock() {
            *slot = Some(name);
        }
    })
    .await;
    let name = signal_name.lock().ok().and_then(|s| *s).unwrap_or("signal");
    tracing::warn!(
        signal = name,
        grace_s = config.shutdown_grace.as_secs_f64(),
        "shutting down: no new connections, queued jobs refused, running jobs may finish"
    );
    let _ = phase_tx.send(Phase::Draining);
    mcp_cancel.cancel();
    tasks.close();

    let finished = async {
        graceful.shutdown().await;
        tasks.wait().await;
    };
    tokio::pin!(finished);
    let killed = tokio::select! {
        () = &mut finished => false,
        () = tokio::time::sleep(config.shutdown_grace) => true,
        name = next_signal(&mut sigint, &mut sigterm) => {
            tracing::warn!(signal = name, "second signal: killing running jobs now");
            true
        }
    };
    if killed {
        tracing::warn!("killing running jobs");
        let _ = phase_tx.send(Phase::Killing);
        if tokio::time::timeout(KILL_WAIT, &mut finished)
            .await
            .is_err()
        {
            tracing::error!("connections still open after the jobs were killed; exiting anyway");
        }
    }
    e2b.shutdown().await;
    runner.shutdown_sessions().await;
    runner.shutdown_backends().await;
    tracing::info!("stopped");
    Ok(())
}
