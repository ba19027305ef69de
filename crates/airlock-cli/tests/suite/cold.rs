//! The cold path (docs/speed.md): which executable builds a sandbox, how its helper joins
//! the job's cgroup, and the observation printed before the sandbox's removal.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;

use super::common::{TestEnv, airlock_bin, host_pids_with, json_run, marker};
use crate::require_native;

/// Longest wait for a job's process to appear on the host (not a measured time: the
/// emulated cgroup v2 VM is slow to start a sandbox).
const APPEAR_WITHIN: Duration = Duration::from_secs(60);

fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The command name may hold spaces; the fields after its closing parenthesis do not.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split(' ').nth(1).unwrap().parse().unwrap()
}

fn cgroups_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap()
}

fn exe_of(pid: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .unwrap()
        .display()
        .to_string()
}

/// Whether this host's kernel lets airlock execute a memfd (not `vm.memfd_noexec = 2` in
/// airlock's own pid namespace).
fn memfds_are_executable() -> bool {
    std::fs::read_to_string("/proc/sys/vm/memfd_noexec").map_or(true, |v| v.trim() != "2")
}

/// Waits for the host pid of the Python job whose command line holds `needle` (as the
/// command line of `airlock`, its supervisor, does, and of a child it forked until that
/// child executes another program).
fn wait_for_job(needle: &str) -> u32 {
    let deadline = Instant::now() + APPEAR_WITHIN;
    loop {
        let found: Vec<u32> = host_pids_with(needle)
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|cmdline| cmdline.starts_with(b"python3\0"))
            })
            .collect();
        if let [pid] = found[..] {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "no job process {needle} appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_sandbox_is_built_by_the_static_init_from_a_memfd_all_of_it_in_the_job_cgroup() {
    require_native!();
    airlock_testkit::require!(
        memfds_are_executable(),
        "this host sets vm.memfd_noexec = 2, so airlock re-executes itself (tested below)"
    );
    let env = TestEnv::new();
    let tag = marker("static-init");
    let policy = env.policy("[limits]\ntimeout = \"120s\"");
    let mut airlock = env
        .cmd()
        .args(["run", "--json", "--policy"])
        .arg(&policy)
        .args(["-c", "import time; time.sleep(120)"])
        .args(["--", &tag])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let job = wait_for_job(&tag);
    // job <- init (pid 1 of the sandbox) <- helper <- airlock
    let init = parent_of(job);
    let helper = parent_of(init);
    assert_eq!(parent_of(helper), airlock.id());
    let small_init = "/memfd:airlock-init (deleted)";
    assert_eq!(exe_of(helper), small_init);
    assert_eq!(exe_of(init), small_init);
    for pid in [helper, init] {
        assert_eq!(
            std::fs::read(format!("/proc/{pid}/cmdline")).unwrap(),
            b"init\0__airlock-init\0"
        );
        assert_eq!(
            std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap(),
            "init\n"
        );
    }
    // The helper joined the job's group in every hierarchy before it forked anything
    // (through `tasks` on v1, born there on v2): all three have the job's groups, which
    // are not airlock's own.
    let groups = cgroups_of(helper);
    assert_eq!(cgroups_of(init), groups);
    assert_eq!(cgroups_of(job), groups);
    assert_ne!(cgroups_of(airlock.id()), groups);
    // Ended from the host, once looked at.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(i32::try_from(job).unwrap()).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let mut stdout = String::new();
    airlock
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    airlock.wait().unwrap();
    let obs: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(obs["outcome"], "killed", "{obs:#}");
    let job_id = obs["job_id"].as_str().unwrap();
    // Each hierarchy airlock limits the job with (v1: memory, cpu, cpuacct, pids; v2: the
    // unified one) names the job's own group.
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let limiting = groups.lines().filter(|line| {
        let controllers = line.split(':').nth(1).unwrap_or_default();
        if v2 {
            controllers.is_empty()
        } else {
            controllers
                .split(',')
                .any(|c| ["memory", "cpu", "cpuacct", "pids"].contains(&c))
        }
    });
    let mut seen = 0;
    for line in limiting {
        assert!(line.ends_with(&format!("/{job_id}")), "{groups}");
        seen += 1;
    }
    assert!(seen >= 1, "{groups}");
}

/// A command that runs `airlock ARGS...` in a pid namespace of its own whose
/// `vm.memfd_noexec` is `mode` (it is per pid namespace), as on a host that sets it.
fn airlock_under_memfd_noexec(env: &TestEnv, mode: u8) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "sh", "-c"])
        .arg(format!(
            "echo {mode} > /proc/sys/vm/memfd_noexec && \"$0\" \"$@\""
        ))
        .arg(airlock_bin())
        .env("AIRLOCK_STATE_DIR", env.path())
        .env("AIRLOCK_LOG", "airlock_native=debug");
    cmd
}

