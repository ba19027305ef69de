//! Limits hold and end the job as the right outcome: wall time, processes, memory, output.

use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;

use super::common::{Kind, Target, host_pids_with, marker};

/// Counts how many tasks the job can hold at once (processes or threads), printing the
/// count and the errno (or message) of the first failure.
const FORK_COUNTER: &str = "import os, time\n\
                            n = 1\n\
                            try:\n\
                            \x20   while n < 1000:\n\
                            \x20       if os.fork() == 0:\n\
                            \x20           time.sleep(30)\n\
                            \x20           os._exit(0)\n\
                            \x20       n += 1\n\
                            except OSError as e:\n\
                            \x20   print(n, e.errno)";
const THREAD_COUNTER: &str = "import threading, time\n\
                              n = 1\n\
                              try:\n\
                              \x20   while n < 1000:\n\
                              \x20       threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n\
                              \x20       n += 1\n\
                              except RuntimeError as e:\n\
                              \x20   print(n, 'no thread')";

/// The fake kubelet's `podPidsLimit` (airlock-kube's `fake::kubelet::POD_PIDS_LIMIT`).
const KUBE_NODE_PIDS_LIMIT: u64 = 128;

/// kube: a Pod has no pids limit of its own (docs/kube.md, `pids` in `allow_degraded`), so
/// `--pids 16` is not held per job; the node's kubelet `podPidsLimit` is. The observation
/// says so, and the job is held at the node's limit, not at 16: this check fails the day a
/// per-job limit appears, so that the documentation changes with it.
fn assert_pids_degraded(t: &Target) {
    let run = t.run(&["--timeout", "4s", "--pids", "16", "-c", THREAD_COUNTER]);
    assert_eq!(run.obs["outcome"], "exited", "{:#}", run.obs);
    let degraded: Vec<&str> = run.obs["degraded"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d.as_str())
        .collect();
    assert!(
        degraded.iter().any(|d| d.starts_with("pids:")),
        "{degraded:?}"
    );
    let held: u64 = run.obs["stdout"]
        .as_str()
        .and_then(|s| s.strip_suffix(" no thread\n"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{:#}", run.obs));
    assert!(
        held > 16 && held <= KUBE_NODE_PIDS_LIMIT,
        "threads held at {held}"
    );
}

conformance! {
    fn wall_time_kills_a_busy_loop_within_timeout_plus_one_second(t: &Target) {
        let started = Instant::now();
        let run = t.run(&["--timeout", "1s", "-c", "while True: pass"]);
        let elapsed = started.elapsed();
        assert_eq!(run.obs["outcome"], "timeout", "{:#}", run.obs);
        assert_eq!(run.obs["ok"], false);
        assert_eq!(run.code, 124);
        // The CLI's whole run. Natively that is the "within timeout + 1 s". With a
        // container it also holds the container's creation and removal, which is speed
        // (bench/), not enforcement, and stretches with the machine (1.8-2.4 s for docker
        // and gvisor here, 4-6 s for podman under the suite's parallel load): there the
        // bound only catches a hang, and the kill itself is judged by duration_ms below.
        // A warm run (`airlock run --warm`) also builds its sandbox and starts the
        // interpreter (the zygote kind: starts a zygote and forks the sandbox from it)
        // before the job is delivered and its clock starts, work a server's pool does ahead
        // of the job: there the bound allows for that (2.5 s was seen with the two cores at
        // load 15; 4.2 s for the zygote kind at load 22).
        let slack = match t.kind {
            Kind::Native => 2,
            Kind::Warm | Kind::Zygote => 5,
            Kind::Docker
            | Kind::Gvisor
            | Kind::Podman
            | Kind::Kube
            | Kind::WarmDocker
            | Kind::WarmGvisor
            | Kind::WarmPodman => 20,
        };
        assert!(elapsed < Duration::from_secs(slack), "took {elapsed:?}");
        let duration = run.obs["duration_ms"].as_u64().unwrap();
        // gVisor's sandbox takes up to ~0.6 s to die after SIGKILL.
        let kill_ms = if t.kind.base() == Kind::Gvisor { 1000 } else { 500 };
        assert!((1000..1000 + kill_ms).contains(&duration), "duration_ms {duration}");
    }

    fn wall_time_kills_the_whole_tree(t: &Target) {
        let tag = marker("tree");
        let source = "import os, signal, time\n\
                      for _ in range(3):\n\
                      \x20   if os.fork() == 0:\n\
                      \x20       signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
                      \x20       time.sleep(1000)\n\
                      time.sleep(1000)";
        let run = t.run(&["--timeout", "1s", "-c", source, "--", &tag]);
        assert_eq!(run.obs["outcome"], "timeout", "{:#}", run.obs);
        // gVisor's processes are not host processes; its whole sandbox is gone with the
        // container (checked by the container-leak tests).
        assert_eq!(host_pids_with(&tag), Vec::<u32>::new());
    }

    fn double_forked_setsid_sleeper_is_gone_when_the_job_ends(t: &Target) {
        let tag = marker("daemon");
        let source = "import os, sys\n\
                      if os.fork() == 0:\n\
                      \x20   os.setsid()\n\
                      \x20   if os.fork() == 0:\n\
                      \x20       os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(1000)', sys.argv[1]])\n\
                      \x20   os._exit(0)\n\
                      os.wait()\n\
                      print('parent exits')";
        let run = t.run(&["-c", source, "--", &tag]);
        assert_eq!(run.obs["outcome"], "exited", "{:#}", run.obs);
        assert_eq!(run.obs["stdout"], "parent exits\n");
        assert_eq!(host_pids_with(&tag), Vec::<u32>::new(), "the daemon survived the job");
    }

    fn fork_bomb_is_held_at_the_pids_limit(t: &Target) {
        if t.kind.base() == Kind::Kube {
            assert_pids_degraded(t);
        } else {
            let run = t.run(&["--timeout", "4s", "--pids", "16", "-c", FORK_COUNTER]);
            assert_eq!(run.obs["outcome"], "exited", "{:#}", run.obs);
            assert_eq!(run.obs["stdout"], "16 11\n", "processes held, errno EAGAIN");
        }
        // A real bomb: every child forks too. It ends at the wall clock, leaving nothing.
        let tag = marker("bomb");
        let bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass";
        let run = t.run(&["--timeout", "2s", "-c", bomb, "--", &tag]);
        // gVisor at the default 256 MiB: 64 forked interpreters use more memory in its
        // kernel than in Linux, so the bomb may end as oom before the clock runs out; on
        // kube only the node's pids limit holds it (the fake node's: 128), above 64.
        let outcome = run.obs["outcome"].as_str().unwrap();
        let allowed: &[&str] = if matches!(t.kind.base(), Kind::Gvisor | Kind::Kube) { &["timeout", "oom"] } else { &["timeout"] };
        assert!(allowed.contains(&outcome), "{:#}", run.obs);
        assert_eq!(host_pids_with(&tag), Vec::<u32>::new(), "bomb processes survived");
    }

    fn thread_bomb_is_held_at_the_pids_limit(t: &Target) {
        if t.kind.base() == Kind::Kube {
            return assert_pids_degraded(t);
        }
        let run = t.run(&["--timeout", "4s", "--pids", "16", "-c", THREAD_COUNTER]);
        assert_eq!(run.obs["outcome"], "exited", "{:#}", run.obs);
        assert_eq!(run.obs["stdout"], "16 no thread\n", "threads held");
    }

    fn allocating_a_gigabyte_ends_as_oom(t: &Target) {
        let run = t.run(&["-c", "b = bytearray(1 << 30)\nprint('allocated')"]);
        assert_eq!(run.obs["outcome"], "oom", "{:#}", run.obs);
        assert_eq!(run.obs["ok"], false);
        assert_eq!(run.obs["stdout"], "");
        assert_eq!(run.code, 137);
        if let Some(peak) = run.obs["peak_memory_bytes"].as_u64() {
            assert!(peak <= 256 * 1024 * 1024 + 1024 * 1024, "peak {peak} above the limit");
        }
    }

    fn output_flood_is_killed_as_output_limit(t: &Target) {
        let run = t.run(&["-c", "import sys\nwhile True: sys.stdout.write('x' * 65536)"]);
        assert_eq!(run.obs["outcome"], "output_limit", "{:#}", run.obs);
        assert_eq!(run.code, 137);
        assert!(run.obs["stdout_bytes"].as_u64().unwrap() >= 64 * 1024 * 1024);
        assert_eq!(run.obs["stdout_truncated"], true);
        assert_eq!(run.obs["stdout"].as_str().unwrap().len(), 8000);
    }
}
