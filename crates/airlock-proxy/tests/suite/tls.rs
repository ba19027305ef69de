//! TLS interception: the proxy terminates the TLS of a secret's host and of a package
//! index with the job's CA, verifies the real upstream itself, puts the secret in and
//! scrubs it out; every other host's tunnel stays opaque. The upstreams are HTTPS servers
//! on 127.0.0.1 with a test CA of their own (airlock-testkit's), which the proxy trusts
//! through `extra_roots`; the client here trusts only the job's CA bundle, as a job does.

use std::net::SocketAddr;
use std::sync::Arc;

use airlock_core::policy::{SecretSpec, SubstitutePlace};
use airlock_proxy::{ProxySummary, Verdict};
use airlock_testkit::tls::{HttpsServer, TestCa};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use pretty_assertions::assert_eq;
use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::common::*;

const PLACEHOLDER: &str = "airlock-placeholder-api-token";
const REAL: &str = "sk-real-value-0123456789";
const OTHER_PLACEHOLDER: &str = "airlock-placeholder-other-token";
const OTHER_REAL: &str = "sk-other-value-9876543210";

/// A test CA, written where a policy's `extra_roots` can name it.
struct Roots {
    ca: TestCa,
    dir: std::path::PathBuf,
}

impl Roots {
    fn new() -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "airlock-proxy-tls-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = TestCa::new("airlock proxy test upstreams");
        ca.write_pem(&dir.join("ca.pem"));
        Self { ca, dir }
    }

    fn path(&self) -> std::path::PathBuf {
        self.dir.join("ca.pem")
    }
}

impl Drop for Roots {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn secret(env: &str, placeholder: &str, value_env: &str, scope: &str) -> SecretSpec {
    SecretSpec {
        env: env.to_owned(),
        placeholder: placeholder.to_owned(),
        value_env: value_env.to_owned(),
        hosts: vec![scope.to_owned()],
        substitute: vec![SubstitutePlace::Headers],
    }
}

/// A proxy allowing `allow`, with the API secret bound to `scope` and the roots trusted.
fn setup(roots: &Roots, scope: &str, allow: &[String]) -> Setup {
    let mut setup = Setup::allowing(allow);
    setup.secrets = vec![secret("API_TOKEN", PLACEHOLDER, "REAL_API_TOKEN", scope)];
    setup
        .secret_values
        .insert("REAL_API_TOKEN".to_owned(), REAL.to_owned());
    setup.extra_roots = vec![roots.path()];
    setup
}

/// The answer a client got through an intercepted (or opaque) tunnel.
#[derive(Debug)]
struct Got {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
    /// The protocol TLS agreed on with whoever answered the handshake.
    alpn: Option<String>,
}

impl Got {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// How the client speaks.
struct Client<'a> {
    /// PEM of the roots it trusts (the job's bundle, or the test CA).
    trust: &'a str,
    /// The CONNECT target.
    connect: String,
    /// The TLS server name.
    sni: String,
    /// ALPN offered.
    alpn: Vec<&'static [u8]>,
}

impl Client<'_> {
    fn new(trust: &str, connect: String) -> Client<'_> {
        let sni = connect.rsplit_once(':').unwrap().0.to_owned();
        Client {
            trust,
            connect,
            sni,
            alpn: vec![b"http/1.1"],
        }
    }

    /// CONNECT, TLS, one request; `Err` with the TLS error when the handshake fails.
    async fn send(&self, proxy: SocketAddr, req: Request<Full<Bytes>>) -> Result<Got, String> {
        let mut stream = TcpStream::connect(proxy).await.unwrap();
        let connect = format!("CONNECT {0} HTTP/1.1\r\nHost: {0}\r\n\r\n", self.connect);
        stream.write_all(connect.as_bytes()).await.unwrap();
        let head = read_head(&mut stream).await;
        if !head.starts_with("HTTP/1.1 200") {
            return Err(format!("CONNECT refused: {head}"));
        }
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(self.trust.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = self.alpn.iter().map(|p| p.to_vec()).collect();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let name = ServerName::try_from(self.sni.clone()).unwrap();
        let tls = tokio::time::timeout(STEP, connector.connect(name, stream))
            .await
            .map_err(|_| "TLS handshake took too long".to_owned())?
            .map_err(|e| e.to_string())?;
        let alpn = tls
            .get_ref()
            .1
            .alpn_protocol()
            .map(|p| String::from_utf8_lossy(p).into_owned());
        let io = TokioIo::new(tls);
        let response: Response<hyper::body::Incoming> = if alpn.as_deref() == Some("h2") {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                    .await
                    .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            sender.send_request(req).await.map_err(|e| e.to_string())?
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            sender.send_request(req).await.map_err(|e| e.to_string())?
        };
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let body = tokio::time::timeout(STEP, response.into_body().collect())
            .await
            .map_err(|_| "body took too long".to_owned())?
            .map(|c| String::from_utf8_lossy(&c.to_bytes()).into_owned())
            .map_err(|e| format!("body: {e}"))?;
        Ok(Got {
            status,
            headers,
            body,
            alpn,
        })
    }
}

