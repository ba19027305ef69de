//! Small file helpers for cgroupfs: every error names the path.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use crate::CgroupError;

/// Reads a whole (small) cgroupfs or procfs file.
pub(crate) fn read(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|source| CgroupError::ReadFile {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a file that older kernels do not have: `Ok(None)` when it does not exist.
pub(crate) fn read_optional(path: &Path) -> Result<Option<String>, CgroupError> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CgroupError::ReadFile {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes one value with a single `write(2)`, as cgroupfs expects.
///
/// The file is opened with `O_CREAT` so that the same code runs on a fake tree in a tempdir;
/// cgroupfs never creates files, so on the real filesystem a missing interface file still fails,
/// and the error then says that the file is missing rather than the kernel's `EACCES`.
pub(crate) fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    let result = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()));
    result.map_err(|source| {
        let source = if path.exists() {
            source
        } else {
            io::Error::new(
                io::ErrorKind::NotFound,
                "no such cgroup interface file (is the controller enabled?)",
            )
        };
        CgroupError::WriteFile {
            path: path.to_path_buf(),
            value: value.to_owned(),
            source,
        }
    })
}

/// Parses a decimal counter such as `memory.max_usage_in_bytes`.
pub(crate) fn parse_u64(path: &Path, text: &str) -> Result<u64, CgroupError> {
    let t = text.trim();
    t.parse().map_err(|_| CgroupError::Parse {
        path: path.to_path_buf(),
        what: "an unsigned integer",
        detail: shorten(t),
    })
}

/// Finds `key N` in a flat-keyed file (`memory.events`, `memory.oom_control`, `cpu.stat`).
pub(crate) fn keyed_u64(path: &Path, text: &str, key: &str) -> Result<Option<u64>, CgroupError> {
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        if parts.next() == Some(key) {
            let value = parts.next().unwrap_or("");
            return parse_u64(path, value).map(Some);
        }
    }
    Ok(None)
}

/// Reads the process ids listed in a `cgroup.procs` file.
pub(crate) fn read_pids(path: &Path) -> Result<Vec<i32>, CgroupError> {
    let text = read(path)?;
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            l.parse::<i32>().map_err(|_| CgroupError::Parse {
                path: path.to_path_buf(),
                what: "a process id",
                detail: shorten(l),
            })
        })
        .collect()
}

/// Cuts untrusted text for error messages.
pub(crate) fn shorten(s: &str) -> String {
    const MAX_DETAIL_CHARS: usize = 80;
    s.chars().take(MAX_DETAIL_CHARS).collect()
}

/// `mkdir -p` of `target` below `mount_point`, one level at a time: `at_each` runs on the
/// mount point and then on each level after it exists (v2 enables controllers there). Every
/// directory this call created is appended to `created`, outermost first.
pub(crate) fn create_dir_chain(
    mount_point: &Path,
    target: &Path,
    created: &mut Vec<std::path::PathBuf>,
    mut at_each: impl FnMut(&Path) -> Result<(), CgroupError>,
) -> Result<(), CgroupError> {
    let rel = target
        .strip_prefix(mount_point)
        .map_err(|_| CgroupError::InvalidParent {
            path: target.to_path_buf(),
            reason: "not below the cgroup mount",
        })?;
    let mut current = mount_point.to_path_buf();
    at_each(&current)?;
    for component in rel.components() {
        current.push(component);
        match fs::create_dir(&current) {
            Ok(()) => created.push(current.clone()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(CgroupError::CreateDir {
                    path: current,
                    source,
                });
            }
        }
        at_each(&current)?;
    }
    Ok(())
}
