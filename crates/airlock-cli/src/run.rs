//! `airlock run`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use airlock_core::observation::ErrorInfo;
use airlock_core::policy::NetworkMode;
use airlock_core::units::parse_duration;
use airlock_core::{
    BackendKind, ByteSize, Cpus, ErrorKind, InputFile, JobRequest, LimitsRequest, NetworkRequest,
    Observation, Outcome,
};
use airlock_engine::{AuditLog, Engine, LoadedPolicy};
use clap::Args;

use crate::{EXIT_AIRLOCK_ERROR, error_chain};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The program: a file, or - for stdin. Use -c to give it inline.
    #[arg(value_name = "FILE|-", conflicts_with = "code")]
    file: Option<PathBuf>,

    /// The program's source, inline.
    #[arg(short = 'c', long = "code", value_name = "CODE")]
    code: Option<String>,

    /// Language: python, node, bash, sh (default: from FILE's extension, else python).
    #[arg(short = 'l', long = "lang", value_name = "LANG")]
    lang: Option<String>,

    /// An input file placed at /work/NAME (repeatable). Its executable bit is kept.
    #[arg(long = "file", value_name = "NAME=PATH")]
    files: Vec<String>,

    /// A file whose content is the program's stdin (otherwise stdin is empty).
    #[arg(long = "stdin", value_name = "PATH")]
    stdin: Option<PathBuf>,

    /// An environment variable for the program; the policy must allow its name (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    env: Vec<String>,

    /// Wall-time limit, e.g. 5s or 500ms (at most the policy's).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    timeout: Option<String>,

    /// Memory limit, e.g. 256MiB (at most the policy's).
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    memory: Option<String>,

    /// CPU share, e.g. 0.5 (at most the policy's).
    #[arg(long, value_name = "CPUS", allow_hyphen_values = true)]
    cpus: Option<String>,

    /// Process and thread limit (at most the policy's).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pids: Option<String>,

    /// Network: none, or proxy (only allowlisted hosts, through airlock's egress proxy).
    #[arg(long = "net", value_name = "MODE", default_value = "none")]
    net: String,

    /// A host the proxy may reach, HOST[:PORT]; must be in the policy (repeatable).
    #[arg(long = "allow", value_name = "HOST[:PORT]")]
    allow: Vec<String>,

    /// Enable /out; accepted files are copied to DIR.
    #[arg(long = "out", value_name = "DIR")]
    out: Option<PathBuf>,

    /// Enable /out and put the released files' content in the observation
    /// (files[].content_base64), up to the policy's filesystem.out.inline_bytes in total;
    /// larger files are listed without content. With --out DIR they are also copied there.
    #[arg(long, requires = "json")]
    return_files: bool,

    /// Backend: native, docker, podman, gvisor, kube.
    #[arg(long, value_name = "BACKEND", default_value = "native")]
    backend: String,

    /// Root filesystem image, REF@sha256:…
    #[arg(long, value_name = "REF@sha256:…")]
    image: Option<String>,

    /// Policy file (default: the built-in policy).
    #[arg(long, value_name = "FILE")]
    pub(crate) policy: Option<PathBuf>,

    /// Print exactly one observation object on stdout.
    #[arg(long)]
    json: bool,

    /// Run the job in a warm sandbox, as `airlock serve`'s warm pool does: the sandbox and
    /// the interpreter are started first, then the job is delivered. Slower than a plain
    /// run; for the conformance suite and for diagnosing the warm path. Python jobs on the
    /// native, docker, gvisor and podman backends (a warm container there). Says on stderr
    /// whether the job ran warm (natively with `[native] zygote`: in a sandbox forked from
    /// a zygote).
    #[arg(long, hide = true)]
    warm: bool,

    /// Arguments passed to the program after the source file.
    #[arg(last = true, value_name = "ARGS")]
    args: Vec<String>,
}

/// The observation's exit code for the shell.
fn exit_code(observation: &Observation) -> ExitCode {
    ExitCode::from(u8::try_from(observation.cli_exit_code()).unwrap_or(EXIT_AIRLOCK_ERROR))
}

