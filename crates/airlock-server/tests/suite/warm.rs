//! The warm pool (`[native] warm_pool`): jobs delivered to sandboxes started ahead of
//! time see exactly what a job in a fresh sandbox sees, one job per sandbox, with the
//! wall clock from delivery; jobs it does not fit run fresh; dead warm sandboxes are
//! replaced; nothing is left behind at shutdown. These are the sandboxes started from
//! scratch (`zygote = false`); suite::zygote has the forked ones.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::common::*;
use crate::require_server;

const POOL: u64 = 2;

fn policy(warm_pool: u64) -> String {
    format!(
        "version = \"warm-test-1\"\n[limits]\ntimeout = \"3s\"\n[native]\nwarm_pool = {warm_pool}\n\
         zygote = false\n"
    )
}

fn server(warm_pool: u64) -> Server {
    Server::start(Opts {
        args: ["--policy", "warm.toml"].map(String::from).to_vec(),
        files: vec![("warm.toml".into(), policy(warm_pool))],
        ..Default::default()
    })
}

/// The jobs whose outcome, output and ([`WARM_PROBE`]'s) view of the sandbox a warm or
/// forked native sandbox must give exactly as a fresh one does.
pub(super) fn equivalence_cases() -> Vec<Value> {
    vec![
        json!({"language": "python", "code": WARM_PROBE, "args": ["a b", "", "ü"], "stdin": "in\n",
               "files": [{"path": "data.txt", "content": "data"}]}),
        json!({"language": "python", "code": WARM_PROBE,
               "files": [{"path": "data.txt", "content": "x"}]}),
        python("def f():\n    raise ValueError('boom')\nf()\n"),
        python("x = (\n"),
        python("import sys\nprint('bye')\nsys.exit(3)\n"),
        python(
            "import atexit, threading, time\natexit.register(lambda: print('atexit'))\nthreading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n",
        ),
        python("# -*- coding: latin-1 -*-\nprint(repr('\u{e9}'))\n"),
        python("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"),
        python("import inspect\ndef g():\n    return 1\nprint(inspect.getsource(g))\n"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_jobs_see_exactly_what_fresh_jobs_see() {
    require_server!();
    let cold = server(0);
    let warm = server(POOL);
    wait_ready(&warm, POOL).await;
    let cases = equivalence_cases();
    // The only thing that may differ: the pid in the job's pid namespace (the warm
    // sandbox's job process is the same one, started earlier).
    assert_warm_sees_what_cold_sees(&cold, &warm, POOL, &cases, &[], &["pid"], |_, _| {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wall_clock_starts_at_delivery_and_each_sandbox_serves_one_job() {
    require_server!();
    let warm = server(POOL);
    wait_ready(&warm, POOL).await;
    assert_nothing_carries_to_the_next_job(&warm, POOL).await;

    // The limit still holds, counted from delivery.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let slow = post_run(
        &warm,
        None,
        &python("import time\nwhile True:\n    time.sleep(0.05)\n"),
    )
    .await;
    assert_eq!(slow.body["outcome"], "timeout", "{:#}", slow.body);
    let ms = slow.body["duration_ms"].as_u64().unwrap();
    assert!(
        (3000..5000).contains(&ms),
        "duration {ms} ms for a 3 s limit: {:#}",
        slow.body
    );
    // A shorter limit than the pool's fits, and is the one enforced.
    wait_ready(&warm, POOL).await;
    let short = post_run(
        &warm,
        None,
        &json!({"language": "python", "code": "while True: pass", "timeout": "1s"}),
    )
    .await;
    assert_eq!(short.body["outcome"], "timeout", "{:#}", short.body);
    let ms = short.body["duration_ms"].as_u64().unwrap();
    assert!(
        (1000..2500).contains(&ms),
        "duration {ms} ms for a 1 s limit"
    );
    // Its CPU time is the job's busy loop: present, and never more than its wall time
    // allows. How much of the second it got depends on the host's load (two cores shared
    // with the rest of the suite gave it a quarter), so there is no tighter floor.
    let cpu = short.body["cpu_ms"].as_u64().unwrap();
    assert!(
        (100..=ms + 100).contains(&cpu),
        "cpu {cpu} ms: {:#}",
        short.body
    );
    assert_eq!(hits(&warm).await, 4, "{}", warm.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_the_pool_does_not_fit_run_in_fresh_sandboxes() {
    require_server!();
    let warm = server(POOL);
    wait_ready(&warm, POOL).await;
    assert_unfit_jobs_run_fresh(
        &warm,
        &[json!({"language": "python", "code": "print(1)", "cpus": 0.25})],
    )
    .await;
}

/// The warm sandboxes' helpers (the server's children) and their cgroup directories.
fn warm_sandboxes(server_pid: u32) -> Vec<(u32, Vec<PathBuf>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(server_pid) {
            continue;
        }
        let cgroups: Vec<PathBuf> = std::fs::read_to_string(entry.path().join("cgroup"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("/warm-"))
            .filter_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                let mount = match controllers.split(',').next() {
                    Some("") | None => "/sys/fs/cgroup".to_owned(),
                    Some(first) => format!("/sys/fs/cgroup/{first}"),
                };
                Some(PathBuf::from(format!("{mount}{path}")))
            })
            .collect();
        if !cgroups.is_empty() {
            found.push((pid, cgroups));
        }
    }
    found
}

fn job_dir_of(cgroup: &std::path::Path) -> PathBuf {
    PathBuf::from("/run/airlock").join(cgroup.file_name().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_warm_sandbox_is_replaced_and_shutdown_leaves_nothing_behind() {
    require_server!();
    let mut warm = server(POOL);
    wait_ready(&warm, POOL).await;
    let sandboxes = warm_sandboxes(warm.pid());
    assert_eq!(sandboxes.len(), POOL as usize, "{sandboxes:?}");
    // Kill every process of the oldest warm sandbox's cgroup, the interpreter included.
    let (_, cgroups) = &sandboxes[0];
    let procs = std::fs::read_to_string(cgroups[0].join("cgroup.procs")).unwrap();
    let mut killed = 0;
    for pid in procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim().starts_with("python") {
            rustix::process::kill_process(
                rustix::process::Pid::from_raw(pid).unwrap(),
                rustix::process::Signal::KILL,
            )
            .unwrap();
            killed += 1;
        }
    }
    assert_eq!(killed, 1, "no interpreter in {procs:?}");
    // The init ends with its only child, and the helper with the init.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        let answer = post_run(&warm, None, &python("print('fine')")).await;
        assert_eq!(answer.body["stdout"], "fine\n", "{:#}", answer.body);
        assert_eq!(answer.body["outcome"], "exited");
    }
    let discarded = metric(
        &warm,
        "airlock_warm_pool_sandboxes_total{result=\"discarded\"}",
    )
    .await;
    assert_eq!(discarded, 1, "{}", warm.log());

    wait_ready(&warm, POOL).await;
    let mut left = warm_sandboxes(warm.pid());
    left.extend(sandboxes);
    warm.terminate();
    assert!(
        warm.wait(Duration::from_secs(20)).success(),
        "{}",
        warm.log()
    );
    for (pid, cgroups) in &left {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                    .is_ok_and(|c| !c.contains("/warm-")),
            "warm sandbox helper {pid} outlived the server"
        );
        for cgroup in cgroups {
            assert!(!cgroup.exists(), "{} left behind", cgroup.display());
            let dir = job_dir_of(cgroup);
            assert!(!dir.exists(), "{} left behind", dir.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_sandbox_idle_past_its_lifetime_is_replaced() {
    require_server!();
    let text = "version = \"warm-test-1\"\n[limits]\ntimeout = \"3s\"\n[native]\nwarm_pool = 1\nwarm_idle = \"1s\"\nzygote = false\n";
    let warm = Server::start(Opts {
        args: ["--policy", "warm.toml"].map(String::from).to_vec(),
        files: vec![("warm.toml".into(), text.to_owned())],
        ..Default::default()
    });
    wait_ready(&warm, 1).await;
    let first = warm_sandboxes(warm.pid());
    assert_eq!(first.len(), 1, "{first:?}");
    // Past its lifetime the sandbox is torn down and another takes its place, with no job.
    let start = Instant::now();
    loop {
        let discarded = metric(
            &warm,
            "airlock_warm_pool_sandboxes_total{result=\"discarded\"}",
        )
        .await;
        let now = warm_sandboxes(warm.pid());
        if discarded >= 1 && now.len() == 1 && now[0].0 != first[0].0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the idle sandbox was not replaced (discarded {discarded}, now {now:?}):\n{}",
            warm.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for cgroup in &first[0].1 {
        assert!(!cgroup.exists(), "{} left behind", cgroup.display());
        assert!(
            !job_dir_of(cgroup).exists(),
            "job dir of {} left behind",
            cgroup.display()
        );
    }
    assert_eq!(hits(&warm).await, 0);
    // The replacement serves a job like any other.
    wait_ready(&warm, 1).await;
    let answer = post_run(&warm, None, &python("print('fresh')")).await;
    assert_eq!(answer.body["stdout"], "fresh\n", "{:#}", answer.body);
    assert_eq!(hits(&warm).await, 1, "{}", warm.log());
}

/// The CPU share file of a cgroup directory (`cpu.shares` on v1, `cpu.weight` on v2), or
/// `None` for a v1 directory of another controller.
fn cpu_share(dir: &std::path::Path) -> Option<(String, String)> {
    ["cpu.shares", "cpu.weight"].into_iter().find_map(|name| {
        let value = std::fs::read_to_string(dir.join(name)).ok()?;
        Some((name.to_owned(), value.trim().to_owned()))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_sandboxes_wait_at_the_lowest_cpu_priority_and_jobs_run_at_normal() {
    require_server!();
    let warm = server(1);
    wait_ready(&warm, 1).await;
    let sandboxes = warm_sandboxes(warm.pid());
    assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
    let (dir, (file, waiting)) = sandboxes[0]
        .1
        .iter()
        .find_map(|d| Some((d.clone(), cpu_share(d)?)))
        .expect("a warm sandbox's cpu cgroup");
    let background = if file == "cpu.shares" { "2" } else { "1" };
    let normal = if file == "cpu.shares" { "1024" } else { "100" };
    assert_eq!(waiting, background, "{} of {}", file, dir.display());
    if file == "cpu.weight"
        && let Ok(idle) = std::fs::read_to_string(dir.join("cpu.idle"))
    {
        assert_eq!(idle.trim(), "1", "cpu.idle of {}", dir.display());
    }

    // While the job runs in that sandbox, its group competes as any job's does.
    let (seen, body) =
        cpu_share_during_a_job(&warm, normal, || cpu_share(&dir).map(|(_, v)| v)).await;
    assert_eq!(
        seen.as_deref(),
        Some(normal),
        "{file} of {} during the job",
        dir.display()
    );
    assert_eq!(body["stdout"], "running\n", "{body:#}");
    assert_eq!(hits(&warm).await, 1, "{}", warm.log());
}

/// A session's jobs bind the session's `/work` when their sandbox is built, so no warm
/// sandbox (built with a `/work` of its own) ever takes one: in either mode every call is
/// counted unfit, none a hit, and the files carry across calls as they do without a pool.
/// (Here without a zygote; with one, a sandbox is forked for the session's job with its
/// mounts: sessions.rs.)
#[tokio::test]
async fn session_jobs_never_take_a_warm_sandbox() {
    require_server!();
    for mode in ["workspace", "kernel"] {
        let policy = format!(
            "{}[sessions]\nenabled = true\nmode = \"{mode}\"\n",
            policy(POOL)
        );
        let warm = Server::start(Opts {
            args: ["--policy", "warm.toml"].map(String::from).to_vec(),
            files: vec![("warm.toml".into(), policy)],
            ..Default::default()
        });
        wait_ready(&warm, POOL).await;
        let post = |path: String, body: Value| {
            let request = client()
                .post(warm.url(&path))
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&body).unwrap());
            async move {
                let response = request.send().await.unwrap();
                let status = response.status().as_u16();
                let body: Value = response.json().await.unwrap();
                (status, body)
            }
        };
        let (status, session) = post("/v1/sessions".into(), json!({})).await;
        assert_eq!(status, 201, "{mode}: {session:#}");
        let id = session["id"].as_str().unwrap().to_owned();
        let runs = format!("/v1/sessions/{id}/runs");
        let (_, first) = post(
            runs.clone(),
            json!({"code": "open('carried.txt', 'w').write('yes')"}),
        )
        .await;
        assert_eq!(
            first["observation"]["outcome"], "exited",
            "{mode}: {first:#}"
        );
        let (_, second) = post(runs, json!({"code": "print(open('carried.txt').read())"})).await;
        assert_eq!(
            second["observation"]["stdout"], "yes\n",
            "{mode}: {second:#}"
        );
        assert_eq!(
            hits(&warm).await,
            0,
            "{mode}: a session job took a warm sandbox"
        );
        // Workspace mode: each call is a job; kernel mode: the session's one kernel job.
        let jobs = if mode == "workspace" { 2 } else { 1 };
        assert_eq!(
            metric(&warm, "airlock_warm_pool_jobs_total{result=\"unfit\"}").await,
            jobs,
            "{mode}"
        );
        // The pool is still whole and still serves ordinary jobs.
        wait_ready(&warm, POOL).await;
        let plain = post_run(
            &warm,
            None,
            &json!({"language": "python", "code": "print(1)"}),
        )
        .await;
        assert_eq!(plain.body["stdout"], "1\n");
        assert_eq!(hits(&warm).await, 1, "{mode}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_preload_imports_the_modules_before_the_job_and_nothing_else_shows() {
    require_server!();
    let cold = server(0);
    // `this` prints the Zen of Python when imported: none of it may reach the job's output.
    // A module that does not exist is skipped.
    let warm = Server::start(Opts {
        args: ["--policy", "warm.toml"].map(String::from).to_vec(),
        files: vec![(
            "warm.toml".into(),
            format!(
                "{}warm_preload = [\"sqlite3\", \"decimal\", \"this\", \"no_such_module_q\"]\n",
                policy(1)
            ),
        )],
        ..Default::default()
    });
    wait_ready(&warm, 1).await;
    let job = python(
        "import json, os, sys\nprint(json.dumps({m: m in sys.modules for m in \
         ['sqlite3', 'decimal', 'this', 'no_such_module_q']} | \
         {'fds': sorted(os.listdir('/proc/self/fd'))}, sort_keys=True))\n",
    );
    let before = hits(&warm).await;
    let got = post_run(&warm, None, &job).await;
    assert_eq!(got.status, 200, "{:#}", got.body);
    assert_eq!(hits(&warm).await, before + 1, "the job did not run warm");
    let want = post_run(&cold, None, &job).await;
    assert_eq!(got.body["stderr"], "", "{:#}", got.body);
    let warm_seen: Value = serde_json::from_str(got.body["stdout"].as_str().unwrap())
        .unwrap_or_else(|e| {
            panic!(
                "{e}: the job's stdout is more than its line: {:#}",
                got.body
            )
        });
    let cold_seen: Value = serde_json::from_str(want.body["stdout"].as_str().unwrap()).unwrap();
    assert_eq!(
        warm_seen,
        json!({"sqlite3": true, "decimal": true, "this": true, "no_such_module_q": false,
               "fds": cold_seen["fds"]}),
        "cold: {cold_seen}"
    );
    assert_eq!(cold_seen["sqlite3"], false);
}
