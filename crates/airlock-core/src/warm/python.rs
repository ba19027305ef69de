//! The Python program a warm sandbox runs while it waits, and the message that hands it its
//! job: one bootstrap for every backend (the native sandbox reads it from a pipe of its
//! own, a container from its stdin), so a job sees the same `__main__`, `sys.argv` and
//! streams however it was delivered.

use crate::job::{JobSpec, WORKDIR};
use crate::policy::NetworkMode;

/// The bootstrap a warm sandbox's interpreter runs (`python3 <flags> -c BOOTSTRAP`), with
/// `{CONTROL_FD}` replaced by the descriptor it reads its job from ([`warm_argv`]).
///
/// It reads one framed message ([`control_message`]): 16 hex digits giving the length of
/// the rest, then the stdin mode byte, then the job's `argv` (script path first,
/// NUL-separated). It reads exactly that much, so what follows on the same descriptor (a
/// container's stdin, which carries the message) is left for the job; end-of-file before
/// a whole message (the pool shutting down) exits 0 quietly. A descriptor other than 0 is
/// closed; with mode `r` or `w` descriptor 0 is replaced by `/dev/null` opened read-only
/// or read-write, which is what a fresh sandbox or container without stdin has there. It then makes `__main__` look as it does for a
/// script (its namespace emptied but for `__builtins__`) and runs the script there. An
/// uncaught exception is printed without the bootstrap's own frame and exits 1, as for a
/// script; `SystemExit` passes through. Everything it names is local, so nothing of it is
/// left in `__main__`.
pub const PYTHON_BOOTSTRAP: &str = r#"def _airlock_run():
    import os, sys
    def take(count):
        data = b""
        while len(data) < count:
            chunk = os.read({CONTROL_FD}, count - len(data))
            if not chunk:
                os._exit(0)
            data += chunk
        return data
    message = take(int(take(16), 16))
    if {CONTROL_FD} != 0:
        os.close({CONTROL_FD})
    if message[:1] in (b"r", b"w"):
        null = os.open(os.devnull, os.O_RDONLY if message[:1] == b"r" else os.O_RDWR)
        os.dup2(null, 0)
        os.close(null)
    argv = [os.fsdecode(a) for a in message[1:].split(b"\0")]
    path = argv[0]
    sys.argv = argv
    sys.orig_argv = sys.orig_argv[:-2] + argv
    import __main__
    SourceFileLoader = sys.modules["_frozen_importlib_external"].SourceFileLoader
    namespace = __main__.__dict__
    builtins = namespace["__builtins__"]
    namespace.clear()
    namespace.update(__name__="__main__", __doc__=None, __package__=None,
                     __loader__=SourceFileLoader("__main__", path), __spec__=None,
                     __annotations__={}, __builtins__=builtins, __file__=path,
                     __cached__=None)
    del builtins, take, message, argv, __main__, SourceFileLoader
    try:
        with open(path, "rb") as source:
            code = compile(source.read(), path, "exec", dont_inherit=True)
    except SyntaxError as e:
        e.__traceback__ = None
        sys.excepthook(type(e), e, None)
        sys.exit(1)
    try:
        exec(code, namespace)
    except SystemExit:
        raise
    except BaseException as e:
        e.__traceback__ = e.__traceback__.tb_next
        sys.excepthook(type(e), e, e.__traceback__)
        sys.exit(1)
_airlock_run()
"#;

/// What a warm sandbox's interpreter runs before the bootstrap when the policy names
/// modules to preload (`{MODULES}`: a Python list of the checked module names). It imports
/// each with the interpreter's own output sent to `/dev/null` and warnings silenced, so
/// nothing of it reaches the job's output; a module that fails to import is skipped.
pub const PYTHON_PRELOAD: &str = r#"def _airlock_preload(names):
    import importlib, os, sys, warnings
    null = os.open(os.devnull, os.O_WRONLY)
    saved = [os.dup(1), os.dup(2)]
    os.dup2(null, 1)
    os.dup2(null, 2)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name in names:
                try:
                    importlib.import_module(name)
                except Exception:
                    pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved + [null]:
            os.close(fd)
_airlock_preload({MODULES})
del _airlock_preload
"#;

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
    let (script, flags) = template.argv.split_last()?;
    if *script != format!("{WORKDIR}/{}", template.source_file) {
        return None;
    }
    let mut argv = flags.to_vec();
    argv.push("-c".to_owned());
    let bootstrap = PYTHON_BOOTSTRAP.replace("{CONTROL_FD}", &control_fd.to_string());
    if preload.is_empty() {
        argv.push(bootstrap);
    } else {
        // The names are checked identifiers ([native] warm_preload): as Python string
        // literals they need no escaping.
        let names: Vec<String> = preload.iter().map(|m| format!("\"{m}\"")).collect();
        let preamble = PYTHON_PRELOAD.replace("{MODULES}", &format!("[{}]", names.join(", ")));
        argv.push(format!("{preamble}{bootstrap}"));
    }
    Some(argv)
}

/// Whether `job` runs the same way in a sandbox built for `template`: same interpreter
/// and flags, environment, filesystem, network (none), and the limits the sandbox itself
/// enforces. Its wall time may be shorter (the kill is the supervisor's); the output caps
/// are the supervisor's too and may differ.
pub fn fits(template: &JobSpec, job: &JobSpec) -> bool {
    let flags = template.argv.len().saturating_sub(1);
    let (t, j) = (&template.limits, &job.limits);
    job.language == template.language
        && job.source_file == template.source_file
        && job.argv.len() > flags
        && job.argv[..=flags] == template.argv[..]
        && job.argv.iter().all(|a| !a.contains('\0'))
        && job.env == template.env
        && job.network == NetworkMode::None
        // A session's /work is bound when the sandbox is built; a warm one has its own.
        && job.workspace.is_none()
        && job.filesystem == template.filesystem
        && j.memory == t.memory
        && j.cpus == t.cpus
        && j.pids == t.pids
        && j.tmp == t.tmp
        && j.open_files == t.open_files
        && j.file_size == t.file_size
        && j.timeout <= t.timeout
}

/// The message that delivers `job` to a warm sandbox built for `template`: the length
/// prefix, the stdin mode, then the script path and the job's arguments, NUL-separated
/// (the bootstrap's `sys.argv`).
pub fn control_message(template: &JobSpec, job: &JobSpec, stdin: WarmStdin) -> Vec<u8> {
    let flags = template.argv.len().saturating_sub(1);
    let mut body = vec![match stdin {
        WarmStdin::Keep => b'k',
        WarmStdin::DevNullReadOnly => b'r',
        WarmStdin::DevNullReadWrite => b'w',
    }];
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
        let message = control_message(&template, &job(&["a b", "ü"]), WarmStdin::DevNullReadWrite);
        let (length, body) = message.split_at(LENGTH_DIGITS);
        let length = usize::from_str_radix(std::str::from_utf8(length).unwrap(), 16).unwrap();
        assert_eq!(length, body.len());
        assert_eq!(body, "w/work/main.py\0a b\0ü".as_bytes());
        let kept = control_message(&template, &template, WarmStdin::Keep);
        assert_eq!(&kept[LENGTH_DIGITS..], b"k/work/main.py");
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
