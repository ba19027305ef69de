//! `airlock mcp` driven as an MCP client drives it (newline-delimited JSON-RPC on the
//! child's stdin and stdout), with real jobs: a call the client gives up on kills its job
//! and frees its slot at once; `return_files` brings `/out` files back intact.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::common::{TestEnv, host_pids_with, marker};
use crate::require_native;

/// How soon after the client gives up the job must be gone.
const PROMPT: Duration = Duration::from_secs(1);

/// A policy whose wall time is long enough that a job killed early cannot be confused
/// with one that ran out.
const MINUTE_JOBS: &str = "[limits]\ntimeout = \"60s\"";

/// `airlock mcp` with one job slot, and the lines it writes.
struct McpChild {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl McpChild {
    fn start(env: &TestEnv, policy_body: &str) -> Self {
        let policy = env.policy(policy_body);
        let mut child = env
            .cmd()
            .args(["mcp", "--max-in-flight", "1", "--policy"])
            .arg(&policy)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn airlock mcp");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut mcp = Self {
            stdin: child.stdin.take(),
            child,
            lines,
        };
        mcp.send(&json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "airlock-cli-tests", "version": "0"}}
        }));
        let reply = mcp.response(0, Duration::from_secs(20));
        assert!(
            reply["result"]["capabilities"]["tools"].is_object(),
            "{reply}"
        );
        mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        mcp
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    }

    fn call(&mut self, id: u64, arguments: Value) {
        self.send(&json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "run_code", "arguments": arguments}
        }));
    }

    /// The response to request `id`, within `limit`.
    fn response(&mut self, id: u64, limit: Duration) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("no response to {id} within {limit:?}: {e}"));
            let message: Value = serde_json::from_str(&line).expect("stdout carries JSON-RPC");
            if message["id"] == id {
                return message;
            }
        }
    }
}

impl Drop for McpChild {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    check()
}

/// A job that becomes a process carrying `tag` on its command line and sleeps.
fn long_job(tag: &str) -> String {
    format!(
        "import os\nos.execvp('python3', ['python3', '-c', 'import time; time.sleep(1000)', {tag:?}])"
    )
}

/// Waits until the job carrying `tag` runs; its directory under /run/airlock (named as
/// the job's cgroup: its /work is a tmpfs mounted nowhere on the host, so the directory
/// holds none of its source).
fn wait_for_job(tag: &str) -> std::path::PathBuf {
    let mut dir = None;
    assert!(
        eventually(Duration::from_secs(20), || {
            dir = airlock_testkit::job_dir_of(
                std::path::Path::new("/run/airlock"),
                &host_pids_with(tag),
            );
            dir.is_some()
        }),
        "the long job never started"
    );
    dir.unwrap_or_default()
}

#[test]
fn a_cancelled_mcp_call_kills_its_job_and_frees_its_slot() {
    require_native!();
    let env = TestEnv::new();
    let mut mcp = McpChild::start(&env, MINUTE_JOBS);
    let tag = marker("mcp-cancel");
    mcp.call(1, json!({"code": long_job(&tag)}));
    let job_dir = wait_for_job(&tag);

    let cancelled_at = Instant::now();
    mcp.send(&json!({
        "jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 1, "reason": "the client gave up"}
    }));
    assert!(
        eventually(PROMPT, || host_pids_with(&tag).is_empty()),
        "job processes still alive {PROMPT:?} after the call was cancelled"
    );
    // With the only slot still held, this call would wait out the first job's minute.
    mcp.call(2, json!({"code": "print('next')"}));
    let reply = mcp.response(2, Duration::from_secs(10));
    assert_eq!(
        reply["result"]["structuredContent"]["stdout"], "next\n",
        "{reply}"
    );
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(10),
        "the next call took {:?}",
        cancelled_at.elapsed()
    );
    assert!(!job_dir.exists(), "{} left behind", job_dir.display());
    // The killed job is audited, as an error rather than a run to its limit.
    let audit = env.audit_lines();
    assert_eq!(audit.len(), 2, "{audit:#?}");
    assert_eq!(audit[0]["outcome"], "error", "{:#}", audit[0]);
    assert!(
        audit[0]["total_ms"].as_u64().unwrap() < 30_000,
        "{:#}",
        audit[0]
    );
}

