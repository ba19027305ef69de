#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The A2A agent against an executor that records its jobs: a message becomes a job, its
//! result the task's artifacts; a task is its tenant's alone; CancelTask drops (kills) the
//! job.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_a2a::{A2aAgent, codes};
use airlock_core::observation::{OutputFile, ReleasedFile};
use airlock_core::{
    BackendKind, BoxFuture, ErrorKind, JobId, JobRequest, JobResult, Observation, Outcome, Policy,
};
use airlock_mcp::Executor;
use serde_json::{Value, json};

const LONG: &str = "sleep forever";

#[derive(Default)]
struct Record {
    sources: Mutex<Vec<String>>,
    tenants: Mutex<Vec<Option<String>>>,
    running: AtomicUsize,
}

struct Fake {
    policy: Arc<Policy>,
    record: Arc<Record>,
}

struct Alive(Arc<Record>);
impl Drop for Alive {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Executor for Fake {
    fn policy(&self, _tenant: Option<&str>) -> Arc<Policy> {
        self.policy.clone()
    }
    fn run(&self, request: JobRequest, tenant: Option<String>) -> BoxFuture<'_, JobResult> {
        Box::pin(async move {
            let source = String::from_utf8_lossy(&request.source).into_owned();
            self.record.sources.lock().unwrap().push(source.clone());
            self.record.tenants.lock().unwrap().push(tenant);
            if source == LONG {
                self.record.running.fetch_add(1, Ordering::SeqCst);
                let _alive = Alive(self.record.clone());
                tokio::time::sleep(Duration::from_secs(600)).await;
            }
            let mut o = Observation::error(
                JobId::generate(),
                BackendKind::Native,
                "v",
                ErrorKind::Internal,
                "",
            );
            o.ok = true;
            o.outcome = Outcome::Exited;
            o.exit_code = Some(0);
            o.error = None;
            o.stdout = "45\n".to_owned();
            let files = if request.out {
                o.files = vec![OutputFile {
                    path: "r.txt".to_owned(),
                    bytes: 2,
                    sha256: "0".repeat(64),
                    media_type: "text/plain".to_owned(),
                    redactions: 0,
                    content_base64: None,
                }];
                vec![ReleasedFile {
                    path: "r.txt".to_owned(),
                    content: b"hi".to_vec(),
                }]
            } else {
                Vec::new()
            };
            JobResult {
                observation: o,
                files,
                connections: Vec::new(),
            }
        })
    }
}

fn agent() -> (A2aAgent, Arc<Record>) {
    let record = Arc::new(Record::default());
    let fake = Fake {
        policy: Arc::new(Policy::builtin()),
        record: record.clone(),
    };
    (A2aAgent::new(Arc::new(fake), true, 1 << 20), record)
}

fn send(code: &str, immediately: bool) -> Value {
    json!({"jsonrpc": "2.0", "id": "1", "method": "SendMessage", "params": {
        "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": code}]},
        "configuration": {"returnImmediately": immediately},
    }})
}

fn artifact<'a>(task: &'a Value, id: &str) -> &'a Value {
    task["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["artifactId"] == id)
        .unwrap_or(&Value::Null)
}

#[tokio::test]
async fn a_message_runs_as_a_job_and_its_result_is_the_task_s_artifacts() {
    let (agent, record) = agent();
    let answer = agent
        .handle(&send("print(sum(range(10)))", false), Some("t1".to_owned()))
        .await
        .unwrap();
    let task = &answer["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task:#}");
    assert_eq!(
        *record.sources.lock().unwrap(),
        vec!["print(sum(range(10)))".to_owned()]
    );
    assert_eq!(*record.tenants.lock().unwrap(), vec![Some("t1".to_owned())]);
    assert_eq!(artifact(task, "stdout")["parts"][0]["text"], "45\n");
    assert_eq!(
        artifact(task, "observation")["parts"][0]["data"]["ok"],
        true
    );
    // A text part's job gets /out, and its files come back as raw parts.
    assert_eq!(artifact(task, "out/r.txt")["parts"][0]["raw"], "aGk=");
    assert_eq!(artifact(task, "out/r.txt")["parts"][0]["filename"], "r.txt");
    let id = task["id"].as_str().unwrap();
    let again = agent
        .handle(
            &json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": id}}),
            Some("t1".to_owned()),
        )
        .await
        .unwrap();
    assert_eq!(&again, task);
    // Another tenant does not see it.
    let other = agent
        .handle(
            &json!({"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": {"id": id}}),
            Some("t2".to_owned()),
        )
        .await
        .unwrap_err();
    assert_eq!(other.code, codes::TASK_NOT_FOUND);
}

