//! The minimal host root (issue 21 item 1): what a default job's `/` holds and lacks,
//! `host-full` for the whole view, and the root's inodes being the job's own (inotify and
//! flock see nothing of the host or of other jobs).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use pretty_assertions::assert_eq;
use serde_json::Value;

use super::common::{JsonRun, TestEnv, json_run};
use crate::require_native;

/// The tools issue 21 found in a default job's root on a typical build host.
const FORBIDDEN_TOOLS: &[&str] = &[
    "gcc", "g++", "ssh", "scp", "curl", "wget", "git", "gcloud", "kubectl", "docker", "podman",
    "runc", "crun", "nsenter", "su", "apt-get", "strace", "gdb",
];

/// Walks the job's whole root (but /proc, /sys, /dev) for files with the forbidden names,
/// and looks each name up in PATH.
pub(super) fn tool_search_source() -> String {
    format!(
        "import os, shutil, json\n\
         names = {FORBIDDEN_TOOLS:?}\n\
         found = [n for n in names if shutil.which(n)]\n\
         for top in os.listdir('/'):\n\
         \x20   if top in ('proc', 'sys', 'dev'):\n\
         \x20       continue\n\
         \x20   for d, dirs, files in os.walk('/' + top):\n\
         \x20       found += [os.path.join(d, f) for f in files if f in names]\n\
         print(json.dumps({{'found': found, 'usr_bin': len(os.listdir('/usr/bin'))}}))"
    )
}

pub(super) fn stdout_json(run: &JsonRun) -> Value {
    assert_eq!(run.obs["ok"], true, "{:#}\n{}", run.obs, run.stderr);
    serde_json::from_str(run.obs["stdout"].as_str().unwrap_or_default().trim())
        .unwrap_or_else(|e| panic!("job output is not JSON ({e}): {:#}", run.obs))
}

#[test]
fn a_default_job_finds_none_of_the_host_tools() {
    require_native!();
    let env = TestEnv::new();
    let report = stdout_json(&env.run_json(&["-c", &tool_search_source()]));
    assert_eq!(report["found"], serde_json::json!([]), "{report:#}");
    // A few dozen utilities, not the host's thousand programs.
    let count = report["usr_bin"].as_u64().unwrap();
    assert!(count < 150, "/usr/bin has {count} entries");
}

