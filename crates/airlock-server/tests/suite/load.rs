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
    // Replies do not wait for their sandboxes' removal; the server is idle once it is done.
    wait_health(&server, |h| h["jobs_in_flight"] == 0).await;
    assert_eq!(leftover_job_dirs(&ids), Vec::<String>::new());
}

/// Whether `word` has the shape of a job id (a UUID: 8-4-4-4-12 lowercase hex).
fn is_job_id(word: &str) -> bool {
    let groups: Vec<&str> = word.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Issue 19 finding 10: under concurrent clients, a log line inside a job carries that
/// job's span only, never another job's nested around it (a span held entered across an
/// await leaks into whatever the thread runs next).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_log_line_carries_its_own_job_s_span_only() {
    require_server!();
    const JOBS: usize = 24;
    const CLIENTS: usize = 8;
    let server = Server::start(Opts {
        args: ["--queue", "100", "--max-in-flight", "8"]
            .map(String::from)
            .to_vec(),
        log_filter: Some("debug".into()),
        ..Default::default()
    });
    let next = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let url = server.url("/v1/runs");
        let next = next.clone();
        clients.push(tokio::spawn(async move {
            let http = client();
            let mut ids = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < JOBS {
                let obs: serde_json::Value = http
                    .post(&url)
                    .json(&json!({"language": "sh", "code": "sleep 0.05; echo x"}))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                assert_eq!(obs["ok"], true, "{obs:#}");
                ids.push(obs["job_id"].as_str().unwrap().to_owned());
            }
            ids
        }));
    }
    let mut ids = BTreeSet::new();
    for c in clients {
        ids.extend(c.await.unwrap());
    }
    assert_eq!(ids.len(), JOBS);
    // Sandboxes are removed after the replies, with log lines of their own.
    wait_health(&server, |h| h["jobs_in_flight"] == 0).await;
    // The last lines of a job may still be on their way through the pipe.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let log = server.log();
    let mut spanned: BTreeSet<String> = BTreeSet::new();
    for line in log.lines() {
        let spans = line.matches("job{job_id=").count();
        assert!(spans <= 1, "a line nested in {spans} job spans: {line}");
        let mentioned: BTreeSet<&str> = line
            .split(|c: char| !(c.is_ascii_hexdigit() || c == '-'))
            .filter(|w| is_job_id(w))
            .collect();
        if spans == 1 {
            let own = line
                .split("job{job_id=")
                .nth(1)
                .and_then(|rest| rest.split([' ', '}']).next())
                .unwrap();
            assert!(is_job_id(own), "{line}");
            assert_eq!(
                mentioned,
                BTreeSet::from([own]),
                "a job's line names another job: {line}"
            );
            spanned.insert(own.to_owned());
        } else if !mentioned.is_empty() {
            // Outside a job span only the request's summary names its job.
            assert!(
                line.contains(" run ") && mentioned.len() == 1,
                "a line about a job outside its span: {line}"
            );
        }
    }
    assert_eq!(spanned, ids, "every job logged inside its own span");
}
