//! airlock-testkit: dev-only helpers for airlock's tests. It owns the in-sandbox probe: the
//! `airlock-probe` binary, run as a job inside a sandbox, prints one JSON [`ProbeReport`] of
//! what the job can see and do (identity, capabilities, mounts, writable paths, network,
//! environment, dangerous syscalls, rlimits), and this library holds the report's types so
//! end-to-end tests in other crates can read it back and judge it. The probe reports, it
//! never judges, and it must stay harmless when run outside any sandbox, even as root (see
//! `airlock_sys::probe`). Nothing here is linked into the airlock binary.

#![forbid(unsafe_code)]

mod cgroups;
mod error;
#[cfg(feature = "fake-cluster")]
pub mod fake_cluster;
mod names;
mod parse;
mod report;
pub mod require;
#[cfg(feature = "tls-server")]
pub mod tls;

use std::path::{Path, PathBuf};

pub use airlock_sys::probe::DangerousCall;
pub use cgroups::{cgroup_dir_names, job_dir_of};
pub use error::Error;
pub use names::{errno_name, signal_name};
pub use parse::{MountInfo, mount_for_path, parse_mountinfo, parse_net_dev, parse_proc_status};
pub use report::{
    Canary, FillTmp, Identity, MountCheck, Network, Outcome, Paths, ProbeReport, ProcStatus,
    REPORT_VERSION, Rlimit, Rlimits, TmpExec,
};

/// The calls the seccomp filter refuses with `EPERM` on every backend (the same reviewed
/// filter everywhere): what a conformance check, and a check of any other kind of sandbox
/// (a session's), asserts of a probe report.
pub const DENIED_WITH_EPERM: &[DangerousCall] = &[
    DangerousCall::Mount,
    DangerousCall::Umount2,
    DangerousCall::PivotRoot,
    DangerousCall::UnshareUser,
    DangerousCall::UnshareMount,
    DangerousCall::Setns,
    DangerousCall::CloneNewuser,
    DangerousCall::PtraceAttach,
    DangerousCall::Bpf,
    DangerousCall::Keyctl,
    DangerousCall::AddKey,
    DangerousCall::IoUringSetup,
    DangerousCall::PerfEventOpen,
    DangerousCall::Userfaultfd,
    DangerousCall::KexecLoad,
    DangerousCall::InitModule,
    DangerousCall::FinitModule,
    DangerousCall::OpenByHandleAt,
    DangerousCall::ClockSettime,
    DangerousCall::Reboot,
    DangerousCall::Swapon,
    DangerousCall::Acct,
    DangerousCall::Chroot,
    DangerousCall::SocketPacketRaw,
    DangerousCall::SocketInetRawIcmp,
];

/// The probe binary's file name.
pub const PROBE_BIN: &str = "airlock-probe";

/// Environment variable that, when set, overrides where [`probe_path`] looks.
pub const PROBE_ENV: &str = "AIRLOCK_PROBE";

/// Where the built `airlock-probe` binary is, for tests in any crate of the workspace.
///
/// `$AIRLOCK_PROBE` if set; otherwise the binary next to the running test's profile
/// directory: test executables live in `target/<profile>/deps/`, the probe in
/// `target/<profile>/`. Cargo builds a crate's own binaries only for that crate's tests, so
/// build the probe first: `cargo build -p airlock-testkit --bin airlock-probe` (same
/// profile and `CARGO_TARGET_DIR` as the tests). The path may not exist; [`require_probe`]
/// checks.
pub fn probe_path() -> PathBuf {
    if let Some(path) = std::env::var_os(PROBE_ENV) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    probe_path_from(&exe)
}

/// [`probe_path`], or [`Error::ProbeNotBuilt`] (whose message says how to build it) when no
/// file is there.
pub fn require_probe() -> Result<PathBuf, Error> {
    let path = probe_path();
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::ProbeNotBuilt { path })
    }
}

/// The probe's path for a test executable at `exe`: the first of `exe`'s ancestor
/// directories (up to three levels) that holds the probe, else `<exe dir>/../airlock-probe`.
fn probe_path_from(exe: &Path) -> PathBuf {
    let dir = exe.parent().unwrap_or(Path::new("."));
    dir.ancestors()
        .take(3)
        .map(|ancestor| ancestor.join(PROBE_BIN))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            let profile = if dir.file_name().is_some_and(|name| name == "deps") {
                dir.parent().unwrap_or(dir)
            } else {
                dir
            };
            profile.join(PROBE_BIN)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_probe_resolves_next_to_deps() {
        let exe = Path::new("/nonexistent/target/debug/deps/suite-0123abcd");
        assert_eq!(
            probe_path_from(exe),
            Path::new("/nonexistent/target/debug/airlock-probe")
        );
        let exe = Path::new("/nonexistent/target/debug/examples/demo");
        assert_eq!(
            probe_path_from(exe),
            Path::new("/nonexistent/target/debug/examples/airlock-probe")
        );
    }
}
