//! Overload: one tenant flooding the server cannot starve another, and a thousand idle
//! connections hold neither the server's memory nor its file descriptors beyond its bounds.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::common::*;
use crate::require_server;

/// The tenants, in the order their audit lines were written.
fn tenants_in_audit_order(server: &Server) -> Vec<String> {
    server
        .audit_lines()
        .iter()
        .map(|line| line["tenant"].as_str().unwrap_or("").to_owned())
        .collect()
}

async fn post_as(server: &Server, token: &str, body: &Value) -> Answer {
    post_run(server, Some(token), body).await
}

/// Tenant A fills its share (one job running, its two queue places taken) and is refused
/// with 429 naming the per-tenant bound; tenant B is still admitted, and the slot A's
/// running job frees goes to B before A's older queued jobs. Asserted by admission and the
/// order of the audit lines, never by a duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_flooding_the_server_cannot_starve_another() {
    require_server!();
    let (alice, alice_block) = new_token("alice", &[]);
    let (bob, bob_block) = new_token("bob", &[]);
    let server = Server::start(Opts {
        tokens: Some(format!("{alice_block}\n{bob_block}")),
        files: vec![(
            "fair.toml".into(),
            "version = \"fair-1\"\n[limits]\ntimeout = \"60s\"\n[admission]\nmax_queued_per_tenant = 2\n"
                .into(),
        )],
        args: ["--max-in-flight", "1", "--queue", "8", "--policy", "fair.toml"]
            .map(String::from)
            .to_vec(),
        ..Default::default()
    });
    // A's first job holds the only slot until its client goes away.
    let marker = format!("fair-{}", std::process::id());
    let body =
        json!({"language": "python", "code": "import time; time.sleep(60)", "args": [marker]})
            .to_string();
    let mut holder = TcpStream::connect(server.addr).unwrap();
    write!(
        holder,
        "POST /v1/runs HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {alice}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.addr,
        body.len()
    )
    .unwrap();
    let start = Instant::now();
    while host_pids_with(&marker).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "A's first job never started:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A queues two more: its share of the queue.
    let mut queued_a = Vec::new();
    for n in 0..2 {
        let server_url = server.url("/v1/runs");
        let token = alice.clone();
        queued_a.push(tokio::spawn(async move {
            client()
                .post(server_url)
                .bearer_auth(token)
                .json(&python(&format!("print('a{n}')")))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }));
    }
    wait_health(&server, |h| h["queue_depth"] == 2).await;
    // A's next job is refused by its own bound, with the key that sets it.
    let refused = post_as(&server, &alice, &python("print('too many')")).await;
    assert_error(&refused, 429, "backend_unavailable");
    let message = refused.body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("admission.max_queued_per_tenant = 2"),
        "{message}"
    );
    assert!(refused.headers.contains_key("retry-after"));
    // B is admitted (queued, not refused) although A holds the slot and its queue share.
    let bob_job = {
        let url = server.url("/v1/runs");
        let token = bob.clone();
        tokio::spawn(async move {
            let response = client()
                .post(url)
                .bearer_auth(token)
                .json(&python("print('b')"))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        })
    };
    wait_health(&server, |h| h["queue_depth"] == 3).await;
    // A's running job ends (its client goes away): the freed slot goes to B first.
    drop(holder);
    let (status, answer) = bob_job.await.unwrap();
    assert_eq!(status, 200, "{answer:#}");
    assert_eq!(answer["stdout"], "b\n", "{answer:#}");
    for task in queued_a {
        assert_eq!(task.await.unwrap(), 200);
    }
    assert_eq!(
        tenants_in_audit_order(&server),
        ["alice", "bob", "alice", "alice"],
        "after A's interrupted job, B's runs before A's two queued ones"
    );
    let metrics = client()
        .get(server.url("/metrics"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("reason=\"tenant_queue_full\""),
        "the refusal is counted by reason:\n{metrics}"
    );
}

/// The server's open file descriptors.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| dir.count())
        .unwrap_or(0)
}

/// The server's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Raises this process's soft open-file limit to `want` when it is lower (the server
/// inherits it); false when the hard limit does not allow it.
fn ensure_nofile(want: u64) -> bool {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    if limit.current.is_some_and(|n| n >= want) || limit.current.is_none() {
        return true;
    }
    if limit.maximum.is_some_and(|n| n < want) {
        return false;
    }
    rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(want),
            maximum: limit.maximum,
        },
    )
    .is_ok()
}

