//! Proxy mode: the job reaches only allowlisted hosts, through airlock's egress proxy, and
//! secrets stay on the host; the same on every backend that offers it. Every server here
//! listens on the host's 127.0.0.1, which the job cannot reach directly (its 127.0.0.1 is
//! its own); the policy names these servers with `[network] hosts` and lets the proxy reach
//! 127.0.0.1 with `allow_ranges`. gVisor has its own network stack, so airlock cannot put
//! the proxy's socket on its loopback: it refuses proxy jobs, and says so. kube refuses them
//! too: the egress proxy is not wired into a Pod (docs/kube.md).

use std::path::PathBuf;

use pretty_assertions::assert_eq;

use super::common::{JsonRun, Kind, RecordingServer, Target, proxy_job_ran, run_proxy_job};

const SECRET_VALUE: &str = "real-secret-value-7f3a9c";
const PLACEHOLDER: &str = "airlock-placeholder-token";

fn proxy_policy(t: &Target, allow: &[String], extra: &str) -> PathBuf {
    proxy_policy_with(t, allow, extra, "")
}

/// [`proxy_policy`] with `filesystem` lines.
fn proxy_policy_with(t: &Target, allow: &[String], extra: &str, filesystem: &str) -> PathBuf {
    let allow: Vec<String> = allow.iter().map(|a| format!("{a:?}")).collect();
    t.policy_with(
        "",
        filesystem,
        &format!(
            "[network]\nmode = \"proxy\"\nallow = [{}]\nallow_ranges = [\"127.0.0.1/32\"]\n\
             hosts = {{ \"api.test\" = [\"127.0.0.1\"], \"other.test\" = [\"127.0.0.1\"], \
             \"metadata.test\" = [\"169.254.169.254\"], \"private.test\" = [\"10.1.2.3\"] }}\n{extra}",
            allow.join(", ")
        ),
    )
}

fn run_proxy(t: &Target, policy: &std::path::Path, source: &str) -> JsonRun {
    run_proxy_with(t, policy, &[], source)
}

/// [`run_proxy`] with more `airlock run` arguments.
fn run_proxy_with(t: &Target, policy: &std::path::Path, args: &[&str], source: &str) -> JsonRun {
    let mut all = args.to_vec();
    all.extend(["-c", source]);
    run_proxy_job(t, policy, &[("REAL_TOKEN", SECRET_VALUE)], &all)
}

/// Runs a proxy job, or checks the refusal where the backend cannot give the shape.
fn run(t: &Target, policy: &std::path::Path, source: &str) -> Option<serde_json::Value> {
    proxy_job_ran(t, run_proxy(t, policy, source))
}

/// A host-side HTTP server on 127.0.0.1 that records each request whole (head and a
/// `Content-Length` body) and, when `echo` is set, answers with what a careless debugging
/// endpoint would: the request's `Authorization` value in an `X-Echoed` header, and in
/// the body the whole request, then that value in hex and with every byte
/// percent-escaped. Otherwise it answers `ok`.
struct EchoServer {
    port: u16,
    requests: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl EchoServer {
    fn start(echo: bool) -> Self {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut request = Vec::new();
                let mut byte = [0u8; 1];
                while !request.ends_with(b"\r\n\r\n") && request.len() < 64 * 1024 {
                    match stream.read(&mut byte) {
                        Ok(1) => request.push(byte[0]),
                        _ => break,
                    }
                }
                let head = String::from_utf8_lossy(&request).into_owned();
                let header = |name: &str| {
                    head.lines().find_map(|l| {
                        let (n, v) = l.split_once(':')?;
                        n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
                    })
                };
                let length: usize = header("content-length")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                // What arrived, which is less than promised when the proxy cut it off.
                let mut body = Vec::new();
                let _ = (&mut stream)
                    .take(length.min(1 << 20) as u64)
                    .read_to_end(&mut body);
                request.extend_from_slice(&body);
                seen.lock()
                    .expect("lock")
                    .push(String::from_utf8_lossy(&request).into_owned());
                let auth = header("authorization").unwrap_or_default();
                let (extra, answer) = if echo {
                    let hex: String = auth.bytes().map(|b| format!("{b:02x}")).collect();
                    let escaped: String = auth.bytes().map(|b| format!("%{b:02X}")).collect();
                    (
                        format!("X-Echoed: {auth}\r\n"),
                        format!("{head}\n{hex}\n{escaped}\n"),
                    )
                } else {
                    (String::new(), "ok".to_owned())
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                    answer.len()
                );
            }
        });
        Self { port, requests }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("lock").clone()
    }
}

