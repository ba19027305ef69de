//! The E2B API through the real server on the native backend: control-plane auth and
//! refusals, data-plane routing by header and by Host, each sandbox's access token,
//! another tenant refused, and a command's Connect stream parsed envelope by envelope.
//! (The unmodified SDKs run the whole flow in scripts/ci/e2b.sh.)

use base64::Engine as _;
use serde_json::{Value, json};

use super::common::*;
use crate::require_server;

struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

async fn send(request: reqwest::RequestBuilder) -> Reply {
    let response = request.send().await.expect("send");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.bytes().await.unwrap().to_vec();
    Reply {
        status,
        headers,
        body,
    }
}

fn envelope(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![flags];
    out.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The envelopes of a Connect stream body: (flags, JSON).
fn envelopes(mut body: &[u8]) -> Vec<(u8, Value)> {
    let mut out = Vec::new();
    while !body.is_empty() {
        let flags = body[0];
        let length = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
        out.push((flags, serde_json::from_slice(&body[5..5 + length]).unwrap()));
        body = &body[5 + length..];
    }
    out
}

#[tokio::test]
async fn e2b_routes_authenticate_route_and_stream() {
    require_server!();
    let (key_a, entry_a) = new_token("alice", &[]);
    let (key_b, entry_b) = new_token("bob", &[]);
    let server = Server::start(Opts {
        files: vec![(
            "policy.toml".into(),
            "version = \"e2b-1\"\n[sessions]\nenabled = true\n".into(),
        )],
        args: ["--policy", "policy.toml", "--max-body", "64KiB"]
            .map(String::from)
            .to_vec(),
        tokens: Some(format!("{entry_a}\n{entry_b}")),
        ..Default::default()
    });
    let c = client();

    // The control plane: E2B's key header, E2B's error shape.
    let unauthenticated = send(c.post(server.url("/v2/sandboxes")).json(&json!({}))).await;
    assert_eq!(unauthenticated.status, 401);
    assert_eq!(unauthenticated.json()["code"], 401);
    let unknown = send(
        c.post(server.url("/v2/sandboxes"))
            .header("X-API-Key", &key_a)
            .json(&json!({"templateID": "nope"})),
    )
    .await;
    assert_eq!(unknown.status, 400);
    assert!(
        unknown.json()["message"]
            .as_str()
            .unwrap()
            .contains("base, code-interpreter-v1"),
        "{}",
        unknown.json()
    );
    let created = send(
        c.post(server.url("/sandboxes"))
            .header("X-API-Key", &key_a)
            .json(&json!({"templateID": "base", "timeout": 60, "metadata": {"k": "v"}})),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.json());
    let sandbox = created.json();
    let id = sandbox["sandboxID"].as_str().unwrap().to_owned();
    let token = sandbox["envdAccessToken"].as_str().unwrap().to_owned();
    assert_eq!(sandbox["envdVersion"], "0.5.7");
    let paused = send(
        c.post(server.url(&format!("/sandboxes/{id}/pause")))
            .header("X-API-Key", &key_a)
            .json(&json!({})),
    )
    .await;
    assert_eq!(paused.status, 501);
    assert!(
        paused.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("not supported by airlock: ")
    );

    // The data plane: by header, by Host; the sandbox's token and nothing else.
    let health = |id: &str, token: Option<&str>| {
        let mut request = c
            .get(server.url("/health"))
            .header("E2b-Sandbox-Id", id)
            .header("E2b-Sandbox-Port", "49983");
        if let Some(token) = token {
            request = request.header("X-Access-Token", token);
        }
        send(request)
    };
    assert_eq!(health(&id, Some(&token)).await.status, 204);
    assert_eq!(health(&id, None).await.status, 401);
    assert_eq!(health(&id, Some(&"0".repeat(64))).await.status, 401);
    assert_eq!(health(&id, Some(&key_a)).await.status, 401);
    let gone = health("doesnotexist", Some(&token)).await;
    assert_eq!(gone.status, 502);
    assert!(
        gone.json()["message"]
            .as_str()
            .unwrap()
            .contains("was not found")
    );
    let by_host = send(
        c.get(server.url("/health"))
            .header("Host", format!("49983-{id}.sandboxes.example.test"))
            .header("X-Access-Token", &token),
    )
    .await;
    assert_eq!(by_host.status, 204);

    // Another tenant does not see it.
    for request in [
        c.get(server.url(&format!("/sandboxes/{id}"))),
        c.delete(server.url(&format!("/sandboxes/{id}"))),
    ] {
        assert_eq!(send(request.header("X-API-Key", &key_b)).await.status, 404);
    }
    let theirs = send(
        c.get(server.url("/v2/sandboxes"))
            .header("X-API-Key", &key_b),
    )
    .await;
    assert_eq!(theirs.json(), json!([]));
    let mine = send(
        c.get(server.url("/v2/sandboxes?metadata=k%3Dv"))
            .header("X-API-Key", &key_a),
    )
    .await;
    assert_eq!(mine.json()[0]["sandboxID"], id.as_str());

    // A command: a Connect server stream, envelope by envelope.
    let start = json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi; echo err >&2; exit 3"]}});
    let streamed = send(
        c.post(server.url("/process.Process/Start"))
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", &token)
            .header("Content-Type", "application/connect+json")
            .body(envelope(0, start.to_string().as_bytes())),
    )
    .await;
    assert_eq!(streamed.status, 200);
    assert_eq!(streamed.headers["content-type"], "application/connect+json");
    let frames = envelopes(&streamed.body);
    let (last_flags, last) = frames.last().unwrap();
    assert_eq!((*last_flags, last), (2, &json!({})));
    let events: Vec<&Value> = frames[..frames.len() - 1]
        .iter()
        .map(|(flags, v)| {
            assert_eq!(*flags, 0);
            &v["event"]
        })
        .collect();
    assert!(events[0]["start"]["pid"].as_u64().is_some(), "{events:?}");
    let decode = |stream: &str| -> String {
        events
            .iter()
            .filter_map(|e| e["data"][stream].as_str())
            .map(|b| {
                String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b).unwrap())
                    .unwrap()
            })
            .collect()
    };
    assert_eq!(decode("stdout"), "hi\n");
    assert_eq!(decode("stderr"), "err\n");
    let end = events.iter().find(|e| e.get("end").is_some()).unwrap();
    assert_eq!(end["end"]["exitCode"], 3);
    // A refusal on a stream is its end-of-stream error.
    let refused = send(
        c.post(server.url("/process.Process/Start"))
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", &token)
            .header("Content-Type", "application/connect+json")
            .body(envelope(0, br#"{"process":{"cmd":"cat"},"stdin":true}"#)),
    )
    .await;
    let frames = envelopes(&refused.body);
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].0, 2);
    assert_eq!(frames[0].1["error"]["code"], "unimplemented");
    // A unary RPC's error: the Connect code, its HTTP status.
    let missing = send(
        c.post(server.url("/filesystem.Filesystem/Stat"))
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", &token)
            .json(&json!({"path": "/home/user/none"})),
    )
    .await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["code"], "not_found");
    let outside = send(
        c.get(server.url("/files?path=/etc/passwd"))
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", &token),
    )
    .await;
    assert_eq!(outside.status, 400);

    // An upload past --max-body: 413 naming the limit and the flag, answered from the
    // declared length before any of the body is sent (a raw request: a client still
    // writing a body the server will not read may see the connection close first).
    let message = {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
        write!(
            stream,
            "POST /files?path=/home/user/big.bin HTTP/1.1\r\nHost: {}\r\nE2b-Sandbox-Id: {id}\r\n\
             X-Access-Token: {token}\r\nContent-Type: application/octet-stream\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            server.addr,
            100 * 1024
        )
        .unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        let mut reply = String::new();
        let _ = stream.read_to_string(&mut reply);
        reply
    };
    assert!(message.starts_with("HTTP/1.1 413"), "{message}");
    assert!(
        message.contains("65536") && message.contains("--max-body"),
        "{message}"
    );
    // A file named after a key: listed and stated with the name redacted, read withheld,
    // each audited as the sessions route's reads and listings are.
    let key = format!("AKIA{}", "QYLPMN5HHHFPZAM2");
    let envd = |path: &str| {
        c.post(server.url(path))
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", &token)
    };
    let put = send(
        envd(&format!("/files?path=/home/user/{key}.txt"))
            .header("Content-Type", "application/octet-stream")
            .body("hello\n"),
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.json());
    let listed =
        send(envd("/filesystem.Filesystem/ListDir").json(&json!({"path": "/home/user"}))).await;
    assert_eq!(listed.status, 200, "{}", listed.json());
    let listing = listed.json().to_string();
    assert!(!listing.contains(&key), "{listing}");
    assert!(
        listing.contains("[REDACTED:aws-access-key-id].txt"),
        "{listing}"
    );
    let stat = send(
        envd("/filesystem.Filesystem/Stat").json(&json!({"path": format!("/home/user/{key}.txt")})),
    )
    .await;
    assert_eq!(stat.status, 200, "{}", stat.json());
    assert!(!stat.json().to_string().contains(&key), "{}", stat.json());
    let read = send(
        c.get(server.url(&format!("/files?path=/home/user/{key}.txt")))
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", &token),
    )
    .await;
    assert_eq!(read.status, 403, "{}", read.json());
    assert!(!String::from_utf8_lossy(&read.body).contains(&key));
    let audit = server.audit_lines();
    let e2b_lines = |event: &str| {
        audit
            .iter()
            .filter(|l| l["event"] == event && l["api"] == "e2b")
            .count()
    };
    assert!(e2b_lines("session_files_listed") >= 2, "{audit:#?}");
    assert!(e2b_lines("session_file_read") >= 1, "{audit:#?}");
    assert!(
        !audit.iter().any(|l| l.to_string().contains(&key)),
        "a key in the audit log"
    );

    // Killed: its envd is gone, and the audit log names the E2B sandbox.
    let killed = send(
        c.delete(server.url(&format!("/sandboxes/{id}")))
            .header("X-API-Key", &key_a),
    )
    .await;
    assert_eq!(killed.status, 204);
    assert_eq!(health(&id, Some(&token)).await.status, 502);
    let lines = server.audit_lines();
    for event in ["e2b_sandbox_create", "e2b_command", "e2b_sandbox_end"] {
        assert!(
            lines
                .iter()
                .any(|l| l["event"] == event && l["e2b_sandbox_id"] == id.as_str()),
            "no {event} line for {id}"
        );
    }
}

