//! What opening the native backend checks of the host: a cgroup it may manage, swap
//! accounting, TCP accounting, `vm.memfd_noexec`; and what the observation lists when the
//! policy accepts a weaker shape.

use airlock_cgroup::{CgroupManager, Hierarchy, ParentSpec};
use airlock_core::policy::CgroupParent;

use crate::backend::NativeConfig;
use crate::error::NativeError;

/// Whether the kernel has `vm.memfd_noexec` (Linux 6.3+, per pid namespace).
pub fn memfd_noexec_available() -> bool {
    std::path::Path::new(MEMFD_NOEXEC_SYSCTL).exists()
}

/// The sysctl that makes memfds non-executable.
pub const MEMFD_NOEXEC_SYSCTL: &str = "/proc/sys/vm/memfd_noexec";

/// What is weaker without a cgroup, as listed in observations and audit lines.
pub const DEGRADED_WITHOUT_CGROUP: &[&str] = &[
    "memory: RLIMIT_AS per process instead of a cgroup limit for the whole job",
    "pids: RLIMIT_NPROC per user namespace instead of a cgroup limit",
    "cpu: no CPU share, only the RLIMIT_CPU time cap",
    "accounting: cpu and peak memory from the processes the init reaped",
];

/// Why a host without TCP accounting in its memory cgroups is refused.
pub const TCP_ACCOUNTING_MISSING: &str = "this kernel does not charge TCP socket buffers to memory cgroups (v1: no \
     memory.kmem.tcp.limit_in_bytes, CONFIG_MEMCG_KMEM off or cgroup.memory=nosocket; v2: \
     booted with cgroup.memory=nosocket), so a job's sockets could pin memory far past its \
     limit; boot without cgroup.memory=nosocket, or use cgroup v2";

/// What the observation lists when the policy accepts an uncapped swap.
pub const DEGRADED_SWAP: &str =
    "memory: swap is on and not accounted, so a job may page out beyond its memory limit";

/// Why the memory limit cannot hold with no swap: `Some` when the cgroup hierarchy cannot
/// cap swap and the host has swap enabled (`SwapTotal` in `/proc/meminfo` above zero).
/// With swap accounting the memory limit is the whole bound, and nothing is read.
pub fn swap_gap(swap_accounting: bool) -> Option<String> {
    if swap_accounting {
        return None;
    }
    // Unreadable /proc/meminfo: no evidence of swap either way; the cgroup check stands.
    swap_gap_in(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default())
}

/// [`swap_gap`] of a host without swap accounting whose `/proc/meminfo` is `meminfo`.
fn swap_gap_in(meminfo: &str) -> Option<String> {
    let swap_kib = meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix("SwapTotal:")?;
        rest.trim()
            .trim_end_matches("kB")
            .trim()
            .parse::<u64>()
            .ok()
    })?;
    (swap_kib > 0).then(|| {
        format!(
            "this host has {} MiB of swap and its cgroups do not account swap, so a job could \
             page out beyond its memory limit",
            swap_kib / 1024
        )
    })
}

pub(crate) fn swap_refusal(gap: String) -> NativeError {
    NativeError::Unsupported {
        control: "swap",
        reason: format!(
            "{gap}. Enable swap accounting (cgroup v1: boot with swapaccount=1; v2: the \
             memory controller with memory.swap.max), or turn swap off (swapoff -a), or accept \
             it with [native] allow_degraded = [\"swap\"]"
        ),
    }
}

/// Opens the cgroup hierarchy and checks that job groups can be created under the parent.
pub(crate) fn open_cgroups(config: &NativeConfig) -> Result<CgroupManager, String> {
    let hierarchy = Hierarchy::detect().map_err(|e| e.to_string())?;
    let parent = match &config.cgroup_parent {
        CgroupParent::Auto => ParentSpec::Auto,
        CgroupParent::Path(p) => ParentSpec::Path(p.clone()),
    };
    let report = hierarchy.report_for(&parent);
    if !report.parent.writable {
        return Err(report
            .parent
            .explanation
            .clone()
            .unwrap_or_else(|| "the cgroup parent is not writable".to_owned()));
    }
    CgroupManager::new(hierarchy, parent).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const WITH_SWAP: &str = "MemTotal:       24000000 kB\nSwapCached:            0 kB\nSwapTotal:       2097148 kB\nSwapFree:        2097148 kB\n";
    const WITHOUT_SWAP: &str =
        "MemTotal:       24000000 kB\nSwapTotal:             0 kB\nSwapFree:              0 kB\n";

    #[test]
    fn swap_without_accounting_is_a_gap() {
        let gap = swap_gap_in(WITH_SWAP).expect("a gap");
        assert!(gap.contains("2047 MiB of swap"), "{gap}");
    }

    #[test]
    fn swap_accounting_or_no_swap_is_no_gap() {
        assert_eq!(swap_gap(true), None);
        assert_eq!(swap_gap_in(WITHOUT_SWAP), None);
        // Nothing known about swap: no evidence of a gap.
        assert_eq!(swap_gap_in(""), None);
    }

    #[test]
    fn the_swap_refusal_names_the_control_and_every_fix() {
        let NativeError::Unsupported { control, reason } = swap_refusal("gap".to_owned()) else {
            panic!("not an Unsupported error");
        };
        assert_eq!(control, "swap");
        for fix in [
            "swapaccount=1",
            "memory.swap.max",
            "swapoff",
            "allow_degraded = [\"swap\"]",
        ] {
            assert!(reason.contains(fix), "{reason}");
        }
    }
}
