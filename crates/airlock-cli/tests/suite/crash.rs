//! `airlock serve` killed with SIGKILL while jobs run, more wait in its queue and a session
//! is open: its next start leaves nothing of it (processes, cgroups, mounts, job
//! directories), writes one audit line, marked interrupted, for every job it had accepted
//! and not ended (running or queued), and its sessions are gone (404).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::common::{TestEnv, host_pids_with, marker};
use crate::require_native;

/// Jobs in flight when the server is killed (the server's every slot).
const IN_FLIGHT: usize = 4;
/// Jobs waiting in its queue then.
const QUEUED: usize = 2;
/// Bound of each wait for something the test itself set off (a job starting, a server
/// listening): generous, for a loaded machine; never an assertion about speed.
const PATIENCE: Duration = Duration::from_secs(120);

struct Serve {
    child: Child,
    addr: String,
}

impl Serve {
    fn start(env: &TestEnv, policy: &Path) -> Self {
        let mut child = env
            .cmd()
            // A slot per job in flight; the others wait in the queue, accepted (their
            // write-ahead record is written before they wait).
            .args(["serve", "--listen", "127.0.0.1:0", "--max-in-flight"])
            .arg(IN_FLIGHT.to_string())
            .arg("--policy")
            .arg(policy)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn airlock serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut log = String::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.find("listening on http://") {
                    let addr = line[at + "listening on http://".len()..]
                        .split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_owned();
                    let _ = tx.send(Ok(addr));
                }
                log.push_str(&line);
                log.push('\n');
            }
            let _ = tx.send(Err(log));
        });
        match rx.recv_timeout(PATIENCE) {
            Ok(Ok(addr)) => Self { child, addr },
            Ok(Err(log)) => panic!("airlock serve exited:\n{log}"),
            Err(_) => panic!("airlock serve did not say where it listens"),
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request; the status and the JSON body (`Null` when there is none), or `None` when
/// the connection broke before a reply (the server died).
fn send(addr: &str, method: &str, path: &str, body: Option<&Value>) -> Option<(u16, Value)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    let body = body.map(Value::to_string).unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    let (head, body) = reply.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn accepted_ids(dir: &Path) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_suffix(".json"))
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    ids
}

#[test]
fn a_server_killed_under_load_leaves_nothing_and_every_accepted_job_is_audited_once() {
    require_native!();
    let env = TestEnv::new();
    let policy = env
        .policy("[limits]\ntimeout = \"120s\"\n[sessions]\nenabled = true\nmode = \"workspace\"");
    let accepted_dir = env.path().join("audit.jsonl.accepted");
    let server = Serve::start(&env, &policy);

    // One job that ends before the crash: its line is the ordinary one.
    let (status, done) = send(
        &server.addr,
        "POST",
        "/v1/runs",
        Some(&json!({"language": "sh", "code": "echo done"})),
    )
    .expect("a reply");
    assert_eq!(status, 200, "{done:#}");
    let done_id = done["job_id"].as_str().expect("job_id").to_owned();
    // A session, which must not outlive its server.
    let (status, session) =
        send(&server.addr, "POST", "/v1/sessions", Some(&json!({}))).expect("a reply");
    assert_eq!(status, 201, "{session:#}");
    let session_id = session["id"].as_str().expect("a session id").to_owned();

    // Jobs in flight: each a process that would run for minutes, found by its marker;
    // then more than the slots, which wait in the queue.
    let mark = marker("crash");
    let clients: Vec<_> = (0..IN_FLIGHT + QUEUED)
        .map(|_| {
            let addr = server.addr.clone();
            let code = format!("sh -c 'sleep 300; :' {mark}");
            std::thread::spawn(move || {
                send(
                    &addr,
                    "POST",
                    "/v1/runs",
                    Some(&json!({"language": "sh", "code": code})),
                )
            })
        })
        .collect();
    wait_for("every slot's job running and the rest queued", || {
        host_pids_with(&mark).len() >= IN_FLIGHT
            && accepted_ids(&accepted_dir).len() >= IN_FLIGHT + QUEUED
    });
    let (status, health) = send(&server.addr, "GET", "/v1/health", None).expect("a reply");
    assert_eq!(status, 200, "{health:#}");
    assert_eq!(health["queue_depth"], QUEUED, "{health:#}");
    assert_eq!(health["jobs_in_flight"], IN_FLIGHT, "{health:#}");
    let in_flight = accepted_ids(&accepted_dir);
    assert_eq!(in_flight.len(), IN_FLIGHT + QUEUED, "{in_flight:?}");

    // SIGKILL: nothing of the server runs its own cleanup.
    let mut server = server;
    server.child.kill().expect("SIGKILL airlock serve");
    server.child.wait().expect("reap airlock serve");
    for client in clients {
        assert_eq!(
            client.join().expect("client thread"),
            None,
            "a reply from a dead server"
        );
    }

    // The next start sweeps.
    let next = Serve::start(&env, &policy);
    wait_for("the dead server's jobs' processes gone", || {
        host_pids_with(&mark).is_empty()
    });
    let cgroups = airlock_testkit::cgroup_dir_names();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    for id in &in_flight {
        assert!(!cgroups.contains(id), "cgroup of {id} left behind");
        assert!(
            !Path::new("/run/airlock").join(id).exists(),
            "job directory of {id} left behind"
        );
        assert!(
            !mountinfo.contains(id.as_str()),
            "mount of {id} left behind"
        );
    }
    assert_eq!(accepted_ids(&accepted_dir), Vec::<String>::new());

    // Exactly one line per job the dead server accepted; the unended ones interrupted.
    let lines: Vec<Value> = env
        .audit_lines()
        .into_iter()
        .filter(|l| l["event"] == "job")
        .collect();
    let mut ids: Vec<String> = lines
        .iter()
        .map(|l| l["job_id"].as_str().unwrap_or_default().to_owned())
        .collect();
    ids.sort();
    let mut expected = in_flight.clone();
    expected.push(done_id.clone());
    expected.sort();
    assert_eq!(ids, expected, "{lines:#?}");
    for line in &lines {
        if line["job_id"] == done_id.as_str() {
            assert!(line.get("interrupted").is_none(), "{line:#}");
            assert_eq!(line["outcome"], "exited", "{line:#}");
        } else {
            assert_eq!(line["interrupted"], true, "{line:#}");
            assert_eq!(line["outcome"], "error", "{line:#}");
            assert_eq!(line["language"], "sh", "{line:#}");
            assert!(line["source_sha256"].is_string(), "{line:#}");
        }
    }

    // The dead server's session is gone, not half alive.
    let (status, body) = send(
        &next.addr,
        "GET",
        &format!("/v1/sessions/{session_id}"),
        None,
    )
    .expect("a reply");
    assert_eq!(status, 404, "{body:#}");
}
