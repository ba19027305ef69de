//! Real clients through the proxy: `curl -x` (plain and `-p` tunnelled) and Python's
//! `urllib` with `HTTP_PROXY`. A client missing from the machine is skipped with a printed
//! reason (airlock-testkit's `require!`), unless `AIRLOCK_REQUIRE_ALL=1` (CI), where that
//! fails the test.

use std::process::Output;
use std::time::Duration;

use pretty_assertions::assert_eq;
use tokio::process::Command;

use super::common::*;

const PROXY_VARS: [&str; 8] = [
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// Whether `program` runs here.
async fn available(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .await
        .is_ok_and(|out| out.status.success())
}

/// A command for `program` with every proxy variable of this environment removed.
fn client(program: &str) -> Command {
    let mut command = Command::new(program);
    for var in PROXY_VARS {
        command.env_remove(var);
    }
    command
}

async fn run(command: &mut Command) -> Output {
    tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .expect("the client hung")
        .expect("the client did not start")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_reaches_an_allowed_host_and_is_refused_elsewhere() {
    airlock_testkit::require!(available("curl").await, "curl is not installed");
    let upstream = Upstream::start(Upstream::body("hello from upstream")).await;
    let port = upstream.port();
    let proxy = Setup::allowing(&[entry("allowed.test", port)]).start();
    let proxy_url = format!("http://{}", proxy.addr);

    let plain = run(client("curl").args([
        "-sS",
        "--max-time",
        "10",
        "-x",
        &proxy_url,
        &format!("http://allowed.test:{port}/plain"),
    ]))
    .await;
    assert!(plain.status.success(), "{plain:?}");
    assert_eq!(stdout(&plain), "hello from upstream");

    // -p: curl opens a CONNECT tunnel even for http://.
    let tunnelled = run(client("curl").args([
        "-sS",
        "-p",
        "--max-time",
        "10",
        "-x",
        &proxy_url,
        &format!("http://allowed.test:{port}/tunnel"),
    ]))
    .await;
    assert!(tunnelled.status.success(), "{tunnelled:?}");
    assert_eq!(stdout(&tunnelled), "hello from upstream");

    let refused = run(client("curl").args([
        "-s",
        "--max-time",
        "10",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-x",
        &proxy_url,
        &format!("http://other.test:{port}/"),
    ]))
    .await;
    assert_eq!(stdout(&refused), "403");

    let metadata = run(client("curl").args([
        "-s",
        "--max-time",
        "10",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-x",
        &proxy_url,
        "http://169.254.169.254/latest/meta-data/",
    ]))
    .await;
    assert_eq!(stdout(&metadata), "403");

    let seen = upstream.requests();
    assert_eq!(seen.len(), 2);
    assert!(
        seen[0].starts_with("GET /plain HTTP/1.1\r\n"),
        "{}",
        seen[0]
    );
    assert!(
        seen[1].starts_with("GET /tunnel HTTP/1.1\r\n"),
        "{}",
        seen[1]
    );
    assert!(proxy.dialled.all().iter().all(|a| a.port() == port));
    let summary = proxy.settle_and_shutdown(4).await;
    let methods: Vec<&str> = summary
        .connections
        .iter()
        .map(|r| r.method.as_str())
        .collect();
    assert!(methods.contains(&"CONNECT"), "{methods:?}");
    assert_eq!(summary.counts(), (2, 2), "{summary:#?}");
}

const URLLIB_SCRIPT: &str = r#"
import sys, urllib.request, urllib.error
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            print(r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        print(e.code, e.read().decode().strip())
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_urllib_follows_http_proxy() {
    airlock_testkit::require!(available("python3").await, "python3 is not installed");
    let upstream = Upstream::start(Upstream::body("hello python")).await;
    let port = upstream.port();
    let proxy = Setup::allowing(&[entry("allowed.test", port)]).start();
    let proxy_url = format!("http://{}", proxy.addr);
    let out = run(client("python3")
        .args(["-I", "-c", URLLIB_SCRIPT])
        .arg(format!("http://allowed.test:{port}/py"))
        .arg(format!("http://other.test:{port}/py"))
        .arg("http://metadata.test/")
        .env("HTTP_PROXY", &proxy_url)
        .env("http_proxy", &proxy_url))
    .await;
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<String> = stdout(&out).lines().map(str::to_owned).collect();
    assert_eq!(
        lines,
        vec![
            "200 hello python".to_owned(),
            format!("403 airlock proxy: other.test:{port} is not on the allowlist"),
            "403 airlock proxy: metadata.test:80 is not on the allowlist".to_owned(),
        ]
    );
    let seen = upstream.requests();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].starts_with("GET /py HTTP/1.1\r\n"), "{}", seen[0]);
    let summary = proxy.settle_and_shutdown(3).await;
    assert_eq!(summary.counts(), (1, 2));
}
