//! What is left below the host's cgroup mounts, for tests that check a job's group is gone.

use std::collections::BTreeSet;
use std::path::Path;

/// Directory names below every cgroup mount under `/sys/fs/cgroup` (8 levels deep at most):
/// a native job's group is named for its job (or warm sandbox).
pub fn cgroup_dir_names() -> BTreeSet<String> {
    fn walk(dir: &Path, depth: usize, out: &mut BTreeSet<String>) {
        if depth == 0 {
            return;
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                out.insert(entry.file_name().to_string_lossy().into_owned());
                walk(&entry.path(), depth - 1, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(Path::new("/sys/fs/cgroup"), 8, &mut out);
    out
}

/// The directory under `runtime` of the native job one of `pids` belongs to: the one named
/// as the process's cgroup (a job's group is named for its job directory). A native job's
/// `/work` is a tmpfs mounted nowhere on the host, so its directory holds none of its
/// files to find it by.
pub fn job_dir_of(runtime: &Path, pids: &[u32]) -> Option<std::path::PathBuf> {
    pids.iter().find_map(|pid| {
        let groups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        groups.lines().find_map(|line| {
            let name = line.rsplit('/').next().filter(|n| !n.is_empty())?;
            let dir = runtime.join(name);
            dir.is_dir().then_some(dir)
        })
    })
}
