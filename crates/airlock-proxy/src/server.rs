//! Accepting clients, reading their requests, and the checks every request goes through
//! before anything is dialled.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::ext::ReasonPhrase;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinHandle;

use crate::config::ProxyConfig;
use crate::dial::{DialError, dial};
use crate::error::ProxyError;
use crate::host::{HostError, TargetHost};
use crate::meter::Metered;
use crate::record::{LimitKind, ProxySummary};
use crate::scrub::FOREIGN_SECRET_REASON;
use crate::state::{Activity, Cut, InFlight, Shared};
use crate::{forward, intercept, tunnel};

/// Largest request line plus headers, in bytes; a larger head gets 431 and a record.
pub const MAX_REQUEST_HEAD_BYTES: usize = 32 * 1024;
/// Read buffer of one client connection, in bytes (hyper's minimum is 8 KiB).
const CLIENT_BUFFER_BYTES: usize = 64 * 1024;
/// Most client connections open at once; more wait in the listen backlog.
const CLIENT_CONNECTIONS_MAX: usize = 256;
/// Pause after a failed `accept` (out of file descriptors, ...), so the loop never spins.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// How long `shutdown` waits for connections to finish their records.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Why the body of a response to the job broke off.
pub(crate) type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response the proxy sends.
pub(crate) type ProxyBody = BoxBody<Bytes, BodyError>;

/// A running proxy.
#[derive(Debug)]
pub struct ProxyHandle {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    drained: mpsc::Receiver<()>,
    accept: JoinHandle<()>,
}

/// Starts the proxy on `listener` (bound and listening already; any address family) in
/// tasks of the current tokio runtime, and returns at once.
///
/// The listener may belong to another network namespace: the proxy only accepts on it.
/// Upstream connects are made from the calling process's own namespace. Dropping the
/// handle stops the proxy as well, but only [`ProxyHandle::shutdown`] returns the summary.
pub fn spawn(
    listener: std::net::TcpListener,
    config: Arc<ProxyConfig>,
) -> Result<ProxyHandle, ProxyError> {
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|source| ProxyError::FindRuntime { source })?;
    let adopt = |source| ProxyError::AdoptListener { source };
    listener.set_nonblocking(true).map_err(adopt)?;
    let listen_addr = listener.local_addr().map_err(adopt)?;
    let _entered = runtime.enter();
    let listener = TcpListener::from_std(listener).map_err(adopt)?;
    let (stop, stop_rx) = watch::channel(false);
    let (drain_tx, drained) = mpsc::channel(1);
    let shared = Arc::new(Shared::new(config, listen_addr, stop_rx, drain_tx));
    let accept = runtime.spawn(accept_loop(listener, shared.clone()));
    tracing::debug!(%listen_addr, "egress proxy started");
    Ok(ProxyHandle {
        shared,
        stop,
        drained,
        accept,
    })
}

impl ProxyHandle {
    /// The address the proxy listens on (in the listener's own namespace).
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.listen_addr
    }

    /// What has happened so far, without stopping.
    pub fn summary(&self) -> ProxySummary {
        self.shared.summary()
    }

    /// Stops accepting, closes every connection, and returns what happened. Connections
    /// still open are cut and recorded with the error `proxy shut down`.
    pub async fn shutdown(self) -> ProxySummary {
        let Self {
            shared,
            stop,
            mut drained,
            accept,
        } = self;
        let _ = stop.send(true);
        let _ = accept.await;
        // The accept loop held the first token; every task holds a clone. `recv` returns
        // `None` once all are dropped, that is when every task has written its record.
        shared.release_drain();
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while drained.recv().await.is_some() {}
        })
        .await;
        shared.summary()
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("listen_addr", &self.listen_addr)
            .finish_non_exhaustive()
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let _token = shared.drain_token();
    let permits = Arc::new(Semaphore::new(CLIENT_CONNECTIONS_MAX));
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = shared.stopped() => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "proxy accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = shared.stopped() => break,
        };
        let shared = shared.clone();
        let token = shared.drain_token();
        tokio::spawn(async move {
            let _permit = permit;
            let _token = token;
            serve_client(stream, shared).await;
        });
    }
    tracing::debug!("egress proxy stopped accepting");
}

/// What the request handlers of one client connection share.
pub(crate) struct ClientCtx {
    pub(crate) shared: Arc<Shared>,
    pub(crate) activity: Arc<Activity>,
    /// Set when this client connection is cut by a limit.
    pub(crate) cut: Arc<Cut>,
}

