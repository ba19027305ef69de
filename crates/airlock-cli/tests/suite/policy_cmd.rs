//! `airlock policy check`, `airlock policy show` and `airlock doctor`.

use pretty_assertions::assert_eq;

use super::common::TestEnv;
use crate::require_native;

#[test]
fn policy_check_accepts_the_shipped_default() {
    let env = TestEnv::new();
    let default = concat!(env!("CARGO_MANIFEST_DIR"), "/../../policy/default.toml");
    let out = env
        .cmd()
        .args(["policy", "check", default])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("version default-1"));
}

#[test]
fn policy_check_names_the_unknown_key() {
    let env = TestEnv::new();
    let bad = env.policy("[network]\nmode = \"none\"\nallowlist = []");
    let out = env
        .cmd()
        .args(["policy", "check"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("allowlist"));
}

#[test]
fn policy_show_prints_a_policy_that_checks() {
    let env = TestEnv::new();
    let out = env.cmd().args(["policy", "show"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let shown = env.path().join("shown.toml");
    std::fs::write(&shown, &out.stdout).unwrap();
    let out = env
        .cmd()
        .args(["policy", "check"])
        .arg(&shown)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn doctor_reports_every_control_and_is_ready_here() {
    require_native!();
    let env = TestEnv::new();
    let out = env.cmd().args(["doctor", "--json"]).output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ready"], true, "{report:#}");
    assert_eq!(out.status.code(), Some(0));
    let controls: Vec<&str> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["control"].as_str().unwrap())
        .collect();
    for needed in [
        "namespaces",
        "user namespaces",
        "seccomp",
        "uid mapping",
        "cgroup parent",
        "sandbox end to end",
    ] {
        assert!(
            controls.contains(&needed),
            "{needed} missing from {controls:?}"
        );
    }
    assert!(controls.iter().any(|c| c.ends_with("memory")));
    assert!(controls.iter().any(|c| c.ends_with("pids")));
}

#[test]
fn doctor_fails_when_a_policy_cannot_be_honoured() {
    let env = TestEnv::new();
    let policy = env.policy("[filesystem]\nrootfs = \"dir:/nonexistent-airlock-rootfs\"");
    let out = env
        .cmd()
        .args(["doctor", "--policy"])
        .arg(&policy)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("MISSING"));
}

/// The Docker socket of `airlock doctor --backend docker` under `DOCKER_HOST`: the `docker:
/// socket` check's detail.
fn docker_socket_check(
    env: &TestEnv,
    docker_host: &str,
    policy: Option<&std::path::Path>,
) -> String {
    let mut cmd = env.cmd();
    cmd.args(["doctor", "--json", "--backend", "docker"])
        .env("DOCKER_HOST", docker_host);
    if let Some(policy) = policy {
        cmd.arg("--policy").arg(policy);
    }
    let out = cmd.output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["control"] == "docker: socket")
        .unwrap_or_else(|| panic!("no docker: socket check in {report:#}"));
    assert_eq!(check["status"], "missing", "{check:#}");
    check["detail"].as_str().unwrap().to_owned()
}

#[test]
fn doctor_takes_the_docker_socket_from_docker_host_and_says_so() {
    let env = TestEnv::new();
    let socket = env.path().join("no-daemon.sock");
    let detail = docker_socket_check(&env, &format!("unix://{}", socket.display()), None);
    assert_eq!(
        detail,
        format!("{} (from DOCKER_HOST) does not exist", socket.display())
    );
    // A socket the policy names wins over DOCKER_HOST.
    let pinned = env.path().join("pinned.sock");
    let policy = env.policy(&format!(
        "[docker]\ndocker_socket = {:?}",
        pinned.display().to_string()
    ));
    let detail = docker_socket_check(&env, &format!("unix://{}", socket.display()), Some(&policy));
    assert_eq!(
        detail,
        format!("{} (from the policy) does not exist", pinned.display())
    );
    // An address that is no local unix socket is refused by name, not passed over.
    let detail = docker_socket_check(&env, "tcp://127.0.0.1:2375", None);
    assert!(
        detail.contains("DOCKER_HOST=\"tcp://127.0.0.1:2375\"") && detail.contains("unix socket"),
        "{detail}"
    );
}
