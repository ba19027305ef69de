//! `/out` for container jobs: a size-capped tmpfs mounted on the host (the daemon and
//! airlock both run as root) at the job directory's `out/`, bound into the container at
//! `/out`, released after the job through a directory descriptor with the native
//! backend's rules ([`airlock_host::out::release`]), then unmounted.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use airlock_host::out::{OutCaps, Released};
use rustix::fs::{Mode, OFlags};
use rustix::mount::{MountFlags, UnmountFlags};

use crate::error::DockerError;
use crate::spec::JOB_UID;

/// Inodes of `/out` beyond `max_files`, for the directories a job makes (as native).
pub const OUT_SPARE_INODES: u64 = airlock_host::out::OUT_SPARE_INODES;

/// The tmpfs options of `/out`: its size and inode caps, owned by the job's uid, mode 0700.
pub fn mount_options(max_bytes: u64, max_files: u32) -> String {
    format!(
        "size={max_bytes},nr_inodes={},mode=0700,uid={JOB_UID},gid={JOB_UID}",
        u64::from(max_files) + OUT_SPARE_INODES
    )
}

/// A mounted `/out` tmpfs; unmounted on drop.
#[derive(Debug)]
pub struct OutMount {
    path: PathBuf,
    mounted: bool,
}

impl OutMount {
    /// Creates `path` and mounts the tmpfs there (needs root).
    pub fn mount(path: &Path, max_bytes: u64, max_files: u32) -> Result<Self, DockerError> {
        let err = |source: std::io::Error| DockerError::MountOut {
            path: path.to_owned(),
            source,
        };
        std::fs::create_dir(path).map_err(err)?;
        let data = CString::new(mount_options(max_bytes, max_files))
            .map_err(|e| err(std::io::Error::other(e)))?;
        rustix::mount::mount(
            "airlock-out",
            path,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            data.as_c_str(),
        )
        .map_err(|e| err(e.into()))?;
        Ok(Self {
            path: path.to_owned(),
            mounted: true,
        })
    }

    /// The mount point (bound at `/out`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the tmpfs's root without following links, releases what the caps allow, and
    /// unmounts it. Every job process is gone by now.
    pub fn release(mut self, caps: OutCaps) -> Result<Released, DockerError> {
        let dir: OwnedFd = rustix::fs::open(
            &self.path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| DockerError::MountOut {
            path: self.path.clone(),
            source: e.into(),
        })?;
        let released = airlock_host::out::release(&dir, caps);
        drop(dir);
        self.unmount();
        Ok(released)
    }

    fn unmount(&mut self) {
        if self.mounted {
            self.mounted = false;
            if let Err(e) = rustix::mount::unmount(&self.path, UnmountFlags::DETACH) {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot unmount /out");
            }
        }
    }
}

impl Drop for OutMount {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// Unmounts a stale job's `/out`, if it is still mounted (for the sweep).
pub fn unmount_stale(path: &Path) {
    // EINVAL (not a mount point) and ENOENT are the common, harmless answers.
    let _ = rustix::mount::unmount(path, UnmountFlags::DETACH);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_cap_bytes_and_inodes() {
        assert_eq!(
            mount_options(8 << 20, 64),
            "size=8388608,nr_inodes=128,mode=0700,uid=65534,gid=65534"
        );
    }
}