pub fn run(args: RunArgs) -> ExitCode {
    if args.backend == "native" {
        airlock_native::start_making_init_early();
    }
    let json = args.json;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return finish(
                json,
                &airlock_engine::early_error(
                    ErrorKind::Internal,
                    format!("start runtime: {e}"),
                    "unknown",
                ),
            );
        }
    };
    let out_dir = args.out.clone();
    runtime.block_on(async move {
        // `TRACEPARENT`, `TRACESTATE` and `BAGGAGE` in the environment: the carrier a
        // calling process hands a command (the OpenTelemetry environment-carrier spec).
        let caller = airlock_telemetry::Caller::from_carrier(|key| {
            std::env::var(key.to_ascii_uppercase()).ok()
        });
        let (mut result, removal) = airlock_telemetry::with_caller(caller, run_async(args)).await;
        // The files go to DIR before the observation is printed, so a failure to write them
        // is in the observation rather than after an `ok: true` the caller already read.
        if let Some(dir) = out_dir
            && let Err(e) = airlock_engine::out_dir::write_released(&dir, &result.files)
        {
            let message = format!("--out {}: {}", dir.display(), error_chain(&e));
            let observation = &mut result.observation;
            observation.ok = false;
            observation.outcome = Outcome::Error;
            observation.error = Some(ErrorInfo {
                kind: ErrorKind::Internal,
                message,
            });
        }
        let code = finish(json, &result.observation);
        // The observation is complete once the job's processes are gone; removing its
        // sandbox (cgroup, mounts, job directory, container) need not delay it. Stdout is
        // let go of too, so a caller reading it to the end has the observation now. The
        // removal still ends before airlock exits; if airlock is killed meanwhile, the next
        // start sweeps what is left (docs/speed.md).
        release_stdout();
        removal.await;
        code
    })
}

/// Work left after the observation is printed: the removal of the job's sandbox.
type Removal = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

/// A job that never reached a backend: its observation, and no sandbox to remove.
fn without_sandbox(observation: Observation) -> (airlock_core::JobResult, Removal) {
    let result = airlock_core::JobResult {
        observation,
        files: Vec::new(),
        connections: Vec::new(),
    };
    (result, Box::pin(std::future::ready(())))
}

/// Points stdout at `/dev/null`, so whoever reads it sees its end, while airlock goes on
/// removing the sandbox (whose warnings, if any, still go to stderr).
fn release_stdout() {
    let _ = std::io::stdout().lock().flush();
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = rustix::stdio::dup2_stdout(&null);
    }
}

fn finish(json: bool, observation: &Observation) -> ExitCode {
    if json {
        match serde_json::to_string(observation) {
            Ok(text) => println!("{text}"),
            Err(e) => eprintln!("airlock: cannot encode the observation: {e}"),
        }
    } else {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(observation.stdout.as_bytes());
        let _ = out.flush();
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(observation.stderr.as_bytes());
        // Start the summary on a line of its own when the program's output did not end one.
        let open_line = |s: &str| !s.is_empty() && !s.ends_with('\n');
        if open_line(&observation.stdout) || open_line(&observation.stderr) {
            let _ = writeln!(err);
        }
        let _ = writeln!(err, "{}", summary(observation));
    }
    exit_code(observation)
}

fn summary(o: &Observation) -> String {
    if let Some(error) = &o.error {
        return format!("airlock: error ({}): {}", error.kind, error.message);
    }
    let how = match o.outcome {
        Outcome::Exited => format!("exited {}", o.exit_code.unwrap_or(-1)),
        Outcome::Timeout => "timed out".to_owned(),
        Outcome::Oom => "killed: out of memory".to_owned(),
        Outcome::OutputLimit => "killed: too much output".to_owned(),
        Outcome::Killed => format!("killed by {}", o.signal.as_deref().unwrap_or("a signal")),
        Outcome::Error => "error".to_owned(),
    };
    let mut parts = vec![format!("{how} after {} ms", o.duration_ms)];
    if let Some(cpu) = o.cpu_ms {
        parts.push(format!("cpu {cpu} ms"));
    }
    if let Some(peak) = o.peak_memory_bytes {
        parts.push(format!(
            "peak memory {:.1} MiB",
            peak as f64 / (1024.0 * 1024.0)
        ));
    }
    if o.stdout_truncated {
        parts.push(format!("stdout cut: {} bytes written", o.stdout_bytes));
    }
    if o.stderr_truncated {
        parts.push(format!("stderr cut: {} bytes written", o.stderr_bytes));
    }
    format!(
        "airlock: {} [{}, policy {}, job {}]",
        parts.join(", "),
        o.backend,
        o.policy_version,
        o.job_id
    )
}

/// An early failure: the job never reached the engine.
fn refuse(kind: ErrorKind, message: impl Into<String>, version: &str) -> Observation {
    airlock_engine::early_error(kind, message, version)
}

