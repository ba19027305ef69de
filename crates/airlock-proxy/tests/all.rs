#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The integration binary of airlock-proxy: a real proxy on 127.0.0.1 in front of real
//! HTTP servers on 127.0.0.1, driven by raw sockets, `curl` and Python's `urllib`.
//! Nothing here leaves the machine: names resolve through a static table, and the proxy's
//! connect gate refuses every non-loopback address (see `suite/common.rs`).

mod suite;
