//! Many jobs from concurrent clients: every one answered, none lost or duplicated.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;

use super::common::*;
use crate::require_server;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_jobs_from_eight_clients_are_each_answered_and_audited_once() {
    require_server!();
    const JOBS: usize = 100;
    const CLIENTS: usize = 8;
    let server = Server::start(Opts {
        args: ["--queue", "100"].map(String::from).to_vec(),
        ..Default::default()
    });
    let next = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let url = server.url("/v1/runs");
        let next = next.clone();
        clients.push(tokio::spawn(async move {
            // One connection per client, reused (keep-alive).
            let http = client();
            let mut answers = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= JOBS {
                    break;
                }
                let response = http
                    .post(&url)
                    .json(&json!({"language": "sh", "code": format!("echo job-{n}")}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status().as_u16(), 200);
                let obs: serde_json::Value = response.json().await.unwrap();
                answers.push((n, obs));
            }
            answers
        }));
    }
    let mut by_job: BTreeMap<usize, String> = BTreeMap::new();
    let mut ids = BTreeSet::new();
    for c in clients {
        for (n, obs) in c.await.unwrap() {
            assert_eq!(obs["ok"], true, "{obs:#}");
            assert_eq!(obs["stdout"], format!("job-{n}\n"), "answers crossed");
            let id = obs["job_id"].as_str().unwrap().to_owned();
            assert!(ids.insert(id.clone()), "job id {id} answered twice");
            assert!(by_job.insert(n, id).is_none(), "job {n} answered twice");
        }
    }
    assert_eq!(by_job.len(), JOBS, "lost answers");
    let audited: Vec<String> = server
        .audit_lines()
        .iter()
        .map(|l| l["job_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(audited.len(), JOBS, "audit lines");
    let audited_set: BTreeSet<String> = audited.iter().cloned().collect();
    assert_eq!(audited_set.len(), JOBS, "a job id audited twice");
    assert_eq!(audited_set, ids, "audit log and answers differ");
    let ids: Vec<String> = ids.into_iter().collect();
    assert_eq!(leftover_job_dirs(&ids), Vec::<String>::new());
}
