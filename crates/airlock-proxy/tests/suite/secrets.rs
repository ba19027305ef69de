//! Secret placeholders become the real value only toward the secret's own host.

use airlock_core::policy::SecretSpec;
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
