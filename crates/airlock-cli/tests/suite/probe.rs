//! The probe, run inside the sandbox, reports what a job can see and do.

use std::net::TcpListener;

use airlock_testkit::{DangerousCall, Outcome, ProbeReport};
use pretty_assertions::assert_eq;

use super::common::TestEnv;
use crate::require_native;

/// Runs the probe in a sandbox started by the `airlock` command that `airlock` makes
/// ([`TestEnv::cmd`], or a wrapper).
pub fn run_probe(
    env: &TestEnv,
    policy_body: &str,
    extra: &[&str],
    airlock: impl Fn(&TestEnv) -> std::process::Command,
) -> (ProbeReport, serde_json::Value) {
    let probe = airlock_testkit::require_probe().expect("probe binary");
    // The probe's subject is the sandbox's shape, not wall time: a long timeout keeps it
    // from racing the machine's speed (the emulated cgroup v2 VM is 20 to 60 times slower).
    let policy = env.policy(&format!(
        "[limits]\nstdout = \"1MiB\"\nfiles = \"64MiB\"\ntimeout = \"120s\"\n{policy_body}"
    ));
    let mut args = vec![
        "--policy".to_owned(),
        policy.display().to_string(),
        "--file".to_owned(),
        format!("probe={}", probe.display()),
        "-l".to_owned(),
        "sh".to_owned(),
        "-c".to_owned(),
    ];
    args.push(format!("exec /work/probe report {}", extra.join(" ")));
    let mut cmd = airlock(env);
    // A secret in the supervisor's environment must never reach the job.
    cmd.env("OPENAI_API_KEY", "sk-airlock-canary-secret");
    cmd.arg("run").arg("--json").args(&args);
    let run = super::common::json_run(cmd.output().unwrap());
    assert_eq!(run.obs["ok"], true, "{:#}\n{}", run.obs, run.stderr);
    assert_eq!(run.obs["stdout_truncated"], false);
    let report = ProbeReport::from_json(run.obs["stdout"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("probe report: {e}\n{}", run.obs["stdout"]));
    (report, run.obs)
}

#[test]
fn probe_sees_a_locked_down_sandbox() {
    require_native!();
    assert_probe_sees_a_locked_down_sandbox("");
}

/// Runs the probe under a policy (`policy_body` added to the test policy) and checks every
/// property of the security shape that does not depend on cgroups.
pub fn assert_probe_sees_a_locked_down_sandbox(policy_body: &str) -> ProbeReport {
    assert_probe_sees_a_locked_down_sandbox_via(policy_body, TestEnv::cmd)
}

/// [`assert_probe_sees_a_locked_down_sandbox`] with the `airlock` command that `airlock`
/// makes (a wrapper, say).
pub fn assert_probe_sees_a_locked_down_sandbox_via(
    policy_body: &str,
    airlock: impl Fn(&TestEnv) -> std::process::Command,
) -> ProbeReport {
    let env = TestEnv::new();
    let canary = TcpListener::bind("127.0.0.1:0").unwrap();
    let canary_addr = canary.local_addr().unwrap().to_string();
    let (r, _) = run_probe(
        &env,
        policy_body,
        &["--canary", &canary_addr, "--fill-tmp"],
        airlock,
    );

    // Identity: uid/gid 65534, alone in its pid namespace.
    assert_eq!((r.identity.uid, r.identity.euid), (65534, 65534));
    assert_eq!((r.identity.gid, r.identity.egid), (65534, 65534));
    assert!(
        r.identity.groups.iter().all(|g| *g == 65534),
        "{:?}",
        r.identity.groups
    );
    assert_eq!(r.identity.hostname, "airlock");
    assert!(
        r.identity.pid < 10,
        "pid {} is not from a fresh pid namespace",
        r.identity.pid
    );

    // Every capability set empty, no_new_privs, seccomp filter mode.
    let status = r.status.as_ref().expect("/proc/self/status");
    assert_eq!(
        (
            status.cap_eff,
            status.cap_prm,
            status.cap_bnd,
            status.cap_amb,
            status.cap_inh
        ),
        (0, 0, 0, 0, 0)
    );
    assert!(status.no_new_privs);
    assert_eq!(status.seccomp, 2);

    // Filesystem: / and /work read-only; /tmp writable, noexec, full at 16 MiB.
    for path in ["/", "/work", "/usr", "/etc", "/dev"] {
        assert_eq!(r.mounts[path].read_only, Some(true), "{path} is writable");
        assert_eq!(r.writes[path], Outcome::errno("EROFS"), "write to {path}");
    }
    assert_eq!(r.mounts["/tmp"].read_only, Some(false));
    assert_eq!(r.mounts["/tmp"].noexec, Some(true));
    assert_eq!(r.mounts["/tmp"].nosuid, Some(true));
    assert_eq!(r.mounts["/tmp"].nodev, Some(true));
    assert!(r.writes["/tmp"].is_ok());
    assert_eq!(r.tmp_exec.exec, Some(Outcome::errno("EACCES")));
    let fill = r.fill_tmp.as_ref().expect("fill report");
    assert_eq!(fill.bytes_written, 16 * 1024 * 1024);
    assert_eq!(fill.error, Some(Outcome::errno("ENOSPC")));

    // Network: only lo, and the host's 127.0.0.1 is not this 127.0.0.1.
    assert_eq!(
        r.network.interfaces.as_deref(),
        Some(&["lo".to_owned()][..])
    );
    let canary_result = &r.network.canary.as_ref().unwrap().result;
    assert!(
        !canary_result.is_ok(),
        "reached the host canary: {canary_result:?}"
    );
    canary.set_nonblocking(true).unwrap();
    assert!(canary.accept().is_err(), "the canary received a connection");

    // Nothing of the host's private files.
    for path in [
        "/etc/shadow",
        "/root",
        "/home",
        "/var",
        "/run",
        "/srv",
        "/opt",
        "/mnt",
        "/media",
        "/sys",
        "/var/run/docker.sock",
    ] {
        assert_eq!(r.paths.exists.get(path), Some(&false), "{path} is visible");
    }
    let etc = r.paths.etc_entries.clone().unwrap_or_default();
    for synthesized in ["passwd", "group", "hosts", "resolv.conf"] {
        assert!(
            etc.contains(&synthesized.to_owned()),
            "/etc lacks {synthesized}: {etc:?}"
        );
    }
    assert!(!etc.contains(&"shadow".to_owned()));
    assert!(!etc.contains(&"ssh".to_owned()));
    let dev = r.paths.dev_entries.clone().unwrap_or_default();
    for node in ["null", "zero", "full", "random", "urandom"] {
        assert!(dev.contains(&node.to_owned()), "/dev lacks {node}: {dev:?}");
    }

    // Environment: the allowlist only; the supervisor's secret is absent.
    assert!(!r.env.contains_key("OPENAI_API_KEY"), "{:?}", r.env);
    assert!(
        !r.env
            .values()
            .any(|v| v.contains("sk-airlock-canary-secret"))
    );
    let mut names: Vec<&str> = r.env.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        vec!["HOME", "LANG", "PATH", "PWD", "PYTHONDONTWRITEBYTECODE"]
    );

    // The denied syscalls fail; ordinary ones work.
    for &call in airlock_testkit::DENIED_WITH_EPERM {
        assert_eq!(
            r.syscall(call),
            Some(&Outcome::errno("EPERM")),
            "{}",
            call.name()
        );
    }
    // Becoming root fails: EPERM where root is mapped (airlock as root), EINVAL where it
    // is not mapped at all (rootless).
    for call in [DangerousCall::Setuid0, DangerousCall::Setgid0] {
        let outcome = r.syscall(call).unwrap();
        assert!(
            matches!(outcome.errno_name(), Some("EPERM" | "EINVAL")),
            "{}: {outcome:?}",
            call.name()
        );
    }
    // clone3's flags cannot be inspected, so the filter makes it look unimplemented.
    assert_eq!(
        r.syscall(DangerousCall::Clone3Newuser),
        Some(&Outcome::errno("ENOSYS"))
    );
    assert!(r.syscall(DangerousCall::Getpid).is_some_and(Outcome::is_ok));
    assert!(
        r.syscall(DangerousCall::SocketInetStream)
            .is_some_and(Outcome::is_ok)
    );

    // rlimits from the policy.
    assert_eq!(r.rlimits.nofile.hard, Some(256));
    assert_eq!(r.rlimits.fsize.hard, Some(64 * 1024 * 1024));
    // 1, not 0: the only value that also stops dumps to a core_pattern pipe.
    assert_eq!(r.rlimits.core.hard, Some(1));
    r
}
