//! Shared helpers: an isolated state directory per test, policy files, running the CLI.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The airlock binary under test: `$AIRLOCK_BIN` when set (the rootless pass of
/// `scripts/test.sh` runs a copy the unprivileged user can reach), else cargo's build.
pub fn airlock_bin() -> String {
    std::env::var("AIRLOCK_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_airlock").to_owned())
}

/// A test's own state directory (audit log, policy files).
pub struct TestEnv {
    pub dir: tempfile::TempDir,
}

/// The result of `airlock run --json`.
#[derive(Debug)]
pub struct JsonRun {
    pub obs: Value,
    pub code: i32,
    pub stderr: String,
}

impl TestEnv {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A policy file with `version = "test-1"` followed by `body`.
    pub fn policy(&self, body: &str) -> PathBuf {
        let path = self.dir.path().join(format!("policy-{}.toml", uuid_like()));
        std::fs::write(&path, format!("version = \"test-1\"\n{body}\n")).expect("write policy");
        path
    }

    /// `airlock` with this test's state directory and nothing else of ours in its env.
    pub fn cmd(&self) -> Command {
        let mut cmd = Command::new(airlock_bin());
        cmd.env("AIRLOCK_STATE_DIR", self.dir.path());
        cmd.env_remove("AIRLOCK_LOG");
        cmd
    }

    /// `airlock run --json ARGS...`.
    pub fn run_json(&self, args: &[&str]) -> JsonRun {
        let mut cmd = self.cmd();
        cmd.arg("run").arg("--json").args(args);
        json_run(cmd.output().expect("spawn airlock"))
    }

    /// Every audit line written so far (built-in policy, or policies in this directory).
    pub fn audit_lines(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.dir.path().join("audit.jsonl")).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
            .collect()
    }
}

pub fn json_run(output: Output) -> JsonRun {
    let stdout = String::from_utf8(output.stdout).expect("stdout is UTF-8");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let obs: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("stdout is not one JSON object ({e}): {stdout:?}\nstderr: {stderr}")
    });
    JsonRun {
        obs,
        code: output.status.code().unwrap_or(-1),
        stderr,
    }
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A marker no other test uses, for finding a job's processes on the host.
pub fn marker(name: &str) -> String {
    format!("airlock-test-{name}-{}", uuid_like())
}

/// Host pids whose command line contains `needle`.
pub fn host_pids_with(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(needle)
        {
            found.push(pid);
        }
    }
    found
}

/// Returns early unless the native backend can run here (root, for now).
#[macro_export]
macro_rules! require_native {
    () => {
        airlock_testkit::require!(
            airlock_testkit::require::is_root(),
            "the native backend needs root on this host (rootless use is issue 3)"
        );
    };
}

/// Asserts an error observation of `kind`, exit code 125.
pub fn assert_error(run: &JsonRun, kind: &str) {
    assert_eq!(run.obs["outcome"], "error", "{:#}", run.obs);
    assert_eq!(run.obs["ok"], false);
    assert_eq!(run.obs["error"]["kind"], kind, "{:#}", run.obs);
    assert!(
        run.obs["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "an error needs a message"
    );
    assert_eq!(run.code, 125, "exit code; stderr: {}", run.stderr);
}
