//! Raw syscalls for the in-sandbox test probe (feature `probe`; never enabled in the airlock
//! binary).
//!
//! [`attempt`] makes one [`DangerousCall`] and reports what the kernel (or the seccomp filter)
//! said. Two rules make this safe to run anywhere, including as root on a host with no sandbox:
//!
//! - **Harmless arguments.** Every call is made with arguments the kernel rejects before it
//!   acts (an empty path, invalid flag bits, a bad magic number, a null pointer), or whose
//!   success changes nothing outside a throwaway process. The comment on each arm of
//!   `perform` says which check stops the call and the errno that check gives when the call
//!   is reached. Where the argument check comes before the privilege check (`umount2`,
//!   `clock_settime`, `settimeofday`, `swapon`, the new mount API), a reached call fails with
//!   `EINVAL`/`ENOENT` even as root, so an `EPERM` can only have come from a filter.
//! - **A forked child per attempt.** The call runs in a freshly forked, single-threaded child
//!   that writes the result to a pipe and `_exit`s. Namespace changes (`unshare`, `clone` with
//!   `CLONE_NEWUSER`, `chroot("/")`, `setuid(0)`) therefore die with the child and never touch
//!   the probe, and a seccomp filter that kills the caller (`SECCOMP_RET_KILL_*`, or `SIGSYS`
//!   from `SECCOMP_RET_TRAP`) shows up as [`Attempt::Killed`] instead of ending the probe.
//!   Between fork and `_exit` the child only makes raw syscalls (async-signal-safe).

use std::os::fd::{AsFd, AsRawFd, RawFd};

use libc::c_long;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::process::{Pid, Signal, WaitOptions};

/// How long one attempt may take before its child is killed.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Upper bound on the life of the process `ptrace_attach` attaches to, should its parent die
/// before killing it.
const PTRACE_TARGET_LIFETIME_SECS: libc::time_t = 10;

/// Flag bits no syscall used here defines: adding them makes the kernel's flag check fail
/// with `EINVAL` before the call does anything.
const INVALID_FLAG_BITS: c_long = 0x4000_0000;

/// Syscall arguments go through C varargs as `long`: never pass a bare `int` literal, whose
/// upper register half is unspecified.
const NO_FD: c_long = -1;
const ZERO: c_long = 0;

/// `kexec_load` flag bit outside `KEXEC_FLAGS` (and with no architecture bits set).
const KEXEC_INVALID_FLAGS: c_long = 0x8000;

/// `LINUX_REBOOT_CMD_*` value that is not a reboot command (the magic is wrong too).
const INVALID_REBOOT_CMD: c_long = 0xDEAD_BEEF;

/// Clock id past the kernel's `MAX_CLOCKS` (16), so `clock_settime` finds no clock.
const INVALID_CLOCK_ID: c_long = 100;

/// `bpf` and `keyctl` command number that no kernel defines.
const INVALID_COMMAND: c_long = 0x7fff_0000;

/// `UFFD_USER_MODE_ONLY`: lets an unprivileged `userfaultfd` past its permission check, so a
/// reached call fails on the invalid flag bits instead (`EINVAL`, not `EPERM`).
const UFFD_USER_MODE_ONLY: c_long = 1;

/// Size of `struct clone_args` in its first version (`CLONE_ARGS_SIZE_VER0`).
const CLONE_ARGS_SIZE_VER0: usize = 64;

