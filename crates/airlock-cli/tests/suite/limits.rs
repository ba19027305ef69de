//! Limits hold and end the job as the right outcome: wall time, processes, memory, output.
//!
//! What every backend must hold is checked once, in airlock-conformance (which runs on the
//! native backend too). What stays here is native-only (the CPU quota, the supervisor's own
//! memory) or what `scripts/vm/run-v2-tests.sh` runs on a cgroup v2 kernel, where the
//! emulated CPU needs the unhurried timeouts below; the conformance binary does not run in
//! that VM.

use pretty_assertions::assert_eq;

use super::common::{TestEnv, host_pids_with, json_run, marker};
use crate::require_native;

/// A policy body for tests whose subject is not wall time: a timeout so long that only a
/// hung sandbox reaches it, however slow the machine (the cgroup v2 VM emulates its CPU
/// and runs these jobs 20 to 60 times slower than the host).
const UNHURRIED: &str = "[limits]\ntimeout = \"120s\"";

#[test]
fn wall_time_kills_the_whole_tree() {
    require_native!();
    let env = TestEnv::new();
    let tag = marker("tree");
    // Children that ignore SIGTERM and sleep; the kill must still take all of them. The
    // parent says "forked" only once every child has its handler, so the test cannot pass
    // with a tree that never grew.
    let source = "import os, signal, sys, time\n\
                  r, w = os.pipe()\n\
                  for _ in range(3):\n\
                  \x20   if os.fork() == 0:\n\
                  \x20       signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
                  \x20       os.write(w, b'.')\n\
                  \x20       time.sleep(1000)\n\
                  got = b''\n\
                  while len(got) < 3:\n\
                  \x20   got += os.read(r, 3)\n\
                  print('forked', flush=True)\n\
                  time.sleep(1000)";
    let run = env.run_json(&["--timeout", "3s", "-c", source, "--", &tag]);
    assert_eq!(run.obs["outcome"], "timeout", "{:#}", run.obs);
    assert_eq!(run.obs["stdout"], "forked\n", "{:#}", run.obs);
    assert_eq!(host_pids_with(&tag), Vec::<u32>::new());
}

#[test]
fn double_forked_setsid_sleeper_is_gone_when_the_job_ends() {
    require_native!();
    let env = TestEnv::new();
    let tag = marker("daemon");
    // The daemon reports its pid; the parent waits until it really runs (its command line
    // carries the tag) before exiting, so the test cannot pass vacuously.
    let source = "import os, sys, time\n\
                  r, w = os.pipe()\n\
                  if os.fork() == 0:\n\
                  \x20   os.setsid()\n\
                  \x20   if os.fork() == 0:\n\
                  \x20       os.write(w, str(os.getpid()).encode())\n\
                  \x20       os.execvp('python3', ['python3', '-c', 'import time; time.sleep(1000)', sys.argv[1]])\n\
                  \x20   os._exit(0)\n\
                  os.wait()\n\
                  pid = int(os.read(r, 32))\n\
                  for _ in range(500):\n\
                  \x20   if sys.argv[1].encode() in open(f'/proc/{pid}/cmdline', 'rb').read():\n\
                  \x20       break\n\
                  \x20   time.sleep(0.01)\n\
                  print('daemon running')";
    let policy = env.policy(UNHURRIED);
    let run = env.run_json(&[
        "--policy",
        policy.to_str().unwrap(),
        "-c",
        source,
        "--",
        &tag,
    ]);
    assert_eq!(run.obs["outcome"], "exited", "{:#}", run.obs);
    assert_eq!(run.obs["stdout"], "daemon running\n", "{:#}", run.obs);
    assert_eq!(
        host_pids_with(&tag),
        Vec::<u32>::new(),
        "the daemon survived the job"
    );
}