fn require_memfd_noexec_and_unshare() -> bool {
    Path::new("/proc/sys/vm/memfd_noexec").exists()
        && Command::new("unshare")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
}

#[test]
fn where_memfds_cannot_be_executed_airlock_itself_builds_the_same_sandbox() {
    require_native!();
    airlock_testkit::require!(
        require_memfd_noexec_and_unshare(),
        "needs vm.memfd_noexec (Linux 6.3+) and util-linux's unshare"
    );
    let env = TestEnv::new();
    let mut cmd = airlock_under_memfd_noexec(&env, 2);
    cmd.args([
        "run",
        "--json",
        "-c",
        "print(open('/proc/1/cmdline', 'rb').read().split(b'\\0')[0].decode(), \
         open('/proc/1/comm').read().strip())",
    ]);
    let run = json_run(cmd.output().unwrap());
    assert_eq!(run.obs["ok"], true, "{:#}\n{}", run.obs, run.stderr);
    assert_eq!(run.obs["stdout"], "init init\n");
    assert!(
        run.stderr.contains("no memfd for the sandbox init"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains(&format!("program={}", airlock_bin()))
            && !run.stderr.contains("program=/proc/self/fd/"),
        "{}",
        run.stderr
    );
    // And the shape of that sandbox is the locked-down one, probed from inside.
    let mut cmd = airlock_under_memfd_noexec(&env, 2);
    cmd.arg("doctor");
    let doctor = String::from_utf8(cmd.output().unwrap().stdout).unwrap();
    assert!(
        doctor.contains("re-executed (no executable memfd)"),
        "{doctor}"
    );
    super::probe::assert_probe_sees_a_locked_down_sandbox_via("", |env| {
        airlock_under_memfd_noexec(env, 2)
    });
}

#[test]
fn where_memfds_must_ask_to_be_executable_the_static_init_still_serves() {
    require_native!();
    airlock_testkit::require!(
        require_memfd_noexec_and_unshare(),
        "needs vm.memfd_noexec (Linux 6.3+) and util-linux's unshare"
    );
    // vm.memfd_noexec = 1: a memfd is executable only when created with MFD_EXEC.
    let env = TestEnv::new();
    let mut cmd = airlock_under_memfd_noexec(&env, 1);
    cmd.args(["run", "--json", "-c", "print(45)"]);
    let run = json_run(cmd.output().unwrap());
    assert_eq!(run.obs["ok"], true, "{:#}\n{}", run.obs, run.stderr);
    assert!(
        run.stderr.contains("program=/proc/self/fd/"),
        "{}",
        run.stderr
    );
}

#[test]
fn the_observation_is_printed_before_the_sandbox_is_removed_and_the_removal_still_ends() {
    require_native!();
    let env = TestEnv::new();
    let output = env
        .cmd()
        .env("AIRLOCK_LOG", "airlock_native=debug")
        .args(["run", "-c", "print(45)"])
        .output()
        .unwrap();
    assert!(output.status.success());
    assert_eq!(output.stdout, b"45\n");
    // The summary and the log share stderr, in the order they happened.
    let stderr = String::from_utf8_lossy(&output.stderr);
    let summary = stderr
        .find("airlock: exited 0 after")
        .unwrap_or_else(|| panic!("no summary: {stderr}"));
    let removed = stderr
        .find("sandbox removed")
        .unwrap_or_else(|| panic!("the sandbox was not removed before exit: {stderr}"));
    assert!(summary < removed, "{stderr}");
    // Removed means removed: the job's directory and cgroups are gone.
    let line = &stderr[summary..];
    let job_id = line[line.find(", job ").unwrap() + 6..line.find(']').unwrap()].to_owned();
    assert!(
        !Path::new("/run/airlock").join(&job_id).exists(),
        "{job_id} left its directory"
    );
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        assert!(
            !find_dir_named(&hierarchy.path(), &job_id, 4),
            "{job_id} left a cgroup under {}",
            hierarchy.path().display()
        );
    }
}

fn find_dir_named(dir: &Path, name: &str, depth: usize) -> bool {
    if depth == 0 {
        return false;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        e.file_type().is_ok_and(|t| t.is_dir())
            && (e.file_name() == name || find_dir_named(&e.path(), name, depth - 1))
    })
}
