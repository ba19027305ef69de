//! A call the client gives up on ends its job at once: `notifications/cancelled`, the end
//! of stdin, a dropped HTTP connection.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use airlock_core::Policy;
use airlock_mcp::RunCodeServer;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};

use super::common::{
    FakeExecutor, LONG_JOB, LineClient, PROMPT, call, cancelled, eventually, initialize,
};

/// A server on an in-memory stream pair; the client's halves and the serving task.
fn stdio_server(
    executor: Arc<FakeExecutor>,
) -> (
    LineClient<tokio::io::DuplexStream, tokio::io::DuplexStream>,
    tokio::task::JoinHandle<Result<(), airlock_mcp::McpError>>,
) {
    let (client_out, server_in) = tokio::io::duplex(1 << 16);
    let (server_out, client_in) = tokio::io::duplex(1 << 16);
    let served = tokio::spawn(airlock_mcp::serve_io(executor, server_in, server_out));
    let client = LineClient {
        reader: BufReader::new(client_in),
        writer: client_out,
    };
    (client, served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_drops_its_job_at_once_and_the_next_call_runs() {
    let executor = Arc::new(FakeExecutor::new(Policy::builtin()));
    let record = executor.record.clone();
    let (mut client, _served) = stdio_server(executor);
    client.handshake().await;

    client.send(call(1, json!({"code": LONG_JOB}))).await;
    assert!(
        eventually(Duration::from_secs(5), || record
            .running
            .load(Ordering::SeqCst)
            == 1)
        .await,
        "the long job never started"
    );
    let cancelled_at = Instant::now();
    client.send(cancelled(1)).await;
    assert!(
        eventually(PROMPT, || record.running.load(Ordering::SeqCst) == 0).await,
        "the cancelled call's job was still running after {PROMPT:?}"
    );
    let dropped_at = record.dropped.lock().unwrap()[0];
    assert!(dropped_at.duration_since(cancelled_at) < PROMPT);

    // The session goes on: the next call is answered, by a job that ran.
    client.send(call(2, json!({"code": "print(1)"}))).await;
    let reply = client.response(2, PROMPT).await;
    assert_eq!(
        reply["result"]["structuredContent"]["stdout"], "done\n",
        "{reply}"
    );
    assert_eq!(record.requests.lock().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_stdin_mid_call_drops_the_job_and_ends_the_session() {
    let executor = Arc::new(FakeExecutor::new(Policy::builtin()));
    let record = executor.record.clone();
    let (mut client, served) = stdio_server(executor);
    client.handshake().await;
    client.send(call(1, json!({"code": LONG_JOB}))).await;
    assert!(
        eventually(Duration::from_secs(5), || record
            .running
            .load(Ordering::SeqCst)
            == 1)
        .await,
        "the long job never started"
    );
    let closed_at = Instant::now();
    client.writer.shutdown().await.unwrap();
    drop(client.writer);
    assert!(
        eventually(PROMPT, || record.running.load(Ordering::SeqCst) == 0).await,
        "the job outlived its client's stdin by more than {PROMPT:?}"
    );
    // rmcp waits up to 5 s for handlers still running when its input ends; none is.
    tokio::time::timeout(Duration::from_secs(2), served)
        .await
        .expect("the session did not end after its input did")
        .unwrap()
        .unwrap();
    assert!(closed_at.elapsed() < Duration::from_secs(2));
}

/// One HTTP/1.1 POST to `/mcp` on a fresh connection, returning the connection.
async fn post(addr: std::net::SocketAddr, body: &serde_json::Value) -> tokio::net::TcpStream {
    post_in(addr, None, body).await
}

/// A POST in MCP session `session`, if one.
async fn post_in(
    addr: std::net::SocketAddr,
    session: Option<&str>,
    body: &serde_json::Value,
) -> tokio::net::TcpStream {
    let body = body.to_string();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let session = session
        .map(|id| format!("Mcp-Session-Id: {id}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-06-18\r\n\
         {session}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_http_connection_drops_its_job() {
    let executor = Arc::new(FakeExecutor::new(Policy::builtin()));
    let record = executor.record.clone();
    // Configured as airlock serve mounts it: stateless, JSON responses.
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true);
    let for_service: Arc<dyn airlock_mcp::Executor> = executor;
    let service = StreamableHttpService::new(
        move || Ok(RunCodeServer::new(for_service.clone())),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let app = axum::Router::new().route_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let mut init = post(addr, &initialize(0)).await;
    let mut reply = String::new();
    init.read_to_string(&mut reply).await.unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");

    let connection = post(addr, &call(1, json!({"code": LONG_JOB}))).await;
    assert!(
        eventually(Duration::from_secs(5), || record
            .running
            .load(Ordering::SeqCst)
            == 1)
        .await,
        "the long job never started"
    );
    drop(connection);
    assert!(
        eventually(PROMPT, || record.running.load(Ordering::SeqCst) == 0).await,
        "the job outlived its HTTP connection by more than {PROMPT:?}"
    );

    let mut quick = post(addr, &call(2, json!({"code": "print(1)"}))).await;
    let mut reply = String::new();
    tokio::time::timeout(PROMPT, quick.read_to_string(&mut reply))
        .await
        .expect("the next call was not answered promptly")
        .unwrap();
    assert!(
        reply.contains(r#"\"stdout\":\"done\\n\""#) || reply.contains("done\\n"),
        "{reply}"
    );
}

/// With sessions (rmcp's legacy session mode, for clients of protocol versions before
/// 2026-07-28), `notifications/cancelled` arrives on its own POST and rmcp routes it to the
/// session: the call's job is dropped although its connection stays open. Stateless
/// serving (as `airlock serve` mounts it) has no session to route it to; there only a
/// closed connection cancels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_notification_in_an_http_session_drops_its_job() {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    let executor = Arc::new(FakeExecutor::new(Policy::builtin()));
    let record = executor.record.clone();
    let config = StreamableHttpServerConfig::default().with_legacy_session_mode(true);
    let for_service: Arc<dyn airlock_mcp::Executor> = executor;
    let service = StreamableHttpService::new(
        move || Ok(RunCodeServer::new(for_service.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let app = axum::Router::new().route_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let mut init = post(addr, &initialize(0)).await;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        init.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let session = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("mcp-session-id")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no session id in {head}"));
    drop(init);
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let mut ack = post_in(addr, Some(&session), &initialized).await;
    let mut reply = String::new();
    ack.read_to_string(&mut reply).await.unwrap();
    assert!(reply.starts_with("HTTP/1.1 202"), "{reply}");

    let _connection = post_in(addr, Some(&session), &call(1, json!({"code": LONG_JOB}))).await;
    assert!(
        eventually(Duration::from_secs(5), || record
            .running
            .load(Ordering::SeqCst)
            == 1)
        .await,
        "the long job never started"
    );
    let mut cancel = post_in(addr, Some(&session), &cancelled(1)).await;
    let mut reply = String::new();
    cancel.read_to_string(&mut reply).await.unwrap();
    assert!(reply.starts_with("HTTP/1.1 202"), "{reply}");
    assert!(
        eventually(PROMPT, || record.running.load(Ordering::SeqCst) == 0).await,
        "the job outlived its cancel notification by more than {PROMPT:?}"
    );
}
