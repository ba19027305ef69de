//! Installs the builtin seccomp policy for real and checks what the kernel then answers.
//!
//! Seccomp filters and `no_new_privs` installed without TSYNC are per thread, so each test
//! filters a spawned thread only; the rest of the test process stays unfiltered. Every probe
//! uses harmless arguments, so nothing bad happens if a filter failed to apply.

#![cfg(target_arch = "x86_64")]

use airlock_seccomp::CompiledSeccomp;

/// What a raw syscall returned: `Ok(value)` or `Err(errno)`.
type Outcome = Result<libc::c_long, i32>;

fn outcome(ret: libc::c_long) -> Outcome {
    if ret == -1 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(ret)
    }
}

/// Runs `probe` on a fresh thread after installing the builtin policy on it.
fn filtered<T: Send + 'static>(probe: impl FnOnce() -> T + Send + 'static) -> T {
    let compiled = match CompiledSeccomp::builtin() {
        Ok(compiled) => compiled,
        Err(error) => panic!("compile the builtin policy: {error:?}"),
    };
    let thread = std::thread::spawn(move || {
        if let Err(error) = rustix::thread::set_no_new_privs(true) {
            panic!("set no_new_privs: {error}");
        }
        if let Err(error) = airlock_sys::seccomp::install(&compiled) {
            panic!("install the builtin policy: {error:?}");
        }
        probe()
    });
    match thread.join() {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// `clone(flags, 0, 0, 0, 0)`: fork-like. If it ever succeeds, the child exits at once and
/// the parent reaps it.
fn raw_clone(flags: libc::c_long) -> Outcome {
    // SAFETY: a fork-like clone (no CLONE_VM, null stack so the child runs on a copy of this
    // stack); the child only calls the async-signal-safe `_exit`.
    let ret = unsafe { libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0) };
    if ret == 0 {
        // SAFETY: `_exit` in the child ends it without running anything of the parent.
        unsafe { libc::_exit(0) };
    }
    let result = outcome(ret);
    if let Ok(pid) = result {
        let mut status = 0;
        // SAFETY: waits for the child created above; `status` is a valid out pointer.
        unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
    }
    result
}

/// `socket(domain, type, protocol)`, closing the fd if one was created.
fn raw_socket(domain: i32, kind: i32, protocol: i32) -> Outcome {
    // SAFETY: plain socket creation; no pointers.
    let result = outcome(unsafe { libc::syscall(libc::SYS_socket, domain, kind, protocol) });
    if let Ok(fd) = result {
        // SAFETY: closes the fd this function just created.
        unsafe { libc::close(fd as i32) };
    }
    result
}

#[test]
fn builtin_policy_allows_ordinary_calls() {
    let results = filtered(|| {
        // SAFETY: getpid takes no arguments.
        let getpid = outcome(unsafe { libc::syscall(libc::SYS_getpid) });
        let stream = raw_socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        let unix = raw_socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two fds socketpair writes.
        let pair = outcome(unsafe {
            libc::syscall(
                libc::SYS_socketpair,
                libc::AF_UNIX,
                libc::SOCK_STREAM,
                0,
                fds.as_mut_ptr(),
            )
        });
        if pair.is_ok() {
            // SAFETY: closes the two fds socketpair just created.
            unsafe {
                libc::close(fds[0]);
                libc::close(fds[1]);
            }
        }
        let fork = raw_clone(libc::SIGCHLD as libc::c_long);
        // SAFETY: 0xffffffff only queries the persona.
        let persona = outcome(unsafe { libc::syscall(libc::SYS_personality, 0xffff_ffffu32) });
        (getpid, stream, unix, pair, fork, persona)
    });
    let (getpid, stream, unix, pair, fork, persona) = results;
    assert!(getpid.is_ok(), "getpid: {getpid:?}");
    assert!(stream.is_ok(), "socket(AF_INET, SOCK_STREAM): {stream:?}");
    assert!(unix.is_ok(), "socket(AF_UNIX, SOCK_STREAM): {unix:?}");
    assert!(pair.is_ok(), "socketpair(AF_UNIX): {pair:?}");
    assert!(fork.is_ok(), "clone(SIGCHLD): {fork:?}");
    assert!(persona.is_ok(), "personality(query): {persona:?}");
}

#[test]
fn builtin_policy_denies_dangerous_calls_with_eperm() {
    let results = filtered(|| {
        let mut results: Vec<(&str, Outcome)> = Vec::new();
        // SAFETY: null source, target and type: the kernel can only refuse it.
        let mount = unsafe { libc::syscall(libc::SYS_mount, 0usize, 0usize, 0usize, 0, 0usize) };
        results.push(("mount", outcome(mount)));
        // SAFETY: would only affect this thread, which ends after the probe.
        let unshare = unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER) };
        results.push(("unshare(CLONE_NEWUSER)", outcome(unshare)));
        for (name, flag) in [
            ("CLONE_NEWNS", libc::CLONE_NEWNS),
            ("CLONE_NEWCGROUP", libc::CLONE_NEWCGROUP),
            ("CLONE_NEWUTS", libc::CLONE_NEWUTS),
            ("CLONE_NEWIPC", libc::CLONE_NEWIPC),
            ("CLONE_NEWUSER", libc::CLONE_NEWUSER),
            ("CLONE_NEWPID", libc::CLONE_NEWPID),
            ("CLONE_NEWNET", libc::CLONE_NEWNET),
        ] {
            let flags = (flag | libc::SIGCHLD) as libc::c_long;
            results.push((name, raw_clone(flags)));
        }
        results.push((
            "socket(AF_PACKET, SOCK_RAW)",
            raw_socket(libc::AF_PACKET, libc::SOCK_RAW, 0),
        ));
        results.push((
            "socket(AF_INET, SOCK_RAW, ICMP)",
            raw_socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP),
        ));
        results.push((
            "socket(AF_INET6, SOCK_RAW | SOCK_CLOEXEC)",
            raw_socket(libc::AF_INET6, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0),
        ));
        // SAFETY: a null params pointer; the kernel can only refuse it.
        let uring = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1, 0usize) };
        results.push(("io_uring_setup", outcome(uring)));
        // SAFETY: pid 0 and null pointers; the kernel can only refuse it.
        let ptrace = unsafe { libc::syscall(libc::SYS_ptrace, libc::PTRACE_PEEKDATA, 0, 0, 0) };
        results.push(("ptrace", outcome(ptrace)));
        // SAFETY: an invalid fd (-1): without the filter the kernel answers EBADF.
        let tiocsti = unsafe { libc::syscall(libc::SYS_ioctl, -1, libc::TIOCSTI, 0usize) };
        results.push(("ioctl(TIOCSTI)", outcome(tiocsti)));
        // The kernel truncates the request to 32 bits: high bits must not bypass the rule.
        let high = (1u64 << 32) | libc::TIOCSTI;
        // SAFETY: as above, an invalid fd.
        let tiocsti_high = unsafe { libc::syscall(libc::SYS_ioctl, -1, high, 0usize) };
        results.push(("ioctl(TIOCSTI | 1 << 32)", outcome(tiocsti_high)));
        // SAFETY: as above, an invalid fd.
        let tioclinux = unsafe { libc::syscall(libc::SYS_ioctl, -1, libc::TIOCLINUX, 0usize) };
        results.push(("ioctl(TIOCLINUX)", outcome(tioclinux)));
        results
    });
    for (name, result) in results {
        assert_eq!(result, Err(libc::EPERM), "{name}");
    }
}

