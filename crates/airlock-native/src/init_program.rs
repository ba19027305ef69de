//! The program the sandbox helper executes: the sandbox init (`airlock_init::init::main`)
//! built as its own small static executable (crates/airlock-init, by `build.rs`), carried inside the
//! airlock binary and executed from a sealed memfd, so there is still one file to install.
//!
//! Why not the airlock binary itself, as before: it is about 30 MB, dynamically linked, with
//! some 35,000 relocations to apply; executing it costs about 1.1 ms of CPU and 230 page
//! faults more per job than the 1.3 MB static init here, and about 70 ms per job in the
//! emulated cgroup v2 VM (docs/speed.md). The init is the same code either way (the
//! airlock-init crate, which both the small executable and this crate link), and so is
//! everything it does.
//!
//! Where the kernel refuses to execute a memfd (`vm.memfd_noexec = 2` in airlock's own pid
//! namespace, a security module's policy), the helper is the airlock binary with its hidden
//! init argument, as before: slower, never weaker.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;

use rustix::fs::{MemfdFlags, SealFlags};

/// The sandbox init as a static executable, as `build.rs` built it.
const INIT_EXECUTABLE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/airlock-init"));

/// The memfd's name: what `/proc/<pid>/exe` of a sandbox's helper and init shows
/// (`/memfd:airlock-init (deleted)`).
const MEMFD_NAME: &str = "airlock-init";

/// The memfd sits at this descriptor number or above, clear of the numbers the helper's
/// descriptors are moved to (0 to 6) between fork and exec, which must not overwrite it
/// before it is executed.
const MEMFD_MIN_FD: i32 = 32;

/// The sealed memfd holding the init, and its `/proc/self/fd/N` path.
type Memfd = (OwnedFd, PathBuf);

/// What the helper is started from.
#[derive(Debug)]
pub(crate) struct InitProgram {
    /// The memfd being made, until the first helper needs it.
    making: Mutex<Option<JoinHandle<io::Result<OwnedFd>>>>,
    /// The memfd once made; `None` when it could not be.
    memfd: OnceLock<Option<Memfd>>,
    /// Set once executing the memfd failed where the airlock binary did not.
    memfd_refused: AtomicBool,
    /// The airlock binary, executed with its init argument otherwise.
    airlock: PathBuf,
}

impl InitProgram {
    /// The init in a sealed memfd where the kernel allows one, with `airlock` (this
    /// binary) to fall back on. The memfd (0.4 ms of copying here) is made on a thread of
    /// its own, while the caller goes on preparing its first job.
    pub(crate) fn new(airlock: PathBuf) -> Self {
        let begun = EARLY.lock().ok().and_then(|mut early| early.take());
        let making = begun.or_else(start_making);
        Self {
            making: Mutex::new(making),
            memfd: OnceLock::new(),
            memfd_refused: AtomicBool::new(false),
            airlock,
        }
    }

    /// The memfd, waiting for it to be made the first time.
    fn memfd(&self) -> Option<&Memfd> {
        self.memfd
            .get_or_init(|| {
                let making = self.making.lock().ok().and_then(|mut m| m.take());
                let asked = std::time::Instant::now();
                let made = match making {
                    Some(thread) => thread
                        .join()
                        .unwrap_or_else(|_| Err(io::Error::other("the memfd thread panicked"))),
                    None => seal_init_memfd(),
                };
                tracing::debug!(waited_us = asked.elapsed().as_micros(), "init memfd ready");
                match made {
                    Ok(fd) => {
                        let path = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
                        Some((fd, path))
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "no memfd for the sandbox init; the helper re-executes airlock");
                        None
                    }
                }
            })
            .as_ref()
    }

    /// The program to start the helper from now.
    pub(crate) fn program(&self) -> &Path {
        match self.memfd() {
            Some((_, path)) if !self.memfd_refused.load(Ordering::Relaxed) => path,
            _ => &self.airlock,
        }
    }

    /// The memfd itself, while the kernel has not refused to execute it: a zygote's
    /// children execute it once their sandbox is built (`init::REAP_ARG`).
    pub(crate) fn executable_memfd(&self) -> Option<BorrowedFd<'_>> {
        match self.memfd() {
            Some((fd, _)) if !self.memfd_refused.load(Ordering::Relaxed) => Some(fd.as_fd()),
            _ => None,
        }
    }

    /// The airlock binary, the fallback.
    pub(crate) fn airlock(&self) -> &Path {
        &self.airlock
    }

    /// Whether `program` is the memfd.
    pub(crate) fn is_memfd(&self, program: &Path) -> bool {
        self.memfd().is_some_and(|(_, path)| path == program)
    }

    /// Records that executing the memfd failed (`error`) and the airlock binary served:
    /// later helpers start from the airlock binary.
    pub(crate) fn refuse_memfd(&self, error: &io::Error) {
        if !self.memfd_refused.swap(true, Ordering::Relaxed) {
            tracing::info!(error = %error, "the kernel refused to execute the sandbox init from a memfd; helpers re-execute airlock instead (slower, same sandbox)");
        }
    }

    /// Which executable the helper runs, for `airlock doctor`.
    pub(crate) fn describe(&self) -> String {
        match self.memfd() {
            Some(_) if !self.memfd_refused.load(Ordering::Relaxed) => format!(
                "the static init carried in airlock ({} KiB), executed from a sealed memfd \
                 (airlock itself where the kernel refuses that)",
                INIT_EXECUTABLE.len() / 1024
            ),
            _ => format!(
                "{} re-executed (no executable memfd)",
                self.airlock.display()
            ),
        }
    }
}

