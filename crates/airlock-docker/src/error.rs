//! The one error type of airlock-docker.

use std::path::PathBuf;

use airlock_core::{BackendError, ErrorKind};

/// Everything that can stop the Engine API backends from running a job. Variants name the
/// operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    /// The egress proxy could not be set up for a container (proxy mode).
    #[error("egress proxy for container {container}: {reason}")]
    Proxy {
        /// The container.
        container: String,
        /// What went wrong.
        reason: String,
    },
    /// The proxy's configuration is refused (a secret's value is missing on the host, an
    /// entry outside the policy's allowlist).
    #[error("egress proxy configuration: {0}")]
    ProxyConfig(String),
    /// `DOCKER_HOST` names the daemon (the policy's `docker_socket` is empty) but is no
    /// address airlock can use.
    #[error(
        "DOCKER_HOST={value:?}: {reason}; set DOCKER_HOST=unix:///path/to/docker.sock, or set [docker] docker_socket in the policy"
    )]
    DockerHost {
        /// The variable's value.
        value: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The daemon's socket does not exist or cannot be used.
    #[error("connect to the {backend} daemon at {socket}")]
    Connect {
        /// `docker`, `podman` or `gvisor`.
        backend: &'static str,
        /// The socket (the policy's, or `DOCKER_HOST`'s).
        socket: PathBuf,
        /// What the client said.
        source: bollard::errors::Error,
    },
    /// The daemon did not answer the version handshake.
    #[error("ask the {backend} daemon at {socket} for its version")]
    Version {
        /// The backend.
        backend: &'static str,
        /// The socket.
        socket: PathBuf,
        /// What the client said.
        source: bollard::errors::Error,
    },
    /// The daemon does not know the OCI runtime the policy names.
    #[error("the daemon has no runtime {runtime:?} (it has: {available}); {fix}")]
    RuntimeMissing {
        /// The runtime asked for.
        runtime: String,
        /// What the daemon has.
        available: String,
        /// How to register it.
        fix: &'static str,
    },
    /// Podman's service would run the job with another runtime than the policy names: its
    /// Docker-compatible API uses the service's default runtime whatever a request asks.
    #[error(
        "podman_runtime is {runtime:?} but the Podman service runs every container with its \
         default runtime {default:?} (its Docker-compatible API ignores the runtime a request \
         names); make {runtime:?} the service's default (containers.conf [engine] runtime) or \
         set podman_runtime = \"\" to accept the default"
    )]
    RuntimeNotHonoured {
        /// The runtime the policy names.
        runtime: String,
        /// The service's default runtime.
        default: String,
    },
    /// The job's rootfs is not an image pinned by digest.
    #[error(
        "the {backend} backend runs images only: set [filesystem] rootfs = \"image:REF@sha256:…\" (the policy has {rootfs})"
    )]
    NotAnImage {
        /// The backend.
        backend: &'static str,
        /// What the policy has.
        rootfs: String,
    },
    /// The image is not in the daemon's store (airlock never pulls).
    #[error(
        "image {reference} ({digest}) is not present in the {backend} daemon's store; load it first (docker load / docker import); airlock never pulls"
    )]
    ImageMissing {
        /// The backend.
        backend: &'static str,
        /// The reference.
        reference: String,
        /// The pinned digest.
        digest: String,
    },
    /// The local image is not the one the policy pins.
    #[error(
        "image {reference} is {found} in the {backend} daemon's store, but the policy pins {pinned}; refusing to run a different image"
    )]
    DigestMismatch {
        /// The backend.
        backend: &'static str,
        /// The reference.
        reference: String,
        /// The digest the policy pins.
        pinned: String,
        /// What the daemon has under that reference (id and repo digests).
        found: String,
    },
    /// A request to the daemon failed.
    #[error("{operation} container {container}")]
    Engine {
        /// The operation, e.g. `create`, `start`.
        operation: &'static str,
        /// The container name or id.
        container: String,
        /// What the daemon said.
        source: bollard::errors::Error,
    },
    /// Inspecting an image failed for a reason other than its absence.
    #[error("inspect image {reference}")]
    InspectImage {
        /// The reference.
        reference: String,
        /// What the daemon said.
        source: bollard::errors::Error,
    },
    /// Loading an image archive into the daemon failed.
    #[error("load the image archive into the {backend} daemon")]
    LoadImage {
        /// The backend.
        backend: &'static str,
        /// What the daemon said.
        source: bollard::errors::Error,
    },
    /// The daemon holds a loaded image under another id than the archive's: it would not be
    /// the image airlock built, so it is not pinned.
    #[error("{backend} has {tag} as {found}, not {expected}: refusing to pin it")]
    LoadedImageMismatch {
        /// The backend.
        backend: &'static str,
        /// The tag loaded.
        tag: String,
        /// The id the daemon reports.
        found: String,
        /// The archive's image id.
        expected: String,
    },
    /// Listing airlock's containers failed.
    #[error("list airlock's containers")]
    ListContainers(#[source] bollard::errors::Error),
    /// A feature the job asks for cannot be given by this backend here.
    #[error("{feature} is not available on the {backend} backend: {reason}")]
    FeatureUnavailable {
        /// The backend.
        backend: &'static str,
        /// The feature, e.g. `/out`.
        feature: &'static str,
        /// Why, and what to do instead.
        reason: String,
    },
    /// The job directory could not be made.
    #[error("prepare the job directory")]
    JobDir(#[source] airlock_host::HostError),
    /// Mounting the `/out` tmpfs on the host failed.
    #[error("mount the /out tmpfs at {path}")]
    MountOut {
        /// The mount point.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The container did not start within its deadline.
    #[error("container {container} did not {step} within {seconds} s")]
    Deadline {
        /// The container.
        container: String,
        /// What it was doing.
        step: &'static str,
        /// The deadline.
        seconds: u64,
    },
    /// The seccomp policy cannot be rendered as a container profile.
    #[error("render the seccomp profile")]
    Seccomp(#[source] airlock_seccomp::SeccompError),
    /// The seccomp profile file (for Podman) could not be written.
    #[error("write the seccomp profile {path}")]
    WriteProfile {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The empty file hiding device nodes could not be made in the job directory.
    #[error("create the empty file {path}")]
    EmptyFile {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// This host cannot hold a container's TCP socket buffers to its memory limit
    /// ([`crate::tcp`]); jobs are refused rather than run unbounded.
    #[error("the {backend} backend cannot bound TCP socket buffers here: {reason}")]
    TcpUnbounded {
        /// The backend.
        backend: &'static str,
        /// Why, and what to change.
        reason: String,
    },
    /// A container's memory cgroup with its TCP limit could not be created.
    #[error("create the memory cgroup {path} of container {container}")]
    TcpGroup {
        /// The container.
        container: String,
        /// The group's directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The container did not run in the memory cgroup airlock set its TCP limit on.
    #[error("container {container}: {reason}")]
    TcpGroupNotUsed {
        /// The container.
        container: String,
        /// Which group it runs in instead.
        reason: String,
    },
    /// A warm pool cannot be kept for this backend with this policy or on this host.
    #[error("keep warm containers for the {backend} backend: {reason}")]
    WarmPool {
        /// The backend.
        backend: &'static str,
        /// Why, and what to change.
        reason: String,
    },
    /// A warm container stopped before it could wait for a job.
    #[error("warm container {container} {reason}")]
    WarmStart {
        /// The container.
        container: String,
        /// What happened to it.
        reason: &'static str,
    },
    /// The host's ends of a warm container job's output pipes could not be read.
    #[error("read the output pipes of warm container {container}")]
    OutputPipes {
        /// The container.
        container: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A warm container did not take its job's output pipes.
    #[error("hand warm container {container} its output pipes: {reason}")]
    OutputHandoff {
        /// The container.
        container: String,
        /// Why.
        reason: String,
    },
    /// A task of the backend failed.
    #[error("{0}")]
    Task(String),
}

impl DockerError {
    /// The public class of this error (DESIGN §2).
    pub fn kind(&self) -> ErrorKind {
        match self {
            DockerError::Connect { .. }
            | DockerError::DockerHost { .. }
            | DockerError::Version { .. }
            | DockerError::RuntimeMissing { .. }
            | DockerError::RuntimeNotHonoured { .. }
            | DockerError::ImageMissing { .. }
            | DockerError::TcpUnbounded { .. }
            | DockerError::ProxyConfig(_)
            | DockerError::WarmPool { .. } => ErrorKind::BackendUnavailable,
            DockerError::NotAnImage { .. }
            | DockerError::DigestMismatch { .. }
            | DockerError::FeatureUnavailable { .. } => ErrorKind::PolicyDenied,
            DockerError::Engine { .. }
            | DockerError::InspectImage { .. }
            | DockerError::LoadImage { .. }
            | DockerError::LoadedImageMismatch { .. }
            | DockerError::ListContainers(_)
            | DockerError::JobDir(_)
            | DockerError::MountOut { .. }
            | DockerError::Deadline { .. }
            | DockerError::Seccomp(_)
            | DockerError::WriteProfile { .. }
            | DockerError::EmptyFile { .. }
            | DockerError::Task(_)
            | DockerError::TcpGroup { .. }
            | DockerError::TcpGroupNotUsed { .. }
            | DockerError::WarmStart { .. }
            | DockerError::OutputPipes { .. }
            | DockerError::OutputHandoff { .. }
            | DockerError::Proxy { .. } => ErrorKind::Internal,
        }
    }
}

impl From<DockerError> for BackendError {
    fn from(err: DockerError) -> Self {
        let kind = err.kind();
        BackendError::new(kind, airlock_core::error::chain(&err))
    }
}
