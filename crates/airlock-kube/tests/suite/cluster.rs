//! The real-cluster suite: the same jobs on a real Kubernetes cluster (kind or k3s with
//! gVisor and a NetworkPolicy-enforcing CNI; docs/kube.md says how to make one). Run when
//! `KUBECONFIG` is set (scripts/ci/kube.sh does), after `airlock kube install`:
//!
//! ```sh
//! KUBECONFIG=~/.kube/config AIRLOCK_KUBE_IMAGE=python:3.12-slim@sha256:… \
//!   cargo nextest run -p airlock-kube --run-ignored only -E 'test(/::cluster::/)'
//! ```
//!
//! Optional: `AIRLOCK_KUBE_NAMESPACE` (default airlock-jobs), `AIRLOCK_KUBE_RUNTIME_CLASS`
//! (e.g. gvisor), `AIRLOCK_KUBE_LOG_STREAMS` (merged or split). Without a cluster the tests
//! are skipped with the reason, and fail under `AIRLOCK_REQUIRE_ALL=1`.

use std::time::Duration;

use airlock_core::doctor::Status;
use airlock_core::policy::KubeLogStreams;
use airlock_core::{JobRequest, LimitsRequest, Outcome, Policy, RunReport, Termination};
use airlock_kube::KubeBackend;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use pretty_assertions::assert_eq;

use super::common::policy;

fn missing() -> Option<String> {
    if std::env::var_os("KUBECONFIG").is_none_or(|v| v.is_empty()) {
        return Some("KUBECONFIG is not set: no cluster to run on (docs/kube.md)".into());
    }
    if std::env::var("AIRLOCK_KUBE_IMAGE").map_or(true, |v| !v.contains("@sha256:")) {
        return Some(
            "AIRLOCK_KUBE_IMAGE is not REF@sha256:… of an image with python3 the cluster can pull"
                .into(),
        );
    }
    None
}

fn cluster_policy() -> Policy {
    let mut policy = policy();
    policy.kube.image = std::env::var("AIRLOCK_KUBE_IMAGE").unwrap_or_default();
    if let Ok(ns) = std::env::var("AIRLOCK_KUBE_NAMESPACE") {
        policy.kube.namespace = ns;
    }
    policy.kube.runtime_class = std::env::var("AIRLOCK_KUBE_RUNTIME_CLASS").unwrap_or_default();
    if std::env::var("AIRLOCK_KUBE_LOG_STREAMS").as_deref() == Ok("split") {
        policy.kube.log_streams = KubeLogStreams::Split;
    }
    policy.kube.start_timeout = Duration::from_secs(180);
    policy
}

macro_rules! need_cluster {
    () => {
        let missing = missing();
        airlock_testkit::require!(missing.is_none(), missing.unwrap_or_default());
    };
}

async fn run(policy: &Policy, request: JobRequest) -> RunReport {
    let job = request.resolve(policy).unwrap();
    let report = KubeBackend::new(policy).run_job(&job, None).await.unwrap();
    // Nothing of the job is left in the namespace.
    let client = airlock_kube::backend::connect(&policy.kube).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, &policy.kube.namespace);
    let left = pods
        .list(&ListParams::default().labels(&format!("airlock.job={}", job.id)))
        .await
        .unwrap();
    assert!(left.items.is_empty(), "pod of job {} left behind", job.id);
    report
}

fn python(code: &str) -> JobRequest {
    JobRequest {
        language: "python".into(),
        source: code.as_bytes().to_vec(),
        ..Default::default()
    }
}

fn stdout(report: &RunReport) -> String {
    report.stdout.render_redacted(&|t| (t, 0)).text
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a real cluster (KUBECONFIG): run by scripts/ci/kube.sh when one is configured"]
async fn cluster_doctor_finds_the_namespace_prepared() {
    need_cluster!();
    let policy = cluster_policy();
    let client = airlock_kube::backend::connect(&policy.kube).await.unwrap();
    let checks = airlock_kube::doctor::doctor(&policy, &client).await;
    let missing: Vec<String> = checks
        .iter()
        .filter(|c| c.status == Status::Missing)
        .map(|c| format!("{}: {}", c.control, c.detail))
        .collect();
    assert_eq!(
        missing,
        Vec::<String>::new(),
        "run `airlock kube install` first"
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a real cluster (KUBECONFIG): run by scripts/ci/kube.sh when one is configured"]
async fn cluster_hello_job_and_exit_code() {
    need_cluster!();
    let policy = cluster_policy();
    let report = run(&policy, python("print(sum(range(10)))")).await;
    assert_eq!(report.termination, Termination::Exited(0), "{report:?}");
    assert_eq!(stdout(&report), "45\n");
    let report = run(&policy, python("import sys; sys.exit(3)")).await;
    assert_eq!(report.termination, Termination::Exited(3));
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a real cluster (KUBECONFIG): run by scripts/ci/kube.sh when one is configured"]
async fn cluster_pod_shape_holds_inside() {
    need_cluster!();
    let policy = cluster_policy();
    let code = "import os\n\
                s = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n\
                print(os.getuid(), os.getgid(), s.get('CapEff', 'gvisor').strip(), s.get('NoNewPrivs', '1').strip())\n\
                try:\n    open('/x', 'w'); print('root-writable')\nexcept OSError:\n    print('root-read-only')\n\
                print(sorted(k for k in os.environ if k.startswith('KUBERNETES')))\n\
                print(os.path.exists('/var/run/secrets/kubernetes.io/serviceaccount/token'))";
    let report = run(&policy, python(code)).await;
    let out = stdout(&report);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0] == "65534 65534 0000000000000000 1" || lines[0] == "65534 65534 gvisor 1",
        "{out}"
    );
    assert_eq!(&lines[1..], ["root-read-only", "[]", "False"], "{out}");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a real cluster (KUBECONFIG): run by scripts/ci/kube.sh when one is configured"]
async fn cluster_network_is_denied() {
    need_cluster!();
    let policy = cluster_policy();
    // The API server's service address, a public address, and DNS: all unreachable.
    let code = "import os, socket\n\
                host = os.environ.get('KUBERNETES_SERVICE_HOST', '10.96.0.1')\n\
                for addr in [('10.96.0.1', 443), ('1.1.1.1', 443), ('8.8.8.8', 53)]:\n\
                \x20   s = socket.socket(); s.settimeout(3)\n\
                \x20   try:\n        s.connect(addr); print('reached', addr)\n\
                \x20   except OSError:\n        print('blocked')\n\
                try:\n    socket.getaddrinfo('kubernetes.default.svc', 443); print('resolved')\nexcept OSError:\n    print('no dns')";
    let mut request = python(code);
    request.limits = LimitsRequest {
        timeout: Some(Duration::from_secs(5)),
        ..Default::default()
    };
    let report = run(&policy, request).await;
    assert_eq!(
        stdout(&report),
        "blocked\nblocked\nblocked\nno dns\n",
        "{report:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a real cluster (KUBECONFIG): run by scripts/ci/kube.sh when one is configured"]
async fn cluster_limits_end_jobs_as_timeout_and_oom() {
    need_cluster!();
    let policy = cluster_policy();
    let mut request = python("while True: pass");
    request.limits = LimitsRequest {
        timeout: Some(Duration::from_secs(2)),
        ..Default::default()
    };
    assert_eq!(run(&policy, request).await.outcome(), Outcome::Timeout);
    let report = run(&policy, python("b = bytearray(1 << 30)")).await;
    assert_eq!(report.outcome(), Outcome::Oom, "{report:?}");
}