/// A syscall the probe tries. Most must be denied inside the sandbox; `SocketInetStream` and
/// `Getpid` are controls that must work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DangerousCall {
    /// `mount(NULL, "", NULL, 0, NULL)`: the empty target never resolves (`ENOENT`).
    Mount,
    /// `umount2("", invalid flags)`: `EINVAL` before any lookup or privilege check.
    Umount2,
    /// `pivot_root("", "")`: `ENOENT` as root, `EPERM` without `CAP_SYS_ADMIN`.
    PivotRoot,
    /// `fsopen("airlock-probe-nofs", invalid flags)`: `EINVAL` (new mount API).
    Fsopen,
    /// `fsmount(-1, invalid flags, 0)`: `EINVAL` (new mount API).
    Fsmount,
    /// `open_tree(-1, "", invalid flags)`: `EINVAL` (new mount API).
    OpenTree,
    /// `move_mount(-1, "", -1, "", invalid flags)`: `EINVAL` (new mount API).
    MoveMount,
    /// `mount_setattr(-1, "", 0, NULL, 0)`: `EINVAL` (attribute size 0).
    MountSetattr,
    /// `unshare(CLONE_NEWUSER)` in the throwaway child: succeeds on most hosts.
    UnshareUser,
    /// `unshare(CLONE_NEWNS)` in the throwaway child: succeeds as root.
    UnshareMount,
    /// `setns(-1, 0)`: `EBADF`.
    Setns,
    /// `clone(CLONE_NEWUSER | SIGCHLD)`: the grandchild `_exit(0)`s at once; returns its pid.
    CloneNewuser,
    /// `clone3` with `CLONE_NEWUSER` (seccomp cannot read clone3's flags, so a filter that
    /// means to stop new namespaces must deny clone3 outright, usually with `ENOSYS`).
    Clone3Newuser,
    /// `ptrace(PTRACE_ATTACH, pid)` on a throwaway grandchild that only sleeps. Never pid 1:
    /// run as root on a host, that would attach to the real init.
    PtraceAttach,
    /// `bpf(invalid cmd, NULL, 0)`: `EINVAL`.
    Bpf,
    /// `keyctl(invalid operation)`: `EOPNOTSUPP`.
    Keyctl,
    /// `add_key("airlock_probe", "airlock-probe", NULL, 0, 0)`: keyring id 0 is `EINVAL`.
    AddKey,
    /// `io_uring_setup(0, NULL)`: `EFAULT` or `EINVAL`.
    IoUringSetup,
    /// `perf_event_open(NULL, -1, -1, -1, 0)`: `EFAULT`.
    PerfEventOpen,
    /// `userfaultfd(UFFD_USER_MODE_ONLY | invalid flags)`: `EINVAL`.
    Userfaultfd,
    /// `kexec_load(0, u32::MAX segments, NULL, invalid flags)`: `EINVAL` as root, `EPERM`
    /// otherwise. (Zero segments would unload a loaded kernel: never used.)
    KexecLoad,
    /// `kexec_file_load(-1, -1, 0, NULL, invalid flags)`: `EINVAL` as root, `EPERM` otherwise.
    KexecFileLoad,
    /// `init_module(NULL, 0, "")`: a zero-length image is `ENOEXEC` as root.
    InitModule,
    /// `finit_module(-1, "", invalid flags)`: `EINVAL` as root.
    FinitModule,
    /// `open_by_handle_at(-1, NULL, O_RDONLY)`: `EBADF`/`EFAULT` as root, `EPERM` otherwise.
    OpenByHandleAt,
    /// `clock_settime(100, {0, -1})`: no such clock, `EINVAL` for everyone.
    ClockSettime,
    /// `settimeofday({0, -1}, NULL)`: invalid microseconds, `EINVAL` for everyone.
    Settimeofday,
    /// `reboot(0, 0, invalid cmd, NULL)`: bad magic, `EINVAL` as root, `EPERM` otherwise.
    Reboot,
    /// `swapon("", invalid flags)`: `EINVAL` before the privilege check.
    Swapon,
    /// `acct("")`: `ENOENT` as root, `EPERM` otherwise. (`acct(NULL)` would turn accounting
    /// off: never used.)
    Acct,
    /// `chroot("/")` in the throwaway child: succeeds as root, changes nothing that lasts.
    Chroot,
    /// `socket(AF_PACKET, SOCK_RAW, 0)`: protocol 0 receives no packets; closed on exit.
    SocketPacketRaw,
    /// `socket(AF_INET, SOCK_RAW, IPPROTO_ICMP)`.
    SocketInetRawIcmp,
    /// `socket(AF_INET, SOCK_STREAM, 0)`: must work.
    SocketInetStream,
    /// `getpid()`: must work.
    Getpid,
    /// `setuid(0)` in the throwaway child: must fail inside the sandbox.
    Setuid0,
    /// `setgid(0)` in the throwaway child: must fail inside the sandbox.
    Setgid0,
}

