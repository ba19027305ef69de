//! A test CA and an HTTPS server on 127.0.0.1 (feature `tls-server`), for the tests of the
//! egress proxy's TLS interception: the proxy trusts the CA through a policy's
//! `extra_roots` (the server is no host's trusted site), and the server records every
//! request it gets (its TLS server name and protocol too) and answers by path:
//!
//! - `/echo`: the request's `Authorization` value in an `X-Echoed` header, and in the body
//!   that value raw, in hex and base64, then the request's protocol and body;
//! - `/echo/chunked`: the same body in 7-byte chunks (chunked over HTTP/1.1);
//! - `/echo/gzip`: the same body gzip-compressed, with `Content-Encoding: gzip`, whatever
//!   the request accepts;
//! - `/echo/br`: a body labelled `Content-Encoding: br`;
//! - a path added with [`HttpsServer::serve_file`]: that file;
//! - anything else: `404`.
//!
//! Each server runs on a thread of its own with its own runtime, so synchronous tests can
//! use it as well as async ones; dropping it stops it.
//!
//! Test scaffolding only: a setup step that fails (a key, a bind) panics, which fails the
//! test that asked for it.
#![allow(clippy::expect_used)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::TlsAcceptor;

/// Largest request body a test server keeps.
const BODY_MAX_BYTES: usize = 1 << 20;

/// A CA for tests: its certificate in PEM, and leaves it signs.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    cert: CertificateDer<'static>,
    pem: String,
}

impl TestCa {
    /// A fresh CA named `name`.
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).expect("CA certificate");
        Self {
            pem: cert.pem(),
            cert: cert.der().clone(),
            issuer: Issuer::new(params, key),
        }
    }

    /// The CA's certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// Writes the CA's certificate to `path` (a policy's `extra_roots` file).
    pub fn write_pem(&self, path: &Path) {
        std::fs::write(path, &self.pem).expect("write the test CA");
    }

    /// A server certificate for `names` (DNS names or IP addresses) signed by this CA,
    /// with the CA's certificate after it, and its key.
    pub fn leaf(&self, names: &[&str]) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let key = KeyPair::generate().expect("leaf key");
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, "airlock test server");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("leaf certificate");
        (
            vec![cert.der().clone(), self.cert.clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
    }
}

/// One request as the server got it.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Path and query.
    pub target: String,
    /// `HTTP/1.1` or `HTTP/2.0`.
    pub version: String,
    /// Headers in order, names lower case.
    pub headers: Vec<(String, String)>,
    /// The body (at most 1 MiB).
    pub body: Vec<u8>,
    /// The TLS server name the client sent.
    pub sni: Option<String>,
}

impl SeenRequest {
    /// The first header of that name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Everything as text, for "the value is nowhere" checks.
    pub fn text(&self) -> String {
        let mut text = format!("{} {} {}\n", self.method, self.target, self.version);
        for (name, value) in &self.headers {
            text.push_str(&format!("{name}: {value}\n"));
        }
        text.push('\n');
        text.push_str(&String::from_utf8_lossy(&self.body));
        text
    }
}

/// What a test server serves, beside its echo paths: path → (content type, bytes).
type Files = Arc<Mutex<HashMap<String, (String, Vec<u8>)>>>;