async fn health_status(server: &Server) -> u16 {
    client()
        .get(server.url("/v1/health"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// A thousand idle connections (and a few slowloris ones sending half a header): the
/// server keeps answering `/v1/health`, its file descriptors stay under its connection
/// bound plus what it held idle, and its memory grows by a bounded amount per connection.
/// Past the bound, more connections wait in the kernel's listen backlog: the server's
/// descriptors do not grow with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_connections_leave_health_answering_and_fds_bounded() {
    require_server!();
    const IDLE: usize = 1000;
    const BOUND: usize = 1024;
    if !ensure_nofile(4096) {
        if std::env::var_os("AIRLOCK_REQUIRE_ALL").is_some() {
            panic!("AIRLOCK_REQUIRE_ALL is set but this test needs 4096 open files");
        }
        eprintln!("SKIP: the open-file limit is below 4096 and cannot be raised");
        return;
    }
    let server = Server::start(Opts {
        args: ["--max-connections", "1024", "--header-timeout", "60s"]
            .map(String::from)
            .to_vec(),
        ..Default::default()
    });
    let pid = server.pid();
    assert_eq!(health_status(&server).await, 200);
    // The health check's own connection closes when its client goes: wait for the count
    // to settle before taking it as the idle figure.
    let mut fds_idle = open_fds(pid);
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        fds_idle = fds_idle.min(open_fds(pid));
    }
    let rss_idle = rss_kib(pid);
    let mut held = Vec::with_capacity(IDLE + 100);
    for n in 0..IDLE {
        let mut stream = TcpStream::connect(server.addr).unwrap();
        if n % 100 == 0 {
            // Slowloris: a request line and half a header, then nothing.
            stream
                .write_all(
                    format!(
                        "GET /v1/health HTTP/1.1\r\nHost: {}\r\nX-Slow: ",
                        server.addr
                    )
                    .as_bytes(),
                )
                .unwrap();
        }
        held.push(stream);
    }
    // Every connection is accepted (there is room under the bound): wait until the server
    // holds them, then check it still answers.
    let start = Instant::now();
    while open_fds(pid) < fds_idle + IDLE {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the server accepted only {} of {IDLE} connections",
            open_fds(pid).saturating_sub(fds_idle)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(health_status(&server).await, 200);
    let fds_busy = open_fds(pid);
    let rss_busy = rss_kib(pid);
    assert!(
        fds_busy <= fds_idle + BOUND,
        "{fds_busy} fds with {IDLE} connections (idle: {fds_idle}, bound {BOUND})"
    );
    // A connection that has sent nothing costs a task and a read buffer: far below 64 KiB.
    let growth = rss_busy.saturating_sub(rss_idle);
    assert!(
        growth < (IDLE as u64) * 64,
        "RSS grew by {growth} KiB for {IDLE} idle connections ({rss_idle} -> {rss_busy} KiB)"
    );
    // Past the bound: 100 more wait in the listen backlog (128 deep: beyond it a client's
    // connect itself waits, retrying its SYN); the server's descriptors stay bounded.
    for _ in 0..100 {
        held.push(TcpStream::connect(server.addr).unwrap());
    }
    // The server fills its bound (it accepts from the backlog up to it)...
    let start = Instant::now();
    while open_fds(pid) < fds_idle + BOUND {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the server never reached its bound: {} fds",
            open_fds(pid)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // ... and goes no further while the rest wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fds_past = open_fds(pid);
    assert!(
        fds_past <= fds_idle + BOUND,
        "{fds_past} fds past the bound (idle: {fds_idle}, bound {BOUND})"
    );
    eprintln!(
        "idle: {fds_idle} fds, {rss_idle} KiB; {IDLE} connections: {fds_busy} fds, {rss_busy} KiB; \
         {} connections: {fds_past} fds",
        IDLE + 100
    );
    // Once the clients go, the server answers again.
    drop(held);
    let start = Instant::now();
    loop {
        let answered = tokio::time::timeout(Duration::from_secs(5), health_status(&server)).await;
        if answered == Ok(200) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "health never answered after the connections closed"
        );
    }
}
