//! A job in a sandbox forked from a zygote (`[native] zygote`, `airlock run --warm`), on
//! whatever cgroup version this host runs (scripts/vm/run-v2-tests.sh runs these on v2):
//! the child put itself into its own job cgroup, whose limits hold, and built its own
//! namespaces and filters.

use super::common::TestEnv;
use crate::require_native;

/// `airlock run --warm --json` under a zygote policy with `limits` lines; asserts the job
/// ran in a forked sandbox.
fn run_forked(env: &TestEnv, limits: &str, args: &[&str]) -> super::common::JsonRun {
    let policy = env.policy(&format!("[limits]\n{limits}\n[native]\nzygote = true\n"));
    let mut cmd = env.cmd();
    cmd.arg("run")
        .arg("--json")
        .arg("--warm")
        .arg("--policy")
        .arg(&policy)
        .args(args);
    let run = super::common::json_run(cmd.output().expect("spawn airlock"));
    assert!(
        run.stderr
            .contains("the job ran in a sandbox forked from a zygote"),
        "{}\n{:#}",
        run.stderr,
        run.obs
    );
    run
}

#[test]
fn a_forked_job_is_held_by_its_own_cgroup() {
    require_native!();
    let env = TestEnv::new();
    // Its own group: the memory limit is the job's, and its cgroup namespace is rooted
    // there (every line of /proc/self/cgroup ends in ":/").
    let run = run_forked(
        &env,
        "memory = \"64MiB\"",
        &[
            "-c",
            "import sys\nprint(open('/proc/self/cgroup').read(), end='', flush=True)\n\
             b = bytearray(200 << 20)\nprint('survived')\n",
        ],
    );
    assert_eq!(run.obs["outcome"], "oom", "{:#}\n{}", run.obs, run.stderr);
    let cgroups = run.obs["stdout"].as_str().unwrap();
    assert!(!cgroups.is_empty(), "{:#}", run.obs);
    assert!(cgroups.lines().all(|l| l.ends_with(":/")), "{cgroups}");
    assert!(
        run.obs["peak_memory_bytes"]
            .as_u64()
            .is_some_and(|b| b >= 60 << 20),
        "{:#}",
        run.obs
    );
}

#[test]
fn a_forked_job_runs_locked_down_in_namespaces_of_its_own() {
    require_native!();
    let env = TestEnv::new();
    let run = run_forked(
        &env,
        "",
        &[
            "-c",
            "import ctypes, errno, json, os\n\
             libc = ctypes.CDLL(None, use_errno=True)\n\
             status = dict(l.split(':', 1) for l in open('/proc/self/status'))\n\
             def denied(rc):\n\
             \x20   return errno.errorcode.get(ctypes.get_errno()) if rc < 0 else 'allowed'\n\
             print(json.dumps({\n\
             \x20   'ids': [os.getuid(), os.getgid(), os.getgroups()],\n\
             \x20   'caps': [int(status[k], 16) for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb')],\n\
             \x20   'nnp': status['NoNewPrivs'].strip(), 'seccomp': status['Seccomp'].strip(),\n\
             \x20   'filters': status['Seccomp_filters'].strip(), 'pid': os.getpid(),\n\
             \x20   'procs': sorted(int(p) for p in os.listdir('/proc') if p.isdigit()),\n\
             \x20   'unshare': denied(libc.unshare(0x10000000)), 'mount': denied(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)),\n\
             \x20   'hostname': os.uname().nodename, 'tmp': os.listdir('/tmp'),\n\
             \x20   'net': sorted(os.listdir('/sys/class/net')) if os.path.isdir('/sys/class/net') else None,\n\
             }))\n",
        ],
    );
    assert_eq!(run.obs["ok"], true, "{:#}\n{}", run.obs, run.stderr);
    let seen: serde_json::Value =
        serde_json::from_str(run.obs["stdout"].as_str().unwrap()).unwrap();
    assert_eq!(seen["ids"], serde_json::json!([65534, 65534, []]), "{seen}");
    assert_eq!(seen["caps"], serde_json::json!([0, 0, 0, 0, 0]), "{seen}");
    assert_eq!(seen["nnp"], "1");
    assert_eq!(seen["seccomp"], "2");
    assert_eq!(seen["filters"], "2");
    // pid 2 under an init of its own: nothing of the zygote's or another child's.
    assert_eq!(seen["pid"], 2, "{seen}");
    assert_eq!(seen["procs"], serde_json::json!([1, 2]), "{seen}");
    assert_eq!(seen["unshare"], "EPERM");
    assert_eq!(seen["mount"], "EPERM");
    assert_eq!(seen["hostname"], "airlock");
    assert_eq!(seen["tmp"], serde_json::json!([]));
}
