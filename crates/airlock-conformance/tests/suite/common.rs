//! The backends under test, their policies, and running the CLI against them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// A backend of the suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Native,
    Docker,
    Gvisor,
    Podman,
    /// The Kubernetes backend, through the fake cluster of airlock-kube's tests (an API
    /// server and a kubelet running each Pod as a container on the local Docker daemon),
    /// started by `scripts/ci/kube.sh` as its example `fake_cluster`.
    Kube,
    /// The native backend's warm path (`airlock run --warm`): each job delivered to a
    /// sandbox started and waiting before it, as `airlock serve`'s warm pool does. Jobs a
    /// warm sandbox cannot take (another language than Python, the egress proxy) run in
    /// a fresh sandbox there, and here too.
    Warm,
    /// The docker backend's warm path (`airlock run --warm --backend docker`): each job
    /// delivered to a container created and started before it, as `airlock serve`'s
    /// `[docker] warm_pool` does; jobs a warm container cannot take run in a fresh one.
    WarmDocker,
    /// The same on gVisor.
    WarmGvisor,
    /// The same on Podman.
    WarmPodman,
    /// The warm path with `[native] zygote = true` (`airlock run --warm` under such a
    /// policy): each job delivered to a sandbox forked from a zygote. Jobs a warm sandbox
    /// cannot take run in a fresh sandbox, as for `Warm`.
    Zygote,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Native => "native",
            Kind::Docker => "docker",
            Kind::Gvisor => "gvisor",
            Kind::Podman => "podman",
            Kind::Kube => "kube",
            Kind::Warm => "warm",
            Kind::WarmDocker => "warm_docker",
            Kind::WarmGvisor => "warm_gvisor",
            Kind::WarmPodman => "warm_podman",
            Kind::Zygote => "zygote",
        }
    }

    /// The `--backend` this kind runs on.
    pub fn backend(self) -> &'static str {
        self.base().name()
    }

    /// The kind whose fresh sandboxes this kind's warm ones are (itself for a cold kind):
    /// what a check expects of a backend, it expects of its warm kind.
    pub fn base(self) -> Kind {
        match self {
            Kind::Warm | Kind::Zygote => Kind::Native,
            Kind::WarmDocker => Kind::Docker,
            Kind::WarmGvisor => Kind::Gvisor,
            Kind::WarmPodman => Kind::Podman,
            cold => cold,
        }
    }

    /// Whether jobs the warm path takes go through it (`airlock run --warm`).
    pub fn is_warm(self) -> bool {
        self.base() != self
    }

    /// Whether jobs run in the native backend's sandboxes (warm, forked or fresh).
    pub fn is_native(self) -> bool {
        self.base() == Kind::Native
    }

    /// Whether the job runs from an image, in a container on the Docker or Podman daemon of
    /// this host (kube: the fake kubelet's).
    pub fn is_container(self) -> bool {
        !self.is_native()
    }
}

/// `$AIRLOCK_TEST_KUBECONFIG`: the kubeconfig of the running fake cluster (the `kube`
/// backend's checks run only when it is set; `scripts/ci/kube.sh` sets it).
pub const KUBECONFIG_ENV: &str = "AIRLOCK_TEST_KUBECONFIG";
/// The namespace of the kube policy (the fake API server has one store for all).
pub const KUBE_NAMESPACE: &str = "airlock-jobs";
/// The seccomp profile the kube policy names: airlock's own filter, which
/// `scripts/ci/kube.sh` installs in the fake node's seccomp directory from
/// `airlock kube seccomp-profile`, as an admin installs it on every node.
pub const KUBE_SECCOMP_PROFILE: &str = "Localhost:airlock.json";
/// The label of the fake kubelet's containers (airlock-kube's `fake::kubelet::LABEL_FAKE`).
pub const KUBE_FAKE_LABEL: &str = "airlock.kube-fake";

