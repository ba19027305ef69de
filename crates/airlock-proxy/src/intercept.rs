//! CONNECT to a host whose TLS the proxy terminates: a secret's host (to put the secret
//! into its requests and scrub it from its answers) or a package index and the file hosts
//! it names (to list what was fetched). Every other tunnel stays opaque ([`crate::tunnel`]).
//!
//! After answering the CONNECT, the proxy reads the job's TLS ClientHello and checks that
//! its server name (SNI) is the CONNECT host (an IP-literal host has none); a mismatch, or
//! a name-less hello toward a name, is refused with a TLS `access_denied` alert. It then
//! opens its own TLS to the upstream (on the address it dialled and checked), offering the
//! protocols the job offered (`h2`, `http/1.1`), and verifies the upstream's certificate
//! against the host's trust roots and the policy's `extra_roots` ([`crate::trust`]). Then
//! it finishes the job's handshake with a leaf certificate for the CONNECT host signed by
//! the job's CA ([`crate::ca`]), choosing the protocol the upstream chose, so HTTP/2 stays
//! HTTP/2 and HTTP/1.1 stays HTTP/1.1.
//!
//! Each request inside is then a request of its own: a connection slot, a record, the
//! checks of plain HTTP (its `Host`, or HTTP/2's authority, must be the CONNECT host, else
//! `421`; a secret's real value toward a host outside its scope is refused), and
//! [`forward::exchange`] over the tunnel's upstream connection. When the upstream's TLS
//! failed (a certificate that does not verify, a handshake error), the job's handshake is
//! still finished, so that each of its requests gets a `502` naming the reason: one clear
//! line where the job reads answers, rather than a TLS error it cannot explain.

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use hyper::body::Incoming;
use hyper::header;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::ServerName;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, ServerConfig};
use tokio::net::TcpStream;
use tokio_rustls::{LazyConfigAcceptor, TlsConnector};

use crate::config::Interception;
use crate::forward::{
    self, MAX_RESPONSE_HEAD_BYTES, Scheme, UPSTREAM_BUFFER_BYTES, UpstreamSender, authority,
};
use crate::host::TargetHost;
use crate::meter::Metered;
use crate::record::{LimitKind, Verdict};
use crate::server::{
    ClientCtx, MAX_REQUEST_HEAD_BYTES, ProxyBody, Target, deny, empty, fail, refuse_foreign_secret,
};
use crate::state::InFlight;

/// The protocols an intercepted connection may speak, as ALPN names them.
const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Answers 200 and runs the intercepted tunnel in a task.
pub(crate) fn open(
    req: Request<Incoming>,
    target: Target,
    upstream: Metered<TcpStream>,
    resolved: IpAddr,
    ctx: &Arc<ClientCtx>,
    inflight: Arc<InFlight>,
) -> Response<ProxyBody> {
    inflight.update(|r| {
        r.status = Some(StatusCode::OK.as_u16());
        r.intercepted = true;
    });
    let ctx = ctx.clone();
    let token = ctx.shared.drain_token();
    tokio::spawn(async move {
        let _token = token;
        let shared = ctx.shared.clone();
        let activity = ctx.activity.clone();
        let idle = shared.config.limits().idle_timeout;
        let tunnel = Tunnel {
            target,
            resolved,
            inflight: inflight.clone(),
        };
        tokio::select! {
            () = tunnel.run(req, upstream, &ctx) => {}
            () = activity.idle(idle) => {
                inflight.fail(LimitKind::IdleTimeout.to_string(), Some(LimitKind::IdleTimeout));
            }
            () = shared.stopped() => {}
        }
    });
    let mut response = Response::new(empty());
    *response.status_mut() = StatusCode::OK;
    response
}

/// One intercepted tunnel.
struct Tunnel {
    target: Target,
    resolved: IpAddr,
    /// The CONNECT's record.
    inflight: Arc<InFlight>,
}

/// What the requests inside a tunnel share.
struct Inside {
    target: Target,
    resolved: IpAddr,
    /// The upstream connection, or why there is none.
    upstream: Result<UpstreamSender, String>,
}

