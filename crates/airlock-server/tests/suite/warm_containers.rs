//! Warm containers (`[docker] warm_pool`, `gvisor_warm_pool`, `podman_warm_pool`): a job
//! delivered to a container created and started before it sees exactly what a job in a
//! fresh container sees, each container serves one job with the wall clock from the
//! delivery, waits at the lowest CPU share and runs its job at the normal one; a dead or
//! idle one is replaced; shutdown removes every waiting container, and a killed server's
//! are swept when the next airlock connects.
//!
//! They need the container engines and the test image, which `scripts/ci/docker.sh` starts
//! and builds: ignored here, run there with `--run-ignored only` (as the kube backend's
//! end-to-end tests are by `scripts/ci/kube.sh`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::common::*;

const POOL: u64 = 2;

/// One container backend under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Docker,
    Gvisor,
    Podman,
}

impl Engine {
    fn backend(self) -> &'static str {
        match self {
            Engine::Docker => "docker",
            Engine::Gvisor => "gvisor",
            Engine::Podman => "podman",
        }
    }

    /// The policy key of this backend's pool size.
    fn pool_key(self) -> &'static str {
        match self {
            Engine::Docker => "warm_pool",
            Engine::Gvisor => "gvisor_warm_pool",
            Engine::Podman => "podman_warm_pool",
        }
    }

    fn socket(self) -> PathBuf {
        let (var, default) = match self {
            Engine::Podman => ("AIRLOCK_PODMAN_SOCKET", "/run/podman/podman.sock"),
            Engine::Docker | Engine::Gvisor => ("AIRLOCK_DOCKER_SOCKET", "/var/run/docker.sock"),
        };
        std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from)
    }

    /// Why this engine cannot be tested here, if it cannot.
    fn missing(self) -> Option<String> {
        if !airlock_testkit::require::is_root() {
            return Some("warm containers need root here".into());
        }
        if !airlock_bin().is_file() {
            return Some(format!(
                "no airlock binary at {} (cargo build -p airlock-cli)",
                airlock_bin().display()
            ));
        }
        if image().is_empty() {
            return Some(
                "AIRLOCK_TEST_IMAGE is not set (scripts/ci/docker.sh builds the image)".into(),
            );
        }
        if !self.socket().exists() {
            return Some(format!("no daemon socket at {}", self.socket().display()));
        }
        None
    }

    /// The docker CLI on this engine's daemon.
    fn cli(self) -> Command {
        let mut cmd = Command::new("docker");
        cmd.env("DOCKER_HOST", format!("unix://{}", self.socket().display()));
        cmd
    }

    /// A policy: the test image, this engine's sockets, a 3 s wall time, `pool` warm
    /// containers, and `extra` lines in `[docker]`.
    fn policy(self, pool: u64, extra: &str) -> String {
        let docker = Engine::Docker.socket();
        let podman = Engine::Podman.socket();
        format!(
            "version = \"warm-ct-1\"\n[limits]\ntimeout = \"3s\"\n[filesystem]\nrootfs = \"image:{}\"\n\
             [docker]\ndocker_socket = {:?}\npodman_socket = {:?}\n{} = {pool}\n{extra}\n",
            image(),
            docker.display().to_string(),
            podman.display().to_string(),
            self.pool_key(),
        )
    }

    fn server(self, pool: u64, extra: &str) -> Server {
        Server::start(Opts {
            args: ["--backend", self.backend(), "--policy", "warm.toml"]
                .map(String::from)
                .to_vec(),
            files: vec![("warm.toml".into(), self.policy(pool, extra))],
            ..Default::default()
        })
    }
}

fn image() -> String {
    std::env::var("AIRLOCK_TEST_IMAGE").unwrap_or_default()
}

async fn discarded(server: &Server) -> u64 {
    metric(
        server,
        "airlock_warm_pool_sandboxes_total{result=\"discarded\"}",
    )
    .await
}

