//! Starting the real server, talking to it, reading its audit log.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `airlock` binary: `$AIRLOCK_BIN`, else next to the test executable's profile dir.
pub fn airlock_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("AIRLOCK_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().unwrap_or(Path::new("."));
    let profile = if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    };
    profile.join("airlock")
}

/// Returns early unless the server can run real jobs here.
#[macro_export]
macro_rules! require_server {
    () => {
        airlock_testkit::require!(
            airlock_testkit::require::is_root(),
            "the native backend needs root on this host"
        );
        airlock_testkit::require!(
            $crate::suite::common::airlock_bin().is_file(),
            format!(
                "no airlock binary at {} (run `cargo build -p airlock-cli` first, same profile and CARGO_TARGET_DIR, or set AIRLOCK_BIN)",
                $crate::suite::common::airlock_bin().display()
            )
        );
    };
}

/// A running `airlock serve` with its own state directory.
pub struct Server {
    pub dir: tempfile::TempDir,
    pub addr: SocketAddr,
    child: Child,
    pub log: Arc<Mutex<String>>,
}

/// Extra configuration of a test server.
#[derive(Default)]
pub struct Opts {
    pub args: Vec<String>,
    /// Tokens file text, written as `tokens.toml` in the state dir.
    pub tokens: Option<String>,
    /// Extra files (name, content) written in the state dir first.
    pub files: Vec<(String, String)>,
    /// `AIRLOCK_LOG` (default `info`).
    pub log_filter: Option<String>,
    /// More environment variables for the server.
    pub env: Vec<(String, String)>,
}

