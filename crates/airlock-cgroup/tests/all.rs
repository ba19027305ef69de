//! The integration binary of airlock-cgroup: real cgroups on this host.
//!
//! Every test needs root and a mounted cgroupfs; without them it prints `skipped: <reason>`
//! and returns. A skipped test shows as passed in nextest's count: read the output.

mod suite;
