//! Policies and jobs for the tests.

use airlock_core::policy::{KubeDegraded, KubeToleration};
use airlock_core::{InputFile, JobRequest, JobSpec, Policy};

pub const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// The built-in policy with an image and every weaker control accepted.
pub fn policy() -> Policy {
    let mut policy = Policy::builtin();
    policy.kube.image = format!("registry.example/airlock-python:3.11@{DIGEST}");
    policy.kube.allow_degraded = vec![
        KubeDegraded::TmpExec,
        KubeDegraded::Pids,
        KubeDegraded::NetworkPolicy,
        KubeDegraded::Seccomp,
        KubeDegraded::MergedLogs,
    ];
    policy
}

/// [`policy`] scheduled on a dedicated gVisor pool.
pub fn pool_policy() -> Policy {
    let mut policy = policy();
    policy.kube.runtime_class = "gvisor".into();
    policy
        .kube
        .node_selector
        .insert("airlock.dev/pool".into(), "jobs".into());
    policy.kube.tolerations.push(KubeToleration {
        key: "airlock.dev/jobs".into(),
        operator: "Equal".into(),
        value: "true".into(),
        effect: "NoSchedule".into(),
    });
    policy
}

pub fn python(policy: &Policy, source: &str) -> JobSpec {
    JobRequest {
        language: "python".into(),
        source: source.as_bytes().to_vec(),
        ..Default::default()
    }
    .resolve(policy)
    .unwrap()
}

pub fn with_inputs(policy: &Policy) -> JobSpec {
    JobRequest {
        language: "python".into(),
        source: b"print(open('/work/in/data.csv').read())".to_vec(),
        files: vec![
            InputFile {
                path: "in/data.csv".into(),
                content: b"a,b\n1,2\n".to_vec(),
                executable: false,
            },
            InputFile {
                path: "run.sh".into(),
                content: b"#!/bin/sh\necho it's \"$1\"\n".to_vec(),
                executable: true,
            },
        ],
        stdin: Some(b"from stdin\n".to_vec()),
        args: vec!["x".into(), "y z".into()],
        ..Default::default()
    }
    .resolve(policy)
    .unwrap()
}
