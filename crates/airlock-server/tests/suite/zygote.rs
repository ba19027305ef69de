//! Warm sandboxes forked from a zygote (`[native] zygote`, docs/speed.md): a forked job
//! sees what a fresh job sees; no descriptor, thread or lock of the zygote reaches it;
//! its random state is its own; its per-user kernel budgets are its own; a zygote that
//! dies is replaced without ending the jobs its children run; nothing is left behind.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::common::*;
use super::warm::equivalence_cases;
use crate::require_server;

const POOL: u64 = 2;

/// A policy with a warm pool forked from a zygote; `native` lines are added to `[native]`,
/// `rest` after it.
fn policy(native: &str, rest: &str) -> String {
    format!(
        "version = \"zygote-test-1\"\n[limits]\ntimeout = \"3s\"\n[native]\nwarm_pool = {POOL}\n\
         zygote = true\n{native}\n{rest}"
    )
}

fn server_with(text: String) -> Server {
    Server::start(Opts {
        args: ["--policy", "zygote.toml"].map(String::from).to_vec(),
        files: vec![("zygote.toml".into(), text)],
        ..Default::default()
    })
}

async fn forked_hits(server: &Server) -> u64 {
    metric(server, "airlock_warm_pool_zygote_total{result=\"hit\"}").await
}

async fn zygote_events(server: &Server, result: &str) -> u64 {
    metric(
        server,
        &format!("airlock_warm_pool_zygote_total{{result=\"{result}\"}}"),
    )
    .await
}

/// A forked job's `RLIMIT_MSGQUEUE` (docs/speed.md): a fresh job's 819200 bytes where
/// airlock may raise the ceiling its zygote's children share, else a sixteenth of what
/// its own hard limit gives, so that no child can take another's.
fn forked_msgqueue_rlimit() -> u64 {
    const FRESH: u64 = 819_200;
    if airlock_testkit::require::has_cap_sys_resource() {
        return FRESH;
    }
    let hard = rustix::process::getrlimit(rustix::process::Resource::Msgqueue)
        .maximum
        .unwrap_or(u64::MAX);
    FRESH.min((FRESH * 16).min(hard) / 16)
}

/// The processes of this server's zygotes (the Python program in a `zygote-*` cgroup,
/// below the server, started by the sandbox's init: a child just forked from it is
/// there too for a moment, but its parent is the zygote), by pid.
fn zygote_pids(server_pid: u32) -> Vec<u32> {
    let python = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim().starts_with("python"))
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let in_zygote = std::fs::read_to_string(entry.path().join("cgroup"))
            .is_ok_and(|c| c.lines().any(|l| l.contains("/zygote-")));
        if in_zygote
            && python(pid)
            && !parent_of(pid).is_some_and(python)
            && descends_from(pid, server_pid)
        {
            found.push(pid);
        }
    }
    found
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn descends_from(mut pid: u32, ancestor: u32) -> bool {
    for _ in 0..64 {
        match parent_of(pid) {
            Some(parent) if parent == ancestor => return true,
            Some(parent) if parent > 1 => pid = parent,
            _ => return false,
        }
    }
    false
}