#[tokio::test]
async fn a_data_part_is_the_run_request_and_a_bad_one_is_invalid_params() {
    let (agent, record) = agent();
    let message = |data: Value| {
        json!({"method": "SendMessage", "params": {"message": {
        "messageId": "m", "role": "ROLE_USER", "parts": [{"data": data}]}}})
    };
    let answer = agent
        .handle(&message(json!({"code": "1", "language": "python"})), None)
        .await
        .unwrap();
    assert_eq!(answer["task"]["status"]["state"], "TASK_STATE_COMPLETED");
    assert!(
        artifact(&answer["task"], "out/r.txt").is_null(),
        "no /out without return_files"
    );
    let error = agent
        .handle(&message(json!({"code": "1", "network": "on"})), None)
        .await
        .unwrap_err();
    assert_eq!(error.code, codes::INVALID_PARAMS);
    assert!(error.message.contains("network"), "{error:?}");
    assert_eq!(record.sources.lock().unwrap().len(), 1);
    let none = json!({"method": "SendMessage", "params": {"message": {"messageId": "m", "parts": [{"url": "http://x"}]}}});
    assert_eq!(
        agent.handle(&none, None).await.unwrap_err().code,
        codes::CONTENT_TYPE_NOT_SUPPORTED
    );
}

#[tokio::test]
async fn cancel_task_kills_the_job() {
    let (agent, record) = agent();
    let answer = agent.handle(&send(LONG, true), None).await.unwrap();
    let id = answer["task"]["id"].as_str().unwrap().to_owned();
    assert_eq!(answer["task"]["status"]["state"], "TASK_STATE_WORKING");
    for _ in 0..500 {
        if record.running.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        record.running.load(Ordering::SeqCst),
        1,
        "the job never started"
    );
    let cancel = json!({"method": "CancelTask", "params": {"id": id}});
    let elsewhere = agent
        .handle(&cancel, Some("other".to_owned()))
        .await
        .unwrap_err();
    assert_eq!(elsewhere.code, codes::TASK_NOT_FOUND);
    let cancelled = agent.handle(&cancel, None).await.unwrap();
    assert_eq!(cancelled["status"]["state"], "TASK_STATE_CANCELED");
    for _ in 0..500 {
        if record.running.load(Ordering::SeqCst) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        record.running.load(Ordering::SeqCst),
        0,
        "the job's future was not dropped"
    );
    let twice = agent.handle(&cancel, None).await.unwrap_err();
    assert_eq!(twice.code, codes::TASK_NOT_CANCELABLE);
}

#[test]
fn the_card_names_the_endpoint_the_skill_and_the_auth() {
    let card = airlock_a2a::card::agent_card("http://h:1/a2a", &Policy::builtin(), true);
    assert_eq!(card["supportedInterfaces"][0]["url"], "http://h:1/a2a");
    assert_eq!(card["supportedInterfaces"][0]["protocolBinding"], "JSONRPC");
    assert_eq!(card["supportedInterfaces"][0]["protocolVersion"], "1.0");
    assert_eq!(card["skills"].as_array().unwrap().len(), 1);
    assert_eq!(card["skills"][0]["id"], "run_code");
    assert_eq!(
        card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"],
        "Bearer"
    );
    let open = airlock_a2a::card::agent_card("http://h:1/a2a", &Policy::builtin(), false);
    assert!(open.get("securitySchemes").is_none());
}