async fn serve_client(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let activity = Arc::new(Activity::new(shared.epoch()));
    let cut = Arc::new(Cut::default());
    let ctx = Arc::new(ClientCtx {
        shared: shared.clone(),
        activity: activity.clone(),
        cut: cut.clone(),
    });
    let io = TokioIo::new(Metered::client(stream, activity.clone()));
    let service = service_fn(move |req| {
        let ctx = ctx.clone();
        async move { handle(req, ctx).await }
    });
    let idle = shared.config.limits().idle_timeout;
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(idle)
        .max_header_size(MAX_REQUEST_HEAD_BYTES)
        .max_buf_size(CLIENT_BUFFER_BYTES);
    let conn = builder.serve_connection(io, service).with_upgrades();
    tokio::select! {
        result = conn => {
            if let Err(e) = result {
                record_protocol_error(&shared, &e);
            }
        }
        // The cut is marked before the connection (and the requests in it) is dropped.
        () = async {
            activity.idle(idle).await;
            cut.set(LimitKind::IdleTimeout);
        } => tracing::debug!("idle client connection closed"),
        () = shared.stopped() => {}
    }
}

/// A request hyper could not parse: hyper has answered 400/414/431; this records it.
fn record_protocol_error(shared: &Arc<Shared>, error: &hyper::Error) {
    if !error.is_parse() {
        return;
    }
    if !shared.claim_slot() {
        return;
    }
    let inflight = InFlight::new(shared.clone(), String::new(), None);
    if error.is_parse_too_large() {
        inflight.deny(
            &format!("request head larger than {MAX_REQUEST_HEAD_BYTES} bytes"),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE.as_u16(),
            Some(LimitKind::RequestHeadSize),
        );
    } else {
        inflight.deny("malformed request", StatusCode::BAD_REQUEST.as_u16(), None);
    }
}

async fn handle(
    req: Request<Incoming>,
    ctx: Arc<ClientCtx>,
) -> Result<Response<ProxyBody>, Infallible> {
    if !ctx.shared.claim_slot() {
        return Ok(text_response(
            StatusCode::TOO_MANY_REQUESTS,
            &LimitKind::Connections.to_string(),
        ));
    }
    let inflight = InFlight::new(
        ctx.shared.clone(),
        req.method().to_string(),
        Some(ctx.cut.clone()),
    );
    Ok(route(req, &ctx, inflight).await)
}

/// The target of a request.
pub(crate) struct Target {
    pub(crate) host: TargetHost,
    pub(crate) port: u16,
}

/// A request refused before any policy check of its target.
struct Refusal {
    status: StatusCode,
    reason: String,
    raw_host: String,
    port: u16,
}

async fn route(
    req: Request<Incoming>,
    ctx: &Arc<ClientCtx>,
    inflight: Arc<InFlight>,
) -> Response<ProxyBody> {
    let shared = &ctx.shared;
    let target = match parse_target(&req) {
        Ok(target) => target,
        Err(refusal) => {
            inflight.target(&refusal.raw_host, refusal.port);
            return deny(&inflight, refusal.status, &refusal.reason, None);
        }
    };
    inflight.target(&target.host.to_string(), target.port);
    if shared.bytes_exhausted() {
        return deny(
            &inflight,
            StatusCode::TOO_MANY_REQUESTS,
            &LimitKind::Bytes.to_string(),
            Some(LimitKind::Bytes),
        );
    }
    if !shared.allows(&target.host, target.port) {
        let reason = format!(
            "{} is not on the allowlist",
            target.host.authority_with_port(target.port)
        );
        return deny(&inflight, StatusCode::FORBIDDEN, &reason, None);
    }
    if let Some(refusal) = refuse_foreign_secret(&req, &target, shared, &inflight) {
        return refusal;
    }
    let (stream, addr) = match dial(shared, &target.host, target.port).await {
        Ok(dialled) => dialled,
        Err(DialError::Blocked(reason)) => {
            return deny(&inflight, StatusCode::FORBIDDEN, &reason, None);
        }
        Err(DialError::Resolve(reason)) => {
            return fail(&inflight, StatusCode::BAD_GATEWAY, reason, None);
        }
        Err(DialError::Timeout) => {
            return fail(
                &inflight,
                StatusCode::GATEWAY_TIMEOUT,
                LimitKind::ConnectTimeout.to_string(),
                Some(LimitKind::ConnectTimeout),
            );
        }
        Err(DialError::Connect(reason)) => {
            return fail(
                &inflight,
                StatusCode::BAD_GATEWAY,
                format!("connect failed: {reason}"),
                None,
            );
        }
    };
    inflight.update(|r| r.resolved = Some(addr.ip()));
    let upstream = Metered::upstream(
        stream,
        ctx.activity.clone(),
        shared.clone(),
        inflight.counters(),
    );
    if req.method() == Method::CONNECT {
        if shared.intercepts(&target.host, target.port) {
            intercept::open(req, target, upstream, addr.ip(), ctx, inflight)
        } else {
            tunnel::open(req, upstream, ctx, inflight)
        }
    } else {
        forward::send(req, &target, upstream, ctx, inflight).await
    }
}