#[test]
fn builtin_policy_answers_unlisted_calls_with_enosys() {
    let results = filtered(|| {
        let mut results: Vec<(&str, Outcome)> = Vec::new();
        // SAFETY: a null clone_args pointer with size 0; the kernel can only refuse it.
        let clone3 = unsafe { libc::syscall(libc::SYS_clone3, 0usize, 0usize) };
        results.push(("clone3", outcome(clone3)));
        // SAFETY: no such syscall.
        let made_up = unsafe { libc::syscall(999) };
        results.push(("syscall 999", outcome(made_up)));
        // SAFETY: x32 getpid; harmless even where x32 is enabled.
        let x32 = unsafe { libc::syscall(0x4000_0000 | libc::SYS_getpid) };
        results.push(("x32 getpid", outcome(x32)));
        // SAFETY: ADDR_NO_RANDOMIZE would only affect later execs of this thread.
        let persona = unsafe { libc::syscall(libc::SYS_personality, 0x0040000) };
        results.push(("personality(ADDR_NO_RANDOMIZE)", outcome(persona)));
        results.push((
            "socket(AF_BLUETOOTH)",
            raw_socket(libc::AF_BLUETOOTH, libc::SOCK_STREAM, 0),
        ));
        results
    });
    for (name, result) in results {
        assert_eq!(result, Err(libc::ENOSYS), "{name}");
    }
}