/// The memfd begun by [`start_early`], for the first [`InitProgram`] to take.
static EARLY: Mutex<Option<JoinHandle<io::Result<OwnedFd>>>> = Mutex::new(None);

/// Begins making the init's memfd now, on a thread, for the native backend this process
/// is about to open: `airlock run` calls it first thing, so the copy (1.3 MB into memory the
/// kernel allocates) runs while the command line and the policy are read, instead of
/// beside the redaction rules' build, which starts with the engine and shares the other
/// CPU with it (the first helper then waited 0.5 to 2.5 ms for the memfd in a third of
/// the cold runs measured on a 2-CPU machine). Without a native backend after it, the
/// memfd is made for nothing and dropped with the process.
pub fn start_early() {
    if let Ok(mut early) = EARLY.lock()
        && early.is_none()
    {
        *early = start_making();
    }
}

fn start_making() -> Option<JoinHandle<io::Result<OwnedFd>>> {
    std::thread::Builder::new()
        .name("airlock-init-memfd".into())
        .spawn(seal_init_memfd)
        .ok()
}

/// A memfd holding the init: executable, then sealed against any change (its size, its
/// content and, on Linux 6.3+, its mode), at a descriptor number of at least
/// [`MEMFD_MIN_FD`], close-on-exec.
fn seal_init_memfd() -> io::Result<OwnedFd> {
    let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
    // MFD_EXEC (6.3+) asks for an executable memfd explicitly, as a host with
    // vm.memfd_noexec = 1 requires; older kernels do not know the flag.
    let memfd = match rustix::fs::memfd_create(MEMFD_NAME, flags | MemfdFlags::EXEC) {
        Err(rustix::io::Errno::INVAL) => rustix::fs::memfd_create(MEMFD_NAME, flags)?,
        other => other?,
    };
    let mut written = 0;
    while written < INIT_EXECUTABLE.len() {
        match rustix::io::write(&memfd, &INIT_EXECUTABLE[written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    rustix::fs::fcntl_add_seals(
        &memfd,
        SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE,
    )?;
    match rustix::fs::fcntl_add_seals(&memfd, SealFlags::EXEC) {
        // Before Linux 6.3 there is no such seal; the mode of a memfd nobody else holds
        // cannot be changed anyway.
        Ok(()) | Err(rustix::io::Errno::INVAL) => {}
        Err(e) => return Err(e.into()),
    }
    rustix::fs::fcntl_add_seals(&memfd, SealFlags::SEAL)?;
    Ok(rustix::io::fcntl_dupfd_cloexec(&memfd, MEMFD_MIN_FD)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_carried_init_is_a_static_executable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("init");
        std::fs::write(&path, INIT_EXECUTABLE).unwrap();
        let deps = crate::elf::read_deps(&path).unwrap();
        // No program interpreter and no library: nothing to load but itself.
        assert_eq!(deps.interpreter, None, "{deps:?}");
        assert!(deps.needed.is_empty(), "{deps:?}");
        // Far smaller than the airlock binary it spares the kernel from loading.
        assert!(
            INIT_EXECUTABLE.len() < 4 << 20,
            "{} bytes",
            INIT_EXECUTABLE.len()
        );
    }

    #[test]
    fn the_memfd_is_sealed_and_clear_of_the_helpers_descriptors() {
        let fd = seal_init_memfd().unwrap();
        assert!(fd.as_raw_fd() >= MEMFD_MIN_FD);
        let seals = rustix::fs::fcntl_get_seals(&fd).unwrap();
        for seal in [
            SealFlags::SEAL,
            SealFlags::SHRINK,
            SealFlags::GROW,
            SealFlags::WRITE,
        ] {
            assert!(seals.contains(seal), "{seals:?}");
        }
        assert!(
            rustix::io::write(&fd, b"x").is_err(),
            "a sealed memfd took a write"
        );
        let flags = rustix::io::fcntl_getfd(&fd).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
    }
}
