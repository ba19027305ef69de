//! Allowed targets answer through the proxy, and their records say so.

use airlock_proxy::Verdict;
use pretty_assertions::assert_eq;

use super::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_tunnel_reaches_an_allowed_host() {
    let upstream = Upstream::start(Upstream::body("through the tunnel")).await;
    let proxy = Setup::allowing(&[entry("allowed.test", upstream.port())]).start();
    let target = entry("allowed.test", upstream.port());
    let (status, _, tunnel) = connect(proxy.addr, &target).await;
    assert_eq!(status, 200);
    let (answer, sent) = get_in_tunnel(tunnel, &target, "/inside", &[]).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.text(), "through the tunnel");
    let received = answer.head.len() + answer.body.len();
    assert!(upstream.requests()[0].starts_with("GET /inside HTTP/1.1\r\n"));

    let summary = proxy.settle_and_shutdown(1).await;
    assert_eq!(summary.connections.len(), 1, "{summary:#?}");
    let record = &summary.connections[0];
    assert_eq!(record.method, "CONNECT");
    assert_eq!(record.host, "allowed.test");
    assert_eq!(record.port, upstream.port());
    assert_eq!(record.resolved, Some("127.0.0.1".parse().unwrap()));
    assert_eq!(record.verdict, Verdict::Allowed);
    assert_eq!(record.status, Some(200));
    assert_eq!(record.error, None);
    assert_eq!(record.limit, None);
    assert_eq!(record.bytes_up, sent as u64);
    assert_eq!(record.bytes_down, received as u64);
    assert_eq!(summary.bytes_up, sent as u64);
    assert_eq!(summary.bytes_down, received as u64);
    assert_eq!(summary.upstream_connects, 1);
    assert_eq!(summary.limit_hit, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_get_reaches_an_allowed_host() {
    let upstream = Upstream::start(Upstream::body("plain http")).await;
    let proxy = Setup::allowing(&[entry("allowed.test", upstream.port())]).start();
    let url = format!("http://Allowed.Test.:{}/path?q=1", upstream.port());
    let answer = get(
        proxy.addr,
        &url,
        &[
            "Proxy-Authorization: Basic c2VjcmV0",
            "Proxy-Connection: keep-alive",
            "X-Job: 1",
        ],
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.text(), "plain http");

    let seen = upstream.requests();
    assert_eq!(seen.len(), 1);
    let request = seen[0].to_ascii_lowercase();
    assert!(
        request.starts_with("get /path?q=1 http/1.1\r\n"),
        "{request}"
    );
    assert!(
        request.contains(&format!("\r\nhost: allowed.test:{}\r\n", upstream.port())),
        "{request}"
    );
    assert!(request.contains("\r\nx-job: 1\r\n"), "{request}");
    assert!(!request.contains("proxy-"), "{request}");

    let summary = proxy.settle_and_shutdown(1).await;
    assert_eq!(summary.connections.len(), 1, "{summary:#?}");
    let record = &summary.connections[0];
    assert_eq!(record.method, "GET");
    assert_eq!(record.host, "allowed.test");
    assert_eq!(record.verdict, Verdict::Allowed);
    assert_eq!(record.status, Some(200));
    assert_eq!(record.error, None);
    assert_eq!(record.resolved, Some("127.0.0.1".parse().unwrap()));
    assert!(record.bytes_up > 0 && record.bytes_down > 0, "{record:?}");
    assert_eq!(record.bytes_up, summary.bytes_up);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_body_is_forwarded_and_the_host_header_is_the_target() {
    let upstream = Upstream::start(Upstream::body("ok")).await;
    let proxy = Setup::allowing(&[entry("allowed.test", upstream.port())]).start();
    let request = format!(
        "POST http://allowed.test:{}/submit HTTP/1.1\r\nHost: evil.test\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello world",
        upstream.port()
    );
    let answer = send_raw(proxy.addr, request.as_bytes()).await;
    assert_eq!(answer.status, 200);
    let seen = upstream.requests();
    assert!(seen[0].ends_with("\r\n\r\nhello world"), "{}", seen[0]);
    assert!(!seen[0].contains("evil.test"), "{}", seen[0]);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcards_and_ip_literals_on_the_allowlist() {
    let upstream = Upstream::start(Upstream::body("ok")).await;
    let port = upstream.port();
    let proxy = Setup::allowing(&[entry("*.wild.test", port), entry("127.0.0.1", port)]).start();
    for host in ["sub.wild.test", "deep.sub.wild.test", "127.0.0.1"] {
        let answer = get(proxy.addr, &format!("http://{host}:{port}/"), &[]).await;
        assert_eq!(answer.status, 200, "{host}: {answer:?}");
    }
    let apex = get(proxy.addr, &format!("http://wild.test:{port}/"), &[]).await;
    assert_eq!(apex.status, 403, "{apex:?}");
    let summary = proxy.settle_and_shutdown(4).await;
    assert_eq!(summary.counts(), (3, 1), "{summary:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_with_mixed_answers_is_reached_through_its_allowed_answer_only() {
    let upstream = Upstream::start(Upstream::body("ok")).await;
    let proxy = Setup::allowing(&[entry("mixed.test", upstream.port())]).start();
    let answer = get(
        proxy.addr,
        &format!("http://mixed.test:{}/", upstream.port()),
        &[],
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    // 10.0.0.1 and 169.254.169.254 came first in the answers, and were never dialled.
    assert_eq!(
        proxy.dialled.all(),
        vec![format!("127.0.0.1:{}", upstream.port()).parse().unwrap()]
    );
    let summary = proxy.shutdown().await;
    assert_eq!(
        summary.connections[0].resolved,
        Some("127.0.0.1".parse().unwrap())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_carries_several_requests_each_recorded() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = Upstream::start(Upstream::body("x")).await;
    let proxy = Setup::allowing(&[entry("allowed.test", upstream.port())]).start();
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    for i in 0..3 {
        let request = format!(
            "GET http://allowed.test:{}/{i} HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
            upstream.port()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let head = read_head(&mut stream).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let mut body = [0u8; 1];
        stream.read_exact(&mut body).await.unwrap();
    }
    drop(stream);
    let summary = proxy.settle_and_shutdown(3).await;
    assert_eq!(summary.counts(), (3, 0), "{summary:#?}");
    assert_eq!(summary.upstream_connects, 3);
}

/// True when `/etc/hosts` maps `localhost`, so resolving it sends no DNS query.
fn hosts_file_has_localhost() -> bool {
    std::fs::read_to_string("/etc/hosts").is_ok_and(|hosts| {
        hosts.lines().any(|line| {
            let mut fields = line.split('#').next().unwrap_or("").split_whitespace();
            fields.next().is_some() && fields.any(|name| name == "localhost")
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_system_resolver_pins_localhost_to_an_allowed_address() {
    airlock_testkit::require!(
        hosts_file_has_localhost(),
        "/etc/hosts does not map localhost (resolving it would query DNS)"
    );
    let upstream = Upstream::start(Upstream::body("system resolver")).await;
    let target = entry("localhost", upstream.port());
    let network = airlock_core::policy::NetworkPolicy {
        mode: airlock_core::policy::NetworkMode::Proxy,
        allow: vec![target.clone()],
        allow_ranges: vec!["127.0.0.1/32".to_owned()],
        ..Default::default()
    };
    let dialled = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = dialled.clone();
    let config = airlock_proxy::ProxyConfig::from_policy(&network, &network.allow, |_| None)
        .unwrap()
        .with_connect_gate(std::sync::Arc::new(move |addr: std::net::SocketAddr| {
            seen.lock().unwrap().push(addr);
            addr.ip().is_loopback()
        }));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let handle = airlock_proxy::spawn(listener, std::sync::Arc::new(config)).unwrap();
    let answer = get(handle.local_addr(), &format!("http://{target}/"), &[]).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.text(), "system resolver");
    // ::1, if the resolver gave it, is outside allow_ranges and was never dialled.
    let dialled = dialled.lock().unwrap().clone();
    assert_eq!(dialled, vec![upstream.addr]);
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_host_that_refuses_the_connect_gets_502_and_an_allowed_record() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let proxy = Setup::allowing(&[entry("allowed.test", port)]).start();
    let answer = get(proxy.addr, &format!("http://allowed.test:{port}/"), &[]).await;
    assert_eq!(answer.status, 502, "{answer:?}");
    assert!(answer.text().contains("connect failed"), "{answer:?}");
    let (status, _, _) = connect(proxy.addr, &entry("allowed.test", port)).await;
    assert_eq!(status, 502);
    let summary = proxy.settle_and_shutdown(2).await;
    for record in &summary.connections {
        assert_eq!(record.verdict, Verdict::Allowed);
        assert_eq!(record.status, Some(502));
        assert!(
            record
                .error
                .as_deref()
                .is_some_and(|e| e.starts_with("connect failed")),
            "{record:?}"
        );
    }
    assert_eq!(summary.upstream_connects, 2);
}
