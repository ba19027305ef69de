//! `return_files`: `/out` asked for, released files inline within the policy's MCP cap,
//! every file a `resource_link` the caller reads back.

use std::sync::Arc;

use airlock_core::observation::{OutputFile, ReleasedFile};
use airlock_core::{ByteSize, Policy};
use airlock_mcp::RunCodeServer;
use base64::Engine as _;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::common::FakeExecutor;

fn file(path: &str, content: &[u8]) -> (OutputFile, ReleasedFile) {
    (
        OutputFile {
            path: path.to_owned(),
            bytes: content.len() as u64,
            sha256: "0".repeat(64),
            media_type: "application/octet-stream".to_owned(),
            redactions: 0,
            content_base64: None,
        },
        ReleasedFile {
            path: path.to_owned(),
            content: content.to_vec(),
        },
    )
}

fn server(inline_bytes: u64) -> (RunCodeServer, Arc<super::common::Record>) {
    let mut policy = Policy::builtin();
    policy.filesystem.out.mcp_inline_bytes = ByteSize::bytes(inline_bytes);
    let mut executor = FakeExecutor::new(policy);
    executor.files = vec![
        file("small.bin", &[0, 1, 2, 255]),
        file("big.bin", &[7; 100]),
        file("last.txt", b"hi"),
    ];
    let record = executor.record.clone();
    (RunCodeServer::new(Arc::new(executor)), record)
}

fn contents(result: &Value) -> Vec<(String, Option<Vec<u8>>)> {
    result["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let content = f.get("content_base64").map(|b| {
                base64::engine::general_purpose::STANDARD
                    .decode(b.as_str().unwrap())
                    .unwrap()
            });
            (f["path"].as_str().unwrap().to_owned(), content)
        })
        .collect()
}

#[tokio::test]
async fn return_files_asks_for_out_and_inlines_what_fits() {
    let (server, record) = server(10);
    let result = server
        .call(Some(json!({"code": "x", "return_files": true})), None)
        .await;
    assert!(
        record.requests.lock().unwrap()[0].out,
        "/out was not asked for"
    );
    let structured = result.structured_content.unwrap();
    // 4 bytes fit, 100 do not, 2 more still fit in the 10-byte cap.
    assert_eq!(
        contents(&structured),
        vec![
            ("small.bin".to_owned(), Some(vec![0, 1, 2, 255])),
            ("big.bin".to_owned(), None),
            ("last.txt".to_owned(), Some(b"hi".to_vec())),
        ]
    );
    assert_eq!(structured["files"][1]["bytes"], 100);
}

#[tokio::test]
async fn without_return_files_nothing_is_inlined_and_out_is_not_asked_for() {
    let (server, record) = server(1 << 20);
    for arguments in [
        json!({"code": "x"}),
        json!({"code": "x", "return_files": null}),
    ] {
        let result = server.call(Some(arguments), None).await;
        let structured = result.structured_content.unwrap();
        assert!(contents(&structured).iter().all(|(_, c)| c.is_none()));
    }
    assert!(record.requests.lock().unwrap().iter().all(|r| !r.out));
}

/// The MCP default is small: a megabyte of base64 never reaches the model's context.
#[test]
fn the_mcp_inline_default_is_small() {
    let policy = Policy::builtin();
    assert_eq!(policy.filesystem.out.mcp_inline_bytes.as_u64(), 64 * 1024);
    assert!(policy.filesystem.out.mcp_inline_bytes < policy.filesystem.out.inline_bytes);
}

fn typed(path: &str, media_type: &str, content: &[u8]) -> (OutputFile, ReleasedFile) {
    let (mut listed, released) = file(path, content);
    listed.media_type = media_type.to_owned();
    (listed, released)
}

