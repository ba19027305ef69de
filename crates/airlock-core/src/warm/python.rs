//! The Python program a warm sandbox runs while it waits, and the message that hands it its
//! job: one bootstrap for every backend (the native sandbox reads it from a pipe of its
//! own, a container from its stdin), so a job sees the same `__main__`, `sys.argv` and
//! streams however it was delivered.

use crate::job::{JobSpec, WORKDIR};
use crate::policy::{FilesystemPolicy, NetworkMode, WorkdirMode};

/// The job runner every warm sandbox's interpreter runs, defining `_airlock_run(forked)`,
/// with `{CONTROL_FD}` standing for the descriptor it reads its job from: the bootstrap of
/// a sandbox started from scratch ([`warm_argv`]) and of a native zygote's children.
///
/// It reads one framed message ([`control_message`]): 16 hex digits giving the length of
/// the rest, then the stdin mode byte, then the output byte, then the job's `argv` (script
/// path first, NUL-separated). It reads exactly that much, so what follows on the same
/// descriptor (a container's stdin, which carries the message) is left for the job;
/// end-of-file before a whole message (the pool shutting down) exits 0 quietly. A
/// descriptor other than 0 is closed; with mode `r` or `w` descriptor 0 is replaced by `/dev/null` opened read-only
/// or read-write, which is what a fresh sandbox or container without stdin has there. With
/// output byte `o`, descriptors 1 and 2 become the write ends of two pipes the host hands
/// over on the socket [`WARM_OUTPUT_SOCKET`] (a warm container whose output the host reads
/// itself, not through its engine: docs/docker.md); with `-` they stay. It then makes
/// `__main__` look as it does for a script (its namespace emptied but for `__builtins__`)
/// and runs the script there. An uncaught exception is printed without the bootstrap's
/// own frame and exits 1, as for a script; `SystemExit` passes through.
/// Everything it names is local, so nothing of it is left in `__main__`. A zygote's child
/// (`forked`) ends as interpreter shutdown would for the job, without tearing down what it
/// shares with the zygote (docs/speed.md).
pub const PYTHON_RUN_JOB: &str = include_str!("run_job.py");

/// What a warm interpreter runs before the job runner when the policy names modules to
/// preload: it defines `_airlock_preload(names)`, which imports each with the
/// interpreter's own output sent to `/dev/null` and warnings silenced, so nothing of it
/// reaches the job's output; a module that fails to import is skipped.
pub const PYTHON_PRELOAD: &str = include_str!("preload.py");

/// [`PYTHON_RUN_JOB`] reading its job from `control_fd`.
pub fn run_job_program(control_fd: i32) -> String {
    PYTHON_RUN_JOB
        .replace("{CONTROL_FD}", &control_fd.to_string())
        .replace("{OUTPUT_SOCKET}", WARM_OUTPUT_SOCKET)
}

/// The name, in `/work`, of the Unix socket on which the host hands a warm sandbox the
/// pipes its job's stdout and stderr go to when its message says so
/// ([`WarmOutput::Handed`]). The host listens there only until the sandbox has connected,
/// and removes it before it hands the pipes over, so the job never sees it.
pub const WARM_OUTPUT_SOCKET_NAME: &str = ".airlock-output.sock";
/// [`WARM_OUTPUT_SOCKET_NAME`] as the sandbox sees it.
pub const WARM_OUTPUT_SOCKET: &str = "/work/.airlock-output.sock";

/// Where a delivered job's stdout and stderr go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmOutput {
    /// Where the warm sandbox's own descriptors 1 and 2 go.
    Inherited,
    /// The write ends of two pipes the host hands over on [`WARM_OUTPUT_SOCKET`]: stdout's,
    /// then stderr's.
    Handed,
}

/// `preload` as a Python list literal. The names are checked identifiers ([native]
/// warm_preload), which need no escaping as string literals.
pub fn module_list<S: AsRef<str>>(preload: &[S]) -> String {
    let names: Vec<String> = preload
        .iter()
        .map(|m| format!("\"{}\"", m.as_ref()))
        .collect();
    format!("[{}]", names.join(", "))
}

/// Hex digits of a control message's length prefix.
const LENGTH_DIGITS: usize = 16;

/// What the job's descriptor 0 is once the bootstrap has its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmStdin {
    /// Left as it is: a pipe carrying the job's input (after the message, on a
    /// container), as a fresh sandbox with input has.
    Keep,
    /// Replaced by `/dev/null` opened read-only: the job has no input, and a fresh native
    /// sandbox has that there.
    DevNullReadOnly,
    /// Replaced by `/dev/null` opened read-write: the job has no input, and a fresh runc
    /// container has that there.
    DevNullReadWrite,
}

