//! Releasing `/out`: after the job, regular files within the caps are read out of the
//! job's tmpfs, everything else is listed as rejected with the reason.
//!
//! The backend reads through a descriptor of `/out` (the native backend's sandbox init
//! sends it one, so the tmpfs outlives the sandbox but nothing else of it does). Every path is opened
//! relative to a directory descriptor with `O_NOFOLLOW`; only regular files are ever
//! opened (`O_NONBLOCK`, so nothing can hang), after `fstatat` without following links.
//! By the time this runs every job process is dead, so nothing changes underneath.

use std::io::Read;
use std::os::fd::OwnedFd;

use airlock_core::{ByteSize, RejectedFile, ReleasedFile};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// Deepest directory level walked below `/out`.
pub const OUT_MAX_DEPTH: usize = 8;
/// Most directory entries looked at, files and directories together, per release.
pub const OUT_MAX_ENTRIES: usize = 100_000;
/// Inodes of `/out` beyond `max_files`, for the directories a job makes.
pub const OUT_SPARE_INODES: u64 = 64;

/// The caps of a release.
#[derive(Debug, Clone, Copy)]
pub struct OutCaps {
    /// Most files released.
    pub max_files: u32,
    /// Most bytes released in all (also the tmpfs's size).
    pub max_bytes: u64,
    /// Largest single file released.
    pub max_file_bytes: u64,
}

/// What a release produced.
#[derive(Debug, Default)]
pub struct Released {
    /// Released files in path order.
    pub files: Vec<ReleasedFile>,
    /// Everything else.
    pub rejected: Vec<RejectedFile>,
}

/// Walks `/out` through `dir` and releases what the caps allow.
pub fn release(dir: &OwnedFd, caps: OutCaps) -> Released {
    let mut released = Released::default();
    let mut total: u64 = 0;
    let mut seen = 0usize;
    walk(dir, "", 0, caps, &mut total, &mut seen, &mut released);
    if let Ok(st) = rustix::fs::fstatvfs(dir)
        && st.f_bavail == 0
    {
        released.rejected.push(RejectedFile {
            path: ".".to_owned(),
            reason: format!(
                "/out reached its cap of {}: writes beyond it failed (ENOSPC)",
                ByteSize::bytes(caps.max_bytes)
            ),
        });
    }
    if let Ok(st) = rustix::fs::fstatvfs(dir)
        && st.f_files > 0
        && st.f_ffree == 0
    {
        released.rejected.push(RejectedFile {
            path: ".".to_owned(),
            reason: "/out ran out of inodes: files beyond the cap could not be created".to_owned(),
        });
    }
    released
}

fn reject(released: &mut Released, path: String, reason: impl Into<String>) {
    released.rejected.push(RejectedFile {
        path,
        reason: reason.into(),
    });
}

fn walk(
    dir: &OwnedFd,
    prefix: &str,
    depth: usize,
    caps: OutCaps,
    total: &mut u64,
    seen: &mut usize,
    released: &mut Released,
) {
    let mut names = Vec::new();
    let entries = match rustix::fs::Dir::read_from(dir) {
        Ok(entries) => entries,
        Err(e) => {
            reject(released, display_dir(prefix), format!("cannot list: {e}"));
            return;
        }
    };
    for entry in entries {
        let Ok(entry) = entry else { break };
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        names.push(name.to_vec());
    }
    names.sort();
    for name in names {
        *seen += 1;
        let shown = String::from_utf8_lossy(&name).into_owned();
        let path = if prefix.is_empty() {
            shown.clone()
        } else {
            format!("{prefix}/{shown}")
        };
        if *seen > OUT_MAX_ENTRIES {
            reject(
                released,
                path,
                format!("more than {OUT_MAX_ENTRIES} entries in /out"),
            );
            return;
        }
        if std::str::from_utf8(&name).is_err() {
            reject(released, path, "name is not UTF-8");
            continue;
        }
        let Ok(cname) = std::ffi::CString::new(name) else {
            continue;
        };
        let st = match rustix::fs::statat(dir, &cname, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(e) => {
                reject(released, path, format!("cannot stat: {e}"));
                continue;
            }
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                if depth + 1 >= OUT_MAX_DEPTH {
                    reject(
                        released,
                        path,
                        format!("deeper than {OUT_MAX_DEPTH} levels"),
                    );
                    continue;
                }
                match rustix::fs::openat(
                    dir,
                    &cname,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(sub) => walk(&sub, &path, depth + 1, caps, total, seen, released),
                    Err(e) => reject(released, path, format!("cannot open directory: {e}")),
                }
            }
            FileType::RegularFile => {
                release_file(dir, &cname, path, &st, caps, total, released);
            }
            FileType::Symlink => reject(released, path, "symbolic link (never followed)"),
            FileType::Fifo => reject(released, path, "fifo"),
            FileType::Socket => reject(released, path, "socket"),
            FileType::CharacterDevice | FileType::BlockDevice => {
                reject(released, path, "device node")
            }
            FileType::Unknown => reject(released, path, "unknown file type"),
        }
    }
}