impl DangerousCall {
    /// Every call, in report order.
    pub const ALL: &'static [DangerousCall] = &[
        Self::Mount,
        Self::Umount2,
        Self::PivotRoot,
        Self::Fsopen,
        Self::Fsmount,
        Self::OpenTree,
        Self::MoveMount,
        Self::MountSetattr,
        Self::UnshareUser,
        Self::UnshareMount,
        Self::Setns,
        Self::CloneNewuser,
        Self::Clone3Newuser,
        Self::PtraceAttach,
        Self::Bpf,
        Self::Keyctl,
        Self::AddKey,
        Self::IoUringSetup,
        Self::PerfEventOpen,
        Self::Userfaultfd,
        Self::KexecLoad,
        Self::KexecFileLoad,
        Self::InitModule,
        Self::FinitModule,
        Self::OpenByHandleAt,
        Self::ClockSettime,
        Self::Settimeofday,
        Self::Reboot,
        Self::Swapon,
        Self::Acct,
        Self::Chroot,
        Self::SocketPacketRaw,
        Self::SocketInetRawIcmp,
        Self::SocketInetStream,
        Self::Getpid,
        Self::Setuid0,
        Self::Setgid0,
    ];

    /// The call's stable snake_case name, used as its key in the probe's report.
    pub fn name(self) -> &'static str {
        match self {
            Self::Mount => "mount",
            Self::Umount2 => "umount2",
            Self::PivotRoot => "pivot_root",
            Self::Fsopen => "fsopen",
            Self::Fsmount => "fsmount",
            Self::OpenTree => "open_tree",
            Self::MoveMount => "move_mount",
            Self::MountSetattr => "mount_setattr",
            Self::UnshareUser => "unshare_newuser",
            Self::UnshareMount => "unshare_newns",
            Self::Setns => "setns",
            Self::CloneNewuser => "clone_newuser",
            Self::Clone3Newuser => "clone3_newuser",
            Self::PtraceAttach => "ptrace_attach",
            Self::Bpf => "bpf",
            Self::Keyctl => "keyctl",
            Self::AddKey => "add_key",
            Self::IoUringSetup => "io_uring_setup",
            Self::PerfEventOpen => "perf_event_open",
            Self::Userfaultfd => "userfaultfd",
            Self::KexecLoad => "kexec_load",
            Self::KexecFileLoad => "kexec_file_load",
            Self::InitModule => "init_module",
            Self::FinitModule => "finit_module",
            Self::OpenByHandleAt => "open_by_handle_at",
            Self::ClockSettime => "clock_settime",
            Self::Settimeofday => "settimeofday",
            Self::Reboot => "reboot",
            Self::Swapon => "swapon",
            Self::Acct => "acct",
            Self::Chroot => "chroot",
            Self::SocketPacketRaw => "socket_packet_raw",
            Self::SocketInetRawIcmp => "socket_inet_raw_icmp",
            Self::SocketInetStream => "socket_inet_stream",
            Self::Getpid => "getpid",
            Self::Setuid0 => "setuid_0",
            Self::Setgid0 => "setgid_0",
        }
    }
}

/// What happened to one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The syscall returned this (non-negative) value.
    Returned(i64),
    /// The syscall failed with this errno.
    Failed(Errno),
    /// The child making the call was killed by this signal (e.g. `SIGSYS` from seccomp).
    Killed(i32),
    /// The child did not report within [`ATTEMPT_TIMEOUT`] and was killed.
    TimedOut,
    /// The probe could not set the attempt up or collect its result.
    Harness {
        /// The step that failed.
        step: &'static str,
        /// Its errno.
        errno: Errno,
    },
}

/// Makes `call` in a forked child and reports the result. Never changes the calling process.
pub fn attempt(call: DangerousCall) -> Attempt {
    let (reader, writer) = match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
        Ok(pipe) => pipe,
        Err(errno) => {
            return Attempt::Harness {
                step: "pipe",
                errno,
            };
        }
    };
    let report_fd = writer.as_raw_fd();
    // SAFETY: the child runs only `child_main`, which makes raw syscalls, writes to the pipe
    // and `_exit`s: it is async-signal-safe, allocates nothing, takes no lock and never
    // returns, so forking from a multi-threaded process (e.g. a test harness) is sound.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        child_main(call, report_fd);
    }
    if pid < 0 {
        return Attempt::Harness {
            step: "fork",
            errno: errno_from_raw(i64::from(last_errno())),
        };
    }
    drop(writer);
    // Checked above: never -1 (which `kill` and `waitpid` would read as "every process").
    let Some(child) = Pid::from_raw(pid) else {
        return Attempt::Harness {
            step: "fork",
            errno: Errno::INVAL,
        };
    };
    let report = read_report(&reader, child);
    let status = reap(child);
    match report {
        ReadOutcome::Report(report) => report.into_attempt(),
        ReadOutcome::TimedOut => Attempt::TimedOut,
        ReadOutcome::Failed(errno) => Attempt::Harness {
            step: "read report",
            errno,
        },
        ReadOutcome::Eof => match status {
            Ok(Some(signal)) => Attempt::Killed(signal),
            Ok(None) => Attempt::Harness {
                step: "read report",
                errno: Errno::IO,
            },
            Err(errno) => Attempt::Harness {
                step: "waitpid",
                errno,
            },
        },
    }
}