#[test]
fn host_full_restores_the_whole_host_view() {
    require_native!();
    let env = TestEnv::new();
    // Walking the whole host /usr takes a while on a busy machine.
    let policy = env.policy(&format!("{LONG_JOBS}[filesystem]\nrootfs = \"host-full\""));
    let report = stdout_json(&env.run_json(&[
        "--policy",
        policy.to_str().unwrap(),
        "--timeout",
        "30s",
        "-c",
        &tool_search_source(),
    ]));
    let host_count = std::fs::read_dir("/usr/bin").unwrap().count() as u64;
    assert_eq!(report["usr_bin"].as_u64(), Some(host_count), "{report:#}");
    // Whatever of the list the host has, the job sees.
    for tool in FORBIDDEN_TOOLS {
        for dir in ["/usr/local/bin", "/usr/bin"] {
            let path = format!("{dir}/{tool}");
            if std::path::Path::new(&path).exists() {
                let found = report["found"].as_array().unwrap();
                assert!(
                    found.iter().any(|f| f == &path),
                    "{path} missing: {report:#}"
                );
            }
        }
    }
    // And doctor warns about it.
    let out = env
        .cmd()
        .args(["doctor", "--policy", policy.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("host-full"), "{text}");
    assert!(text.contains("WARN"), "{text}");
}

#[test]
fn each_language_runs_with_its_standard_library() {
    require_native!();
    let env = TestEnv::new();
    let python = "import ssl, json, sqlite3, ctypes, decimal, hashlib, zlib, lzma, bz2, asyncio, \
                  threading, subprocess, urllib.request, email, csv, datetime, locale\n\
                  t = threading.Thread(target=lambda: None); t.start(); t.join()\n\
                  ctypes.CDLL('libc.so.6')\n\
                  print(ssl.create_default_context().cert_store_stats()['x509_ca'] > 0, \
                  sqlite3.connect(':memory:').execute('select 6*7').fetchone()[0], \
                  subprocess.run(['ls', '/work'], capture_output=True).returncode)";
    let run = env.run_json(&["-c", python]);
    assert_eq!(run.obs["stdout"], "True 42 0\n", "{:#}", run.obs);
    let node = "const c = require('crypto'), z = require('zlib'), fs = require('fs');\n\
                console.log(c.createHash('sha256').update('x').digest('hex').slice(0, 8), \
                z.gunzipSync(z.gzipSync('ok')).toString(), fs.existsSync('/work'))";
    let run = env.run_json(&["-l", "node", "-c", node]);
    assert_eq!(run.obs["stdout"], "2d711642 ok true\n", "{:#}", run.obs);
    for lang in ["bash", "sh"] {
        let run = env.run_json(&[
            "-l",
            lang,
            "-c",
            "printf '%s\\n' b a | sort | head -1; echo x | sed s/x/y/; seq 3 | wc -l",
        ]);
        assert_eq!(run.obs["stdout"], "a\ny\n3\n", "{lang}: {:#}", run.obs);
    }
}

#[test]
fn a_language_the_host_lacks_is_refused_with_the_reason() {
    require_native!();
    let env = TestEnv::new();
    let policy = env.policy(
        "[languages.ruby]\ncommand = [\"airlock-no-such-ruby\", \"{file}\"]\nfile = \"m.rb\"\n\
         [languages.python]\ncommand = [\"python3\", \"{file}\"]\nfile = \"m.py\"",
    );
    let run = env.run_json(&[
        "--policy",
        policy.to_str().unwrap(),
        "-l",
        "ruby",
        "-c",
        "puts 1",
    ]);
    super::common::assert_error(&run, "invalid_input");
    let message = run.obs["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("airlock-no-such-ruby is not installed on this host"),
        "{message}"
    );
    // The other language of the policy still runs.
    let run = env.run_json(&["--policy", policy.to_str().unwrap(), "-c", "print(7)"]);
    assert_eq!(run.obs["stdout"], "7\n", "{:#}", run.obs);
}

/// The host directory under the job's `/usr` (its overlay's lower layer), from a job's own
/// mount table.
fn usr_lower(env: &TestEnv, policy: Option<&std::path::Path>) -> PathBuf {
    let mut args = Vec::new();
    if let Some(p) = policy {
        args.extend(["--policy".to_owned(), p.to_str().unwrap().to_owned()]);
    }
    args.extend([
        "-l".to_owned(),
        "sh".to_owned(),
        "-c".to_owned(),
        "grep ' /usr ' /proc/self/mountinfo".to_owned(),
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = env.run_json(&refs);
    let line = run.obs["stdout"].as_str().unwrap_or_default().to_owned();
    assert!(
        line.contains(" - overlay "),
        "/usr is not an overlay: {:#}",
        run.obs
    );
    let lower = line
        .split("lowerdir=")
        .nth(1)
        .and_then(|s| s.split(':').next())
        .unwrap_or_else(|| panic!("no lowerdir in {line}"));
    // `host-full` shows the host's own /usr, the path the job sees too. A copy's layer is
    // named relative to its directory of copies (no host path in the job's mount table):
    // it is one of the cache's.
    if lower == "/usr" {
        return PathBuf::from(lower);
    }
    assert!(
        !lower.starts_with('/'),
        "a host path in the job's mount table: {line}"
    );
    let roots = std::env::var_os("AIRLOCK_CACHE_DIR")
        .map_or_else(|| PathBuf::from("/var/cache/airlock"), PathBuf::from)
        .join("roots");
    std::fs::read_dir(&roots)
        .unwrap()
        .flatten()
        .map(|dir| dir.path().join(lower))
        .find(|path| path.is_dir())
        .unwrap_or_else(|| {
            panic!(
                "{lower} is in no directory of copies under {}",
                roots.display()
            )
        })
}

fn epoch_secs() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn spawn_json(env: &TestEnv, args: &[&str]) -> Child {
    let mut cmd = env.cmd();
    cmd.arg("run")
        .arg("--json")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().expect("spawn airlock")
}

/// Busy host and another job for `length`: exec the host's interpreter, read the prepared
/// copy under the job's view, start another job that imports and executes.
fn host_activity(
    env: &TestEnv,
    policy: Option<&std::path::Path>,
    lower: &std::path::Path,
    length: Duration,
) -> (f64, f64) {
    let started = epoch_secs();
    let deadline = Instant::now() + length;
    let mut args = Vec::new();
    if let Some(p) = policy {
        args.extend(["--policy", p.to_str().unwrap()]);
    }
    let other = spawn_json(
        env,
        &[
            args.as_slice(),
            &[
                "--timeout",
                "20s",
                "-c",
                "import json, email, http.client, subprocess\n\
             for _ in range(5): subprocess.run(['ls', '/usr/bin'], capture_output=True)\n\
             print('other')",
            ],
        ]
        .concat(),
    );
    while Instant::now() < deadline {
        let status = Command::new("/usr/bin/python3")
            .args(["-c", "import json, email, http.client"])
            .status()
            .unwrap();
        assert!(status.success());
        for entry in std::fs::read_dir(lower.join("bin")).unwrap().flatten() {
            let _ = std::fs::read(entry.path()).map(|b| b.len());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let other = json_run(other.wait_with_output().unwrap());
    assert_eq!(other.obs["stdout"], "other\n", "{:#}", other.obs);
    (started, epoch_secs())
}

/// A job watching its own `/usr/bin` and standard library with inotify for `window`
/// seconds, then touching a file itself (the watch must see that).
fn inotify_source(window: f64) -> String {
    format!(
        "import ctypes, os, select, sys, time, json\n\
         libc = ctypes.CDLL('libc.so.6', use_errno=True)\n\
         fd = libc.inotify_init1(os.O_NONBLOCK)\n\
         assert fd >= 0, ctypes.get_errno()\n\
         dirs = ['/usr/bin', os.path.dirname(os.__file__), os.path.dirname(os.path.realpath(sys.executable))]\n\
         for d in dirs:\n\
         \x20   assert libc.inotify_add_watch(fd, d.encode(), 0xfff) >= 0, (d, ctypes.get_errno())\n\
         def drain(seconds):\n\
         \x20   n, end = 0, time.time() + seconds\n\
         \x20   while time.time() < end:\n\
         \x20       if select.select([fd], [], [], 0.1)[0]:\n\
         \x20           n += len(os.read(fd, 65536))\n\
         \x20   return n\n\
         start = time.time()\n\
         during = drain({window})\n\
         end = time.time()\n\
         open(os.path.realpath(sys.executable), 'rb').read(16)\n\
         control = drain(0.5)\n\
         print(json.dumps({{'start': start, 'end': end, 'during': during, 'control': control}}))"
    )
}

/// A policy whose jobs may run long enough for the timing of these tests, plus `extra`.
const LONG_JOBS: &str = "[limits]\ntimeout = \"30s\"\n";

/// Runs the inotify check under a policy with `extra` (TOML tables). On a busy machine the
/// host's activity (another whole job among it) can outlast the job's watch; that proves
/// nothing either way, so the check is made again with a longer watch.
pub(super) fn check_inotify(extra: &str) {
    let env = TestEnv::new();
    let policy = Some(env.policy(&format!("{LONG_JOBS}{extra}")));
    let lower = usr_lower(&env, policy.as_deref());
    let windows = [6.0, 15.0];
    for (attempt, window) in windows.into_iter().enumerate() {
        let mut args = Vec::new();
        if let Some(p) = &policy {
            args.extend(["--policy", p.to_str().unwrap()]);
        }
        let source = inotify_source(window);
        args.extend(["--timeout", "30s", "-c", &source]);
        let job = spawn_json(&env, &args);
        std::thread::sleep(Duration::from_millis(1500));
        let (busy_from, busy_to) =
            host_activity(&env, policy.as_deref(), &lower, Duration::from_secs(2));
        let run = json_run(job.wait_with_output().unwrap());
        let report = stdout_json(&run);
        let (start, end) = (
            report["start"].as_f64().unwrap(),
            report["end"].as_f64().unwrap(),
        );
        // Whatever the timing, the job must not have seen the part that overlapped.
        assert_eq!(
            report["during"], 0,
            "the job saw host or other-job activity: {report:#}"
        );
        assert!(
            report["control"].as_u64().unwrap() > 0,
            "the watch saw not even the job's own read: {report:#}"
        );
        if start <= busy_from && busy_to <= end {
            return;
        }
        assert!(
            attempt + 1 < windows.len(),
            "the host was busy {busy_from:.2}..{busy_to:.2}, outside the job's watch \
             {start:.2}..{end:.2}, even with a {window}s watch: the machine is too slow for \
             this test's timing"
        );
        eprintln!(
            "the host was busy {busy_from:.2}..{busy_to:.2}, outside the job's {window}s watch \
             {start:.2}..{end:.2}; again with a longer watch"
        );
    }
}

#[test]
fn inotify_in_a_job_sees_nothing_of_the_host_or_other_jobs() {
    require_native!();
    check_inotify("");
}

#[test]
fn inotify_in_a_host_full_job_sees_nothing_of_the_host_or_other_jobs() {
    require_native!();
    check_inotify("[filesystem]\nrootfs = \"host-full\"");
}

#[test]
fn a_jobs_flock_on_the_interpreter_blocks_neither_the_host_nor_another_job() {
    require_native!();
    let env = TestEnv::new();
    let policy = env.policy(LONG_JOBS);
    let policy = policy.to_str().unwrap();
    let lower = usr_lower(&env, None);
    // The job holds an exclusive lock on its interpreter; a second open of it in the same
    // job must then fail to lock (the lock is real).
    let holder = spawn_json(
        &env,
        &[
            "--policy",
            policy,
            "--timeout",
            "30s",
            "-c",
            "import fcntl, os, sys, time\n\
             exe = os.path.realpath(sys.executable)\n\
             a = open(exe, 'rb'); fcntl.flock(a, fcntl.LOCK_EX)\n\
             b = open(exe, 'rb')\n\
             try:\n\
             \x20   fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB); print('not held')\n\
             except BlockingIOError:\n\
             \x20   print('held')\n\
             time.sleep(5)",
        ],
    );
    std::thread::sleep(Duration::from_millis(2000));
    let started = Instant::now();
    // Another job locks its own interpreter at once.
    let other = env.run_json(&[
        "-c",
        "import fcntl, os, sys\n\
         f = open(os.path.realpath(sys.executable), 'rb')\n\
         fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n\
         print('locked')",
    ]);
    assert_eq!(other.obs["stdout"], "locked\n", "{:#}", other.obs);
    // So does the host, on its own interpreter and on the prepared copy.
    let host_python = std::fs::canonicalize("/usr/bin/python3").unwrap();
    let copy_python = std::fs::read_dir(lower.join("bin"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("python3."))
        })
        .expect("python3.N in the prepared copy");
    for path in [host_python, copy_python] {
        let file = std::fs::File::open(&path).unwrap();
        rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .unwrap_or_else(|e| panic!("{} is locked by the job: {e}", path.display()));
    }
    let locked_within = started.elapsed();
    let held = json_run(holder.wait_with_output().unwrap());
    assert_eq!(held.obs["stdout"], "held\n", "{:#}", held.obs);
    assert!(
        locked_within < Duration::from_secs(3),
        "the checks ran after the holder's lock ended ({locked_within:?})"
    );
}
