//! Sending a request upstream and handing its answer back: plain HTTP, and each request
//! inside a tunnel whose TLS the proxy intercepts ([`crate::intercept`]).
//!
//! Plain HTTP: an absolute-form request (`GET http://host:port/path`) is re-sent in origin
//! form on its own upstream connection to the checked address; each request gets a fresh
//! upstream connection, closed when its response ends; nothing is pooled across requests.
//! Intercepted HTTPS: each request goes over the tunnel's own TLS connection to the
//! upstream, HTTP/1.1 in origin form or HTTP/2 with `https://` and the authority.
//!
//! Hop-by-hop headers (`Connection` and the headers it names, `Keep-Alive`, `TE`,
//! `Trailer`, `Transfer-Encoding`, `Upgrade`), every `Proxy-*` header and `Expect` are
//! dropped both ways; `Host` (or HTTP/2's authority) is always rewritten to the target, so
//! a request for an allowed host cannot name another virtual host on the same address.
//! Secrets are put in as described in [`crate::secrets`], and kept from coming back or
//! going elsewhere as described in [`crate::scrub`]; an answer the proxy must read and
//! that is compressed anyway is decoded as [`crate::decode`] says, or refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use airlock_core::policy::SubstitutePlace;
use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper::ext::ReasonPhrase;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::config::{ProxyConfig, Secret};
use crate::decode::{DecodedBody, response_coding};
use crate::meter::Metered;
use crate::packages::LinkScanner;
use crate::record::LimitKind;
use crate::scrub::{FOREIGN_SECRET_REASON, GuardedBody, RequestBodyError, Scrubber};
use crate::secrets::{
    substitute_bytes_counted, substitute_query_counted, substituted_counted, unbound_placeholders,
};
use crate::server::{ClientCtx, ProxyBody, Target, fail, text_response};
use crate::state::InFlight;

/// Largest response head accepted from an upstream, in bytes.
pub(crate) const MAX_RESPONSE_HEAD_BYTES: usize = 64 * 1024;
/// Read buffer of one upstream connection, in bytes.
pub(crate) const UPSTREAM_BUFFER_BYTES: usize = 128 * 1024;

/// The body sent upstream: the job's, guarded when some secret's value must not go there,
/// with placeholders replaced where a secret says so.
pub(crate) type UpstreamBody = BoxBody<Bytes, RequestBodyError>;

/// Where requests go: one upstream connection, HTTP/1.1 (one request at a time) or
/// HTTP/2.
pub(crate) enum UpstreamSender {
    /// HTTP/1.1: the next request waits until the previous answer has been read.
    Http1(tokio::sync::Mutex<Http1Sender>),
    /// HTTP/2: requests share the connection.
    Http2(http2::SendRequest<UpstreamBody>),
}

/// An HTTP/1.1 connection's sender, and whether it has carried a request.
pub(crate) struct Http1Sender {
    sender: http1::SendRequest<UpstreamBody>,
    used: bool,
}

impl UpstreamSender {
    pub(crate) fn http1(sender: http1::SendRequest<UpstreamBody>) -> Self {
        UpstreamSender::Http1(tokio::sync::Mutex::new(Http1Sender {
            sender,
            used: false,
        }))
    }

    async fn send(&self, req: Request<UpstreamBody>) -> Result<Response<Incoming>, hyper::Error> {
        match self {
            UpstreamSender::Http1(sender) => {
                let mut sender = sender.lock().await;
                // A fresh connection takes its first request at once; a later one waits
                // until the previous answer has been read.
                if sender.used {
                    sender.sender.ready().await?;
                }
                sender.used = true;
                sender.sender.send_request(req).await
            }
            UpstreamSender::Http2(sender) => {
                let mut sender = sender.clone();
                sender.ready().await?;
                sender.send_request(req).await
            }
        }
    }

    fn version(&self) -> Version {
        match self {
            UpstreamSender::Http1(_) => Version::HTTP_11,
            UpstreamSender::Http2(_) => Version::HTTP_2,
        }
    }
}

/// The scheme a request goes upstream with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    /// Plain HTTP (default port 80).
    Http,
    /// Intercepted HTTPS (default port 443).
    Https,
}