#[test]
fn fork_bomb_is_held_at_the_pids_limit() {
    require_native!();
    let env = TestEnv::new();
    // Count how many processes the job can hold at once.
    let counter = "import os, time\n\
                   n = 1\n\
                   try:\n\
                   \x20   while n < 1000:\n\
                   \x20       if os.fork() == 0:\n\
                   \x20           time.sleep(30)\n\
                   \x20           os._exit(0)\n\
                   \x20       n += 1\n\
                   except OSError as e:\n\
                   \x20   print(n, e.errno)";
    let policy = env.policy(UNHURRIED);
    let policy = policy.to_str().unwrap();
    let run = env.run_json(&["--policy", policy, "--pids", "16", "-c", counter]);
    assert_eq!(run.obs["outcome"], "exited", "{:#}", run.obs);
    let stdout = run.obs["stdout"].as_str().unwrap();
    assert_eq!(stdout, "16 11\n", "processes held, errno EAGAIN");

    // A real bomb: every child forks too. It must end, and leave nothing behind.
    let tag = marker("bomb");
    let bomb =
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass";
    let run = env.run_json(&["--timeout", "2s", "-c", bomb, "--", &tag]);
    assert_eq!(run.obs["outcome"], "timeout", "{:#}", run.obs);
    assert_eq!(
        host_pids_with(&tag),
        Vec::<u32>::new(),
        "bomb processes survived"
    );
}

#[test]
fn allocating_a_gigabyte_ends_as_oom() {
    require_native!();
    let env = TestEnv::new();
    let policy = env.policy(UNHURRIED);
    let policy = policy.to_str().unwrap();
    let run = env.run_json(&[
        "--policy",
        policy,
        "-c",
        "b = bytearray(1 << 30)\nprint('allocated')",
    ]);
    assert_eq!(run.obs["outcome"], "oom", "{:#}", run.obs);
    assert_eq!(run.obs["ok"], false);
    assert_eq!(run.obs["stdout"], "");
    assert_eq!(run.code, 137);
    let peak = run.obs["peak_memory_bytes"].as_u64().unwrap();
    assert!(
        peak <= 256 * 1024 * 1024 + 1024 * 1024,
        "peak {peak} above the limit"
    );
    assert!(
        peak >= 200 * 1024 * 1024,
        "peak {peak}: the bomb never neared the limit"
    );
}

#[test]
fn cpu_quota_is_applied() {
    require_native!();
    let env = TestEnv::new();
    // Two spinning processes under a quota of a quarter CPU: CPU time over wall time near
    // 0.25, where without the quota it would be 2 (or 1 on a single CPU). Judged as a
    // ratio, not against the nominal timeout, so a slow start (the emulated v2 VM) and a
    // coarse tick there still leave a wide margin on both sides.
    let spin = "import os\nos.fork()\nwhile True: pass";
    let run = env.run_json(&["--timeout", "4s", "--cpus", "0.25", "-c", spin]);
    assert_eq!(run.obs["outcome"], "timeout", "{:#}", run.obs);
    let cpu = run.obs["cpu_ms"].as_u64().unwrap();
    let wall = run.obs["duration_ms"].as_u64().unwrap();
    let share = cpu as f64 / wall as f64;
    assert!(
        (0.08..=0.6).contains(&share),
        "cpu_ms {cpu} over duration_ms {wall} is {share:.2}, not about 0.25"
    );
}

#[test]
fn printing_a_gigabyte_keeps_the_supervisor_small() {
    require_native!();
    let env = TestEnv::new();
    let policy = env.policy("[limits]\ntimeout = \"120s\"\ncpus = 1\nflood = \"2GiB\"");
    // python3 reports the peak RSS of the largest process in airlock's tree once it ends.
    let driver = "import resource, subprocess, sys\n\
                  p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE)\n\
                  print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n\
                  sys.stdout.buffer.write(p.stdout)";
    let job = "import sys\nchunk = b'y' * (1 << 20)\nfor _ in range(1024): sys.stdout.buffer.write(chunk)";
    let out = std::process::Command::new("python3")
        .args(["-c", driver, &super::common::airlock_bin(), "run", "--json"])
        .args(["--policy", policy.to_str().unwrap(), "-c", job])
        .env("AIRLOCK_STATE_DIR", env.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let max_rss_kib: u64 = stderr
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no rss in {stderr}"));
    let run = json_run(std::process::Output {
        status: out.status,
        stdout: out.stdout,
        stderr: Vec::new(),
    });
    assert_eq!(run.obs["outcome"], "exited", "{:#}", run.obs);
    assert_eq!(run.obs["stdout_bytes"], 1u64 << 30);
    assert_eq!(run.obs["stdout_truncated"], true);
    assert_eq!(run.obs["stdout"].as_str().unwrap().len(), 8000);
    assert!(
        max_rss_kib < 64 * 1024,
        "supervisor peak RSS {max_rss_kib} KiB"
    );
}
