//! `airlock doctor --backend B` on each backend the host runs: ready, with the controls it
//! checked, and a policy the backend cannot honour reported as missing with its fix.

use pretty_assertions::assert_eq;
use serde_json::Value;

use super::common::{Kind, Target};

/// `airlock doctor --backend B --json --policy POLICY`: the report and the exit code.
fn doctor(t: &Target, policy: &std::path::Path) -> (Value, i32) {
    let out = t
        .cmd()
        .args([
            "doctor",
            "--json",
            "--backend",
            t.kind.backend(),
            "--policy",
        ])
        .arg(policy)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let report: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("doctor --json printed no JSON ({e}): {text}"));
    (report, out.status.code().unwrap_or(-1))
}

/// The check whose control starts with `prefix`.
fn check<'a>(report: &'a Value, prefix: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["control"].as_str().unwrap().starts_with(prefix))
        .unwrap_or_else(|| panic!("no check {prefix:?} in {report:#}"))
}

conformance_on! {
    [native: Native, docker: Docker, gvisor: Gvisor, podman: Podman]
    fn doctor_reports_the_backend_ready(t: &Target) {
        let (report, code) = doctor(t, &t.policy());
        assert_eq!(report["ready"], true, "{report:#}");
        assert_eq!(code, 0, "{report:#}");
        assert_eq!(report["backend"], t.kind.backend());
        let statuses: Vec<&str> = report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["status"].as_str().unwrap())
            .collect();
        assert!(!statuses.contains(&"missing"), "{report:#}");
        // It ends with a real job on the backend.
        assert_eq!(check(&report, "sandbox end to end")["status"], "ok", "{report:#}");
        if t.kind.is_container() {
            let prefix = t.kind.backend();
            assert_eq!(check(&report, &format!("{prefix}: daemon"))["status"], "ok");
            let image = check(&report, &format!("{prefix}: image"));
            assert_eq!(image["status"], "ok", "{report:#}");
            let digest = std::env::var("AIRLOCK_TEST_IMAGE").unwrap();
            let digest = digest.rsplit('@').next().unwrap();
            assert!(image["detail"].as_str().unwrap().contains(digest), "{image:#}");
        }
        if t.kind.base() == Kind::Gvisor {
            let runtime = check(&report, "gvisor: runtime runsc");
            assert!(runtime["detail"].as_str().unwrap().contains("--oci-seccomp"), "{runtime:#}");
        }
    }
}

/// Runtimes a backend must refuse rather than run a job with a weaker shape.
mod runtime {
    use pretty_assertions::assert_eq;

    use super::super::common::Target;
    use super::{check, doctor};

    conformance_on! {
        [gvisor: Gvisor]
        fn gvisor_without_its_seccomp_flag_is_refused(t: &Target) {
            // airlock-broken-runsc has --oci-seccomp; plain airlock-broken does not: a runtime
            // that would run jobs without a seccomp filter is missing, never accepted.
            let policy = t.policy_with("", "", "gvisor_runtime = \"airlock-broken\"");
            let (report, code) = doctor(t, &policy);
            assert_eq!(report["ready"], false, "{report:#}");
            assert_eq!(code, 1, "{report:#}");
            let runtime = check(&report, "gvisor: runtime airlock-broken");
            assert_eq!(runtime["status"], "missing", "{runtime:#}");
            let run = t.run_with(&policy, &["-c", "print('never')"]);
            assert_eq!(run.obs["error"]["kind"], "backend_unavailable", "{:#}", run.obs);
            assert!(run.obs["error"]["message"].as_str().unwrap().contains("--oci-seccomp"));
        }
    }

    conformance_on! {
        [podman: Podman]
        fn a_podman_runtime_other_than_the_services_default_is_refused(t: &Target) {
            // Podman's Docker-compatible API runs every container with the service's default
            // runtime (runc here) and ignores the one a request names: asking for runsc would
            // silently run runc, so airlock refuses and doctor says so.
            let policy = t.policy_with("", "", "podman_runtime = \"runsc\"");
            let (report, code) = doctor(t, &policy);
            assert_eq!(report["ready"], false, "{report:#}");
            assert_eq!(code, 1, "{report:#}");
            let runtime = check(&report, "podman: runtime runsc");
            assert_eq!(runtime["status"], "missing", "{runtime:#}");
            let run = t.run_with(&policy, &["-c", "print('never')"]);
            assert_eq!(run.obs["outcome"], "error", "{:#}", run.obs);
            assert_eq!(run.obs["error"]["kind"], "backend_unavailable", "{:#}", run.obs);
            let message = run.obs["error"]["message"].as_str().unwrap();
            assert!(message.contains("ignores the runtime a request names"), "{message}");
            assert_eq!(run.obs["stdout"], "");
        }
    }
}
