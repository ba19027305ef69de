//! airlock-proxy owns the egress proxy of a job in `proxy` network mode: an HTTP/1.1
//! proxy that opens CONNECT tunnels and forwards absolute-form plain-HTTP requests to the
//! `host[:port]` entries of the job's allowlist only. It resolves each name itself,
//! refuses loopback, private, link-local (cloud metadata), CGNAT, multicast, reserved and
//! documentation addresses (and their IPv6 forms) unless the policy's `allow_ranges` names
//! them, and connects to the exact address it checked. For a host with a secret bound to
//! it, or a reviewed package index (and the file hosts the index names), it terminates the
//! tunnel's TLS with a CA made for the job (`ca`, `intercept`), verifies the real upstream
//! itself (`trust`), and handles each request inside like a plain-HTTP one. It swaps secret
//! placeholders for real values only on requests to a secret's own hosts, replaces the real
//! values (in the encodings it knows) by the placeholders again in those hosts' answers
//! (decoding gzip and deflate, refusing what it cannot read), refuses requests that carry a
//! value toward any other host, enforces the per-job connection, byte and time limits, and
//! records every request, allowed or denied.
//!
//! It must not: create or enter namespaces, bind sockets (the caller hands it a listening
//! socket, typically created inside the job's network namespace), read the executor's
//! environment by itself, write the audit log or any file (the job's CA bundle goes to the
//! caller as text, [`ProxyConfig::trust_bundle_pem`]; the CA's key never leaves this
//! process's memory), decrypt a tunnel it was not told to intercept, or print a secret's
//! value.
//!
//! # Use
//!
//! ```no_run
//! # async fn run(network: &airlock_core::policy::NetworkPolicy, job_allow: &[String],
//! #              listener: std::net::TcpListener) -> Result<(), airlock_proxy::ProxyError> {
//! use std::sync::Arc;
//! let config = airlock_proxy::ProxyConfig::from_policy(network, job_allow, |name| {
//!     std::env::var(name).ok()
//! })?;
//! // `listener`: bound to 127.0.0.1:PORT inside the job's network namespace, listening,
//! // received by the supervisor (which runs in the host's namespace) over its handoff
//! // socket. The proxy accepts on it; its upstream connects come from the supervisor's
//! // own namespace.
//! let proxy = airlock_proxy::spawn(listener, Arc::new(config))?;
//! // ... run the job with HTTP_PROXY=http://127.0.0.1:PORT and friends ...
//! let summary = proxy.shutdown().await;
//! for record in &summary.connections {
//!     // one audit event per record (serde::Serialize), with the job id
//! }
//! # Ok(()) }
//! ```
//!
//! Choices, each documented where it is made: an allowlist entry without a port admits
//! ports 80 and 443 only ([`DEFAULT_PORTS`]); numeric hosts other than a canonical
//! dotted quad are refused outright ([`TargetHost`]); a name with some blocked answers is
//! reached through its allowed answers only, and refused when none is left (`dial`);
//! placeholders are replaced where each secret's `substitute` says, header values by
//! default (`secrets`); a compressed answer the proxy must read is decoded when it is gzip
//! or deflate, refused otherwise (`decode`); every request or tunnel, allowed or denied,
//! takes one of `limits.connections`, and so does each request inside an intercepted
//! tunnel.
#![forbid(unsafe_code)]

mod ca;
mod config;
mod decode;
mod dial;
mod edit;
mod error;
mod forward;
mod host;
mod intercept;
mod meter;
mod packages;
mod ranges;
mod record;
mod scrub;
mod secrets;
mod server;
mod state;
mod trust;
mod tunnel;

pub use ca::{CaError, LEAVES_MAX, VALIDITY_DAYS};
pub use config::{
    ConnectGate, PackageIndex, ProxyConfig, ResolveFn, Resolver, Secret, SecretValue,
};
pub use decode::{DECODED_BODY_MAX_BYTES, INPUT_STEP_BYTES};
pub use error::ProxyError;
pub use host::{DEFAULT_PORTS, HostError, HostRule, TargetHost};
pub use ranges::{
    AllowedRanges, BLOCKED_V4, BLOCKED_V6, BlockReason, BlockedRange, GLOBAL_UNICAST_V6,
    blocked_reason, canonical_ip,
};
pub use record::{ConnectionRecord, LimitKind, ProxySummary, RECORD_PATH_MAX_BYTES, Verdict};
pub use server::{MAX_REQUEST_HEAD_BYTES, ProxyHandle, spawn};
pub use state::FILE_HOSTS_MAX;
pub use trust::EXTRA_ROOTS_MAX_PER_FILE;
