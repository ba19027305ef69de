//! Writing a job's released `/out` files into a directory on the host (`airlock run --out
//! DIR`).
//!
//! The names come from the job, so the host side treats them as hostile even though the
//! release already checked them: every directory below DIR is opened relative to its parent's
//! descriptor with `O_NOFOLLOW | O_DIRECTORY`, and every file is created with `O_CREAT |
//! O_EXCL | O_NOFOLLOW`. A symbolic link already sitting in DIR (placed there by someone
//! else, or left by an earlier run) is never followed, and nothing that exists is
//! overwritten. DIR itself is the operator's own choice and is taken as given.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use airlock_core::ReleasedFile;
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

/// Deepest path below DIR a released file may have; the release allows 8 levels.
const MAX_DEPTH: usize = 16;

/// Why a released file could not be written into the output directory.
#[derive(Debug, thiserror::Error)]
pub enum WriteOutError {
    /// DIR cannot be created or opened as a directory.
    #[error("open the output directory {dir}")]
    OpenDir {
        /// The directory.
        dir: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A released file's name is not a plain relative path.
    #[error("refuse to write {path:?}: not a plain relative path")]
    BadName {
        /// The name, as the job gave it.
        path: String,
    },
    /// A directory on the way to a file cannot be created, or is not a plain directory
    /// (a symbolic link, a file).
    #[error("directory {path} in the output directory")]
    Subdir {
        /// The directory, relative to DIR.
        path: String,
        /// The OS error (`ELOOP` or `ENOTDIR` for a link or a file in the way).
        source: std::io::Error,
    },
    /// The file cannot be created (it exists already, or a link sits at its name).
    #[error("create {path} in the output directory")]
    Create {
        /// The file, relative to DIR.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Writing the file's content failed.
    #[error("write {path} in the output directory")]
    Write {
        /// The file, relative to DIR.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Writes every released file under `dir` (created when missing), never following a link
/// below it and never replacing a file that exists. Stops at the first failure; files
/// written before it stay.
pub fn write_released(dir: &Path, files: &[ReleasedFile]) -> Result<(), WriteOutError> {
    let open_dir_error = |source: std::io::Error| WriteOutError::OpenDir {
        dir: dir.to_owned(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(open_dir_error)?;
    let root = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| open_dir_error(e.into()))?;
    for file in files {
        write_one(&root, file)?;
    }
    Ok(())
}

fn write_one(root: &OwnedFd, file: &ReleasedFile) -> Result<(), WriteOutError> {
    let bad_name = || WriteOutError::BadName {
        path: file.path.clone(),
    };
    let parts: Vec<&str> = file.path.split('/').collect();
    let plain = |p: &&str| !p.is_empty() && *p != "." && *p != ".." && !p.contains('\0');
    if parts.len() > MAX_DEPTH || !parts.iter().all(plain) {
        return Err(bad_name());
    }
    let Some((name, subdirs)) = parts.split_last() else {
        return Err(bad_name());
    };
    let mut parent: Option<OwnedFd> = None;
    for (depth, part) in subdirs.iter().enumerate() {
        let at = parent.as_ref().unwrap_or(root);
        let subdir_error = |source: Errno| WriteOutError::Subdir {
            path: parts[..=depth].join("/"),
            source: source.into(),
        };
        match rustix::fs::mkdirat(at, *part, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(subdir_error(e)),
        }
        let next = rustix::fs::openat(
            at,
            *part,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(subdir_error)?;
        parent = Some(next);
    }
    let at = parent.as_ref().unwrap_or(root);
    let fd = rustix::fs::openat(
        at,
        *name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(|e| WriteOutError::Create {
        path: file.path.clone(),
        source: e.into(),
    })?;
    std::fs::File::from(fd)
        .write_all(&file.content)
        .map_err(|source| WriteOutError::Write {
            path: file.path.clone(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn released(path: &str, content: &str) -> ReleasedFile {
        ReleasedFile {
            path: path.to_owned(),
            content: content.as_bytes().to_vec(),
        }
    }

    #[test]
    fn files_and_their_directories_are_written() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out");
        write_released(
            &dir,
            &[
                released("a.txt", "one"),
                released("sub/deeper/b.txt", "two"),
            ],
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("a.txt")).unwrap(), "one");
        assert_eq!(
            std::fs::read_to_string(dir.join("sub/deeper/b.txt")).unwrap(),
            "two"
        );
    }

    #[test]
    fn a_symlinked_directory_in_the_output_directory_is_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let dir = tmp.path().join("out");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.join("sub")).unwrap();
        let err = write_released(&dir, &[released("sub/x.txt", "escaped")]).unwrap_err();
        assert!(
            matches!(&err, WriteOutError::Subdir { path, .. } if path == "sub"),
            "{err:?}"
        );
        assert!(!elsewhere.join("x.txt").exists(), "wrote through the link");
    }

    #[test]
    fn a_symlink_at_the_file_name_is_never_followed_nor_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target.txt");
        std::fs::write(&target, "original").unwrap();
        let dir = tmp.path().join("out");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&target, dir.join("x.txt")).unwrap();
        let err = write_released(&dir, &[released("x.txt", "overwritten")]).unwrap_err();
        assert!(matches!(err, WriteOutError::Create { .. }), "{err:?}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "original");
    }

    #[test]
    fn an_existing_file_is_not_overwritten() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("x.txt"), "mine").unwrap();
        let err = write_released(&dir, &[released("x.txt", "theirs")]).unwrap_err();
        assert!(matches!(err, WriteOutError::Create { .. }), "{err:?}");
        assert_eq!(std::fs::read_to_string(dir.join("x.txt")).unwrap(), "mine");
    }

    #[test]
    fn names_that_are_not_plain_relative_paths_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out");
        for name in ["../x", "/etc/x", "a//b", "a/./b", "", "a/", "x\0y"] {
            let err = write_released(&dir, &[released(name, "x")]).unwrap_err();
            assert!(
                matches!(err, WriteOutError::BadName { .. }),
                "{name:?}: {err:?}"
            );
        }
        assert!(!tmp.path().join("x").exists());
    }
}
