//! Limits end connections, refuse new ones, and show in the records.

use std::time::{Duration, Instant};

use airlock_core::ByteSize;
use airlock_proxy::{LimitKind, Verdict};
use pretty_assertions::assert_eq;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_after_the_last_allowed_one_is_refused() {
    let upstream = Upstream::start(Upstream::body("ok")).await;
    let port = upstream.port();
    let mut setup = Setup::allowing(&[entry("allowed.test", port)]);
    setup.limits.connections = 3;
    let proxy = setup.start();
    // Denied requests use the budget too: it bounds what a job can make the proxy do.
    let denied = get(proxy.addr, "http://other.test/", &[]).await;
    assert_eq!(denied.status, 403);
    for _ in 0..2 {
        let answer = get(proxy.addr, &format!("http://allowed.test:{port}/"), &[]).await;
        assert_eq!(answer.status, 200);
    }
    let refused = get(proxy.addr, &format!("http://allowed.test:{port}/"), &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.text(), "airlock proxy: connection limit\n");
    let (status, _, _) = connect(proxy.addr, &entry("allowed.test", port)).await;
    assert_eq!(status, 429);
    assert_eq!(upstream.requests().len(), 2);

    let summary = proxy.settle_and_shutdown(3).await;
    assert_eq!(summary.counts(), (2, 1), "{summary:#?}");
    assert_eq!(summary.refused_after_limit, 2);
    assert_eq!(summary.limit_hit, Some(LimitKind::Connections));
    assert_eq!(summary.upstream_connects, 2);
    // Every request is audited: the three with records, and the two refused after the
    // limit as one record with their number.
    let report = summary.into_report();
    assert_eq!(report.counts.connections, 5);
    assert_eq!(report.counts.denied, 3);
    assert_eq!(report.connections.len(), 4, "{:#?}", report.connections);
    let last = report.connections.last().unwrap();
    assert_eq!(last["verdict"], "denied", "{last:#}");
    assert_eq!(last["limit"], "connections");
    assert_eq!(last["refused"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_byte_cap_cuts_a_big_download_in_a_tunnel_and_refuses_what_follows() {
    let body = vec![b'x'; 1 << 20];
    let upstream = Upstream::start(Reply::Body(std::sync::Arc::new(body))).await;
    let target = entry("allowed.test", upstream.port());
    let mut setup = Setup::allowing(std::slice::from_ref(&target));
    let cap = 64 * 1024;
    setup.limits.bytes = ByteSize::bytes(cap);
    let proxy = setup.start();

    let (status, _, tunnel) = connect(proxy.addr, &target).await;
    assert_eq!(status, 200);
    let (answer, sent) = get_in_tunnel(tunnel, &target, "/big", &[]).await;
    let received = (answer.head.len() + answer.body.len()) as u64;
    assert!(
        received <= cap - sent as u64,
        "{received} bytes came through a {cap}-byte cap"
    );
    assert!(answer.body.len() < 1 << 20);

    // The budget is spent: the next request is refused before anything is dialled.
    let next = get(proxy.addr, &format!("http://{target}/"), &[]).await;
    assert_eq!(next.status, 429);
    assert_eq!(next.text(), "airlock proxy: byte limit\n");

    let summary = proxy.settle_and_shutdown(2).await;
    assert_eq!(summary.limit_hit, Some(LimitKind::Bytes));
    assert_eq!(summary.upstream_connects, 1);
    assert_eq!(summary.bytes_up + summary.bytes_down, cap);
    let tunnel = &summary.connections[0];
    assert_eq!(tunnel.method, "CONNECT");
    assert_eq!(tunnel.verdict, Verdict::Allowed);
    assert_eq!(tunnel.limit, Some(LimitKind::Bytes));
    assert_eq!(tunnel.bytes_up, sent as u64);
    assert_eq!(tunnel.bytes_down, cap - sent as u64);
    let refused = &summary.connections[1];
    assert_eq!(refused.limit, Some(LimitKind::Bytes));
    assert!(matches!(refused.verdict, Verdict::Denied { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_byte_cap_cuts_a_big_plain_http_download() {
    let body = vec![b'y'; 1 << 20];
    let upstream = Upstream::start(Reply::Body(std::sync::Arc::new(body))).await;
    let target = entry("allowed.test", upstream.port());
    let mut setup = Setup::allowing(std::slice::from_ref(&target));
    let cap = 100 * 1024;
    setup.limits.bytes = ByteSize::bytes(cap);
    let proxy = setup.start();

    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    let request =
        format!("GET http://{target}/big HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut body = Vec::new();
    let _ = tokio::time::timeout(STEP, stream.read_to_end(&mut body))
        .await
        .expect("the cut download did not end");
    assert!((body.len() as u64) < cap, "{} bytes", body.len());

    let summary = proxy.settle_and_shutdown(1).await;
    let record = &summary.connections[0];
    assert_eq!(record.limit, Some(LimitKind::Bytes), "{record:#?}");
    assert_eq!(record.status, Some(200));
    assert_eq!(record.bytes_up + record.bytes_down, cap);
    assert_eq!(summary.limit_hit, Some(LimitKind::Bytes));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_timeout_closes_a_silent_tunnel() {
    let upstream = Upstream::start(Reply::Silent).await;
    let target = entry("allowed.test", upstream.port());
    let mut setup = Setup::allowing(std::slice::from_ref(&target));
    setup.limits.idle_timeout = Duration::from_millis(300);
    let proxy = setup.start();

    let (status, _, mut tunnel) = connect(proxy.addr, &target).await;
    assert_eq!(status, 200);
    tunnel.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let started = Instant::now();
    let mut rest = Vec::new();
    // Closed by the proxy (EOF or reset, either way).
    let _ = tokio::time::timeout(STEP, tunnel.read_to_end(&mut rest))
        .await
        .expect("the idle tunnel was not closed");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert!(rest.is_empty());

    let summary = proxy.settle_and_shutdown(1).await;
    let record = &summary.connections[0];
    assert_eq!(record.limit, Some(LimitKind::IdleTimeout), "{record:#?}");
    assert_eq!(record.error.as_deref(), Some("idle timeout"));
    assert_eq!(record.bytes_up, 18);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_timeout_closes_a_silent_plain_http_request() {
    let upstream = Upstream::start(Reply::Silent).await;
    let target = entry("allowed.test", upstream.port());
    let mut setup = Setup::allowing(std::slice::from_ref(&target));
    setup.limits.idle_timeout = Duration::from_millis(300);
    let proxy = setup.start();
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    let request = format!("GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(STEP, stream.read_to_end(&mut rest))
        .await
        .expect("the idle request was not closed");
    let summary = proxy.settle_and_shutdown(1).await;
    assert_eq!(
        summary.connections[0].limit,
        Some(LimitKind::IdleTimeout),
        "{summary:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_nothing_is_closed_after_the_idle_timeout() {
    let mut setup = Setup::allowing(&["allowed.test".to_owned()]);
    setup.limits.idle_timeout = Duration::from_millis(200);
    let proxy = setup.start();
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(b"GET http://allowed.test/ HT")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(STEP, stream.read_to_end(&mut rest))
        .await
        .expect("the silent client was not closed");
    proxy.shutdown().await;
}

/// A listener on 127.0.0.1 whose accept queue is full: a further connect gets no answer
/// to its SYN and hangs, without leaving loopback.
async fn full_listener() -> (tokio::net::TcpListener, Vec<TcpStream>) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..8 {
        match tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => fillers.push(stream),
            _ => break,
        }
    }
    (listener, fillers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connect_timeout_gives_504_and_a_record() {
    let (listener, _fillers) = full_listener().await;
    let port = listener.local_addr().unwrap().port();
    let target = entry("allowed.test", port);
    let mut setup = Setup::allowing(std::slice::from_ref(&target));
    setup.limits.connect_timeout = Duration::from_millis(400);
    let proxy = setup.start();

    let started = Instant::now();
    let answer = get(proxy.addr, &format!("http://{target}/"), &[]).await;
    assert_eq!(answer.status, 504, "{answer:?}");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(350), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    let (status, _, _) = connect(proxy.addr, &target).await;
    assert_eq!(status, 504);

    let summary = proxy.settle_and_shutdown(2).await;
    for record in &summary.connections {
        assert_eq!(record.verdict, Verdict::Allowed);
        assert_eq!(record.limit, Some(LimitKind::ConnectTimeout));
        assert_eq!(record.status, Some(504));
        assert_eq!(record.resolved, None);
    }
    assert_eq!(summary.upstream_connects, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cuts_an_open_tunnel_and_still_records_it() {
    let upstream = Upstream::start(Reply::Silent).await;
    let target = entry("allowed.test", upstream.port());
    let proxy = Setup::allowing(std::slice::from_ref(&target)).start();
    let (status, _, mut tunnel) = connect(proxy.addr, &target).await;
    assert_eq!(status, 200);
    tunnel.write_all(b"hello").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let proxy_addr = proxy.addr;
    let started = Instant::now();
    let summary = proxy.shutdown().await;
    assert!(started.elapsed() < Duration::from_secs(2));
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(STEP, tunnel.read_to_end(&mut rest))
        .await
        .expect("the tunnel stayed open after shutdown");
    assert_eq!(summary.connections.len(), 1);
    let record = &summary.connections[0];
    assert_eq!(record.error.as_deref(), Some("proxy shut down"));
    assert_eq!(record.bytes_up, 5);
    // And nothing accepts any more.
    assert!(TcpStream::connect(proxy_addr).await.is_err());
}