impl Tunnel {
    async fn run(self, req: Request<Incoming>, upstream: Metered<TcpStream>, ctx: &Arc<ClientCtx>) {
        let inflight = &self.inflight;
        let Some(interception) = ctx.shared.config.interception() else {
            inflight.fail("no CA to intercept with".to_owned(), None);
            return;
        };
        let upgraded = match hyper::upgrade::on(req).await {
            Ok(upgraded) => upgraded,
            Err(e) => {
                inflight.fail(format!("client left before the tunnel opened: {e}"), None);
                return;
            }
        };
        let acceptor =
            LazyConfigAcceptor::new(rustls::server::Acceptor::default(), TokioIo::new(upgraded));
        let start = match acceptor.await {
            Ok(start) => start,
            Err(e) => {
                inflight.fail(format!("TLS from the job: {e}"), None);
                return;
            }
        };
        let hello = start.client_hello();
        let sni = hello.server_name().map(str::to_owned);
        let offered: Vec<Vec<u8>> = hello
            .alpn()
            .map(|protocols| {
                protocols
                    .filter(|p| ALPN_PROTOCOLS.contains(p))
                    .map(<[u8]>::to_vec)
                    .collect()
            })
            .unwrap_or_default();
        if let Err(reason) = check_server_name(&self.target.host, sni.as_deref()) {
            tracing::debug!(%reason, "intercepted tunnel refused");
            inflight.update(|r| r.verdict = Verdict::Denied { reason });
            inflight.finish();
            // The handshake fails with access_denied: no certificate is offered.
            if let Ok(config) = refusing_config(interception) {
                let _ = start.into_stream(config).await;
            }
            return;
        }
        let upstream = self
            .connect_upstream(upstream, &offered, ctx, interception)
            .await;
        // The job speaks what the upstream chose; without an upstream, the job's first
        // choice, so that its requests get the reason.
        let protocol = match &upstream {
            Ok((_, protocol)) => protocol.clone(),
            Err(_) => offered.first().cloned(),
        };
        let leaf = match interception.ca.leaf_for(&self.target.host) {
            Ok(leaf) => leaf,
            Err(e) => {
                inflight.fail(format!("no certificate for the job: {e}"), None);
                if let Ok(config) = refusing_config(interception) {
                    let _ = start.into_stream(config).await;
                }
                return;
            }
        };
        let config = match serving_config(interception, leaf, protocol.clone()) {
            Ok(config) => config,
            Err(e) => {
                inflight.fail(format!("TLS configuration: {e}"), None);
                return;
            }
        };
        let client_tls = match start.into_stream(config).await {
            Ok(tls) => tls,
            Err(e) => {
                inflight.fail(
                    format!("TLS with the job failed (does it trust its CA bundle?): {e}"),
                    None,
                );
                return;
            }
        };
        let http2 = protocol.as_deref() == Some(b"h2");
        let upstream = match upstream {
            Ok((tls, _)) => self.handshake_upstream(tls, http2, ctx).await,
            Err(reason) => Err(reason),
        };
        if let Err(reason) = &upstream {
            tracing::debug!(%reason, "intercepted upstream unusable");
            inflight.fail(reason.clone(), None);
        }
        let inside = Arc::new(Inside {
            target: self.target,
            resolved: self.resolved,
            upstream,
        });
        let service_ctx = ctx.clone();
        let service = service_fn(move |req| {
            let ctx = service_ctx.clone();
            let inside = inside.clone();
            async move { Ok::<_, Infallible>(handle(req, &ctx, &inside).await) }
        });
        let io = TokioIo::new(client_tls);
        let served = if http2 {
            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_header_list_size(u32::try_from(MAX_REQUEST_HEAD_BYTES).unwrap_or(u32::MAX))
                .serve_connection(io, service)
                .await
        } else {
            hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(ctx.shared.config.limits().idle_timeout)
                .max_buf_size(UPSTREAM_BUFFER_BYTES)
                .serve_connection(io, service)
                .await
        };
        match served {
            Ok(()) => inflight.finish(),
            Err(e) => inflight.fail(format!("intercepted connection: {e}"), None),
        }
    }