/// A client on the protocol: a small picture comes back as an image block (not base64 in
/// the JSON), every file as a resource_link, and `resources/read` of a link gives the
/// bytes back; a file past the inline budget is a link only.
#[tokio::test]
async fn files_are_resource_links_the_client_reads_back() {
    let mut policy = Policy::builtin();
    policy.filesystem.out.mcp_inline_bytes = ByteSize::bytes(64);
    let mut executor = FakeExecutor::new(policy);
    let big: Vec<u8> = (0..=255).collect();
    executor.files = vec![
        typed("plot.png", "image/png", &[0x89, b'P', b'N', b'G']),
        typed("data.bin", "application/octet-stream", &big),
        typed("notes.txt", "text/plain", b"hello"),
    ];
    let (client_out, server_in) = tokio::io::duplex(1 << 20);
    let (server_out, client_in) = tokio::io::duplex(1 << 20);
    let _served = tokio::spawn(airlock_mcp::serve_io(
        Arc::new(executor),
        server_in,
        server_out,
    ));
    let mut client = super::common::LineClient {
        reader: tokio::io::BufReader::new(client_in),
        writer: client_out,
    };
    client.handshake().await;
    let limit = std::time::Duration::from_secs(10);
    client
        .send(super::common::call(
            1,
            json!({"code": "x", "return_files": true}),
        ))
        .await;
    let reply = client.response(1, limit).await;
    let result = &reply["result"];
    let structured = &result["structuredContent"];
    let files = structured["files"].as_array().unwrap();
    assert!(files[0].get("content_base64").is_none(), "{structured}");
    assert!(
        files[1].get("content_base64").is_none(),
        "256 B is past the 64 B budget"
    );
    assert_eq!(files[2]["content_base64"], "aGVsbG8=");
    let blocks = result["content"].as_array().unwrap();
    let kinds: Vec<&str> = blocks.iter().map(|b| b["type"].as_str().unwrap()).collect();
    // Only the file past the inline budget is a link block; the others are read back at
    // their URI all the same.
    assert_eq!(kinds, vec!["text", "image", "resource_link"]);
    assert!(!blocks[0]["text"].as_str().unwrap().contains("iVBORw"));
    assert_eq!(blocks[1]["mimeType"], "image/png");
    assert_eq!(blocks[1]["data"], "iVBORw==");
    let link = &blocks[2];
    assert_eq!(link["name"], "data.bin");
    assert_eq!(link["size"], 256);
    let uri = link["uri"].as_str().unwrap();
    let job = structured["job_id"].as_str().unwrap();
    assert_eq!(uri, format!("airlock://jobs/{job}/out/data.bin"));

    client
        .send(
            json!({"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"uri": uri}}),
        )
        .await;
    let read = client.response(2, limit).await;
    let contents = &read["result"]["contents"][0];
    assert_eq!(contents["mimeType"], "application/octet-stream");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(contents["blob"].as_str().unwrap())
        .unwrap();
    assert_eq!(bytes, big);
    let text_uri = format!("airlock://jobs/{job}/out/notes.txt");
    client
        .send(json!({"jsonrpc": "2.0", "id": 3, "method": "resources/read", "params": {"uri": text_uri}}))
        .await;
    let read = client.response(3, limit).await;
    assert_eq!(read["result"]["contents"][0]["text"], "hello");

    client
        .send(
            json!({"jsonrpc": "2.0", "id": 4, "method": "resources/read",
                     "params": {"uri": format!("airlock://jobs/{job}/out/nope")}}),
        )
        .await;
    let missing = client.response(4, limit).await;
    assert!(
        missing["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no such resource"),
        "{missing}"
    );

    client
        .send(json!({"jsonrpc": "2.0", "id": 5, "method": "resources/templates/list"}))
        .await;
    let templates = client.response(5, limit).await;
    assert_eq!(
        templates["result"]["resourceTemplates"][0]["uriTemplate"],
        "airlock://jobs/{job_id}/out/{path}"
    );
}

/// `tools/list` is the same bytes every time, and says how long it may be cached.
#[tokio::test]
async fn tools_list_is_deterministic() {
    let mut policy = Policy::builtin();
    policy.sessions.enabled = true;
    let (client_out, server_in) = tokio::io::duplex(1 << 20);
    let (server_out, client_in) = tokio::io::duplex(1 << 20);
    let _served = tokio::spawn(airlock_mcp::serve_io(
        Arc::new(FakeExecutor::new(policy)),
        server_in,
        server_out,
    ));
    let mut client = super::common::LineClient {
        reader: tokio::io::BufReader::new(client_in),
        writer: client_out,
    };
    client.handshake().await;
    let mut answers = Vec::new();
    for id in 1..=3 {
        client
            .send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}))
            .await;
        let reply = client
            .response(id, std::time::Duration::from_secs(10))
            .await;
        answers.push(reply["result"].to_string());
    }
    assert!(answers.windows(2).all(|w| w[0] == w[1]), "{answers:#?}");
    let result: Value = serde_json::from_str(&answers[0]).unwrap();
    let names: Vec<&str> = result["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["run_code", "session_start", "session_end"]);
    assert!(result["ttlMs"].as_u64().unwrap() > 0, "{result}");
}
