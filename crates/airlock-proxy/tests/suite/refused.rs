//! Everything the proxy must refuse, refused before any connect, and recorded.

use std::time::Duration;

use airlock_proxy::{LimitKind, Verdict};
use pretty_assertions::assert_eq;

use super::common::*;

fn denied(reason: &str) -> Verdict {
    Verdict::Denied {
        reason: reason.to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_not_on_the_list_is_refused_with_403() {
    let upstream = Upstream::start(Upstream::body("never")).await;
    let port = upstream.port();
    let proxy = Setup::allowing(&[entry("allowed.test", port)]).start();

    let answer = get(proxy.addr, &format!("http://other.test:{port}/"), &[]).await;
    assert_eq!(answer.status, 403);
    assert_eq!(
        answer.text(),
        format!("airlock proxy: other.test:{port} is not on the allowlist\n")
    );
    let (status, _, _) = connect(proxy.addr, &entry("other.test", port)).await;
    assert_eq!(status, 403);
    // The right host on another port is another entry.
    let (status, _, _) = connect(proxy.addr, "allowed.test:443").await;
    assert_eq!(status, 403);

    assert!(upstream.requests().is_empty());
    assert!(proxy.dialled.all().is_empty());
    let summary = proxy.shutdown().await;
    let verdicts: Vec<_> = summary
        .connections
        .iter()
        .map(|r| {
            (
                r.method.as_str(),
                r.host.as_str(),
                r.port,
                r.verdict.clone(),
                r.status,
            )
        })
        .collect();
    let reason = format!("other.test:{port} is not on the allowlist");
    assert_eq!(
        verdicts,
        vec![
            ("GET", "other.test", port, denied(&reason), Some(403)),
            ("CONNECT", "other.test", port, denied(&reason), Some(403)),
            (
                "CONNECT",
                "allowed.test",
                443,
                denied("allowed.test:443 is not on the allowlist"),
                Some(403)
            ),
        ]
    );
    assert_eq!(summary.upstream_connects, 0);
    assert!(summary.connections.iter().all(|r| r.resolved.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_name_resolving_to_a_blocked_range_is_refused() {
    let proxy = Setup::allowing(&[
        "private.test:80".to_owned(),
        "cgnat.test:80".to_owned(),
        "mapped.test:80".to_owned(),
        "ula.test:80".to_owned(),
        "loopback6.test:80".to_owned(),
    ])
    .start();
    for host in [
        "private.test",
        "cgnat.test",
        "mapped.test",
        "ula.test",
        "loopback6.test",
    ] {
        let answer = get(proxy.addr, &format!("http://{host}/"), &[]).await;
        assert_eq!(answer.status, 403, "{host}: {answer:?}");
        assert!(
            answer.text().contains("blocked range"),
            "{host}: {answer:?}"
        );
        let (status, _, _) = connect(proxy.addr, &format!("{host}:80")).await;
        assert_eq!(status, 403, "{host}");
    }
    assert!(proxy.dialled.all().is_empty(), "{:?}", proxy.dialled.all());
    let summary = proxy.shutdown().await;
    assert_eq!(summary.counts(), (0, 10));
    assert_eq!(summary.upstream_connects, 0);
    let private = &summary.connections[0];
    assert_eq!(
        private.verdict,
        denied("10.0.0.1 is in blocked range 10.0.0.0/8 (private, RFC 1918)")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_needs_allow_ranges() {
    let upstream = Upstream::start(Upstream::body("never")).await;
    let mut setup = Setup::allowing(&[entry("allowed.test", upstream.port())]);
    setup.allow_ranges.clear();
    let proxy = setup.start();
    let answer = get(
        proxy.addr,
        &format!("http://allowed.test:{}/", upstream.port()),
        &[],
    )
    .await;
    assert_eq!(answer.status, 403);
    assert!(
        answer.text().contains("127.0.0.0/8 (loopback)"),
        "{answer:?}"
    );
    assert!(upstream.requests().is_empty());
    assert!(proxy.dialled.all().is_empty());
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_metadata_is_refused_and_never_connected() {
    // Both by name and as the literal, and both allowlisted: the range check still refuses.
    let proxy =
        Setup::allowing(&["metadata.test".to_owned(), "169.254.169.254".to_owned()]).start();
    let started = std::time::Instant::now();
    for url in [
        "http://metadata.test/latest/meta-data/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/latest/meta-data/",
        "http://[::ffff:a9fe:a9fe]/",
        "http://[64:ff9b::a9fe:a9fe]/",
    ] {
        let answer = get(proxy.addr, url, &[]).await;
        assert!(
            answer.status == 403,
            "{url}: {} {}",
            answer.status,
            answer.text()
        );
    }
    for target in [
        "metadata.test:443",
        "169.254.169.254:443",
        "169.254.169.254:80",
    ] {
        let (status, _, _) = connect(proxy.addr, target).await;
        assert_eq!(status, 403, "{target}");
    }
    // Refused at once: no connect was attempted (nothing to time out on).
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(proxy.dialled.all().is_empty(), "{:?}", proxy.dialled.all());
    let summary = proxy.shutdown().await;
    assert_eq!(summary.upstream_connects, 0);
    assert_eq!(summary.counts(), (0, 8), "{summary:#?}");
    for record in &summary.connections {
        assert_eq!(record.resolved, None);
        assert_eq!(record.bytes_up + record.bytes_down, 0);
    }
    assert_eq!(
        summary.connections[1].verdict,
        denied(
            "169.254.169.254 is in blocked range 169.254.0.0/16 (link-local, cloud metadata, RFC 3927)"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alternative_ip_encodings_are_refused_outright() {
    let upstream = Upstream::start(Upstream::body("never")).await;
    let port = upstream.port();
    let proxy = Setup::allowing(&[entry("127.0.0.1", port)]).start();
    let encodings = [
        "0x7f.1",
        "2130706433",
        "017700000001",
        "127.1",
        "0177.0.0.1",
        "0x7f000001",
        "127.0.0.01",
        "0x7f.0x0.0x0.0x1",
    ];
    for host in encodings {
        let answer = get(proxy.addr, &format!("http://{host}:{port}/"), &[]).await;
        assert_eq!(answer.status, 403, "{host}: {answer:?}");
        assert!(
            answer.text().contains("non-canonical"),
            "{host}: {answer:?}"
        );
        let (status, _, _) = connect(proxy.addr, &format!("{host}:{port}")).await;
        assert_eq!(status, 403, "{host}");
    }
    // IPv6 spellings of the allowed literal are not the allowed literal.
    for host in ["[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "[::1]"] {
        let answer = get(proxy.addr, &format!("http://{host}:{port}/"), &[]).await;
        assert_eq!(answer.status, 403, "{host}: {answer:?}");
    }
    assert!(upstream.requests().is_empty());
    assert!(proxy.dialled.all().is_empty());
    let summary = proxy.shutdown().await;
    assert_eq!(summary.counts(), (0, encodings.len() * 2 + 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_are_not_proxy_requests_get_400_and_a_record() {
    let proxy = Setup::allowing(&["allowed.test".to_owned()]).start();
    let cases: [(&[u8], u16); 6] = [
        (b"GET /local HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n", 400),
        (b"GET https://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n", 400),
        (b"GET ftp://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n", 400),
        (b"GET http://user:pw@allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n", 400),
        (b"CONNECT allowed.test HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n", 400),
        (b"NOT HTTP AT ALL\r\n\r\n", 400),
    ];
    for (request, status) in cases {
        let answer = send_raw(proxy.addr, request).await;
        assert_eq!(
            answer.status,
            status,
            "{}: {answer:?}",
            String::from_utf8_lossy(request)
        );
    }
    assert!(proxy.dialled.all().is_empty());
    let summary = proxy.shutdown().await;
    assert_eq!(summary.counts(), (0, cases.len()), "{summary:#?}");
    assert!(summary.connections.iter().all(|r| r.status == Some(400)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_request_head_gets_431_and_a_record() {
    let proxy = Setup::allowing(&["allowed.test".to_owned()]).start();
    let big = "a".repeat(airlock_proxy::MAX_REQUEST_HEAD_BYTES + 1);
    let request =
        format!("GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nX-Big: {big}\r\n\r\n");
    let answer = send_raw(proxy.addr, request.as_bytes()).await;
    assert_eq!(answer.status, 431);
    let summary = proxy.shutdown().await;
    assert_eq!(summary.connections.len(), 1);
    assert_eq!(
        summary.connections[0].limit,
        Some(LimitKind::RequestHeadSize)
    );
    assert!(matches!(
        summary.connections[0].verdict,
        Verdict::Denied { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_never_dials_itself() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    // Allow-list the proxy's own future address: it must still refuse to loop.
    let network = airlock_core::policy::NetworkPolicy {
        mode: airlock_core::policy::NetworkMode::Proxy,
        allow: vec![entry("127.0.0.1", port)],
        allow_ranges: vec!["127.0.0.0/8".to_owned()],
        ..Default::default()
    };
    let config = airlock_proxy::ProxyConfig::from_policy(&network, &network.allow, |_| None)
        .unwrap()
        .with_resolver(resolver());
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let handle = airlock_proxy::spawn(listener, std::sync::Arc::new(config)).unwrap();
    let answer = get(
        handle.local_addr(),
        &format!("http://127.0.0.1:{port}/"),
        &[],
    )
    .await;
    assert_eq!(answer.status, 403, "{answer:?}");
    assert!(answer.text().contains("the proxy itself"), "{answer:?}");
    let summary = handle.shutdown().await;
    assert_eq!(summary.upstream_connects, 0);
}

/// A resolver whose first answer for a name is 127.0.0.1 and every later one 127.0.0.2,
/// with the count of lookups.
fn rebinding_resolver() -> (
    airlock_proxy::Resolver,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let lookups = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = lookups.clone();
    let resolve = airlock_proxy::ResolveFn(std::sync::Arc::new(move |name: &str| {
        assert_eq!(name, "rebind.test");
        let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let ip = if n == 0 { "127.0.0.1" } else { "127.0.0.2" };
        Ok(vec![ip.parse().unwrap()])
    }));
    (airlock_proxy::Resolver::Function(resolve), lookups)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_whose_answer_changes_after_the_check_is_dialled_at_the_checked_address() {
    // DNS rebinding: the checked answer is the allowed 127.0.0.1; any later lookup
    // answers 127.0.0.2, outside the allowed 127.0.0.1/32, where a canary listens on the
    // same port. A proxy that resolved again to connect would reach the canary.
    let upstream = Upstream::start(Upstream::body("checked")).await;
    let port = upstream.port();
    let canary = std::net::TcpListener::bind(("127.0.0.2", port)).unwrap();
    canary.set_nonblocking(true).unwrap();
    for tunnel in [false, true] {
        let (resolver, lookups) = rebinding_resolver();
        let mut setup = Setup::allowing(&[entry("rebind.test", port)]);
        setup.resolver = Some(resolver);
        let proxy = setup.start();
        if tunnel {
            let (status, _, _) = connect(proxy.addr, &entry("rebind.test", port)).await;
            assert_eq!(status, 200);
        } else {
            let answer = get(proxy.addr, &format!("http://rebind.test:{port}/"), &[]).await;
            assert_eq!(answer.status, 200);
            assert_eq!(answer.text(), "checked");
        }
        // One lookup, and the connect went to the address that was checked.
        assert_eq!(lookups.load(std::sync::atomic::Ordering::SeqCst), 1);
        let dialled = proxy.dialled.all();
        assert_eq!(dialled.len(), 1, "{dialled:?}");
        assert_eq!(dialled[0].ip().to_string(), "127.0.0.1");
        assert!(
            canary.accept().is_err(),
            "the proxy reached the rebound address"
        );
        let summary = proxy.settle_and_shutdown(1).await;
        assert_eq!(
            summary.connections[0].resolved.map(|ip| ip.to_string()),
            Some("127.0.0.1".to_owned())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_rebinds_to_a_blocked_address_on_its_next_lookup_is_refused_then() {
    // The reverse order: a request whose (only) lookup answers the blocked address is
    // refused, whatever an earlier lookup of the same name answered.
    let upstream = Upstream::start(Upstream::body("checked")).await;
    let port = upstream.port();
    let lookups = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = lookups.clone();
    let rebinding = airlock_proxy::ResolveFn(std::sync::Arc::new(move |_: &str| {
        let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let ip = if n == 0 {
            "127.0.0.1"
        } else {
            "169.254.169.254"
        };
        Ok(vec![ip.parse().unwrap()])
    }));
    let mut setup = Setup::allowing(&[entry("rebind.test", port)]);
    setup.resolver = Some(airlock_proxy::Resolver::Function(rebinding));
    let proxy = setup.start();
    let first = get(proxy.addr, &format!("http://rebind.test:{port}/"), &[]).await;
    assert_eq!(first.status, 200);
    let second = get(proxy.addr, &format!("http://rebind.test:{port}/"), &[]).await;
    assert_eq!(second.status, 403, "{}", second.text());
    assert!(
        second.text().contains("169.254.169.254"),
        "{}",
        second.text()
    );
    assert_eq!(proxy.dialled.all().len(), 1);
    proxy.settle_and_shutdown(2).await;
}