/// The warm containers a server holds: the sandboxes whose job directory's lock it has
/// open (`warm-<uuid>`; the container is `airlock-warm-<uuid>`). Other tests' servers on
/// the same daemon hold their own.
fn warm_containers_of(server_pid: u32) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(format!("/proc/{server_pid}/fd"))
        .map(|dir| {
            dir.flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .filter_map(|target| {
                    let dir = target.parent()?;
                    (dir.parent()? == Path::new("/run/airlock-docker"))
                        .then(|| dir.file_name()?.to_str().map(str::to_owned))
                        .flatten()
                })
                .filter(|name| name.starts_with("warm-"))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found.dedup();
    found
}

/// What the docker CLI prints on this engine's daemon for `args`.
fn cli_output(engine: Engine, args: &[&str]) -> String {
    let out = engine.cli().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Whether the daemon has a container of that sandbox (running or not).
fn container_exists(engine: Engine, sandbox: &str) -> bool {
    let label = format!("label=airlock.job={sandbox}");
    !cli_output(engine, &["ps", "-aq", "--filter", &label]).is_empty()
}

/// The host pid of a sandbox's container's first process.
fn container_pid(engine: Engine, sandbox: &str) -> u32 {
    let name = format!("airlock-{sandbox}");
    cli_output(engine, &["inspect", "-f", "{{.State.Pid}}", &name])
        .parse()
        .unwrap()
}

/// The CPU share of a process's cgroup on the host: (`cpu.shares` on v1 or `cpu.weight`
/// on v2, its value).
fn host_cpu_share(pid: u32) -> (String, String) {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let dir = cgroup
        .lines()
        .find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            if controllers.split(',').any(|c| c == "cpu") {
                let mount = if Path::new("/sys/fs/cgroup/cpu,cpuacct").is_dir() {
                    "/sys/fs/cgroup/cpu,cpuacct"
                } else {
                    "/sys/fs/cgroup/cpu"
                };
                Some(PathBuf::from(format!("{mount}{path}")))
            } else {
                None
            }
        })
        .or_else(|| {
            let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
            Some(PathBuf::from(format!("/sys/fs/cgroup{path}")))
        })
        .unwrap();
    for name in ["cpu.shares", "cpu.weight"] {
        if let Ok(value) = std::fs::read_to_string(dir.join(name)) {
            return (name.to_owned(), value.trim().to_owned());
        }
    }
    panic!("no CPU share file in {}", dir.display());
}

async fn warm_containers_see_exactly_what_fresh_ones_see(engine: Engine) {
    let cold = engine.server(0, "");
    let warm = engine.server(POOL, "");
    wait_ready(&warm, POOL).await;
    let cases: Vec<Value> = vec![
        json!({"language": "python", "code": WARM_PROBE, "args": ["a b", "", "ü"], "stdin": "in\n",
               "files": [{"path": "data.txt", "content": "data"}]}),
        json!({"language": "python", "code": WARM_PROBE,
               "files": [{"path": "data.txt", "content": "x"}]}),
        json!({"language": "python", "code": "import sys\nprint(sys.stdin.read(3), sys.stdin.read())",
               "stdin": "abcdef"}),
        python("def f():\n    raise ValueError('boom')\nf()\n"),
        python("x = (\n"),
        python("import sys\nprint('bye')\nsys.exit(3)\n"),
        python(
            "import atexit, threading, time\natexit.register(lambda: print('atexit'))\nthreading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n",
        ),
        python("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\nprint('alive')\n"),
        python("import inspect\ndef g():\n    return 1\nprint(inspect.getsource(g))\n"),
    ];
    // Nothing may differ: the job is its container's first process in both.
    assert_warm_sees_what_cold_sees(
        &cold,
        &warm,
        POOL,
        &cases,
        &["backend", "image_digest"],
        &[],
        |_, _| {},
    )
    .await;

    // Jobs the template does not fit run in fresh containers, with their own limits.
    assert_unfit_jobs_run_fresh(&warm, &[]).await;
    stop(warm, engine);
    stop(cold, engine);
}

async fn each_container_serves_one_job_from_its_delivery_at_normal_priority(engine: Engine) {
    let warm = engine.server(1, "");
    wait_ready(&warm, 1).await;
    let waiting = warm_containers_of(warm.pid());
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    let pid = container_pid(engine, &waiting[0]);
    let (file, share) = host_cpu_share(pid);
    let (background, normal) = if file == "cpu.shares" {
        ("2", "1024")
    } else {
        ("1", "100")
    };
    assert_eq!(share, background, "{file} of the waiting container");

    // While its job runs, the container's group competes as any job's does.
    let (seen, body) = cpu_share_during_a_job(&warm, normal, || Some(host_cpu_share(pid).1)).await;
    assert_eq!(seen.as_deref(), Some(normal), "{file} during the job");
    assert_eq!(body["stdout"], "running\n", "{body:#}");

    // Waiting longer than the 3 s limit in the pool costs the next job nothing, and what
    // the first job left is not there: a container serves one job.
    wait_ready(&warm, 1).await;
    assert!(
        !container_exists(engine, &waiting[0]),
        "the used container is still there"
    );
    assert_nothing_carries_to_the_next_job(&warm, 1).await;
    // The limit still holds, counted from the delivery: a job that never ends is killed
    // no earlier than its 3 s.
    wait_ready(&warm, 1).await;
    let slow = post_run(
        &warm,
        None,
        &python("import time\nwhile True:\n    time.sleep(0.05)\n"),
    )
    .await;
    assert_eq!(slow.body["outcome"], "timeout", "{:#}", slow.body);
    assert!(
        slow.body["duration_ms"].as_u64().unwrap() >= 3000,
        "{:#}",
        slow.body
    );
    assert_eq!(hits(&warm).await, 4, "{}", warm.log());
    stop(warm, engine);
}

