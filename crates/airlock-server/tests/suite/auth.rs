//! Bearer tokens, tenants, their policies and limits.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::common::*;
use crate::require_server;

struct Tenants {
    server: Server,
    alice: String,
    bob: String,
}

/// alice: the server's policy, at most 1 job at once; bob: his own policy (1 s ceiling).
fn start() -> Tenants {
    let (alice, alice_block) = new_token("alice", &["--max-in-flight", "1"]);
    let (bob, bob_block) = new_token("bob", &["--policy", "bob.toml"]);
    let server = Server::start(Opts {
        tokens: Some(format!("{alice_block}\n{bob_block}")),
        files: vec![(
            "bob.toml".into(),
            "version = \"bob-1\"\n[limits]\ntimeout = \"1s\"\n[audit]\npath = \"bob-audit.jsonl\"\n"
                .into(),
        )],
        args: ["--max-in-flight", "4"].map(String::from).to_vec(),
        ..Default::default()
    });
    Tenants { server, alice, bob }
}

#[tokio::test]
async fn missing_or_wrong_tokens_are_401_and_tokens_map_to_tenants() {
    require_server!();
    let t = start();
    let job = python("print('hi')");
    let missing = post_run(&t.server, None, &job).await;
    assert_error(&missing, 401, "unauthorized");
    assert_eq!(missing.headers["www-authenticate"], "Bearer");
    // Issue 30: the 401 says how a token is made.
    let message = missing.body["error"]["message"].as_str().unwrap();
    assert!(message.contains("airlock token new"), "{message}");
    let wrong = post_run(&t.server, Some("alk_not-a-token"), &job).await;
    assert_error(&wrong, 401, "unauthorized");
    // The digest in the file is not a token either.
    let tokens_file = std::fs::read_to_string(t.server.dir.path().join("tokens.toml")).unwrap();
    let digest = tokens_file
        .split('"')
        .find(|s| s.starts_with("sha256:"))
        .unwrap();
    assert_error(
        &post_run(&t.server, Some(digest), &job).await,
        401,
        "unauthorized",
    );
    // Every protected route, MCP included, answers the same 401 body.
    for (method, path) in [
        (reqwest::Method::GET, "/v1/tool-schema"),
        (reqwest::Method::GET, "/metrics"),
        (reqwest::Method::GET, "/mcp"),
        (reqwest::Method::POST, "/mcp"),
    ] {
        let response = client()
            .request(method.clone(), t.server.url(path))
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body: Value = response.json().await.unwrap();
        let answer = Answer {
            status,
            headers,
            body,
        };
        assert_error(&answer, 401, "unauthorized");
        assert_eq!(
            answer.headers["www-authenticate"], "Bearer",
            "{method} {path}"
        );
    }
    // Health and the API document need no token.
    for path in ["/v1/health", "/v1/openapi.json"] {
        let status = client()
            .get(t.server.url(path))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status.as_u16(), 200, "{path}");
    }

    // With tokens, real host names and any Origin work (a page has no token); bodies
    // must still be JSON.
    let named = client()
        .post(t.server.url("/v1/runs"))
        .bearer_auth(&t.alice)
        .header("host", "airlock.internal.example")
        .header("origin", "https://app.example")
        .json(&job)
        .send()
        .await
        .unwrap();
    assert_eq!(named.status().as_u16(), 200);
    let form = client()
        .post(t.server.url("/v1/runs"))
        .bearer_auth(&t.alice)
        .header("content-type", "text/plain")
        .body(job.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(form.status().as_u16(), 415);

    let a = post_run(&t.server, Some(&t.alice), &job).await;
    assert_eq!(a.status, 200, "{:#}", a.body);
    assert_eq!(a.body["policy_version"], "default-1");
    let b = post_run(&t.server, Some(&t.bob), &job).await;
    assert_eq!(b.status, 200, "{:#}", b.body);
    assert_eq!(b.body["policy_version"], "bob-1");

    // Each tenant's policy applies to it: 2 s is within alice's ceiling, not bob's.
    let two_s = json!({"language": "python", "code": "print(1)", "timeout": "2s"});
    assert_eq!(
        post_run(&t.server, Some(&t.alice), &two_s).await.status,
        200
    );
    assert_error(
        &post_run(&t.server, Some(&t.bob), &two_s).await,
        403,
        "policy_denied",
    );
    let bob_schema: Value = client()
        .get(t.server.url("/v1/tool-schema"))
        .bearer_auth(&t.bob)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        bob_schema["function"]["description"]
            .as_str()
            .unwrap()
            .contains("1s wall time")
    );

    // Audit lines name the tenant, in each policy's own log; never the token.
    let alice_lines = t.server.audit_lines();
    // Three: the one with a real host name, and two below (the form body never ran).
    assert_eq!(alice_lines.len(), 3);
    assert!(alice_lines.iter().all(|l| l["tenant"] == "alice"));
    let bob_lines = audit_lines(&t.server.dir.path().join("bob-audit.jsonl"));
    assert_eq!(bob_lines.len(), 2);
    assert!(bob_lines.iter().all(|l| l["tenant"] == "bob"));
    let metrics = client()
        .get(t.server.url("/metrics"))
        .bearer_auth(&t.alice)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let audit_text = std::fs::read_to_string(t.server.dir.path().join("audit.jsonl")).unwrap()
        + &std::fs::read_to_string(t.server.dir.path().join("bob-audit.jsonl")).unwrap();
    let log = t.server.log();
    for token in [&t.alice, &t.bob] {
        assert!(
            !log.contains(token.as_str()),
            "a token is in the server log"
        );
        assert!(
            !audit_text.contains(token.as_str()),
            "a token is in the audit log"
        );
        assert!(
            !metrics.contains(token.as_str()),
            "a token is in the metrics"
        );
    }
    assert!(log.contains("/v1/runs"), "requests are logged: {log}");
}

