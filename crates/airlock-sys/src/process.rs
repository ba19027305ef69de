//! Process creation and replacement: fork, unshare, execve, signal reset, fd hygiene.
//!
//! `fork` and `unshare` are only sound in a single-threaded process (a forked child of a
//! multithreaded parent may deadlock on a lock another thread held). Rather than make the
//! caller promise it, each checks `/proc/self/task` and refuses otherwise: a single thread
//! cannot become multithreaded behind its own back, so the check cannot race.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::process::Command;

use rustix::process::Pid;

/// The result of [`fork`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fork {
    /// In the child.
    Child,
    /// In the parent; the child's pid.
    Parent(Pid),
}

/// Number of threads of the calling process.
pub fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

fn require_single_thread(operation: &str) -> io::Result<()> {
    let threads = thread_count()?;
    if threads != 1 {
        return Err(io::Error::other(format!(
            "{operation} needs a single-threaded process, this one has {threads} threads"
        )));
    }
    Ok(())
}

/// `fork()`, refused unless the process is single-threaded.
pub fn fork() -> io::Result<Fork> {
    require_single_thread("fork")?;
    // SAFETY: the process has exactly one thread (checked above, and only this thread could
    // have started another), so the child inherits no lock held by a vanished thread and may
    // run arbitrary code, allocation included.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Fork::Child),
        pid => Pid::from_raw(pid)
            .map(Fork::Parent)
            .ok_or_else(|| io::Error::other("fork returned an invalid pid")),
    }
}

/// Namespace flags accepted by [`unshare_namespaces`].
pub use rustix::thread::UnshareFlags;

/// `unshare(flags)` for namespace flags only, refused unless the process is single-threaded.
pub fn unshare_namespaces(flags: UnshareFlags) -> io::Result<()> {
    let namespaces = UnshareFlags::NEWUSER
        | UnshareFlags::NEWNS
        | UnshareFlags::NEWPID
        | UnshareFlags::NEWNET
        | UnshareFlags::NEWIPC
        | UnshareFlags::NEWUTS
        | UnshareFlags::NEWCGROUP
        | UnshareFlags::NEWTIME;
    if !namespaces.contains(flags) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    require_single_thread("unshare")?;
    // SAFETY: only namespace flags are passed (checked above), never CLONE_FILES, CLONE_FS
    // or CLONE_SYSVSEM, whose effects on shared state other threads could observe; and the
    // process is single-threaded.
    unsafe { rustix::thread::unshare_unsafe(flags) }.map_err(io::Error::from)
}

/// Ends the process at once, without running destructors or atexit handlers (`_exit`).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit is always safe to call; it never returns.
    unsafe { libc::_exit(code) }
}

/// `execve(path, argv, envp)`. Returns only on failure.
pub fn execve(path: &CStr, argv: &[CString], envp: &[CString]) -> io::Error {
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|e| e.as_ptr()).collect();
    envp_ptrs.push(std::ptr::null());
    // SAFETY: path, every argv and envp entry are valid NUL-terminated strings that outlive
    // the call, and both pointer arrays are NULL-terminated.
    unsafe { libc::execve(path.as_ptr(), argv_ptrs.as_ptr(), envp_ptrs.as_ptr()) };
    io::Error::last_os_error()
}

