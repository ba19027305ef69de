//! Golden manifests: what `airlock kube install` applies (`deploy/namespace/`) and an
//! example job Pod (`deploy/examples/job-pod.yaml`), rendered from the code. CI validates
//! them with `kubernetes-validate --strict` for the oldest supported version. Set
//! `AIRLOCK_BLESS=1` to rewrite them after an intended change.

use std::path::{Path, PathBuf};

use airlock_core::JobId;
use airlock_kube::KubeBackend;
use airlock_kube::install::{Identity, InstallPlan, objects};
use airlock_kube::yaml::to_yaml_stream;

use super::common::{pool_policy, with_inputs};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn golden(path: &Path, rendered: &str) {
    if std::env::var_os("AIRLOCK_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, rendered).unwrap();
        return;
    }
    let on_disk = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        on_disk == rendered,
        "{} differs from what the code renders; if the change is intended, rerun with AIRLOCK_BLESS=1 and review the diff\n--- rendered:\n{rendered}",
        path.display()
    );
}

const HEADER_NAMESPACE: &str = "# Rendered by airlock-kube (tests/suite/golden.rs) from the built-in policy: what\n# `airlock kube install` applies once per job namespace. Regenerate with AIRLOCK_BLESS=1.\n";
const HEADER_POD: &str = "# Rendered by airlock-kube (tests/suite/golden.rs): the Pod of one job (an input file,\n# stdin, arguments) on a gVisor node pool. Not applied by anything; validated in CI.\n";

#[test]
fn the_namespace_manifests_are_golden() {
    let plan = InstallPlan::from_policy(
        &airlock_core::Policy::builtin(),
        Identity::ServiceAccount("airlock-system".into(), "airlock".into()),
    );
    let text = format!(
        "{HEADER_NAMESPACE}{}",
        to_yaml_stream(&objects(&plan).unwrap())
    );
    golden(&deploy().join("namespace/airlock-jobs.yaml"), &text);
}

#[test]
fn the_example_job_pod_is_golden() {
    let policy = pool_policy();
    let mut job = with_inputs(&policy);
    job.id =
        serde_json::from_value::<JobId>("0197a3c2-5d1e-7c3b-9f00-0123456789ab".into()).unwrap();
    let pod = KubeBackend::new(&policy).manifest(&job).unwrap();
    let mut value = serde_json::to_value(&pod).unwrap();
    value["apiVersion"] = "v1".into();
    value["kind"] = "Pod".into();
    let text = format!("{HEADER_POD}{}", to_yaml_stream(&[value]));
    golden(&deploy().join("examples/job-pod.yaml"), &text);
}

#[test]
fn the_serve_policy_is_valid_and_accepted_by_the_backend() {
    let path = deploy().join("serve/policy.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let policy = airlock_core::Policy::from_toml(&text, &path.display().to_string()).unwrap();
    assert_eq!(policy.kube.namespace, "airlock-jobs");
    airlock_kube::backend::check_degraded(&policy.kube).unwrap();
    assert!(policy.kube.image_ref(&policy.filesystem.rootfs).is_some());
}