/// Why a template cannot be served warm.
pub fn unsupported_template(template: &JobSpec) -> Option<String> {
    if template.network != NetworkMode::None {
        return Some("warm sandboxes have no network; the template job asks for the proxy".into());
    }
    let program = template
        .argv
        .first()
        .map(|p| p.rsplit('/').next().unwrap_or(p));
    if !program.is_some_and(|p| p.starts_with("python")) {
        return Some(format!(
            "warm sandboxes start a Python interpreter; the {} command is {:?}",
            template.language, template.argv
        ));
    }
    if warm_argv(template, &[], 0).is_none() {
        return Some(format!(
            "the {} command {:?} does not end with the source file",
            template.language, template.argv
        ));
    }
    None
}

/// The warm sandbox's argv: the template's interpreter and flags, then `-c BOOTSTRAP`
/// reading from `control_fd` (after the preload, when there is one) in place of the source
/// file. `None` unless the template ends with the source file.
pub fn warm_argv(template: &JobSpec, preload: &[String], control_fd: i32) -> Option<Vec<String>> {
    let run_job = run_job_program(control_fd);
    let program = if preload.is_empty() {
        format!("{run_job}_airlock_run()\n")
    } else {
        format!(
            "{PYTHON_PRELOAD}_airlock_preload({})\ndel _airlock_preload\n{run_job}_airlock_run()\n",
            module_list(preload)
        )
    };
    interpreter_running(template, program)
}

/// The template's interpreter and flags running `program` (`python3 <flags> -c PROGRAM`)
/// in place of the source file; `None` unless the template's command ends with its source
/// file.
pub fn interpreter_running(template: &JobSpec, program: String) -> Option<Vec<String>> {
    let (script, flags) = template.argv.split_last()?;
    if *script != format!("{WORKDIR}/{}", template.source_file) {
        return None;
    }
    let mut argv = flags.to_vec();
    argv.push("-c".to_owned());
    argv.push(program);
    Some(argv)
}

/// Whether `job` runs the same way in a sandbox built for `template`: same interpreter
/// and flags, environment, filesystem, network (none), and the limits the sandbox itself
/// enforces. Its wall time may be shorter (the kill is the supervisor's); the output caps
/// are the supervisor's too and may differ.
pub fn fits(template: &JobSpec, job: &JobSpec) -> bool {
    // A session's /work is bound when the sandbox is built; a warm one has its own.
    job.workspace.is_none()
        && job.session_tmp.is_none()
        && job.limits.timeout <= template.limits.timeout
        && same_sandbox(template, job, &job.filesystem)
}

/// Whether a session's `job` (its `/work` the session's workspace, always writable, its
/// `/tmp` the session's own or fresh) gets the sandbox of `template` but for those mounts
/// and its CPU-time limit, which follows its own wall time (a kernel lives for the
/// session's `ttl`): what a sandbox forked for it with the session's mounts gives it
/// (`WarmSandboxes::start_for_session`).
pub fn fits_session(template: &JobSpec, job: &JobSpec) -> bool {
    if job.workspace.is_none() || job.filesystem.workdir != WorkdirMode::Rw {
        return false;
    }
    let filesystem = FilesystemPolicy {
        workdir: template.filesystem.workdir,
        ..job.filesystem.clone()
    };
    same_sandbox(template, job, &filesystem)
}

/// The modules a kernel session's driver imports (airlock-engine's `kernel_driver.py`,
/// which a test holds to this list): a zygote imports them once, and a sandbox it forks
/// for a kernel keeps them as a fresh kernel would have them once started, where any
/// other child is left only a fresh interpreter's modules and the policy's preload.
pub const KERNEL_MODULES: &[&str] = &[
    "_ast",
    "json",
    "linecache",
    "os",
    "select",
    "signal",
    "stat",
    "sys",
    "time",
    "types",
];

/// Everything but `/work`, `/tmp`'s source and the wall time: the interpreter and its
/// flags, the environment, the network, the filesystem's shape (`filesystem`, the job's
/// as compared) and the limits.
fn same_sandbox(template: &JobSpec, job: &JobSpec, filesystem: &FilesystemPolicy) -> bool {
    let flags = template.argv.len().saturating_sub(1);
    let (t, j) = (&template.limits, &job.limits);
    job.language == template.language
        && job.source_file == template.source_file
        && job.argv.len() > flags
        && job.argv[..=flags] == template.argv[..]
        && job.argv.iter().all(|a| !a.contains('\0'))
        && job.env == template.env
        && job.network == NetworkMode::None
        && *filesystem == template.filesystem
        && j.memory == t.memory
        && j.cpus == t.cpus
        && j.pids == t.pids
        && j.tmp == t.tmp
        && j.open_files == t.open_files
        && j.file_size == t.file_size
}

