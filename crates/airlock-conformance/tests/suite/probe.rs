//! The probe, run inside the sandbox, reports what a job can see and do; the same
//! locked-down shape must hold on every backend. Where a backend shows a property
//! differently (gVisor's own kernel), the check says how and why.

use std::net::TcpListener;

use airlock_testkit::{DangerousCall, Outcome, ProbeReport};
use pretty_assertions::assert_eq;

use super::common::{Kind, Target};

/// Where the kube backend's image has the probe: a Pod's inputs are text annotations, so a
/// binary cannot travel as an input file; `scripts/ci/kube.sh` adds the probe to the test
/// image instead.
pub const KUBE_PROBE_PATH: &str = "/usr/local/bin/airlock-probe";

fn run_probe(t: &Target, filesystem: &str, extra: &[&str]) -> ProbeReport {
    run_probe_obs(t, filesystem, extra).0
}

/// The probe's report and the observation around it.
fn run_probe_obs(t: &Target, filesystem: &str, extra: &[&str]) -> (ProbeReport, serde_json::Value) {
    let policy = t.policy_with("stdout = \"1MiB\"\nfiles = \"64MiB\"", filesystem, "");
    let mut cmd = t.cmd();
    // A secret in airlock's own environment must never reach the job.
    cmd.env("OPENAI_API_KEY", "sk-airlock-canary-secret");
    cmd.args(["run", "--json"])
        .args(t.backend_args(&[]))
        .arg("--policy")
        .arg(&policy);
    let probe = if t.kind.base() == Kind::Kube {
        KUBE_PROBE_PATH.to_owned()
    } else {
        let probe = airlock_testkit::require_probe()
            .expect("probe binary (cargo build -p airlock-testkit --bins)");
        cmd.arg("--file").arg(format!("probe={}", probe.display()));
        "/work/probe".to_owned()
    };
    if t.kind.is_warm() {
        // Warm sandboxes wait with a Python interpreter loaded: the job is Python that
        // becomes the probe, in the very sandbox the interpreter was started in.
        let argv: Vec<String> = ["/work/probe", "report"]
            .iter()
            .map(|s| (*s).to_owned())
            .chain(extra.iter().map(|s| (*s).to_owned()))
            .collect();
        cmd.args(["-l", "python", "-c"])
            .arg(format!("import os\nos.execv('/work/probe', {argv:?})"));
    } else {
        cmd.args(["-l", "sh", "-c"])
            .arg(format!("exec {probe} report {}", extra.join(" ")));
    }
    let run = super::common::json_run(cmd.output().unwrap());
    if t.kind.is_warm() {
        super::common::assert_ran_warm(t.kind, &run);
    }
    assert_eq!(run.obs["ok"], true, "{:#}\n{}", run.obs, run.stderr);
    assert_eq!(run.obs["stdout_truncated"], false);
    let report = ProbeReport::from_json(run.obs["stdout"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("probe report: {e}\n{}", run.obs["stdout"]));
    (report, run.obs)
}

/// The names of the weaker controls an observation lists.
fn degraded(obs: &serde_json::Value) -> Vec<String> {
    obs["degraded"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|d| Some(d.as_str()?.split(':').next()?.to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// A write that must fail: EROFS on a read-only mount; gVisor's gofer answers EACCES for
/// its read-only binds and root.
fn assert_write_refused(t: &Target, outcome: &Outcome, path: &str) {
    let errno = outcome.errno_name();
    let ok = match t.kind.base() {
        Kind::Gvisor => matches!(errno, Some("EROFS" | "EACCES")),
        _ => errno == Some("EROFS"),
    };
    assert!(ok, "write to {path}: {outcome:?}");
}

conformance! {
    fn probe_sees_a_locked_down_sandbox(t: &Target) {
        let canary = TcpListener::bind("127.0.0.1:0").unwrap();
        let canary_addr = canary.local_addr().unwrap().to_string();
        let (r, obs) = run_probe_obs(t, "", &["--canary", &canary_addr, "--fill-tmp"]);

        // Identity: uid/gid 65534, alone in a fresh pid namespace, hostname airlock.
        assert_eq!((r.identity.uid, r.identity.euid), (65534, 65534));
        assert_eq!((r.identity.gid, r.identity.egid), (65534, 65534));
        assert!(r.identity.groups.iter().all(|g| *g == 65534), "{:?}", r.identity.groups);
        assert_eq!(r.identity.hostname, "airlock");
        assert!(r.identity.pid < 10, "pid {}", r.identity.pid);

        // Capabilities, no_new_privs, seccomp. gVisor's /proc/self/status has no
        // capability or seccomp lines (its kernel does not report them); the denied
        // syscalls below show its filter instead.
        match (&r.status, t.kind.base()) {
            (None, Kind::Gvisor) => {}
            (status, _) => {
                let status = status.as_ref().expect("/proc/self/status");
                assert_eq!(
                    (status.cap_eff, status.cap_prm, status.cap_bnd, status.cap_amb, status.cap_inh),
                    (0, 0, 0, 0, 0)
                );
                assert!(status.no_new_privs);
                assert_eq!(status.seccomp, 2);
            }
        }

        // Filesystem: / and /work read-only; /tmp writable, noexec, full at 16 MiB.
        for path in ["/", "/work", "/usr", "/etc"] {
            assert_write_refused(t, &r.writes[path], path);
        }
        if t.kind.base() != Kind::Gvisor {
            // gVisor's mount table shows its 9p root and binds without "ro"; the gofer
            // refuses the writes (above).
            for path in ["/", "/work", "/usr", "/etc"] {
                assert_eq!(r.mounts[path].read_only, Some(true), "{path} is writable");
            }
            // kube: an emptyDir, which Kubernetes cannot mount noexec (`tmp_exec`, accepted
            // by the policy and listed in the observation).
            // Nor nosuid, nodev: the fake kubelet's Docker tmpfs has them, a kubelet's
            // does not, so they are not claimed here (no_new_privs and the dropped
            // capabilities make set-id files and device nodes inert; docs/kube.md).
            if t.kind.base() == Kind::Kube {
                assert_eq!(r.mounts["/tmp"].noexec, Some(false));
            } else {
                assert_eq!(r.mounts["/tmp"].noexec, Some(true));
                assert_eq!(r.mounts["/tmp"].nosuid, Some(true));
                assert_eq!(r.mounts["/tmp"].nodev, Some(true));
            }
        }
        assert_eq!(r.mounts["/tmp"].read_only, Some(false));
        assert!(r.writes["/tmp"].is_ok());
        let exec = r.tmp_exec.exec.as_ref().expect("exec from /tmp tried");
        if t.kind.base() == Kind::Kube {
            assert!(exec.is_ok(), "exec from /tmp: {exec:?}");
            assert!(degraded(&obs).contains(&"tmp_exec".to_owned()), "{:?}", degraded(&obs));
        } else {
            assert!(matches!(exec.errno_name(), Some("EACCES" | "EPERM")), "exec from /tmp: {exec:?}");
        }
        let fill = r.fill_tmp.as_ref().expect("fill report");
        assert_eq!(fill.bytes_written, 16 * 1024 * 1024);
        assert_eq!(fill.error, Some(Outcome::errno("ENOSPC")));

        // Network: only lo, and the host's 127.0.0.1 is not this 127.0.0.1. (kube: the fake
        // kubelet gives its containers no network at all; a real Pod has an interface whose
        // egress only the namespace's NetworkPolicy denies, `network_policy` below, proven
        // by airlock-kube's real-cluster suite.)
        if t.kind.base() == Kind::Kube {
            assert!(degraded(&obs).contains(&"network_policy".to_owned()), "{:?}", degraded(&obs));
        }
        assert_eq!(r.network.interfaces.as_deref(), Some(&["lo".to_owned()][..]));
        let canary_result = &r.network.canary.as_ref().unwrap().result;
        assert!(!canary_result.is_ok(), "reached the host canary: {canary_result:?}");
        canary.set_nonblocking(true).unwrap();
        assert!(canary.accept().is_err(), "the canary received a connection");

        // Nothing of the host's private files. Container backends show their image, which
        // the CI script trims (no /var, /root, /home, shadow files); they do show a
        // read-only /sys, as every Docker and Podman container does.
        let mut hidden = vec!["/etc/shadow", "/root", "/home", "/var", "/run", "/srv", "/opt", "/mnt", "/media", "/var/run/docker.sock"];
        if !t.kind.is_container() {
            hidden.push("/sys");
        }
        if t.kind.base() == Kind::Podman {
            // Podman always mounts /run and /var/tmp; airlock makes them empty and
            // read-only (see airlock-docker's spec).
            hidden.retain(|p| *p != "/run" && *p != "/var");
        }
        for path in hidden {
            assert_eq!(r.paths.exists.get(path), Some(&false), "{path} is visible");
        }
        let etc = r.paths.etc_entries.clone().unwrap_or_default();
        for needed in ["passwd", "group", "hosts", "resolv.conf"] {
            assert!(etc.contains(&needed.to_owned()), "/etc lacks {needed}: {etc:?}");
        }
        assert!(!etc.contains(&"shadow".to_owned()));
        let dev = r.paths.dev_entries.clone().unwrap_or_default();
        for node in ["null", "zero", "full", "random", "urandom"] {
            assert!(dev.contains(&node.to_owned()), "/dev lacks {node}: {dev:?}");
        }

        // Environment: the allowlist only (PWD is the shell's own; warm jobs are Python,
        // which sets none).
        assert!(!r.env.contains_key("OPENAI_API_KEY"), "{:?}", r.env);
        assert!(!r.env.values().any(|v| v.contains("sk-airlock-canary-secret")));
        let mut names: Vec<&str> = r.env.keys().map(String::as_str).collect();
        names.sort_unstable();
        let mut allowed = vec!["HOME", "LANG", "PATH", "PWD", "PYTHONDONTWRITEBYTECODE"];
        if t.kind.is_warm() {
            allowed.retain(|n| *n != "PWD");
        }
        assert_eq!(names, allowed);

        // The denied syscalls fail with EPERM (the same reviewed filter everywhere).
        for &call in airlock_testkit::DENIED_WITH_EPERM {
            assert_eq!(r.syscall(call), Some(&Outcome::errno("EPERM")), "{}", call.name());
        }
        for call in [DangerousCall::Setuid0, DangerousCall::Setgid0] {
            let outcome = r.syscall(call).unwrap();
            assert!(matches!(outcome.errno_name(), Some("EPERM" | "EINVAL")), "{}: {outcome:?}", call.name());
        }
        // clone3's flags cannot be inspected: unimplemented to the job (Docker answers EPERM).
        let clone3 = r.syscall(DangerousCall::Clone3Newuser).unwrap();
        assert!(matches!(clone3.errno_name(), Some("ENOSYS" | "EPERM")), "clone3: {clone3:?}");
        assert!(r.syscall(DangerousCall::Getpid).is_some_and(Outcome::is_ok));
        assert!(r.syscall(DangerousCall::SocketInetStream).is_some_and(Outcome::is_ok));

        // rlimits from the policy.
        assert_eq!(r.rlimits.nofile.hard, Some(256));
        assert_eq!(r.rlimits.fsize.hard, Some(64 * 1024 * 1024));
        assert_eq!(r.rlimits.core.hard, Some(1));
    }

    fn rw_workdir_policy_makes_work_writable_and_nothing_else(t: &Target) {
        let r = run_probe(t, "workdir = \"rw\"", &[]);
        assert!(r.writes["/work"].is_ok(), "{:?}", r.writes["/work"]);
        assert_write_refused(t, &r.writes["/"], "/");
        assert_write_refused(t, &r.writes["/usr"], "/usr");
    }
}