/// Sets `SIGXFSZ` to ignored, so a write past `RLIMIT_FSIZE` fails with `EFBIG` instead of
/// killing the probe.
pub fn ignore_sigxfsz() -> Result<(), Errno> {
    // SAFETY: `SIG_IGN` installs no handler code; changing the disposition of SIGXFSZ affects
    // only how this process reacts to exceeding RLIMIT_FSIZE.
    let previous = unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    if previous == libc::SIG_ERR {
        return Err(errno_from_raw(i64::from(last_errno())));
    }
    Ok(())
}

/// The fixed-size record the child writes: which step it reports, the return value, errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Report {
    step: i64,
    ret: i64,
    errno: i64,
}

/// `Report::step` for the call itself.
const STEP_CALL: i64 = 0;
/// `Report::step` when the child could not fork the process `ptrace_attach` targets.
const STEP_FORK_TARGET: i64 = 1;

const REPORT_LEN: usize = 24;

impl Report {
    fn call(ret: c_long) -> Self {
        let errno = if ret < 0 { last_errno() } else { 0 };
        Self {
            step: STEP_CALL,
            ret,
            errno: i64::from(errno),
        }
    }

    fn to_bytes(self) -> [u8; REPORT_LEN] {
        let mut bytes = [0u8; REPORT_LEN];
        let fields = [self.step, self.ret, self.errno];
        let mut index = 0;
        while index < fields.len() {
            let field = fields[index].to_ne_bytes();
            let mut byte = 0;
            while byte < field.len() {
                bytes[index * 8 + byte] = field[byte];
                byte += 1;
            }
            index += 1;
        }
        bytes
    }

    fn from_bytes(bytes: &[u8; REPORT_LEN]) -> Self {
        let field = |index: usize| {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(&bytes[index * 8..index * 8 + 8]);
            i64::from_ne_bytes(raw)
        };
        Self {
            step: field(0),
            ret: field(1),
            errno: field(2),
        }
    }

    fn into_attempt(self) -> Attempt {
        let errno = errno_from_raw(self.errno);
        match self.step {
            STEP_CALL if self.ret >= 0 => Attempt::Returned(self.ret),
            STEP_CALL => Attempt::Failed(errno),
            STEP_FORK_TARGET => Attempt::Harness {
                step: "fork ptrace target",
                errno,
            },
            _ => Attempt::Harness {
                step: "decode report",
                errno: Errno::INVAL,
            },
        }
    }
}

enum ReadOutcome {
    Report(Report),
    Eof,
    TimedOut,
    Failed(Errno),
}

