//! What a Pod gives only in a weaker form under a `[kube]` policy, and the refusal unless
//! the policy accepts each of them.

use airlock_core::policy::{KubeDegraded, KubeLogStreams, KubePolicy};

use crate::error::KubeError;

/// The controls a Pod gives only in a weaker form under `kube`, each with why.
pub fn weaker_controls(kube: &KubePolicy) -> Vec<(KubeDegraded, &'static str)> {
    let mut weaker = vec![
        (
            KubeDegraded::TmpExec,
            "/tmp is a size-limited emptyDir, which Kubernetes cannot mount noexec",
        ),
        (
            KubeDegraded::Pids,
            "a Pod has no pids limit of its own; the node's kubelet podPidsLimit applies",
        ),
        (
            KubeDegraded::NetworkPolicy,
            "the Pod has a network interface; egress is denied by the namespace's NetworkPolicy, enforced by the cluster's CNI",
        ),
    ];
    if kube.seccomp_profile == KubePolicy::SECCOMP_RUNTIME_DEFAULT {
        weaker.push((
            KubeDegraded::Seccomp,
            "the runtime's default seccomp filter applies, not airlock's",
        ));
    }
    if kube.log_streams == KubeLogStreams::Merged {
        weaker.push((
            KubeDegraded::MergedLogs,
            "the Pod log API interleaves stderr into stdout",
        ));
    }
    weaker
}

/// Refuses `kube` unless the policy accepts every weaker control; returns the observation's
/// `degraded` entries.
pub fn check_degraded(kube: &KubePolicy) -> Result<Vec<String>, KubeError> {
    let weaker = weaker_controls(kube);
    let missing: Vec<&(KubeDegraded, &str)> = weaker
        .iter()
        .filter(|(control, _)| !kube.allow_degraded.contains(control))
        .collect();
    if !missing.is_empty() {
        return Err(KubeError::DegradedNotAccepted {
            missing: missing
                .iter()
                .map(|(c, why)| format!("{} ({why})", c.as_str()))
                .collect::<Vec<_>>()
                .join("; "),
            accept: missing
                .iter()
                .map(|(c, _)| format!("{:?}", c.as_str()))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(weaker
        .iter()
        .map(|(c, why)| format!("{}: {why}", c.as_str()))
        .collect())
}