#[tokio::test]
async fn a_tenant_cannot_exceed_its_own_limit() {
    require_server!();
    let t = start();
    let sleep = json!({"language": "python", "code": "import time; print(time.time()); time.sleep(0.7); print(time.time())"});
    // Three jobs of alice (limit 1) run one after another although 4 slots are free...
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let url = t.server.url("/v1/runs");
        let token = t.alice.clone();
        let body = sleep.clone();
        tasks.push(tokio::spawn(async move {
            let response = client()
                .post(url)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status().as_u16(), 200);
            response.json::<Value>().await.unwrap()
        }));
    }
    let mut spans = Vec::new();
    for task in tasks {
        let obs = task.await.unwrap();
        let times: Vec<f64> = obs["stdout"]
            .as_str()
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        spans.push((times[0], times[1]));
    }
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    for pair in spans.windows(2) {
        assert!(pair[1].0 >= pair[0].1, "alice's jobs overlapped: {spans:?}");
    }
    assert!(started.elapsed() >= Duration::from_millis(2100));
    // ...while bob's (no limit of his own) run side by side.
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let url = t.server.url("/v1/runs");
        let token = t.bob.clone();
        let body = sleep.clone();
        tasks.push(tokio::spawn(async move {
            let response = client()
                .post(url)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status().as_u16(), 200);
            response.json::<Value>().await.unwrap()
        }));
    }
    let mut bob_spans = Vec::new();
    for task in tasks {
        let obs = task.await.unwrap();
        let times: Vec<f64> = obs["stdout"]
            .as_str()
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        bob_spans.push((times[0], times[1]));
    }
    let latest_start = bob_spans.iter().map(|s| s.0).fold(f64::MIN, f64::max);
    let earliest_end = bob_spans.iter().map(|s| s.1).fold(f64::MAX, f64::min);
    assert!(
        latest_start < earliest_end,
        "bob's jobs did not run side by side: {bob_spans:?}"
    );
}