/// An HTTPS server on 127.0.0.1. Dropping it stops it.
pub struct HttpsServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    seen: Arc<Mutex<Vec<SeenRequest>>>,
    files: Files,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpsServer {
    /// A server presenting a certificate from `ca` for `names`, speaking HTTP/2 and
    /// HTTP/1.1 (by ALPN).
    pub fn start(ca: &TestCa, names: &[&str]) -> Self {
        Self::start_with(ca, names, true)
    }

    /// Like [`HttpsServer::start`], HTTP/2 offered only when `http2`.
    pub fn start_with(ca: &TestCa, names: &[&str], http2: bool) -> Self {
        let (chain, key) = ca.leaf(names);
        let mut config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .expect("server certificate");
        config.alpn_protocols = if http2 {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let files: Files = Arc::new(Mutex::new(HashMap::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (log, served) = (seen.clone(), files.clone());
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let accept = async {
                    loop {
                        let Ok((stream, _)) = listener.accept().await else {
                            continue;
                        };
                        let (acceptor, log, files) =
                            (acceptor.clone(), log.clone(), served.clone());
                        tokio::spawn(async move {
                            let _ = serve(acceptor, stream, log, files).await;
                        });
                    }
                };
                tokio::select! {
                    () = accept => {}
                    _ = stopped => {}
                }
            });
        });
        Self {
            port,
            seen,
            files,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Serves `content` at `path` from now on.
    pub fn serve_file(&self, path: &str, content_type: &str, content: Vec<u8>) {
        self.files
            .lock()
            .expect("files")
            .insert(path.to_owned(), (content_type.to_owned(), content));
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.seen.lock().expect("requests").clone()
    }
}

impl Drop for HttpsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(
    acceptor: TlsAcceptor,
    stream: tokio::net::TcpStream,
    log: Arc<Mutex<Vec<SeenRequest>>>,
    files: Files,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let tls = acceptor.accept(stream).await?;
    let (_, connection) = tls.get_ref();
    let sni = connection.server_name().map(str::to_owned);
    let http2 = connection.alpn_protocol() == Some(b"h2");
    let service = hyper::service::service_fn(move |req| {
        let (log, files, sni) = (log.clone(), files.clone(), sni.clone());
        async move { Ok::<_, Infallible>(answer(req, log, files, sni).await) }
    });
    let io = TokioIo::new(tls);
    if http2 {
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(io, service)
            .await?;
    } else {
        hyper::server::conn::http1::Builder::new()
            .serve_connection(io, service)
            .await?;
    }
    Ok(())
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn answer(
    req: Request<Incoming>,
    log: Arc<Mutex<Vec<SeenRequest>>>,
    files: Files,
    sni: Option<String>,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let mut body = body
        .collect()
        .await
        .map(|c| c.to_bytes().to_vec())
        .unwrap_or_default();
    body.truncate(BODY_MAX_BYTES);
    let seen = SeenRequest {
        method: parts.method.to_string(),
        target: parts
            .uri
            .path_and_query()
            .map_or("/".to_owned(), |pq| pq.as_str().to_owned()),
        version: format!("{:?}", parts.version),
        headers: parts
            .headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body,
        sni,
    };
    log.lock().expect("requests").push(seen.clone());
    let auth = seen.header("authorization").unwrap_or_default().to_owned();
    let echo = format!(
        "auth={auth}\nhex={}\nbase64={}\nversion={}\nbody={}\n",
        auth.bytes().map(|b| format!("{b:02x}")).collect::<String>(),
        base64::engine::general_purpose::STANDARD.encode(&auth),
        seen.version,
        String::from_utf8_lossy(&seen.body),
    );
    let path = parts.uri.path();
    let full = |bytes: Vec<u8>| -> Body { Full::new(Bytes::from(bytes)).boxed() };
    let response = Response::builder().header("x-echoed", auth.as_str());
    let built = match path {
        "/echo" => response
            .header("content-type", "text/plain")
            .body(full(echo.into_bytes())),
        "/echo/chunked" => {
            let frames: Vec<Result<Frame<Bytes>, Infallible>> = echo
                .as_bytes()
                .chunks(7)
                .map(|chunk| Ok(Frame::data(Bytes::copy_from_slice(chunk))))
                .collect();
            let stream = StreamBody::new(futures_util::stream::iter(frames));
            response
                .header("content-type", "text/plain")
                .body(stream.boxed())
        }
        "/echo/gzip" => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            let _ = encoder.write_all(echo.as_bytes());
            let gz = encoder.finish().unwrap_or_default();
            response
                .header("content-type", "text/plain")
                .header("content-encoding", "gzip")
                .body(full(gz))
        }
        "/echo/br" => response
            .header("content-type", "text/plain")
            .header("content-encoding", "br")
            .body(full(b"\x0b\x02\x80not really brotli".to_vec())),
        other => match files.lock().expect("files").get(other).cloned() {
            Some((content_type, content)) => Response::builder()
                .header("content-type", content_type)
                .body(full(content)),
            None => Response::builder()
                .status(StatusCode::NOT_FOUND)
                .body(full(b"not found\n".to_vec())),
        },
    };
    built.unwrap_or_else(|_| Response::new(full(Vec::new())))
}