/// Reads the child's report, waiting at most [`ATTEMPT_TIMEOUT`]; kills the child on timeout.
fn read_report(reader: &impl AsFd, child: Pid) -> ReadOutcome {
    let deadline = Instant::now() + ATTEMPT_TIMEOUT;
    let mut bytes = [0u8; REPORT_LEN];
    let mut filled = 0;
    while filled < REPORT_LEN {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = Timespec {
            tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [PollFd::new(reader, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) => {
                // The child is ours and not yet reaped, so the pid cannot have been reused.
                let _ = rustix::process::kill_process(child, Signal::KILL);
                return ReadOutcome::TimedOut;
            }
            Ok(_) => {}
            Err(Errno::INTR) => continue,
            Err(errno) => return ReadOutcome::Failed(errno),
        }
        match rustix::io::read(reader, &mut bytes[filled..]) {
            Ok(0) => return ReadOutcome::Eof,
            Ok(n) => filled += n,
            Err(Errno::INTR) => {}
            Err(errno) => return ReadOutcome::Failed(errno),
        }
    }
    ReadOutcome::Report(Report::from_bytes(&bytes))
}

/// Waits for `child` to end; returns the signal that killed it, if one did.
fn reap(child: Pid) -> Result<Option<i32>, Errno> {
    loop {
        match rustix::process::waitpid(Some(child), WaitOptions::empty()) {
            Ok(Some((_, status))) if status.exited() || status.signaled() => {
                return Ok(status.terminating_signal());
            }
            Ok(_) | Err(Errno::INTR) => {}
            Err(errno) => return Err(errno),
        }
    }
}

/// A valid `Errno` (1..=4095) from a raw number, `EIO` for anything else.
fn errno_from_raw(raw: i64) -> Errno {
    match i32::try_from(raw) {
        Ok(raw @ 1..=4095) => Errno::from_raw_os_error(raw),
        _ => Errno::IO,
    }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// The forked child: make the call, write the report, `_exit`. Async-signal-safe.
fn child_main(call: DangerousCall, report_fd: RawFd) -> ! {
    let bytes = perform(call, report_fd).to_bytes();
    let mut written = 0;
    while written < REPORT_LEN {
        // SAFETY: `bytes` is a live local array and `written < REPORT_LEN`, so the pointer and
        // length describe initialised memory we own; `report_fd` is the pipe's write end,
        // inherited from the parent and still open in this child.
        let n = unsafe {
            libc::write(
                report_fd,
                bytes.as_ptr().add(written).cast(),
                REPORT_LEN - written,
            )
        };
        if n > 0 {
            written += n.unsigned_abs();
        } else if n < 0 && last_errno() == libc::EINTR {
            continue;
        } else {
            break;
        }
    }
    // SAFETY: `_exit` ends this forked child without running atexit handlers, flushing stdio
    // buffers or dropping values: all of those belong to the parent.
    unsafe { libc::_exit(0) }
}

/// Makes `call` with harmless arguments. Runs in the forked child: async-signal-safe only.
fn perform(call: DangerousCall, report_fd: RawFd) -> Report {
    let null = std::ptr::null::<libc::c_void>();
    let empty = c"".as_ptr();
    match call {
        DangerousCall::Mount => {
            // SAFETY: null or NUL-terminated static strings. The empty target never resolves,
            // so the kernel fails the lookup (ENOENT) before any mount code runs; type and
            // source are null, so nothing could be mounted even if it did resolve.
            Report::call(unsafe { libc::syscall(libc::SYS_mount, null, empty, null, ZERO, null) })
        }
        DangerousCall::Umount2 => {
            // SAFETY: static string; umount2 rejects unknown flag bits (EINVAL) first thing.
            Report::call(unsafe { libc::syscall(libc::SYS_umount2, empty, INVALID_FLAG_BITS) })
        }
        DangerousCall::PivotRoot => {
            // SAFETY: static strings; empty paths never resolve (ENOENT), and without
            // CAP_SYS_ADMIN the call stops earlier (EPERM).
            Report::call(unsafe { libc::syscall(libc::SYS_pivot_root, empty, empty) })
        }
        DangerousCall::Fsopen => {
            // SAFETY: static string; unknown flag bits fail (EINVAL) before the filesystem
            // type is looked up, and an fs context mounts nothing by itself.
            Report::call(unsafe {
                libc::syscall(
                    libc::SYS_fsopen,
                    c"airlock-probe-nofs".as_ptr(),
                    INVALID_FLAG_BITS,
                )
            })
        }
        DangerousCall::Fsmount => {
            // SAFETY: no pointers; fd -1 and unknown flag bits (EINVAL).
            Report::call(unsafe {
                libc::syscall(libc::SYS_fsmount, NO_FD, INVALID_FLAG_BITS, ZERO)
            })
        }
        DangerousCall::OpenTree => {
            // SAFETY: static string; unknown flag bits fail first (EINVAL).
            Report::call(unsafe {
                libc::syscall(libc::SYS_open_tree, NO_FD, empty, INVALID_FLAG_BITS)
            })
        }
        DangerousCall::MoveMount => {
            // SAFETY: static strings; fds -1 and unknown flag bits (EINVAL).
            Report::call(unsafe {
                libc::syscall(
                    libc::SYS_move_mount,
                    NO_FD,
                    empty,
                    NO_FD,
                    empty,
                    INVALID_FLAG_BITS,
                )
            })
        }
        DangerousCall::MountSetattr => {
            // SAFETY: static string and null attr with size 0, below MOUNT_ATTR_SIZE_VER0
            // (EINVAL); fd -1.
            Report::call(unsafe {
                libc::syscall(libc::SYS_mount_setattr, NO_FD, empty, ZERO, null, ZERO)
            })
        }
        DangerousCall::UnshareUser => {
            // SAFETY: no pointers; the new user namespace belongs to this throwaway child.
            Report::call(unsafe {
                libc::syscall(libc::SYS_unshare, c_long::from(libc::CLONE_NEWUSER))
            })
        }
        DangerousCall::UnshareMount => {
            // SAFETY: no pointers; the new mount namespace belongs to this throwaway child.
            Report::call(unsafe {
                libc::syscall(libc::SYS_unshare, c_long::from(libc::CLONE_NEWNS))
            })
        }
        DangerousCall::Setns => {
            // SAFETY: no pointers; fd -1 is never a namespace (EBADF).
            Report::call(unsafe { libc::syscall(libc::SYS_setns, NO_FD, ZERO) })
        }
        DangerousCall::CloneNewuser => {
            let flags = c_long::from(libc::CLONE_NEWUSER | libc::SIGCHLD);
            // SAFETY: stack 0 gives fork semantics (the grandchild runs on a copy of this
            // stack); the tid and tls pointers are unused without their CLONE_* flags.
            let ret = unsafe { libc::syscall(libc::SYS_clone, flags, ZERO, ZERO, ZERO, ZERO) };
            finish_clone(ret)
        }
        DangerousCall::Clone3Newuser => {
            let args = CloneArgs {
                flags: libc::CLONE_NEWUSER as u64,
                exit_signal: libc::SIGCHLD as u64,
                ..CloneArgs::default()
            };
            // SAFETY: `args` is a live, fully initialised `struct clone_args` (version 0
            // layout) of the size passed; stack 0 gives fork semantics.
            let ret = unsafe {
                libc::syscall(
                    libc::SYS_clone3,
                    std::ptr::from_ref(&args),
                    CLONE_ARGS_SIZE_VER0,
                )
            };
            finish_clone(ret)
        }
        DangerousCall::PtraceAttach => ptrace_throwaway(report_fd),
        DangerousCall::Bpf => {
            // SAFETY: null attr with size 0; the command number does not exist (EINVAL).
            Report::call(unsafe { libc::syscall(libc::SYS_bpf, INVALID_COMMAND, null, ZERO) })
        }
        DangerousCall::Keyctl => {
            // SAFETY: no pointers; the operation does not exist (EOPNOTSUPP).
            Report::call(unsafe {
                libc::syscall(libc::SYS_keyctl, INVALID_COMMAND, ZERO, ZERO, ZERO, ZERO)
            })
        }
        DangerousCall::AddKey => {
            // SAFETY: static strings, null payload of length 0; keyring id 0 is invalid
            // (EINVAL), so no key or keyring is created.
            Report::call(unsafe {
                libc::syscall(
                    libc::SYS_add_key,
                    c"airlock_probe".as_ptr(),
                    c"airlock-probe".as_ptr(),
                    null,
                    ZERO,
                    ZERO,
                )
            })
        }
        DangerousCall::IoUringSetup => {
            // SAFETY: null params (EFAULT) and 0 entries (EINVAL): no ring is created.
            Report::call(unsafe { libc::syscall(libc::SYS_io_uring_setup, ZERO, null) })
        }
        DangerousCall::PerfEventOpen => {
            // SAFETY: null attr: the kernel's copy of it faults (EFAULT).
            Report::call(unsafe {
                libc::syscall(libc::SYS_perf_event_open, null, NO_FD, NO_FD, NO_FD, ZERO)
            })
        }
        DangerousCall::Userfaultfd => {
            // SAFETY: no pointers; unknown flag bits (EINVAL).
            Report::call(unsafe {
                libc::syscall(
                    libc::SYS_userfaultfd,
                    UFFD_USER_MODE_ONLY | INVALID_FLAG_BITS,
                )
            })
        }
        DangerousCall::KexecLoad => {
            // SAFETY: null segments; unknown flag bits and a segment count above
            // KEXEC_SEGMENT_MAX both fail (EINVAL) before anything is loaded or unloaded.
            Report::call(unsafe {
                libc::syscall(
                    libc::SYS_kexec_load,
                    ZERO,
                    c_long::from(u32::MAX),
                    null,
                    KEXEC_INVALID_FLAGS,
                )
            })
        }
        DangerousCall::KexecFileLoad => {
            // SAFETY: fds -1, null cmdline of length 0; unknown flag bits (EINVAL), and
            // KEXEC_FILE_UNLOAD (bit 0) is not set.
            Report::call(unsafe {
                libc::syscall(
                    libc::SYS_kexec_file_load,
                    NO_FD,
                    NO_FD,
                    ZERO,
                    null,
                    INVALID_FLAG_BITS,
                )
            })
        }
        DangerousCall::InitModule => {
            // SAFETY: null image of length 0 (shorter than an ELF header: ENOEXEC); static
            // empty argument string.
            Report::call(unsafe { libc::syscall(libc::SYS_init_module, null, ZERO, empty) })
        }
        DangerousCall::FinitModule => {
            // SAFETY: fd -1, static empty argument string, unknown flag bits (EINVAL).
            Report::call(unsafe {
                libc::syscall(libc::SYS_finit_module, NO_FD, empty, INVALID_FLAG_BITS)
            })
        }
        DangerousCall::OpenByHandleAt => {
            // SAFETY: fd -1 and a null handle: EBADF/EFAULT as root, EPERM otherwise.
            Report::call(unsafe {
                libc::syscall(
                    libc::SYS_open_by_handle_at,
                    NO_FD,
                    null,
                    c_long::from(libc::O_RDONLY),
                )
            })
        }
        DangerousCall::ClockSettime => {
            let time = libc::timespec {
                tv_sec: 0,
                tv_nsec: -1,
            };
            // SAFETY: `time` is a live timespec; the clock id does not exist (EINVAL) and the
            // nanoseconds are invalid too, so no clock is set.
            Report::call(unsafe {
                libc::syscall(
                    libc::SYS_clock_settime,
                    INVALID_CLOCK_ID,
                    std::ptr::from_ref(&time),
                )
            })
        }
        DangerousCall::Settimeofday => {
            let time = libc::timeval {
                tv_sec: 0,
                tv_usec: -1,
            };
            // SAFETY: `time` is a live timeval with invalid microseconds (EINVAL, checked
            // before privilege); the timezone pointer is null, so it is not touched either.
            Report::call(unsafe {
                libc::syscall(libc::SYS_settimeofday, std::ptr::from_ref(&time), null)
            })
        }
        DangerousCall::Reboot => {
            // SAFETY: no pointers used; both magic numbers and the command are invalid
            // (EINVAL as root, EPERM without CAP_SYS_BOOT).
            Report::call(unsafe {
                libc::syscall(libc::SYS_reboot, ZERO, ZERO, INVALID_REBOOT_CMD, null)
            })
        }
        DangerousCall::Swapon => {
            // SAFETY: static empty path; unknown flag bits fail (EINVAL) before anything else.
            Report::call(unsafe { libc::syscall(libc::SYS_swapon, empty, INVALID_FLAG_BITS) })
        }
        DangerousCall::Acct => {
            // SAFETY: static empty path (ENOENT as root, EPERM otherwise); never null, which
            // would switch process accounting off.
            Report::call(unsafe { libc::syscall(libc::SYS_acct, empty) })
        }
        DangerousCall::Chroot => {
            // SAFETY: static path "/"; the changed root belongs to this throwaway child.
            Report::call(unsafe { libc::syscall(libc::SYS_chroot, c"/".as_ptr()) })
        }
        DangerousCall::SocketPacketRaw => {
            // SAFETY: no pointers; protocol 0 receives nothing, the fd closes on `_exit`.
            Report::call(unsafe {
                libc::syscall(
                    libc::SYS_socket,
                    c_long::from(libc::AF_PACKET),
                    c_long::from(libc::SOCK_RAW),
                    ZERO,
                )
            })
        }
        DangerousCall::SocketInetRawIcmp => {
            // SAFETY: no pointers; the fd closes on `_exit`.
            Report::call(unsafe {
                libc::syscall(
                    libc::SYS_socket,
                    c_long::from(libc::AF_INET),
                    c_long::from(libc::SOCK_RAW),
                    c_long::from(libc::IPPROTO_ICMP),
                )
            })
        }
        DangerousCall::SocketInetStream => {
            // SAFETY: no pointers; the fd closes on `_exit`.
            Report::call(unsafe {
                libc::syscall(
                    libc::SYS_socket,
                    c_long::from(libc::AF_INET),
                    c_long::from(libc::SOCK_STREAM),
                    ZERO,
                )
            })
        }
        DangerousCall::Getpid => {
            // SAFETY: getpid takes no arguments and cannot fail.
            Report::call(unsafe { libc::syscall(libc::SYS_getpid) })
        }
        DangerousCall::Setuid0 => {
            // SAFETY: no pointers; a changed uid belongs to this throwaway child. The raw
            // syscall (not libc's setuid) because there are no other threads to broadcast to.
            Report::call(unsafe { libc::syscall(libc::SYS_setuid, ZERO) })
        }
        DangerousCall::Setgid0 => {
            // SAFETY: as for setuid: no pointers, throwaway child, raw syscall.
            Report::call(unsafe { libc::syscall(libc::SYS_setgid, ZERO) })
        }
    }
}

/// `struct clone_args`, version 0 (64 bytes).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
}

const _: () = assert!(std::mem::size_of::<CloneArgs>() == CLONE_ARGS_SIZE_VER0);

/// After a fork-like clone: the new process `_exit`s at once, the caller reaps it.
fn finish_clone(ret: c_long) -> Report {
    if ret == 0 {
        // SAFETY: we are the freshly cloned grandchild; `_exit` ends it without touching
        // anything shared with the parent.
        unsafe { libc::_exit(0) }
    }
    let report = Report::call(ret);
    if ret > 0 {
        reap_raw(ret);
    }
    report
}

/// `ptrace(PTRACE_ATTACH)` on a grandchild that only sleeps, then kill and reap it.
fn ptrace_throwaway(report_fd: RawFd) -> Report {
    // SAFETY: getpid takes no arguments and cannot fail.
    let parent = unsafe { libc::syscall(libc::SYS_getpid) };
    // SAFETY: this child is single-threaded; the grandchild runs only raw syscalls and
    // `_exit`s, as below.
    let target = unsafe { libc::fork() };
    if target < 0 {
        return Report {
            step: STEP_FORK_TARGET,
            ret: -1,
            errno: i64::from(last_errno()),
        };
    }
    if target == 0 {
        let nap = libc::timespec {
            tv_sec: PTRACE_TARGET_LIFETIME_SECS,
            tv_nsec: 0,
        };
        // SAFETY: the grandchild closes its copy of the report pipe (so the probe never
        // waits on it), asks to be killed with its parent, exits at once if the parent is
        // already gone, and otherwise sleeps a bounded time on a live timespec and exits.
        unsafe {
            libc::close(report_fd);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            if c_long::from(libc::getppid()) == parent {
                libc::nanosleep(&nap, std::ptr::null_mut());
            }
            libc::_exit(0)
        }
    }
    let target = c_long::from(target);
    // SAFETY: attaching to our own sleeping child; null addr and data are what
    // PTRACE_ATTACH expects.
    let report = Report::call(unsafe {
        libc::syscall(
            libc::SYS_ptrace,
            c_long::from(libc::PTRACE_ATTACH),
            target,
            std::ptr::null::<libc::c_void>(),
            std::ptr::null::<libc::c_void>(),
        )
    });
    // SAFETY: `target` is our unreaped child, so the pid cannot name another process.
    unsafe { libc::syscall(libc::SYS_kill, target, c_long::from(libc::SIGKILL)) };
    reap_raw(target);
    report
}

/// Waits until child `pid` has ended (stops of a traced child are skipped).
fn reap_raw(pid: c_long) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    loop {
        let mut status = 0;
        // SAFETY: `status` is a live c_int the kernel writes the wait status to.
        let ret = unsafe { libc::waitpid(pid, &mut status, 0) };
        if ret < 0 && last_errno() == libc::EINTR {
            continue;
        }
        if ret < 0 || libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_snake_case() {
        let mut names: Vec<_> = DangerousCall::ALL.iter().map(|call| call.name()).collect();
        assert!(names.iter().all(|name| {
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        }));
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DangerousCall::ALL.len());
    }

    #[test]
    fn report_round_trips_through_bytes() {
        let report = Report {
            step: STEP_FORK_TARGET,
            ret: -1,
            errno: i64::from(libc::EAGAIN),
        };
        assert_eq!(Report::from_bytes(&report.to_bytes()), report);
    }

    #[test]
    fn controls_work() {
        assert!(matches!(
            attempt(DangerousCall::Getpid),
            Attempt::Returned(pid) if pid > 0
        ));
        assert!(matches!(
            attempt(DangerousCall::SocketInetStream),
            Attempt::Returned(fd) if fd >= 0
        ));
    }

    #[test]
    fn argument_checks_come_first() {
        // These fail on their arguments for any caller; EPERM only under a seccomp filter
        // (e.g. a container runtime's default profile).
        for call in [
            DangerousCall::Umount2,
            DangerousCall::ClockSettime,
            DangerousCall::Settimeofday,
            DangerousCall::Swapon,
        ] {
            let result = attempt(call);
            assert!(
                matches!(result, Attempt::Failed(Errno::INVAL | Errno::PERM)),
                "{}: {result:?}",
                call.name()
            );
        }
    }

    #[test]
    fn every_attempt_completes() {
        for &call in DangerousCall::ALL {
            let result = attempt(call);
            assert!(
                !matches!(result, Attempt::TimedOut | Attempt::Harness { .. }),
                "{}: {result:?}",
                call.name()
            );
        }
    }
}
