//! `POST /v1/runs?stream=true`: output chunks as they come, then the observation.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::common::*;
use crate::require_server;

/// Reads a whole SSE answer: (event, data) pairs, with the time each arrived.
async fn read_events(response: reqwest::Response) -> Vec<(String, Value, Duration)> {
    let start = Instant::now();
    let mut response = response;
    let mut buffer = String::new();
    let mut events = Vec::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let mut event = String::new();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    event = v.to_owned();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            if !event.is_empty() {
                events.push((event, serde_json::from_str(&data).unwrap(), start.elapsed()));
            }
        }
    }
    events
}

#[tokio::test]
async fn chunks_arrive_as_written_then_the_observation() {
    require_server!();
    let server = Server::start(Opts::default());
    let code = "import sys, time\nfor i in range(4):\n    print(f'line {i}', flush=True)\n    print(f'err {i}', file=sys.stderr, flush=True)\n    time.sleep(0.3)\n";
    let response = client()
        .post(server.url("/v1/runs?stream=true"))
        .json(&json!({"language": "python", "code": code}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = read_events(response).await;
    let (last, observation, finished) = events.last().unwrap().clone();
    assert_eq!(last, "observation");
    assert_eq!(observation["ok"], true);
    let chunks = &events[..events.len() - 1];
    assert!(
        chunks
            .iter()
            .all(|(e, _, _)| e == "stdout" || e == "stderr")
    );
    let text = |stream: &str| -> String {
        chunks
            .iter()
            .filter(|(e, _, _)| e == stream)
            .map(|(_, d, _)| d["text"].as_str().unwrap())
            .collect()
    };
    assert_eq!(text("stdout"), observation["stdout"].as_str().unwrap());
    assert_eq!(text("stderr"), observation["stderr"].as_str().unwrap());
    assert_eq!(text("stdout"), "line 0\nline 1\nline 2\nline 3\n");
    // Streamed, not buffered: the first chunk came well before the end.
    let (_, _, first) = &chunks[0];
    assert!(
        finished.saturating_sub(*first) >= Duration::from_millis(600),
        "first chunk at {first:?}, end at {finished:?}"
    );
    assert_eq!(server.audit_lines().len(), 1);
}

#[tokio::test]
async fn a_refused_streamed_request_is_a_plain_json_error() {
    require_server!();
    let server = Server::start(Opts::default());
    let response = client()
        .post(server.url("/v1/runs?stream=true"))
        .json(&json!({"language": "python", "code": "1", "memory": "2GiB"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 403);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["kind"], "policy_denied");
    let response = client()
        .post(server.url("/v1/runs?stream=maybe"))
        .json(&python("1"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);
}

/// A streamed run with `return_files` gets the files inline in its final observation.
#[tokio::test]
async fn a_streamed_run_returns_its_files_in_the_observation() {
    require_server!();
    let server = Server::start(Opts::default());
    let response = client()
        .post(server.url("/v1/runs?stream=true"))
        .json(&json!({
            "code": "print('writing')\nopen('/out/r.bin', 'wb').write(bytes([0, 255, 10]))",
            "return_files": true
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let events = read_events(response).await;
    let (last, observation, _) = events.last().unwrap().clone();
    assert_eq!(last, "observation");
    assert_eq!(observation["ok"], true, "{observation:#}");
    assert_eq!(observation["files"][0]["path"], "r.bin");
    assert_eq!(
        observation["files"][0]["content_base64"], "AP8K",
        "{observation:#}"
    );
}
