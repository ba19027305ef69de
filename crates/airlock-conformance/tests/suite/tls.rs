//! Secrets in HTTPS and reviewed package installs (issue 16), on every backend with the
//! egress proxy (native, docker, podman; gVisor and kube refuse proxy jobs, checked here
//! too). The HTTPS servers run in this test on the host's 127.0.0.1 with a test CA of their
//! own, which the policy's `extra_roots` makes the proxy trust; the job trusts nothing but
//! its CA bundle, with no flag: Python's urllib and requests, curl, Node's fetch and pip
//! all find it through the variables airlock sets (pip comes as an input file, from the
//! host's wheel, so that the job's root needs only Python).
//!
//! The real value is random per test; the job gets only its first bytes and its SHA-256,
//! enough to look for it (in everything it received, its environment, its files and its
//! own memory) without holding it.

use std::path::{Path, PathBuf};

use airlock_testkit::tls::{HttpsServer, TestCa};
use pretty_assertions::assert_eq;
use sha2::Digest as _;

use super::common::{Target, proxy_job_ran, run_proxy_job};

const PLACEHOLDER: &str = "airlock-placeholder-api-token";
const OTHER_PLACEHOLDER: &str = "airlock-placeholder-other-token";
/// What every real value starts with (the job looks for it, then checks the digest).
const VALUE_PREFIX: &str = "sk-live-";

/// A fresh real value: the prefix and 16 random hex digits.
fn real_value() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    format!("{VALUE_PREFIX}{:016x}", hasher.finish())
}

/// The Python that looks for `value` by its prefix and digest: `hits(bytes)`, and the
/// job's environment, files and memory.
fn leak_scan(value: &str) -> String {
    let digest = hex(&sha2::Sha256::digest(value.as_bytes()));
    format!(
        r#"import hashlib, os
PREFIX, LEN, DIGEST = {VALUE_PREFIX:?}.encode(), {len}, {digest:?}
def hits(data):
    n, i = 0, data.find(PREFIX)
    while i != -1:
        n += hashlib.sha256(data[i:i + LEN]).hexdigest() == DIGEST
        i = data.find(PREFIX, i + 1)
    return n
def env_hits():
    return hits(open('/proc/self/environ', 'rb').read()) + sum(hits(v.encode()) for v in os.environ.values())
def file_hits():
    n = 0
    for top in ['/tmp', '/work', '/etc/ssl']:
        for root, dirs, files in os.walk(top):
            for f in files:
                try:
                    n += hits(open(os.path.join(root, f), 'rb').read())
                except OSError:
                    pass
    return n
def memory_hits():
    n, step = 0, 8 << 20
    with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if 'r' not in perms:
                continue
            start, end = (int(x, 16) for x in span.split('-'))
            at = start
            while at < end:
                try:
                    mem.seek(at)
                    n += hits(mem.read(min(step + LEN, end - at)))
                except (OSError, ValueError, OverflowError):
                    break
                at += step
    return n
"#,
        len = value.len(),
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The test CA's file, for `extra_roots`.
fn write_ca(t: &Target, ca: &TestCa) -> PathBuf {
    let path = t.path().join("test-ca.pem");
    ca.write_pem(&path);
    path
}

/// A proxy policy: `allow`, names of the tests resolved to 127.0.0.1, the CA trusted,
/// `extra` after it (secrets, packages), 30 s per job (pip and node start slowly).
fn tls_policy(t: &Target, allow: &[String], ca: &Path, extra: &str, filesystem: &str) -> PathBuf {
    let allow: Vec<String> = allow.iter().map(|a| format!("{a:?}")).collect();
    let names = [
        "api.test",
        "other.test",
        "pypi.test",
        "files.test",
        "bad.test",
    ]
    .map(|n| format!("{n:?} = [\"127.0.0.1\"]"))
    .join(", ");
    t.policy_with(
        "timeout = \"30s\"",
        filesystem,
        &format!(
            "[network]\nmode = \"proxy\"\nallow = [{}]\nallow_ranges = [\"127.0.0.1/32\"]\n\
             hosts = {{ {names} }}\nextra_roots = [{:?}]\n{extra}",
            allow.join(", "),
            ca.display().to_string(),
        ),
    )
}

/// A secret bound to `host`.
fn secret(env: &str, placeholder: &str, value_env: &str, host: &str) -> String {
    format!(
        "[[network.secrets]]\nenv = {env:?}\nplaceholder = {placeholder:?}\n\
         value_env = {value_env:?}\nhosts = [{host:?}]\n"
    )
}

/// One HTTPS API, `api.test`, with the API secret bound to it: its real value, the server,
/// its `host:port` and the policy (with the host's tools: curl, requests, pip, node).
struct Api {
    value: String,
    server: HttpsServer,
    api: String,
    policy: PathBuf,
}

fn one_api(t: &Target) -> Api {
    let ca = TestCa::new("airlock conformance upstreams");
    let server = HttpsServer::start(&ca, &["api.test"]);
    let api = format!("api.test:{}", server.port);
    let policy = tls_policy(
        t,
        std::slice::from_ref(&api),
        &write_ca(t, &ca),
        &secret("API_TOKEN", PLACEHOLDER, "REAL_TOKEN", &api),
        t.host_tools_rootfs(),
    );
    Api {
        value: real_value(),
        server,
        api,
        policy,
    }
}

fn connection_lines(t: &Target) -> Vec<serde_json::Value> {
    t.audit_lines()
        .into_iter()
        .filter(|l| l["event"] == "connection")
        .collect()
}

fn assert_nowhere(t: &Target, obs: &serde_json::Value, value: &str) {
    let everything = obs.to_string()
        + &std::fs::read_to_string(t.path().join("audit.jsonl")).unwrap_or_default();
    assert!(
        !everything.contains(value),
        "the real value is in the observation or the audit log"
    );
}

/// The host's pip as a wheel (Debian's python3-pip-whl), which runs from the zip.
fn host_pip_wheel() -> Option<PathBuf> {
    let mut wheels: Vec<PathBuf> = std::fs::read_dir("/usr/share/python-wheels")
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("pip-") && n.ends_with(".whl"))
        })
        .collect();
    wheels.sort();
    wheels.pop()
}

