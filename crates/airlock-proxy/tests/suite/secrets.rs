//! Secret placeholders become the real value only toward the secret's own host.

use airlock_core::policy::{SecretSpec, SubstitutePlace};
use std::sync::Arc;

use pretty_assertions::assert_eq;

use super::common::*;

const PLACEHOLDER: &str = "airlock-placeholder-api-token";
const REAL: &str = "sk-real-value-0123456789";

fn with_secret(scope: &str, allow: &[String]) -> Setup {
    let mut setup = Setup::allowing(allow);
    setup.secrets = vec![SecretSpec {
        env: "API_TOKEN".to_owned(),
        placeholder: PLACEHOLDER.to_owned(),
        value_env: "REAL_API_TOKEN".to_owned(),
        hosts: vec![scope.to_owned()],
        substitute: vec![SubstitutePlace::Headers, SubstitutePlace::Query],
    }];
    setup
        .secret_values
        .insert("REAL_API_TOKEN".to_owned(), REAL.to_owned());
    setup
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_placeholder_is_replaced_only_for_its_own_host() {
    let api = Upstream::start(Upstream::body("api")).await;
    let other = Upstream::start(Upstream::body("other")).await;
    let proxy = with_secret(
        &entry("api.test", api.port()),
        &[
            entry("api.test", api.port()),
            entry("other.test", other.port()),
            // The secret's host on another port is not the secret's scope.
            entry("api.test", other.port()),
        ],
    )
    .start();
    let auth = format!("Authorization: Bearer {PLACEHOLDER}");
    let extra = format!("X-Token: a {PLACEHOLDER} b {PLACEHOLDER}");
    for (host, port) in [
        ("api.test", api.port()),
        ("other.test", other.port()),
        ("api.test", other.port()),
    ] {
        let url = format!("http://{host}:{port}/v1/{PLACEHOLDER}?key={PLACEHOLDER}&x=1");
        let answer = get(proxy.addr, &url, &[&auth, &extra]).await;
        assert_eq!(answer.status, 200, "{host}:{port} {answer:?}");
    }

    let at_api = api.requests();
    assert_eq!(at_api.len(), 1);
    let request = &at_api[0];
    assert!(
        request.starts_with(&format!(
            "GET /v1/{PLACEHOLDER}?key={REAL}&x=1 HTTP/1.1\r\n"
        )),
        "{request}"
    );
    assert!(
        request.contains(&format!("authorization: Bearer {REAL}\r\n")),
        "{request}"
    );
    assert!(
        request.contains(&format!("x-token: a {REAL} b {REAL}\r\n")),
        "{request}"
    );

    let at_other = other.requests();
    assert_eq!(at_other.len(), 2);
    for request in &at_other {
        assert!(!request.contains(REAL), "the real value leaked: {request}");
        assert!(request.contains(&format!("authorization: Bearer {PLACEHOLDER}\r\n")));
        assert!(request.contains(&format!("?key={PLACEHOLDER}&x=1")));
    }

    let summary = proxy.settle_and_shutdown(3).await;
    let json = serde_json::to_string(&summary).unwrap();
    assert!(!json.contains(REAL));
    assert!(!format!("{summary:?}").contains(REAL));
    // Counted, never shown: the query's one and the headers' three, toward the secret's
    // own host only; the same total for the job.
    let substituted: Vec<(u16, u64)> = summary
        .connections
        .iter()
        .map(|r| (r.port, r.secrets_substituted))
        .collect();
    assert_eq!(
        substituted,
        vec![(api.port(), 4), (other.port(), 0), (other.port(), 0)],
        "{json}"
    );
    let report = summary.into_report();
    assert_eq!(report.counts.secrets_substituted, 4);
    assert_eq!(report.counts.secrets_scrubbed, 0);
    assert_eq!(report.connections[0]["secrets_substituted"], 4);
    assert!(report.connections[1].get("secrets_substituted").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_query_is_left_alone_unless_the_secret_names_it() {
    let api = Upstream::start(Upstream::body("api")).await;
    let target = entry("api.test", api.port());
    let mut setup = with_secret(&target, std::slice::from_ref(&target));
    setup.secrets[0].substitute = vec![SubstitutePlace::Headers];
    let proxy = setup.start();
    let auth = format!("Authorization: Bearer {PLACEHOLDER}");
    let url = format!("http://{target}/?key={PLACEHOLDER}");
    assert_eq!(get(proxy.addr, &url, &[&auth]).await.status, 200);
    let seen = &api.requests()[0];
    assert!(
        seen.starts_with(&format!("GET /?key={PLACEHOLDER} ")),
        "{seen}"
    );
    assert!(
        seen.contains(&format!("authorization: Bearer {REAL}")),
        "{seen}"
    );
    proxy.settle_and_shutdown(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_to_another_host_is_opaque_so_the_placeholder_passes_unchanged() {
    let other = Upstream::start(Upstream::body("other")).await;
    let target = entry("other.test", other.port());
    let proxy = with_secret(&entry("api.test", 443), std::slice::from_ref(&target)).start();
    let (status, _, tunnel) = connect(proxy.addr, &target).await;
    assert_eq!(status, 200);
    let auth = format!("Authorization: Bearer {PLACEHOLDER}");
    let (answer, _) = get_in_tunnel(tunnel, &target, "/", &[&auth]).await;
    assert_eq!(answer.status, 200);
    let seen = other.requests();
    assert!(seen[0].contains(&auth), "{}", seen[0]);
    assert!(!seen[0].contains(REAL));
    let summary = proxy.settle_and_shutdown(1).await;
    // Not intercepted: the proxy cannot see the placeholder, so none is listed.
    assert!(!summary.connections[0].intercepted);
    assert!(summary.connections[0].unbound_placeholders.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wildcard_scope_covers_subdomains_only() {
    let upstream = Upstream::start(Upstream::body("ok")).await;
    let port = upstream.port();
    let proxy = with_secret(
        &entry("*.wild.test", port),
        &[entry("*.wild.test", port), entry("wild.test", port)],
    )
    .start();
    let auth = format!("Authorization: {PLACEHOLDER}");
    for host in ["sub.wild.test", "wild.test"] {
        let answer = get(proxy.addr, &format!("http://{host}:{port}/"), &[&auth]).await;
        assert_eq!(answer.status, 200);
    }
    let seen = upstream.requests();
    let to_sub = seen
        .iter()
        .find(|r| r.contains("host: sub.wild.test"))
        .unwrap();
    let to_apex = seen.iter().find(|r| r.contains("host: wild.test")).unwrap();
    assert!(to_sub.contains(REAL), "{to_sub}");
    assert!(!to_apex.contains(REAL), "{to_apex}");
    proxy.settle_and_shutdown(2).await;
}

/// Reads a chunked body as the job would see it (the proxy re-frames it).
fn unchunk(answer: &Answer) -> String {
    let head = answer.head.to_ascii_lowercase();
    if !head.contains("transfer-encoding: chunked") {
        return answer.text();
    }
    let mut body = answer.body.as_slice();
    let mut out = Vec::new();
    loop {
        let line_end = find(body, b"\r\n").expect("chunk size line");
        let size =
            usize::from_str_radix(std::str::from_utf8(&body[..line_end]).unwrap().trim(), 16)
                .unwrap();
        body = &body[line_end + 2..];
        if size == 0 {
            break;
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
    String::from_utf8(out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_echoing_the_secret_hands_back_only_the_placeholder() {
    use base64::Engine as _;
    let api = Upstream::start(Reply::Echo).await;
    let target = entry("api.test", api.port());
    let proxy = with_secret(&target, std::slice::from_ref(&target)).start();
    let echo = format!("X-Echo: {PLACEHOLDER}");
    let auth = format!("Authorization: Bearer {PLACEHOLDER}");
    let answer = get(proxy.addr, &format!("http://{target}/"), &[&echo, &auth]).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    // The upstream did get the real value...
    assert!(api.requests()[0].contains(REAL));
    // ...and the job gets none of its forms back, in headers or body.
    let body = unchunk(&answer);
    let everything = format!("{}{body}", answer.head);
    for form in [
        REAL.to_owned(),
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(REAL),
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(REAL),
        hex::encode(REAL),
        hex::encode_upper(REAL),
        // What the echo sends: every byte but letters and digits escaped, `-` too (which
        // need not be, so a scrubber that knows only the shortest escape misses it).
        REAL.replace('-', "%2d"),
    ] {
        assert!(
            !everything.contains(&form),
            "{form} came back: {everything}"
        );
    }
    assert!(
        answer
            .head
            .to_ascii_lowercase()
            .contains(&format!("x-echoed: {PLACEHOLDER}")),
        "{}",
        answer.head
    );
    // Request head: the echo and authorization values; then 4 base64, 1 percent, 2 hex.
    assert_eq!(body.matches(PLACEHOLDER).count(), 2 + 7, "{body}");
    let summary = proxy.settle_and_shutdown(1).await;
    assert_eq!(summary.connections[0].secrets_scrubbed, 1 + 2 + 7);
    let json = serde_json::to_value(&summary.connections[0]).unwrap();
    assert_eq!(json["secrets_scrubbed"], 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_value_is_refused_toward_another_host() {
    use base64::Engine as _;
    let api = Upstream::start(Upstream::body("api")).await;
    let other = Upstream::start(Upstream::body("other")).await;
    let proxy = with_secret(
        &entry("api.test", api.port()),
        &[
            entry("api.test", api.port()),
            entry("other.test", other.port()),
        ],
    )
    .start();
    let b64 = base64::engine::general_purpose::STANDARD.encode(REAL);
    let url = format!("http://other.test:{}/", other.port());
    let in_header = get(proxy.addr, &url, &[&format!("X-Leak: {REAL}")]).await;
    let in_base64 = get(proxy.addr, &url, &[&format!("X-Leak: {b64}")]).await;
    let in_query = get(proxy.addr, &format!("{url}?q={}", hex::encode(REAL)), &[]).await;
    for answer in [&in_header, &in_base64, &in_query] {
        assert_eq!(answer.status, 403, "{answer:?}");
    }
    assert!(other.requests().is_empty(), "{:?}", other.requests());
    let summary = proxy.settle_and_shutdown(3).await;
    assert_eq!(summary.counts(), (0, 3));
    for record in &summary.connections {
        assert_eq!(record.host, "other.test");
        assert!(matches!(
            record.verdict,
            airlock_proxy::Verdict::Denied { .. }
        ));
    }
    assert!(!serde_json::to_string(&summary).unwrap().contains(REAL));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_answer_from_the_secrets_host_is_decoded_and_scrubbed() {
    use std::io::Write as _;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(format!("echoed: {REAL} and {}", hex::encode(REAL)).as_bytes())
        .unwrap();
    let api = Upstream::start(Reply::Gzip(Arc::new(gz.finish().unwrap()))).await;
    let target = entry("api.test", api.port());
    let proxy = with_secret(&target, std::slice::from_ref(&target)).start();
    let answer = get(proxy.addr, &format!("http://{target}/"), &[]).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        !answer
            .head
            .to_ascii_lowercase()
            .contains("content-encoding"),
        "{}",
        answer.head
    );
    assert_eq!(
        unchunk(&answer),
        format!("echoed: {PLACEHOLDER} and {PLACEHOLDER}")
    );
    assert!(
        api.requests()[0].contains("accept-encoding: identity\r\n"),
        "{}",
        api.requests()[0]
    );
    let summary = proxy.settle_and_shutdown(1).await;
    assert_eq!(summary.connections[0].secrets_scrubbed, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_gzip_answer_from_the_secrets_host_never_passes_raw() {
    let mut broken = b"\x1f\x8b".to_vec();
    broken.extend_from_slice(format!(" not really gzip {REAL}").as_bytes());
    let api = Upstream::start(Reply::Gzip(Arc::new(broken))).await;
    let target = entry("api.test", api.port());
    let proxy = with_secret(&target, std::slice::from_ref(&target)).start();
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let request =
        format!("GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n");
    tokio::io::AsyncWriteExt::write_all(&mut stream, request.as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(
        STEP,
        tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut got),
    )
    .await;
    let got = String::from_utf8_lossy(&got);
    // The body broke off (the head may have gone out first): none of the undecodable
    // bytes came.
    assert!(!got.contains("not really"), "{got}");
    assert!(!got.contains(REAL), "{got}");
    let summary = proxy.settle_and_shutdown(1).await;
    assert!(
        summary.connections[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("does not decode")),
        "{:?}",
        summary.connections[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_in_a_coding_the_proxy_cannot_read_is_refused() {
    let api = Upstream::start(raw_reply(&format!(
        "HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{REAL}",
        REAL.len()
    )))
    .await;
    let target = entry("api.test", api.port());
    let proxy = with_secret(&target, std::slice::from_ref(&target)).start();
    let answer = get(proxy.addr, &format!("http://{target}/"), &[]).await;
    assert_eq!(answer.status, 502, "{answer:?}");
    assert!(answer.text().contains("br coding"), "{}", answer.text());
    assert!(
        answer.head.contains("502 airlock proxy: "),
        "{}",
        answer.head
    );
    assert!(!answer.text().contains(REAL));
    proxy.settle_and_shutdown(1).await;
}

fn raw_reply(text: &str) -> Reply {
    Reply::Raw(Arc::new(text.as_bytes().to_vec()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_value_in_a_reason_phrase_or_a_header_name_does_not_come_back() {
    let api = Upstream::start(raw_reply(&format!(
        "HTTP/1.1 200 {REAL}\r\nX-{REAL}: 1\r\nX-Fine: {REAL}\r\nContent-Length: 2\r\n\
         Connection: close\r\n\r\nok"
    )))
    .await;
    let target = entry("api.test", api.port());
    let proxy = with_secret(&target, std::slice::from_ref(&target)).start();
    let answer = get(proxy.addr, &format!("http://{target}/"), &[]).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let lower = answer.head.to_ascii_lowercase();
    assert!(!lower.contains(REAL), "{}", answer.head);
    assert!(
        lower.contains(&format!("x-fine: {PLACEHOLDER}")),
        "{}",
        answer.head
    );
    assert_eq!(unchunk(&answer), "ok");
    let summary = proxy.settle_and_shutdown(1).await;
    assert_eq!(summary.connections[0].secrets_scrubbed, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_transfer_coding_from_the_secrets_host_is_refused() {
    let api = Upstream::start(raw_reply(
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n\
         3\r\nabc\r\n0\r\n\r\n",
    ))
    .await;
    let target = entry("api.test", api.port());
    let proxy = with_secret(&target, std::slice::from_ref(&target)).start();
    let answer = get(proxy.addr, &format!("http://{target}/"), &[]).await;
    assert_eq!(answer.status, 502, "{answer:?}");
    assert!(answer.text().contains("gzip"), "{}", answer.text());
    let summary = proxy.settle_and_shutdown(1).await;
    assert_eq!(summary.connections[0].status, Some(502));
    assert!(
        summary.connections[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("gzip")),
        "{:?}",
        summary.connections[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_answer_from_another_host_passes() {
    // Only a secret's own hosts saw the value; other answers are not touched.
    let other = Upstream::start(Reply::Gzip(Arc::new(b"\x1f\x8b not really".to_vec()))).await;
    let api = entry("api.test", 1);
    let target = entry("other.test", other.port());
    let proxy = with_secret(&api, &[api.clone(), target.clone()]).start();
    let answer = get(proxy.addr, &format!("http://{target}/"), &[]).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body, b"\x1f\x8b not really");
    proxy.settle_and_shutdown(1).await;
}

/// A chunked `POST` of `body` (in chunks of `chunk` bytes) to `url` through the proxy.
async fn post_chunked(proxy: std::net::SocketAddr, url: &str, body: &[u8], chunk: usize) -> Answer {
    let host = url.trim_start_matches("http://").split('/').next().unwrap();
    let mut request = format!(
        "POST {url} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    for piece in body.chunks(chunk) {
        request.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        request.extend_from_slice(piece);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    send_raw(proxy, &request).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_carrying_the_value_to_another_host_is_cut_off() {
    use base64::Engine as _;
    let other = Upstream::start(Upstream::body("other")).await;
    let api = entry("api.test", 1);
    let target = entry("other.test", other.port());
    let proxy = with_secret(&api, &[api.clone(), target.clone()]).start();
    let url = format!("http://{target}/upload");
    // Lots of harmless bytes first, so some of the body has gone out before the value.
    let lead = "x".repeat(100_000);
    let bodies = [
        format!("{lead}{REAL}"),
        format!(
            "{lead}{{\"t\":\"{}\"}}",
            base64::engine::general_purpose::STANDARD.encode(REAL)
        ),
        format!("{lead}t={}&more", hex::encode(REAL)),
    ];
    for body in &bodies {
        let answer = post_chunked(proxy.addr, &url, body.as_bytes(), 7).await;
        assert_eq!(answer.status, 403, "{answer:?}");
        assert!(
            answer.text().contains("outside its scope"),
            "{}",
            answer.text()
        );
    }
    // Content-Length framing, the value in one piece.
    let body = format!("{lead}{REAL}");
    let request = format!(
        "POST {url} HTTP/1.1\r\nHost: {target}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let answer = send_raw(proxy.addr, request.as_bytes()).await;
    assert_eq!(answer.status, 403, "{answer:?}");
    // A body without the value goes through whole.
    let clean = post_chunked(proxy.addr, &url, lead.as_bytes(), 4096).await;
    assert_eq!(clean.status, 200, "{clean:?}");

    let summary = proxy.settle_and_shutdown(5).await;
    let b64 = base64::engine::general_purpose::STANDARD.encode(REAL);
    for request in other.requests() {
        for form in [REAL.to_owned(), b64.clone(), hex::encode(REAL)] {
            assert!(!request.contains(&form), "{form} reached the other host");
        }
    }
    let whole = |r: &String| r.ends_with("0\r\n\r\n") && r.matches('x').count() >= lead.len();
    assert_eq!(other.requests().iter().filter(|r| whole(r)).count(), 1);
    let denied: Vec<_> = summary
        .connections
        .iter()
        .filter(|r| matches!(r.verdict, airlock_proxy::Verdict::Denied { .. }))
        .collect();
    assert_eq!(denied.len(), 4, "{:#?}", summary.connections);
    for record in denied {
        assert_eq!(record.host, "other.test");
        assert_eq!(record.status, Some(403));
        assert_eq!(record.error, None, "{record:?}");
        // Cut off on the way: what came before the value did go out.
        assert!(record.bytes_up > 0, "{record:?}");
    }
    assert!(!serde_json::to_string(&summary).unwrap().contains(REAL));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_value_in_a_host_name_is_refused_before_any_lookup() {
    let proxy = with_secret(
        &entry("api.test", 80),
        &["api.test:80".to_owned(), "*.wild.test:80".to_owned()],
    )
    .start();
    let name = format!("{}.wild.test", REAL.to_ascii_uppercase());
    let plain = get(proxy.addr, &format!("http://{name}/"), &[]).await;
    assert_eq!(plain.status, 403, "{plain:?}");
    let (status, head, _) = connect(proxy.addr, &format!("{name}:80")).await;
    assert_eq!(status, 403, "{head}");
    let summary = proxy.settle_and_shutdown(2).await;
    assert!(proxy_dialled_nothing(&summary));
}

fn proxy_dialled_nothing(summary: &airlock_proxy::ProxySummary) -> bool {
    summary.connections.iter().all(|r| {
        r.resolved.is_none()
            && r.verdict
                == airlock_proxy::Verdict::Denied {
                    reason: "the request carries a secret's real value to a host outside its scope"
                        .to_owned(),
                }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_value_percent_encoded_in_a_path_or_in_a_header_name_is_refused() {
    let other = Upstream::start(Upstream::body("other")).await;
    let api = entry("api.test", 1);
    let target = entry("other.test", other.port());
    let proxy = with_secret(&api, &[api.clone(), target.clone()]).start();
    let escaped: String = REAL.bytes().map(|b| format!("%{b:02X}")).collect();
    let in_path = get(proxy.addr, &format!("http://{target}/{escaped}"), &[]).await;
    let in_name = get(
        proxy.addr,
        &format!("http://{target}/"),
        &[&format!("X-{REAL}: 1")],
    )
    .await;
    for answer in [&in_path, &in_name] {
        assert_eq!(answer.status, 403, "{answer:?}");
    }
    assert!(other.requests().is_empty());
    let summary = proxy.settle_and_shutdown(2).await;
    assert!(proxy_dialled_nothing(&summary));
}