#[tokio::test]
async fn e2b_creates_say_why_they_are_refused() {
    require_server!();
    for (policy, says) in [
        // A policy that turns sessions off (the built-in one has them on).
        (
            "version = \"e2b-2\"\n[sessions]\nenabled = false\n",
            "[sessions] enabled",
        ),
        (
            "version = \"e2b-3\"\n[sessions]\nenabled = true\n[e2b]\nenabled = false\n",
            "[e2b] enabled",
        ),
    ] {
        let server = Server::start(Opts {
            files: vec![("policy.toml".into(), policy.into())],
            args: ["--policy", "policy.toml"].map(String::from).to_vec(),
            ..Default::default()
        });
        let refused = send(client().post(server.url("/v2/sandboxes")).json(&json!({}))).await;
        assert_eq!(refused.status, 403, "{}", refused.json());
        assert_eq!(refused.json()["code"], 403);
        assert!(
            refused.json()["message"].as_str().unwrap().contains(says),
            "{}",
            refused.json()
        );
    }
}

/// Creates a `code-interpreter-v1` sandbox with E2B's key header: its record.
async fn create_code_interpreter(server: &Server, key: &str) -> Value {
    let created = send(
        client()
            .post(server.url("/v2/sandboxes"))
            .header("X-API-Key", key)
            .json(&json!({"templateID": "code-interpreter-v1"})),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.json());
    created.json()
}

