//! airlock run by an unprivileged user (issue 3). `scripts/test.sh` runs these tests as a
//! user it creates; run as root they report a skip.

use pretty_assertions::assert_eq;

use super::common::{TestEnv, host_pids_with, marker};

const DEGRADED_POLICY: &str = "[native]\nallow_degraded = [\"cgroup\"]";

macro_rules! require_unprivileged {
    () => {
        airlock_testkit::require!(
            !airlock_testkit::require::is_root(),
            "runs as an unprivileged user (scripts/test.sh runs it with runuser)"
        );
    };
}

/// Whether this user may create cgroups under its own cgroup (a delegated v2 subtree).
fn has_delegated_cgroup() -> bool {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let Some(path) = own.lines().find_map(|l| l.strip_prefix("0::")) else {
        return false;
    };
    let dir = std::path::Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    rustix::fs::access(&dir, rustix::fs::Access::WRITE_OK).is_ok()
        && std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.contains("memory"))
}

#[test]
fn rootless_without_a_cgroup_is_refused_with_the_reason_and_the_fix() {
    require_unprivileged!();
    airlock_testkit::require!(
        !has_delegated_cgroup(),
        "this user has a delegated cgroup; the refusal needs a host without one"
    );
    let env = TestEnv::new();
    let run = env.run_json(&["-c", "print(sum(range(10)))"]);
    super::common::assert_error(&run, "backend_unavailable");
    let message = run.obs["error"]["message"].as_str().unwrap();
    for needle in ["cgroup", "allow_degraded"] {
        assert!(message.contains(needle), "{needle} missing from: {message}");
    }
    // The fix is the one that works on this host's cgroup version (issue 30: a v1 host
    // was told to use systemd's v2 delegation).
    if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        assert!(
            message.contains("systemd-run"),
            "v2 fix missing from: {message}"
        );
    } else {
        assert!(
            message.contains("chown") && message.contains("cgroup_parent"),
            "v1 fix missing from: {message}"
        );
        assert!(
            !message.contains("systemd-run"),
            "a v2 fix on v1: {message}"
        );
    }
    // doctor explains it too, and says the host is not ready for the default policy.
    let out = env.cmd().args(["doctor"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("MISSING  cgroup parent"), "{text}");
}

#[test]
fn rootless_degraded_policy_runs_and_lists_what_is_weaker() {
    require_unprivileged!();
    let env = TestEnv::new();
    let policy = env.policy(DEGRADED_POLICY);
    let run = env.run_json(&[
        "--policy",
        policy.to_str().unwrap(),
        "-c",
        "print(sum(range(10)))",
    ]);
    assert_eq!(run.obs["ok"], true, "{:#}\n{}", run.obs, run.stderr);
    assert_eq!(run.obs["stdout"], "45\n");
    if has_delegated_cgroup() {
        assert!(run.obs.get("degraded").is_none(), "{:#}", run.obs);
        return;
    }
    let degraded: Vec<&str> = run.obs["degraded"]
        .as_array()
        .expect("degraded controls listed")
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    for control in ["memory", "pids", "cpu"] {
        assert!(
            degraded.iter().any(|d| d.starts_with(control)),
            "{control} not listed in {degraded:?}"
        );
    }
    let audit = env.audit_lines();
    assert_eq!(audit.last().unwrap()["degraded"], run.obs["degraded"]);
}

#[test]
fn rootless_probe_sees_a_locked_down_sandbox() {
    require_unprivileged!();
    let report = super::probe::assert_probe_sees_a_locked_down_sandbox(DEGRADED_POLICY);
    if !has_delegated_cgroup() {
        // The degraded shape's rlimits are in place.
        assert_eq!(report.rlimits.nproc.hard, Some(66));
    }
}

#[test]
fn rootless_wall_time_still_kills_the_whole_tree() {
    require_unprivileged!();
    let env = TestEnv::new();
    let policy = env.policy(DEGRADED_POLICY);
    let tag = marker("rootless-tree");
    let source = "import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n        os.setsid()\n        time.sleep(1000)\ntime.sleep(1000)";
    let run = env.run_json(&[
        "--policy",
        policy.to_str().unwrap(),
        "--timeout",
        "1s",
        "-c",
        source,
        "--",
        &tag,
    ]);
    assert_eq!(run.obs["outcome"], "timeout", "{:#}", run.obs);
    assert_eq!(host_pids_with(&tag), Vec::<u32>::new());
}

#[test]
fn rootless_memory_and_process_limits_hold_as_rlimits() {
    require_unprivileged!();
    airlock_testkit::require!(
        !has_delegated_cgroup(),
        "with a delegated cgroup the cgroup limits apply (see the limits suite)"
    );
    let env = TestEnv::new();
    let policy = env.policy(DEGRADED_POLICY);
    let policy = policy.to_str().unwrap();
    let run = env.run_json(&["--policy", policy, "-c", "b = bytearray(1 << 30)"]);
    assert_eq!(run.obs["outcome"], "exited", "{:#}", run.obs);
    assert_eq!(run.obs["exit_code"], 1);
    assert!(run.obs["stderr"].as_str().unwrap().contains("MemoryError"));
    let counter = "import os, time\nn = 1\ntry:\n    while n < 1000:\n        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print(n, e.errno)";
    let run = env.run_json(&[
        "--policy",
        policy,
        "--timeout",
        "3s",
        "--pids",
        "16",
        "-c",
        counter,
    ]);
    assert_eq!(run.obs["stdout"], "16 11\n", "{:#}", run.obs);
}

#[test]
fn rootless_jobs_get_the_minimal_root_with_inodes_of_their_own() {
    require_unprivileged!();
    let env = TestEnv::new();
    let policy = env.policy(DEGRADED_POLICY);
    let run = env.run_json(&[
        "--policy",
        policy.to_str().unwrap(),
        "-c",
        &super::minimal_root::tool_search_source(),
    ]);
    let report = super::minimal_root::stdout_json(&run);
    assert_eq!(report["found"], serde_json::json!([]), "{report:#}");
    super::minimal_root::check_inotify(DEGRADED_POLICY);
}
