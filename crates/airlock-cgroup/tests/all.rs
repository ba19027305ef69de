//! The integration binary of airlock-cgroup: real cgroups on this host.
//!
//! Every test needs root and a mounted cgroupfs (v1, or v2 with memory, pids and cpu);
//! without them it prints `skipped: <reason>` and returns, and a skipped test shows as
//! passed in nextest's count. Under `AIRLOCK_REQUIRE_ALL=1` (CI) a missing requirement
//! fails the test instead. `scripts/vm/run-v2-tests.sh` runs this binary on a real cgroup
//! v2 kernel.

mod suite;
