//! A recording executor and a newline-delimited JSON-RPC client.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_core::observation::{OutputFile, ReleasedFile};
use airlock_core::{
    BackendKind, BoxFuture, ErrorKind, JobId, JobRequest, JobResult, Observation, Outcome, Policy,
};
use airlock_mcp::Executor;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A program the fake executor "runs" for a minute (until the call is dropped).
pub const LONG_JOB: &str = "import time; time.sleep(60)";

/// How long a cancelled job may take to go away, and an answer to come: far below the fake
/// job's minute, so that a job still running after it was run out rather than cancelled,
/// and far above what a busy machine's scheduling adds (a CPU hog beside the suite
/// delayed a one-second bound here).
pub const PROMPT: Duration = Duration::from_secs(10);

/// What the fake executor saw.
#[derive(Default)]
pub struct Record {
    /// Jobs whose future is alive (started and neither finished nor dropped).
    pub running: AtomicUsize,
    /// Every request, in order.
    pub requests: Mutex<Vec<JobRequest>>,
    /// When each long job's future was dropped.
    pub dropped: Mutex<Vec<Instant>>,
}

/// An executor that runs nothing: a [`LONG_JOB`] waits a minute, anything else exits 0
/// at once with `files` released.
pub struct FakeExecutor {
    pub policy: Arc<Policy>,
    pub record: Arc<Record>,
    pub files: Vec<(OutputFile, ReleasedFile)>,
}

impl FakeExecutor {
    pub fn new(policy: Policy) -> Self {
        Self {
            policy: Arc::new(policy),
            record: Arc::new(Record::default()),
            files: Vec::new(),
        }
    }
}

/// Decrements `running` and notes the time when a long job's future goes away.
struct Alive(Arc<Record>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
        self.0.dropped.lock().unwrap().push(Instant::now());
    }
}

/// The observation of a job that printed `stdout` and exited 0.
pub fn exited(stdout: &str, files: Vec<OutputFile>) -> Observation {
    let mut o = Observation::error(
        JobId::generate(),
        BackendKind::Native,
        "test-1",
        ErrorKind::Internal,
        "",
    );
    o.ok = true;
    o.outcome = Outcome::Exited;
    o.exit_code = Some(0);
    o.error = None;
    o.stdout = stdout.to_owned();
    o.stdout_bytes = stdout.len() as u64;
    o.duration_ms = 12;
    o.files = files;
    o
}

impl Executor for FakeExecutor {
    fn policy(&self, _tenant: Option<&str>) -> Arc<Policy> {
        self.policy.clone()
    }

    /// Stands in for a server's executor: the session tools are listed where the policy
    /// enables them.
    fn keeps_sessions(&self) -> bool {
        true
    }

    fn run(&self, request: JobRequest, _tenant: Option<String>) -> BoxFuture<'_, JobResult> {
        Box::pin(async move {
            let long = request.source == LONG_JOB.as_bytes();
            self.record.requests.lock().unwrap().push(request);
            if long {
                self.record.running.fetch_add(1, Ordering::SeqCst);
                let _alive = Alive(self.record.clone());
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            let (listed, released) = self.files.iter().cloned().unzip();
            JobResult {
                observation: exited("done\n", listed),
                files: released,
                connections: Vec::new(),
            }
        })
    }
}

/// Waits until `condition` holds, up to `limit`; whether it did.
pub async fn eventually(limit: Duration, condition: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    condition()
}

/// A JSON-RPC client on a byte stream pair, one message per line.
pub struct LineClient<R, W> {
    pub reader: BufReader<R>,
    pub writer: W,
}

impl<R, W> LineClient<R, W>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    pub async fn send(&mut self, message: Value) {
        let mut line = message.to_string();
        line.push('\n');
        self.writer.write_all(line.as_bytes()).await.unwrap();
        self.writer.flush().await.unwrap();
    }

    /// The response to request `id` (messages before it are skipped), within `limit`.
    pub async fn response(&mut self, id: u64, limit: Duration) -> Value {
        tokio::time::timeout(limit, async {
            loop {
                let mut line = String::new();
                let n = self.reader.read_line(&mut line).await.unwrap();
                assert!(n > 0, "the server closed its output before answering {id}");
                let message: Value = serde_json::from_str(&line).unwrap();
                if message["id"] == id {
                    return message;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no response to request {id} within {limit:?}"))
    }

    /// `initialize` and `notifications/initialized`.
    pub async fn handshake(&mut self) {
        self.send(initialize(0)).await;
        let reply = self.response(0, Duration::from_secs(10)).await;
        assert!(
            reply["result"]["capabilities"]["tools"].is_object(),
            "{reply}"
        );
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
    }
}

pub fn initialize(id: u64) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "airlock-mcp-tests", "version": "0"}
        }
    })
}

pub fn call(id: u64, arguments: Value) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "run_code", "arguments": arguments}
    })
}

pub fn cancelled(id: u64) -> Value {
    json!({
        "jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": id, "reason": "the client gave up"}
    })
}
