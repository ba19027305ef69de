//! CONNECT: a byte tunnel between the job and the checked upstream address.
//!
//! The tunnel is opaque: TLS inside it is not decrypted, so neither the allowlist nor
//! secret substitution can look at what flows (the server name inside TLS, or a `Host`
//! header inside it, may differ from the CONNECT target: a CDN that serves many names on
//! one address can be reached through any allowed name it also serves). The byte budget,
//! the idle timeout and shutdown still apply.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::meter::Metered;
use crate::record::LimitKind;
use crate::server::{ClientCtx, ProxyBody, empty};
use crate::state::InFlight;

/// Answers 200 and splices the client's upgraded connection to `upstream` in a task.
pub(crate) fn open(
    req: Request<Incoming>,
    mut upstream: Metered<TcpStream>,
    ctx: &Arc<ClientCtx>,
    inflight: Arc<InFlight>,
) -> Response<ProxyBody> {
    inflight.update(|r| r.status = Some(StatusCode::OK.as_u16()));
    let shared = ctx.shared.clone();
    let activity = ctx.activity.clone();
    let token = shared.drain_token();
    tokio::spawn(async move {
        let _token = token;
        let idle = shared.config.limits().idle_timeout;
        let upgraded = tokio::select! {
            upgraded = hyper::upgrade::on(req) => match upgraded {
                Ok(upgraded) => upgraded,
                Err(e) => {
                    inflight.fail(format!("client left before the tunnel opened: {e}"), None);
                    return;
                }
            },
            () = activity.idle(idle) => {
                inflight.fail(LimitKind::IdleTimeout.to_string(), Some(LimitKind::IdleTimeout));
                return;
            }
            () = shared.stopped() => return,
        };
        let mut client = TokioIo::new(upgraded);
        tokio::select! {
            copied = tokio::io::copy_bidirectional(&mut client, &mut upstream) => match copied {
                Ok(_) => inflight.finish(),
                Err(e) => inflight.fail(format!("tunnel: {e}"), None),
            },
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