/// A wheel of one module, `tinypkg`, built with the host's Python (zipfile); its bytes.
fn tiny_wheel(dir: &Path) -> Vec<u8> {
    let path = dir.join("tinypkg-0.1-py3-none-any.whl");
    let script = r#"import base64, hashlib, sys, zipfile
files = {
    'tinypkg/__init__.py': b'GREETING = "hello from tinypkg"\n',
    'tinypkg-0.1.dist-info/METADATA': b'Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n',
    'tinypkg-0.1.dist-info/WHEEL': b'Wheel-Version: 1.0\nGenerator: airlock-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n',
}
record = ''
for name, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()
    record += f'{name},sha256={digest},{len(data)}\n'
record += 'tinypkg-0.1.dist-info/RECORD,,\n'
files['tinypkg-0.1.dist-info/RECORD'] = record.encode()
with zipfile.ZipFile(sys.argv[1], 'w') as z:
    for name, data in files.items():
        z.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
"#;
    let status = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&path)
        .status()
        .expect("python3 on the host builds the test wheel");
    assert!(status.success());
    std::fs::read(&path).unwrap()
}

conformance! {
    fn an_https_api_gets_the_real_key_and_the_job_only_ever_the_placeholder(t: &Target) {
        let Api { value, server, api, policy } = one_api(t);
        let source = format!(
            "{scan}\
import subprocess, urllib.request, requests
URL = 'https://{api}/echo'
t = os.environ['API_TOKEN']
auth = {{'Authorization': 'Bearer ' + t}}
got = []
r = urllib.request.urlopen(urllib.request.Request(URL, headers=auth), timeout=10)
got.append(r.headers.get('X-Echoed', '').encode() + b'\\n' + r.read())
r = requests.get(URL, headers=auth, timeout=10)
got.append(r.headers.get('X-Echoed', '').encode() + b'\\n' + r.content)
c = subprocess.run(['curl', '-sS', '-D', '-', '-H', 'Authorization: Bearer ' + t, URL], capture_output=True)
got.append(c.stdout + c.stderr)
for name, data in zip(['urllib', 'requests', 'curl'], got):
    print(name, data.count(t.encode()), hits(data))
print('env', env_hits(), 'files', file_hits(), 'memory', memory_hits())
print('bundle', os.environ['SSL_CERT_FILE'], os.environ['CURL_CA_BUNDLE'], os.environ['NODE_EXTRA_CA_CERTS'])
",
            scan = leak_scan(&value),
        );
        let run = run_proxy_job(t, &policy, &[("REAL_TOKEN", &value)], &["-c", &source]);
        let Some(obs) = proxy_job_ran(t, run) else { return };
        // Each client got the echo back with the placeholder in the four places the value
        // was (the header, the body raw, in hex, in base64) and none of the value.
        assert_eq!(
            obs["stdout"],
            "urllib 4 0\nrequests 4 0\ncurl 4 0\nenv 0 files 0 memory 0\n\
             bundle /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt \
             /etc/ssl/certs/ca-certificates.crt\n",
            "{obs:#}"
        );
        let seen = server.requests();
        assert_eq!(seen.len(), 3, "{seen:#?}");
        for request in &seen {
            assert_eq!(request.header("authorization"), Some(format!("Bearer {value}").as_str()));
            assert_eq!(request.sni.as_deref(), Some("api.test"));
        }
        let lines = connection_lines(t);
        let requests: Vec<&serde_json::Value> =
            lines.iter().filter(|l| l["method"] == "GET").collect();
        assert_eq!(requests.len(), 3, "{lines:#?}");
        for line in requests {
            assert_eq!(line["intercepted"], true, "{line:#}");
            assert_eq!(line["secrets_scrubbed"], 4, "{line:#}");
            assert_eq!(line["job_id"], obs["job_id"]);
        }
        assert_nowhere(t, &obs, &value);
    }

    fn node_fetch_trusts_the_jobs_ca_without_flags(t: &Target) {
        let Api { value, server, api, policy } = one_api(t);
        // Node before 22.21 and 24.5 sends fetch() past HTTPS_PROXY, so the job opens the
        // CONNECT itself and lets fetch run over it; nowhere does it name a CA: the trust
        // comes from NODE_EXTRA_CA_CERTS alone.
        let source = format!(
            r#"const http = require('http'), tls = require('tls');
const proxy = new URL(process.env.HTTPS_PROXY);
function connect(opts, cb) {{
  const req = http.request({{host: proxy.hostname, port: proxy.port, method: 'CONNECT', path: `${{opts.hostname}}:${{opts.port}}`}});
  req.on('connect', (res, socket) => {{
    if (res.statusCode !== 200) return cb(new Error(`proxy: ${{res.statusCode}} ${{res.statusMessage}}`));
    const s = tls.connect({{socket, servername: opts.servername || opts.hostname, ALPNProtocols: ['http/1.1']}}, () => cb(null, s));
    s.on('error', cb);
  }});
  req.on('error', cb);
  req.end();
}}
(async () => {{
  try {{ await fetch('http://127.0.0.1:9/'); }} catch (e) {{}}
  const Agent = globalThis[Symbol.for('undici.globalDispatcher.1')].constructor;
  const token = process.env.API_TOKEN;
  const r = await fetch('https://{api}/echo', {{headers: {{Authorization: 'Bearer ' + token}}, dispatcher: new Agent({{connect}})}});
  const body = (r.headers.get('x-echoed') || '') + '\n' + await r.text();
  console.log('fetch', r.status, body.split(token).length - 1, body.includes('{VALUE_PREFIX}'));
}})().catch(e => {{ console.log('fetch failed:', e.cause ? e.cause.message : e.message); process.exit(1); }});
"#
        );
        let run = run_proxy_job(t, &policy, &[("REAL_TOKEN", &value)], &["-l", "node", "-c", &source]);
        let Some(obs) = proxy_job_ran(t, run) else { return };
        assert_eq!(obs["stdout"], "fetch 200 4 false\n", "{obs:#}");
        assert_eq!(
            server.requests()[0].header("authorization"),
            Some(format!("Bearer {value}").as_str())
        );
        assert_nowhere(t, &obs, &value);
    }

    fn a_placeholder_sent_to_a_host_it_is_not_bound_to_goes_unchanged_and_is_audited(t: &Target) {
        let (value, other_value) = (real_value(), real_value());
        let ca = TestCa::new("airlock conformance upstreams");
        let api_server = HttpsServer::start(&ca, &["api.test"]);
        let other_server = HttpsServer::start(&ca, &["other.test"]);
        let api = format!("api.test:{}", api_server.port);
        let other = format!("other.test:{}", other_server.port);
        let secrets = secret("API_TOKEN", PLACEHOLDER, "REAL_TOKEN", &api)
            + &secret("OTHER_TOKEN", OTHER_PLACEHOLDER, "REAL_OTHER", &other);
        // The default root: the minimal one natively, whose CA bundle file the job's
        // replaces; urllib only.
        let policy = tls_policy(t, &[api.clone(), other.clone()], &write_ca(t, &ca), &secrets, "");
        let source = format!(
            "import os, urllib.request
req = urllib.request.Request('https://{other}/echo', headers={{'Authorization': 'Bearer ' + os.environ['API_TOKEN']}})
with urllib.request.urlopen(req, timeout=10) as r:
    print(r.status, r.read().decode().count(os.environ['API_TOKEN']))
"
        );
        let run = run_proxy_job(
            t,
            &policy,
            &[("REAL_TOKEN", &value), ("REAL_OTHER", &other_value)],
            &["-c", &source],
        );
        let Some(obs) = proxy_job_ran(t, run) else { return };
        assert_eq!(obs["stdout"], "200 1\n", "{obs:#}");
        assert_eq!(
            other_server.requests()[0].header("authorization"),
            Some(format!("Bearer {PLACEHOLDER}").as_str())
        );
        assert!(api_server.requests().is_empty());
        let lines = connection_lines(t);
        let get = lines
            .iter()
            .find(|l| l["method"] == "GET")
            .expect("the request's audit line");
        assert_eq!(get["host"], "other.test");
        assert_eq!(get["unbound_placeholders"], serde_json::json!(["API_TOKEN"]), "{get:#}");
        assert_nowhere(t, &obs, &value);
        assert_nowhere(t, &obs, &other_value);
    }

    fn http2_chunked_and_gzip_answers_carrying_the_secret_come_back_scrubbed(t: &Target) {
        let Api { value, server, api, policy } = one_api(t);
        let source = format!(
            "{scan}\
import subprocess
t = os.environ['API_TOKEN']
for http2, path in [(True, '/echo'), (True, '/echo/chunked'), (True, '/echo/gzip'), (False, '/echo/chunked'), (False, '/echo/gzip')]:
    c = subprocess.run(['curl', '-sS', '--http2' if http2 else '--http1.1', '-D', '-', '-w', '%{{http_version}}',
                        '-H', 'Authorization: Bearer ' + t, 'https://{api}' + path], capture_output=True)
    out = c.stdout + c.stderr
    print(path, out.decode().rsplit('\\n', 1)[-1], out.count(t.encode()), hits(out))
",
            scan = leak_scan(&value),
        );
        let run = run_proxy_job(t, &policy, &[("REAL_TOKEN", &value)], &["-c", &source]);
        let Some(obs) = proxy_job_ran(t, run) else { return };
        assert_eq!(
            obs["stdout"],
            "/echo 2 4 0\n/echo/chunked 2 4 0\n/echo/gzip 2 4 0\n/echo/chunked 1.1 4 0\n/echo/gzip 1.1 4 0\n",
            "{obs:#}"
        );
        let versions: Vec<String> = server.requests().iter().map(|r| r.version.clone()).collect();
        assert_eq!(versions, ["HTTP/2.0", "HTTP/2.0", "HTTP/2.0", "HTTP/1.1", "HTTP/1.1"]);
        assert_nowhere(t, &obs, &value);
    }

    fn mismatches_and_bad_upstreams_fail_with_one_clear_line(t: &Target) {
        let value = real_value();
        let ca = TestCa::new("airlock conformance upstreams");
        let server = HttpsServer::start(&ca, &["api.test"]);
        let stranger = TestCa::new("a CA nobody trusts");
        let bad = HttpsServer::start(&stranger, &["bad.test"]);
        let api = format!("api.test:{}", server.port);
        let bad_target = format!("bad.test:{}", bad.port);
        let secrets = secret("API_TOKEN", PLACEHOLDER, "REAL_TOKEN", &api)
            + &secret("BAD_TOKEN", OTHER_PLACEHOLDER, "REAL_TOKEN", &bad_target);
        let policy = tls_policy(
            t,
            &[api.clone(), bad_target.clone()],
            &write_ca(t, &ca),
            &secrets,
            t.host_tools_rootfs(),
        );
        let port = server.port;
        let source = format!(
            "import os, socket, ssl, requests
def line(how, f):
    try:
        r = f()
        print(how, r.status_code, r.text.strip())
    except Exception as e:
        print(how, 'error', str(e).splitlines()[0])
# The TLS server name is not the CONNECT host.
s = socket.create_connection(('127.0.0.1', 3128), timeout=10)
s.sendall(b'CONNECT {api} HTTP/1.1\\r\\nHost: {api}\\r\\n\\r\\n')
head = b''
while not head.endswith(b'\\r\\n\\r\\n'):
    head += s.recv(1)
try:
    ssl.create_default_context().wrap_socket(s, server_hostname='other.test')
    print('sni', 'accepted')
except ssl.SSLError as e:
    print('sni', e.reason)
# The Host header is not the CONNECT host.
line('host', lambda: requests.get('https://{api}/echo', headers={{'Host': 'other.test:{port}'}}, timeout=10))
# The upstream's certificate is not signed by anything the proxy trusts.
line('upstream', lambda: requests.get('https://{bad_target}/echo', timeout=10))
# Not on the allowlist.
line('allowlist', lambda: requests.get('https://nowhere.test/', timeout=10))
"
        );
        let run = run_proxy_job(t, &policy, &[("REAL_TOKEN", &value)], &["-c", &source]);
        let Some(obs) = proxy_job_ran(t, run) else { return };
        let stdout = obs["stdout"].as_str().unwrap();
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 4, "{obs:#}");
        assert_eq!(lines[0], "sni TLSV1_ALERT_ACCESS_DENIED", "{obs:#}");
        assert_eq!(
            lines[1],
            format!("host 421 airlock proxy: the request's Host other.test:{port} is not the tunnel's host {api}"),
        );
        assert!(
            lines[2].starts_with(&format!(
                "upstream 502 airlock proxy: TLS with the upstream {bad_target} failed: invalid peer certificate: UnknownIssuer"
            )),
            "{}",
            lines[2]
        );
        assert!(lines[3].starts_with("allowlist error "), "{}", lines[3]);
        assert!(
            lines[3].contains("403 airlock proxy: nowhere.test:443 is not on the allowlist"),
            "{}",
            lines[3]
        );
        assert!(server.requests().is_empty() && bad.requests().is_empty());
        let lines = connection_lines(t);
        let sni = lines
            .iter()
            .find(|l| l["reason"].as_str().is_some_and(|r| r.contains("(SNI)")))
            .expect("the SNI refusal's audit line");
        assert_eq!(sni["verdict"], "denied");
        assert_nowhere(t, &obs, &value);
    }

    fn pip_installs_a_hashed_wheel_from_the_allowed_index_and_refuses_another(t: &Target) {
        // pip comes as an input file, from the host's wheel, runnable as it is: the job's
        // root needs Python only (airlock-built images carry no pip, by design).
        let pip_wheel = host_pip_wheel();
        airlock_testkit::require!(
            pip_wheel.is_some(),
            "no pip wheel in /usr/share/python-wheels (apt-get install python3-pip-whl)"
        );
        let pip_wheel = pip_wheel.unwrap_or_default();
        let ca = TestCa::new("airlock conformance upstreams");
        let index = HttpsServer::start(&ca, &["pypi.test"]);
        let files = HttpsServer::start(&ca, &["files.test"]);
        let elsewhere = HttpsServer::start(&ca, &["other.test"]);
        let wheel = tiny_wheel(t.path());
        let digest = hex(&sha2::Sha256::digest(&wheel));
        let files_target = format!("files.test:{}", files.port);
        let page = format!(
            "<!DOCTYPE html><html><body>\n<a href=\"https://{files_target}/packages/tinypkg-0.1-py3-none-any.whl#sha256={digest}\">tinypkg-0.1-py3-none-any.whl</a>\n</body></html>\n"
        );
        for server in [&index, &elsewhere] {
            server.serve_file("/simple/tinypkg/", "text/html", page.clone().into_bytes());
        }
        files.serve_file("/packages/tinypkg-0.1-py3-none-any.whl", "application/octet-stream", wheel);
        let requirements = t.path().join("requirements.txt");
        std::fs::write(&requirements, format!("tinypkg==0.1 --hash=sha256:{digest}\n")).unwrap();
        let packages = format!(
            "[network.packages]\nindex = \"https://pypi.test:{}/simple\"\n",
            index.port
        );
        // No allow entry at all: the index and the file host it names are enough. The
        // default root (natively the minimal one).
        let policy = tls_policy(t, &[], &write_ca(t, &ca), &packages, "");
        let source = format!(
            "import os, subprocess, sys
def pip(*args):
    c = subprocess.run([sys.executable, '/work/pip.whl/pip', 'install', '--no-cache-dir', '--disable-pip-version-check',
                        '--retries', '0', '--target', '/tmp/site', '-r', '/work/requirements.txt', *args],
                       capture_output=True, text=True)
    return c.returncode, c.stdout + c.stderr
print('hashes', os.environ['PIP_REQUIRE_HASHES'], os.environ['PIP_INDEX_URL'] == 'https://pypi.test:{index_port}/simple')
code, out = pip()
print('allowed', code)
if code:
    print(out[-1500:])
sys.path.insert(0, '/tmp/site')
import tinypkg
print(tinypkg.GREETING)
code, out = pip('--index-url', 'https://other.test:{other_port}/simple', '--upgrade', '--force-reinstall', '--retries', '1')
# One retry, so that pip prints why the index failed (with none it only says it found nothing).
print('other', code, 'Tunnel connection failed: 403 airlock proxy: other.test:{other_port} is not on the allowlist' in out)
",
            index_port = index.port,
            other_port = elsewhere.port,
        );
        let requirements_arg = format!("requirements.txt={}", requirements.display());
        let pip_arg = format!("pip.whl={}", pip_wheel.display());
        let run = run_proxy_job(
            t,
            &policy,
            &[],
            &["--file", &requirements_arg, "--file", &pip_arg, "-c", &source],
        );
        let Some(obs) = proxy_job_ran(t, run) else { return };
        assert_eq!(
            obs["stdout"],
            "hashes 1 True\nallowed 0\nhello from tinypkg\nother 1 True\n",
            "{obs:#}"
        );
        assert!(elsewhere.requests().is_empty());
        // The audit lists what was fetched, from where.
        let fetched: Vec<(String, String)> = connection_lines(t)
            .iter()
            .filter(|l| l["method"] == "GET")
            .map(|l| (l["host"].as_str().unwrap().to_owned(), l["path"].as_str().unwrap_or("").to_owned()))
            .collect();
        assert_eq!(
            fetched,
            vec![
                ("pypi.test".to_owned(), "/simple/tinypkg/".to_owned()),
                ("files.test".to_owned(), "/packages/tinypkg-0.1-py3-none-any.whl".to_owned()),
            ]
        );
    }
}
