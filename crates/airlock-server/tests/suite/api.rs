//! The API's answers and status codes against the real sandbox.

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::{Value, json};

use super::common::*;
use crate::require_server;

#[tokio::test]
async fn a_job_that_ran_is_200_whatever_its_exit() {
    require_server!();
    let server = Server::start(Opts::default());
    let ok = post_run(&server, None, &python("print(sum(range(10)))")).await;
    assert_eq!(ok.status, 200, "{:#}", ok.body);
    assert_eq!(ok.body["ok"], true);
    assert_eq!(ok.body["stdout"], "45\n");
    assert_eq!(ok.body["backend"], "native");
    let failed = post_run(&server, None, &python("import sys; sys.exit(3)")).await;
    assert_eq!(failed.status, 200);
    assert_eq!(failed.body["ok"], false);
    assert_eq!(failed.body["outcome"], "exited");
    assert_eq!(failed.body["exit_code"], 3);
    let timeout = post_run(
        &server,
        None,
        &json!({"language": "sh", "code": "sleep 5", "timeout": "300ms"}),
    )
    .await;
    assert_eq!(timeout.status, 200);
    assert_eq!(timeout.body["outcome"], "timeout");
    // Files, stdin, args and base64 source reach the program.
    let rich = post_run(
        &server,
        None,
        &json!({
            "language": "python",
            "code_base64": "aW1wb3J0IHN5cwpwcmludChvcGVuKCdkYXRhL2EudHh0JykucmVhZCgpLCBzeXMuc3RkaW4ucmVhZCgpLCBzeXMuYXJndlsxXSk=",
            "files": [{"path": "data/a.txt", "content": "file"}],
            "stdin": "in",
            "args": ["arg"],
            "timeout_s": 3
        }),
    )
    .await;
    assert_eq!(rich.body["stdout"], "file in arg\n", "{:#}", rich.body);
    // Every job is audited, with no tenant (no tokens file).
    let lines = server.audit_lines();
    assert_eq!(lines.len(), 4);
    assert!(lines.iter().all(|l| l["tenant"].is_null()));
}

#[tokio::test]
async fn malformed_and_refused_requests_have_their_status_and_the_error_shape() {
    require_server!();
    let server = Server::start(Opts::default());
    for (body, what) in [
        (
            json!({"language": "python", "code": "1", "image": "x"}),
            "unknown field",
        ),
        (
            json!({"language": "cobol", "code": "1"}),
            "unknown language",
        ),
        (json!({"language": "python"}), "no code"),
        (
            json!({"language": "python", "code": "1", "timeout": "soon"}),
            "bad duration",
        ),
        (
            json!({"language": "python", "code": "\u{0}"}),
            "NUL in source",
        ),
        (
            json!({"language": "python", "code": "1", "files": [{"path": "../x", "content": ""}]}),
            "path escape",
        ),
        (json!([1, 2]), "not an object"),
    ] {
        let answer = post_run(&server, None, &body).await;
        assert_error(&answer, 400, "invalid_input");
        let _ = what;
    }
    let not_json = post_raw(&server, None, b"{not json".to_vec()).await;
    assert_error(&not_json, 400, "invalid_input");
    // Issue 30: a value of the wrong type is named by its field, not by a column.
    let wrong_type = post_run(&server, None, &json!({"code": "1", "timeout": 5})).await;
    assert_error(&wrong_type, 400, "invalid_input");
    let message = wrong_type.body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("timeout: invalid type: integer `5`") && !message.contains("column"),
        "{message}"
    );
    // A refusal names the policy key an operator would change.
    for (body, key) in [
        (
            json!({"language": "python", "code": "1", "memory": "1GiB"}),
            "[limits] memory",
        ),
        (
            json!({"language": "python", "code": "1", "timeout": "1h"}),
            "[limits] timeout",
        ),
        (
            json!({"language": "python", "code": "1", "env": {"SECRET": "x"}}),
            "[env] allow",
        ),
    ] {
        let answer = post_run(&server, None, &body).await;
        assert_error(&answer, 403, "policy_denied");
        assert!(
            answer.body["job_id"].is_string(),
            "refusals are audited with an id"
        );
        let message = answer.body["error"]["message"].as_str().unwrap();
        assert!(message.contains(key), "{key} not in {message}");
    }
    // Unknown routes and methods answer in the same shape.
    let response = client()
        .get(server.url("/v1/nothing"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["outcome"], "error");
    let response = client().get(server.url("/v1/runs")).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 405);
    // Refusals by the engine are audited; malformed bodies never reach it.
    let audited: Vec<String> = server
        .audit_lines()
        .iter()
        .map(|l| l["error_kind"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(
        audited.iter().filter(|k| *k == "policy_denied").count(),
        3,
        "{audited:?}"
    );
}

/// Sends `head`, then `body` from another thread (the server may answer before reading
/// it), and returns the response text.
fn raw_exchange(server: &Server, head: String, body: Vec<Vec<u8>>) -> String {
    let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        for chunk in body {
            if writer.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    let mut response = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                response.extend_from_slice(&buf[..n]);
                if String::from_utf8_lossy(&response).contains("\"outcome\":\"error\"}") {
                    break;
                }
            }
        }
    }
    drop(stream);
    let _ = sender.join();
    String::from_utf8_lossy(&response).into_owned()
}