fn release_file(
    dir: &OwnedFd,
    name: &std::ffi::CStr,
    path: String,
    st: &rustix::fs::Stat,
    caps: OutCaps,
    total: &mut u64,
    released: &mut Released,
) {
    let size = u64::try_from(st.st_size).unwrap_or(u64::MAX);
    if st.st_nlink > 1 {
        return reject(released, path, "hard link (a file with several names)");
    }
    if size > caps.max_file_bytes {
        return reject(
            released,
            path,
            format!(
                "{} is larger than the per-file cap of {}",
                ByteSize::bytes(size),
                ByteSize::bytes(caps.max_file_bytes)
            ),
        );
    }
    if released.files.len() >= caps.max_files as usize {
        return reject(
            released,
            path,
            format!("over the cap of {} released files", caps.max_files),
        );
    }
    if *total + size > caps.max_bytes {
        return reject(
            released,
            path,
            format!(
                "would exceed the total cap of {}",
                ByteSize::bytes(caps.max_bytes)
            ),
        );
    }
    let fd = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) => return reject(released, path, format!("cannot open: {e}")),
    };
    // The same inode, still a regular file.
    match rustix::fs::fstat(&fd) {
        Ok(now)
            if now.st_ino == st.st_ino
                && FileType::from_raw_mode(now.st_mode) == FileType::RegularFile => {}
        _ => return reject(released, path, "changed while being released"),
    }
    let mut content = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    let file = std::fs::File::from(fd);
    if let Err(e) = file
        .take(caps.max_file_bytes.saturating_add(1))
        .read_to_end(&mut content)
    {
        return reject(released, path, format!("cannot read: {e}"));
    }
    if content.len() as u64 > caps.max_file_bytes {
        return reject(
            released,
            path,
            "grew past the per-file cap while being read",
        );
    }
    *total += content.len() as u64;
    released.files.push(ReleasedFile { path, content });
}

fn display_dir(prefix: &str) -> String {
    if prefix.is_empty() {
        ".".to_owned()
    } else {
        prefix.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn caps() -> OutCaps {
        OutCaps {
            max_files: 3,
            max_bytes: 100,
            max_file_bytes: 40,
        }
    }

    fn open_dir(path: &std::path::Path) -> OwnedFd {
        rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap()
    }

    #[test]
    fn only_regular_files_within_the_caps_are_released() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        std::fs::create_dir_all(out.join("sub")).unwrap();
        std::fs::write(out.join("a.txt"), "alpha").unwrap();
        std::fs::write(out.join("sub/b.txt"), "beta").unwrap();
        std::fs::write(out.join("big.bin"), vec![0u8; 41]).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", out.join("passwd")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("secret"), out.join("host")).unwrap();
        std::fs::write(tmp.path().join("secret"), "host secret").unwrap();
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            out.join("fifo"),
            Mode::from_raw_mode(0o600),
        )
        .unwrap();
        std::fs::write(out.join("linked"), "twice").unwrap();
        std::fs::hard_link(out.join("linked"), out.join("sub/linked2")).unwrap();
        let released = release(&open_dir(&out), caps());
        let files: Vec<(&str, &[u8])> = released
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.content.as_slice()))
            .collect();
        assert_eq!(
            files,
            vec![("a.txt", &b"alpha"[..]), ("sub/b.txt", &b"beta"[..])]
        );
        let rejected: Vec<(&str, &str)> = released
            .rejected
            .iter()
            .map(|r| (r.path.as_str(), r.reason.split(' ').next().unwrap_or("")))
            .collect();
        assert_eq!(
            rejected,
            vec![
                ("big.bin", "41B"),
                ("fifo", "fifo"),
                ("host", "symbolic"),
                ("linked", "hard"),
                ("passwd", "symbolic"),
                ("sub/linked2", "hard"),
            ]
        );
    }

    #[test]
    fn count_and_total_caps_hold() {
        let tmp = tempfile::tempdir().unwrap();
        for i in 0..5 {
            std::fs::write(tmp.path().join(format!("f{i}")), vec![b'x'; 30]).unwrap();
        }
        let released = release(&open_dir(tmp.path()), caps());
        assert_eq!(released.files.len(), 3);
        assert_eq!(released.rejected.len(), 2);
        assert!(released.rejected[0].reason.contains("released files"));
    }
}
