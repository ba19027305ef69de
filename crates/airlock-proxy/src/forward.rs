//! Plain HTTP: an absolute-form request (`GET http://host:port/path`) is re-sent in
//! origin form on its own upstream connection to the checked address.
//!
//! Hop-by-hop headers (`Connection` and the headers it names, `Keep-Alive`, `TE`,
//! `Trailer`, `Transfer-Encoding`, `Upgrade`), every `Proxy-*` header and `Expect` are
//! dropped both ways; `Host` is always rewritten to the target, so a request for an
//! allowed host cannot name another virtual host on the same address. Secrets are put in
//! as described in [`crate::secrets`]. Each request gets a fresh upstream connection,
//! closed when its response ends; nothing is pooled across requests.

use std::sync::Arc;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::config::Secret;
use crate::meter::Metered;
use crate::record::LimitKind;
use crate::secrets::{ScrubbedBody, Scrubber, substitute_bytes, substitute_query};
use crate::server::{ClientCtx, ProxyBody, Target, fail, text_response};
use crate::state::InFlight;

/// Largest response head accepted from an upstream, in bytes.
const MAX_RESPONSE_HEAD_BYTES: usize = 64 * 1024;
/// Read buffer of one upstream connection, in bytes.
const UPSTREAM_BUFFER_BYTES: usize = 128 * 1024;

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
    // The real value (in any form the scrubber knows) may only go to its own hosts; a job
    // that read it back somehow must not be able to carry it anywhere else.
    if let Some(foreign) = Scrubber::new(&foreign) {
        let in_target = req
            .uri()
            .path_and_query()
            .is_some_and(|pq| foreign.finds(pq.as_str().as_bytes()));
        let in_headers = req.headers().values().any(|v| foreign.finds(v.as_bytes()));
        if in_target || in_headers {
            let reason = "the request carries a secret's real value to a host outside its scope";
            tracing::warn!(reason, "proxy request denied");
            inflight.deny(reason, StatusCode::FORBIDDEN.as_u16(), None);
            return text_response(StatusCode::FORBIDDEN, reason);
        }
    }
    let scrubber = Scrubber::new(&secrets).map(Arc::new);
    let outgoing = match build_request(req, target, &secrets) {
        Ok(outgoing) => outgoing,
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
    let token = shared.drain_token();
    tokio::spawn(async move {
        let _token = token;
        let idle = shared.config.limits().idle_timeout;
        tokio::select! {
            result = conn => match result {
                Ok(()) => driver_record.finish(),
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
    strip_hop_by_hop(&mut parts.headers);
    let Some(scrubber) = scrubber else {
        return Response::from_parts(parts, body.boxed());
    };
    // The upstream saw the real value and may echo it; what the job gets back has it
    // replaced. A body the proxy cannot read (compressed) is refused rather than passed.
    let encoded = parts
        .headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    if encoded {
        return fail(
            &inflight,
            StatusCode::BAD_GATEWAY,
            "the upstream of a secret sent a compressed body, which the proxy cannot scrub"
                .to_owned(),
            None,
        );
    }
    let mut scrubbed = 0;
    for value in parts.headers.values_mut() {
        if let Some((replaced, n)) = scrubber.scrub(value.as_bytes()) {
            match HeaderValue::from_bytes(&replaced) {
                Ok(new) => *value = new,
                Err(_) => *value = HeaderValue::from_static(""),
            }
            scrubbed += n;
        }
    }
    if scrubbed > 0 {
        inflight.update(|r| r.secrets_scrubbed += scrubbed);
    }
    // The length changes with each replacement; hyper frames the body as chunked.
    parts.headers.remove(header::CONTENT_LENGTH);
    let body = ScrubbedBody::new(body, scrubber, inflight);
    Response::from_parts(parts, body.boxed())
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