/// The message that delivers `job` to a warm sandbox built for `template`: the length
/// prefix, the stdin mode, the output, then the script path and the job's arguments,
/// NUL-separated (the bootstrap's `sys.argv`).
pub fn control_message(
    template: &JobSpec,
    job: &JobSpec,
    stdin: WarmStdin,
    output: WarmOutput,
) -> Vec<u8> {
    let flags = template.argv.len().saturating_sub(1);
    let mut body = vec![
        match stdin {
            WarmStdin::Keep => b'k',
            WarmStdin::DevNullReadOnly => b'r',
            WarmStdin::DevNullReadWrite => b'w',
        },
        match output {
            WarmOutput::Inherited => b'-',
            WarmOutput::Handed => b'o',
        },
    ];
    body.extend_from_slice(job.argv[flags..].join("\0").as_bytes());
    let mut message = format!("{:0width$x}", body.len(), width = LENGTH_DIGITS).into_bytes();
    message.extend_from_slice(&body);
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{JobRequest, Policy};

    fn job(args: &[&str]) -> JobSpec {
        JobRequest {
            language: "python".into(),
            source: b"print(1)".to_vec(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            ..Default::default()
        }
        .resolve(&Policy::builtin())
        .unwrap()
    }

    #[test]
    fn the_message_is_framed_and_carries_the_script_and_its_arguments() {
        let template = job(&[]);
        let message = control_message(
            &template,
            &job(&["a b", "ü"]),
            WarmStdin::DevNullReadWrite,
            WarmOutput::Inherited,
        );
        let (length, body) = message.split_at(LENGTH_DIGITS);
        let length = usize::from_str_radix(std::str::from_utf8(length).unwrap(), 16).unwrap();
        assert_eq!(length, body.len());
        assert_eq!(body, "w-/work/.airlock-main.py\0a b\0ü".as_bytes());
        let kept = control_message(&template, &template, WarmStdin::Keep, WarmOutput::Handed);
        assert_eq!(&kept[LENGTH_DIGITS..], b"ko/work/.airlock-main.py");
    }

    #[test]
    fn the_warm_argv_is_the_templates_flags_and_the_bootstrap_on_its_descriptor() {
        let template = job(&[]);
        let argv = warm_argv(&template, &[], 6).unwrap();
        assert_eq!(
            argv[..argv.len() - 2],
            template.argv[..template.argv.len() - 1]
        );
        assert_eq!(argv[argv.len() - 2], "-c");
        let program = &argv[argv.len() - 1];
        assert!(program.contains("os.read(6, "), "{program}");
        assert!(!program.contains("{CONTROL_FD}"));
        assert!(!program.contains("{OUTPUT_SOCKET}"));
        assert!(
            program.contains("\"/work/.airlock-output.sock\""),
            "{program}"
        );
        assert_eq!(
            WARM_OUTPUT_SOCKET,
            format!("{WORKDIR}/{WARM_OUTPUT_SOCKET_NAME}")
        );
        assert!(WARM_OUTPUT_SOCKET_NAME.starts_with(crate::job::RESERVED_PREFIX));
        let preloaded = warm_argv(&template, &["numpy".into()], 0).unwrap();
        let program = preloaded.last().unwrap();
        assert!(program.starts_with("def _airlock_preload"), "{program}");
        assert!(program.contains("_airlock_preload([\"numpy\"])"));
        assert!(program.contains("os.read(0, "));
        assert_eq!(unsupported_template(&template), None);
    }

    #[test]
    fn jobs_with_other_limits_or_arguments_do_not_fit() {
        let template = job(&[]);
        assert!(fits(&template, &job(&["x"])));
        let mut other = job(&[]);
        other.limits.memory = crate::ByteSize::mib(128);
        assert!(!fits(&template, &other));
        let mut nul = job(&["x"]);
        nul.argv[template.argv.len()] = "a\0b".into();
        assert!(!fits(&template, &nul), "a NUL would split the message");
        let mut shorter = job(&[]);
        shorter.limits.timeout = std::time::Duration::from_secs(1);
        assert!(fits(&template, &shorter), "a shorter wall time fits");
    }
}