fn parse_target(req: &Request<Incoming>) -> Result<Target, Refusal> {
    let uri = req.uri();
    let refuse = |status, reason: &str| Refusal {
        status,
        reason: reason.to_owned(),
        raw_host: uri.host().unwrap_or_default().to_owned(),
        port: uri.port_u16().unwrap_or(0),
    };
    let authority = if req.method() == Method::CONNECT {
        match uri.authority() {
            Some(a) if uri.scheme().is_none() && uri.path_and_query().is_none() => a,
            _ => return Err(refuse(StatusCode::BAD_REQUEST, "CONNECT needs host:port")),
        }
    } else {
        match uri.scheme_str() {
            None => {
                return Err(refuse(
                    StatusCode::BAD_REQUEST,
                    "not a proxy request: send an absolute http:// URI, or CONNECT",
                ));
            }
            Some("http") => {}
            Some(_) => {
                return Err(refuse(
                    StatusCode::BAD_REQUEST,
                    "only http:// is forwarded; use CONNECT for https",
                ));
            }
        }
        match uri.authority() {
            Some(a) => a,
            None => return Err(refuse(StatusCode::BAD_REQUEST, "the URI has no host")),
        }
    };
    if authority.as_str().contains('@') {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "user information in the URI is not forwarded",
        ));
    }
    let port = match (authority.port_u16(), req.method() == Method::CONNECT) {
        (Some(0), _) => return Err(refuse(StatusCode::BAD_REQUEST, "port 0")),
        (Some(port), _) => port,
        (None, true) => return Err(refuse(StatusCode::BAD_REQUEST, "CONNECT needs host:port")),
        (None, false) => 80,
    };
    match TargetHost::parse(authority.host()) {
        Ok(host) => Ok(Target { host, port }),
        Err(e @ HostError::Malformed) => Err(refuse(StatusCode::BAD_REQUEST, &e.to_string())),
        Err(e @ HostError::NonCanonicalNumeric) => {
            Err(refuse(StatusCode::FORBIDDEN, &e.to_string()))
        }
    }
}

/// The refusal of a request whose head carries a secret's real value toward a host outside
/// its scope ([`forward::carries_foreign_secret`]), if it does.
pub(crate) fn refuse_foreign_secret(
    req: &Request<Incoming>,
    target: &Target,
    shared: &Shared,
    inflight: &InFlight,
) -> Option<Response<ProxyBody>> {
    if !forward::carries_foreign_secret(req, target, &shared.config) {
        return None;
    }
    tracing::warn!(
        reason = FOREIGN_SECRET_REASON,
        "proxy request denied: a secret's value toward another host"
    );
    Some(deny(
        inflight,
        StatusCode::FORBIDDEN,
        FOREIGN_SECRET_REASON,
        None,
    ))
}

/// Refuses by policy: a Denied record, and the reason to the job.
pub(crate) fn deny(
    inflight: &InFlight,
    status: StatusCode,
    reason: &str,
    limit: Option<LimitKind>,
) -> Response<ProxyBody> {
    tracing::debug!(%status, reason, "proxy request denied");
    inflight.deny(reason, status.as_u16(), limit);
    text_response(status, reason)
}

/// An allowed request that could not be carried out.
pub(crate) fn fail(
    inflight: &InFlight,
    status: StatusCode,
    error: String,
    limit: Option<LimitKind>,
) -> Response<ProxyBody> {
    let response = text_response(status, &error);
    inflight.update(|r| r.status = Some(status.as_u16()));
    inflight.fail(error, limit);
    inflight.finish();
    response
}

/// Longest reason phrase the proxy writes, in bytes.
const REASON_PHRASE_MAX_BYTES: usize = 200;

/// A short plain-text answer from the proxy itself. Over HTTP/1.1 the reason is also the
/// reason phrase (`403 airlock proxy: x.test:443 is not on the allowlist`), since many
/// clients print only the status line of a refused CONNECT (Python's `http.client`, and
/// so pip and `requests`).
pub(crate) fn text_response(status: StatusCode, text: &str) -> Response<ProxyBody> {
    let body = Full::new(Bytes::from(format!("airlock proxy: {text}\n")))
        .map_err(|never| match never {})
        .boxed();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    let phrase: String = format!("airlock proxy: {text}")
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .take(REASON_PHRASE_MAX_BYTES)
        .collect();
    if let Ok(phrase) = ReasonPhrase::try_from(phrase) {
        response.extensions_mut().insert(phrase);
    }
    response
}

/// An empty body.
pub(crate) fn empty() -> ProxyBody {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}