async fn a_dead_or_idle_container_is_replaced(engine: Engine) {
    let warm = engine.server(1, "warm_idle = \"5s\"");
    wait_ready(&warm, 1).await;
    let first = warm_containers_of(warm.pid());
    assert_eq!(first.len(), 1, "{first:?}");
    // The container dies while it waits: the next job does not get it.
    let killed = engine
        .cli()
        .args(["kill"])
        .arg(format!("airlock-{}", first[0]))
        .output()
        .unwrap();
    assert!(
        killed.status.success(),
        "{}",
        String::from_utf8_lossy(&killed.stderr)
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let answer = post_run(&warm, None, &python("print('fine')")).await;
    assert_eq!(answer.body["stdout"], "fine\n", "{:#}", answer.body);
    assert_eq!(answer.body["outcome"], "exited");
    assert_eq!(discarded(&warm).await, 1, "{}", warm.log());
    assert_eq!(hits(&warm).await, 0, "the dead container served a job");
    assert!(
        eventually(20, || !container_exists(engine, &first[0])),
        "the dead container was not removed"
    );

    // Past its idle lifetime a container is removed and another takes its place, with no
    // job.
    wait_ready(&warm, 1).await;
    let second = warm_containers_of(warm.pid());
    assert_eq!(second.len(), 1, "{second:?}");
    let start = Instant::now();
    loop {
        let now = warm_containers_of(warm.pid());
        if discarded(&warm).await >= 2 && now.len() == 1 && now != second {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the idle container was not replaced (now {now:?}):\n{}",
            warm.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        eventually(20, || !container_exists(engine, &second[0])),
        "the idle container was not removed"
    );
    wait_ready(&warm, 1).await;
    let answer = post_run(&warm, None, &python("print('fresh')")).await;
    assert_eq!(answer.body["stdout"], "fresh\n", "{:#}", answer.body);
    assert_eq!(hits(&warm).await, 1, "{}", warm.log());
    stop(warm, engine);
}

async fn container_ends(server: &Server, source: &str) -> u64 {
    metric(
        server,
        &format!("airlock_warm_pool_container_ends_total{{result=\"{source}\"}}"),
    )
    .await
}

/// The host's processes whose command line contains `tag`.
fn host_processes_with(tag: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(tag))
        .collect()
}

/// On Docker and Podman a delivered job's end comes from the kernel (docs/docker.md, "How
/// a warm container's job ends"): its first process's pidfd and the kernel's process
/// events, not the engine's wait. The reply comes only once no process of the job is
/// left; a job whose status its events cannot tell (it made a thread) gets the engine's,
/// which is then the one a cold container reports, even when its leading thread exits
/// on its own before another thread ends it with another status. gVisor's always come
/// from the engine.
async fn a_jobs_end_comes_from_the_kernel_and_its_status_is_the_engines(engine: Engine) {
    let cold = engine.server(0, "");
    let warm = engine.server(1, "");
    let from_kernel = engine != Engine::Gvisor;
    // The jobs whose end the kernel told, and the engine, as the metric must count them.
    let (mut kernel_ends, mut engine_ends) = (0, 0);
    // A background process started by the job: with the reply, it is gone.
    let tag = format!("airlock-bg-{}", std::process::id());
    let simple = [
        (python("print('one')"), "exited", Some(0)),
        (python("import sys\nsys.exit(7)"), "exited", Some(7)),
        (
            python(&format!(
                "import subprocess\nsubprocess.Popen(['sh', '-c', 'sleep 300; : {tag}'])\nprint('left')"
            )),
            "exited",
            Some(0),
        ),
        (python("import os\nos.abort()"), "killed", None),
    ];
    for (job, outcome, code) in &simple {
        wait_ready(&warm, 1).await;
        let answer = post_run(&warm, None, job).await;
        assert_eq!(answer.body["outcome"], *outcome, "{:#}", answer.body);
        assert_eq!(
            answer.body["exit_code"].as_i64(),
            *code,
            "{:#}",
            answer.body
        );
        if from_kernel {
            // The job's processes are host processes (under gVisor they are the sandbox's
            // own, never in the host's /proc).
            assert_eq!(
                host_processes_with(&tag),
                Vec::<String>::new(),
                "a process of the job outlived its reply"
            );
            kernel_ends += 1;
        } else {
            engine_ends += 1;
        }
        assert_ends(&warm, kernel_ends, engine_ends).await;
    }
    // The leading thread exits on its own (SYS_exit), another thread ends the process
    // with status 5 a moment later: the leader's exit code (0) is not the job's.
    let threaded = python(
        "import ctypes, os, platform, threading, time\n\
         threading.Thread(target=lambda: (time.sleep(0.3), os._exit(5))).start()\n\
         ctypes.CDLL(None).syscall(93 if platform.machine() == 'aarch64' else 60, 0)\n",
    );
    wait_ready(&warm, 1).await;
    let from_warm = post_run(&warm, None, &threaded).await;
    let from_cold = post_run(&cold, None, &threaded).await;
    assert_eq!(from_cold.body["exit_code"], 5, "{:#}", from_cold.body);
    assert_eq!(from_warm.body["exit_code"], 5, "{:#}", from_warm.body);
    engine_ends += 1;
    assert_ends(&warm, kernel_ends, engine_ends).await;
    stop(warm, engine);
    stop(cold, engine);
}

/// The server's `airlock_warm_pool_container_ends_total`, by where the end was learned.
async fn assert_ends(server: &Server, kernel: u64, engine: u64) {
    assert_eq!(
        (
            container_ends(server, "kernel").await,
            container_ends(server, "engine").await
        ),
        (kernel, engine),
        "(kernel, engine) ends:\n{}",
        server.log()
    );
}

/// Stops a server as an operator does (SIGTERM) and checks that it removed every container
/// it kept waiting, and their directories, before it exited. (A test that let its server
/// be killed on drop would leave them to the next airlock's sweep.)
fn stop(mut server: Server, engine: Engine) {
    let waiting = warm_containers_of(server.pid());
    server.terminate();
    assert!(
        server.wait(Duration::from_secs(60)).success(),
        "{}",
        server.log()
    );
    for sandbox in &waiting {
        assert!(
            !container_exists(engine, sandbox),
            "{sandbox} left behind:\n{}",
            server.log()
        );
        assert!(
            !Path::new("/run/airlock-docker").join(sandbox).exists(),
            "{sandbox}'s directory left behind"
        );
    }
}

async fn shutdown_removes_every_waiting_container_and_a_killed_servers_are_swept(engine: Engine) {
    let warm = engine.server(POOL, "");
    wait_ready(&warm, POOL).await;
    assert_eq!(warm_containers_of(warm.pid()).len(), POOL as usize);
    stop(warm, engine);

    // A server killed outright leaves its containers; the next airlock to connect to the
    // daemon removes them (their job directories' locks died with it).
    let mut killed = engine.server(POOL, "");
    wait_ready(&killed, POOL).await;
    let left = warm_containers_of(killed.pid());
    assert_eq!(left.len(), POOL as usize, "{left:?}");
    let pid = rustix::process::Pid::from_raw(killed.pid() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    killed.wait(Duration::from_secs(10));
    for sandbox in &left {
        assert!(
            container_exists(engine, sandbox),
            "{sandbox} gone before the sweep"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policy.toml"), engine.policy(0, "")).unwrap();
    let out = Command::new(airlock_bin())
        .args(["run", "--json", "--backend", engine.backend(), "--policy"])
        .arg(dir.path().join("policy.toml"))
        .args(["-c", "print('next')"])
        .env("AIRLOCK_STATE_DIR", dir.path())
        .env("AIRLOCK_LOG", "airlock_docker=debug,info")
        .output()
        .unwrap();
    let obs: Value = serde_json::from_slice(&out.stdout).unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(obs["stdout"], "next\n", "{obs:#}\n{log}");
    for sandbox in &left {
        // Podman may still be finishing a removal it answered as under way.
        assert!(
            eventually(10, || !container_exists(engine, sandbox)),
            "{sandbox} not swept:\n{log}"
        );
        assert!(
            !Path::new("/run/airlock-docker").join(sandbox).exists(),
            "{sandbox}'s directory not swept"
        );
    }
}

/// Waits up to `secs` for `check` to hold.
fn eventually(secs: u64, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    check()
}

/// One test per engine for each check: `suite::warm_containers::<engine>::<check>`.
macro_rules! per_engine {
    ($($check:ident),* $(,)?) => {
        per_engine!(@engine docker, Docker, $($check),*);
        per_engine!(@engine gvisor, Gvisor, $($check),*);
        per_engine!(@engine podman, Podman, $($check),*);
    };
    (@engine $module:ident, $engine:ident, $($check:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs the container engines and the test image: scripts/ci/docker.sh runs it"]
                async fn $check() {
                    let engine = super::Engine::$engine;
                    let missing = engine.missing();
                    airlock_testkit::require!(missing.is_none(), missing.unwrap_or_default());
                    super::$check(engine).await;
                }
            )*
        }
    };
}

per_engine!(
    warm_containers_see_exactly_what_fresh_ones_see,
    each_container_serves_one_job_from_its_delivery_at_normal_priority,
    a_dead_or_idle_container_is_replaced,
    shutdown_removes_every_waiting_container_and_a_killed_servers_are_swept,
    a_jobs_end_comes_from_the_kernel_and_its_status_is_the_engines,
);