#[test]
fn a_20_mb_body_is_413_before_it_is_read() {
    require_server!();
    let server = Server::start(Opts::default());
    let addr = server.addr;
    let size = 20_000_000usize;
    let chunk = vec![b' '; 1 << 20];
    let chunks = size.div_ceil(chunk.len());
    let text = raw_exchange(
        &server,
        format!(
            "POST /v1/runs HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
        ),
        vec![chunk.clone(); chunks],
    );
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("\"kind\":\"invalid_input\""), "{text}");
    // Also a chunked body that never declares its size.
    let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
    framed.extend_from_slice(&chunk);
    framed.extend_from_slice(b"\r\n");
    let text = raw_exchange(
        &server,
        format!(
            "POST /v1/runs HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        ),
        vec![framed; chunks],
    );
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    // The server is fine afterwards.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let ok = runtime.block_on(post_run(&server, None, &python("print(1)")));
    assert_eq!(ok.status, 200);
}

#[tokio::test]
async fn a_burst_larger_than_the_queue_gets_429_with_retry_after() {
    require_server!();
    let server = Server::start(Opts {
        args: ["--max-in-flight", "1", "--queue", "1"]
            .map(String::from)
            .to_vec(),
        ..Default::default()
    });
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let url = server.url("/v1/runs");
        tasks.push(tokio::spawn(async move {
            let response = client()
                .post(url)
                .json(&json!({"language": "sh", "code": "sleep 1"}))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let retry = response
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            let body: Value = response.json().await.unwrap();
            (status, retry, body)
        }));
    }
    let mut ran = 0;
    let mut busy = 0;
    for task in tasks {
        let (status, retry, body) = task.await.unwrap();
        match status {
            200 => ran += 1,
            429 => {
                busy += 1;
                assert_eq!(retry.as_deref(), Some("1"));
                assert_eq!(body["error"]["kind"], "backend_unavailable");
            }
            other => panic!("{other}: {body}"),
        }
    }
    assert_eq!(
        (ran, busy),
        (2, 4),
        "one running, one queued, the rest refused"
    );
    let metrics = metrics_text(&server).await;
    assert!(
        metrics.contains("airlock_requests_rejected_total{reason=\"queue_full\"} 4"),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_unavailable_backend_is_503() {
    require_server!();
    let server = Server::start(Opts {
        args: ["--backend", "kube"].map(String::from).to_vec(),
        ..Default::default()
    });
    let answer = post_run(&server, None, &python("print(1)")).await;
    assert_error(&answer, 503, "backend_unavailable");
}

#[tokio::test]
async fn health_metrics_openapi_and_tool_schema() {
    require_server!();
    let server = Server::start(Opts::default());
    let health: Value = client()
        .get(server.url("/v1/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    let ok = post_run(&server, None, &python("print('x' * 10)")).await;
    assert_eq!(ok.status, 200);
    // The reply does not wait for the sandbox's removal; the job counts until it is done.
    wait_health(&server, |h| h["jobs_in_flight"] == 0).await;
    let response = client().get(server.url("/metrics")).send().await.unwrap();
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let metrics = response.text().await.unwrap();
    assert!(
        metrics.contains("# TYPE airlock_jobs_total counter\n"),
        "{metrics}"
    );
    assert!(!metrics.contains("# EOF"), "{metrics}");
    // Prometheus's own scrape header prefers OpenMetrics.
    let response = client()
        .get(server.url("/metrics"))
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let openmetrics = response.text().await.unwrap();
    assert!(
        openmetrics.contains("# TYPE airlock_jobs counter\n"),
        "{openmetrics}"
    );
    assert!(openmetrics.ends_with("# EOF\n"), "{openmetrics}");
    for needle in [
        "airlock_jobs_total{outcome=\"exited\",backend=\"native\"} 1",
        "airlock_job_duration_seconds_count 1",
        "airlock_queue_wait_seconds_count 1",
        "airlock_jobs_in_flight 0",
        "airlock_queue_depth 0",
        "airlock_output_bytes_total{stream=\"stdout\"} 11",
        "airlock_redactions_total 0",
    ] {
        assert!(metrics.contains(needle), "{needle} not in:\n{metrics}");
    }
    let doc: Value = client()
        .get(server.url("/v1/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["paths"]["/v1/runs"]["post"].is_object());
    let tool: Value = client()
        .get(server.url("/v1/tool-schema"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(tool["type"], "function");
    assert_eq!(tool["function"]["name"], "run_code");
    let description = tool["function"]["description"].as_str().unwrap();
    assert!(description.contains("5s wall time") && description.contains("network is off"));
    // Strict: every argument required, the optional ones nullable.
    assert_eq!(tool["function"]["strict"], true);
    assert_eq!(
        tool["function"]["parameters"]["required"],
        json!(["code", "files", "language", "return_files", "timeout_s"])
    );
    assert_eq!(
        tool["function"]["parameters"]["properties"]["timeout_s"]["type"],
        json!(["number", "null"])
    );
    let responses: Value = client()
        .get(server.url("/v1/tool-schema?format=responses"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(responses["name"], "run_code");
    assert_eq!(responses["parameters"], tool["function"]["parameters"]);
    let bad = client()
        .get(server.url("/v1/tool-schema?format=xml"))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 400);
}

#[test]
fn without_tokens_only_loopback_is_served() {
    require_server!();
    let output = std::process::Command::new(airlock_bin())
        .args(["serve", "--listen", "0.0.0.0:0"])
        .env("AIRLOCK_STATE_DIR", tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("without a tokens file"), "{stderr}");
}

#[test]
fn the_python_example_in_the_docs_is_the_tested_one() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let example = std::fs::read_to_string(root.join("tests/py/run_in_container.py")).unwrap();
    for doc in ["../../docs/serve.md", "../../README.md"] {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        assert!(
            text.contains(&example),
            "{doc} must hold tests/py/run_in_container.py verbatim"
        );
    }
}

#[tokio::test]
async fn an_oversized_request_head_is_431() {
    require_server!();
    let server = Server::start(Opts::default());
    let response = client()
        .get(server.url("/v1/health"))
        .header("x-padding", "a".repeat(20_000))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 431);
    let ok = client().get(server.url("/v1/health")).send().await.unwrap();
    assert_eq!(ok.status().as_u16(), 200);
}

/// `{"code": …}` alone runs in the policy's default language (python), and
/// `return_files` brings /out back inline, byte for byte, within the policy's cap.
#[tokio::test]
async fn only_code_runs_as_python_and_return_files_brings_out_back_inline() {
    require_server!();
    let server = Server::start(Opts::default());
    let bare = post_run(
        &server,
        None,
        &json!({"code": "import sys; print(sys.version_info[0])"}),
    )
    .await;
    assert_eq!(bare.status, 200, "{:#}", bare.body);
    assert_eq!(bare.body["stdout"], "3\n");

    let writes = "open('/out/all.bin', 'wb').write(bytes(range(256)))\n\
                  open('/out/big.bin', 'wb').write(b'x' * (2 << 20))\n\
                  open('/out/note.txt', 'w').write('done')\n";
    let answer = post_run(
        &server,
        None,
        &json!({"code": writes, "return_files": true, "language": null}),
    )
    .await;
    assert_eq!(answer.status, 200, "{:#}", answer.body);
    assert_eq!(answer.body["ok"], true, "{:#}", answer.body);
    let files = answer.body["files"].as_array().unwrap();
    let by_path = |p: &str| {
        files
            .iter()
            .find(|f| f["path"] == p)
            .unwrap_or_else(|| panic!("{p}: {files:?}"))
    };
    use base64::Engine as _;
    let decode = |f: &Value| {
        base64::engine::general_purpose::STANDARD
            .decode(f["content_base64"].as_str().unwrap())
            .unwrap()
    };
    assert_eq!(decode(by_path("all.bin")), (0..=255u8).collect::<Vec<_>>());
    assert_eq!(decode(by_path("note.txt")), b"done");
    // 2 MiB is past the built-in policy's 1 MiB inline cap: listed, not sent.
    let big = by_path("big.bin");
    assert_eq!(big["bytes"], 2 << 20);
    assert!(big.get("content_base64").is_none(), "{big}");

    // Without return_files there is no /out (and nothing inline).
    let without = post_run(&server, None, &python("open('/out/a', 'w').write('x')")).await;
    assert_eq!(without.body["ok"], false, "{:#}", without.body);
    assert!(
        without.body["stderr"].as_str().unwrap().contains("/out"),
        "{:#}",
        without.body
    );
    assert_eq!(without.body["files"], json!([]));
}

/// Issue 19 finding 6: without tokens, what a web page can send is refused before it
/// runs: a form-typed body (no preflight), a foreign Origin, a DNS-rebinding Host, on
/// every route, /mcp included; loopback callers and loopback origins are served.
#[tokio::test]
async fn a_server_without_tokens_serves_no_web_page() {
    require_server!();
    let server = Server::start(Opts::default());
    let job = serde_json::to_vec(&python("print(1)")).unwrap();
    let send = |method: reqwest::Method, path: &str, headers: &[(&str, String)]| {
        let mut request = client()
            .request(method.clone(), server.url(path))
            .body(job.clone());
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let text = response.text().await.unwrap();
            let body: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{status}: not JSON ({e}): {text}"));
            Answer {
                status,
                headers,
                body,
            }
        }
    };
    let json_type = ("content-type", "application/json".to_owned());
    for content_type in ["text/plain", "application/x-www-form-urlencoded"] {
        let answer = send(
            reqwest::Method::POST,
            "/v1/runs",
            &[("content-type", content_type.to_owned())],
        )
        .await;
        assert_error(&answer, 415, "invalid_input");
        let message = answer.body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("Content-Type: application/json"),
            "{message}"
        );
    }
    assert_error(
        &send(reqwest::Method::POST, "/v1/runs", &[]).await,
        415,
        "invalid_input",
    );
    let evil_origin = ("origin", "http://evil.example".to_owned());
    assert_error(
        &send(
            reqwest::Method::POST,
            "/v1/runs",
            &[json_type.clone(), evil_origin.clone()],
        )
        .await,
        403,
        "policy_denied",
    );
    let port = server.addr.port();
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_owned(),
        format!("127.0.0.1:{}", port.wrapping_add(1)),
    ] {
        for (method, path) in [
            (reqwest::Method::POST, "/v1/runs"),
            (reqwest::Method::GET, "/v1/health"),
            (reqwest::Method::GET, "/v1/openapi.json"),
            (reqwest::Method::GET, "/metrics"),
            (reqwest::Method::POST, "/mcp"),
            (reqwest::Method::GET, "/nowhere"),
        ] {
            let answer = send(
                method.clone(),
                path,
                &[json_type.clone(), ("host", host.clone())],
            )
            .await;
            assert_error(&answer, 403, "policy_denied");
            let message = answer.body["error"]["message"].as_str().unwrap();
            assert!(
                message.contains(&format!("Host: 127.0.0.1:{port}")),
                "{method} {path}: {message}"
            );
        }
    }
    assert!(
        server.audit_lines().is_empty(),
        "refused requests never reach the engine"
    );
    // Loopback callers, by name or address, and pages served from loopback, are served.
    for headers in [
        vec![json_type.clone()],
        vec![json_type.clone(), ("host", format!("localhost:{port}"))],
        vec![
            json_type.clone(),
            ("origin", "http://localhost:3000".to_owned()),
        ],
        vec![("content-type", "application/json; charset=utf-8".to_owned())],
    ] {
        let answer = send(reqwest::Method::POST, "/v1/runs", &headers).await;
        assert_eq!(answer.status, 200, "{headers:?}: {:#}", answer.body);
    }
    // Each refusal is counted: 3 untyped bodies; 3 hosts on 6 routes and 1 origin.
    let metrics = metrics_text(&server).await;
    for needle in [
        "airlock_requests_rejected_total{reason=\"not_json\"} 3\n",
        "airlock_requests_rejected_total{reason=\"foreign_host\"} 19\n",
    ] {
        assert!(metrics.contains(needle), "{needle} not in:\n{metrics}");
    }
}

/// Issue 35, target 4: a server prepares the minimal root when it starts, not at its first
/// job: with a cache of its own (as after a change of the host's files, whose copy must be
/// made again), the copy is made while no job has been sent, and the first job finds it.
#[tokio::test]
async fn a_server_prepares_the_minimal_root_before_its_first_job() {
    require_server!();
    let cache = tempfile::tempdir().unwrap();
    let server = Server::start(Opts {
        env: vec![(
            "AIRLOCK_CACHE_DIR".into(),
            cache.path().display().to_string(),
        )],
        ..Default::default()
    });
    let prepared = || {
        std::fs::read_dir(cache.path().join("roots"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|spec| spec.path().join("current").exists())
    };
    let start = std::time::Instant::now();
    while !prepared() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no minimal root was prepared without a job:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reply = post_run(&server, None, &json!({"code": "print('ok')"})).await;
    assert_eq!(reply.body["stdout"], "ok\n", "{:#}", reply.body);
}
