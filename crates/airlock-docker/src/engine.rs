//! Which daemon socket a backend talks to. Docker's own clients honour `DOCKER_HOST`, so a
//! user who points the docker CLI at another daemon expects airlock to follow: an empty
//! `[docker] docker_socket` (the default) takes `DOCKER_HOST`, else the standard socket; a
//! path in the policy wins. Podman's socket is the policy's alone.

use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};

use airlock_core::policy::DockerPolicy;

use bollard::Docker;

use crate::Flavor;
use crate::error::DockerError;

/// The environment variable Docker's clients read for the daemon's address.
pub const DOCKER_HOST: &str = "DOCKER_HOST";

/// Client timeout, in seconds, of the connections the guard and the sweep open.
pub const CLIENT_TIMEOUT_SECS: u64 = 30;

/// A client for the socket (no request is made yet). API version 1.41 is the newest the
/// daemons of Debian 12 speak (Docker 20.10, Podman 4.3); [`crate::launch`] negotiates.
pub fn connect(socket: &Path) -> Result<Docker, bollard::errors::Error> {
    Docker::connect_with_unix(
        &socket.to_string_lossy(),
        CLIENT_TIMEOUT_SECS,
        bollard::API_DEFAULT_VERSION,
    )
}

/// Where a backend's socket path came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketSource {
    /// The policy's `[docker] docker_socket` or `podman_socket`.
    Policy,
    /// The caller's `DOCKER_HOST`.
    DockerHost,
    /// Neither: the standard socket.
    Default,
}

impl fmt::Display for SocketSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SocketSource::Policy => "from the policy",
            SocketSource::DockerHost => "from DOCKER_HOST",
            SocketSource::Default => "the default",
        })
    }
}

/// A backend's daemon socket and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineSocket {
    /// The unix socket.
    pub path: PathBuf,
    /// Where the path came from.
    pub source: SocketSource,
}

/// The socket of `flavor` under `policy`, with `DOCKER_HOST` from this process's
/// environment.
pub fn socket(policy: &DockerPolicy, flavor: Flavor) -> Result<EngineSocket, DockerError> {
    socket_with(policy, flavor, std::env::var_os(DOCKER_HOST).as_deref())
}

/// [`socket`] with `DOCKER_HOST`'s value given. An empty value counts as unset, as for the
/// docker CLI. Only `unix://` with an absolute path is accepted: the backends speak to a
/// local daemon over its unix socket (they mount host paths into containers and check the
/// daemon's host), so a TCP or SSH address is refused rather than passed over.
pub fn socket_with(
    policy: &DockerPolicy,
    flavor: Flavor,
    docker_host: Option<&OsStr>,
) -> Result<EngineSocket, DockerError> {
    if flavor == Flavor::Podman {
        return Ok(EngineSocket {
            path: policy.podman_socket.clone(),
            source: SocketSource::Policy,
        });
    }
    if !policy.docker_socket.as_os_str().is_empty() {
        return Ok(EngineSocket {
            path: policy.docker_socket.clone(),
            source: SocketSource::Policy,
        });
    }
    let Some(value) = docker_host.filter(|v| !v.is_empty()) else {
        return Ok(EngineSocket {
            path: PathBuf::from(DockerPolicy::DEFAULT_DOCKER_SOCKET),
            source: SocketSource::Default,
        });
    };
    let refuse = |reason: &'static str| DockerError::DockerHost {
        value: value.to_string_lossy().into_owned(),
        reason,
    };
    let text = value.to_str().ok_or_else(|| refuse("it is not UTF-8"))?;
    let path = match text.split_once("://") {
        Some(("unix", path)) => Path::new(path),
        Some(_) => {
            return Err(refuse(
                "airlock talks to a local daemon over its unix socket only",
            ));
        }
        None => return Err(refuse("it is not an address of the form unix:///path")),
    };
    if !path.is_absolute() {
        return Err(refuse("the socket path is not absolute"));
    }
    Ok(EngineSocket {
        path: path.to_path_buf(),
        source: SocketSource::DockerHost,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn policy(docker_socket: &str) -> DockerPolicy {
        DockerPolicy {
            docker_socket: PathBuf::from(docker_socket),
            ..DockerPolicy::default()
        }
    }

    fn resolved(docker_socket: &str, flavor: Flavor, host: Option<&str>) -> (String, SocketSource) {
        let s = socket_with(&policy(docker_socket), flavor, host.map(OsStr::new)).unwrap();
        (s.path.display().to_string(), s.source)
    }

    #[test]
    fn docker_host_names_the_socket_when_the_policy_leaves_it_empty() {
        for flavor in [Flavor::Docker, Flavor::Gvisor] {
            assert_eq!(
                resolved("", flavor, Some("unix:///run/airlock-ci/docker.sock")),
                (
                    "/run/airlock-ci/docker.sock".to_owned(),
                    SocketSource::DockerHost
                )
            );
            assert_eq!(
                resolved("", flavor, None),
                ("/var/run/docker.sock".to_owned(), SocketSource::Default)
            );
            // Empty counts as unset, as for the docker CLI.
            assert_eq!(
                resolved("", flavor, Some("")),
                ("/var/run/docker.sock".to_owned(), SocketSource::Default)
            );
        }
    }

    #[test]
    fn a_socket_in_the_policy_wins_over_docker_host() {
        assert_eq!(
            resolved("/srv/d.sock", Flavor::Docker, Some("unix:///other.sock")),
            ("/srv/d.sock".to_owned(), SocketSource::Policy)
        );
    }

    #[test]
    fn podman_takes_the_policy_socket_whatever_docker_host_says() {
        assert_eq!(
            resolved("", Flavor::Podman, Some("unix:///other.sock")),
            ("/run/podman/podman.sock".to_owned(), SocketSource::Policy)
        );
    }

    #[test]
    fn docker_host_that_is_no_local_unix_socket_is_refused() {
        for bad in [
            "tcp://127.0.0.1:2375",
            "ssh://user@host",
            "npipe:////./pipe/docker_engine",
            "unix://relative.sock",
            "/var/run/docker.sock",
        ] {
            let err =
                socket_with(&policy(""), Flavor::Docker, Some(OsStr::new(bad))).expect_err(bad);
            let text = err.to_string();
            assert!(
                text.contains(bad) && text.contains("docker_socket"),
                "{text}"
            );
            assert_eq!(err.kind(), airlock_core::ErrorKind::BackendUnavailable);
        }
    }
}
