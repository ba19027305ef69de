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
