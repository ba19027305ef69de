//! MCP tasks over a real rmcp session: a client that declares the tasks extension gets a
//! task for a long call, polls it, and cancelling it drops (kills) its job.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use airlock_core::Policy;
use serde_json::{Value, json};
use tokio::io::BufReader;

use super::common::{FakeExecutor, LONG_JOB, LineClient, PROMPT, call, eventually};

const TASKS: &str = "io.modelcontextprotocol/tasks";

fn policy(task_after: Duration) -> Policy {
    let mut policy = Policy::builtin();
    policy.mcp.task_after = task_after;
    policy.mcp.tasks_per_tenant = 2;
    policy
}

type Client = LineClient<tokio::io::DuplexStream, tokio::io::DuplexStream>;

/// A stdio server whose client declared (or not) the tasks extension at `initialize`.
async fn client(executor: Arc<FakeExecutor>, declares_tasks: bool) -> Client {
    let (client_out, server_in) = tokio::io::duplex(1 << 16);
    let (server_out, client_in) = tokio::io::duplex(1 << 16);
    tokio::spawn(airlock_mcp::serve_io(executor, server_in, server_out));
    let mut client = LineClient {
        reader: BufReader::new(client_in),
        writer: client_out,
    };
    let capabilities = if declares_tasks {
        json!({"extensions": {TASKS: {}}})
    } else {
        json!({})
    };
    client
        .send(json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": capabilities,
                "clientInfo": {"name": "airlock-mcp-tests", "version": "0"}
            }
        }))
        .await;
    let reply = client.response(0, Duration::from_secs(10)).await;
    assert!(
        reply["result"]["capabilities"]["extensions"][TASKS].is_object(),
        "the server does not advertise the tasks extension: {reply}"
    );
    client
        .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    client
}

fn request(id: u64, method: &str, task_id: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {"taskId": task_id}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_call_becomes_a_task_that_cancel_kills() {
    let executor = Arc::new(FakeExecutor::new(policy(Duration::from_millis(200))));
    let record = executor.record.clone();
    let mut client = client(executor, true).await;

    client.send(call(1, json!({"code": LONG_JOB}))).await;
    let created = client.response(1, Duration::from_secs(10)).await;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    assert_eq!(created["result"]["status"], "working", "{created}");
    let task_id = created["result"]["taskId"].as_str().unwrap().to_owned();
    assert_eq!(record.running.load(Ordering::SeqCst), 1);

    client.send(request(2, "tasks/get", &task_id)).await;
    let got = client.response(2, PROMPT).await;
    assert_eq!(got["result"]["status"], "working", "{got}");
    assert_eq!(got["result"]["resultType"], "complete", "{got}");

    client.send(request(3, "tasks/get", "no-such-task")).await;
    let unknown = client.response(3, PROMPT).await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");

    client.send(request(4, "tasks/cancel", &task_id)).await;
    let ack = client.response(4, PROMPT).await;
    assert!(ack["result"].is_object(), "{ack}");
    assert!(
        eventually(PROMPT, || record.running.load(Ordering::SeqCst) == 0).await,
        "the cancelled task's job was still running after {PROMPT:?}"
    );
    client.send(request(5, "tasks/get", &task_id)).await;
    let got = client.response(5, PROMPT).await;
    assert_eq!(got["result"]["status"], "cancelled", "{got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_completes_with_the_plain_calls_result_and_the_bound_refuses() {
    // task_after 0: every call of a declaring client is a task.
    let executor = Arc::new(FakeExecutor::new(policy(Duration::ZERO)));
    let mut client = client(executor.clone(), true).await;
    let mut plain = client_without_tasks(executor.clone()).await;

    client.send(call(1, json!({"code": "print(1)"}))).await;
    let created = client.response(1, Duration::from_secs(10)).await;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let task_id = created["result"]["taskId"].as_str().unwrap().to_owned();
    // Polled until it completes: a count of polls would be a time bound in disguise, which
    // a busy machine overruns.
    let mut completed = Value::Null;
    let polling = std::time::Instant::now();
    for id in 10.. {
        client.send(request(id, "tasks/get", &task_id)).await;
        let got = client.response(id, PROMPT).await;
        if got["result"]["status"] == "completed" {
            completed = got;
            break;
        }
        if polling.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let result = &completed["result"]["result"];
    plain.send(call(2, json!({"code": "print(1)"}))).await;
    let direct = plain.response(2, Duration::from_secs(10)).await;
    let direct = &direct["result"];
    assert_eq!(
        result["structuredContent"]["stdout"], "done\n",
        "{completed}"
    );
    assert_eq!(result["isError"], direct["isError"]);
    // The same result but for the job's own id (in the text too), and the 2026-07-28
    // `resultType` the task's result carries (this plain client speaks 2025-11-25).
    let shape = |v: &Value| {
        let mut v = v.clone();
        v["structuredContent"]["job_id"] = Value::Null;
        v["content"] = Value::Null;
        if let Some(object) = v.as_object_mut() {
            object.remove("resultType");
        }
        v
    };
    assert_eq!(shape(result), shape(direct), "{result}\n{direct}");

    // Two tasks held (the first, kept after it ended, and one running): the third is
    // refused before anything runs.
    client.send(call(3, json!({"code": LONG_JOB}))).await;
    let second = client.response(3, Duration::from_secs(10)).await;
    assert_eq!(second["result"]["resultType"], "task", "{second}");
    // A task is answered before its job starts: counted once the second task's job is
    // there (calls 1, 2 and 3), so that the refused call's count is the only one left.
    let requests = || executor.record.requests.lock().unwrap().len();
    assert!(
        eventually(PROMPT, || requests() == 3).await,
        "the second task's job never started: {} requests",
        requests()
    );
    let before = requests();
    client.send(call(4, json!({"code": "print(1)"}))).await;
    let refused = client.response(4, Duration::from_secs(10)).await;
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    let error = &refused["result"]["structuredContent"]["error"];
    assert_eq!(error["kind"], "policy_denied", "{refused}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("tasks_per_tenant"),
        "{refused}"
    );
    assert_eq!(executor.record.requests.lock().unwrap().len(), before);
}

async fn client_without_tasks(executor: Arc<FakeExecutor>) -> Client {
    client(executor, false).await
}
