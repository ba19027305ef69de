//! A `workspace` session on each backend that binds its workspace: `/work` carries files
//! from one call to the next, and no process of a call outlives it (each call is a fresh
//! sandbox, removed like any job's). Through a real `airlock serve --backend KIND`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};

use serde_json::{Value, json};

use super::common::{Target, airlock_containers, eventually, host_pids_with, marker};

/// `airlock serve` on 127.0.0.1 for the target's backend, stopped when dropped.
struct Serve {
    child: Child,
    addr: String,
}

impl Serve {
    fn start(t: &Target, policy: &std::path::Path) -> Self {
        let mut child = t
            .cmd()
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(t.backend_args(&[]))
            .arg("--policy")
            .arg(policy)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn airlock serve");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        // Drained for the server's life, so its log never blocks it.
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
        match rx.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(Ok(addr)) => Self { child, addr },
            Ok(Err(log)) => panic!("airlock serve exited:\n{log}"),
            Err(_) => panic!("airlock serve did not say where it listens"),
        }
    }

    /// One request; the status and the JSON body (`Null` when empty).
    fn send(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let mut stream = TcpStream::connect(&self.addr).expect("connect");
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(120)))
            .unwrap();
        let body = body.map(Value::to_string).unwrap_or_default();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).expect("read the reply");
        let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP reply");
        assert!(
            !head
                .to_ascii_lowercase()
                .contains("transfer-encoding: chunked"),
            "a chunked reply: {head}"
        );
        let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
        };
        (status, body)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        // SIGTERM: the server ends its sessions and removes their sandboxes.
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let _ = self.child.wait();
    }
}

conformance_on! {
    [native: Native, docker: Docker, podman: Podman]

    fn a_workspace_session_carries_files_but_no_process(t: &Target) {
        let policy = t.policy_with(
            "",
            "",
            "[sessions]\nenabled = true\nmode = \"workspace\"\n",
        );
        let server = Serve::start(t, &policy);
        let (status, session) = server.send("POST", "/v1/sessions", Some(&json!({})));
        assert_eq!(status, 201, "{session:#}");
        let id = session["id"].as_str().unwrap().to_owned();
        let runs = format!("/v1/sessions/{id}/runs");
        let tag = marker("session-orphan");

        // Call 1 writes a file and leaves a process behind.
        let first = json!({"language": "sh", "code": format!(
            "echo carried > /work/note.txt\nnohup sh -c 'sleep 300; : {tag}' >/dev/null 2>&1 &\necho left"
        )});
        let (status, one) = server.send("POST", &runs, Some(&first));
        assert_eq!(status, 200, "{one:#}");
        assert_eq!(one["observation"]["stdout"], "left\n", "{one:#}");
        let first_job = one["observation"]["job_id"].as_str().unwrap().to_owned();
        // Its sandbox went with it, the orphan too.
        assert!(
            eventually(30, || host_pids_with(&tag).is_empty()),
            "call 1's process outlived it: {:?}",
            host_pids_with(&tag)
        );

        // Call 2 reads the file in a fresh sandbox where nothing of call 1 runs. (The
        // pattern's `[a]` keeps grep from finding its own command line.)
        let pattern = format!("[a]{}", &tag[1..]);
        let second = json!({"language": "sh", "code": format!(
            "cat /work/note.txt\nfor p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '{pattern}' || true"
        )});
        let (status, two) = server.send("POST", &runs, Some(&second));
        assert_eq!(status, 200, "{two:#}");
        assert_eq!(two["observation"]["stdout"], "carried\n0\n", "{two:#}");
        let second_job = two["observation"]["job_id"].as_str().unwrap().to_owned();
        assert_ne!(first_job, second_job);

        let (status, _) = server.send("DELETE", &format!("/v1/sessions/{id}"), None);
        assert_eq!(status, 204);
        if t.kind.is_container() {
            for job in [&first_job, &second_job] {
                assert!(
                    eventually(30, || airlock_containers(t.kind, Some(job)).is_empty()),
                    "the container of {job} is left"
                );
            }
        }
        let (status, _) = server.send("GET", &format!("/v1/sessions/{id}"), None);
        assert_eq!(status, 404);
    }
}
