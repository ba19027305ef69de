//! What a Pod's status says about its job, as pure data: waiting, running, or ended and
//! how. Built from the Pod objects the watch delivers.

use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};

use crate::pod::CONTAINER;

/// The Pod reason the kubelet sets when `activeDeadlineSeconds` ran out.
pub const REASON_DEADLINE: &str = "DeadlineExceeded";
/// The container reason when the kernel's OOM killer ended it.
pub const REASON_OOM: &str = "OOMKilled";
/// The Pod reason when the kubelet evicted it (ephemeral storage, node pressure).
pub const REASON_EVICTED: &str = "Evicted";
/// Exit codes above this (up to 128 + 64) mean "killed by signal (code - 128)": the
/// container status reports only an exit code, and runtimes report a signal death as
/// 128 + N.
pub const SIGNAL_EXIT_BASE: i32 = 128;
/// The highest signal number.
pub const SIGNAL_MAX: i32 = 64;
/// Waiting reasons after which the container will not start by itself.
pub const FATAL_WAITING_REASONS: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];
/// Terminated reasons that mean the program never ran.
pub const START_FAILED_REASONS: &[&str] = &["StartError", "ContainerCannotRun"];

/// How the job's container ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The exit code, if the container reported one.
    pub exit_code: Option<i32>,
    /// The signal, if the runtime reported one.
    pub signal: Option<i32>,
    /// The kernel's OOM killer ended it.
    pub oom: bool,
    /// The kubelet ended it at `activeDeadlineSeconds`.
    pub deadline: bool,
    /// The kubelet evicted the Pod.
    pub evicted: bool,
}

/// What the Pod says now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodState {
    /// Not started yet; the reason, when there is one (`ContainerCreating`, `Unschedulable:
    /// 0/3 nodes are available…`).
    Waiting(String),
    /// The program is running.
    Running,
    /// The container ended.
    Ended(Ended),
    /// The container cannot start: reason and message.
    Failed {
        /// The reason, e.g. `ErrImagePull`.
        reason: String,
        /// The kubelet's message.
        message: String,
    },
}

fn ended_from(terminated: &ContainerStateTerminated, pod_reason: Option<&str>) -> Ended {
    Ended {
        exit_code: Some(terminated.exit_code),
        signal: terminated.signal.filter(|s| *s > 0),
        oom: terminated.reason.as_deref() == Some(REASON_OOM),
        deadline: pod_reason == Some(REASON_DEADLINE),
        evicted: pod_reason == Some(REASON_EVICTED),
    }
}

/// Reads the job's state off a Pod.
pub fn pod_state(pod: &Pod) -> PodState {
    let Some(status) = &pod.status else {
        return PodState::Waiting(String::new());
    };
    let pod_reason = status.reason.as_deref();
    let container = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == CONTAINER);
    let state = container.and_then(|c| c.state.as_ref());
    if let Some(terminated) = state.and_then(|s| s.terminated.as_ref()) {
        if let Some(reason) = terminated.reason.as_deref()
            && START_FAILED_REASONS.contains(&reason)
        {
            return PodState::Failed {
                reason: reason.to_owned(),
                message: terminated.message.clone().unwrap_or_default(),
            };
        }
        return PodState::Ended(ended_from(terminated, pod_reason));
    }
    let phase = status.phase.as_deref().unwrap_or("Pending");
    if matches!(phase, "Failed" | "Succeeded") {
        // Ended without a container status: the deadline or an eviction hit before the
        // container ran or before the kubelet recorded how it ended.
        return PodState::Ended(Ended {
            exit_code: None,
            signal: None,
            oom: false,
            deadline: pod_reason == Some(REASON_DEADLINE),
            evicted: pod_reason == Some(REASON_EVICTED),
        });
    }
    if state.and_then(|s| s.running.as_ref()).is_some() {
        return PodState::Running;
    }
    if let Some(waiting) = state.and_then(|s| s.waiting.as_ref()) {
        let reason = waiting.reason.clone().unwrap_or_default();
        if FATAL_WAITING_REASONS.contains(&reason.as_str()) {
            return PodState::Failed {
                reason,
                message: waiting.message.clone().unwrap_or_default(),
            };
        }
        return PodState::Waiting(reason);
    }
    // Not scheduled yet: the scheduler says why on the PodScheduled condition.
    let unscheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    PodState::Waiting(unscheduled.map_or_else(String::new, |c| {
        format!(
            "{}: {}",
            c.reason.clone().unwrap_or_default(),
            c.message.clone().unwrap_or_default()
        )
    }))
}

/// The exit code and signal airlock reports: a code in 129..=192 is "killed by signal
/// code − 128", as on the Docker backend.
pub fn termination(ended: &Ended) -> airlock_core::Termination {
    use airlock_core::Termination;
    if let Some(signal) = ended.signal {
        return Termination::Signaled(signal);
    }
    match ended.exit_code {
        Some(code) if code > SIGNAL_EXIT_BASE && code <= SIGNAL_EXIT_BASE + SIGNAL_MAX => {
            Termination::Signaled(code - SIGNAL_EXIT_BASE)
        }
        Some(code) => Termination::Exited(code),
        None => Termination::Unknown,
    }
}
