//! airlock-docker: the Engine API backends. One implementation of [`airlock_core::Backend`]
//! talks to a container daemon over its unix socket with `bollard` and runs each job in a
//! fresh container of exactly the reference shape (DESIGN §5): Docker with runc
//! (`docker`), Podman's Docker-compatible service (`podman`), or Docker with gVisor's
//! `runsc` (`gvisor`). Images are used by digest only and checked before every job; output
//! is read as a bounded stream; wall time and the output flood are enforced here; every
//! container carries the label `airlock.managed=true` and is removed after its job, also
//! when the job's future is dropped. Warm containers ([`warm`]) are the same containers
//! created and started ahead of their jobs, kept in the pool every backend shares. It must
//! never pull an image, never touch a container without airlock's label, and never hand
//! the daemon's socket to a job.
#![forbid(unsafe_code)]

pub mod backend;
pub mod doctor;
pub mod engine;
pub mod error;
mod handoff;
pub mod host_checks;
pub mod image;
pub mod launch;
pub mod netns;
pub mod outdir;
pub mod provider;
pub mod seccomp;
pub mod spec;
pub mod supervise;
pub mod sweep;
pub mod tcp;
pub mod teardown;
pub mod warm;

use std::fmt;

use airlock_core::BackendKind;

pub use backend::{DockerBackend, DockerConfig};
pub use error::DockerError;
pub use provider::ContainerProvider;

/// Which daemon and runtime a backend uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flavor {
    /// The Docker daemon with runc (or the policy's `[docker] runtime`).
    Docker,
    /// Podman's Docker-compatible service.
    Podman,
    /// The Docker daemon with gVisor's runsc.
    Gvisor,
}

impl Flavor {
    /// The flavor of a backend kind; `None` for kinds this crate does not run.
    pub fn of(kind: BackendKind) -> Option<Self> {
        match kind {
            BackendKind::Docker => Some(Flavor::Docker),
            BackendKind::Podman => Some(Flavor::Podman),
            BackendKind::Gvisor => Some(Flavor::Gvisor),
            BackendKind::Native | BackendKind::Kube => None,
        }
    }

    /// The backend kind.
    pub const fn kind(self) -> BackendKind {
        match self {
            Flavor::Docker => BackendKind::Docker,
            Flavor::Podman => BackendKind::Podman,
            Flavor::Gvisor => BackendKind::Gvisor,
        }
    }

    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        self.kind().as_str()
    }
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