/// The names of this server's sandboxes (`warm-*`, `zygote-*`: their job directories and
/// cgroups), from the cgroups of the processes below it.
fn sandbox_names(server_pid: u32) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if !descends_from(pid, server_pid) {
            continue;
        }
        let cgroups = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        for line in cgroups.lines() {
            let name = line.rsplit('/').next().unwrap_or_default();
            if name.starts_with("warm-") || name.starts_with("zygote-") {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

async fn wait_for(what: &str, server: &Server, secs: u64, mut check: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "{what} within {secs} s:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The mount points of the template's own mounts that a forked child covers with its own
/// (docs/speed.md): they show in its mount table beneath the child's, unreachable. The
/// template mounts no /work (each child attaches its job's over the empty directory).
const TEMPLATE_MOUNTS_COVERED: [&str; 3] = ["/dev/shm", "/proc", "/tmp"];

/// The mount points of the entries of `forked` (a probe's `mounts`) beyond those of `fresh`,
/// each entry of `fresh` matched once; sorted.
fn covered_template_mounts(forked: &Value, fresh: &Value) -> Vec<String> {
    let mut extra: Vec<Value> = forked.as_array().cloned().unwrap_or_default();
    for mount in fresh.as_array().into_iter().flatten() {
        let at = extra.iter().position(|m| m == mount);
        assert!(at.is_some(), "a fresh job's mount is missing: {mount}");
        extra.remove(at.unwrap_or_default());
    }
    let mut points: Vec<String> = extra
        .iter()
        .map(|m| m[0].as_str().unwrap_or_default().to_owned())
        .collect();
    points.sort();
    points
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forked_jobs_see_exactly_what_fresh_jobs_see() {
    require_server!();
    let cold = server_with(policy("", "").replace(&format!("warm_pool = {POOL}"), "warm_pool = 0"));
    let forked = server_with(policy("", ""));
    wait_ready(&forked, POOL).await;
    // How a forked job ends is the job's own (docs/speed.md): more endings than a warm
    // sandbox is checked on.
    let mut cases = equivalence_cases();
    cases.extend([
        python("import sys\nsys.exit('a message')\n"),
        python("import sys\nsys.exit(300)\n"),
        python("import threading, time\nthreading.Thread(target=time.sleep, args=(5,), daemon=True).start()\nprint('daemon')\n"),
        python("class D:\n    def __del__(self):\n        print('del ran')\nd = D()\nprint('end')\n"),
        python("import sys\nprint('x', end='')\nsys.stdout.write('y')\n"),
        python("raise KeyboardInterrupt\n"),
    ]);
    // What may differ, but for the pid (docs/speed.md): where this host makes the zygote's
    // children share a message-queue ceiling, each one's share of it; and the mount table,
    // which also lists the template's mounts the child's own cover.
    let msgqueue = forked_msgqueue_rlimit();
    let declared = |forked_probe: &mut Value, cold_probe: &mut Value| {
        assert_eq!(
            forked_probe["rlimits"][12],
            json!([msgqueue, msgqueue]),
            "RLIMIT_MSGQUEUE"
        );
        forked_probe["rlimits"][12] = cold_probe["rlimits"][12].clone();
        let covered = covered_template_mounts(&forked_probe["mounts"], &cold_probe["mounts"]);
        assert_eq!(
            covered, TEMPLATE_MOUNTS_COVERED,
            "the forked job's mounts beyond a fresh job's: {:#}",
            forked_probe["mounts"]
        );
        forked_probe["mounts"] = cold_probe["mounts"].clone();
    };
    assert_warm_sees_what_cold_sees(&cold, &forked, POOL, &cases, &[], &["pid"], declared).await;
    assert_eq!(
        forked_hits(&forked).await,
        cases.len() as u64,
        "a job ran in a sandbox started from scratch:\n{}",
        forked.log()
    );
    assert_eq!(zygote_events(&forked, "fork_failed").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forked_job_holds_no_descriptor_thread_or_lock_of_the_zygote() {
    require_server!();
    // Modules whose locks the zygote holds objects of: logging's module and handler locks,
    // decimal's context, concurrent.futures' globals, and the import lock itself.
    let forked = server_with(policy(
        "warm_preload = [\"logging\", \"decimal\", \"concurrent.futures\"]",
        "",
    ));
    wait_ready(&forked, POOL).await;
    let job = python(
        "import json, os, threading, logging, decimal, concurrent.futures\n\
         fds = []\n\
         for fd in os.listdir('/proc/self/fd'):\n\
         \x20   try:\n\
         \x20       fds.append(os.readlink('/proc/self/fd/' + fd))\n\
         \x20   except FileNotFoundError:\n\
         \x20       fds.append('the listing itself')\n\
         threads = os.listdir('/proc/self/task')\n\
         def work(n):\n\
         \x20   logging.getLogger('job').warning('thread %d', n)\n\
         \x20   import sqlite3, fractions\n\
         \x20   return str(decimal.Decimal(n) / 3)\n\
         with concurrent.futures.ThreadPoolExecutor(4) as pool:\n\
         \x20   done = list(pool.map(work, range(8)))\n\
         print(json.dumps({'fds': sorted(fds), 'threads': threads, 'done': len(done)}))\n",
    );
    for _ in 0..2 {
        let got = post_run(&forked, None, &job).await;
        assert_eq!(got.body["outcome"], "exited", "{:#}", got.body);
        let seen: Value = serde_json::from_str(got.body["stdout"].as_str().unwrap())
            .unwrap_or_else(|e| panic!("{e}: {:#}", got.body));
        // stdin (/dev/null, as a fresh job without input has), stdout and stderr (the
        // host's pipes) and the listing's own directory: nothing of the zygote's (its
        // socket, its children's pidfds, a mount, a cgroup file) and nothing of the
        // sandbox's setup.
        let fds: Vec<&str> = seen["fds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(fds.len(), 4, "{fds:?}");
        assert_eq!(
            fds.iter().filter(|f| f.starts_with("pipe:[")).count(),
            2,
            "{fds:?}"
        );
        assert!(fds.contains(&"/dev/null"), "{fds:?}");
        assert!(fds.contains(&"the listing itself"), "{fds:?}");
        // One thread when the job began, and no lock held at the fork blocked its threads.
        assert_eq!(seen["threads"].as_array().unwrap().len(), 1, "{seen}");
        assert_eq!(seen["done"], 8);
        assert_eq!(
            got.body["stderr"]
                .as_str()
                .unwrap()
                .matches("thread ")
                .count(),
            8,
            "{:#}",
            got.body
        );
        wait_ready(&forked, POOL).await;
    }
    assert_eq!(forked_hits(&forked).await, 2, "{}", forked.log());
}

/// The package directory with numpy (scripts/ci/pylib.sh).
fn pylib() -> Option<PathBuf> {
    std::env::var_os("AIRLOCK_TEST_PYLIB")
        .map(PathBuf::from)
        .filter(|dir| dir.join("numpy").is_dir())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_forked_jobs_draw_different_random_numbers() {
    require_server!();
    let pylib = pylib();
    airlock_testkit::require!(
        pylib.is_some(),
        "AIRLOCK_TEST_PYLIB names no directory with numpy (scripts/ci/pylib.sh makes one)"
    );
    let pylib = pylib.unwrap();
    let forked = server_with(policy(
        "warm_preload = [\"random\", \"tempfile\", \"numpy\"]",
        &format!("[filesystem]\nsite_packages = [\"{}\"]\n", pylib.display()),
    ));
    wait_ready(&forked, POOL).await;
    // Everything the zygote imported and could have drawn from before the fork.
    let job = python(
        "import json, random, tempfile, numpy\n\
         print(json.dumps({'random': random.getrandbits(64), 'numpy': int(numpy.random.randint(0, 2**62)),\n\
         \x20   'tempfile': next(tempfile._get_candidate_names()), 'hash': hash('airlock'),\n\
         \x20   'default_rng': int(numpy.random.default_rng().integers(0, 2**62))}))\n",
    );
    let mut draws = Vec::new();
    for _ in 0..3 {
        let got = post_run(&forked, None, &job).await;
        assert_eq!(got.body["outcome"], "exited", "{:#}", got.body);
        draws.push(serde_json::from_str::<Value>(got.body["stdout"].as_str().unwrap()).unwrap());
        wait_ready(&forked, POOL).await;
    }
    assert_eq!(forked_hits(&forked).await, 3, "{}", forked.log());
    for key in ["random", "numpy", "tempfile", "default_rng"] {
        let values: std::collections::BTreeSet<String> =
            draws.iter().map(|d| d[key].to_string()).collect();
        assert_eq!(
            values.len(),
            draws.len(),
            "{key} repeats across children: {draws:?}"
        );
    }
    // Shared by construction and documented (docs/speed.md): the string hash seed.
    let hashes: std::collections::BTreeSet<String> =
        draws.iter().map(|d| d["hash"].to_string()).collect();
    assert_eq!(hashes.len(), 1, "{draws:?}");
}

/// `[native] zygote_forks` bounds how many jobs share a zygote's hash secret and layout:
/// with one fork each, two forked jobs come from two zygotes and see different
/// `hash('x')` (with the default, consecutive forked jobs see the same, above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zygote_is_replaced_after_its_forks_and_the_next_jobs_hash_secret_differs() {
    require_server!();
    let forked = server_with(
        "version = \"zygote-forks-1\"\n[limits]\ntimeout = \"3s\"\n[native]\nwarm_pool = 1\n\
         zygote = true\nzygote_forks = 1\n"
            .to_owned(),
    );
    let job = python("import os\nprint(hash('x'), os.getppid())");
    let mut hashes = Vec::new();
    for _ in 0..2 {
        wait_ready(&forked, 1).await;
        let got = post_run(&forked, None, &job).await;
        assert_eq!(got.body["outcome"], "exited", "{:#}", got.body);
        hashes.push(got.body["stdout"].as_str().unwrap().to_owned());
    }
    // Both jobs ran in forked sandboxes, of two zygotes.
    assert_eq!(forked_hits(&forked).await, 2, "{}", forked.log());
    assert!(
        zygote_events(&forked, "started").await >= 2,
        "{}",
        forked.log()
    );
    let hash = |line: &str| {
        line.split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    assert_ne!(hash(&hashes[0]), hash(&hashes[1]), "{hashes:?}");
}

/// What both budget jobs start with: libc, and a small message queue's attributes.
const BUDGET_PRELUDE: &str = r#"
import ctypes, errno, json, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
class Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long),
                ("msgsize", ctypes.c_long), ("curmsgs", ctypes.c_long),
                ("pad", ctypes.c_long * 4)]
small = Attr(0, 1, 64, 0)
def err():
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
"#;

/// Takes as much as it can of each per-user budget (inotify instances, POSIX message
/// queue bytes in small queues, queued signals), then starts a child whose command line is
/// `<argv[1]>-held` and holds everything until it is killed.
const EXHAUST: &str = r#"
took = {}
fds = []
while len(fds) < 4096 and libc.inotify_init1(0) >= 0:
    fds.append(1)
took['inotify'] = len(fds)
queues = 0
while queues < 100000 and libc.mq_open(b'/budget-%d' % queues, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(small)) >= 0:
    queues += 1
took['mq'] = queues
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
sent = 0
while sent < 200000 and libc.sigqueue(os.getpid(), signal.SIGRTMIN, ctypes.c_void_p(0)) == 0:
    sent += 1
took['sig'] = sent
print(took, flush=True)
pid = os.fork()
if pid == 0:
    os.execv('/bin/sleep', [sys.argv[1] + '-held', '20'])
os.waitpid(pid, 0)
"#;

/// One of each budget, in a small queue; what each call answered.
const TAKE_ONE: &str = r#"
out = {}
out['inotify'] = 'ok' if libc.inotify_init1(0) >= 0 else err()
out['mq'] = 'ok' if libc.mq_open(b'/one', os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(small)) >= 0 else err()
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
out['sigqueue'] = 'ok' if libc.sigqueue(os.getpid(), signal.SIGRTMIN, ctypes.c_void_p(0)) == 0 else err()
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forked_jobs_cannot_exhaust_each_others_kernel_budgets() {
    require_server!();
    let forked = server_with(
        "version = \"zygote-budgets\"\n[limits]\ntimeout = \"30s\"\n[native]\nwarm_pool = 2\nzygote = true\n"
            .to_owned(),
    );
    wait_ready(&forked, 2).await;
    let marker = format!("airlock-zygote-budgets-{}", std::process::id());
    let holder = spawn_run(
        &forked,
        json!({"language": "python", "code": format!("{BUDGET_PRELUDE}{EXHAUST}"),
               "args": [marker.clone()]}),
    );
    let held = format!("{marker}-held");
    let start = Instant::now();
    while host_pids_with(&held).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(25) && !holder.is_finished(),
            "the first job never held its budgets:\n{}",
            forked.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // While the first child holds everything it could take, the second takes its own.
    let other = post_run(
        &forked,
        None,
        &python(&format!("{BUDGET_PRELUDE}{TAKE_ONE}")),
    )
    .await;
    for pid in host_pids_with(&held) {
        kill_pid(pid);
    }
    let first = holder.await.unwrap();
    let took = first["stdout"].as_str().unwrap_or_default().to_owned();
    // The first did exhaust each budget (else this proves nothing).
    assert!(took.contains("'inotify': "), "{first:#}");
    assert!(!took.contains("'inotify': 4096"), "{took}");
    assert!(!took.contains("'mq': 100000"), "{took}");
    assert!(!took.contains("'sig': 200000"), "{took}");
    assert_eq!(
        serde_json::from_str::<Value>(other.body["stdout"].as_str().unwrap_or("")).ok(),
        Some(json!({"inotify": "ok", "mq": "ok", "sigqueue": "ok"})),
        "a forked job lost a per-user budget to its sibling, which took {took}: {:#}",
        other.body
    );
    assert_eq!(forked_hits(&forked).await, 2, "{}", forked.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_zygote_is_replaced_and_the_jobs_of_its_children_finish() {
    require_server!();
    let forked = server_with(policy("", ""));
    wait_ready(&forked, POOL).await;
    // A job running in a child of the zygote while the zygote dies.
    let running = spawn_run(
        &forked,
        python("import time\nprint('started', flush=True)\ntime.sleep(1.5)\nprint('done')\n"),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let zygotes = zygote_pids(forked.pid());
    assert_eq!(zygotes.len(), 1, "{zygotes:?}\n{}", forked.log());
    assert!(kill_pid(zygotes[0]));
    let body = running.await.unwrap();
    assert_eq!(body["stdout"], "started\ndone\n", "{body:#}");
    assert_eq!(body["outcome"], "exited");
    // The next refills notice, report it, and start another; jobs run meanwhile.
    for _ in 0..4 {
        let answer = post_run(&forked, None, &python("print('fine')")).await;
        assert_eq!(answer.body["stdout"], "fine\n", "{:#}", answer.body);
    }
    wait_for(
        "a lost zygote reported and another started",
        &forked,
        30,
        async || {
            zygote_events(&forked, "lost").await >= 1
                && zygote_events(&forked, "started").await >= 2
        },
    )
    .await;
    // The pool hands out its oldest sandbox first: those started from scratch while the
    // zygote was missing go before the first forked from the new one.
    let before = forked_hits(&forked).await;
    for _ in 0..=POOL {
        wait_ready(&forked, POOL).await;
        let answer = post_run(&forked, None, &python("print('forked again')")).await;
        assert_eq!(answer.body["stdout"], "forked again\n");
    }
    assert!(forked_hits(&forked).await > before, "{}", forked.log());
    let now = zygote_pids(forked.pid());
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now[0], zygotes[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_zygote_is_replaced_and_shutdown_leaves_nothing_behind() {
    require_server!();
    let mut forked = server_with(policy("warm_idle = \"2s\"", ""));
    wait_ready(&forked, POOL).await;
    let first = zygote_pids(forked.pid());
    assert_eq!(first.len(), 1, "{first:?}");
    wait_for("the idle zygote replaced", &forked, 30, async || {
        zygote_events(&forked, "started").await >= 2
    })
    .await;
    wait_for("the old zygote gone", &forked, 30, async || {
        !std::path::Path::new(&format!("/proc/{}", first[0])).exists()
    })
    .await;
    assert_eq!(zygote_events(&forked, "lost").await, 0, "{}", forked.log());
    // The new zygote's children serve jobs (with sandboxes this short-lived, a job may
    // also find none ready, or one just started from scratch).
    for _ in 0..10 {
        wait_ready(&forked, POOL).await;
        let answer = post_run(&forked, None, &python("print('fresh')")).await;
        assert_eq!(answer.body["stdout"], "fresh\n", "{:#}", answer.body);
        if forked_hits(&forked).await > 0 {
            break;
        }
    }
    assert!(forked_hits(&forked).await > 0, "{}", forked.log());

    wait_ready(&forked, POOL).await;
    let zygotes = zygote_pids(forked.pid());
    let names = sandbox_names(forked.pid());
    assert!(
        !zygotes.is_empty() && names.iter().any(|n| n.starts_with("warm-")),
        "{names:?}"
    );
    forked.terminate();
    assert!(
        forked.wait(Duration::from_secs(20)).success(),
        "{}",
        forked.log()
    );
    for pid in zygotes {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "zygote {pid} outlived the server"
        );
    }
    for name in names {
        let dir = std::path::Path::new("/run/airlock").join(&name);
        assert!(
            !dir.exists(),
            "{} left behind:\n{}",
            dir.display(),
            forked.log()
        );
        assert!(
            !airlock_testkit::cgroup_dir_names().contains(&name),
            "the cgroup {name} left behind"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_leaves_no_zygote_running() {
    require_server!();
    let mut forked = server_with(policy("", ""));
    wait_ready(&forked, POOL).await;
    let zygotes = zygote_pids(forked.pid());
    assert_eq!(zygotes.len(), 1, "{zygotes:?}");
    assert!(kill_pid(forked.pid()));
    forked.wait(Duration::from_secs(10));
    // Every sandbox helper dies with the server, each init with its helper, and every
    // process of a pid namespace with its init: the zygote and its waiting children too.
    let start = Instant::now();
    while std::path::Path::new(&format!("/proc/{}", zygotes[0])).exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the zygote outlived the killed server"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_zygote_is_on_by_default() {
    require_server!();
    let forked = server_with(format!(
        "version = \"zygote-default\"\n[native]\nwarm_pool = {POOL}\n"
    ));
    wait_ready(&forked, POOL).await;
    let answer = post_run(&forked, None, &python("print(1)")).await;
    assert_eq!(answer.body["stdout"], "1\n");
    assert_eq!(forked_hits(&forked).await, 1, "{}", forked.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zygote_false_starts_every_warm_sandbox_from_scratch() {
    require_server!();
    let warm = server_with(policy("", "").replace("zygote = true", "zygote = false"));
    wait_ready(&warm, POOL).await;
    assert_eq!(zygote_pids(warm.pid()), Vec::<u32>::new());
    let answer = post_run(&warm, None, &python("print(1)")).await;
    assert_eq!(answer.body["stdout"], "1\n");
    assert_eq!(hits(&warm).await, 1);
    for result in ["hit", "forked", "started"] {
        assert_eq!(zygote_events(&warm, result).await, 0, "{result}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zygote_that_imported_a_thread_is_refused_and_sandboxes_start_from_scratch() {
    require_server!();
    // A package directory whose one module starts a thread when imported (outside /tmp:
    // the minimal root refuses directories a job's own mounts would hide).
    let packages = tempfile::Builder::new()
        .prefix("airlock-zygote-test-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::write(
        packages.path().join("starts_a_thread.py"),
        "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n",
    )
    .unwrap();
    let warm = server_with(policy(
        "warm_preload = [\"starts_a_thread\"]",
        &format!(
            "[filesystem]\nsite_packages = [\"{}\"]\n",
            packages.path().display()
        ),
    ));
    wait_for("a zygote refused", &warm, 60, async || {
        zygote_events(&warm, "failed").await >= 1
    })
    .await;
    assert!(
        warm.log().contains("threads after its imports"),
        "{}",
        warm.log()
    );
    // The pool fills from scratch meanwhile, and its jobs run as they would.
    wait_ready(&warm, POOL).await;
    let answer = post_run(&warm, None, &python("import starts_a_thread\nprint('ran')")).await;
    assert_eq!(answer.body["stdout"], "ran\n", "{:#}", answer.body);
    assert_eq!(hits(&warm).await, 1, "{}", warm.log());
    assert_eq!(forked_hits(&warm).await, 0);
    assert_eq!(zygote_events(&warm, "forked").await, 0);
    // A refused zygote is ended, not left waiting. The pool tries again after a backoff
    // (and is refused again), so a retry's zygote may be starting at any one moment: what
    // must come is a moment with none.
    wait_for("no zygote process between retries", &warm, 30, async || {
        zygote_pids(warm.pid()).is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_finding_no_sandbox_ready_run_in_one_forked_for_them() {
    require_server!();
    // One sandbox kept ready and four jobs at once: the first takes it, the others find
    // none and each gets one forked for it at once, never a fresh sandbox (whose pid 1 is
    // `init` alone; a forked sandbox's is the init reaping its job).
    let forked = Server::start(Opts {
        args: ["--policy", "zygote.toml", "--max-in-flight", "4"]
            .map(String::from)
            .to_vec(),
        files: vec![(
            "zygote.toml".into(),
            policy("", "").replace(&format!("warm_pool = {POOL}"), "warm_pool = 1"),
        )],
        ..Default::default()
    });
    wait_ready(&forked, 1).await;
    let code = "import time\ntime.sleep(0.3)\n\
                print(open('/proc/1/cmdline', 'rb').read().split(b'\\0')[:-1])\n";
    let jobs: Vec<_> = (0..4).map(|_| spawn_run(&forked, python(code))).collect();
    for job in jobs {
        let body = job.await.unwrap();
        assert_eq!(
            body["stdout"],
            "[b'init', b'reap', b'2', b'report', b'5']\n",
            "{body:#}\n{}",
            forked.log()
        );
    }
    let for_jobs = metric(
        &forked,
        "airlock_warm_pool_sandboxes_total{result=\"started_for_job\"}",
    )
    .await;
    assert!(for_jobs >= 1, "{}", forked.log());
    assert_eq!(forked_hits(&forked).await + for_jobs, 4, "{}", forked.log());
    assert_eq!(zygote_events(&forked, "fork_failed").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forked_jobs_reply_comes_only_once_no_process_of_it_is_left() {
    require_server!();
    // A forked job's reply waits for pid 1 of its pid namespace, not for the sandbox's
    // leader (whose exit tears the namespaces down, after the reply; docs/speed.md): the
    // kernel reports pid 1 gone only once it has killed and reaped every other process of
    // the namespace. A daemon the job leaves behind (its own session, SIGHUP ignored),
    // running when the job ends, is gone by the time the reply is read.
    let forked = server_with(policy("", ""));
    wait_ready(&forked, POOL).await;
    for round in 0..3 {
        wait_ready(&forked, POOL).await;
        let tag = format!("airlock-zygote-daemon-{}-{round}", std::process::id());
        let code = format!(
            "import os, sys\n\
             r, w = os.pipe()\n\
             if os.fork() == 0:\n\
             \x20   os.setsid()\n\
             \x20   if os.fork() == 0:\n\
             \x20       os.close(r)\n\
             \x20       os.set_inheritable(w, True)\n\
             \x20       daemon = ('import os, signal, sys, time\\n'\n\
             \x20                 'signal.signal(signal.SIGHUP, signal.SIG_IGN)\\n'\n\
             \x20                 'os.write(int(sys.argv[1]), b\"up\")\\n'\n\
             \x20                 'time.sleep(1000)\\n')\n\
             \x20       os.execv(sys.executable, [sys.executable, '-c', daemon, str(w), '{tag}'])\n\
             \x20   os._exit(0)\n\
             os.close(w)\n\
             os.wait()\n\
             print(os.read(r, 2).decode())\n"
        );
        let answer = post_run(&forked, None, &python(&code)).await;
        assert_eq!(answer.status, 200, "{:#}", answer.body);
        assert_eq!(
            answer.body["stdout"], "up\n",
            "the daemon never ran: {:#}",
            answer.body
        );
        assert_eq!(
            host_pids_with(&tag),
            Vec::<u32>::new(),
            "a process of the job outlived its reply"
        );
    }
    assert_eq!(forked_hits(&forked).await, 3, "{}", forked.log());
}
