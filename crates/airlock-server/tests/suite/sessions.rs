//! Sessions through the real server on the native backend: kernel state, per-call wall
//! time, a killed kernel reported, ttl and idle with nothing left, tenants isolated,
//! `max_per_tenant`, workspace files carried and processes not.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::common::*;
use crate::require_server;

/// Where the server mounts session workspaces (its default as root).
const SESSIONS_ROOT: &str = "/run/airlock-sessions";

fn policy(sessions: &str) -> String {
    format!("version = \"sess-1\"\n[sessions]\nenabled = true\n{sessions}\n")
}

fn start(sessions: &str, tokens: Option<String>) -> Server {
    Server::start(Opts {
        files: vec![("policy.toml".into(), policy(sessions))],
        args: ["--policy", "policy.toml"].map(String::from).to_vec(),
        tokens,
        ..Default::default()
    })
}

struct Reply {
    status: u16,
    body: Value,
}

async fn send(
    server: &Server,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Reply {
    let mut request = client().request(method, server.url(path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).unwrap());
    }
    let response = request.send().await.expect("send");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    Reply { status, body }
}

async fn create(server: &Server, token: Option<&str>) -> Reply {
    send(
        server,
        reqwest::Method::POST,
        "/v1/sessions",
        token,
        Some(json!({})),
    )
    .await
}

async fn call(server: &Server, token: Option<&str>, id: &str, body: Value) -> Reply {
    send(
        server,
        reqwest::Method::POST,
        &format!("/v1/sessions/{id}/runs"),
        token,
        Some(body),
    )
    .await
}

fn id_of(reply: &Reply) -> String {
    assert_eq!(reply.status, 201, "{:#}", reply.body);
    reply.body["id"].as_str().unwrap().to_owned()
}

fn workspace(id: &str) -> PathBuf {
    Path::new(SESSIONS_ROOT).join(id)
}

fn mounted(path: &Path) -> bool {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let needle = format!(" {} ", path.display());
    mountinfo.lines().any(|l| l.contains(&needle))
}

/// The session's audit lines (its own events and the jobs they name).
fn session_lines(server: &Server, id: &str) -> Vec<Value> {
    server
        .audit_lines()
        .into_iter()
        .filter(|l| l["session_id"] == id)
        .collect()
}