pub fn kubeconfig() -> Option<PathBuf> {
    std::env::var_os(KUBECONFIG_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Whether `bin` was built with the kube backend (it then has the `kube` subcommand).
fn has_kube_backend(bin: &Path) -> bool {
    static KNOWN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KNOWN.get_or_init(|| {
        Command::new(bin)
            .args(["kube", "--help"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// The fake cluster's API server, `http://127.0.0.1:PORT`, from its kubeconfig.
pub fn kube_server() -> String {
    let path = kubeconfig().expect("AIRLOCK_TEST_KUBECONFIG");
    let text = std::fs::read_to_string(&path).expect("read the kubeconfig");
    text.lines()
        .find_map(|l| l.trim().strip_prefix("server:"))
        .map(|s| s.trim().to_owned())
        .expect("a server in the kubeconfig")
}

/// A request to the fake API server, with curl (the suite has no HTTP client of its own);
/// the answer's JSON.
pub fn kube_api(method: &str, path: &str) -> Value {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-X", method])
        .arg(format!("{}{path}", kube_server()))
        .output()
        .expect("curl");
    assert!(
        out.status.success(),
        "{method} {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the API server answers JSON")
}

/// Every Pod in the kube policy's namespace.
pub fn kube_pods() -> Vec<Value> {
    let list = kube_api("GET", &format!("/api/v1/namespaces/{KUBE_NAMESPACE}/pods"));
    list["items"].as_array().cloned().unwrap_or_default()
}

/// The Pods of one job (label `airlock.job`).
pub fn kube_pods_of(job: &str) -> Vec<Value> {
    kube_pods()
        .into_iter()
        .filter(|p| p["metadata"]["labels"]["airlock.job"] == job)
        .collect()
}

/// `$AIRLOCK_TEST_IMAGE`: the image container backends run, `REF@sha256:…` (the CI script
/// builds and loads it).
pub const IMAGE_ENV: &str = "AIRLOCK_TEST_IMAGE";

/// `$AIRLOCK_TEST_NATIVE_IMAGE` and `$AIRLOCK_TEST_OCI_STORE`: when both are set, the native
/// backend runs that image (`REF@sha256:…`) from that airlock image store instead of the
/// host's root (scripts/ci/images.sh builds one).
pub const NATIVE_IMAGE_ENV: &str = "AIRLOCK_TEST_NATIVE_IMAGE";
/// The image store of [`NATIVE_IMAGE_ENV`].
pub const OCI_STORE_ENV: &str = "AIRLOCK_TEST_OCI_STORE";

/// The image and store the native backend runs, when the environment names both.
pub fn native_image() -> Option<(String, String)> {
    let image = std::env::var(NATIVE_IMAGE_ENV)
        .ok()
        .filter(|v| !v.is_empty())?;
    let store = std::env::var(OCI_STORE_ENV)
        .ok()
        .filter(|v| !v.is_empty())?;
    Some((image, store))
}

pub fn docker_socket() -> PathBuf {
    std::env::var_os("AIRLOCK_DOCKER_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/run/docker.sock"))
}

pub fn podman_socket() -> PathBuf {
    std::env::var_os("AIRLOCK_PODMAN_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/podman/podman.sock"))
}

/// The airlock binary: `$AIRLOCK_BIN`, else `airlock` next to this test's profile
/// directory (build it first: `cargo build -p airlock-cli`).
pub fn airlock_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("AIRLOCK_BIN") {
        return PathBuf::from(bin);
    }
    let probe = airlock_testkit::probe_path();
    probe.with_file_name("airlock")
}

/// Why `kind` cannot run here, if it cannot.
pub fn unavailable(kind: Kind) -> Option<String> {
    if !airlock_bin().is_file() {
        return Some(format!(
            "no airlock binary at {} (cargo build -p airlock-cli, or set AIRLOCK_BIN)",
            airlock_bin().display()
        ));
    }
    if !airlock_testkit::require::is_root() {
        return Some(format!("the {} backend needs root here", kind.name()));
    }
    if kind.base() == Kind::Kube {
        let Some(kubeconfig) = kubeconfig() else {
            return Some(format!(
                "{KUBECONFIG_ENV} is not set (scripts/ci/kube.sh starts the fake cluster and sets it)"
            ));
        };
        if !kubeconfig.is_file() {
            return Some(format!("no kubeconfig at {}", kubeconfig.display()));
        }
        if !has_kube_backend(&airlock_bin()) {
            return Some(format!(
                "{} was built without the kube backend (cargo build -p airlock-cli --features kube; set AIRLOCK_BIN)",
                airlock_bin().display()
            ));
        }
    }
    if kind.is_container() {
        if std::env::var(IMAGE_ENV).map_or(true, |v| v.is_empty()) {
            return Some(format!(
                "{IMAGE_ENV} is not set (REF@sha256:… of a Debian 12 image with python3; scripts/ci/docker.sh builds one)"
            ));
        }
        let socket = if kind.base() == Kind::Podman {
            podman_socket()
        } else {
            docker_socket()
        };
        if !socket.exists() {
            return Some(format!(
                "no daemon socket at {} for the {} backend",
                socket.display(),
                kind.name()
            ));
        }
    }
    None
}

/// One test's backend, state directory and policies.
pub struct Target {
    pub kind: Kind,
    pub dir: tempfile::TempDir,
}

/// The result of `airlock run --json`.
#[derive(Debug)]
pub struct JsonRun {
    pub obs: Value,
    pub code: i32,
    pub stderr: String,
}

impl Target {
    pub fn new(kind: Kind) -> Self {
        Self {
            kind,
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `--backend B`, and `--warm` where this kind puts a job with these arguments
    /// through the warm path.
    pub fn backend_args(&self, args: &[&str]) -> Vec<&'static str> {
        let mut out = vec!["--backend", self.kind.backend()];
        if self.kind.is_warm() && warm_fits(self.kind, args) {
            out.push("--warm");
        }
        out
    }

    /// A policy file: `limits` lines under `[limits]`, `filesystem` lines under
    /// `[filesystem]` (after the backend's rootfs), `extra` as given.
    pub fn policy_with(&self, limits: &str, filesystem: &str, extra: &str) -> PathBuf {
        self.write_policy(limits, filesystem, extra, "")
    }

    /// [`Target::policy_with`] with `kube` lines added to the `[kube]` section (kube only).
    pub fn kube_policy_with(&self, limits: &str, kube: &str) -> PathBuf {
        assert_eq!(self.kind, Kind::Kube);
        self.write_policy(limits, "", "", kube)
    }

    fn write_policy(&self, limits: &str, filesystem: &str, extra: &str, kube: &str) -> PathBuf {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let mut images = String::new();
        let rootfs = if filesystem.contains("rootfs =") {
            // The test picks the root itself (Target::host_tools_rootfs).
            String::new()
        } else if self.kind.is_container() {
            format!(
                "rootfs = \"image:{}\"",
                std::env::var(IMAGE_ENV).unwrap_or_default()
            )
        } else if let Some((image, store)) = native_image() {
            images = format!("[images]\nstore = {store:?}\n");
            format!("rootfs = \"image:{image}\"")
        } else {
            "rootfs = \"host\"".to_owned()
        };
        // The warm kinds pin how their sandboxes are made, whatever the default.
        let native = match self.kind {
            Kind::Zygote => "[native]\nzygote = true\n",
            Kind::Warm => "[native]\nzygote = false\n",
            _ => "",
        };
        let text = format!(
            "version = \"test-1\"\n[limits]\n{limits}\n[filesystem]\n{rootfs}\n{filesystem}\n\
             {}{kube}[docker]\ndocker_socket = {:?}\npodman_socket = {:?}\n{images}{extra}\n{native}",
            self.kube_section(),
            docker_socket().display().to_string(),
            podman_socket().display().to_string(),
        );
        let path = self
            .dir
            .path()
            .join(format!("policy-{}.toml", N.fetch_add(1, Ordering::Relaxed)));
        std::fs::write(&path, text).expect("write policy");
        path
    }

    pub fn policy(&self) -> PathBuf {
        self.policy_with("", "", "")
    }

    /// A `[filesystem]` line for a test that runs a host tool beside the interpreter (curl):
    /// on the native backend's host root that is `host-full`, since the minimal root leaves
    /// such tools out; elsewhere nothing (the image has them).
    pub fn host_tools_rootfs(&self) -> &'static str {
        if !self.kind.is_container() && native_image().is_none() {
            "rootfs = \"host-full\""
        } else {
            ""
        }
    }

    /// [`Target::policy_with`] (`extra` in `[docker]`) with `podman_socket` replaced.
    pub fn policy_on_podman_socket(&self, socket: &Path, extra: &str) -> PathBuf {
        let path = self.policy_with("", "", extra);
        let default = format!(
            "podman_socket = {:?}",
            podman_socket().display().to_string()
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(&default), "{text}");
        let moved = text.replace(
            &default,
            &format!("podman_socket = {:?}", socket.display().to_string()),
        );
        std::fs::write(&path, moved).unwrap();
        path
    }

    /// The `[kube]` section of the kube backend's policies (empty for the others): the
    /// fake cluster's kubeconfig; the image is the rootfs image, as for the other container
    /// backends; both log streams (the fake API server honours `stream=`); airlock's own
    /// seccomp filter as a node-local profile; and the weaker controls a Pod gives, each
    /// accepted by name (docs/kube.md), so every observation lists them.
    pub fn kube_section(&self) -> String {
        if self.kind != Kind::Kube {
            return String::new();
        }
        format!(
            "[kube]\nkubeconfig = {:?}\nnamespace = {KUBE_NAMESPACE:?}\nlog_streams = \"split\"\n\
             seccomp_profile = {KUBE_SECCOMP_PROFILE:?}\n\
             allow_degraded = [\"tmp_exec\", \"pids\", \"network_policy\"]\n",
            kubeconfig().unwrap_or_default().display().to_string(),
        )
    }

    /// `airlock` with this test's state directory and nothing else of ours in its env.
    pub fn cmd(&self) -> Command {
        let mut cmd = Command::new(airlock_bin());
        cmd.env("AIRLOCK_STATE_DIR", self.dir.path());
        cmd.env_remove("AIRLOCK_LOG");
        cmd
    }

    /// `airlock run --json --backend KIND --policy POLICY ARGS...`.
    pub fn run_with(&self, policy: &Path, args: &[&str]) -> JsonRun {
        let mut cmd = self.cmd();
        let backend = self.backend_args(args);
        cmd.arg("run")
            .arg("--json")
            .args(&backend)
            .arg("--policy")
            .arg(policy)
            .args(args);
        let run = json_run(cmd.output().expect("spawn airlock"));
        if backend.contains(&"--warm") {
            assert_ran_warm(self.kind, &run);
        }
        run
    }

    /// [`Target::run_with`] under the backend's default test policy.
    pub fn run(&self, args: &[&str]) -> JsonRun {
        self.run_with(&self.policy(), args)
    }

    /// Every audit line written so far (the test policies log next to themselves).
    pub fn audit_lines(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.dir.path().join("audit.jsonl")).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
            .collect()
    }
}

/// Whether a job with these `airlock run` arguments is one a warm sandbox of `kind` takes:
/// Python (the default language), no network, and on the container backends no `/out`
/// (its tmpfs is mounted for each job; a warm container has none).
pub fn warm_fits(kind: Kind, args: &[&str]) -> bool {
    let mut words = args.iter().take_while(|a| **a != "--");
    while let Some(word) = words.next() {
        match *word {
            "-l" | "--lang" => {
                let language = words.next();
                if language.is_some_and(|l| *l != "python") {
                    return false;
                }
            }
            "--net" => return false,
            "--out" if kind.is_container() => return false,
            "-c" | "--code" | "--file" | "--timeout" | "--memory" | "--cpus" | "--pids"
            | "--out" | "--stdin" | "--env" | "--allow" => {
                words.next();
            }
            _ => {}
        }
    }
    true
}

/// A job run with `--warm` that got as far as running must say it ran warm (for the
/// zygote kind: in a sandbox forked from a zygote): the warm kinds prove nothing if their
/// jobs quietly ran in fresh sandboxes.
pub fn assert_ran_warm(kind: Kind, run: &JsonRun) {
    if run.obs.get("error").is_some_and(|e| !e.is_null()) {
        return;
    }
    let said = if kind == Kind::Zygote {
        "the job ran in a sandbox forked from a zygote"
    } else {
        "the job ran in a warm sandbox"
    };
    assert!(
        run.stderr.contains(said),
        "the job did not run as {} says: {}\n{:#}",
        kind.name(),
        run.stderr,
        run.obs
    );
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

/// A marker no other test uses.
pub fn marker(name: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "airlock-conf-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Host pids whose command line contains `needle`.
pub fn host_pids_with(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(needle)
        {
            found.push(pid);
            continue;
        }
        // A warm sandbox's interpreter was started before its job, so its command line
        // names no job; its root's /work/.airlock-main.py does.
        if sandboxed(&entry.path())
            && std::fs::read(entry.path().join("root/work/.airlock-main.py"))
                .is_ok_and(|source| String::from_utf8_lossy(&source).contains(needle))
        {
            found.push(pid);
        }
    }
    found
}

/// Whether the process at `/proc/PID` has another root than ours.
fn sandboxed(proc_dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (
        std::fs::metadata(proc_dir.join("root")),
        std::fs::metadata("/"),
    ) {
        (Ok(theirs), Ok(ours)) => (theirs.dev(), theirs.ino()) != (ours.dev(), ours.ino()),
        _ => false,
    }
}

/// Containers of airlock (label `airlock.managed`) on a daemon, as `docker ps -aq` lists
/// them, optionally only those of one job.
/// The kube backend's containers are the fake kubelet's (label `airlock.kube-fake`): airlock
/// itself creates Pods, never containers.
pub fn airlock_containers(kind: Kind, job: Option<&str>) -> Vec<String> {
    let socket = if kind.base() == Kind::Podman {
        podman_socket()
    } else {
        docker_socket()
    };
    let label = if kind == Kind::Kube {
        format!("label={KUBE_FAKE_LABEL}=true")
    } else {
        "label=airlock.managed=true".to_owned()
    };
    let mut cmd = Command::new("docker");
    cmd.env("DOCKER_HOST", format!("unix://{}", socket.display()))
        .args(["ps", "-aq", "--no-trunc", "--filter", &label]);
    if let Some(job) = job {
        cmd.arg("--filter").arg(format!("label=airlock.job={job}"));
    }
    let out = cmd.output().expect("docker ps");
    assert!(
        out.status.success(),
        "docker ps: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// `airlock run --json --net proxy --backend KIND --policy POLICY ARGS...` with `values`
/// (a secret's real value, by its `value_env`) in airlock's environment.
pub fn run_proxy_job(t: &Target, policy: &Path, values: &[(&str, &str)], args: &[&str]) -> JsonRun {
    let mut cmd = t.cmd();
    for (name, value) in values {
        cmd.env(name, value);
    }
    cmd.args([
        "run",
        "--json",
        "--net",
        "proxy",
        "--backend",
        t.kind.backend(),
        "--policy",
    ])
    .arg(policy)
    .args(args);
    json_run(cmd.output().unwrap())
}

/// The observation of a proxy job that ran; `None` on a backend that refuses proxy jobs
/// (gVisor, kube), after checking that it refused and said why.
pub fn proxy_job_ran(t: &Target, run: JsonRun) -> Option<Value> {
    if matches!(t.kind.base(), Kind::Gvisor | Kind::Kube) {
        assert_eq!(run.obs["outcome"], "error", "{:#}", run.obs);
        assert_eq!(run.obs["error"]["kind"], "policy_denied", "{:#}", run.obs);
        assert!(
            run.obs["error"]["message"]
                .as_str()
                .unwrap()
                .contains("proxy")
        );
        return None;
    }
    assert_eq!(
        run.obs["outcome"], "exited",
        "{:#}\n{}",
        run.obs, run.stderr
    );
    Some(run.obs)
}

/// Asserts an error observation of `kind`, exit code 125.
pub fn assert_error(run: &JsonRun, kind: &str) {
    assert_eq!(run.obs["outcome"], "error", "{:#}", run.obs);
    assert_eq!(run.obs["ok"], false);
    assert_eq!(run.obs["error"]["kind"], kind, "{:#}", run.obs);
    assert_eq!(run.code, 125, "exit code; stderr: {}", run.stderr);
}

/// Waits up to `secs` for `check` to hold.
pub fn eventually(secs: u64, mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    check()
}

/// A tiny HTTP server on 127.0.0.1 that answers every request with `body` and records
/// each request's head (request line and headers).
pub struct RecordingServer {
    pub port: u16,
    pub requests: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    pub accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl RecordingServer {
    pub fn start(body: &'static str) -> Self {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (seen, count) = (requests.clone(), accepted.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 64 * 1024 {
                    match stream.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => break,
                    }
                }
                seen.lock()
                    .expect("lock")
                    .push(String::from_utf8_lossy(&head).into_owned());
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Self {
            port,
            requests,
            accepted,
        }
    }

    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("lock").clone()
    }
}

/// Declares checks once and one `#[test]` per backend for each:
/// `suite::<file>::<backend>::<check>`. A backend that cannot run here is skipped with the
/// reason (a failure under `AIRLOCK_REQUIRE_ALL=1`).
macro_rules! conformance {
    ($(fn $name:ident($t:ident: &Target) $body:block)*) => {
        $(fn $name($t: &Target) $body)*
        conformance!(@backend native, Native, $($name)*);
        conformance!(@backend docker, Docker, $($name)*);
        conformance!(@backend gvisor, Gvisor, $($name)*);
        conformance!(@backend podman, Podman, $($name)*);
        conformance!(@backend kube, Kube, $($name)*);
        conformance!(@backend warm, Warm, $($name)*);
        conformance!(@backend warm_docker, WarmDocker, $($name)*);
        conformance!(@backend warm_gvisor, WarmGvisor, $($name)*);
        conformance!(@backend warm_podman, WarmPodman, $($name)*);
        conformance!(@backend zygote, Zygote, $($name)*);
    };
    (@backend $module:ident, $kind:ident, $($name:ident)*) => {
        mod $module {
            $(
                #[test]
                fn $name() {
                    let kind = $crate::suite::common::Kind::$kind;
                    let missing = $crate::suite::common::unavailable(kind);
                    airlock_testkit::require!(missing.is_none(), missing.unwrap_or_default());
                    super::$name(&$crate::suite::common::Target::new(kind));
                }
            )*
        }
    };
}

/// [`conformance!`] for the named backends only, for a check that has no meaning on the
/// others (it is then absent there, never passed without testing anything):
/// `conformance_on! { [docker: Docker, podman: Podman] fn check(t: &Target) { ... } }`.
macro_rules! conformance_on {
    ([$($module:ident: $kind:ident),*] $(fn $name:ident($t:ident: &Target) $body:block)*) => {
        $(fn $name($t: &Target) $body)*
        conformance_on!(@each [$($module: $kind),*] ($($name)*));
    };
    (@each [$($module:ident: $kind:ident),*] $names:tt) => {
        $(conformance_on!(@one $module, $kind, $names);)*
    };
    (@one $module:ident, $kind:ident, ($($name:ident)*)) => {
        conformance!(@backend $module, $kind, $($name)*);
    };
}
