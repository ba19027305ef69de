//! What connecting checks of the host beside the daemon: how the containers' TCP socket
//! buffers are held to their memory limit (refused when they cannot be), and the flag
//! gVisor's runtime must carry for the seccomp profile to hold.

use crate::Flavor;
use crate::error::DockerError;
use crate::tcp::{HostFacts, TcpAccounting};

/// runsc must load the OCI seccomp profile into the sandbox, or the job runs without one.
pub const GVISOR_SECCOMP_FLAG: &str = "--oci-seccomp";

/// How this daemon's containers get their TCP buffers charged, from what it reports and
/// what this host has; refused when they cannot be.
pub(crate) fn tcp_accounting(
    flavor: Flavor,
    info: &bollard::models::SystemInfo,
) -> Result<TcpAccounting, DockerError> {
    let unbounded = |reason: String| DockerError::TcpUnbounded {
        backend: flavor.as_str(),
        reason,
    };
    // Unreadable files read as empty: the plan then refuses for a missing mount.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let version = info.cgroup_version.as_ref().map(|v| v.to_string());
    let driver = info.cgroup_driver.as_ref().map(|d| d.to_string());
    let accounting = crate::tcp::plan(
        flavor,
        &HostFacts {
            cgroup_version: version.as_deref(),
            cgroup_driver: driver.as_deref(),
            mountinfo: &mountinfo,
            cmdline: &cmdline,
            root: rustix::process::geteuid().is_root(),
        },
    )
    .map_err(unbounded)?;
    if let TcpAccounting::V1(groups) = &accounting
        && !groups.kernel_accounts_tcp()
    {
        return Err(unbounded(format!(
            "no {} in the v1 memory hierarchy: this kernel does not charge TCP buffers to \
             memory cgroups (CONFIG_MEMCG_KMEM off), so a job's sockets could pin memory \
             far past its limit; use cgroup v2",
            crate::tcp::TCP_LIMIT_FILE
        )));
    }
    Ok(accounting)
}