    /// The proxy's own TLS to the upstream, verified, offering `offered`; with the
    /// protocol the upstream chose.
    async fn connect_upstream(
        &self,
        upstream: Metered<TcpStream>,
        offered: &[Vec<u8>],
        ctx: &Arc<ClientCtx>,
        interception: &Interception,
    ) -> Result<
        (
            tokio_rustls::client::TlsStream<Metered<TcpStream>>,
            Option<Vec<u8>>,
        ),
        String,
    > {
        let name = authority(&self.target, Scheme::Https);
        let server_name = match &self.target.host {
            TargetHost::Name(host) => ServerName::try_from(host.clone())
                .map_err(|e| format!("{host} is not a TLS server name: {e}"))?,
            TargetHost::V4(v4) => ServerName::IpAddress(IpAddr::V4(*v4).into()),
            TargetHost::V6(v6) => ServerName::IpAddress(IpAddr::V6(*v6).into()),
        };
        let mut config = ClientConfig::builder_with_provider(interception.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS configuration: {e}"))?
            .with_root_certificates(interception.roots.store())
            .with_no_client_auth();
        config.alpn_protocols = offered.to_vec();
        let connector = TlsConnector::from(Arc::new(config));
        let timeout = ctx.shared.config.limits().connect_timeout;
        match tokio::time::timeout(timeout, connector.connect(server_name, upstream)).await {
            Ok(Ok(tls)) => {
                let protocol = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
                Ok((tls, protocol))
            }
            Ok(Err(e)) => Err(format!("TLS with the upstream {name} failed: {e}")),
            Err(_) => Err(format!(
                "TLS with the upstream {name}: {}",
                LimitKind::ConnectTimeout
            )),
        }
    }

    /// HTTP over the upstream's TLS; its connection driven by a task of its own, which
    /// records a failure of the connection in the tunnel's record.
    async fn handshake_upstream(
        &self,
        tls: tokio_rustls::client::TlsStream<Metered<TcpStream>>,
        http2: bool,
        ctx: &Arc<ClientCtx>,
    ) -> Result<UpstreamSender, String> {
        let io = TokioIo::new(tls);
        let record = self.inflight.clone();
        let shared = ctx.shared.clone();
        let token = shared.drain_token();
        let drive = |conn: std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<(), hyper::Error>> + Send>,
        >| {
            tokio::spawn(async move {
                let _token = token;
                tokio::select! {
                    result = conn => if let Err(e) = result {
                        record.fail(format!("upstream: {e}"), None);
                    },
                    () = shared.stopped() => {}
                }
            });
        };
        if http2 {
            let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_header_list_size(u32::try_from(MAX_RESPONSE_HEAD_BYTES).unwrap_or(u32::MAX))
                .handshake(io)
                .await
                .map_err(|e| format!("HTTP/2 with the upstream: {e}"))?;
            drive(Box::pin(conn));
            Ok(UpstreamSender::Http2(sender))
        } else {
            let (sender, conn) = hyper::client::conn::http1::Builder::new()
                .max_buf_size(UPSTREAM_BUFFER_BYTES)
                .max_header_size(MAX_RESPONSE_HEAD_BYTES)
                .handshake(io)
                .await
                .map_err(|e| format!("HTTP/1.1 with the upstream: {e}"))?;
            drive(Box::pin(conn));
            Ok(UpstreamSender::http1(sender))
        }
    }
}

/// One request inside an intercepted tunnel: its own slot and record, the checks, and the
/// exchange with the upstream.
async fn handle(
    req: Request<Incoming>,
    ctx: &Arc<ClientCtx>,
    inside: &Inside,
) -> Response<ProxyBody> {
    let shared = &ctx.shared;
    if !shared.claim_slot() {
        return crate::server::text_response(
            StatusCode::TOO_MANY_REQUESTS,
            &LimitKind::Connections.to_string(),
        );
    }
    let inflight = InFlight::new(
        shared.clone(),
        req.method().to_string(),
        Some(ctx.cut.clone()),
    );
    let target = &inside.target;
    inflight.target(&target.host.to_string(), target.port);
    inflight.update(|r| {
        r.intercepted = true;
        r.resolved = Some(inside.resolved);
    });
    if let Err(reason) = check_authority(&req, target) {
        return deny(&inflight, StatusCode::MISDIRECTED_REQUEST, &reason, None);
    }
    let upstream = match &inside.upstream {
        Ok(upstream) => upstream,
        Err(reason) => return fail(&inflight, StatusCode::BAD_GATEWAY, reason.clone(), None),
    };
    if shared.bytes_exhausted() {
        return deny(
            &inflight,
            StatusCode::TOO_MANY_REQUESTS,
            &LimitKind::Bytes.to_string(),
            Some(LimitKind::Bytes),
        );
    }
    if let Some(refusal) = refuse_foreign_secret(&req, target, shared, &inflight) {
        return refusal;
    }
    forward::exchange(
        req,
        target,
        upstream,
        ctx,
        inflight,
        Arc::new(AtomicBool::new(false)),
        Scheme::Https,
    )
    .await
}

/// The job's TLS must name the CONNECT host: SNI equal to it (without case), and none for
/// an IP literal (clients send no SNI for addresses).
fn check_server_name(host: &TargetHost, sni: Option<&str>) -> Result<(), String> {
    match (host, sni) {
        (TargetHost::Name(name), Some(sni))
            if sni.trim_end_matches('.').eq_ignore_ascii_case(name) =>
        {
            Ok(())
        }
        (TargetHost::Name(name), Some(sni)) => Err(format!(
            "the TLS server name (SNI) {sni} is not the CONNECT host {name}"
        )),
        (TargetHost::Name(name), None) => Err(format!(
            "the TLS handshake names no server (SNI), but the CONNECT host is {name}"
        )),
        (_, None) => Ok(()),
        (ip, Some(sni)) => Err(format!(
            "the TLS server name (SNI) {sni} is not the CONNECT host {ip}"
        )),
    }
}

/// Every authority a request names (its URI's, HTTP/2's `:authority`, and its `Host`
/// headers) must be the tunnel's host and port; at least one must be there.
fn check_authority(req: &Request<Incoming>, target: &Target) -> Result<(), String> {
    let expected = target.host.authority_with_port(target.port);
    let mut named: Vec<String> = Vec::new();
    if let Some(authority) = req.uri().authority() {
        named.push(authority.as_str().to_owned());
    }
    for value in req.headers().get_all(header::HOST) {
        named.push(
            value
                .to_str()
                .map(str::to_owned)
                .unwrap_or_else(|_| String::from_utf8_lossy(value.as_bytes()).into_owned()),
        );
    }
    if named.is_empty() {
        return Err(format!(
            "the request names no host (Host); the tunnel is to {expected}"
        ));
    }
    for name in named {
        if !names_target(&name, target) {
            let shown: String = name
                .chars()
                .filter(|c| c.is_ascii_graphic())
                .take(255)
                .collect();
            return Err(format!(
                "the request's Host {shown} is not the tunnel's host {expected}"
            ));
        }
    }
    Ok(())
}

/// True when `authority` (`host[:port]`) is the target's host and port (443 when absent).
fn names_target(authority: &str, target: &Target) -> bool {
    let Ok(uri_authority) = authority.parse::<hyper::http::uri::Authority>() else {
        return false;
    };
    if authority.contains('@') {
        return false;
    }
    let port = uri_authority.port_u16().unwrap_or(443);
    TargetHost::parse(uri_authority.host()).is_ok_and(|host| host == target.host)
        && port == target.port
}

/// A server configuration that resolves no certificate: the handshake ends with an
/// `access_denied` alert.
fn refusing_config(interception: &Interception) -> Result<Arc<ServerConfig>, rustls::Error> {
    #[derive(Debug)]
    struct NoCertificate;
    impl ResolvesServerCert for NoCertificate {
        fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
            None
        }
    }
    server_config(interception, Arc::new(NoCertificate), None)
}

/// The job-facing configuration: `leaf` for every name, `protocol` as the only ALPN.
fn serving_config(
    interception: &Interception,
    leaf: Arc<CertifiedKey>,
    protocol: Option<Vec<u8>>,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    #[derive(Debug)]
    struct Leaf(Arc<CertifiedKey>);
    impl ResolvesServerCert for Leaf {
        fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
            Some(self.0.clone())
        }
    }
    server_config(interception, Arc::new(Leaf(leaf)), protocol)
}

fn server_config(
    interception: &Interception,
    resolver: Arc<dyn ResolvesServerCert>,
    protocol: Option<Vec<u8>>,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let mut config = ServerConfig::builder_with_provider(interception.provider.clone())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = protocol.into_iter().collect();
    Ok(Arc::new(config))
}