/// A request to `authority` (for `Host`, or HTTP/2's authority) at `path`.
fn request(
    authority: &str,
    path: &str,
    headers: &[(&str, &str)],
    http2: bool,
) -> Request<Full<Bytes>> {
    let mut builder = if http2 {
        Request::get(format!("https://{authority}{path}"))
    } else {
        Request::get(path).header("host", authority)
    };
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Full::new(Bytes::new())).unwrap()
}

/// Every intercepted request record of `summary` (not the tunnels').
fn inner_requests(summary: &ProxySummary) -> Vec<&airlock_proxy::ConnectionRecord> {
    summary
        .connections
        .iter()
        .filter(|r| r.intercepted && r.method != "CONNECT")
        .collect()
}

async fn secret_round_trip(http2: bool, path: &str) {
    let roots = Roots::new();
    let server = HttpsServer::start(&roots.ca, &["api.test"]);
    let target = entry("api.test", server.port);
    let proxy = setup(&roots, &target, std::slice::from_ref(&target)).start();
    let bundle = proxy.bundle.clone().expect("a CA bundle");
    let mut client = Client::new(&bundle, target.clone());
    if http2 {
        client.alpn = vec![b"h2", b"http/1.1"];
    }
    let auth = format!("Bearer {PLACEHOLDER}");
    let got = client
        .send(
            proxy.addr,
            request(&target, path, &[("authorization", &auth)], http2),
        )
        .await
        .unwrap();
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(
        got.alpn.as_deref(),
        Some(if http2 { "h2" } else { "http/1.1" })
    );
    // The server got the real value, over the protocol the job chose...
    let seen = server.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {REAL}").as_str())
    );
    assert_eq!(seen[0].version, if http2 { "HTTP/2.0" } else { "HTTP/1.1" });
    assert_eq!(seen[0].sni.as_deref(), Some("api.test"));
    assert_eq!(seen[0].header("accept-encoding"), Some("identity"));
    // ...and echoed it raw, in hex and in base64; the job sees only the placeholder.
    assert_eq!(got.header("x-echoed"), Some(auth.as_str()), "{got:?}");
    assert!(!got.body.contains(REAL), "{}", got.body);
    assert!(!got.body.contains(&hex_of(REAL)), "{}", got.body);
    assert!(
        got.body.contains(&format!("auth=Bearer {PLACEHOLDER}\n")),
        "{}",
        got.body
    );
    assert_eq!(got.body.matches(PLACEHOLDER).count(), 3, "{}", got.body);
    let summary = proxy.settle_and_shutdown(2).await;
    let tunnel = summary
        .connections
        .iter()
        .find(|r| r.method == "CONNECT")
        .expect("the tunnel's record");
    assert!(tunnel.intercepted, "{tunnel:?}");
    assert_eq!(tunnel.verdict, Verdict::Allowed);
    assert!(tunnel.bytes_up > 0 && tunnel.bytes_down > 0, "{tunnel:?}");
    let inner = inner_requests(&summary);
    assert_eq!(inner.len(), 1, "{:#?}", summary.connections);
    assert_eq!(inner[0].status, Some(200));
    assert_eq!(inner[0].error, None, "{:?}", inner[0]);
    // The header, and three forms in the body.
    assert_eq!(inner[0].secrets_scrubbed, 4, "{:?}", inner[0]);
    assert!(!serde_json::to_string(&summary).unwrap().contains(REAL));
}