/// Job ids of the session's kernels (the jobs whose audit lines ran the driver).
fn kernel_job_ids(server: &Server, id: &str) -> Vec<String> {
    let lines = server.audit_lines();
    let start = lines
        .iter()
        .position(|l| l["event"] == "session_start" && l["session_id"] == id);
    let end = lines
        .iter()
        .position(|l| l["event"] == "session_end" && l["session_id"] == id);
    match (start, end) {
        (Some(s), Some(e)) => lines[s..e]
            .iter()
            .filter(|l| l["event"] == "job" && l["source_bytes"].as_u64() > Some(1000))
            .filter_map(|l| l["job_id"].as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

async fn wait_gone(server: &Server, id: &str, limit: Duration) {
    let started = Instant::now();
    loop {
        let reply = send(
            server,
            reqwest::Method::GET,
            &format!("/v1/sessions/{id}"),
            None,
            None,
        )
        .await;
        if reply.status == 404 {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "session {id} still there: {:#}",
            reply.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn assert_nothing_left(server: &Server, id: &str, reason: &str) {
    let path = workspace(id);
    assert!(!path.exists(), "{} is left", path.display());
    assert!(!mounted(&path), "{} is still mounted", path.display());
    let lines = session_lines(server, id);
    let end: Vec<&Value> = lines
        .iter()
        .filter(|l| l["event"] == "session_end")
        .collect();
    assert_eq!(end.len(), 1, "{lines:#?}");
    assert_eq!(end[0]["reason"], reason, "{:#}", end[0]);
    assert_eq!(end[0]["workspace_removed"], true);
    let kernels = kernel_job_ids(server, id);
    assert!(
        leftover_job_dirs(&kernels).is_empty(),
        "job dirs of {kernels:?} left"
    );
    for job in &kernels {
        assert!(
            host_pids_with(job).is_empty(),
            "a process of the kernel job {job} is alive"
        );
    }
}

#[tokio::test]
async fn sessions_are_refused_unless_the_policy_enables_them() {
    require_server!();
    // The built-in policy enables them (bounded); a policy may turn them off.
    let server = Server::start(Opts {
        files: vec![(
            "policy.toml".into(),
            "version = \"no-sessions\"\n[sessions]\nenabled = false\n".to_owned(),
        )],
        args: ["--policy", "policy.toml"].map(String::from).to_vec(),
        ..Default::default()
    });
    let reply = create(&server, None).await;
    assert_eq!(reply.status, 403, "{:#}", reply.body);
    assert_eq!(reply.body["error"]["kind"], "policy_denied");
    assert!(
        reply.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("[sessions] enabled"),
        "{:#}",
        reply.body
    );
}

#[tokio::test]
async fn a_kernel_keeps_state_interrupts_a_loop_and_reports_its_death() {
    require_server!();
    let server = start(
        "mode = \"kernel\"\nttl = \"5m\"\nidle = \"5m\"\ninterrupt_grace = \"1s\"",
        None,
    );
    let id = id_of(&create(&server, None).await);
    assert_eq!(
        send(
            &server,
            reqwest::Method::GET,
            &format!("/v1/sessions/{id}"),
            None,
            None
        )
        .await
        .body["mode"],
        "kernel"
    );

    // A variable across three calls; the last expression comes back like a cell's.
    let one = call(&server, None, &id, json!({"code": "x = 40\nprint('set')"})).await;
    assert_eq!(one.status, 200, "{:#}", one.body);
    assert_eq!(one.body["observation"]["stdout"], "set\n");
    assert_eq!(one.body["value"], Value::Null);
    let two = call(&server, None, &id, json!({"code": "x += 1\nx"})).await;
    assert_eq!(two.body["value"], "41", "{:#}", two.body);
    let three = call(&server, None, &id, json!({"code": "x + 1"})).await;
    assert_eq!(three.body["value"], "42", "{:#}", three.body);
    assert_eq!(three.body["call"], 3);
    assert!(three.body.get("kernel_restarted").is_none());

    // A loop is interrupted at its own wall time; the kernel and its globals stay.
    let started = Instant::now();
    let looped = call(
        &server,
        None,
        &id,
        json!({"code": "while True: pass", "timeout_s": 1}),
    )
    .await;
    assert_eq!(
        looped.body["observation"]["outcome"], "timeout",
        "{:#}",
        looped.body
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    let after = call(&server, None, &id, json!({"code": "x"})).await;
    assert_eq!(after.body["value"], "41", "{:#}", after.body);
    assert!(after.body.get("kernel_restarted").is_none());

    // A call that will not stop is killed with its kernel: said so on the next call.
    let stubborn = call(
        &server,
        None,
        &id,
        json!({"code": "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True: pass", "timeout_s": 1}),
    )
    .await;
    assert_eq!(
        stubborn.body["observation"]["outcome"], "timeout",
        "{:#}",
        stubborn.body
    );
    let fresh = call(&server, None, &id, json!({"code": "x"})).await;
    assert!(
        fresh.body["kernel_restarted"]
            .as_str()
            .is_some_and(|r| r.contains("did not stop")),
        "{:#}",
        fresh.body
    );
    assert_eq!(fresh.body["error"]["name"], "NameError", "{:#}", fresh.body);
    assert!(
        !fresh.body["observation"]["stderr"]
            .as_str()
            .unwrap()
            .contains(".airlock-main.py"),
        "the driver's frames are not the cell's traceback: {:#}",
        fresh.body
    );

    // Memory exhaustion kills the kernel (the session's memory limit holds across calls).
    let hog = call(
        &server,
        None,
        &id,
        json!({"code": "keep = []\nwhile True: keep.append(bytearray(16 << 20))"}),
    )
    .await;
    assert_eq!(hog.body["observation"]["outcome"], "oom", "{:#}", hog.body);
    let next = call(&server, None, &id, json!({"code": "1 + 1"})).await;
    assert!(
        next.body["kernel_restarted"]
            .as_str()
            .is_some_and(|r| r.contains("memory")),
        "{:#}",
        next.body
    );
    assert_eq!(next.body["value"], "2");

    // Every call is an audit line with the session id; so are the start and the end.
    let del = send(
        &server,
        reqwest::Method::DELETE,
        &format!("/v1/sessions/{id}"),
        None,
        None,
    )
    .await;
    assert_eq!(del.status, 204, "{:#}", del.body);
    let lines = session_lines(&server, &id);
    let calls = lines
        .iter()
        .filter(|l| l["event"] == "session_call")
        .count();
    assert_eq!(calls, 9, "{lines:#?}");
    assert!(lines.iter().any(|l| l["event"] == "session_start"));
    assert!(lines.iter().all(|l| l["tenant"] == "-"));
    assert_nothing_left(&server, &id, "delete");
    assert_eq!(kernel_job_ids(&server, &id).len(), 3);
    let gone = call(&server, None, &id, json!({"code": "1"})).await;
    assert_eq!(gone.status, 404);
}

#[tokio::test]
async fn idle_and_ttl_destroy_sessions_with_nothing_left() {
    require_server!();
    let server = start("mode = \"kernel\"\nttl = \"4s\"\nidle = \"2s\"", None);
    // Idle: one call, then nothing.
    let idle = id_of(&create(&server, None).await);
    assert_eq!(
        call(&server, None, &idle, json!({"code": "1"}))
            .await
            .status,
        200
    );
    assert!(workspace(&idle).is_dir());
    // Busy: a call every half second, so only the ttl ends it. The order of events is
    // asserted, not a time: it answers until the ttl has passed, then it is gone while
    // still busy (a generous cap only stops a server that never ends it).
    let busy = id_of(&create(&server, None).await);
    let started = Instant::now();
    let mut ended = false;
    while started.elapsed() < Duration::from_secs(30) {
        let reply = call(&server, None, &busy, json!({"code": "1"})).await;
        if reply.status == 404 {
            ended = true;
            break;
        }
        assert_eq!(reply.status, 200, "{:#}", reply.body);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let lived = started.elapsed();
    assert!(ended, "a busy session outlived its 4 s ttl ({lived:?})");
    assert!(
        lived >= Duration::from_secs(3),
        "ended before its ttl: {lived:?}"
    );
    wait_gone(&server, &idle, Duration::from_secs(5)).await;
    wait_gone(&server, &busy, Duration::from_secs(5)).await;
    assert_nothing_left(&server, &idle, "idle");
    assert_nothing_left(&server, &busy, "ttl");
}

#[tokio::test]
async fn another_tenant_gets_404_and_max_per_tenant_answers_429() {
    require_server!();
    let (alice, alice_block) = new_token("alice", &[]);
    let (bob, bob_block) = new_token("bob", &[]);
    let server = start(
        "mode = \"workspace\"\nmax_per_tenant = 1",
        Some(format!("{alice_block}\n{bob_block}")),
    );
    let id = id_of(&create(&server, Some(&alice)).await);
    let path = format!("/v1/sessions/{id}");
    let put = client()
        .put(server.url(&format!("{path}/files/secret.txt")))
        .bearer_auth(&alice)
        .body("alice's")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status().as_u16(), 204);

    // To bob, alice's session does not exist: not 403, which would say it does.
    use reqwest::Method;
    for (method, route, body) in [
        (Method::GET, path.clone(), None),
        (
            Method::POST,
            format!("{path}/runs"),
            Some(json!({"code": "print(1)"})),
        ),
        (Method::GET, format!("{path}/files"), None),
        (Method::GET, format!("{path}/files/secret.txt"), None),
        (Method::DELETE, path.clone(), None),
    ] {
        let reply = send(&server, method.clone(), &route, Some(&bob), body).await;
        assert_eq!(reply.status, 404, "{method} {route}: {:#}", reply.body);
    }
    let bob_put = client()
        .put(server.url(&format!("{path}/files/x")))
        .bearer_auth(&bob)
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(bob_put.status().as_u16(), 404);

    // alice's one session is still whole.
    let read = client()
        .get(server.url(&format!("{path}/files/secret.txt")))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(read.text().await.unwrap(), "alice's");

    // One session each: alice's second is 429; bob still gets his own.
    let second = create(&server, Some(&alice)).await;
    assert_eq!(second.status, 429, "{:#}", second.body);
    let bobs = id_of(&create(&server, Some(&bob)).await);
    assert_ne!(bobs, id);
    let lines = session_lines(&server, &id);
    assert!(lines.iter().all(|l| l["tenant"] == "alice"), "{lines:#?}");
    for (token, id) in [(&alice, &id), (&bob, &bobs)] {
        let del = send(
            &server,
            Method::DELETE,
            &format!("/v1/sessions/{id}"),
            Some(token),
            None,
        )
        .await;
        assert_eq!(del.status, 204);
    }
    assert_nothing_left(&server, &id, "delete");
}

#[tokio::test]
async fn a_workspace_session_carries_files_but_no_process() {
    require_server!();
    let server = start("mode = \"workspace\"", None);
    let id = id_of(&create(&server, None).await);
    let first = call(
        &server,
        None,
        &id,
        json!({"code": "import subprocess\nopen('state.txt', 'w').write('from call 1')\nsubprocess.Popen(['sleep', '31337'], start_new_session=True)\nprint('started')"}),
    )
    .await;
    assert_eq!(first.status, 200, "{:#}", first.body);
    assert_eq!(
        first.body["observation"]["stdout"], "started\n",
        "{:#}",
        first.body
    );
    assert!(
        host_pids_with("31337").is_empty(),
        "call 1's sleeper outlived its sandbox"
    );
    let second = call(
        &server,
        None,
        &id,
        json!({"code": "import os\nprint(open('state.txt').read())\nseen = [open(f'/proc/{p}/cmdline', 'rb').read() for p in os.listdir('/proc') if p.isdigit()]\nprint(any(b'31337' in c for c in seen), len(seen) > 0)"}),
    )
    .await;
    let stdout = second.body["observation"]["stdout"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(stdout.starts_with("from call 1\n"), "{:#}", second.body);
    // Call 1's sleeper is nowhere in call 2's sandbox.
    assert!(stdout.ends_with("False True\n"), "{stdout}");
    // The workspace is a filesystem of its own: its mount names no host path (as a job's
    // own /work: suite::hostile::mount_table in the conformance suite).
    let mounts = call(
        &server,
        None,
        &id,
        json!({"code": "print(''.join(l for l in open('/proc/self/mountinfo') if ' /work ' in l or ' /tmp ' in l), end='')"}),
    )
    .await;
    let table = mounts.body["observation"]["stdout"]
        .as_str()
        .unwrap_or_default();
    assert!(table.contains(" /work "), "{:#}", mounts.body);
    for line in table.lines() {
        let root = line.split(' ').nth(3).unwrap_or_default();
        assert_eq!(root, "/", "a host path as the mount's root: {line}");
        assert!(!line.contains(&id) && !line.contains("/run/"), "{line}");
    }
    // Every call is a job of its own, audited as one, with the session's call line.
    let jobs: Vec<String> = session_lines(&server, &id)
        .iter()
        .filter(|l| l["event"] == "session_call")
        .map(|l| l["job_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(jobs.len(), 3);
    let audit = server.audit_lines();
    for job in &jobs {
        assert!(
            audit
                .iter()
                .any(|l| l["event"] == "job" && l["job_id"] == job.as_str())
        );
    }

    // Files in and out: the same name rules as job files, the session's own dir refused.
    let url = |p: &str| server.url(&format!("/v1/sessions/{id}/files/{p}"));
    let put = client()
        .put(url("in/data.csv"))
        .body("a,b\n1,2\n")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status().as_u16(), 204);
    let read = call(
        &server,
        None,
        &id,
        json!({"code": "print(open('in/data.csv').read().split()[1])"}),
    )
    .await;
    assert_eq!(read.body["observation"]["stdout"], "1,2\n");
    // (A client's URL library resolves "a/../b" itself; the server sees what is left.)
    for bad in [".airlock/x", "a%0Ab", "x//y", "%2Fetc%2Fpasswd", "a/..%2Fb"] {
        let reply = client().put(url(bad)).body("x").send().await.unwrap();
        assert_eq!(reply.status().as_u16(), 400, "{bad}");
    }
    let missing = client().get(url("nope.txt")).send().await.unwrap();
    assert_eq!(missing.status().as_u16(), 404);
    let listed = send(
        &server,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/files"),
        None,
        None,
    )
    .await;
    let names: Vec<&str> = listed.body["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"state.txt") && names.contains(&"in/data.csv"),
        "{names:?}"
    );
    // A link the job leaves is never followed by the host.
    call(
        &server,
        None,
        &id,
        json!({"code": "import os\nos.symlink('/etc/hostname', 'link')"}),
    )
    .await;
    let link = client().get(url("link")).send().await.unwrap();
    assert_eq!(link.status().as_u16(), 404);
    let del = send(
        &server,
        reqwest::Method::DELETE,
        &format!("/v1/sessions/{id}"),
        None,
        None,
    )
    .await;
    assert_eq!(del.status, 204);
    assert_nothing_left(&server, &id, "delete");
}

/// What the host hands back from a session's /work is scanned as `/out` is: a text file's
/// key comes back `[REDACTED:…]`, a file named after a key is listed redacted, a binary with
/// a key in it is withheld with the reason, a control character in a name is escaped, and
/// each is counted in the audit log.
#[tokio::test]
async fn a_secret_in_a_session_file_or_its_name_never_leaves_unredacted() {
    require_server!();
    let server = start("mode = \"workspace\"", None);
    let id = id_of(&create(&server, None).await);
    // Assembled in the job, so the source itself holds no key.
    let key = format!("AKIA{}", "QYLPMN5HHHFPZAM2");
    let code = "key = 'AKIA' + 'QYLPMN5HHHFPZAM2'\n\
                open('creds.txt', 'w').write('aws_key=' + key + '\\nregion=eu-west-1\\n')\n\
                open(key + '.txt', 'w').write('named after a key')\n\
                open('blob.bin', 'wb').write(b'\\x00\\x01\\xff' + key.encode() + b'\\x00\\xfe')\n\
                open('plain.bin', 'wb').write(bytes(range(256)))\n\
                open('bell\\x07name.txt', 'w').write('x')\n\
                print('written')";
    let wrote = call(&server, None, &id, json!({ "code": code })).await;
    assert_eq!(
        wrote.body["observation"]["stdout"], "written\n",
        "{:#}",
        wrote.body
    );
    let url = |p: &str| server.url(&format!("/v1/sessions/{id}/files/{p}"));

    let creds = client().get(url("creds.txt")).send().await.unwrap();
    assert_eq!(creds.status().as_u16(), 200);
    assert_eq!(creds.headers()["x-airlock-redactions"], "1");
    let text = creds.text().await.unwrap();
    assert_eq!(
        text,
        "aws_key=[REDACTED:aws-access-key-id]\nregion=eu-west-1\n"
    );
    assert!(!text.contains(&key));

    // A binary cannot be rewritten: withheld, with the reason.
    let blob = send(
        &server,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/files/blob.bin"),
        None,
        None,
    )
    .await;
    assert_eq!(blob.status, 403, "{:#}", blob.body);
    let reason = blob.body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        reason.contains("binary") && reason.contains("secret"),
        "{:#}",
        blob.body
    );
    // A binary without one comes back byte for byte.
    let plain = client().get(url("plain.bin")).send().await.unwrap();
    assert_eq!(plain.status().as_u16(), 200);
    assert_eq!(
        plain.bytes().await.unwrap().to_vec(),
        (0u8..=255).collect::<Vec<u8>>()
    );
    // Read by its real name, a file named after a key is withheld too.
    let named = client()
        .get(url(&format!("{key}.txt")))
        .send()
        .await
        .unwrap();
    assert_eq!(named.status().as_u16(), 403);
    assert!(!named.text().await.unwrap().contains(&key));

    let listed = send(
        &server,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/files"),
        None,
        None,
    )
    .await;
    let listing = listed.body.to_string();
    assert!(!listing.contains(&key), "{listing}");
    let names: Vec<&str> = listed.body["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"[REDACTED:aws-access-key-id].txt"),
        "{names:?}"
    );
    assert!(names.contains(&"bell\\x07name.txt"), "{names:?}");

    let lines = session_lines(&server, &id);
    let reads: Vec<&Value> = lines
        .iter()
        .filter(|l| l["event"] == "session_file_read")
        .collect();
    let of = |path: &str| {
        reads
            .iter()
            .find(|l| l["path"] == path)
            .unwrap_or_else(|| panic!("no read of {path} in {reads:#?}"))
    };
    assert_eq!(of("creds.txt")["redactions"], 1);
    assert_eq!(of("creds.txt")["withheld"], Value::Null);
    assert_eq!(of("blob.bin")["redactions"], 1);
    assert!(of("blob.bin")["withheld"].is_string());
    assert_eq!(of("plain.bin")["redactions"], 0);
    assert!(
        !server
            .audit_lines()
            .iter()
            .any(|l| l.to_string().contains(&key))
    );
    let listings: Vec<&Value> = lines
        .iter()
        .filter(|l| l["event"] == "session_files_listed")
        .collect();
    assert_eq!(listings.len(), 1, "{lines:#?}");
    assert_eq!(listings[0]["redactions"], 1);
}

#[tokio::test]
async fn a_killed_servers_workspaces_are_swept_by_the_next() {
    require_server!();
    // A sessions root of its own: a server of another test, starting meanwhile, would
    // sweep the dead server's workspace in the shared one before the second server here.
    let root = tempfile::tempdir().unwrap();
    let start_here = || {
        Server::start(Opts {
            files: vec![("policy.toml".into(), policy("mode = \"workspace\""))],
            args: ["--policy", "policy.toml"].map(String::from).to_vec(),
            env: vec![(
                "AIRLOCK_SESSIONS_DIR".into(),
                root.path().display().to_string(),
            )],
            ..Default::default()
        })
    };
    let workspace = |id: &str| root.path().join(id);
    let first = start_here();
    let id = id_of(&create(&first, None).await);
    assert!(mounted(&workspace(&id)));
    drop(first); // SIGKILL: no shutdown, the workspace stays mounted
    assert!(mounted(&workspace(&id)));
    let second = start_here();
    // The manager starts (and sweeps) with the first session request.
    let other = id_of(&create(&second, None).await);
    assert!(
        !workspace(&id).exists(),
        "the dead server's workspace is left"
    );
    assert!(!mounted(&workspace(&id)));
    assert!(mounted(&workspace(&other)), "a live workspace was swept");
    let del = send(
        &second,
        reqwest::Method::DELETE,
        &format!("/v1/sessions/{other}"),
        None,
        None,
    )
    .await;
    assert_eq!(del.status, 204);
}

/// One MCP request to `/mcp` (a stateless client of protocol 2026-07-28).
async fn mcp(server: &Server, method: &str, name: Option<&str>, params: Value) -> Value {
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}
    });
    let mut request = client()
        .post(server.url("/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(name) = name {
        request = request.header("mcp-name", name);
    }
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let response = request.json(&body).send().await.unwrap();
    let reply: Value = response.json().await.unwrap();
    reply["result"].clone()
}

#[tokio::test]
async fn mcp_offers_session_tools_and_run_code_takes_a_session() {
    require_server!();
    let server = start("mode = \"kernel\"", None);
    let tools = mcp(&server, "tools/list", None, json!({})).await;
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["run_code", "session_start", "session_end"],
        "{tools:#}"
    );
    for tool in tools["tools"].as_array().unwrap() {
        assert_eq!(
            tool["inputSchema"]["additionalProperties"], false,
            "{tool:#}"
        );
    }
    let call = |name: &'static str, arguments: Value| {
        let server = &server;
        async move {
            mcp(
                server,
                "tools/call",
                Some(name),
                json!({"name": name, "arguments": arguments}),
            )
            .await
        }
    };
    let started = call("session_start", json!({})).await;
    let id = started["structuredContent"]["session"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    call("run_code", json!({"code": "y = 7", "session": id})).await;
    let ran = call("run_code", json!({"code": "y * 6", "session": id})).await;
    assert_eq!(ran["isError"], false, "{ran:#}");
    assert_eq!(
        ran["structuredContent"]["session"]["value"], "42",
        "{ran:#}"
    );
    assert_eq!(ran["structuredContent"]["session"]["call"], 2);
    let ended = call("session_end", json!({"session": id})).await;
    assert_eq!(ended["isError"], false, "{ended:#}");
    let after = call("run_code", json!({"code": "y", "session": id})).await;
    assert_eq!(after["isError"], true);
    assert_eq!(after["structuredContent"]["error"]["kind"], "invalid_input");
    assert_nothing_left(&server, &id, "delete");
    let extra = call("session_start", json!({"mode": "kernel"})).await;
    assert_eq!(extra["isError"], true, "{extra:#}");
}

/// The package directory with matplotlib and pandas (scripts/ci/pylib.sh).
fn charts_pylib() -> Option<PathBuf> {
    std::env::var_os("AIRLOCK_TEST_PYLIB")
        .map(PathBuf::from)
        .filter(|dir| dir.join("matplotlib").is_dir() && dir.join("pandas").is_dir())
}

/// The file `path` of an observation's `files`, with its content decoded.
fn released_file(observation: &Value, path: &str) -> (Value, Vec<u8>) {
    use base64::Engine as _;
    let files = observation["files"].as_array().expect("files");
    let file = files
        .iter()
        .find(|f| f["path"] == path)
        .unwrap_or_else(|| panic!("no {path} in {files:#?}"))
        .clone();
    let content = base64::engine::general_purpose::STANDARD
        .decode(file["content_base64"].as_str().expect("content inline"))
        .unwrap();
    (file, content)
}

/// Decodes a PNG far enough to know it is one: the signature, every chunk's CRC, the
/// header's size, and image data that inflates to exactly the rows the header promises.
fn decode_png(bytes: &[u8]) -> (u32, u32) {
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "not a PNG signature"
    );
    let (mut at, mut size, mut idat) = (8, None, Vec::new());
    let mut channels_bits = (0u32, 0u32);
    loop {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let kind = &bytes[at + 4..at + 8];
        let data = &bytes[at + 8..at + 8 + len];
        let crc = u32::from_be_bytes(bytes[at + 8 + len..at + 12 + len].try_into().unwrap());
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(kind);
        hasher.update(data);
        assert_eq!(hasher.finalize(), crc, "bad CRC in a {kind:?} chunk");
        match kind {
            b"IHDR" => {
                let w = u32::from_be_bytes(data[0..4].try_into().unwrap());
                let h = u32::from_be_bytes(data[4..8].try_into().unwrap());
                let channels = match data[9] {
                    0 => 1,
                    2 => 3,
                    3 => 1,
                    4 => 2,
                    6 => 4,
                    other => panic!("colour type {other}"),
                };
                channels_bits = (channels, u32::from(data[8]));
                size = Some((w, h));
            }
            b"IDAT" => idat.extend_from_slice(data),
            b"IEND" => break,
            _ => {}
        }
        at += 12 + len;
    }
    let (w, h) = size.expect("no IHDR");
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::ZlibDecoder::new(&idat[..]), &mut raw)
        .expect("the image data does not inflate");
    let row = 1 + (w * channels_bits.0 * channels_bits.1).div_ceil(8);
    assert_eq!(raw.len() as u32, row * h, "the image data is not {w}x{h}");
    (w, h)
}

#[tokio::test]
async fn a_kernel_returns_open_figures_as_pngs_and_a_dataframe_as_text_and_html() {
    require_server!();
    let pylib = charts_pylib();
    airlock_testkit::require!(
        pylib.is_some(),
        "AIRLOCK_TEST_PYLIB names no directory with matplotlib and pandas (scripts/ci/pylib.sh makes one)"
    );
    let pylib = pylib.unwrap();
    // The minimal root copies the package directory in; jobs find it through PYTHONPATH.
    let policy = format!(
        "version = \"sess-charts\"\n\
         [limits]\ntimeout = \"60s\"\nmemory = \"1GiB\"\n\
         [filesystem]\nsite_packages = [\"{}\"]\n\
         [sessions]\nenabled = true\nmode = \"kernel\"\nttl = \"10m\"\nidle = \"10m\"\n",
        pylib.display()
    );
    let server = Server::start(Opts {
        files: vec![("policy.toml".into(), policy)],
        args: ["--policy", "policy.toml"].map(String::from).to_vec(),
        ..Default::default()
    });
    let id = id_of(&create(&server, None).await);

    // Step 1: load data. Nothing drawn, nothing released.
    let load = call(
        &server,
        None,
        &id,
        json!({"code": "import pandas as pd\nimport matplotlib.pyplot as plt\n\
                        df = pd.DataFrame({'x': [1, 2, 3], 'y': [4, 9, 16]})\nlen(df)",
               "timeout_s": 60}),
    )
    .await;
    assert_eq!(load.status, 200, "{:#}", load.body);
    // Under a loaded full run the kernel once read its order file before the host had
    // written it and died (the host now renames it into place whole). The server's log
    // says why a kernel ends during a call.
    assert_eq!(
        load.body["value"],
        "3",
        "{:#}\nserver log:\n{}",
        load.body,
        server.log()
    );
    assert_eq!(load.body["observation"]["files"], json!([]));

    // Step 2: a plot left open and the frame as the cell's value, its HTML asked for.
    let plot = call(
        &server,
        None,
        &id,
        json!({"code": "df.plot(x='x', y='y')\ndf", "html": true, "timeout_s": 60}),
    )
    .await;
    assert_eq!(plot.status, 200, "{:#}", plot.body);
    let observation = &plot.body["observation"];
    assert_eq!(observation["outcome"], "exited", "{observation:#}");
    let text = plot.body["value"].as_str().expect("a value");
    assert!(
        text.contains('x') && text.contains("16") && text.lines().count() == 4,
        "the frame as text: {text:?}"
    );
    let (png, bytes) = released_file(observation, "figure-1.png");
    assert_eq!(png["media_type"], "image/png", "{png:#}");
    assert_eq!(png["bytes"], bytes.len() as u64);
    let (w, h) = decode_png(&bytes);
    assert!(w >= 100 && h >= 100, "{w}x{h}");
    let (html, content) = released_file(observation, "value.html");
    assert_eq!(html["media_type"], "text/html", "{html:#}");
    let content = String::from_utf8(content).unwrap();
    assert!(
        content.contains("<table") && content.contains("<td>16</td>"),
        "{content}"
    );

    // Step 3: the figure was closed with its call; a failing call still returns what it
    // drew, and no HTML unless asked.
    let again = call(
        &server,
        None,
        &id,
        json!({"code": "plt.figure()\nplt.plot([1, 2], [3, 4])\n1 / 0", "timeout_s": 60}),
    )
    .await;
    assert_eq!(again.status, 200, "{:#}", again.body);
    assert_eq!(again.body["error"]["name"], "ZeroDivisionError");
    let files: Vec<&str> = again.body["observation"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["figure-1.png"]);
    decode_png(&released_file(&again.body["observation"], "figure-1.png").1);
    // No leftovers of the calls' files in the session's /work.
    let listed = send(
        &server,
        reqwest::Method::GET,
        &format!("/v1/sessions/{id}/files"),
        None,
        None,
    )
    .await;
    let paths: Vec<&str> = listed.body["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert!(
        paths
            .iter()
            .all(|p| !p.contains("figure") && !p.contains(".html")),
        "{paths:?}"
    );

    // Through MCP, in the same session: the figure is an image block the model sees, not
    // base64 in the JSON a second time.
    let drawn = mcp(
        &server,
        "tools/call",
        Some("run_code"),
        json!({"name": "run_code", "arguments": {
            "code": "plt.plot([1, 2, 3], [3, 1, 2])\nNone", "session": id, "timeout_s": 60}}),
    )
    .await;
    assert_eq!(drawn["isError"], false, "{drawn:#}");
    let blocks = drawn["content"].as_array().unwrap();
    let images: Vec<&Value> = blocks.iter().filter(|b| b["type"] == "image").collect();
    assert_eq!(images.len(), 1, "{drawn:#}");
    assert_eq!(images[0]["mimeType"], "image/png");
    use base64::Engine as _;
    let png = base64::engine::general_purpose::STANDARD
        .decode(images[0]["data"].as_str().unwrap())
        .unwrap();
    decode_png(&png);
    let listed = &drawn["structuredContent"]["files"][0];
    assert_eq!(listed["path"], "figure-1.png");
    assert!(listed.get("content_base64").is_none(), "{listed:#}");
}

/// Puts the probe into the session's /work through the files API.
async fn put_probe(server: &Server, id: &str) {
    let probe = airlock_testkit::require_probe().expect("the probe is built");
    let reply = client()
        .put(server.url(&format!("/v1/sessions/{id}/files/probe")))
        .body(std::fs::read(probe).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 204);
}

/// What every sandbox shows the probe, judged the way the conformance suite judges a job's
/// (crates/airlock-conformance/tests/suite/probe.rs), except for `/work`, which a session
/// makes writable on purpose.
fn assert_locked_down(
    r: &airlock_testkit::ProbeReport,
    canary: &std::net::TcpListener,
    what: &str,
    max_pid: i32,
) {
    use airlock_testkit::{DangerousCall, Outcome};
    assert_eq!((r.identity.uid, r.identity.euid), (65534, 65534), "{what}");
    assert_eq!((r.identity.gid, r.identity.egid), (65534, 65534), "{what}");
    assert_eq!(r.identity.hostname, "airlock", "{what}");
    // A pid namespace of the sandbox's own.
    assert!(r.identity.pid < max_pid, "{what}: pid {}", r.identity.pid);
    let status = r.status.as_ref().expect("/proc/self/status");
    assert_eq!(
        (
            status.cap_eff,
            status.cap_prm,
            status.cap_bnd,
            status.cap_amb,
            status.cap_inh
        ),
        (0, 0, 0, 0, 0),
        "{what}"
    );
    assert!(status.no_new_privs, "{what}");
    assert_eq!(status.seccomp, 2, "{what}");
    for path in ["/", "/usr", "/etc"] {
        assert_eq!(r.writes[path].errno_name(), Some("EROFS"), "{what}: {path}");
        assert_eq!(r.mounts[path].read_only, Some(true), "{what}: {path}");
    }
    assert!(r.writes["/work"].is_ok(), "{what}: the session's /work");
    assert_eq!(r.mounts["/tmp"].noexec, Some(true), "{what}");
    let exec = r.tmp_exec.exec.as_ref().expect("exec from /tmp tried");
    assert!(
        matches!(exec.errno_name(), Some("EACCES" | "EPERM")),
        "{what}: exec from /tmp: {exec:?}"
    );
    assert_eq!(
        r.network.interfaces.as_deref(),
        Some(&["lo".to_owned()][..]),
        "{what}"
    );
    let reached = &r.network.canary.as_ref().expect("canary tried").result;
    assert!(!reached.is_ok(), "{what}: reached the host canary");
    canary.set_nonblocking(true).unwrap();
    assert!(
        canary.accept().is_err(),
        "{what}: the canary got a connection"
    );
    for path in [
        "/etc/shadow",
        "/root",
        "/home",
        "/var",
        "/run",
        "/sys",
        "/var/run/docker.sock",
    ] {
        assert_eq!(
            r.paths.exists.get(path),
            Some(&false),
            "{what}: {path} is visible"
        );
    }
    let names: Vec<&str> = r.env.keys().map(String::as_str).collect();
    // MPLBACKEND: the kernel driver's own (figures render off-screen), inherited by what
    // a cell starts.
    let allowed = [
        "HOME",
        "LANG",
        "PATH",
        "PWD",
        "PYTHONDONTWRITEBYTECODE",
        "MPLBACKEND",
    ];
    assert!(
        names.iter().all(|n| allowed.contains(n)),
        "{what}: {names:?}"
    );
    for &call in airlock_testkit::DENIED_WITH_EPERM {
        assert_eq!(
            r.syscall(call),
            Some(&Outcome::errno("EPERM")),
            "{what}: {}",
            call.name()
        );
    }
    for call in [DangerousCall::Setuid0, DangerousCall::Setgid0] {
        let outcome = r.syscall(call).unwrap();
        assert!(
            matches!(outcome.errno_name(), Some("EPERM" | "EINVAL")),
            "{what}: {outcome:?}"
        );
    }
    assert_eq!(r.rlimits.nofile.hard, Some(256), "{what}");
}

#[tokio::test]
async fn the_probe_finds_the_same_locked_down_sandbox_in_both_session_modes() {
    require_server!();
    airlock_testkit::require!(
        airlock_testkit::require_probe().is_ok(),
        "the probe is not built (cargo build -p airlock-testkit --bins)"
    );
    let limits = "[limits]\nstdout = \"1MiB\"\ntimeout = \"20s\"\n";
    for mode in ["workspace", "kernel"] {
        let canary = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = canary.local_addr().unwrap().to_string();
        let server = Server::start(Opts {
            files: vec![(
                "policy.toml".into(),
                format!("{}{limits}", policy(&format!("mode = \"{mode}\""))),
            )],
            args: ["--policy", "policy.toml"].map(String::from).to_vec(),
            ..Default::default()
        });
        let id = id_of(&create(&server, None).await);
        put_probe(&server, &id).await;
        let body = if mode == "workspace" {
            json!({"language": "sh", "code": format!("chmod +x /work/probe && exec /work/probe report --canary {addr}")})
        } else {
            // The kernel's own sandbox: the probe is its child, as any subprocess a cell
            // starts. The host wrote the file while the kernel ran, so it is root's: the
            // cell makes its own copy to run (docs/sessions.md).
            json!({"code": format!(
                "import os, shutil, subprocess, sys\nshutil.copy('/work/probe', '/work/probe-x')\n\
                 os.chmod('/work/probe-x', 0o755)\n\
                 run = subprocess.run(['/work/probe-x', 'report', '--canary', {addr:?}], capture_output=True)\n\
                 sys.stdout.write(run.stdout.decode())\nrun.returncode"
            )})
        };
        // Twice: a session's second call sees the same shape as its first.
        for number in 1..=2 {
            let reply = call(&server, None, &id, body.clone()).await;
            assert_eq!(reply.status, 200, "{:#}", reply.body);
            let stdout = reply.body["observation"]["stdout"].as_str().unwrap();
            let report = airlock_testkit::ProbeReport::from_json(stdout)
                .unwrap_or_else(|e| panic!("{mode}: the probe's report: {e}\n{:#}", reply.body));
            // A kernel's pid namespace lives for the session: its cells' earlier
            // processes took pids too.
            let max_pid = if mode == "kernel" { 100 } else { 10 };
            assert_locked_down(
                &report,
                &canary,
                &format!("{mode} session, call {number}"),
                max_pid,
            );
        }
    }
}

/// Issue 30 items 1 and 2, in both modes: a user's `main.py` is never overwritten (not by
/// a call's source, not by the kernel's driver, not when the kernel is replaced), the
/// listing shows only the user's files, the reserved names are refused at upload, and a
/// helper module uploaded beside the code imports.
#[tokio::test]
async fn a_users_main_py_survives_every_call_and_uploaded_modules_import() {
    require_server!();
    for mode in ["workspace", "kernel"] {
        let server = start(&format!("mode = \"{mode}\""), None);
        let id = id_of(&create(&server, None).await);
        let url = |p: &str| server.url(&format!("/v1/sessions/{id}/files/{p}"));
        let user_main = "print('the user main')\n";
        for (name, body) in [
            ("main.py", user_main),
            ("util.py", "def f():\n    return 7\n"),
        ] {
            let put = client().put(url(name)).body(body).send().await.unwrap();
            assert_eq!(put.status().as_u16(), 204, "{mode} {name}");
        }
        for reserved in [".airlock-main.py", ".airlock/call-1.py", ".airlockx"] {
            let put = client().put(url(reserved)).body("x").send().await.unwrap();
            assert_eq!(put.status().as_u16(), 400, "{mode} {reserved}");
        }
        let first = call(
            &server,
            None,
            &id,
            json!({"code": "import util\nprint(util.f())"}),
        )
        .await;
        assert_eq!(
            first.body["observation"]["stdout"], "7\n",
            "{mode}: {:#}",
            first.body
        );
        if mode == "kernel" {
            // The kernel is replaced: its driver is written again, never over main.py.
            let died = call(
                &server,
                None,
                &id,
                json!({"code": "import os\nos._exit(3)"}),
            )
            .await;
            assert_eq!(died.status, 200, "{:#}", died.body);
            let again = call(&server, None, &id, json!({"code": "1"})).await;
            assert!(
                again.body["kernel_restarted"].is_string(),
                "{:#}",
                again.body
            );
        }
        let read = client().get(url("main.py")).send().await.unwrap();
        assert_eq!(read.text().await.unwrap(), user_main, "{mode}");
        let listed = send(
            &server,
            reqwest::Method::GET,
            &format!("/v1/sessions/{id}/files"),
            None,
            None,
        )
        .await;
        let mut names: Vec<&str> = listed.body["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["main.py", "util.py"], "{mode}");
    }
}

/// Reads the next server-sent event of `response` (event name, data), `None` at the end.
async fn next_event(
    response: &mut reqwest::Response,
    buffer: &mut String,
) -> Option<(String, Value)> {
    loop {
        if let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let (mut event, mut data) = (String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    event = v.to_owned();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            if !event.is_empty() {
                return Some((event, serde_json::from_str(&data).unwrap()));
            }
            continue;
        }
        let chunk = response.chunk().await.unwrap()?;
        buffer.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

/// Issue 31's code interpreter on a kernel session: results in E2B's shape (display(),
/// rich reprs, the main result last), errors with a traceback, execution counts per
/// context, contexts with their own globals and cwd, a call past its timeout interrupted
/// with the kernel usable after, a language refused, and (issue 30 item 6) `?stream=true`
/// streaming a call's output while it runs.
#[tokio::test]
async fn a_kernel_gives_rich_results_contexts_and_streams_its_output() {
    require_server!();
    let server = start(
        "mode = \"kernel\"\n[env]\nallow = [\"GREETING\"]\n[limits]\ntimeout = \"30s\"",
        None,
    );
    let id = id_of(&create(&server, None).await);

    // display() outputs in order, then the main result with its rich formats (html: true).
    let code = "class Card:\n    def _repr_html_(self): return '<b>card</b>'\n    def _repr_svg_(self): return '<svg xmlns=\"http://www.w3.org/2000/svg\"/>'\n    def _repr_json_(self): return {'k': [1, 2]}\n    def _repr_png_(self): return b'\\x89PNG\\r\\n\\x1a\\nfake'\n    def __repr__(self): return 'Card()'\ndisplay(Card())\ndisplay({'plain': 1})\nprint('between')\nCard()";
    let rich = call(&server, None, &id, json!({"code": code, "html": true})).await;
    assert_eq!(rich.status, 200, "{:#}", rich.body);
    let results = rich.body["results"]
        .as_array()
        .unwrap_or_else(|| panic!("{:#}", rich.body))
        .clone();
    assert_eq!(results.len(), 3, "{:#}", rich.body);
    assert_eq!(results[0]["is_main_result"], false);
    assert_eq!(results[0]["html"], "<b>card</b>");
    assert_eq!(results[0]["json"], json!({"k": [1, 2]}));
    assert_eq!(results[0]["text"], "Card()");
    assert_eq!(
        results[0]["svg"],
        "<svg xmlns=\"http://www.w3.org/2000/svg\"/>"
    );
    use base64::Engine as _;
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(results[0]["png"].as_str().unwrap())
            .unwrap(),
        b"\x89PNG\r\n\x1a\nfake"
    );
    assert_eq!(results[1]["text"], "{'plain': 1}");
    assert!(results[1].get("html").is_none(), "{:#}", results[1]);
    assert_eq!(results[2]["is_main_result"], true);
    assert_eq!(results[2]["html"], "<b>card</b>");
    assert_eq!(rich.body["value"], "Card()");
    assert_eq!(rich.body["observation"]["stdout"], "between\n");
    assert_eq!(rich.body["execution_count"], 1);

    // An error: name, value, the traceback from the cell's own frames.
    let failed = call(
        &server,
        None,
        &id,
        json!({"code": "def f():\n    raise KeyError('nope')\nf()"}),
    )
    .await;
    assert_eq!(
        failed.body["error"]["name"], "KeyError",
        "{:#}",
        failed.body
    );
    assert_eq!(failed.body["error"]["value"], "'nope'");
    let traceback = failed.body["error"]["traceback"].as_str().unwrap();
    assert!(
        traceback.starts_with("Traceback")
            && traceback.contains("in f")
            && !traceback.contains(".airlock"),
        "{traceback}"
    );
    assert_eq!(failed.body["execution_count"], 2);

    // Contexts: their own globals, cwd and count; restart and remove.
    call(&server, None, &id, json!({"code": "shared = 'default'"})).await;
    let url = |p: &str| server.url(&format!("/v1/sessions/{id}/contexts{p}"));
    let made = client()
        .post(url(""))
        .json(&json!({"cwd": "/work/sub"}))
        .send()
        .await
        .unwrap();
    assert_eq!(made.status().as_u16(), 201);
    let context: Value = made.json().await.unwrap();
    let ctx = context["id"].as_str().unwrap().to_owned();
    assert_eq!(context["cwd"], "/work/sub");
    assert_eq!(context["language"], "python");
    let inside = call(&server, None, &id, json!({"code": "import os\nprint(os.getcwd(), 'shared' in globals())\nmine = 1", "context": ctx})).await;
    assert_eq!(
        inside.body["observation"]["stdout"], "/work/sub False\n",
        "{:#}",
        inside.body
    );
    assert_eq!(inside.body["execution_count"], 1);
    let back = call(
        &server,
        None,
        &id,
        json!({"code": "import os\nprint(os.getcwd(), shared, 'mine' in globals())"}),
    )
    .await;
    assert_eq!(
        back.body["observation"]["stdout"], "/work default False\n",
        "{:#}",
        back.body
    );
    let listed: Value = client()
        .get(url(""))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = listed["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["default", ctx.as_str()]);
    for bad in [
        json!({"cwd": "/etc"}),
        json!({"cwd": "/work/../etc"}),
        json!({"cwd": "/work/.airlock"}),
        json!({"language": "r"}),
    ] {
        let refused = client().post(url("")).json(&bad).send().await.unwrap();
        assert_eq!(refused.status().as_u16(), 400, "{bad}");
    }
    let restarted = client()
        .post(url(&format!("/{ctx}/restart")))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(restarted.status().as_u16(), 204);
    let fresh = call(
        &server,
        None,
        &id,
        json!({"code": "'mine' in globals()", "context": ctx}),
    )
    .await;
    assert_eq!(fresh.body["value"], "False", "{:#}", fresh.body);
    let removed = client()
        .delete(url(&format!("/{ctx}")))
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status().as_u16(), 204);
    let gone = call(&server, None, &id, json!({"code": "1", "context": ctx})).await;
    assert_eq!(gone.status, 400, "{:#}", gone.body);
    let keep_default = client().delete(url("/default")).send().await.unwrap();
    assert_eq!(keep_default.status().as_u16(), 400);

    // The call's environment: allowed names only, gone after the call.
    let env = call(
        &server,
        None,
        &id,
        json!({"code": "import os\nos.environ['GREETING']", "env": {"GREETING": "hi"}}),
    )
    .await;
    assert_eq!(env.body["value"], "'hi'", "{:#}", env.body);
    let after = call(
        &server,
        None,
        &id,
        json!({"code": "import os\nos.environ.get('GREETING')"}),
    )
    .await;
    assert!(after.body.get("value").is_none(), "{:#}", after.body);
    let denied = call(
        &server,
        None,
        &id,
        json!({"code": "1", "env": {"OTHER": "x"}}),
    )
    .await;
    assert_eq!(denied.status, 403, "{:#}", denied.body);

    // Past its timeout: interrupted, and the kernel and its globals are still there.
    let looped = call(
        &server,
        None,
        &id,
        json!({"code": "while True: pass", "timeout_s": 1}),
    )
    .await;
    assert_eq!(
        looped.body["observation"]["outcome"], "timeout",
        "{:#}",
        looped.body
    );
    let alive = call(&server, None, &id, json!({"code": "shared"})).await;
    assert_eq!(alive.body["value"], "'default'", "{:#}", alive.body);
    assert!(
        alive.body.get("kernel_restarted").is_none(),
        "{:#}",
        alive.body
    );

    // Another language is refused, saying what the kernel runs.
    let other = call(
        &server,
        None,
        &id,
        json!({"code": "echo hi", "language": "bash"}),
    )
    .await;
    assert_eq!(other.status, 400, "{:#}", other.body);
    assert!(
        other.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("python only")
    );

    // Streamed: the first line arrives while the call still waits for a file the test
    // writes only once it has seen that line (so a call that did not stream could not
    // finish in time), then the results, then the whole answer.
    let mut response = client()
        .post(server.url(&format!("/v1/sessions/{id}/runs?stream=true")))
        .json(&json!({"code": "import os, time\nprint('first', flush=True)\nwhile not os.path.exists('/work/go'):\n    time.sleep(0.01)\nprint('second')\ndisplay('shown')\n42", "timeout_s": 20}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let mut buffer = String::new();
    let (event, data) = next_event(&mut response, &mut buffer)
        .await
        .expect("an event");
    assert_eq!(
        (event.as_str(), &data),
        ("stdout", &json!({"text": "first\n"}))
    );
    let put = client()
        .put(server.url(&format!("/v1/sessions/{id}/files/go")))
        .body("")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status().as_u16(), 204);
    let mut events = Vec::new();
    while let Some(event) = next_event(&mut response, &mut buffer).await {
        events.push(event);
    }
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(
        names,
        ["stdout", "result", "result", "session_run"],
        "{events:?}"
    );
    assert_eq!(events[0].1["text"], "second\n");
    assert_eq!(events[1].1["text"], "'shown'");
    assert_eq!(events[2].1["is_main_result"], true);
    let answer = &events[3].1;
    assert_eq!(
        answer["observation"]["stdout"], "first\nsecond\n",
        "{answer:#}"
    );
    assert_eq!(answer["value"], "42");

    // A workspace-less route answers 404 for an unknown session before any stream.
    let unknown = client()
        .post(server.url("/v1/sessions/nope/runs?stream=true"))
        .json(&json!({"code": "1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status().as_u16(), 404);
}

/// Issue 31's sandbox: a kernel session also runs calls as fresh jobs over the same
/// /work (E2B's `commands.run` beside `run_code`): files are shared both ways, the
/// kernel's globals survive the job, the job's processes do not, and each such call is a
/// job with its own audit line.
#[tokio::test]
async fn a_kernel_session_also_runs_fresh_jobs_over_its_workspace() {
    require_server!();
    let server = start("mode = \"kernel\"", None);
    let id = id_of(&create(&server, None).await);
    let set = call(
        &server,
        None,
        &id,
        json!({"code": "kept = 5\nopen('from_kernel.txt', 'w').write('k')"}),
    )
    .await;
    assert_eq!(set.status, 200, "{:#}", set.body);
    let job = call(
        &server,
        None,
        &id,
        json!({"code": "cat from_kernel.txt; echo j > from_job.txt; (sleep 31338 &) ; echo done", "language": "bash", "workspace": true}),
    )
    .await;
    assert_eq!(job.status, 200, "{:#}", job.body);
    assert_eq!(
        job.body["observation"]["stdout"], "kdone\n",
        "{:#}",
        job.body
    );
    assert!(job.body.get("execution_count").is_none(), "{:#}", job.body);
    assert!(
        host_pids_with("31338").is_empty(),
        "the job's sleeper outlived its sandbox"
    );
    let back = call(
        &server,
        None,
        &id,
        json!({"code": "kept, open('from_job.txt').read()"}),
    )
    .await;
    assert_eq!(back.body["value"], "(5, 'j\\n')", "{:#}", back.body);
    assert!(
        back.body.get("kernel_restarted").is_none(),
        "{:#}",
        back.body
    );
    let job_id = job.body["observation"]["job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        server
            .audit_lines()
            .iter()
            .any(|l| l["event"] == "job" && l["job_id"] == job_id.as_str()),
        "the fresh job has its own audit line"
    );
    // Streamed, a fresh job's output comes as a streamed job's does, then the answer.
    let mut response = client()
        .post(server.url(&format!("/v1/sessions/{id}/runs?stream=true")))
        .json(&json!({"code": "echo streamed", "language": "sh", "workspace": true}))
        .send()
        .await
        .unwrap();
    let mut buffer = String::new();
    let mut events = Vec::new();
    while let Some(event) = next_event(&mut response, &mut buffer).await {
        events.push(event);
    }
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(names, ["stdout", "session_run"], "{events:?}");
    assert_eq!(events[0].1["text"], "streamed\n");
    assert_eq!(events[1].1["observation"]["stdout"], "streamed\n");
}

/// Issue 35, the kernel's wake-up FIFO: a job may replace it (with a regular file, with a
/// link to a host file) and every call is still answered, the kernel's replacement
/// included; the host writes only into the FIFO it made and held open, never through a
/// name the job controls, and makes the FIFO anew for each kernel.
#[tokio::test]
async fn a_kernel_whose_wake_fifo_is_replaced_still_answers_and_the_host_follows_no_link() {
    require_server!();
    let server = start("mode = \"kernel\"\nttl = \"5m\"\nidle = \"5m\"", None);
    let id = id_of(&create(&server, None).await);
    let host_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(host_file.path(), "untouched").unwrap();
    let is_fifo = "import os, stat\nstat.S_ISFIFO(os.lstat('/work/.airlock/wake').st_mode)";

    let first = call(&server, None, &id, json!({ "code": is_fifo })).await;
    assert_eq!(first.body["value"], "True", "{:#}", first.body);
    for replacement in [
        format!(
            "os.symlink({:?}, '/work/.airlock/wake')",
            host_file.path().display()
        ),
        "open('/work/.airlock/wake', 'w').write('x')".to_owned(),
    ] {
        let swapped = call(
            &server,
            None,
            &id,
            json!({ "code": format!("import os\nos.remove('/work/.airlock/wake')\n{replacement}\n'swapped'") }),
        )
        .await;
        assert_eq!(swapped.body["value"], "'swapped'", "{:#}", swapped.body);
        for n in 1..=3 {
            let answered = call(&server, None, &id, json!({ "code": format!("{n} * 7") })).await;
            assert_eq!(
                answered.body["value"],
                (n * 7).to_string(),
                "{:#}",
                answered.body
            );
            assert!(answered.body.get("kernel_restarted").is_none());
        }
        // The next kernel gets a FIFO again, and answers.
        let died = call(
            &server,
            None,
            &id,
            json!({"code": "import os\nos._exit(3)"}),
        )
        .await;
        assert_eq!(died.status, 200, "{:#}", died.body);
        let again = call(&server, None, &id, json!({ "code": is_fifo })).await;
        assert!(
            again.body["kernel_restarted"].is_string(),
            "{:#}",
            again.body
        );
        assert_eq!(again.body["value"], "True", "{:#}", again.body);
        let next = call(&server, None, &id, json!({"code": "6 * 7"})).await;
        assert_eq!(next.body["value"], "42", "{:#}", next.body);
    }
    assert_eq!(
        std::fs::read_to_string(host_file.path()).unwrap(),
        "untouched",
        "the host wrote through the job's link"
    );
}

/// Issue 35, target 3: with the native warm pool on, a kernel session's kernel is forked
/// from the zygote with the session's mounts rather than started from scratch. It is the
/// same locked-down sandbox the probe finds in a fresh one, with the session's `/work`,
/// the CPU-time limit of the session's `ttl` (not the pool template's wall time), the
/// driver's modules and none of the zygote's own; a replaced kernel is forked again over
/// the same files.
#[tokio::test]
async fn a_kernel_forked_from_the_zygote_is_the_same_locked_down_sandbox_over_the_sessions_work() {
    require_server!();
    airlock_testkit::require!(
        airlock_testkit::require_probe().is_ok(),
        "the probe is not built (cargo build -p airlock-testkit --bins)"
    );
    let canary = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = canary.local_addr().unwrap().to_string();
    let server = start(
        "mode = \"kernel\"\nttl = \"10m\"\nidle = \"10m\"\n\
         [limits]\nstdout = \"1MiB\"\ntimeout = \"20s\"\n[native]\nwarm_pool = 1",
        None,
    );
    wait_for_zygote(&server, None).await;
    let forked_for_sessions = || {
        metric(
            &server,
            "airlock_warm_pool_sandboxes_total{result=\"started_for_session\"}",
        )
    };
    let id = id_of(&create(&server, None).await);
    assert_eq!(forked_for_sessions().await, 1, "{}", server.log());

    let modules = call(
        &server,
        None,
        &id,
        json!({"code": "import sys\nsorted(m for m in ('json', 'linecache', 'ctypes', 'fcntl', 'socket', 'resource') if m in sys.modules)"}),
    )
    .await;
    assert_eq!(
        modules.body["value"], "['json', 'linecache']",
        "the kernel keeps its driver's modules and none of the zygote's: {:#}",
        modules.body
    );
    let cpu = call(
        &server,
        None,
        &id,
        json!({"code": "import resource\nopen('/work/kept.txt', 'w').write('kept')\nresource.getrlimit(resource.RLIMIT_CPU)[0]"}),
    )
    .await;
    let cpu: u64 = cpu.body["value"].as_str().unwrap().parse().unwrap();
    // The template's would be its 20 s wall time's at most; the session lives 10 minutes.
    assert!(cpu > 100, "RLIMIT_CPU {cpu} s is not the session's");

    put_probe(&server, &id).await;
    let probe = json!({"code": format!(
        "import os, shutil, subprocess, sys\nshutil.copy('/work/probe', '/work/probe-x')\n\
         os.chmod('/work/probe-x', 0o755)\n\
         run = subprocess.run(['/work/probe-x', 'report', '--canary', {addr:?}], capture_output=True)\n\
         sys.stdout.write(run.stdout.decode())\nrun.returncode"
    )});
    let reply = call(&server, None, &id, probe.clone()).await;
    let stdout = reply.body["observation"]["stdout"].as_str().unwrap();
    let report = airlock_testkit::ProbeReport::from_json(stdout)
        .unwrap_or_else(|e| panic!("the probe's report: {e}\n{:#}", reply.body));
    assert_locked_down(&report, &canary, "a kernel forked from the zygote", 100);

    // Replaced, the kernel is forked again, over the same /work.
    let died = call(
        &server,
        None,
        &id,
        json!({"code": "import os\nos._exit(3)"}),
    )
    .await;
    assert_eq!(died.status, 200, "{:#}", died.body);
    let again = call(
        &server,
        None,
        &id,
        json!({"code": "open('/work/kept.txt').read()"}),
    )
    .await;
    assert!(
        again.body["kernel_restarted"].is_string(),
        "{:#}",
        again.body
    );
    assert_eq!(again.body["value"], "'kept'", "{:#}", again.body);
    assert_eq!(forked_for_sessions().await, 2, "{}", server.log());
}
