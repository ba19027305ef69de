//! How a sandbox's user namespace maps its ids to host ids: the native backend writes the
//! maps, and every backend chowns the job's directory to the job's host ids.

use serde::{Deserialize, Serialize};

/// The uid and gid the job runs as, inside the sandbox.
pub const JOB_ID_IN_SANDBOX: u32 = 65_534;

/// How in-sandbox ids map to host ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum IdMapping {
    /// airlock runs as root: in-sandbox 0..65535 map to host `base..base+65535`, so
    /// in-sandbox root is an unprivileged host uid and the job's 65534 is `base+65534`.
    Root {
        /// First host id of the range.
        host_base: u32,
    },
    /// airlock runs unprivileged: only its own uid and gid exist in the sandbox, as 65534.
    Rootless {
        /// airlock's uid.
        host_uid: u32,
        /// airlock's gid.
        host_gid: u32,
    },
}

impl IdMapping {
    /// Number of ids mapped in root mode.
    pub const ROOT_RANGE: u32 = 65_536;

    /// The `uid_map` text.
    pub fn uid_map(&self) -> String {
        match self {
            IdMapping::Root { host_base } => format!("0 {host_base} {}\n", Self::ROOT_RANGE),
            IdMapping::Rootless { host_uid, .. } => format!("{JOB_ID_IN_SANDBOX} {host_uid} 1\n"),
        }
    }

    /// The `gid_map` text.
    pub fn gid_map(&self) -> String {
        match self {
            IdMapping::Root { host_base } => format!("0 {host_base} {}\n", Self::ROOT_RANGE),
            IdMapping::Rootless { host_gid, .. } => format!("{JOB_ID_IN_SANDBOX} {host_gid} 1\n"),
        }
    }

    /// Whether `setgroups` must be denied before the gid map can be written (unprivileged).
    pub fn deny_setgroups(&self) -> bool {
        matches!(self, IdMapping::Rootless { .. })
    }

    /// The host uid the job runs as.
    pub fn job_host_uid(&self) -> u32 {
        match self {
            IdMapping::Root { host_base } => host_base + JOB_ID_IN_SANDBOX,
            IdMapping::Rootless { host_uid, .. } => *host_uid,
        }
    }

    /// The host gid the job runs as.
    pub fn job_host_gid(&self) -> u32 {
        match self {
            IdMapping::Root { host_base } => host_base + JOB_ID_IN_SANDBOX,
            IdMapping::Rootless { host_gid, .. } => *host_gid,
        }
    }

    /// The host uid (and gid) that creates, and so owns, the job's user namespace: in-sandbox
    /// id `1 + slot % NAMESPACE_OWNER_SLOTS`, mapped but never run as. Root mode only: a
    /// namespace created by host root charges its processes' per-user counts (inotify
    /// instances, message queue bytes, queued signals, namespaces) to host root as well, so a
    /// job could exhaust root's; owned by its own unprivileged uid, it charges that uid. Rootless,
    /// the namespace is already owned by airlock's own user.
    pub fn namespace_owner(&self, slot: u32) -> Option<u32> {
        match self {
            IdMapping::Root { host_base } => Some(host_base + 1 + slot % NAMESPACE_OWNER_SLOTS),
            IdMapping::Rootless { .. } => None,
        }
    }

    /// The host uid of in-sandbox root (the owner of the job directory), if root is mapped.
    pub fn sandbox_root_host_uid(&self) -> Option<u32> {
        match self {
            IdMapping::Root { host_base } => Some(*host_base),
            IdMapping::Rootless { .. } => None,
        }
    }
}

/// How many distinct owners job user namespaces rotate through: the in-sandbox ids between
/// root (0) and the job (65534), which are mapped but that nothing runs as.
pub const NAMESPACE_OWNER_SLOTS: u32 = JOB_ID_IN_SANDBOX - 1;

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn root_mapping_never_maps_host_root() {
        let ids = IdMapping::Root {
            host_base: 1_879_048_192,
        };
        assert_eq!(ids.uid_map(), "0 1879048192 65536\n");
        assert_eq!(ids.job_host_uid(), 1_879_048_192 + 65_534);
        assert!(!ids.deny_setgroups());
        // Owners are mapped ids that are neither root nor the job, never a host id below the
        // range or past it.
        for slot in [
            0,
            1,
            NAMESPACE_OWNER_SLOTS - 1,
            NAMESPACE_OWNER_SLOTS,
            u32::MAX,
        ] {
            let owner = ids.namespace_owner(slot).unwrap();
            assert!(
                owner > 1_879_048_192 && owner < ids.job_host_uid(),
                "{slot}: {owner}"
            );
        }
        assert_eq!(ids.namespace_owner(0), Some(1_879_048_193));
        assert_eq!(
            ids.namespace_owner(NAMESPACE_OWNER_SLOTS),
            Some(1_879_048_193)
        );
    }

    #[test]
    fn rootless_mapping_maps_only_the_user() {
        let ids = IdMapping::Rootless {
            host_uid: 1000,
            host_gid: 1000,
        };
        assert_eq!(ids.uid_map(), "65534 1000 1\n");
        assert_eq!(ids.gid_map(), "65534 1000 1\n");
        assert!(ids.deny_setgroups());
        assert_eq!(ids.namespace_owner(7), None);
    }
}
