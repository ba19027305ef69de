//! Test servers and clients, all on 127.0.0.1.
//!
//! Names resolve through a static table only (`allowed.test` → 127.0.0.1,
//! `metadata.test` → 169.254.169.254, ...), and every proxy built here carries a connect
//! gate that records each address the proxy is about to dial and refuses any that is not
//! loopback, so no test can send a packet off this machine even if the proxy were wrong.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_core::ByteSize;
use airlock_core::policy::{NetworkMode, NetworkPolicy, PackagesPolicy, ProxyLimits, SecretSpec};
use airlock_proxy::{ProxyConfig, ProxyHandle, ProxySummary, Resolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// How long any single client step may take before the test fails.
pub const STEP: Duration = Duration::from_secs(10);

/// The static DNS of the tests.
pub fn resolver() -> Resolver {
    let table: HashMap<String, Vec<IpAddr>> = [
        ("allowed.test", vec!["127.0.0.1"]),
        ("other.test", vec!["127.0.0.1"]),
        ("api.test", vec!["127.0.0.1"]),
        ("pypi.test", vec!["127.0.0.1"]),
        ("files.test", vec!["127.0.0.1"]),
        ("sub.wild.test", vec!["127.0.0.1"]),
        ("deep.sub.wild.test", vec!["127.0.0.1"]),
        ("wild.test", vec!["127.0.0.1"]),
        ("metadata.test", vec!["169.254.169.254"]),
        ("private.test", vec!["10.0.0.1"]),
        ("cgnat.test", vec!["100.64.0.1"]),
        ("mapped.test", vec!["::ffff:169.254.169.254"]),
        ("ula.test", vec!["fd00::1"]),
        (
            "mixed.test",
            vec!["10.0.0.1", "169.254.169.254", "127.0.0.1"],
        ),
        ("loopback6.test", vec!["::1"]),
    ]
    .into_iter()
    .map(|(name, ips)| {
        (
            name.to_owned(),
            ips.into_iter().map(|ip| ip.parse().unwrap()).collect(),
        )
    })
    .collect();
    Resolver::Static(table)
}

/// Addresses the proxy was about to dial.
#[derive(Clone, Default)]
pub struct Dialled(Arc<Mutex<Vec<SocketAddr>>>);

impl Dialled {
    pub fn all(&self) -> Vec<SocketAddr> {
        self.0.lock().unwrap().clone()
    }
}

/// What a test proxy is built from.
pub struct Setup {
    pub allow: Vec<String>,
    pub allow_ranges: Vec<String>,
    pub secrets: Vec<SecretSpec>,
    pub secret_values: HashMap<String, String>,
    pub limits: ProxyLimits,
    /// The resolver; `None`: the static table of [`resolver`].
    pub resolver: Option<Resolver>,
    /// PEM files of roots the proxy trusts toward intercepted upstreams.
    pub extra_roots: Vec<std::path::PathBuf>,
    /// `[network.packages]`.
    pub packages: PackagesPolicy,
}

impl Setup {
    /// Allows `entries`, with loopback 127.0.0.1/32 reachable.
    pub fn allowing(entries: &[String]) -> Self {
        Self {
            allow: entries.to_vec(),
            allow_ranges: vec!["127.0.0.1/32".to_owned()],
            secrets: Vec::new(),
            secret_values: HashMap::new(),
            limits: ProxyLimits {
                connections: 64,
                bytes: ByteSize::mib(64),
                connect_timeout: Duration::from_secs(5),
                idle_timeout: Duration::from_secs(30),
            },
            resolver: None,
            extra_roots: Vec::new(),
            packages: PackagesPolicy::default(),
        }
    }

    pub fn start(self) -> TestProxy {
        let network = NetworkPolicy {
            mode: NetworkMode::Proxy,
            allow: self.allow.clone(),
            allow_ranges: self.allow_ranges,
            secrets: self.secrets,
            limits: self.limits,
            hosts: Default::default(),
            extra_roots: self.extra_roots,
            packages: self.packages,
        };
        let values = self.secret_values;
        let dialled = Dialled::default();
        let record = dialled.clone();
        let config =
            ProxyConfig::from_policy(&network, &self.allow, |name| values.get(name).cloned())
                .unwrap()
                .with_resolver(self.resolver.unwrap_or_else(resolver))
                .with_connect_gate(Arc::new(move |addr: SocketAddr| {
                    record.0.lock().unwrap().push(addr);
                    addr.ip().is_loopback()
                }));
        let bundle = config.trust_bundle_pem().map(str::to_owned);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let handle = airlock_proxy::spawn(listener, Arc::new(config)).unwrap();
        TestProxy {
            addr: handle.local_addr(),
            handle,
            dialled,
            bundle,
        }
    }
}

pub struct TestProxy {
    pub addr: SocketAddr,
    pub handle: ProxyHandle,
    pub dialled: Dialled,
    /// The job's CA bundle, when the proxy intercepts TLS.
    pub bundle: Option<String>,
}

impl TestProxy {
    /// Waits until `records` connections have ended (so none is cut by the shutdown),
    /// then shuts down.
    pub async fn settle_and_shutdown(self, records: usize) -> ProxySummary {
        let deadline = tokio::time::Instant::now() + STEP;
        while self.handle.summary().connections.len() < records {
            assert!(
                tokio::time::Instant::now() < deadline,
                "only {:#?}",
                self.handle.summary()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.shutdown().await
    }

    pub async fn shutdown(self) -> ProxySummary {
        tokio::time::timeout(STEP, self.handle.shutdown())
            .await
            .expect("shutdown took too long")
    }
}

/// How a test upstream answers.
#[derive(Clone)]
pub enum Reply {
    /// 200 with this body, then close.
    Body(Arc<Vec<u8>>),
    /// Read the request, then say nothing and keep the connection open.
    Silent,
    /// Echo the request back: the value of its `X-Echo` header in a response header, and
    /// in a chunked body (chunks of 5 bytes, so values straddle chunks) the whole request
    /// followed by that value in base64 (standard and URL-safe, padded and not), percent
    /// and hex encodings.
    Echo,
    /// 200 with a `Content-Encoding: gzip` header and this body.
    Gzip(Arc<Vec<u8>>),
    /// These bytes as the whole response, then close.
    Raw(Arc<Vec<u8>>),
}

/// A tiny HTTP/1.1 server on 127.0.0.1 that records every request it receives (head and
/// body, as text) and answers each connection once.
pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl Upstream {
    pub async fn start(reply: Reply) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let log = log.clone();
                let reply = reply.clone();
                tokio::spawn(async move {
                    let _ = answer(stream, log, reply).await;
                });
            }
        });
        Self { addr, seen, task }
    }

    pub fn body(text: &str) -> Reply {
        Reply::Body(Arc::new(text.as_bytes().to_vec()))
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    mut stream: TcpStream,
    log: Arc<Mutex<Vec<String>>>,
    reply: Reply,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(pos) = find(&buf, b"\r\n\r\n") {
            break pos + 4;
        }
        if buf.len() > 1 << 20 {
            return Ok(());
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    // A chunked body is read to its last chunk (the tests' bodies never hold that
    // sequence themselves), so the answer comes after the whole request, as from most
    // servers.
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    while if chunked {
        !buf[head_end..].ends_with(b"0\r\n\r\n")
    } else {
        buf.len() < head_end + length
    } {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    log.lock()
        .unwrap()
        .push(String::from_utf8_lossy(&buf).to_string());
    match reply {
        Reply::Body(body) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n",
                body.len()
            );
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(&body).await?;
            stream.shutdown().await?;
        }
        Reply::Echo => {
            use base64::Engine as _;
            use base64::engine::general_purpose as b64;
            let request = String::from_utf8_lossy(&buf).to_string();
            let echo = request
                .lines()
                .find_map(|l| l.strip_prefix("x-echo: "))
                .unwrap_or_default()
                .to_owned();
            let percent: String = echo
                .bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() || b"._~".contains(&b) {
                        char::from(b).to_string()
                    } else {
                        format!("%{b:02x}")
                    }
                })
                .collect();
            let body = format!(
                "{request}\n{}\n{}\n{}\n{}\n{percent}\n{}\n{}\n",
                b64::STANDARD.encode(&echo),
                b64::STANDARD_NO_PAD.encode(&echo),
                b64::URL_SAFE.encode(&echo),
                b64::URL_SAFE_NO_PAD.encode(&echo),
                hex::encode(&echo),
                hex::encode_upper(&echo),
            );
            let head = format!(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Echoed: {echo}\r\nConnection: close\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).await?;
            for chunk in body.as_bytes().chunks(5) {
                stream
                    .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                    .await?;
                stream.write_all(chunk).await?;
                stream.write_all(b"\r\n").await?;
                stream.flush().await?;
            }
            stream.write_all(b"0\r\n\r\n").await?;
            stream.shutdown().await?;
        }
        Reply::Gzip(body) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Encoding: gzip\r\nConnection: close\r\n\r\n",
                body.len()
            );
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(&body).await?;
            stream.shutdown().await?;
        }
        Reply::Raw(response) => {
            stream.write_all(&response).await?;
            stream.shutdown().await?;
        }
        Reply::Silent => {
            tokio::time::sleep(Duration::from_secs(120)).await;
        }
    }
    Ok(())
}

pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A parsed response.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }
}

fn parse_status(head: &str) -> u16 {
    head.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"))
}

/// Reads one response head, byte by byte, so nothing after it is consumed.
pub async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(STEP, stream.read(&mut byte))
            .await
            .expect("response head took too long")
            .unwrap();
        assert!(
            n == 1,
            "connection closed inside the response head: {head:?}"
        );
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).to_string()
}

async fn read_to_end(stream: &mut TcpStream) -> Vec<u8> {
    let mut body = Vec::new();
    let _ = tokio::time::timeout(STEP, stream.read_to_end(&mut body))
        .await
        .expect("response took too long");
    body
}

/// Sends raw bytes to the proxy and reads the whole answer (the request should say
/// `Connection: close`).
pub async fn send_raw(proxy: SocketAddr, request: &[u8]) -> Answer {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(request).await.unwrap();
    let head = read_head(&mut stream).await;
    let body = read_to_end(&mut stream).await;
    Answer {
        status: parse_status(&head),
        head,
        body,
    }
}

/// `GET <url>` through the proxy, absolute form, with extra header lines.
pub async fn get(proxy: SocketAddr, url: &str, headers: &[&str]) -> Answer {
    let mut request = format!("GET {url} HTTP/1.1\r\n");
    let host = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or_default();
    request.push_str(&format!("Host: {host}\r\n"));
    for h in headers {
        request.push_str(h);
        request.push_str("\r\n");
    }
    request.push_str("Connection: close\r\n\r\n");
    send_raw(proxy, request.as_bytes()).await
}

/// `CONNECT target` through the proxy. On 200 returns the open tunnel.
pub async fn connect(proxy: SocketAddr, target: &str) -> (u16, String, TcpStream) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let head = read_head(&mut stream).await;
    (parse_status(&head), head, stream)
}

/// Speaks one HTTP request inside an open tunnel and reads the whole answer.
pub async fn get_in_tunnel(
    mut tunnel: TcpStream,
    host: &str,
    path: &str,
    headers: &[&str],
) -> (Answer, usize) {
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n");
    for h in headers {
        request.push_str(h);
        request.push_str("\r\n");
    }
    request.push_str("Connection: close\r\n\r\n");
    tunnel.write_all(request.as_bytes()).await.unwrap();
    let head = read_head(&mut tunnel).await;
    let body = read_to_end(&mut tunnel).await;
    (
        Answer {
            status: parse_status(&head),
            head,
            body,
        },
        request.len(),
    )
}

/// The listening port as a `host:port` allowlist entry.
pub fn entry(host: &str, port: u16) -> String {
    format!("{host}:{port}")
}
