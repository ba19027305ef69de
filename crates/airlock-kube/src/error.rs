//! The one error type of airlock-kube.

use airlock_core::{BackendError, ErrorKind};

/// Everything that can stop the Kubernetes backend from running a job. Variants name the
/// operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The kubeconfig (or the in-cluster configuration) could not be read.
    #[error("load the Kubernetes client configuration{}", origin_suffix(.origin))]
    LoadConfig {
        /// The kubeconfig file, or empty for the inferred one.
        origin: String,
        /// What kube-rs said.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The client could not be built from the configuration.
    #[error("build the Kubernetes client")]
    BuildClient(#[source] kube::Error),
    /// The job's rootfs is not an image pinned by digest.
    #[error(
        "the kube backend runs images only: set [kube] image or [filesystem] rootfs to REF@sha256:… (the policy has {rootfs})"
    )]
    NotAnImage {
        /// What the policy has.
        rootfs: String,
    },
    /// A control the Pod can give only in a weaker form, which the policy does not accept.
    #[error(
        "the kube backend would run this job with weaker controls than DESIGN §1: {missing}; accept them explicitly with [kube] allow_degraded = [{accept}] or use another backend"
    )]
    DegradedNotAccepted {
        /// What is weaker, and why.
        missing: String,
        /// The names to list in `allow_degraded`.
        accept: String,
    },
    /// A feature the job asks for that this backend does not give.
    #[error("{feature} is not available on the kube backend: {reason}")]
    FeatureUnavailable {
        /// The feature.
        feature: &'static str,
        /// Why, and what to do instead.
        reason: String,
    },
    /// The job's input cannot be delivered in a Pod.
    #[error("{field}: {reason}")]
    Input {
        /// The request field.
        field: String,
        /// Why.
        reason: String,
    },
    /// The generated Pod breaks the Pod Security `restricted` profile (a bug: fail closed).
    #[error("the generated Pod breaks the Pod Security restricted profile: {0}")]
    Restricted(String),
    /// A request to the API server failed.
    #[error("{operation} {object}")]
    Api {
        /// The operation, e.g. `create`, `watch`, `read the log of`, `delete`.
        operation: &'static str,
        /// The object, e.g. `pod airlock-jobs/airlock-…`.
        object: String,
        /// What the client said.
        source: kube::Error,
    },
    /// The Pod did not start within the policy's `start_timeout`.
    #[error("pod {pod} did not start within {seconds} s: {last_state}")]
    StartTimeout {
        /// The Pod.
        pod: String,
        /// The deadline.
        seconds: u64,
        /// The last state seen (waiting reason, scheduling condition).
        last_state: String,
    },
    /// The container could not start (image pull, config or runtime error).
    #[error("pod {pod} cannot start its container: {reason}: {message}")]
    StartFailed {
        /// The Pod.
        pod: String,
        /// The waiting or terminated reason, e.g. `ErrImagePull`.
        reason: String,
        /// The kubelet's message.
        message: String,
    },
    /// The Pod was deleted by someone other than this job (another airlock's janitor, an
    /// operator, an eviction).
    #[error("pod {pod} disappeared before its job ended")]
    Vanished {
        /// The Pod.
        pod: String,
    },
    /// The cluster ignored the log API's `stream` parameter (split mode needs the
    /// `PodLogsQuerySplitStreams` feature gate).
    #[error(
        "the API server mixed stderr into the stdout log stream: enable the PodLogsQuerySplitStreams feature gate or set [kube] log_streams = \"merged\""
    )]
    SplitStreamsUnsupported,
    /// The Pod was not deleted after its job (it is left to the janitor).
    #[error("pod {pod} was not removed within {seconds} s")]
    DeleteTimeout {
        /// The Pod.
        pod: String,
        /// How long airlock waited.
        seconds: u64,
    },
    /// A task of the backend failed.
    #[error("{0}")]
    Task(String),
}

fn origin_suffix(origin: &str) -> String {
    if origin.is_empty() {
        String::new()
    } else {
        format!(" from {origin}")
    }
}

/// The HTTP status of an API error, if the server answered with one.
pub fn status_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

impl KubeError {
    /// The public class of this error (DESIGN §2).
    pub fn kind(&self) -> ErrorKind {
        match self {
            KubeError::LoadConfig { .. }
            | KubeError::BuildClient(_)
            | KubeError::StartTimeout { .. }
            | KubeError::SplitStreamsUnsupported => ErrorKind::BackendUnavailable,
            KubeError::NotAnImage { .. }
            | KubeError::DegradedNotAccepted { .. }
            | KubeError::FeatureUnavailable { .. } => ErrorKind::PolicyDenied,
            KubeError::Input { .. } => ErrorKind::InvalidInput,
            KubeError::Api { source, .. } => match status_code(source) {
                // Forbidden (RBAC, Pod Security admission, quota), missing namespace,
                // throttled after every retry, or no answer at all: the cluster cannot run
                // jobs for airlock right now.
                Some(401 | 403 | 404 | 429 | 503) | None => ErrorKind::BackendUnavailable,
                Some(_) => ErrorKind::Internal,
            },
            KubeError::Restricted(_)
            | KubeError::StartFailed { .. }
            | KubeError::Vanished { .. }
            | KubeError::DeleteTimeout { .. }
            | KubeError::Task(_) => ErrorKind::Internal,
        }
    }
}

impl From<KubeError> for BackendError {
    fn from(err: KubeError) -> Self {
        let kind = err.kind();
        BackendError::new(kind, airlock_core::error::chain_without_repeats(&err))
    }
}
