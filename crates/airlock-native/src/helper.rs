//! Starting the sandbox helper (`airlock __airlock-init`) and holding on to it.
//!
//! On cgroup v2 the helper is created directly inside the job's cgroup
//! (`clone3(CLONE_INTO_CGROUP)`, [`airlock_sys::process::spawn_into_cgroup`]): moving a
//! process into a cgroup afterwards costs an RCU grace period (several milliseconds per
//! job, the largest single cost of a cold job), creating it there does not. Elsewhere (cgroup
//! v1, no cgroup, a kernel or a container runtime without `clone3`) it is started by
//! `tokio::process` and joins its cgroup itself, first thing. Either way the supervisor holds
//! a [`Helper`]: wait for it, kill it, and read its stdout and stderr.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};

use airlock_sys::process::{SpawnError, SpawnRequest};
use rustix::process::{Signal, WaitId, WaitIdOptions};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite};

/// The helper's stdout or stderr, as the supervisor reads it.
pub(crate) type HelperOutput = Pin<Box<dyn AsyncRead + Send>>;
/// The helper's stdin, as the supervisor writes it.
pub(crate) type HelperInput = Pin<Box<dyn AsyncWrite + Send>>;

/// How the helper was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Created inside the job's cgroup by `clone3(CLONE_INTO_CGROUP)`.
    Born,
    /// Started outside; it joins the job's cgroup (if any) itself.
    Joins,
}

/// A started helper.
pub(crate) struct Helper {
    process: Process,
    /// Where it was started.
    pub(crate) placement: Placement,
}

/// A helper just started, with its standard streams.
pub(crate) struct Started {
    /// The helper.
    pub(crate) helper: Helper,
    /// Its stdin when piped.
    pub(crate) stdin: Option<HelperInput>,
    /// Its stdout.
    pub(crate) stdout: HelperOutput,
    /// Its stderr.
    pub(crate) stderr: HelperOutput,
}

enum Process {
    Tokio(tokio::process::Child),
    Pidfd(PidfdChild),
}

/// Set once `clone3(CLONE_INTO_CGROUP)` proved missing (an old kernel, a container's
/// seccomp filter), so that no later job tries it again.
static CLONE_INTO_CGROUP_MISSING: AtomicBool = AtomicBool::new(false);

/// The errno values that say the call itself is missing, not that this group refused.
mod missing_call {
    use rustix::io::Errno;
    pub(super) const ENOSYS: i32 = Errno::NOSYS.raw_os_error();
    pub(super) const EINVAL: i32 = Errno::INVAL.raw_os_error();
    pub(super) const E2BIG: i32 = Errno::TOOBIG.raw_os_error();
}

/// What the helper is started with.
pub(crate) struct HelperCommand<'a> {
    /// The helper binary.
    pub(crate) program: &'a Path,
    /// Its arguments after `argv[0]`.
    pub(crate) args: &'a [&'a str],
    /// Whether its stdin is a pipe (else `/dev/null`).
    pub(crate) stdin_piped: bool,
    /// Descriptors it gets at fixed numbers.
    pub(crate) fds: &'a [(BorrowedFd<'a>, RawFd)],
}

impl Helper {
    /// Starts the helper; inside `cgroup_v2_dir` from birth when that is given and the
    /// kernel can, otherwise the ordinary way (and the caller's plan must have it join).
    pub(crate) fn start(
        command: &HelperCommand<'_>,
        cgroup_v2_dir: Option<&Path>,
    ) -> io::Result<Started> {
        if let Some(dir) = cgroup_v2_dir
            && !CLONE_INTO_CGROUP_MISSING.load(Ordering::Relaxed)
        {
            match start_in_cgroup(command, dir) {
                Ok(helper) => return Ok(helper),
                Err(StartError::Unavailable(e)) => {
                    // The kernel or a seccomp filter lacks the call: it stays so for this
                    // process, so later jobs go straight to the other way. Other errors
                    // (a permission on this one group) are not remembered.
                    let missing = matches!(
                        e.raw_os_error(),
                        Some(missing_call::ENOSYS | missing_call::EINVAL | missing_call::E2BIG)
                    );
                    if missing {
                        CLONE_INTO_CGROUP_MISSING.store(true, Ordering::Relaxed);
                    }
                    tracing::debug!(error = %e, remembered = missing, "clone3 into the job cgroup unavailable; the helper joins it instead");
                }
                Err(StartError::Failed(e)) => return Err(e),
            }
        }
        start_with_tokio(command)
    }

