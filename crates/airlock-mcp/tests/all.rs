#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! airlock-mcp's integration tests: the tool server driven over its real transports
//! (a byte stream as stdio, streamable HTTP) with an executor that records what it is
//! asked to do, so cancellation and file return are checked without a sandbox.

mod suite;
