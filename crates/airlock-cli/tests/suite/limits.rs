//! Limits hold and end the job as the right outcome: wall time, processes, memory, output.

use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;

use super::common::{TestEnv, host_pids_with, json_run, marker};
use crate::require_native;

#[test]
fn wall_time_kills_a_busy_loop_within_timeout_plus_one_second() {
    require_native!();
    let env = TestEnv::new();
    let started = Instant::now();
    let run = env.run_json(&["--timeout", "1s", "-c", "while True: pass"]);
    let elapsed = started.elapsed();
    assert_eq!(run.obs["outcome"], "timeout", "{:#}", run.obs);
    assert_eq!(run.obs["ok"], false);
    assert_eq!(run.code, 124);
    assert!(elapsed < Duration::from_secs(2), "took {elapsed:?}");
    let duration = run.obs["duration_ms"].as_u64().unwrap();
    assert!((1000..1500).contains(&duration), "duration_ms {duration}");
}

#[test]
fn wall_time_kills_the_whole_tree() {
    require_native!();
    let env = TestEnv::new();
    let tag = marker("tree");
    // Children that ignore SIGTERM and sleep; the kill must still take all of them.
    let source = "import os, signal, time\n\
                  for _ in range(3):\n\
                  \x20   if os.fork() == 0:\n\
                  \x20       signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
                  \x20       time.sleep(1000)\n\
                  time.sleep(1000)";
    let run = env.run_json(&["--timeout", "1s", "-c", source, "--", &tag]);
    assert_eq!(run.obs["outcome"], "timeout", "{:#}", run.obs);
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
    let run = env.run_json(&["-c", source, "--", &tag]);
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
    let run = env.run_json(&["--timeout", "3s", "--pids", "16", "-c", counter]);
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
    let run = env.run_json(&["-c", "b = bytearray(1 << 30)\nprint('allocated')"]);
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
    let run = env.run_json(&["--timeout", "2s", "-c", "while True: pass"]);
    assert_eq!(run.obs["outcome"], "timeout");
    let cpu = run.obs["cpu_ms"].as_u64().unwrap();
    // 0.5 CPU for 2 s: about 1000 ms of CPU, never the 2000 ms an unlimited loop takes.
    assert!((600..=1400).contains(&cpu), "cpu_ms {cpu}");
}

#[test]
fn output_flood_is_killed_as_output_limit() {
    require_native!();
    let env = TestEnv::new();
    let run = env.run_json(&[
        "-c",
        "import sys\nwhile True: sys.stdout.write('x' * 65536)",
    ]);
    assert_eq!(run.obs["outcome"], "output_limit", "{:#}", run.obs);
    assert_eq!(run.code, 137);
    assert!(run.obs["stdout_bytes"].as_u64().unwrap() >= 64 * 1024 * 1024);
    assert_eq!(run.obs["stdout_truncated"], true);
    assert_eq!(run.obs["stdout"].as_str().unwrap().len(), 8000);
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
