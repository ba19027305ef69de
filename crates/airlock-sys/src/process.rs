//! Process creation and replacement: fork, unshare, execve, signal reset, fd hygiene.
//!
//! `fork` and `unshare` are only sound in a single-threaded process (a forked child of a
//! multithreaded parent may deadlock on a lock another thread held). Rather than make the
//! caller promise it, each checks `/proc/self/task` and refuses otherwise: a single thread
//! cannot become multithreaded behind its own back, so the check cannot race.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
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
pub fn pass_fds(cmd: &mut Command, fds: &[(&OwnedFd, RawFd)]) -> io::Result<PassedFds> {
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
        let guard = pass_fds(&mut cmd, &[(&writer, 7)]).unwrap();
        let status = cmd.status().unwrap();
        drop(guard);
        drop(writer);
        assert!(status.success());
        let mut buf = [0u8; 16];
        let n = rustix::io::read(&reader, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hi\n");
    }
}