fn hex_of(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http1_the_secret_goes_in_and_never_comes_back() {
    secret_round_trip(false, "/echo").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http2_the_secret_goes_in_and_never_comes_back() {
    secret_round_trip(true, "/echo").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_echo_is_scrubbed_across_its_chunks() {
    secret_round_trip(false, "/echo/chunked").await;
    secret_round_trip(true, "/echo/chunked").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_echo_is_decoded_and_scrubbed() {
    secret_round_trip(false, "/echo/gzip").await;
    secret_round_trip(true, "/echo/gzip").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echo_in_a_coding_the_proxy_cannot_read_is_refused() {
    let roots = Roots::new();
    let server = HttpsServer::start(&roots.ca, &["api.test"]);
    let target = entry("api.test", server.port);
    let proxy = setup(&roots, &target, std::slice::from_ref(&target)).start();
    let bundle = proxy.bundle.clone().unwrap();
    let got = Client::new(&bundle, target.clone())
        .send(proxy.addr, request(&target, "/echo/br", &[], false))
        .await
        .unwrap();
    assert_eq!(got.status, 502, "{got:?}");
    assert!(got.body.contains("br coding"), "{}", got.body);
    proxy.settle_and_shutdown(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_name_other_than_the_connect_host_is_refused() {
    let roots = Roots::new();
    let server = HttpsServer::start(&roots.ca, &["api.test", "other.test"]);
    let target = entry("api.test", server.port);
    let proxy = setup(&roots, &target, std::slice::from_ref(&target)).start();
    let bundle = proxy.bundle.clone().unwrap();
    let mut client = Client::new(&bundle, target.clone());
    client.sni = "other.test".to_owned();
    let err = client
        .send(proxy.addr, request(&target, "/echo", &[], false))
        .await
        .unwrap_err();
    assert!(err.contains("AccessDenied"), "{err}");
    assert!(server.requests().is_empty());
    let summary = proxy.settle_and_shutdown(1).await;
    let record = &summary.connections[0];
    assert_eq!(
        record.verdict,
        Verdict::Denied {
            reason: "the TLS server name (SNI) other.test is not the CONNECT host api.test"
                .to_owned()
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_header_other_than_the_connect_host_is_refused() {
    let roots = Roots::new();
    let server = HttpsServer::start(&roots.ca, &["api.test"]);
    let target = entry("api.test", server.port);
    let proxy = setup(&roots, &target, std::slice::from_ref(&target)).start();
    let bundle = proxy.bundle.clone().unwrap();
    for http2 in [false, true] {
        let mut client = Client::new(&bundle, target.clone());
        if http2 {
            client.alpn = vec![b"h2"];
        }
        let other = entry("other.test", server.port);
        let got = client
            .send(proxy.addr, request(&other, "/echo", &[], http2))
            .await
            .unwrap();
        assert_eq!(got.status, 421, "{got:?}");
        assert!(
            got.body.contains(&format!(
                "the request's Host {other} is not the tunnel's host {target}"
            )),
            "{}",
            got.body
        );
    }
    assert!(server.requests().is_empty());
    let summary = proxy.settle_and_shutdown(4).await;
    assert_eq!(inner_requests(&summary).len(), 2);
    for record in inner_requests(&summary) {
        assert!(
            matches!(record.verdict, Verdict::Denied { .. }),
            "{record:?}"
        );
        assert_eq!(record.status, Some(421));
    }
}

async fn refused_upstream(server: HttpsServer, roots: &Roots, expected: &str) {
    let target = entry("api.test", server.port);
    let proxy = setup(roots, &target, std::slice::from_ref(&target)).start();
    let bundle = proxy.bundle.clone().unwrap();
    let auth = format!("Bearer {PLACEHOLDER}");
    let got = Client::new(&bundle, target.clone())
        .send(
            proxy.addr,
            request(&target, "/echo", &[("authorization", &auth)], false),
        )
        .await
        .unwrap();
    assert_eq!(got.status, 502, "{got:?}");
    assert!(
        got.body
            .contains(&format!("TLS with the upstream {target} failed")),
        "{}",
        got.body
    );
    assert!(got.body.contains(expected), "{}", got.body);
    assert!(server.requests().is_empty(), "the server got a request");
    let summary = proxy.settle_and_shutdown(2).await;
    let inner = inner_requests(&summary);
    assert_eq!(inner[0].status, Some(502));
    assert!(
        inner[0].error.as_deref().unwrap().contains(expected),
        "{:?}",
        inner[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_whose_certificate_no_root_vouches_for_gets_no_request() {
    let roots = Roots::new();
    let stranger = TestCa::new("nobody trusts this one");
    let server = HttpsServer::start(&stranger, &["api.test"]);
    refused_upstream(server, &roots, "UnknownIssuer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_whose_certificate_names_another_host_gets_no_request() {
    let roots = Roots::new();
    let server = HttpsServer::start(&roots.ca, &["other.test"]);
    refused_upstream(server, &roots, "not valid for name").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placeholder_toward_a_host_outside_its_scope_goes_unchanged_and_is_listed() {
    let roots = Roots::new();
    let api = HttpsServer::start(&roots.ca, &["api.test"]);
    let other = HttpsServer::start(&roots.ca, &["other.test"]);
    let (api_target, other_target) = (entry("api.test", api.port), entry("other.test", other.port));
    let mut setup = setup(
        &roots,
        &api_target,
        &[api_target.clone(), other_target.clone()],
    );
    // The other host has a secret of its own, so its TLS is intercepted too.
    setup.secrets.push(secret(
        "OTHER_TOKEN",
        OTHER_PLACEHOLDER,
        "REAL_OTHER_TOKEN",
        &other_target,
    ));
    setup
        .secret_values
        .insert("REAL_OTHER_TOKEN".to_owned(), OTHER_REAL.to_owned());
    let proxy = setup.start();
    let bundle = proxy.bundle.clone().unwrap();
    let auth = format!("Bearer {PLACEHOLDER}");
    let got = Client::new(&bundle, other_target.clone())
        .send(
            proxy.addr,
            request(
                &other_target,
                "/echo",
                &[("authorization", &auth), ("x-other", OTHER_PLACEHOLDER)],
                false,
            ),
        )
        .await
        .unwrap();
    assert_eq!(got.status, 200, "{got:?}");
    let seen = other.requests();
    assert_eq!(seen[0].header("authorization"), Some(auth.as_str()));
    assert_eq!(seen[0].header("x-other"), Some(OTHER_REAL));
    assert!(api.requests().is_empty());
    let summary = proxy.settle_and_shutdown(2).await;
    let inner = inner_requests(&summary);
    assert_eq!(inner[0].unbound_placeholders, vec!["API_TOKEN".to_owned()]);
    let json = serde_json::to_value(inner[0]).unwrap();
    assert_eq!(
        json["unbound_placeholders"],
        serde_json::json!(["API_TOKEN"])
    );
    assert_eq!(json["intercepted"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_without_secrets_is_tunneled_untouched() {
    let roots = Roots::new();
    let api = HttpsServer::start(&roots.ca, &["api.test"]);
    let other = HttpsServer::start(&roots.ca, &["other.test"]);
    let (api_target, other_target) = (entry("api.test", api.port), entry("other.test", other.port));
    let proxy = setup(
        &roots,
        &api_target,
        &[api_target.clone(), other_target.clone()],
    )
    .start();
    // A client that trusts the test CA alone reaches the server only through a tunnel the
    // proxy leaves alone: the other host's, not the secret's (there it meets the job's CA).
    let got = Client::new(roots.ca.pem(), other_target.clone())
        .send(proxy.addr, request(&other_target, "/echo", &[], false))
        .await
        .unwrap();
    assert_eq!(got.status, 200);
    let err = Client::new(roots.ca.pem(), api_target.clone())
        .send(proxy.addr, request(&api_target, "/echo", &[], false))
        .await
        .unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");
    let summary = proxy.settle_and_shutdown(2).await;
    let by_host = |host: &str| {
        summary
            .connections
            .iter()
            .find(|r| r.host == host)
            .unwrap_or_else(|| panic!("no record for {host}: {summary:#?}"))
    };
    assert!(!by_host("other.test").intercepted);
    assert!(by_host("api.test").intercepted);
    // The job refused the proxy's certificate, and the record says so.
    assert!(
        by_host("api.test")
            .error
            .as_deref()
            .is_some_and(|e| e.contains("TLS with the job failed")),
        "{:?}",
        by_host("api.test")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_gets_the_secret_only_where_the_rule_says() {
    let roots = Roots::new();
    let server = HttpsServer::start(&roots.ca, &["api.test"]);
    let target = entry("api.test", server.port);
    for (places, expected) in [
        (vec![SubstitutePlace::Headers], PLACEHOLDER),
        (vec![SubstitutePlace::Headers, SubstitutePlace::Body], REAL),
    ] {
        let mut setup = setup(&roots, &target, std::slice::from_ref(&target));
        setup.secrets[0].substitute = places;
        let proxy = setup.start();
        let bundle = proxy.bundle.clone().unwrap();
        let body = format!("{{\"token\": \"{PLACEHOLDER}\"}}");
        let req = Request::post("/echo")
            .header("host", &target)
            .header("content-length", body.len())
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let got = Client::new(&bundle, target.clone())
            .send(proxy.addr, req)
            .await
            .unwrap();
        assert_eq!(got.status, 200, "{got:?}");
        let seen = server.requests().pop().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&seen.body),
            format!("{{\"token\": \"{expected}\"}}")
        );
        // The echoed body comes back scrubbed either way.
        assert!(!got.body.contains(REAL), "{}", got.body);
        proxy.settle_and_shutdown(2).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_index_names_its_file_hosts_and_each_fetch_is_recorded() {
    let roots = Roots::new();
    let index = HttpsServer::start(&roots.ca, &["pypi.test"]);
    let files = HttpsServer::start(&roots.ca, &["files.test"]);
    let files_target = entry("files.test", files.port);
    index.serve_file(
        "/simple/tiny/",
        "text/html",
        format!(
            "<a href=\"https://{files_target}/packages/tiny-0.1-py3-none-any.whl#sha256=00\">tiny</a>\n\
             <p>Homepage: https://homepage.test/ (not a link to a file)</p>"
        )
        .into_bytes(),
    );
    files.serve_file(
        "/packages/tiny-0.1-py3-none-any.whl",
        "application/zip",
        b"PK".to_vec(),
    );
    let mut setup = Setup::allowing(&[]);
    setup.extra_roots = vec![roots.path()];
    setup.packages.index = Some(format!("https://pypi.test:{}/simple", index.port));
    let proxy = setup.start();
    let bundle = proxy.bundle.clone().unwrap();
    let addr = proxy.addr;
    let fetch = |target: String, path: &'static str| {
        let bundle = bundle.clone();
        async move {
            Client::new(&bundle, target.clone())
                .send(addr, request(&target, path, &[], false))
                .await
        }
    };
    // Before the index names it, the file host is off the list.
    let early = fetch(files_target.clone(), "/packages/tiny-0.1-py3-none-any.whl").await;
    assert!(
        early.unwrap_err().contains("403"),
        "the file host was open before the index named it"
    );
    let page = fetch(entry("pypi.test", index.port), "/simple/tiny/")
        .await
        .unwrap();
    assert_eq!(page.status, 200);
    assert!(page.body.contains("tiny-0.1"), "{}", page.body);
    let wheel = fetch(files_target.clone(), "/packages/tiny-0.1-py3-none-any.whl")
        .await
        .unwrap();
    assert_eq!((wheel.status, wheel.body.as_str()), (200, "PK"));
    // Other URLs of the page allow nothing.
    let homepage = fetch("homepage.test:443".to_owned(), "/").await;
    assert!(homepage.unwrap_err().contains("403"));
    let summary = proxy.settle_and_shutdown(6).await;
    let fetched: Vec<(String, Option<String>)> = inner_requests(&summary)
        .iter()
        .map(|r| (r.host.clone(), r.path.clone()))
        .collect();
    assert_eq!(
        fetched,
        vec![
            ("pypi.test".to_owned(), Some("/simple/tiny/".to_owned())),
            (
                "files.test".to_owned(),
                Some("/packages/tiny-0.1-py3-none-any.whl".to_owned())
            ),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_readable_in_the_status_line() {
    let proxy = Setup::allowing(&[]).start();
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(b"CONNECT nowhere.test:443 HTTP/1.1\r\nHost: nowhere.test:443\r\n\r\n")
        .await
        .unwrap();
    let head = read_head(&mut stream).await;
    assert!(
        head.starts_with(
            "HTTP/1.1 403 airlock proxy: nowhere.test:443 is not on the allowlist\r\n"
        ),
        "{head}"
    );
    drop(stream);
    proxy.settle_and_shutdown(1).await;
}
