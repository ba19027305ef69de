//! The container's seccomp profile: the native backend's reviewed policy
//! (`policy/seccomp.json`) rendered as one OCI profile, so a container job meets the same
//! filter as a native one. The policy is parsed and rendered by
//! [`airlock_sys::seccomp::SeccompPolicy`] (the same types the native backend compiles to
//! BPF); this module only names what the container backends and `airlock kube
//! seccomp-profile` call.

pub use airlock_sys::seccomp::OciRuntime;
use airlock_sys::seccomp::SeccompPolicy;

/// The reviewed policy, embedded at build time (the same file the native backend compiles).
pub const POLICY_JSON: &str = airlock_sys::seccomp::BUILTIN_POLICY_JSON;

/// Why the policy cannot be rendered (parse errors, or rules the OCI profile cannot say;
/// the backend then refuses to run jobs rather than guess).
pub type ProfileError = airlock_sys::seccomp::SeccompError;

/// Renders the policy as a Docker/OCI seccomp profile (JSON text for `SecurityOpt:
/// seccomp=…`) for the kernel that enforces it (see [`OciRuntime`]).
pub fn docker_profile(policy_json: &str, runtime: OciRuntime) -> Result<String, ProfileError> {
    SeccompPolicy::parse(policy_json)?.to_oci_profile(runtime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_policy_renders_for_every_flavour() {
        for runtime in [OciRuntime::Runc, OciRuntime::Gvisor] {
            let profile: serde_json::Value =
                serde_json::from_str(&docker_profile(POLICY_JSON, runtime).unwrap()).unwrap();
            assert_eq!(profile["defaultErrnoRet"], 38);
        }
    }

    #[test]
    fn a_policy_that_does_not_parse_is_refused() {
        assert!(matches!(
            docker_profile(r#"{"allow": {}}"#, OciRuntime::Runc),
            Err(ProfileError::ParsePolicy(_))
        ));
    }
}