    /// Holds a process this one did not start, by a pidfd it was handed (a zygote's child,
    /// whose own parent reaps it): waits watch the pidfd, kills go through it.
    pub(crate) fn adopt(pidfd: OwnedFd) -> io::Result<Self> {
        Ok(Self {
            process: Process::Pidfd(PidfdChild::adopted(pidfd)?),
            placement: Placement::Born,
        })
    }

    /// Waits until the helper has exited (and reaps it).
    pub(crate) async fn wait(&mut self) {
        match &mut self.process {
            Process::Tokio(child) => {
                let _ = child.wait().await;
            }
            Process::Pidfd(child) => child.wait().await,
        }
    }

    /// Sends SIGKILL (a no-op once it has exited).
    pub(crate) fn start_kill(&mut self) {
        match &mut self.process {
            Process::Tokio(child) => {
                let _ = child.start_kill();
            }
            Process::Pidfd(child) => child.kill(),
        }
    }

    /// Whether it is still running.
    pub(crate) fn is_running(&mut self) -> bool {
        match &mut self.process {
            Process::Tokio(child) => matches!(child.try_wait(), Ok(None)),
            Process::Pidfd(child) => !child.reap(false),
        }
    }
}

/// The helper's `argv[0]`, which becomes the sandbox init's and is what a job reads in
/// `/proc/1/cmdline`: a neutral name, not the host path of the airlock binary.
const HELPER_ARGV0: &str = "init";

enum StartError {
    /// Not started; the ordinary way may be tried.
    Unavailable(io::Error),
    /// A real failure (the binary cannot be executed, no descriptors left, ...).
    Failed(io::Error),
}