async fn run_async(args: RunArgs) -> (airlock_core::JobResult, Removal) {
    let result = without_sandbox;
    let loaded = match &args.policy {
        Some(path) => match LoadedPolicy::from_file(path) {
            Ok(p) => p,
            Err(e) => {
                return result(refuse(ErrorKind::InvalidInput, error_chain(&e), "unknown"));
            }
        },
        None => LoadedPolicy::builtin(),
    };
    let version = loaded.policy.version.clone();
    let request = match build_request(&args) {
        Ok(r) => r,
        Err(e) => return result(refuse(e.0, e.1, &version)),
    };
    let backend_kind: BackendKind = match args.backend.parse() {
        Ok(kind) => kind,
        Err(e) => return result(refuse(ErrorKind::InvalidInput, e, &version)),
    };
    // --image replaces the policy's rootfs: whoever runs the CLI owns the policy too.
    let mut loaded = loaded;
    if let Some(image) = &args.image {
        match format!("image:{image}").parse::<airlock_core::policy::RootfsSpec>() {
            Ok(rootfs) => loaded.policy.filesystem.rootfs = rootfs,
            Err(e) => {
                return result(refuse(
                    ErrorKind::InvalidInput,
                    format!("--image: {e}"),
                    &version,
                ));
            }
        }
    }
    if let Some(dir) = &args.out
        && let Err(e) = check_out_dir(dir)
    {
        return result(refuse(
            ErrorKind::InvalidInput,
            format!("--out {}: {e}", dir.display()),
            &version,
        ));
    }
    let audit_path = loaded.audit_path();
    let audit = match AuditLog::open(&audit_path, loaded.policy.audit.fsync) {
        Ok(a) => a,
        Err(e) => return result(refuse(ErrorKind::Internal, error_chain(&e), &version)),
    };
    let inline_cap = loaded.policy.filesystem.out.inline_bytes.as_u64();
    let (mut result, removal) = if args.warm {
        run_warm(request, backend_kind, loaded, audit).await
    } else {
        tracing::debug!("opening the backend");
        let backend = airlock_engine::backends::open(backend_kind, &loaded);
        tracing::debug!("backend open");
        let engine = Engine::new(loaded.policy, backend_kind, backend, audit);
        let (result, teardown) = engine
            .run_detached(request, None, interrupted(), None)
            .await;
        let removal: Removal = Box::pin(async move {
            teardown.wait().await;
            tracing::debug!("sandbox removed; exiting");
            drop(engine);
        });
        (result, removal)
    };
    if args.return_files {
        result.inline_files(inline_cap);
    }
    (result, removal)
}

