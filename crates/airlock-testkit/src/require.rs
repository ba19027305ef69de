//! Requirements of environment-dependent tests, and how a missing one is reported.
//!
//! A test that needs something the host lacks (root, a rootfs, Docker) calls
//! [`require!`](crate::require). Locally it prints `SKIPPED <test>: <reason>` to stderr
//! and returns early. Under `AIRLOCK_REQUIRE_ALL=1`, which `.ci/run` sets, a missing
//! requirement fails the test instead: in CI a skip is never counted as a pass. Every skip
//! is also appended to the file named by `AIRLOCK_SKIP_LOG`, so a run can list them.

use std::io::Write;

/// Environment variable that turns skips into failures.
pub const REQUIRE_ALL_ENV: &str = "AIRLOCK_REQUIRE_ALL";

/// Environment variable naming a file where skips are recorded.
pub const SKIP_LOG_ENV: &str = "AIRLOCK_SKIP_LOG";

/// Whether the test should go on: true when `met`; otherwise reports the skip (or panics
/// under `AIRLOCK_REQUIRE_ALL=1`) and returns false.
pub fn check(met: bool, test: &str, reason: &str) -> bool {
    if met {
        return true;
    }
    if std::env::var(REQUIRE_ALL_ENV).is_ok_and(|v| v == "1") {
        panic!("{test}: required but missing ({REQUIRE_ALL_ENV}=1): {reason}");
    }
    eprintln!("SKIPPED {test}: {reason}");
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV)
        && let Ok(mut file) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
    {
        let _ = writeln!(file, "{test}: {reason}");
    }
    false
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Whether this process has `CAP_SYS_RESOURCE` (bit 24 of `CapEff`), which some hosts'
/// root lacks (a container's); airlock, started by it, has what it has.
pub fn has_cap_sys_resource() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

/// Returns from the calling test unless `$met`, reporting `$reason` (see the module docs).
#[macro_export]
macro_rules! require {
    ($met:expr, $reason:expr) => {
        if !$crate::require::check($met, module_path!(), &$reason) {
            return;
        }
    };
}