impl Scheme {
    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// True when the head of `req` (its target's host, and for plain HTTP its path, query and
/// headers) carries the real value of a secret whose scope does not include the target.
/// Checked before anything is dialled; a body is checked as it streams ([`exchange`]). A
/// tunnel's contents are checked only when the proxy intercepts it, request by request.
pub(crate) fn carries_foreign_secret(
    req: &Request<Incoming>,
    target: &Target,
    config: &ProxyConfig,
) -> bool {
    let foreign: Vec<&Secret> = config
        .secrets()
        .iter()
        .filter(|s| !s.is_for(&target.host, target.port))
        .collect();
    let Some(foreign) = Scrubber::new(&foreign) else {
        return false;
    };
    // Host names lose their case on the way (DNS, normalization), so compare without it.
    if foreign.finds(target.host.to_string().as_bytes(), true) {
        return true;
    }
    if req.method() == Method::CONNECT {
        return false;
    }
    let in_target = req
        .uri()
        .path_and_query()
        .is_some_and(|pq| foreign.finds(pq.as_str().as_bytes(), false));
    let in_headers = req.headers().iter().any(|(name, value)| {
        foreign.finds(name.as_str().as_bytes(), true) || foreign.finds(value.as_bytes(), false)
    });
    in_target || in_headers
}

/// Sends a plain-HTTP `req` to `upstream` and returns the upstream's response, streaming.
pub(crate) async fn send(
    req: Request<Incoming>,
    target: &Target,
    upstream: Metered<TcpStream>,
    ctx: &Arc<ClientCtx>,
    inflight: Arc<InFlight>,
) -> Response<ProxyBody> {
    let handshake = http1::Builder::new()
        .max_buf_size(UPSTREAM_BUFFER_BYTES)
        .max_header_size(MAX_RESPONSE_HEAD_BYTES)
        .handshake(TokioIo::new(upstream))
        .await;
    let (sender, conn) = match handshake {
        Ok(pair) => pair,
        Err(e) => {
            return fail(
                &inflight,
                StatusCode::BAD_GATEWAY,
                format!("upstream handshake: {e}"),
                None,
            );
        }
    };
    // The connection is driven by its own task, so the response body can stream to the
    // client after this function returns; the task holds the record until it ends.
    let refused = Arc::new(AtomicBool::new(false));
    let shared = ctx.shared.clone();
    let activity = ctx.activity.clone();
    let driver_record = inflight.clone();
    let driver_refused = refused.clone();
    let token = shared.drain_token();
    tokio::spawn(async move {
        let _token = token;
        let idle = shared.config.limits().idle_timeout;
        tokio::select! {
            result = conn => match result {
                Ok(()) => driver_record.finish(),
                // The proxy cut the body off itself; the record says why already.
                Err(_) if driver_refused.load(Ordering::SeqCst) => driver_record.finish(),
                Err(e) => driver_record.fail(format!("upstream: {e}"), None),
            },
            () = activity.idle(idle) => {
                driver_record.fail(LimitKind::IdleTimeout.to_string(), Some(LimitKind::IdleTimeout));
            }
            () = shared.stopped() => {}
        }
    });
    let sender = UpstreamSender::http1(sender);
    exchange(req, target, &sender, ctx, inflight, refused, Scheme::Http).await
}

/// Sends `req` (checked already: allowed, no foreign secret in its head) through `upstream`
/// and returns the answer for the job: placeholders replaced toward the secrets' own
/// hosts, the real values scrubbed out of what comes back, a body carrying a value toward
/// another host cut off. `refused` is set when that happens (the upstream connection then
/// fails, which is not an error of the record).
pub(crate) async fn exchange(
    req: Request<Incoming>,
    target: &Target,
    upstream: &UpstreamSender,
    ctx: &Arc<ClientCtx>,
    inflight: Arc<InFlight>,
    refused: Arc<AtomicBool>,
    scheme: Scheme,
) -> Response<ProxyBody> {
    let shared = &ctx.shared;
    let config = &shared.config;
    let (secrets, foreign): (Vec<&Secret>, Vec<&Secret>) = config
        .secrets()
        .iter()
        .partition(|s| s.is_for(&target.host, target.port));
    let unbound = {
        let target_text = req.uri().path_and_query().map(|pq| pq.as_str().as_bytes());
        let texts: Vec<&[u8]> = target_text
            .into_iter()
            .chain(req.headers().values().map(HeaderValue::as_bytes))
            .collect();
        unbound_placeholders(&foreign, texts.iter().copied())
    };
    if !unbound.is_empty() {
        tracing::info!(
            secrets = ?unbound,
            "a placeholder went to a host outside its secret's scope, unchanged"
        );
        inflight.update(|r| r.unbound_placeholders = unbound);
    }
    let package_host = shared.is_package_host(&target.host, target.port);
    if package_host {
        inflight.path(req.uri().path());
    }
    // An answer the proxy reads (to scrub it, or for the links of a package index) must
    // come uncompressed; one compressed anyway is decoded below.
    let reads_answer = !secrets.is_empty() || config.is_package_index(&target.host, target.port);
    let scrubber = Scrubber::new(&secrets).map(Arc::new);
    let guard = Scrubber::new(&foreign);
    let in_body: Vec<&Secret> = secrets
        .iter()
        .copied()
        .filter(|s| s.substitutes_in(SubstitutePlace::Body))
        .collect();
    let outgoing = match build_request(
        req,
        target,
        &secrets,
        upstream.version(),
        scheme,
        reads_answer,
    ) {
        Ok((mut outgoing, substituted_in_head)) => {
            if substituted_in_head > 0 {
                inflight.update(|r| r.secrets_substituted += substituted_in_head);
            }
            if !in_body.is_empty() {
                // Each replacement changes the length; the body goes without one.
                outgoing.headers_mut().remove(header::CONTENT_LENGTH);
            }
            outgoing.map(|body| -> UpstreamBody {
                let guarded: UpstreamBody = match guard {
                    Some(guard) => {
                        GuardedBody::new(body, guard, inflight.clone(), refused.clone()).boxed()
                    }
                    None => body.map_err(RequestBodyError::from).boxed(),
                };
                if in_body.is_empty() {
                    guarded
                } else {
                    substituted_counted(guarded, &in_body, inflight.clone()).boxed()
                }
            })
        }
        Err(reason) => return fail(&inflight, StatusCode::BAD_REQUEST, reason, None),
    };
    let response = match upstream.send(outgoing).await {
        Ok(response) => response,
        Err(_) if refused.load(Ordering::SeqCst) => {
            inflight.update(|r| r.status = Some(StatusCode::FORBIDDEN.as_u16()));
            inflight.finish();
            return text_response(StatusCode::FORBIDDEN, FOREIGN_SECRET_REASON);
        }
        Err(e) => {
            return fail(
                &inflight,
                StatusCode::BAD_GATEWAY,
                format!("upstream request: {e}"),
                None,
            );
        }
    };
    let status = response.status().as_u16();
    inflight.update(|r| r.status = Some(status));
    let (mut parts, body) = response.into_parts();
    if !reads_answer {
        strip_hop_by_hop(&mut parts.headers);
        let body = body.map_err(Into::into).boxed();
        return Response::from_parts(parts, RecordedBody::new(body, inflight).boxed());
    }
    // The upstream may have seen a real value and echo it, or be an index whose links the
    // proxy reads: it was asked for identity, and an answer compressed anyway is decoded
    // (gzip, deflate) or refused.
    let coding = match response_coding(&parts.headers) {
        Ok(coding) => coding,
        Err(coding) => {
            return fail(
                &inflight,
                StatusCode::BAD_GATEWAY,
                format!(
                    "the upstream sent a body in the {coding} coding, which the proxy cannot \
                     read (it asks for identity and decodes gzip and deflate); refused"
                ),
                None,
            );
        }
    };
    strip_hop_by_hop(&mut parts.headers);
    let mut body: ProxyBody = match coding {
        Some(coding) => {
            parts.headers.remove(header::CONTENT_ENCODING);
            parts.headers.remove(header::CONTENT_LENGTH);
            DecodedBody::new(body, coding).boxed()
        }
        None => body.map_err(Into::into).boxed(),
    };
    if config.is_package_index(&target.host, target.port) && parts.status.is_success() {
        body = LinkScanner::new(body, shared.clone()).boxed();
    }
    if let Some(scrubber) = scrubber {
        let mut scrubbed = scrub_head(&mut parts.headers, &scrubber);
        // hyper sends a non-canonical reason phrase on; the upstream chose it.
        if let Some(reason) = parts.extensions.get::<ReasonPhrase>()
            && scrubber.finds(reason.as_bytes(), false)
        {
            parts.extensions.remove::<ReasonPhrase>();
            scrubbed += 1;
        }
        if scrubbed > 0 {
            inflight.update(|r| r.secrets_scrubbed += scrubbed);
        }
        // The length changes with each replacement; hyper frames the body as chunked.
        parts.headers.remove(header::CONTENT_LENGTH);
        body = crate::scrub::scrubbed(body, scrubber, inflight.clone()).boxed();
    }
    Response::from_parts(parts, RecordedBody::new(body, inflight).boxed())
}

/// An answer's body that ends its request's record: finished when the body ends, failed
/// with the error when it breaks off (a body that cannot be decoded, an upstream gone), and
/// interrupted when the job stops reading. An intercepted request needs it (its tunnel's
/// connection lives on); a plain one gets the body's errors into its record as well.
struct RecordedBody {
    inner: ProxyBody,
    inflight: Arc<InFlight>,
}

impl RecordedBody {
    fn new(inner: ProxyBody, inflight: Arc<InFlight>) -> Self {
        Self { inner, inflight }
    }
}

impl hyper::body::Body for RecordedBody {
    type Data = Bytes;
    type Error = crate::server::BodyError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(None) => self.inflight.finish(),
            std::task::Poll::Ready(Some(Err(e))) => {
                self.inflight.fail(format!("answer: {e}"), None);
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        let ended = self.inner.is_end_stream();
        if ended {
            // hyper does not poll a body that says it has ended (an empty answer).
            self.inflight.finish();
        }
        ended
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Replaces the secrets' values in header values, and drops a header whose name holds
/// one; returns how many replacements and drops there were.
fn scrub_head(headers: &mut HeaderMap, scrubber: &Scrubber) -> u64 {
    let mut scrubbed = 0;
    let named: Vec<HeaderName> = headers
        .keys()
        .filter(|name| scrubber.finds(name.as_str().as_bytes(), true))
        .cloned()
        .collect();
    for name in named {
        headers.remove(name);
        scrubbed += 1;
    }
    for value in headers.values_mut() {
        if let Some((replaced, n)) = scrubber.scrub(value.as_bytes()) {
            // A placeholder is header-safe text, so this only fails on bytes the upstream
            // sent around it that hyper let through; then the value goes.
            *value = HeaderValue::from_bytes(&replaced).unwrap_or(HeaderValue::from_static(""));
            scrubbed += n;
        }
    }
    scrubbed
}

/// The request as it goes upstream: origin form with `Host` over HTTP/1.1, or
/// `https://authority/...` over HTTP/2; hop-by-hop headers dropped; placeholders of
/// `secrets` replaced in header values and the query where each secret says so;
/// `Accept-Encoding: identity` when the proxy reads the answer.
fn build_request(
    req: Request<Incoming>,
    target: &Target,
    secrets: &[&Secret],
    version: Version,
    scheme: Scheme,
    reads_answer: bool,
) -> Result<(Request<Incoming>, u64), String> {
    let (mut parts, body) = req.into_parts();
    let mut substitutions = 0u64;
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .filter(|pq| !pq.is_empty())
        .unwrap_or("/");
    let in_query: Vec<&Secret> = secrets
        .iter()
        .copied()
        .filter(|s| s.substitutes_in(SubstitutePlace::Query))
        .collect();
    let path_and_query = match substitute_query_counted(path_and_query, &in_query) {
        Some((replaced, n)) => {
            substitutions += n;
            replaced
        }
        None => path_and_query.to_owned(),
    };
    let authority = authority(target, scheme);
    parts.uri = match version {
        Version::HTTP_2 => format!("https://{authority}{path_and_query}"),
        _ => path_and_query,
    }
    .parse::<Uri>()
    .map_err(|_| "the request target does not parse".to_owned())?;
    parts.version = version;
    let mut headers = std::mem::take(&mut parts.headers);
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    headers.remove(header::EXPECT);
    if reads_answer {
        // A compressed answer would have to be decoded before it can be read.
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
    }
    let in_headers: Vec<&Secret> = secrets
        .iter()
        .copied()
        .filter(|s| s.substitutes_in(SubstitutePlace::Headers))
        .collect();
    if !in_headers.is_empty() {
        for value in headers.values_mut() {
            if let Some((replaced, n)) = substitute_bytes_counted(value.as_bytes(), &in_headers) {
                substitutions += n;
                let sensitive = value.is_sensitive();
                *value = HeaderValue::from_bytes(&replaced)
                    .map_err(|_| "a header value is invalid after substitution".to_owned())?;
                value.set_sensitive(sensitive);
            }
        }
    }
    if version != Version::HTTP_2 {
        let host = HeaderValue::from_str(&authority)
            .map_err(|_| "the target is not a valid Host header".to_owned())?;
        headers.insert(header::HOST, host);
    }
    parts.headers = headers;
    Ok((Request::from_parts(parts, body), substitutions))
}

/// The target as a `Host` header or authority: the port left out when it is the scheme's
/// default, IPv6 in brackets.
pub(crate) fn authority(target: &Target, scheme: Scheme) -> String {
    let with_port = target.host.authority_with_port(target.port);
    if target.port == scheme.default_port() {
        match &target.host {
            crate::host::TargetHost::V6(v6) => format!("[{v6}]"),
            host => host.to_string(),
        }
    } else {
        with_port
    }
}

/// Removes hop-by-hop headers, the headers `Connection` names, and `Proxy-*` headers.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    let proxy: Vec<HeaderName> = headers
        .keys()
        .filter(|name| name.as_str().starts_with("proxy-"))
        .cloned()
        .collect();
    for name in proxy {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_proxy_headers_go() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, X-Private"),
            ("x-private", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-authorization", "Basic eA=="),
            ("proxy-connection", "keep-alive"),
            ("proxy-whatever", "1"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("accept", "*/*"),
            ("authorization", "Bearer x"),
        ] {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        strip_hop_by_hop(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, vec!["accept", "authorization"]);
    }
}