/// `--warm`: a warm sandbox built for this very job, started and waited for, then the job
/// delivered to it.
async fn run_warm(
    request: JobRequest,
    backend_kind: BackendKind,
    loaded: LoadedPolicy,
    audit: AuditLog,
) -> (airlock_core::JobResult, Removal) {
    let version = loaded.policy.version.clone();
    let result = without_sandbox;
    if backend_kind == BackendKind::Kube {
        return result(refuse(
            ErrorKind::InvalidInput,
            format!("--warm needs the native or a container backend, not {backend_kind}"),
            &version,
        ));
    }
    let template = JobRequest {
        source: Vec::new(),
        files: Vec::new(),
        stdin: None,
        args: Vec::new(),
        ..request.clone()
    };
    let options = airlock_engine::backends::OpenOptions {
        warm_pool: true,
        warm_template: Some(template),
    };
    let backend = airlock_engine::backends::open_with(backend_kind, &loaded, options);
    let engine = Engine::new(loaded.policy, backend_kind, backend, audit);
    // A backend that did not open ends the job with its error, as without --warm.
    let deadline = std::time::Instant::now() + WARM_START_LIMIT;
    while let Some(stats) = engine.warm_pool() {
        if stats.ready > 0 {
            break;
        }
        if stats.failed > 0 || std::time::Instant::now() > deadline {
            // As the server's pool does on a miss: the job runs in a fresh sandbox, whose
            // own error (if any) is the one the observation reports.
            eprintln!(
                "airlock: --warm: no warm sandbox started ({} failed starts); the job runs in a fresh one",
                stats.failed
            );
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let (outcome, teardown) = engine
        .run_detached(request, None, interrupted(), None)
        .await;
    if let Some(stats) = engine.warm_pool() {
        if stats.forked_hits == 1 {
            eprintln!("airlock: --warm: the job ran in a sandbox forked from a zygote");
        } else if stats.hits == 1 {
            eprintln!("airlock: --warm: the job ran in a warm sandbox");
        } else if outcome.observation.error.is_none() {
            eprintln!("airlock: --warm: the job ran in a fresh sandbox");
        }
    }
    let removal: Removal = Box::pin(async move {
        teardown.wait().await;
        engine.shutdown().await;
    });
    (outcome, removal)
}

/// How long `--warm` waits for its sandbox to start.
const WARM_START_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Completes on SIGINT or SIGTERM, naming the signal: the job is then killed and its
/// sandbox removed before airlock exits, rather than left to whoever cleans up next.
async fn interrupted() -> String {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "SIGINT".to_owned(),
        _ = term.recv() => "SIGTERM".to_owned(),
    }
}

/// `--out DIR` must be a directory (or not exist yet), so a job is not run for nothing.
fn check_out_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(std::io::Error::other("not a directory")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

type RequestError = (ErrorKind, String);

fn invalid(message: impl Into<String>) -> RequestError {
    (ErrorKind::InvalidInput, message.into())
}

fn language_for(path: &Path) -> Option<&'static str> {
    match path.extension()?.to_str()? {
        "py" => Some("python"),
        "js" | "mjs" | "cjs" => Some("node"),
        "sh" => Some("sh"),
        "bash" => Some("bash"),
        _ => None,
    }
}

fn build_request(args: &RunArgs) -> Result<JobRequest, RequestError> {
    let (source, language_hint) = match (&args.code, &args.file) {
        (Some(code), _) => (code.clone().into_bytes(), None),
        (None, Some(path)) if path.as_os_str() == "-" => {
            let mut bytes = Vec::new();
            std::io::stdin()
                .read_to_end(&mut bytes)
                .map_err(|e| invalid(format!("read the program from stdin: {e}")))?;
            (bytes, None)
        }
        (None, Some(path)) => {
            let bytes = std::fs::read(path)
                .map_err(|e| invalid(format!("read {}: {e}", path.display())))?;
            (bytes, language_for(path))
        }
        (None, None) => {
            return Err(invalid("no program: give a FILE, - for stdin, or -c CODE"));
        }
    };
    let language = args
        .lang
        .clone()
        .or(language_hint.map(str::to_owned))
        .unwrap_or_else(|| "python".to_owned());

    let mut files = Vec::new();
    for spec in &args.files {
        let (name, path) = spec
            .split_once('=')
            .ok_or_else(|| invalid(format!("--file {spec:?}: expected NAME=PATH")))?;
        let path = Path::new(path);
        // Symlinks in the input are never followed: name the file itself.
        let meta = std::fs::symlink_metadata(path)
            .map_err(|e| invalid(format!("--file {name}: {}: {e}", path.display())))?;
        if meta.file_type().is_symlink() {
            return Err(invalid(format!(
                "--file {name}: {} is a symbolic link; give the file it points to",
                path.display()
            )));
        }
        if !meta.is_file() {
            return Err(invalid(format!(
                "--file {name}: {} is not a regular file",
                path.display()
            )));
        }
        let content = std::fs::read(path)
            .map_err(|e| invalid(format!("--file {name}: {}: {e}", path.display())))?;
        files.push(InputFile {
            path: name.to_owned(),
            content,
            executable: meta.permissions().mode() & 0o111 != 0,
        });
    }
    let stdin = match &args.stdin {
        Some(path) => Some(
            std::fs::read(path).map_err(|e| invalid(format!("--stdin {}: {e}", path.display())))?,
        ),
        None => None,
    };
    let mut env = BTreeMap::new();
    for spec in &args.env {
        let (name, value) = spec
            .split_once('=')
            .ok_or_else(|| invalid(format!("--env {spec:?}: expected NAME=VALUE")))?;
        env.insert(name.to_owned(), value.to_owned());
    }
    let limits = LimitsRequest {
        timeout: args
            .timeout
            .as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(|e| invalid(format!("--timeout: {e}")))?,
        memory: args
            .memory
            .as_deref()
            .map(str::parse::<ByteSize>)
            .transpose()
            .map_err(|e| invalid(format!("--memory: {e}")))?,
        cpus: args
            .cpus
            .as_deref()
            .map(str::parse::<Cpus>)
            .transpose()
            .map_err(|e| invalid(format!("--cpus: {e}")))?,
        pids: args
            .pids
            .as_deref()
            .map(|p| {
                p.trim()
                    .parse::<u32>()
                    .map_err(|_| invalid(format!("--pids {p:?}: expected a positive whole number")))
            })
            .transpose()?,
    };
    let mode = match args.net.as_str() {
        "none" => NetworkMode::None,
        "proxy" => NetworkMode::Proxy,
        other => return Err(invalid(format!("--net {other:?}: expected none or proxy"))),
    };
    Ok(JobRequest {
        language,
        source,
        files,
        stdin,
        args: args.args.clone(),
        limits,
        network: NetworkRequest {
            mode,
            allow: args.allow.clone(),
        },
        env,
        out: args.out.is_some() || args.return_files,
        workspace: None,
        session_tmp: None,
        session_kernel: false,
    })
}
