//! Plain HTTP: an absolute-form request (`GET http://host:port/path`) is re-sent in
//! origin form on its own upstream connection to the checked address.
//!
//! Hop-by-hop headers (`Connection` and the headers it names, `Keep-Alive`, `TE`,
//! `Trailer`, `Transfer-Encoding`, `Upgrade`), every `Proxy-*` header and `Expect` are
//! dropped both ways; `Host` is always rewritten to the target, so a request for an
//! allowed host cannot name another virtual host on the same address. Secrets are put in
//! as described in [`crate::secrets`], and kept from coming back or going elsewhere as
//! described in [`crate::scrub`]. Each request gets a fresh upstream connection, closed
//! when its response ends; nothing is pooled across requests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use hyper::ext::ReasonPhrase;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::config::{ProxyConfig, Secret};
use crate::meter::Metered;
use crate::record::LimitKind;
use crate::scrub::{FOREIGN_SECRET_REASON, GuardedBody, RequestBodyError, ScrubbedBody, Scrubber};
use crate::secrets::{substitute_bytes, substitute_query};
use crate::server::{ClientCtx, ProxyBody, Target, fail, text_response};
use crate::state::InFlight;

/// Largest response head accepted from an upstream, in bytes.
const MAX_RESPONSE_HEAD_BYTES: usize = 64 * 1024;
/// Read buffer of one upstream connection, in bytes.
const UPSTREAM_BUFFER_BYTES: usize = 128 * 1024;

/// The body sent upstream: the job's, guarded when some secret's value must not go there.
type UpstreamBody = BoxBody<Bytes, RequestBodyError>;

/// True when the head of `req` (its target's host, and for plain HTTP its path, query and
/// headers) carries the real value of a secret whose scope does not include the target.
/// Checked before anything is dialled; a body is checked as it streams ([`send`]). A
/// CONNECT tunnel's contents cannot be checked (TLS).
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

/// Sends `req` to `upstream` and returns the upstream's response, streaming.
pub(crate) async fn send(
    req: Request<Incoming>,
    target: &Target,
    upstream: Metered<TcpStream>,
    ctx: &Arc<ClientCtx>,
    inflight: Arc<InFlight>,
) -> Response<ProxyBody> {
    let config = &ctx.shared.config;
    let (secrets, foreign): (Vec<&Secret>, Vec<&Secret>) = config
        .secrets()
        .iter()
        .partition(|s| s.is_for(&target.host, target.port));
    let scrubber = Scrubber::new(&secrets).map(Arc::new);
    // The head was checked before dialling (`carries_foreign_secret`); the body streams,
    // so it is checked on the way and cut off if it holds a value that must not go here.
    let refused = Arc::new(AtomicBool::new(false));
    let guard = Scrubber::new(&foreign);
    let outgoing = match build_request(req, target, &secrets) {
        Ok(outgoing) => outgoing.map(|body| -> UpstreamBody {
            match guard {
                Some(guard) => {
                    GuardedBody::new(body, guard, inflight.clone(), refused.clone()).boxed()
                }
                None => body.map_err(RequestBodyError::from).boxed(),
            }
        }),
        Err(reason) => return fail(&inflight, StatusCode::BAD_REQUEST, reason, None),
    };
    let handshake = hyper::client::conn::http1::Builder::new()
        .max_buf_size(UPSTREAM_BUFFER_BYTES)
        .max_header_size(MAX_RESPONSE_HEAD_BYTES)
        .handshake(TokioIo::new(upstream))
        .await;
    let (mut sender, conn) = match handshake {
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
    let response = match sender.send_request(outgoing).await {
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
    drop(sender);
    let status = response.status().as_u16();
    inflight.update(|r| r.status = Some(status));
    let (mut parts, body) = response.into_parts();
    let Some(scrubber) = scrubber else {
        strip_hop_by_hop(&mut parts.headers);
        return Response::from_parts(parts, body.boxed());
    };
    // The upstream saw the real value and may echo it; what the job gets back has it
    // replaced. A body the proxy cannot read (compressed, as a content or a transfer
    // coding) is refused rather than passed: it asked for `identity`, and decoding here
    // would mean a decompressor, and its output bound, on the path of every response.
    if let Some(coding) = unreadable_coding(&parts.headers) {
        return fail(
            &inflight,
            StatusCode::BAD_GATEWAY,
            format!(
                "the upstream of a secret sent a compressed body ({coding} coding), which \
                 the proxy cannot scrub of the secret; it asks for identity"
            ),
            None,
        );
    }
    strip_hop_by_hop(&mut parts.headers);
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
    let body = ScrubbedBody::new(body, scrubber, inflight);
    Response::from_parts(parts, body.boxed())
}

/// The first content or transfer coding of a response other than `identity` and
/// `chunked` (which hyper removes), if there is one.
fn unreadable_coding(headers: &HeaderMap) -> Option<String> {
    let content = headers.get_all(header::CONTENT_ENCODING).iter();
    let transfer = headers.get_all(header::TRANSFER_ENCODING).iter();
    content
        .chain(transfer)
        .flat_map(|value| value.as_bytes().split(|&b| b == b','))
        .map(|coding| String::from_utf8_lossy(coding).trim().to_ascii_lowercase())
        .find(|coding| coding != "identity" && coding != "chunked")
        .map(|coding| {
            if coding.is_empty() {
                "an empty".to_owned()
            } else {
                coding
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .take(32)
                    .collect()
            }
        })
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

fn build_request(
    req: Request<Incoming>,
    target: &Target,
    secrets: &[&Secret],
) -> Result<Request<Incoming>, String> {
    let (mut parts, body) = req.into_parts();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .filter(|pq| !pq.is_empty())
        .unwrap_or("/");
    let path_and_query =
        substitute_query(path_and_query, secrets).unwrap_or_else(|| path_and_query.to_owned());
    parts.uri = path_and_query
        .parse::<Uri>()
        .map_err(|_| "the request target does not parse".to_owned())?;
    parts.version = Version::HTTP_11;
    let mut headers = std::mem::take(&mut parts.headers);
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    headers.remove(header::EXPECT);
    if !secrets.is_empty() {
        // A compressed answer could not be scrubbed of the value, so ask for none.
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        for value in headers.values_mut() {
            if let Some(replaced) = substitute_bytes(value.as_bytes(), secrets) {
                let sensitive = value.is_sensitive();
                *value = HeaderValue::from_bytes(&replaced)
                    .map_err(|_| "a header value is invalid after substitution".to_owned())?;
                value.set_sensitive(sensitive);
            }
        }
    }
    let host = HeaderValue::from_str(&target.host.authority(target.port))
        .map_err(|_| "the target is not a valid Host header".to_owned())?;
    headers.insert(header::HOST, host);
    parts.headers = headers;
    Ok(Request::from_parts(parts, body))
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
