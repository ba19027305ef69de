//! Slow and vanishing clients: none holds a job slot or the server.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::json;

use super::common::*;
use crate::require_server;

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// Reads until EOF or error (or 30 s); returns what came and when it ended.
fn read_to_end(stream: &mut TcpStream) -> (String, Duration) {
    let start = Instant::now();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), start.elapsed())
}

#[test]
fn headers_that_never_finish_are_cut_off() {
    require_server!();
    let server = Server::start(Opts {
        args: args(&["--header-timeout", "1s"]),
        ..Default::default()
    });
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream
        .write_all(
            format!(
                "POST /v1/runs HTTP/1.1\r\nHost: {}\r\nX-Slow: ",
                server.addr
            )
            .as_bytes(),
        )
        .unwrap();
    // While the head dribbles, the server answers others.
    let mut health = TcpStream::connect(server.addr).unwrap();
    health
        .write_all(
            format!(
                "GET /v1/health HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
                server.addr
            )
            .as_bytes(),
        )
        .unwrap();
    let (text, _) = read_to_end(&mut health);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let (_, after) = read_to_end(&mut stream);
    assert!(
        after >= Duration::from_millis(900) && after < Duration::from_secs(5),
        "closed after {after:?}"
    );
    // An idle keep-alive connection is closed the same way.
    let mut idle = TcpStream::connect(server.addr).unwrap();
    idle.write_all(format!("GET /v1/health HTTP/1.1\r\nHost: {}\r\n\r\n", server.addr).as_bytes())
        .unwrap();
    let (text, after) = read_to_end(&mut idle);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        after < Duration::from_secs(5),
        "idle connection kept {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_never_holds_a_job_slot() {
    require_server!();
    // One slot, no queue: a slot held by a slow client would make the next job a 429.
    let server = Server::start(Opts {
        args: args(&[
            "--max-in-flight",
            "1",
            "--queue",
            "0",
            "--body-timeout",
            "2s",
        ]),
        ..Default::default()
    });
    let mut slow = Vec::new();
    for _ in 0..3 {
        let mut stream = TcpStream::connect(server.addr).unwrap();
        stream
            .write_all(
                format!(
                    "POST /v1/runs HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"langua",
                    server.addr
                )
                .as_bytes(),
            )
            .unwrap();
        slow.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = post_run(&server, None, &python("print('not blocked')")).await;
    assert_eq!(answer.status, 200, "{:#}", answer.body);
    for mut stream in slow {
        let (text, after) = tokio::task::spawn_blocking(move || read_to_end(&mut stream))
            .await
            .unwrap();
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(after < Duration::from_secs(5));
    }
    assert_eq!(
        server.audit_lines().len(),
        1,
        "slow bodies never reach the engine"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_client_that_never_reads_holds_neither_a_slot_nor_the_server() {
    require_server!();
    let server = Server::start(Opts {
        args: args(&[
            "--policy",
            "big.toml",
            "--max-in-flight",
            "1",
            "--queue",
            "0",
            "--write-stall-timeout",
            "2s",
        ]),
        // Keeps 8 MiB of stdout, so the answer is far bigger than the socket buffers.
        files: vec![(
            "big.toml".into(),
            "version = \"big-1\"\n[limits]\nstdout = \"8MiB\"\n".into(),
        )],
        ..Default::default()
    });
    let mut stalled = TcpStream::connect(server.addr).unwrap();
    let body =
        json!({"language": "python", "code": "import sys\nsys.stdout.write('x' * 8_000_000)"})
            .to_string();
    write!(
        stalled,
        "POST /v1/runs?stream=true HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.addr,
        body.len()
    )
    .unwrap();
    // Never read. The job ends by itself and frees its slot; the next job runs.
    wait_health(&server, |h| h["jobs_in_flight"] == 1).await;
    let start = Instant::now();
    loop {
        let answer = post_run(&server, None, &python("print(1)")).await;
        if answer.status == 200 {
            break;
        }
        assert_eq!(answer.status, 429);
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "slot never freed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The stalled connection is closed by the server: reading now ends before the whole
    // answer (the observation event) arrives.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (text, _) = tokio::task::spawn_blocking(move || read_to_end(&mut stalled))
        .await
        .unwrap();
    assert!(
        text.starts_with("HTTP/1.1 200"),
        "{}",
        &text[..text.len().min(200)]
    );
    assert!(
        !text.contains("event: observation"),
        "the stalled answer was delivered in full ({} bytes)",
        text.len()
    );
    let health = wait_health(&server, |h| h["jobs_in_flight"] == 0).await;
    assert_eq!(health["status"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_gets_its_job_killed_and_audited() {
    require_server!();
    let server = Server::start(Opts::default());
    for stream in [false, true] {
        let marker = format!("gone-{}-{stream}", std::process::id());
        let body =
            json!({"language": "python", "code": "import time; time.sleep(4)", "args": [marker]})
                .to_string();
        let path = if stream {
            "/v1/runs?stream=true"
        } else {
            "/v1/runs"
        };
        let mut client = TcpStream::connect(server.addr).unwrap();
        write!(
            client,
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            server.addr,
            body.len()
        )
        .unwrap();
        let start = Instant::now();
        while host_pids_with(&marker).is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "job never started"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let before = server.audit_lines().len();
        drop(client);
        let gone = Instant::now();
        loop {
            let lines = server.audit_lines();
            if lines.len() > before {
                let line = lines.last().unwrap();
                assert_eq!(line["outcome"], "error", "{line}");
                assert_eq!(line["error_kind"], "internal", "{line}");
                break;
            }
            // The job sleeps 4 s: its audit line says whether it was killed or ended.
            assert!(
                gone.elapsed() < Duration::from_secs(15),
                "no audit line for the job (stream={stream})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(host_pids_with(&marker).is_empty(), "job processes left");
        let id = server.audit_lines().last().unwrap()["job_id"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(leftover_job_dirs(&[id]), Vec::<String>::new());
    }
}
