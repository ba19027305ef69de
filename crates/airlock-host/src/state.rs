//! airlock's state directory, where what outlives a job is kept (the image store).

use std::path::PathBuf;

/// airlock's state directory (also `airlock_engine::state_dir`):
/// `$AIRLOCK_STATE_DIR`, else `/var/lib/airlock` for root, else `$XDG_STATE_HOME/airlock`,
/// else `~/.local/state/airlock`.
pub fn state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("AIRLOCK_STATE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if rustix::process::geteuid().is_root() {
        return PathBuf::from("/var/lib/airlock");
    }
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("airlock");
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(home) => PathBuf::from(home).join(".local/state/airlock"),
        None => std::env::temp_dir().join("airlock-state"),
    }
}
