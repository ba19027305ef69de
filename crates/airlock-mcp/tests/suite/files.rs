//! `return_files`: `/out` asked for, released files inline within the policy's cap.

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
    policy.filesystem.out.inline_bytes = ByteSize::bytes(inline_bytes);
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
