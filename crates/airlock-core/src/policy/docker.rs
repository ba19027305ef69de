//! `[docker]`: the Engine API backends' daemon sockets and OCI runtimes.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Settings of the Engine API backends: where their daemons listen and which OCI runtime
/// each uses. The job never sees any of this; the sockets stay on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DockerPolicy {
    /// The Docker daemon's socket, for `--backend docker` and `--backend gvisor`. Empty
    /// (the default): the caller's `DOCKER_HOST` (a `unix://` address), as for the docker
    /// CLI, else [`DockerPolicy::DEFAULT_DOCKER_SOCKET`]; a path here wins over
    /// `DOCKER_HOST`.
    pub docker_socket: PathBuf,
    /// Podman's Docker-compatible service socket (`podman system service`).
    pub podman_socket: PathBuf,
    /// The OCI runtime of `--backend docker`.
    pub runtime: String,
    /// The OCI runtime of `--backend gvisor`, as registered with the Docker daemon.
    pub gvisor_runtime: String,
    /// The OCI runtime of `--backend podman`; empty: the service's default.
    pub podman_runtime: String,
}

impl DockerPolicy {
    /// Longest runtime name.
    pub const RUNTIME_NAME_MAX_BYTES: usize = 64;
    /// The Docker daemon's socket when `docker_socket` is empty and `DOCKER_HOST` unset.
    pub const DEFAULT_DOCKER_SOCKET: &'static str = "/var/run/docker.sock";

    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        for (field, path, may_be_empty) in [
            ("docker_socket", &self.docker_socket, true),
            ("podman_socket", &self.podman_socket, false),
        ] {
            if path.as_os_str().is_empty() && may_be_empty {
                continue;
            }
            if !path.is_absolute() {
                return Err((field, format!("{} is not an absolute path", path.display())));
            }
            if path.as_os_str().as_encoded_bytes().contains(&0) {
                return Err((field, "contains a NUL byte".to_owned()));
            }
        }
        for (field, name, may_be_empty) in [
            ("runtime", &self.runtime, false),
            ("gvisor_runtime", &self.gvisor_runtime, false),
            ("podman_runtime", &self.podman_runtime, true),
        ] {
            if name.is_empty() && may_be_empty {
                continue;
            }
            let valid = !name.is_empty()
                && name.len() <= Self::RUNTIME_NAME_MAX_BYTES
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !valid {
                return Err((
                    field,
                    format!(
                        "{name:?} is not a runtime name (1-{} characters of [A-Za-z0-9._-])",
                        Self::RUNTIME_NAME_MAX_BYTES
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Default for DockerPolicy {
    fn default() -> Self {
        Self {
            docker_socket: PathBuf::new(),
            podman_socket: PathBuf::from("/run/podman/podman.sock"),
            runtime: "runc".to_owned(),
            gvisor_runtime: "runsc".to_owned(),
            podman_runtime: String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;
    use pretty_assertions::assert_eq;

    #[test]
    fn docker_section_takes_defaults_and_overrides() {
        let p = Policy::builtin();
        assert_eq!(p.docker.docker_socket, PathBuf::new());
        assert_eq!(
            p.docker.podman_socket,
            PathBuf::from("/run/podman/podman.sock")
        );
        assert_eq!(p.docker.runtime, "runc");
        assert_eq!(p.docker.gvisor_runtime, "runsc");
        assert_eq!(p.docker.podman_runtime, "");
        let p = Policy::from_toml(
            "version = \"t\"\n[docker]\ndocker_socket = \"/srv/d.sock\"\npodman_runtime = \"crun\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(p.docker.docker_socket, PathBuf::from("/srv/d.sock"));
        assert_eq!(p.docker.podman_runtime, "crun");
        assert_eq!(p.docker.gvisor_runtime, "runsc");
    }
}
