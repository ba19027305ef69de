//! `[docker]`: the Engine API backends' daemon sockets and OCI runtimes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::LanguageSpec;
use crate::units::duration_serde;

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
    /// Containers `airlock serve` and `airlock mcp` keep created and started ahead of time
    /// for `warm_language` jobs of `--backend docker`, each of a cold job's shape and used
    /// for one job only. 0 (the default) creates every container on demand.
    pub warm_pool: u32,
    /// The same for `--backend gvisor`.
    pub gvisor_warm_pool: u32,
    /// The same for `--backend podman`.
    pub podman_warm_pool: u32,
    /// The language warm containers are started for; its interpreter must be Python.
    pub warm_language: String,
    /// How long a warm container may wait for its job; older ones are removed and replaced.
    #[serde(with = "duration_serde")]
    pub warm_idle: Duration,
}

impl DockerPolicy {
    /// Longest runtime name.
    pub const RUNTIME_NAME_MAX_BYTES: usize = 64;
    /// The Docker daemon's socket when `docker_socket` is empty and `DOCKER_HOST` unset.
    pub const DEFAULT_DOCKER_SOCKET: &'static str = "/var/run/docker.sock";

    /// The warm pool size of a container backend (0 for the others).
    pub fn warm_pool_of(&self, backend: crate::BackendKind) -> u32 {
        match backend {
            crate::BackendKind::Docker => self.warm_pool,
            crate::BackendKind::Gvisor => self.gvisor_warm_pool,
            crate::BackendKind::Podman => self.podman_warm_pool,
            crate::BackendKind::Native | crate::BackendKind::Kube => 0,
        }
    }

    pub(super) fn check(
        &self,
        languages: &BTreeMap<String, LanguageSpec>,
    ) -> Result<(), (&'static str, String)> {
        super::warm::check_warm(
            &[
                ("warm_pool", self.warm_pool),
                ("gvisor_warm_pool", self.gvisor_warm_pool),
                ("podman_warm_pool", self.podman_warm_pool),
            ],
            self.warm_idle,
            &self.warm_language,
            languages,
        )?;
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
            warm_pool: 0,
            gvisor_warm_pool: 0,
            podman_warm_pool: 0,
            warm_language: "python".to_owned(),
            warm_idle: Duration::from_secs(600),
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

    #[test]
    fn warm_pools_are_per_backend_and_off_by_default() {
        use crate::BackendKind;
        let p = Policy::builtin();
        for kind in [
            BackendKind::Docker,
            BackendKind::Gvisor,
            BackendKind::Podman,
        ] {
            assert_eq!(p.docker.warm_pool_of(kind), 0);
        }
        let p = Policy::from_toml(
            "version = \"t\"\n[docker]\nwarm_pool = 2\ngvisor_warm_pool = 3\nwarm_idle = \"1m\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(p.docker.warm_pool_of(BackendKind::Docker), 2);
        assert_eq!(p.docker.warm_pool_of(BackendKind::Gvisor), 3);
        assert_eq!(p.docker.warm_pool_of(BackendKind::Podman), 0);
        assert_eq!(p.docker.warm_idle, Duration::from_secs(60));
        for bad in [
            "podman_warm_pool = 65",
            "warm_idle = \"0s\"",
            "warm_pool = 1\nwarm_language = \"sh\"",
        ] {
            let text = format!("version = \"t\"\n[docker]\n{bad}\n");
            assert!(Policy::from_toml(&text, "t").is_err(), "{bad}");
        }
    }
}
