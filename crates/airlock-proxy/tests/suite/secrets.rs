//! Secret placeholders become the real value only toward the secret's own host.

use airlock_core::policy::SecretSpec;
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_is_opaque_so_the_placeholder_passes_unchanged() {
    let api = Upstream::start(Upstream::body("api")).await;
    let target = entry("api.test", api.port());
    let proxy = with_secret(&target, std::slice::from_ref(&target)).start();
    let (status, _, tunnel) = connect(proxy.addr, &target).await;
    assert_eq!(status, 200);
    let auth = format!("Authorization: Bearer {PLACEHOLDER}");
    let (answer, _) = get_in_tunnel(tunnel, &target, "/", &[&auth]).await;
    assert_eq!(answer.status, 200);
    let seen = api.requests();
    assert!(seen[0].contains(&auth), "{}", seen[0]);
    assert!(!seen[0].contains(REAL));
    proxy.settle_and_shutdown(1).await;
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
async fn a_compressed_answer_from_the_secrets_host_is_refused() {
    let api = Upstream::start(Reply::Gzip(Arc::new(b"\x1f\x8b not really".to_vec()))).await;
    let target = entry("api.test", api.port());
    let proxy = with_secret(&target, std::slice::from_ref(&target)).start();
    let answer = get(proxy.addr, &format!("http://{target}/"), &[]).await;
    assert_eq!(answer.status, 502, "{answer:?}");
    assert!(answer.text().contains("compressed"), "{}", answer.text());
    assert!(
        api.requests()[0].contains("accept-encoding: identity\r\n"),
        "{}",
        api.requests()[0]
    );
    proxy.settle_and_shutdown(1).await;
}
