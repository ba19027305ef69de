//! Resolve, check, connect: the one path from a target to an upstream socket.
//!
//! The name is resolved once; every answer is checked against the blocked ranges; the
//! proxy then connects to one of the checked addresses itself, never to the name, so a
//! DNS answer that changes between check and connect (rebinding) changes nothing.
//!
//! Mixed answers: a name whose answers include blocked addresses is reached through its
//! allowed answers only (tried in the resolver's order); it is refused only when no answer
//! is left. Refusing outright would add no safety, since the blocked answers are never
//! dialled, and would break names with a private AAAA next to a public A record.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::config::Resolver;
use crate::host::TargetHost;
use crate::ranges::BlockReason;
use crate::state::Shared;

/// Most answers of one name that are tried.
const ANSWERS_TRIED_MAX: usize = 8;

/// Why no upstream socket was made.
#[derive(Debug)]
pub(crate) enum DialError {
    /// Policy: the target's addresses are all refused.
    Blocked(String),
    /// The name does not resolve.
    Resolve(String),
    /// `limits.connect_timeout` passed (resolution included).
    Timeout,
    /// Every connect failed.
    Connect(String),
}

/// Resolves `host`, checks every address, and connects to the first allowed one within
/// the connect timeout. Returns the socket and the address it is connected to.
pub(crate) async fn dial(
    shared: &Arc<Shared>,
    host: &TargetHost,
    port: u16,
) -> Result<(TcpStream, SocketAddr), DialError> {
    let timeout = shared.config.limits().connect_timeout;
    let deadline = Instant::now() + timeout;
    let answers = match host.ip() {
        Some(ip) => vec![ip],
        None => {
            let TargetHost::Name(name) = host else {
                return Err(DialError::Resolve("no address".to_owned()));
            };
            match tokio::time::timeout_at(deadline, resolve(shared.config.resolver(), name, port))
                .await
            {
                Ok(Ok(answers)) => answers,
                Ok(Err(e)) => return Err(DialError::Resolve(e)),
                Err(_) => return Err(DialError::Timeout),
            }
        }
    };
    let candidates = check_answers(shared, &answers, port)?;
    connect_first(shared, &candidates, deadline, timeout).await
}

/// The allowed answers, as the addresses to connect to; an error naming the refusal when
/// none is left.
pub(crate) fn check_answers(
    shared: &Shared,
    answers: &[IpAddr],
    port: u16,
) -> Result<Vec<SocketAddr>, DialError> {
    let ranges = shared.config.allow_ranges();
    let mut candidates = Vec::new();
    let mut refused: Vec<(IpAddr, Option<BlockReason>)> = Vec::new();
    for &ip in answers {
        match ranges.check(ip) {
            Ok(ip) if is_self(shared.listen_addr, SocketAddr::new(ip, port)) => {
                refused.push((ip, None));
            }
            Ok(ip) => {
                let addr = SocketAddr::new(ip, port);
                if !candidates.contains(&addr) {
                    candidates.push(addr);
                }
            }
            Err(reason) => refused.push((ip, Some(reason))),
        }
    }
    if !candidates.is_empty() {
        candidates.truncate(ANSWERS_TRIED_MAX);
        return Ok(candidates);
    }
    let reason = match refused.first() {
        Some((ip, Some(reason))) => format!("{ip} is in blocked range {reason}"),
        Some((ip, None)) => format!("{ip}:{port} is the proxy itself"),
        None => "the name has no address".to_owned(),
    };
    Err(DialError::Blocked(reason))
}

/// True when `target` would reach the proxy's own listener.
fn is_self(listen: SocketAddr, target: SocketAddr) -> bool {
    target.port() == listen.port()
        && (target.ip() == listen.ip()
            || target.ip().is_unspecified()
            || listen.ip().is_unspecified()
            || (target.ip().is_loopback() && listen.ip().is_loopback()))
}

async fn resolve(resolver: &Resolver, name: &str, port: u16) -> Result<Vec<IpAddr>, String> {
    match resolver {
        Resolver::Static(table) => table
            .get(name)
            .filter(|answers| !answers.is_empty())
            .cloned()
            .ok_or_else(|| format!("{name} does not resolve")),
        Resolver::SystemWithHosts(table) if table.contains_key(name) => table
            .get(name)
            .filter(|answers| !answers.is_empty())
            .cloned()
            .ok_or_else(|| format!("{name} has no address in the policy's hosts table")),
        Resolver::Function(resolve) => match (resolve.0)(name) {
            Ok(answers) if answers.is_empty() => Err(format!("{name} has no address")),
            answer => answer,
        },
        Resolver::System | Resolver::SystemWithHosts(_) => {
            let answers = tokio::net::lookup_host((name, port))
                .await
                .map_err(|e| format!("{name} does not resolve: {e}"))?;
            let mut ips: Vec<IpAddr> = Vec::new();
            for addr in answers {
                if !ips.contains(&addr.ip()) {
                    ips.push(addr.ip());
                }
            }
            if ips.is_empty() {
                return Err(format!("{name} has no address"));
            }
            Ok(ips)
        }
    }
}

async fn connect_first(
    shared: &Shared,
    candidates: &[SocketAddr],
    deadline: Instant,
    timeout: Duration,
) -> Result<(TcpStream, SocketAddr), DialError> {
    let mut last_error: Option<io::Error> = None;
    for &addr in candidates {
        if let Some(gate) = shared.config.connect_gate()
            && !gate(addr)
        {
            last_error = Some(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "refused by the connect gate",
            ));
            continue;
        }
        shared.count_connect();
        match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                // Small writes (TLS handshakes, request heads) go out at once.
                let _ = stream.set_nodelay(true);
                return Ok((stream, addr));
            }
            Ok(Err(e)) => last_error = Some(e),
            Err(_) => {
                tracing::debug!(%addr, ?timeout, "upstream connect timed out");
                return Err(DialError::Timeout);
            }
        }
    }
    Err(DialError::Connect(match last_error {
        Some(e) => e.to_string(),
        None => "no address to connect to".to_owned(),
    }))
}
