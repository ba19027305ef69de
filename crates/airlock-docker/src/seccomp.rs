//! The container's seccomp profile: the native backend's reviewed policy
//! (`policy/seccomp.json`) rendered as one OCI profile by airlock-seccomp (the same types
//! the native backend compiles to BPF), so a container job meets the same filter as a
//! native one.

use airlock_seccomp::{OciRuntime, SeccompError, SeccompPolicy};

use crate::Flavor;

/// The built-in policy as a Docker/OCI seccomp profile (JSON text for `SecurityOpt:
/// seccomp=…`) for the kernel that enforces `flavor`'s containers: gVisor's own, or the
/// host's under runc and crun (see [`OciRuntime`]). An error means the policy cannot be
/// rendered; the backend then refuses to run jobs rather than guess.
pub fn profile_for(flavor: Flavor) -> Result<String, SeccompError> {
    let runtime = match flavor {
        Flavor::Gvisor => OciRuntime::Gvisor,
        Flavor::Docker | Flavor::Podman => OciRuntime::Runc,
    };
    SeccompPolicy::builtin()?.to_oci_profile(runtime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_policy_renders_for_every_flavour() {
        for flavor in [Flavor::Docker, Flavor::Podman, Flavor::Gvisor] {
            let profile: serde_json::Value =
                serde_json::from_str(&profile_for(flavor).unwrap()).unwrap();
            assert_eq!(profile["defaultErrnoRet"], 38);
        }
    }

    #[test]
    fn gvisor_gets_the_profile_for_its_own_kernel() {
        let runc = profile_for(Flavor::Docker).unwrap();
        assert_eq!(profile_for(Flavor::Podman).unwrap(), runc);
        assert_ne!(profile_for(Flavor::Gvisor).unwrap(), runc);
    }
}