/// The forms of `value` that must not reach the job or another host: raw, hex and fully
/// percent-escaped.
fn forms_of(value: &str) -> [String; 3] {
    [
        value.to_owned(),
        value.bytes().map(|b| format!("{b:02x}")).collect(),
        value.bytes().map(|b| format!("%{b:02X}")).collect(),
    ]
}

conformance! {
    fn an_allowed_host_answers_through_the_proxy_from_urllib_and_curl(t: &Target) {
        let server = RecordingServer::start("hello from api");
        let allowed = format!("api.test:{}", server.port);
        let policy =
            proxy_policy_with(t, std::slice::from_ref(&allowed), "", t.host_tools_rootfs());
        let source = format!(
            "import subprocess, urllib.request\n\
             print(urllib.request.urlopen('http://{allowed}/a', timeout=5).read().decode())\n\
             print(subprocess.run(['curl', '-s', 'http://{allowed}/b'], capture_output=True, text=True).stdout)"
        );
        let Some(obs) = run(t, &policy, &source) else { return };
        assert_eq!(obs["stdout"], "hello from api\nhello from api\n", "{obs:#}");
        assert_eq!(obs["network"]["connections"], 2);
        assert_eq!(obs["network"]["denied"], 0);
        assert_eq!(server.requests().len(), 2);
        // Each request is an audit line of its own, tied to the job.
        let audit = t.audit_lines();
        let connections: Vec<&serde_json::Value> =
            audit.iter().filter(|l| l["event"] == "connection").collect();
        assert_eq!(connections.len(), 2);
        for line in connections {
            assert_eq!(line["job_id"], obs["job_id"]);
            assert_eq!(line["verdict"], "allowed");
            assert_eq!(line["host"], "api.test");
            assert_eq!(line["resolved"], "127.0.0.1");
        }
    }

    fn hosts_off_the_list_and_blocked_addresses_are_refused(t: &Target) {
        let server = RecordingServer::start("should not be reached");
        let port = server.port;
        // metadata.test and private.test are on the list, but resolve to blocked ranges.
        let allow = [
            format!("api.test:{port}"),
            "metadata.test:80".to_owned(),
            "private.test:80".to_owned(),
            "169.254.169.254:80".to_owned(),
        ];
        let policy = proxy_policy(t, &allow, "");
        let source = format!(
            "import urllib.request\n\
             for url in ['http://other.test:{port}/', 'http://api.test:{}/', 'http://metadata.test/', \
                         'http://private.test/', 'http://169.254.169.254/latest/meta-data/', \
                         'http://0x7f.1:{port}/', 'http://2130706433:{port}/']:\n\
             \x20   try:\n\
             \x20       urllib.request.urlopen(url, timeout=5)\n\
             \x20       print('REACHED', url)\n\
             \x20   except Exception as e:\n\
             \x20       print(getattr(e, 'code', e))",
            port + 1
        );
        let Some(obs) = run(t, &policy, &source) else { return };
        let lines: Vec<&str> = obs["stdout"].as_str().unwrap().lines().collect();
        assert_eq!(lines, vec!["403"; 7], "{obs:#}");
        assert_eq!(server.accepted.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert_eq!(obs["network"]["denied"], 7);
        let audit = t.audit_lines();
        let metadata = audit
            .iter()
            .find(|l| l["event"] == "connection" && l["host"] == "metadata.test")
            .expect("an audit line for metadata.test");
        assert_eq!(metadata["verdict"], "denied");
        assert!(metadata["resolved"].is_null(), "the proxy connected: {metadata}");
    }

    fn a_job_that_ignores_the_proxy_reaches_nothing(t: &Target) {
        let server = RecordingServer::start("direct");
        let policy = proxy_policy(t, &[format!("api.test:{}", server.port)], "");
        let source = format!(
            "import socket\n\
             for addr in [('127.0.0.1', {}), ('10.0.0.1', 80), ('169.254.169.254', 80)]:\n\
             \x20   s = socket.socket()\n\
             \x20   s.settimeout(2)\n\
             \x20   try:\n\
             \x20       s.connect(addr)\n\
             \x20       print('CONNECTED', addr)\n\
             \x20   except OSError as e:\n\
             \x20       print(e.errno)",
            server.port
        );
        let Some(obs) = run(t, &policy, &source) else { return };
        // ECONNREFUSED on its own loopback, ENETUNREACH everywhere else.
        assert_eq!(obs["stdout"], "111\n101\n101\n", "{obs:#}");
        assert_eq!(server.accepted.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    fn a_secret_is_replaced_only_toward_its_own_host(t: &Target) {
        let api = RecordingServer::start("api");
        let other = RecordingServer::start("other");
        let allow = [
            format!("api.test:{}", api.port),
            format!("other.test:{}", other.port),
        ];
        let secret = format!(
            "[[network.secrets]]\nenv = \"API_TOKEN\"\nplaceholder = \"{PLACEHOLDER}\"\n\
             value_env = \"REAL_TOKEN\"\nhosts = [\"api.test:{}\"]",
            api.port
        );
        let policy = proxy_policy(t, &allow, &secret);
        let source = format!(
            "import os, urllib.request\n\
             token = os.environ['API_TOKEN']\n\
             print(token)\n\
             for host in ['api.test:{}', 'other.test:{}']:\n\
             \x20   req = urllib.request.Request('http://' + host + '/', headers={{'Authorization': 'Bearer ' + token}})\n\
             \x20   print(urllib.request.urlopen(req, timeout=5).read().decode())",
            api.port, other.port
        );
        let Some(obs) = run(t, &policy, &source) else { return };
        assert_eq!(obs["stdout"], format!("{PLACEHOLDER}\napi\nother\n"), "{obs:#}");
        let to_api = api.requests().join("");
        let to_other = other.requests().join("");
        assert!(to_api.contains(&format!("Bearer {SECRET_VALUE}")), "{to_api}");
        assert!(!to_other.contains(SECRET_VALUE), "the other host saw the secret: {to_other}");
        assert!(to_other.contains(PLACEHOLDER), "{to_other}");
        let everything = obs.to_string()
            + &std::fs::read_to_string(t.path().join("audit.jsonl")).unwrap_or_default();
        assert!(!everything.contains(SECRET_VALUE), "the secret leaked into the observation or audit log");
    }

    fn an_echoing_upstream_never_hands_back_the_secret_nor_can_it_go_elsewhere(t: &Target) {
        let api = EchoServer::start(true);
        let other = EchoServer::start(false);
        let allow = [
            format!("api.test:{}", api.port),
            format!("other.test:{}", other.port),
        ];
        let secret = format!(
            "[[network.secrets]]\nenv = \"API_TOKEN\"\nplaceholder = \"{PLACEHOLDER}\"\n\
             value_env = \"REAL_TOKEN\"\nhosts = [\"api.test:{}\"]",
            api.port
        );
        let policy = proxy_policy(t, &allow, &secret);
        // The job reads what the echo hands back and forwards all of it, hex-encoded past
        // any redaction, to the other host. Then it tries the real value itself (the test
        // hands it over, as a job that got it some other way would have it) in a header,
        // a body and a query toward the other host: each must be refused.
        let real_hex: String = SECRET_VALUE.bytes().map(|b| format!("{b:02x}")).collect();
        let source = format!(
            "import base64, os, urllib.error, urllib.request\n\
             token = os.environ['API_TOKEN']\n\
             req = urllib.request.Request('http://api.test:{api}/', headers={{'Authorization': 'Bearer ' + token}})\n\
             with urllib.request.urlopen(req, timeout=5) as r:\n\
             \x20   got = (r.headers.get('X-Echoed', '') + '\\n').encode() + r.read()\n\
             print('echoed', got.count(token.encode()))\n\
             fwd = urllib.request.Request('http://other.test:{other}/fwd', data=got.hex().encode())\n\
             print('forwarded', urllib.request.urlopen(fwd, timeout=5).status)\n\
             real = bytes.fromhex('{real_hex}').decode()\n\
             for how, req in [\n\
             \x20   ('header', urllib.request.Request('http://other.test:{other}/', headers={{'X-Leak': real}})),\n\
             \x20   ('body', urllib.request.Request('http://other.test:{other}/', data=base64.b64encode(real.encode()))),\n\
             \x20   ('query', urllib.request.Request('http://other.test:{other}/?k=' + real.encode().hex())),\n\
             ]:\n\
             \x20   try:\n\
             \x20       print(how, urllib.request.urlopen(req, timeout=5).status)\n\
             \x20   except urllib.error.HTTPError as e:\n\
             \x20       print(how, e.code)",
            api = api.port,
            other = other.port,
        );
        let Some(obs) = run(t, &policy, &source) else { return };
        // The upstream did get the real value and echoed it (header, request, hex, escaped)...
        let to_api = api.requests().join("");
        assert!(to_api.contains(&format!("Bearer {SECRET_VALUE}")), "{to_api}");
        // ...and the job got the placeholder back in each of those four places instead.
        assert_eq!(
            obs["stdout"],
            "echoed 4\nforwarded 200\nheader 403\nbody 403\nquery 403\n",
            "{obs:#}"
        );
        // The header and the query were refused before the proxy dialled; the body was
        // cut off before any of the value went out (its head may have, or not even that).
        let to_other = other.requests();
        assert_eq!(to_other.len(), 2, "{to_other:?}");
        let cut_body = to_other[1].split_once("\r\n\r\n").map_or("", |(_, body)| body);
        assert_eq!(cut_body, "", "a body reached the other host: {to_other:?}");
        let forwarded = to_other[0].split("\r\n\r\n").nth(1).unwrap_or_default();
        let forwarded: Vec<u8> = (0..forwarded.len() / 2)
            .filter_map(|i| u8::from_str_radix(&forwarded[2 * i..2 * i + 2], 16).ok())
            .collect();
        let forwarded = String::from_utf8_lossy(&forwarded);
        assert!(forwarded.contains(PLACEHOLDER), "{forwarded}");
        for form in forms_of(SECRET_VALUE) {
            assert!(!forwarded.contains(&form), "{form} came back to the job: {forwarded}");
            assert!(!to_other.join("").contains(&form), "{form} reached the other host");
        }
        // Audited: the scrubbed answer, and each refusal, with its reason.
        let audit = t.audit_lines();
        let connections: Vec<&serde_json::Value> =
            audit.iter().filter(|l| l["event"] == "connection").collect();
        let echoed = connections
            .iter()
            .find(|l| l["host"] == "api.test")
            .expect("an audit line for the echo");
        assert_eq!(echoed["verdict"], "allowed", "{echoed:#}");
        assert_eq!(echoed["secrets_scrubbed"], 4, "{echoed:#}");
        // The placeholder the job sent in its Authorization header was substituted once:
        // counted on the request's line and in the job's totals, never its value.
        assert_eq!(echoed["secrets_substituted"], 1, "{echoed:#}");
        assert_eq!(obs["network"]["secrets_substituted"], 1, "{obs:#}");
        assert_eq!(obs["network"]["secrets_scrubbed"], 4, "{obs:#}");
        let job_line = audit.iter().find(|l| l["event"] == "job").expect("the job's audit line");
        assert_eq!(job_line["network_usage"]["secrets_substituted"], 1, "{job_line:#}");
        assert_eq!(job_line["network_usage"]["secrets_scrubbed"], 4, "{job_line:#}");
        let refused: Vec<&&serde_json::Value> = connections
            .iter()
            .filter(|l| l["host"] == "other.test" && l["verdict"] == "denied")
            .collect();
        assert_eq!(refused.len(), 3, "{connections:#?}");
        for line in refused {
            assert_eq!(line["status"], 403, "{line:#}");
            assert!(line["reason"].as_str().unwrap().contains("outside its scope"), "{line:#}");
        }
        assert_eq!(obs["network"]["denied"], 3, "{obs:#}");
        let everything = obs.to_string()
            + &std::fs::read_to_string(t.path().join("audit.jsonl")).unwrap_or_default();
        assert!(!everything.contains(SECRET_VALUE), "the secret leaked into the observation or audit log");
    }

    fn the_proxy_connection_limit_holds(t: &Target) {
        let server = RecordingServer::start("ok");
        let allowed = format!("api.test:{}", server.port);
        let policy = proxy_policy(t, std::slice::from_ref(&allowed), "[network.limits]\nconnections = 2");
        let source = format!(
            "import urllib.request\n\
             for _ in range(3):\n\
             \x20   try:\n\
             \x20       print(urllib.request.urlopen('http://{allowed}/', timeout=5).status)\n\
             \x20   except Exception as e:\n\
             \x20       print(getattr(e, 'code', e))"
        );
        let Some(obs) = run(t, &policy, &source) else { return };
        assert_eq!(obs["stdout"], "200\n200\n429\n", "{obs:#}");
        assert_eq!(obs["network"]["limit_hit"], "connection limit");
        assert_eq!(server.requests().len(), 2);
    }

    fn the_proxy_byte_cap_holds(t: &Target) {
        // 1 MiB from upstream through a 64 KiB budget: the job gets at most the budget.
        let body: &'static str = "x".repeat(1 << 20).leak();
        let server = RecordingServer::start(body);
        let allowed = format!("api.test:{}", server.port);
        let policy = proxy_policy(t, std::slice::from_ref(&allowed), "[network.limits]\nbytes = \"64KiB\"");
        let source = format!(
            "import urllib.request\n\
             got = 0\n\
             try:\n\
             \x20   with urllib.request.urlopen('http://{allowed}/big', timeout=10) as r:\n\
             \x20       while chunk := r.read(8192):\n\
             \x20           got += len(chunk)\n\
             except Exception as e:\n\
             \x20   pass\n\
             print(got)"
        );
        let Some(obs) = run(t, &policy, &source) else { return };
        let got: u64 = obs["stdout"].as_str().unwrap().trim().parse().unwrap();
        assert!(got <= 64 * 1024, "{got} bytes through a 64 KiB cap: {obs:#}");
        assert_eq!(obs["network"]["limit_hit"], "byte limit", "{obs:#}");
        assert!(obs["network"]["bytes_down"].as_u64().unwrap() <= 64 * 1024, "{obs:#}");
    }

    fn the_proxy_idle_timeout_ends_a_silent_upstream(t: &Target) {
        // An upstream that accepts and never answers: the proxy ends the request after
        // idle_timeout, and the audit line says so.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = silent.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in silent.incoming().flatten() {
                held.push(stream);
            }
        });
        let allowed = format!("api.test:{port}");
        let policy = proxy_policy(t, std::slice::from_ref(&allowed), "[network.limits]\nidle_timeout = \"1s\"");
        let source = format!(
            "import time, urllib.request\n\
             t0 = time.monotonic()\n\
             try:\n\
             \x20   urllib.request.urlopen('http://{allowed}/', timeout=30)\n\
             \x20   print('answered')\n\
             except Exception as e:\n\
             \x20   print('ended', getattr(e, 'code', ''), round(time.monotonic() - t0))"
        );
        let Some(obs) = run(t, &policy, &source) else { return };
        let stdout = obs["stdout"].as_str().unwrap();
        assert!(stdout.starts_with("ended"), "{obs:#}");
        let waited: u64 = stdout.split_whitespace().last().unwrap().parse().unwrap();
        assert!(waited < 10, "the job waited {waited} s for a 1 s idle timeout");
        let audit = t.audit_lines();
        let line = audit.iter().find(|l| l["event"] == "connection").expect("a connection line");
        assert_eq!(line["limit"], "idle_timeout", "{line:#}");
    }

    fn allow_on_the_command_line_narrows_the_policys_list(t: &Target) {
        let server = RecordingServer::start("ok");
        let port = server.port;
        let policy = proxy_policy(t, &[format!("api.test:{port}"), format!("other.test:{port}")], "");
        let source = format!(
            "import urllib.request\n\
             for host in ['api.test', 'other.test']:\n\
             \x20   try:\n\
             \x20       print(host, urllib.request.urlopen(f'http://{{host}}:{port}/', timeout=5).status)\n\
             \x20   except Exception as e:\n\
             \x20       print(host, getattr(e, 'code', e))"
        );
        let narrowed = format!("api.test:{port}");
        let run = run_proxy_with(t, &policy, &["--allow", &narrowed], &source);
        if matches!(t.kind.base(), Kind::Gvisor | Kind::Kube) {
            assert_eq!(run.obs["error"]["kind"], "policy_denied", "{:#}", run.obs);
            return;
        }
        assert_eq!(run.obs["stdout"], "api.test 200\nother.test 403\n", "{:#}", run.obs);
        assert_eq!(server.requests().len(), 1);
        // A host the policy does not allow cannot be added from the command line.
        let run = run_proxy_with(t, &policy, &["--allow", "evil.test:80"], "print('never')");
        assert_eq!(run.obs["outcome"], "error", "{:#}", run.obs);
        assert_eq!(run.obs["error"]["kind"], "policy_denied", "{:#}", run.obs);
        assert!(run.obs["error"]["message"].as_str().unwrap().contains("evil.test"), "{:#}", run.obs);
        assert_eq!(run.code, 125);
    }
}