#[test]
fn a_client_that_exits_mid_call_takes_its_job_along() {
    require_native!();
    let env = TestEnv::new();
    let mut mcp = McpChild::start(&env, MINUTE_JOBS);
    let tag = marker("mcp-eof");
    mcp.call(1, json!({"code": long_job(&tag)}));
    let job_dir = wait_for_job(&tag);

    let closed_at = Instant::now();
    drop(mcp.stdin.take());
    assert!(
        eventually(PROMPT, || host_pids_with(&tag).is_empty()),
        "job processes still alive {PROMPT:?} after the client closed stdin"
    );
    assert!(
        eventually(Duration::from_secs(3), || mcp
            .child
            .try_wait()
            .unwrap()
            .is_some()),
        "airlock mcp still running {:?} after its client left",
        closed_at.elapsed()
    );
    assert!(!job_dir.exists(), "{} left behind", job_dir.display());
    assert_eq!(env.audit_lines().len(), 1);
}

/// Writes 256 bytes of every value and a text file to /out, printing the bytes' sha256.
const OUT_JOB: &str = "import hashlib\n\
    data = bytes(range(256))\n\
    open('/out/data.bin', 'wb').write(data)\n\
    open('/out/big.txt', 'w').write('x' * 5000)\n\
    print(hashlib.sha256(data).hexdigest())";

fn decoded(file: &Value) -> Option<Vec<u8>> {
    file.get("content_base64").map(|b64| {
        base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap()
    })
}

#[test]
fn return_files_over_mcp_brings_out_files_back_intact() {
    require_native!();
    let env = TestEnv::new();
    // A cap that holds data.bin (256 B) but not big.txt (5000 B).
    let mut mcp = McpChild::start(&env, "[filesystem.out]\nmcp_inline_bytes = \"1KiB\"");
    mcp.call(
        1,
        json!({"code": OUT_JOB, "return_files": true, "language": null, "files": null}),
    );
    let reply = mcp.response(1, Duration::from_secs(30));
    let obs = &reply["result"]["structuredContent"];
    assert_eq!(obs["ok"], true, "{reply:#}");
    let files = obs["files"].as_array().unwrap();
    let by_path = |path: &str| files.iter().find(|f| f["path"] == path).unwrap();
    let data = by_path("data.bin");
    assert_eq!(decoded(data), Some((0..=255).collect::<Vec<u8>>()));
    assert_eq!(data["sha256"], obs["stdout"].as_str().unwrap().trim());
    let big = by_path("big.txt");
    assert_eq!(big["bytes"], 5000);
    assert_eq!(decoded(big), None, "past the cap, listed only");

    // Without return_files there is no /out to write to.
    mcp.call(2, json!({"code": OUT_JOB}));
    let reply = mcp.response(2, Duration::from_secs(30));
    let obs = &reply["result"]["structuredContent"];
    assert_eq!(obs["ok"], false, "{reply:#}");
    assert_eq!(obs["files"], json!([]));
}

#[test]
fn the_tool_lists_its_output_schema() {
    let env = TestEnv::new();
    let mut mcp = McpChild::start(&env, "");
    mcp.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}));
    let reply = mcp.response(1, Duration::from_secs(10));
    let tool = &reply["result"]["tools"][0];
    assert_eq!(tool["name"], "run_code");
    assert_eq!(tool["outputSchema"]["type"], "object");
    assert_eq!(tool["inputSchema"]["required"], json!(["code"]));
    // The same document `airlock tool-schema --format mcp` prints.
    let printed = env
        .cmd()
        .args(["tool-schema", "--format", "mcp", "--policy"])
        .arg(env.policy(""))
        .output()
        .unwrap();
    let printed: Value = serde_json::from_slice(&printed.stdout).unwrap();
    assert_eq!(&printed, tool);
}