fn start_with_tokio(command: &HelperCommand<'_>) -> io::Result<Started> {
    let mut cmd = std::process::Command::new(command.program);
    std::os::unix::process::CommandExt::arg0(&mut cmd, HELPER_ARGV0);
    cmd.args(command.args)
        .env_clear()
        .current_dir("/")
        .stdin(if command.stdin_piped {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let passed = airlock_sys::process::pass_fds(&mut cmd, command.fds)?;
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let mut child = cmd.spawn()?;
    drop(passed);
    let missing = || io::Error::other("the helper has no stdio pipes");
    let stdout: HelperOutput = Box::pin(child.stdout.take().ok_or_else(missing)?);
    let stderr: HelperOutput = Box::pin(child.stderr.take().ok_or_else(missing)?);
    let stdin = child.stdin.take().map(|s| -> HelperInput { Box::pin(s) });
    Ok(Started {
        helper: Helper {
            process: Process::Tokio(child),
            placement: Placement::Joins,
        },
        stdin,
        stdout,
        stderr,
    })
}

fn start_in_cgroup(command: &HelperCommand<'_>, dir: &Path) -> Result<Started, StartError> {
    let failed = |e: io::Error| StartError::Failed(e);
    let cgroup = rustix::fs::open(
        dir,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| failed(e.into()))?;
    let c_string = |bytes: &[u8]| {
        CString::new(bytes).map_err(|_| failed(io::Error::other("a NUL byte in an argument")))
    };
    let program = c_string(command.program.as_os_str().as_bytes())?;
    let mut argv = vec![c_string(HELPER_ARGV0.as_bytes())?];
    for arg in command.args {
        argv.push(c_string(arg.as_bytes())?);
    }
    let cwd = c_string(b"/")?;
    let pipe =
        || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| failed(e.into()));
    let (stdin_child, stdin_ours) = if command.stdin_piped {
        let (read, write) = pipe()?;
        (read, Some(write))
    } else {
        let null = rustix::fs::open(
            "/dev/null",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| failed(e.into()))?;
        (null, None)
    };
    let (stdout_ours, stdout_child) = pipe()?;
    let (stderr_ours, stderr_child) = pipe()?;
    let mut fds: Vec<(BorrowedFd<'_>, RawFd)> = vec![
        (stdin_child.as_fd(), 0),
        (stdout_child.as_fd(), 1),
        (stderr_child.as_fd(), 2),
    ];
    fds.extend(command.fds.iter().copied());
    let request = SpawnRequest {
        program: &program,
        argv: &argv,
        envp: &[],
        cwd: &cwd,
        fds: &fds,
    };
    let spawned = match airlock_sys::process::spawn_into_cgroup(&request, cgroup.as_fd()) {
        Ok(spawned) => spawned,
        Err(SpawnError::Unavailable(e)) => return Err(StartError::Unavailable(e)),
        Err(SpawnError::Exec(e) | SpawnError::Prepare(e)) => return Err(failed(e)),
    };
    drop((stdin_child, stdout_child, stderr_child));
    let child = PidfdChild::new(spawned.pidfd).map_err(failed)?;
    let receiver = |fd: OwnedFd| -> Result<HelperOutput, StartError> {
        Ok(Box::pin(
            tokio::net::unix::pipe::Receiver::from_owned_fd(fd).map_err(failed)?,
        ))
    };
    let stdin = match stdin_ours {
        Some(fd) => Some(Box::pin(
            tokio::net::unix::pipe::Sender::from_owned_fd(fd).map_err(failed)?,
        ) as HelperInput),
        None => None,
    };
    tracing::trace!(
        pid = spawned.pid.as_raw_nonzero().get(),
        "helper created in the job cgroup"
    );
    Ok(Started {
        helper: Helper {
            process: Process::Pidfd(child),
            placement: Placement::Born,
        },
        stdin,
        stdout: receiver(stdout_ours)?,
        stderr: receiver(stderr_ours)?,
    })
}

/// A child held by its pidfd: readable once it exits; killed and reaped when dropped, as
/// tokio's `kill_on_drop` does for the other kind. An adopted process (not our child) is
/// only watched and killed: its own parent reaps it.
struct PidfdChild {
    pidfd: AsyncFd<OwnedFd>,
    reaped: bool,
    ours: bool,
}

impl PidfdChild {
    fn new(pidfd: OwnedFd) -> io::Result<Self> {
        Ok(Self {
            pidfd: airlock_sys::process::async_owned_fd(pidfd, tokio::io::Interest::READABLE)?,
            reaped: false,
            ours: true,
        })
    }

    fn adopted(pidfd: OwnedFd) -> io::Result<Self> {
        let mut child = Self::new(pidfd)?;
        child.ours = false;
        Ok(child)
    }

    /// Reaps the child if it has exited (blocking until it has when `block`); true once
    /// it is reaped (for an adopted process: once it has exited).
    fn reap(&mut self, block: bool) -> bool {
        if self.reaped {
            return true;
        }
        if !self.ours {
            let mut fds = [rustix::event::PollFd::new(
                self.pidfd.get_ref(),
                rustix::event::PollFlags::IN,
            )];
            let timeout = (!block).then_some(rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            });
            // Readable (or an error on the pidfd): the process has exited.
            self.reaped = !matches!(rustix::event::poll(&mut fds, timeout.as_ref()), Ok(0));
            return self.reaped;
        }
        let mut options = WaitIdOptions::EXITED;
        if !block {
            options |= WaitIdOptions::NOHANG;
        }
        match rustix::process::waitid(WaitId::PidFd(self.pidfd.get_ref().as_fd()), options) {
            Ok(Some(_)) => self.reaped = true,
            Ok(None) => {}
            // ECHILD: reaped already; anything else: nothing more can be learnt.
            Err(_) => self.reaped = true,
        }
        self.reaped
    }

    async fn wait(&mut self) {
        while !self.reap(false) {
            match self.pidfd.readable().await {
                // Readable means exited; the next reap confirms it.
                Ok(mut guard) => guard.clear_ready(),
                Err(_) => {
                    self.reap(true);
                    return;
                }
            }
        }
    }

    fn kill(&mut self) {
        if !self.reaped {
            let _ = rustix::process::pidfd_send_signal(self.pidfd.get_ref(), Signal::KILL);
        }
    }
}

impl Drop for PidfdChild {
    fn drop(&mut self) {
        if self.reap(false) {
            return;
        }
        self.kill();
        if self.reap(false) || !self.ours {
            return;
        }
        // Dying after SIGKILL takes a moment; reap it off this thread rather than block.
        let raw = self.pidfd.get_ref().as_raw_fd();
        match rustix::io::fcntl_dupfd_cloexec(self.pidfd.get_ref(), 0) {
            Ok(dup) => {
                let _ = std::thread::Builder::new()
                    .name("airlock-reap".into())
                    .spawn(move || {
                        let _ = rustix::process::waitid(
                            WaitId::PidFd(dup.as_fd()),
                            WaitIdOptions::EXITED,
                        );
                    });
            }
            Err(e) => tracing::warn!(pidfd = raw, error = %e, "cannot reap a killed helper"),
        }
    }
}
