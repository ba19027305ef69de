//! airlock's seccomp filter as the OCI profile container runtimes load, for operators who
//! install it themselves (`airlock kube seccomp-profile` for a node's kubelet directory).

use airlock_seccomp::{OciRuntime, SeccompError, SeccompPolicy};

/// The builtin seccomp policy as an OCI profile (JSON text), exactly as the Docker, Podman
/// and Kubernetes backends load it. An error is a bug in `policy/seccomp.json`.
pub fn oci_profile() -> Result<String, SeccompError> {
    SeccompPolicy::builtin()?.to_oci_profile(OciRuntime::Runc)
}