impl Server {
    pub fn start(opts: Opts) -> Self {
        let dir = tempfile::tempdir().unwrap();
        for (name, content) in &opts.files {
            std::fs::write(dir.path().join(name), content).unwrap();
        }
        let mut cmd = Command::new(airlock_bin());
        cmd.arg("serve").arg("--listen").arg("127.0.0.1:0");
        if let Some(tokens) = &opts.tokens {
            let path = dir.path().join("tokens.toml");
            std::fs::write(&path, tokens).unwrap();
            cmd.arg("--tokens").arg(path);
        }
        cmd.args(&opts.args)
            .current_dir(dir.path())
            .env("AIRLOCK_STATE_DIR", dir.path())
            .env("AIRLOCK_LOG", opts.log_filter.as_deref().unwrap_or("info"))
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn airlock serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listening on http://").nth(1)
                    && let Some(tx) = tx.take()
                {
                    let addr = rest.split_whitespace().next().unwrap_or("").to_owned();
                    let _ = tx.send(addr);
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(addr) => addr.parse().unwrap(),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("airlock serve did not start:\n{}", log.lock().unwrap());
            }
        };
        Self {
            dir,
            addr,
            child,
            log,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let pid = rustix::process::Pid::from_raw(self.pid() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    }

    /// Waits for the server to exit, at most `limit`.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < limit,
                "airlock serve still running after {limit:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Audit lines of the built-in policy's log (in the state dir).
    pub fn audit_lines(&self) -> Vec<Value> {
        audit_lines(&self.dir.path().join("audit.jsonl"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub fn audit_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
        .collect()
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// A run response: status, headers, JSON body.
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

pub async fn post_run(server: &Server, token: Option<&str>, body: &Value) -> Answer {
    post_raw(server, token, serde_json::to_vec(body).unwrap()).await
}

pub async fn post_raw(server: &Server, token: Option<&str>, body: Vec<u8>) -> Answer {
    let mut request = client()
        .post(server.url("/v1/runs"))
        .header("content-type", "application/json")
        .body(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("send");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("status {status}: body is not JSON ({e}): {text:?}"));
    Answer {
        status,
        headers,
        body,
    }
}

/// Posts `body` to `/v1/runs` in a task of its own: the answer's body, once it comes.
pub fn spawn_run(server: &Server, body: Value) -> tokio::task::JoinHandle<Value> {
    let url = server.url("/v1/runs");
    tokio::spawn(async move {
        client()
            .post(url)
            .json(&body)
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    })
}

/// Sends SIGKILL to `pid`; whether it was still there.
pub fn kill_pid(pid: u32) -> bool {
    rustix::process::Pid::from_raw(pid as i32).is_some_and(|pid| {
        rustix::process::kill_process(pid, rustix::process::Signal::KILL).is_ok()
    })
}

pub fn python(code: &str) -> Value {
    serde_json::json!({"language": "python", "code": code})
}

/// Asserts the DESIGN error shape with `kind`.
pub fn assert_error(answer: &Answer, status: u16, kind: &str) {
    assert_eq!(answer.status, status, "{:#}", answer.body);
    assert_eq!(answer.body["ok"], false, "{:#}", answer.body);
    assert_eq!(answer.body["outcome"], "error");
    assert_eq!(answer.body["error"]["kind"], kind, "{:#}", answer.body);
    assert!(
        answer.body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
}

/// Job directories of these jobs still in the runtime directory.
pub fn leftover_job_dirs(job_ids: &[String]) -> Vec<String> {
    job_ids
        .iter()
        .filter(|id| Path::new("/run/airlock").join(id.as_str()).exists())
        .cloned()
        .collect()
}

/// Host processes whose command line contains `needle`.
pub fn host_pids_with(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(needle)
        {
            found.push(pid);
        }
    }
    found
}

/// `airlock token new --tenant NAME`: (token, tokens-file block). The token is stdout,
/// alone; the block is on stderr, after comment lines.
pub fn new_token(tenant: &str, extra: &[&str]) -> (String, String) {
    let output = Command::new(airlock_bin())
        .args(["token", "new", "--tenant", tenant])
        .args(extra)
        .output()
        .unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    let token = stdout.trim_end().to_owned();
    assert!(
        token.starts_with("alk_") && !token.contains('\n'),
        "{stdout:?}"
    );
    let stderr = String::from_utf8(output.stderr).unwrap();
    let block = stderr[stderr.find("[tenants.").unwrap()..].to_owned();
    (token, block)
}

/// Polls `/v1/health` until `check` holds (at most 20 s).
pub async fn wait_health(server: &Server, check: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let health: Value = client()
            .get(server.url("/v1/health"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if check(&health) {
            return health;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "health never matched: {health}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The text of `/metrics` (no token).
pub async fn metrics_text(server: &Server) -> String {
    metrics_text_as(server, None).await
}

/// The text of `/metrics`, with `token` when the server has tokens.
pub async fn metrics_text_as(server: &Server, token: Option<&str>) -> String {
    let mut request = client().get(server.url("/metrics"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap().text().await.unwrap()
}

/// One series of `/metrics` (0 when absent).
pub async fn metric(server: &Server, series: &str) -> u64 {
    metric_as(server, None, series).await
}

/// One series of `/metrics` (0 when absent), asked with `token`.
pub async fn metric_as(server: &Server, token: Option<&str>, series: &str) -> u64 {
    metrics_text_as(server, token)
        .await
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Waits until the server's native pool has a zygote to fork from (asked with `token`).
pub async fn wait_for_zygote(server: &Server, token: Option<&str>) {
    let start = Instant::now();
    while metric_as(
        server,
        token,
        "airlock_warm_pool_zygote_total{result=\"started\"}",
    )
    .await
        < 1
    {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no zygote started:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the server's warm pool has `want` sandboxes ready (a gVisor container
/// takes a second to start; the bound only catches a pool that never fills).
pub async fn wait_ready(server: &Server, want: u64) {
    let start = Instant::now();
    while metric(server, "airlock_warm_pool_ready").await < want {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "the warm pool never had {want} sandboxes ready:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs a job of 2 s on `server` and reads a CPU share with `read` while it runs, until
/// it reads `normal` or the job ends: the last value read, and the job's observation.
pub async fn cpu_share_during_a_job(
    server: &Server,
    normal: &str,
    read: impl Fn() -> Option<String>,
) -> (Option<String>, Value) {
    let job = spawn_run(
        server,
        python("import time\nprint('running', flush=True)\ntime.sleep(2)\n"),
    );
    let start = Instant::now();
    let mut seen = None;
    while start.elapsed() < Duration::from_secs(2) && !job.is_finished() {
        seen = read();
        if seen.as_deref() == Some(normal) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (seen, job.await.unwrap())
}

/// Jobs that ran in a warm sandbox.
pub async fn hits(server: &Server) -> u64 {
    metric(server, "airlock_warm_pool_jobs_total{result=\"hit\"}").await
}

/// The warm pools' equivalence probe: what a job can observe about its interpreter, its `__main__`, its descriptors and its
/// container. Descriptor targets and mount options are kept with their inode numbers and
/// host paths taken out (they differ between any two containers).
pub const WARM_PROBE: &str = r#"
import fcntl, json, os, re, sys
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
def fds():
    out = []
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            target = re.sub(r"\d+", "N", os.readlink("/proc/self/fd/" + fd))
            out.append([fd, target, oct(fcntl.fcntl(int(fd), fcntl.F_GETFL))])
        except OSError as e:
            out.append([fd, e.strerror])
    return out
def mounts():
    out = []
    for line in open("/proc/self/mounts"):
        source, point, fstype, options = line.split()[:4]
        out.append([point, fstype, [o for o in options.split(",") if "/" not in o]])
    # The engines order a container's tmpfs mounts and binds as they like.
    return sorted(out)
def cgroup_files():
    out = {}
    for path in ["/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/pids/pids.max",
                 "/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.shares",
                 "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/cpu.max",
                 "/sys/fs/cgroup/cpu.weight"]:
        try:
            out[path] = open(path).read().strip()
        except OSError as e:
            out[path] = e.strerror
    return out
print(json.dumps({
    "argv": sys.argv, "orig_argv": sys.orig_argv, "name": __name__, "file": __file__,
    "doc": __doc__, "package": __package__, "spec": repr(__spec__),
    "loader": type(__loader__).__name__, "globals": sorted(globals()),
    "path": sys.path, "flags": repr(sys.flags), "modules": sorted(sys.modules),
    "env": dict(os.environ), "cwd": os.getcwd(), "ids": [os.getuid(), os.getgid(), os.getgroups()],
    "fds": fds(), "stdin": sys.stdin.read(), "umask": os.umask(0o22),
    "caps": [status(k) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")],
    "no_new_privs": status("NoNewPrivs"), "seccomp": status("Seccomp"),
    "filters": status("Seccomp_filters"), "pid": os.getpid(), "ppid": os.getppid(),
    "sid": os.getsid(0), "pgrp": os.getpgrp(),
    "procs": sorted(p for p in os.listdir("/proc") if p.isdigit() and p != str(os.getpid())),
    "rlimits": [__import__("resource").getrlimit(r) for r in range(16)],
    "hostname": os.uname().nodename, "mounts": mounts(), "cgroup": cgroup_files(),
    "work": sorted(os.listdir(".")), "tmp": sorted(os.listdir("/tmp")),
    "dev": sorted(os.listdir("/dev")), "data": open("data.txt").read(),
    "writable": [os.access(p, os.W_OK) for p in ("/", "/work", "/tmp", "/dev/shm")],
}, sort_keys=True))
"#;

/// Runs each of `cases` on a `cold` server (no pool) and on a `warm` one (each once the
/// pool has `pool` ready again) and checks that the warm job saw what the cold one did:
/// the outcome, the exit, stderr and `same` fields of the observation, and stdout; a
/// stdout that is a JSON object ([`WARM_PROBE`]'s report) is compared whole, but for the
/// `may_differ` keys and what `adjust(warm, cold)` declares may differ (it checks the
/// warm report's value and edits the reports to compare).
pub async fn assert_warm_sees_what_cold_sees(
    cold: &Server,
    warm: &Server,
    pool: u64,
    cases: &[Value],
    same: &[&str],
    may_differ: &[&str],
    adjust: impl Fn(&mut Value, &mut Value),
) {
    for (i, case) in cases.iter().enumerate() {
        let want = post_run(cold, None, case).await;
        let got = post_run(warm, None, case).await;
        assert_eq!(want.status, 200, "cold #{i}: {:#}", want.body);
        assert_eq!(got.status, 200, "warm #{i}: {:#}", got.body);
        for key in ["ok", "outcome", "exit_code", "signal", "stderr"]
            .iter()
            .chain(same)
        {
            assert_eq!(
                got.body[key], want.body[key],
                "#{i} {key}: warm {:#} cold {:#}",
                got.body, want.body
            );
        }
        let (out_warm, out_cold) = (&got.body["stdout"], &want.body["stdout"]);
        match serde_json::from_str::<Value>(out_cold.as_str().unwrap_or("")) {
            Ok(mut cold_probe) if cold_probe.is_object() => {
                let mut warm_probe: Value = serde_json::from_str(out_warm.as_str().unwrap())
                    .unwrap_or_else(|e| panic!("#{i}: {e}: {:#}", got.body));
                for key in may_differ {
                    assert!(!warm_probe[key].is_null() && !cold_probe[key].is_null());
                    warm_probe[key] = Value::Null;
                    cold_probe[key] = Value::Null;
                }
                adjust(&mut warm_probe, &mut cold_probe);
                pretty_assertions::assert_eq!(warm_probe, cold_probe, "#{i}");
            }
            _ => assert_eq!(out_warm, out_cold, "#{i}"),
        }
        // A warm job's setup happened before it was delivered.
        assert!(got.body["duration_ms"].as_u64().is_some(), "{:#}", got.body);
        wait_ready(warm, pool).await;
    }
    assert_eq!(hits(warm).await, cases.len() as u64, "{}", warm.log());
    assert_eq!(
        metric(warm, "airlock_warm_pool_jobs_total{result=\"miss\"}").await,
        0
    );
    assert_eq!(metric(cold, "airlock_warm_pool_ready").await, 0);
}

/// Runs on `warm` jobs its pool does not fit (other limits, another language, and
/// `extra`), each printing `1`, checks they ran in fresh sandboxes (counted unfit, no
/// hit), and that a 128 MiB limit is really the job's.
pub async fn assert_unfit_jobs_run_fresh(warm: &Server, extra: &[Value]) {
    let hits_before = hits(warm).await;
    let mut unfit = vec![
        serde_json::json!({"language": "python", "code": "print(1)", "memory": "128MiB"}),
        serde_json::json!({"language": "python", "code": "print(1)", "pids": 8}),
        serde_json::json!({"language": "sh", "code": "echo 1"}),
    ];
    unfit.extend_from_slice(extra);
    for case in &unfit {
        let answer = post_run(warm, None, case).await;
        assert_eq!(answer.body["outcome"], "exited", "{:#}", answer.body);
        assert_eq!(answer.body["stdout"], "1\n", "{:#}", answer.body);
    }
    assert_eq!(hits(warm).await, hits_before);
    assert_eq!(
        metric(warm, "airlock_warm_pool_jobs_total{result=\"unfit\"}").await,
        unfit.len() as u64
    );
    // The 128 MiB limit is really the job's: it is not a warm sandbox with the default.
    let big = post_run(
        warm,
        None,
        &serde_json::json!({"language": "python", "code": "b = bytearray(200 << 20)\nprint('no')", "memory": "128MiB"}),
    )
    .await;
    assert_eq!(big.body["outcome"], "oom", "{:#}", big.body);
}

/// A job leaves a module attribute and files in `/tmp` (and `/work` where it may write)
/// on `warm`; the next, sent once the pool has `pool` ready again and after waiting
/// longer than the 3 s limit of the warm tests' policies (which the job must not pay),
/// finds none of it: each warm sandbox serves one job.
pub async fn assert_nothing_carries_to_the_next_job(warm: &Server, pool: u64) {
    let leave = post_run(
        warm,
        None,
        &python("import builtins, os\nbuiltins.left_behind = 1\nopen('/tmp/marker', 'w').write('x')\nopen('/work/marker', 'w').write('x') if os.access('/work', os.W_OK) else None\nprint('wrote')\n"),
    )
    .await;
    assert_eq!(leave.body["outcome"], "exited", "{:#}", leave.body);
    assert_eq!(leave.body["stdout"], "wrote\n", "{:#}", leave.body);
    wait_ready(warm, pool).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let look = post_run(
        warm,
        None,
        &python("import builtins, os\nprint(hasattr(builtins, 'left_behind'), os.path.exists('/tmp/marker'), os.path.exists('/work/marker'), sorted(os.listdir('/work')))\n"),
    )
    .await;
    assert_eq!(look.body["outcome"], "exited", "{:#}", look.body);
    assert_eq!(
        look.body["stdout"], "False False False ['.airlock-main.py']\n",
        "{:#}",
        look.body
    );
}
