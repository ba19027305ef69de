//! airlock-proxy owns the egress proxy of a job in `proxy` network mode: an HTTP/1.1
//! proxy that opens CONNECT tunnels and forwards absolute-form plain-HTTP requests to the
//! `host[:port]` entries of the job's allowlist only. It resolves each name itself,
//! refuses loopback, private, link-local (cloud metadata), CGNAT, multicast, reserved and
//! documentation addresses (and their IPv6 forms) unless the policy's `allow_ranges` names
//! them, and connects to the exact address it checked. It swaps secret placeholders for
//! real values only on plain-HTTP requests to a secret's own hosts, enforces the per-job
//! connection, byte and time limits, and records every request, allowed or denied.
//!
//! It must not: create or enter namespaces, bind sockets (the caller hands it a listening
//! socket, typically created inside the job's network namespace), read the executor's
//! environment by itself, write the audit log, decrypt TLS, or print a secret's value.
#![forbid(unsafe_code)]

mod config;
mod dial;
mod error;
mod forward;
mod host;
mod meter;
mod ranges;
mod record;
mod secrets;
mod server;
mod state;
mod tunnel;

pub use config::{ConnectGate, ProxyConfig, Resolver, Secret, SecretValue};
pub use error::ProxyError;
pub use host::{DEFAULT_PORTS, HostError, HostRule, TargetHost};
pub use ranges::{
    AllowedRanges, BLOCKED_V4, BLOCKED_V6, BlockReason, BlockedRange, GLOBAL_UNICAST_V6,
    blocked_reason, canonical_ip,
};
pub use record::{ConnectionRecord, LimitKind, ProxySummary, Verdict};
pub use server::{MAX_REQUEST_HEAD_BYTES, ProxyHandle, spawn};
