//! SIGTERM: stop accepting, refuse queued jobs, let running ones finish within the grace
//! period, kill the rest; nothing left behind.

use std::time::Duration;

use serde_json::{Value, json};

use super::common::*;
use crate::require_server;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graceful_shutdown_finishes_kills_refuses_and_leaves_nothing_behind() {
    require_server!();
    // A 60 s ceiling lets the long job run far past the grace period unless killed.
    let mut server = Server::start(Opts {
        args: [
            "--policy",
            "long.toml",
            "--max-in-flight",
            "2",
            "--queue",
            "4",
            "--shutdown-grace",
            "4s",
        ]
        .map(String::from)
        .to_vec(),
        files: vec![(
            "long.toml".into(),
            "version = \"long-1\"\n[limits]\ntimeout = \"60s\"\n".into(),
        )],
        ..Default::default()
    });
    let marker = format!("shutdown-{}", std::process::id());
    let job = |seconds: f64| {
        json!({"language": "python", "code": format!("import time; time.sleep({seconds}); print('done')"),
               "args": [marker.clone()], "timeout": "60s"})
    };
    let send = |body: Value| {
        let url = server.url("/v1/runs");
        tokio::spawn(async move {
            let response = client().post(url).json(&body).send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        })
    };
    let short = send(job(1.5));
    let long = send(job(30.0));
    wait_health(&server, |h| h["jobs_in_flight"] == 2).await;
    let queued = send(job(0.1));
    wait_health(&server, |h| h["queue_depth"] == 1).await;

    server.terminate();
    let (status, body) = queued.await.unwrap();
    assert_eq!(status, 503, "queued job: {body:#}");
    assert_eq!(body["error"]["kind"], "backend_unavailable");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        std::net::TcpStream::connect(server.addr).is_err(),
        "still accepting connections after SIGTERM"
    );
    let (status, body) = short.await.unwrap();
    assert_eq!(
        status, 200,
        "a job within the grace period finishes: {body:#}"
    );
    assert_eq!(body["stdout"], "done\n");
    let short_id = body["job_id"].as_str().unwrap().to_owned();
    let (status, body) = long.await.unwrap();
    assert_eq!(
        status, 503,
        "a job past the grace period is killed: {body:#}"
    );
    assert_eq!(body["error"]["kind"], "internal");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("server shutdown")
    );
    let exit = server.wait(Duration::from_secs(30));
    assert!(exit.success(), "{exit:?}\n{}", server.log());

    let long_id = body["job_id"].as_str().unwrap().to_owned();
    let audited: Vec<Value> = server.audit_lines();
    assert_eq!(audited.len(), 2, "{audited:#?}");
    for id in [&short_id, &long_id] {
        assert_eq!(
            audited
                .iter()
                .filter(|l| l["job_id"] == id.as_str())
                .count(),
            1,
            "{id} audited once"
        );
    }
    let audited_ids: Vec<String> = audited
        .iter()
        .map(|l| l["job_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(leftover_job_dirs(&audited_ids), Vec::<String>::new());
    assert!(host_pids_with(&marker).is_empty(), "job processes left");
}
