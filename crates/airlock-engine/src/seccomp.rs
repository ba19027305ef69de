//! airlock's seccomp filter as the OCI profile container runtimes load, for operators who
//! install it themselves (`airlock kube seccomp-profile` for a node's kubelet directory).

/// Why the builtin policy cannot be rendered (a bug in `policy/seccomp.json`).
pub use airlock_docker::seccomp::ProfileError;

/// The builtin seccomp policy as an OCI profile (JSON text), exactly as the Docker, Podman
/// and Kubernetes backends load it.
pub fn oci_profile() -> Result<String, ProfileError> {
    airlock_docker::seccomp::docker_profile(
        airlock_docker::seccomp::POLICY_JSON,
        airlock_docker::seccomp::OciRuntime::Runc,
    )
}