/// Restores default dispositions for every catchable signal and unblocks all signals.
///
/// Ignored dispositions and the blocked mask survive `execve`; Rust's runtime ignores
/// `SIGPIPE`, which would otherwise leak into the job (`yes | head` would never end).
pub fn reset_signals() -> io::Result<()> {
    for signal in 1..libc::SIGRTMAX() {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: installing SIG_DFL has no memory-safety preconditions; glibc-reserved
        // real-time signals may refuse with EINVAL, which is ignored.
        unsafe { libc::signal(signal, libc::SIG_DFL) };
    }
    // SAFETY: an all-zero sigset is a valid empty set; sigemptyset initialises it anyway.
    let mut empty: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `empty` is a valid, writable sigset_t.
    unsafe { libc::sigemptyset(&mut empty) };
    // SAFETY: `empty` is initialised; the old-set pointer may be NULL.
    let rc = unsafe { libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Marks every file descriptor from `first` upwards close-on-exec (`close_range` with
/// `CLOSE_RANGE_CLOEXEC`), so nothing but stdio crosses into the job.
pub fn set_cloexec_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on descriptors; it
    // closes nothing, so no Rust owner is invalidated.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Arranges for `cmd`'s child to receive each `(fd, target)` as descriptor number `target`.
///
/// The sources are first duplicated above every target number, so a source that happens
/// to sit on another pair's target cannot be clobbered. The duplicates are owned by the
/// returned guard, which must live until the child is spawned.
pub fn pass_fds(cmd: &mut Command, fds: &[(BorrowedFd<'_>, RawFd)]) -> io::Result<PassedFds> {
    use std::os::unix::process::CommandExt;
    let floor = fds.iter().map(|(_, t)| *t).max().unwrap_or(2) + 1;
    let mut held = Vec::with_capacity(fds.len());
    let mut pairs: Vec<(RawFd, RawFd)> = Vec::with_capacity(fds.len());
    for (fd, target) in fds {
        let high = rustix::io::fcntl_dupfd_cloexec(fd, floor)?;
        pairs.push((high.as_raw_fd(), *target));
        held.push(high);
    }
    // SAFETY: the closure runs in the child between fork and exec and only calls dup2,
    // which is async-signal-safe; it allocates nothing (`pairs` was built before fork).
    unsafe {
        cmd.pre_exec(move || {
            for (source, target) in &pairs {
                if libc::dup2(*source, *target) == -1 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    Ok(PassedFds { _held: held })
}

/// Keeps the duplicated descriptors of [`pass_fds`] open until the child is spawned.
#[derive(Debug)]
pub struct PassedFds {
    _held: Vec<OwnedFd>,
}

/// CPU time and peak resident size of the terminated children this process has waited
/// for (`getrusage(RUSAGE_CHILDREN)`): user plus system time, and the largest child's peak.
pub fn children_usage() -> io::Result<(std::time::Duration, u64)> {
    // SAFETY: rusage is a plain C struct for which all-zero bytes are a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage that outlives the call.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let micros = |t: libc::timeval| {
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_usec).unwrap_or(0)
    };
    let cpu = std::time::Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime));
    // ru_maxrss is in KiB on Linux.
    let max_rss_bytes = u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024;
    Ok((cpu, max_rss_bytes))
}

static CLAIMED_FDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Takes ownership of a descriptor this process inherited at a known number (0..64), and
/// marks it close-on-exec. Each number can be claimed once per process, so two owners of
/// the same descriptor cannot arise.
pub fn claim_inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    use std::os::fd::{BorrowedFd, FromRawFd};
    use std::sync::atomic::Ordering;
    if !(0..64).contains(&fd) {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    let bit = 1u64 << fd;
    if CLAIMED_FDS.fetch_or(bit, Ordering::SeqCst) & bit != 0 {
        return Err(io::Error::other(format!(
            "descriptor {fd} was already claimed"
        )));
    }
    // SAFETY: fcntl(F_GETFD) on any number is harmless; it only tells whether it is open.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor is open (checked above) and no other owner exists: it was
    // inherited, std does not own numbers above 2, and CLAIMED_FDS lets it be claimed once.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `owned` keeps the descriptor open for the borrow's lifetime.
    let borrowed = unsafe { BorrowedFd::borrow_raw(owned.as_raw_fd()) };
    rustix::io::fcntl_setfd(borrowed, rustix::io::FdFlags::CLOEXEC)?;
    Ok(owned)
}

/// Removes every capability from the bounding set (`PR_CAPBSET_DROP` for each number up
/// to the kernel's last), so no later exec can regain one. Needs `CAP_SETPCAP`.
pub fn drop_bounding_set() -> io::Result<()> {
    for cap in 0..64 {
        // SAFETY: PR_CAPBSET_DROP takes an integer and touches no memory of ours.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            // EINVAL: past the last capability this kernel knows.
            if err.raw_os_error() == Some(libc::EINVAL) {
                return Ok(());
            }
            return Err(err);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unshare_refuses_non_namespace_flags() {
        let err = unshare_namespaces(UnshareFlags::FILES).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn fork_refuses_in_a_multithreaded_process() {
        let _thread = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_secs(2)));
        let err = fork().unwrap_err();
        assert!(err.to_string().contains("single-threaded"), "{err}");
    }

    #[test]
    fn passed_fds_arrive_at_their_numbers() {
        let (reader, writer) = rustix::pipe::pipe().unwrap();
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("echo hi >&7");
        let guard = pass_fds(&mut cmd, &[(std::os::fd::AsFd::as_fd(&writer), 7)]).unwrap();
        let status = cmd.status().unwrap();
        drop(guard);
        drop(writer);
        assert!(status.success());
        let mut buf = [0u8; 16];
        let n = rustix::io::read(&reader, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hi\n");
    }
}

/// What [`spawn_into_cgroup`] starts: a program, its arguments and environment, its
/// working directory, and the descriptors it gets at given numbers (stdio included).
#[derive(Debug)]
pub struct SpawnRequest<'a> {
    /// The program to execute.
    pub program: &'a CStr,
    /// Its arguments, `argv[0]` first.
    pub argv: &'a [CString],
    /// Its whole environment.
    pub envp: &'a [CString],
    /// Its working directory.
    pub cwd: &'a CStr,
    /// `(source, target)`: the child gets `source` as descriptor number `target`. Every
    /// other descriptor of this process is close-on-exec (Rust opens everything so).
    pub fds: &'a [(std::os::fd::BorrowedFd<'a>, RawFd)],
}

/// A child started by [`spawn_into_cgroup`].
#[derive(Debug)]
pub struct Spawned {
    /// Its pid.
    pub pid: Pid,
    /// A pidfd for it: readable once it exits; waits and signals go through it, so they
    /// can never reach a recycled pid.
    pub pidfd: OwnedFd,
}

/// Why [`spawn_into_cgroup`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// `clone3` with `CLONE_INTO_CGROUP` is not available here (kernel before 5.7, a
    /// seccomp filter of a container runtime answering `ENOSYS`, a cgroup v1 descriptor):
    /// nothing was started, and the caller may start the child another way.
    #[error("clone3 into a cgroup is not available")]
    Unavailable(#[source] io::Error),
    /// The child was created but could not execute the program (it has been reaped).
    #[error("start the program")]
    Exec(#[source] io::Error),
    /// Preparing the child failed before anything was started.
    #[error("prepare the child")]
    Prepare(#[source] io::Error),
}

/// The kernel's `struct clone_args` (linux/sched.h), as of 5.7 (`cgroup` last).
#[repr(C)]
#[derive(Debug, Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `CLONE_PIDFD` (linux/sched.h).
const CLONE_PIDFD: u64 = 0x1000;
/// `CLONE_INTO_CGROUP` (linux/sched.h, 5.7).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Starts `request` as a child that is a member of the cgroup v2 group `cgroup` from its
/// first instruction (`clone3` with `CLONE_INTO_CGROUP | CLONE_PIDFD`), then executes it.
///
/// Placing a child at creation takes the kernel's cgroup locks for reading only, where
/// moving a process by writing `cgroup.procs` takes `cgroup_threadgroup_rwsem` for writing
/// and waits for an RCU grace period (several milliseconds per job). Safe to call from a
/// multithreaded process: between `clone3` and `execve` the child only duplicates
/// descriptors, resets its signal mask and `SIGPIPE`, changes directory and executes,
/// all async-signal-safe system calls on memory prepared before the clone; it allocates
/// nothing and takes no lock.
pub fn spawn_into_cgroup(
    request: &SpawnRequest<'_>,
    cgroup: std::os::fd::BorrowedFd<'_>,
) -> Result<Spawned, SpawnError> {
    use std::os::fd::FromRawFd;
    // Everything the child touches, built before the clone.
    let mut argv: Vec<*const libc::c_char> = request.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = request.envp.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    // Sources duplicated above every target, so no pair can clobber another's source.
    let floor = request.fds.iter().map(|(_, t)| *t).max().unwrap_or(2) + 1;
    let mut held = Vec::with_capacity(request.fds.len());
    let mut pairs: Vec<(RawFd, RawFd)> = Vec::with_capacity(request.fds.len());
    for (fd, target) in request.fds {
        let high = rustix::io::fcntl_dupfd_cloexec(fd, floor)
            .map_err(|e| SpawnError::Prepare(e.into()))?;
        pairs.push((high.as_raw_fd(), *target));
        held.push(high);
    }
    // The child reports a failure before exec as its errno on this pipe; a successful
    // exec closes it (close-on-exec) with nothing written.
    let (report_read, report_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| SpawnError::Prepare(e.into()))?;
    let report_fd = report_write.as_raw_fd();
    let mut pidfd: RawFd = -1;
    let args = CloneArgs {
        flags: CLONE_PIDFD | CLONE_INTO_CGROUP,
        pidfd: std::ptr::addr_of_mut!(pidfd) as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: u64::try_from(cgroup.as_raw_fd())
            .map_err(|_| SpawnError::Prepare(io::Error::from_raw_os_error(libc::EBADF)))?,
        ..CloneArgs::default()
    };
    let program = request.program.as_ptr();
    let cwd = request.cwd.as_ptr();
    // SAFETY: `args` is a valid clone_args of the size passed, and its pidfd field points
    // at a live i32. Without CLONE_VM the child gets a copy of this address space (fork
    // semantics) and, with stack 0, runs on its copy of this stack; it only runs
    // `exec_child`, which makes async-signal-safe system calls on data built above.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            std::ptr::addr_of!(args),
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if ret == 0 {
        // SAFETY: in the child of clone3; see exec_child.
        unsafe { exec_child(&pairs, cwd, program, &argv, &envp, report_fd) }
    }
    if ret < 0 {
        return Err(SpawnError::Unavailable(io::Error::last_os_error()));
    }
    drop(report_write);
    drop(held);
    let pid = i32::try_from(ret)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| SpawnError::Prepare(io::Error::other("clone3 returned no pid")))?;
    // SAFETY: with CLONE_PIDFD the kernel stored a new descriptor, owned by nobody else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let mut errno = [0u8; 4];
    let mut got = 0;
    while got < errno.len() {
        match rustix::io::read(&report_read, &mut errno[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(SpawnError::Prepare(e.into())),
        }
    }
    if got == 0 {
        return Ok(Spawned { pid, pidfd });
    }
    // The child exits right after reporting: reap it so no zombie is left.
    let _ = rustix::process::waitid(
        rustix::process::WaitId::PidFd(std::os::fd::AsFd::as_fd(&pidfd)),
        rustix::process::WaitIdOptions::EXITED,
    );
    Err(SpawnError::Exec(io::Error::from_raw_os_error(
        i32::from_ne_bytes(errno),
    )))
}

/// The child's side of [`spawn_into_cgroup`]: descriptors into place, signal mask and
/// `SIGPIPE` back to their defaults (Rust's runtime ignores `SIGPIPE`, and ignored
/// dispositions survive exec), working directory, exec. Any failure is written to
/// `report_fd` as an errno and ends the child with status 127.
///
/// # Safety
/// Only in the child of `clone3`/`fork` of a possibly multithreaded process: it calls
/// nothing but async-signal-safe functions and allocates nothing.
unsafe fn exec_child(
    pairs: &[(RawFd, RawFd)],
    cwd: *const libc::c_char,
    program: *const libc::c_char,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    report_fd: RawFd,
) -> ! {
    let fail = |report_fd: RawFd| -> ! {
        // SAFETY: errno location of this (only) thread; write and _exit are
        // async-signal-safe and touch only the 4 bytes on this stack.
        unsafe {
            let errno = *libc::__errno_location();
            let bytes = errno.to_ne_bytes();
            libc::write(report_fd, bytes.as_ptr().cast(), bytes.len());
            libc::_exit(127)
        }
    };
    // SAFETY: each call below is an async-signal-safe system call wrapper; the pointers
    // are to NUL-terminated strings and NULL-terminated arrays built before the clone and
    // still alive in this copy of the address space.
    unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        if libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) != 0 {
            fail(report_fd);
        }
        if libc::signal(libc::SIGPIPE, libc::SIG_DFL) == libc::SIG_ERR {
            fail(report_fd);
        }
        for (source, target) in pairs {
            if libc::dup2(*source, *target) == -1 {
                fail(report_fd);
            }
        }
        if libc::chdir(cwd) != 0 {
            fail(report_fd);
        }
        libc::execve(program, argv.as_ptr(), envp.as_ptr());
        fail(report_fd)
    }
}

/// Registers an owned descriptor (a pidfd) with tokio's reactor, for readiness waits.
///
/// A safe wrapper: tokio requires that the descriptor stays open and the same for the
/// `AsyncFd`'s whole life, which an `OwnedFd` moved into it guarantees.
pub fn async_owned_fd(
    fd: OwnedFd,
    interest: tokio::io::Interest,
) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the AsyncFd takes ownership of `fd`; nothing else can close it or change what
    // its number refers to until the AsyncFd is dropped or into_inner'd.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, interest) }.map_err(|e| e.into())
}
