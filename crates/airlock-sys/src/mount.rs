//! `mount(2)` and `umount2(2)` with every argument optional, as the kernel takes them.
//!
//! rustix splits mount into several helpers that each fix some arguments; the sandbox
//! needs the raw shape (for example a bind remount with an explicit flag set), so this is a
//! thin, checked wrapper.

use std::ffi::CStr;
use std::io;

/// `MS_*` flags, re-exported from libc for callers that must not depend on libc.
pub mod flags {
    /// Read-only.
    pub const RDONLY: u64 = libc::MS_RDONLY;
    /// Ignore set-user-id bits.
    pub const NOSUID: u64 = libc::MS_NOSUID;
    /// No device files.
    pub const NODEV: u64 = libc::MS_NODEV;
    /// No execution.
    pub const NOEXEC: u64 = libc::MS_NOEXEC;
    /// No access-time updates.
    pub const NOATIME: u64 = libc::MS_NOATIME;
    /// No directory access-time updates.
    pub const NODIRATIME: u64 = libc::MS_NODIRATIME;
    /// Relative access times.
    pub const RELATIME: u64 = libc::MS_RELATIME;
    /// Change an existing mount.
    pub const REMOUNT: u64 = libc::MS_REMOUNT;
    /// Bind mount.
    pub const BIND: u64 = libc::MS_BIND;
    /// Apply recursively.
    pub const REC: u64 = libc::MS_REC;
    /// Make private (no propagation).
    pub const PRIVATE: u64 = libc::MS_PRIVATE;
    /// Make a slave.
    pub const SLAVE: u64 = libc::MS_SLAVE;
    /// Suppress some kernel log messages.
    pub const SILENT: u64 = libc::MS_SILENT;
}

/// `mount(source, target, fstype, flags, data)`.
pub fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: u64,
    data: Option<&CStr>,
) -> io::Result<()> {
    let ptr = |s: Option<&CStr>| s.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: every pointer is NULL or a valid NUL-terminated string that outlives the call;
    // `data` is a string because every filesystem airlock mounts takes string options.
    let rc = unsafe {
        libc::mount(
            ptr(source),
            target.as_ptr(),
            ptr(fstype),
            flags as libc::c_ulong,
            ptr(data).cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `umount2(target, MNT_DETACH)`.
pub fn unmount_detach(target: &CStr) -> io::Result<()> {
    // SAFETY: target is a valid NUL-terminated string.
    let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The `MS_*` flags an existing mount has, read with `statvfs`, restricted to those a
/// bind remount must repeat (the kernel refuses to clear a locked flag inherited from a
/// more privileged mount namespace).
pub fn existing_mount_flags(path: &CStr) -> io::Result<u64> {
    let st = rustix::fs::statvfs(path)?;
    use rustix::fs::StatVfsMountFlags as F;
    let mut out = 0;
    let pairs = [
        (F::RDONLY, flags::RDONLY),
        (F::NOSUID, flags::NOSUID),
        (F::NODEV, flags::NODEV),
        (F::NOEXEC, flags::NOEXEC),
        (F::NOATIME, flags::NOATIME),
        (F::NODIRATIME, flags::NODIRATIME),
        (F::RELATIME, flags::RELATIME),
    ];
    for (have, flag) in pairs {
        if st.f_flag.contains(have) {
            out |= flag;
        }
    }
    Ok(out)
}