/// Issue 31: the built-in policy (no --policy) has sessions on, so a create with no template
/// (the code interpreter SDK's own default is `code-interpreter-v1`) gets a sandbox; kill ends it.
#[tokio::test]
async fn e2b_creates_on_the_builtin_policy() {
    require_server!();
    let (key, entry) = new_token("alice", &[]);
    let server = Server::start(Opts {
        tokens: Some(entry),
        ..Default::default()
    });
    let c = client();
    let id = create_code_interpreter(&server, &key).await["sandboxID"]
        .as_str()
        .unwrap()
        .to_owned();
    let killed = send(
        c.delete(server.url(&format!("/sandboxes/{id}")))
            .header("X-API-Key", &key),
    )
    .await;
    assert_eq!(killed.status, 204, "{}", killed.json());
}

/// Issue 35, target 3, through E2B's API: with the native warm pool on, a code
/// interpreter sandbox's kernel is forked from the zygote with the sandbox's own `/tmp`
/// (which persists, as E2B's does) as well as its `/work`; what a cell leaves in `/tmp`
/// is there for the kernel that replaces it, forked again.
#[tokio::test]
async fn e2b_kernels_forked_from_the_zygote_keep_the_sandboxes_tmp() {
    require_server!();
    let (key, entry) = new_token("alice", &[]);
    let server = Server::start(Opts {
        files: vec![(
            "policy.toml".into(),
            airlock_core::policy::BUILTIN_POLICY_TOML.replacen(
                "\nwarm_pool = 0 ",
                "\nwarm_pool = 1 ",
                1,
            ),
        )],
        args: ["--policy", "policy.toml"].map(String::from).to_vec(),
        tokens: Some(entry),
        ..Default::default()
    });
    wait_for_zygote(&server, Some(&key)).await;
    let c = client();
    let sandbox = create_code_interpreter(&server, &key).await;
    let id = sandbox["sandboxID"].as_str().unwrap().to_owned();
    let token = sandbox["envdAccessToken"].as_str().unwrap().to_owned();
    let execute = |code: &str| {
        let request = c
            .post(server.url("/execute"))
            .header("E2b-Sandbox-Id", &id)
            .header("E2b-Sandbox-Port", "49999")
            .header("X-Access-Token", &token)
            .json(&json!({"code": code}));
        async move {
            let reply = send(request).await;
            assert_eq!(
                reply.status,
                200,
                "{}",
                String::from_utf8_lossy(&reply.body)
            );
            String::from_utf8_lossy(&reply.body)
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .collect::<Vec<Value>>()
        }
    };
    let result = |lines: &[Value]| {
        lines
            .iter()
            .find(|l| l["type"] == "result")
            .map(|l| l["text"].clone())
    };
    let sessions_forked = || {
        metric_as(
            &server,
            Some(&key),
            "airlock_warm_pool_sandboxes_total{result=\"started_for_session\"}",
        )
    };
    assert_eq!(sessions_forked().await, 1, "{}", server.log());
    let wrote = execute("open('/tmp/kept', 'w').write('in tmp')").await;
    assert_eq!(result(&wrote), Some(json!("6")), "{wrote:?}");
    // The sandbox's /tmp seen from its kernel: the session's tmpfs, not a fresh one.
    let mounted = execute(
        "[l.split(' - ')[1].split()[1] for l in open('/proc/self/mountinfo') if l.split()[4] == '/tmp'][-1]",
    )
    .await;
    assert_eq!(
        result(&mounted),
        Some(json!("'airlock-session'")),
        "{mounted:?}"
    );
    execute("import os\nos._exit(3)").await;
    let read = execute("open('/tmp/kept').read()").await;
    assert_eq!(result(&read), Some(json!("'in tmp'")), "{read:?}");
    assert_eq!(sessions_forked().await, 2, "{}", server.log());
    let killed = send(
        c.delete(server.url(&format!("/sandboxes/{id}")))
            .header("X-API-Key", &key),
    )
    .await;
    assert_eq!(killed.status, 204);
}
