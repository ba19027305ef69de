//! The probe's checks, one function per report field. Each returns what it found; anything
//! it could not do cleanly goes to `notes`. Files it creates are named
//! `.airlock-probe-<what>-<pid>` and removed again.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use airlock_sys::probe::{DangerousCall, attempt};
use airlock_testkit::{
    Canary, FillTmp, Identity, MountCheck, MountInfo, Network, Outcome, Paths, ProcStatus, Rlimit,
    Rlimits, TmpExec, mount_for_path, parse_mountinfo, parse_net_dev, parse_proc_status,
};
use rustix::fs::{AtFlags, StatVfsMountFlags, StatxFlags};
use rustix::process::Resource;

/// Paths whose mount the report describes.
const MOUNT_PATHS: &[&str] = &["/", "/work", "/tmp", "/proc", "/dev", "/usr", "/etc"];

/// Directories the probe tries to create a file in.
const WRITE_DIRS: &[&str] = &["/", "/work", "/usr", "/etc", "/tmp", "/dev"];

/// Host paths whose existence the report records.
const EXIST_PATHS: &[&str] = &[
    "/etc/shadow",
    "/root",
    "/home",
    "/var",
    "/run",
    "/srv",
    "/opt",
    "/mnt",
    "/media",
    "/sys",
    "/var/run/docker.sock",
    "/etc/passwd",
];

/// Most directory entries listed for `/etc` and `/dev`.
const MAX_DIR_ENTRIES: usize = 1024;

/// Connect timeout for `--canary`.
const CANARY_TIMEOUT: Duration = Duration::from_secs(2);

/// Chunk size for `--fill-tmp`.
const FILL_CHUNK_BYTES: usize = 1 << 20;

/// Where `--fill-tmp` stops even without an error: well above the sandbox's 16 MiB `/tmp`,
/// small enough to be harmless on a host.
const FILL_TMP_CAP_BYTES: u64 = 64 << 20;

/// The script `tmp_exec` writes and runs.
const EXEC_SCRIPT: &[u8] = b"#!/bin/sh\nexit 0\n";

const TMP: &str = "/tmp";

fn scratch_path(dir: &str, what: &str, pid: i32) -> PathBuf {
    Path::new(dir).join(format!(".airlock-probe-{what}-{pid}"))
}

fn remove_scratch(path: &Path, notes: &mut Vec<String>) {
    if let Err(error) = fs::remove_file(path) {
        notes.push(format!("could not remove {}: {error}", path.display()));
    }
}

pub fn identity() -> Identity {
    use rustix::process;
    Identity {
        uid: process::getuid().as_raw(),
        gid: process::getgid().as_raw(),
        euid: process::geteuid().as_raw(),
        egid: process::getegid().as_raw(),
        groups: process::getgroups()
            .map(|groups| groups.into_iter().map(|gid| gid.as_raw()).collect())
            .unwrap_or_default(),
        pid: process::getpid().as_raw_pid(),
        ppid: rustix::process::Pid::as_raw(process::getppid()),
        hostname: rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned(),
        visible_processes: fs::read_dir("/proc").ok().map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|entry| {
                    entry
                        .file_name()
                        .to_str()
                        .is_some_and(|name| name.parse::<u32>().is_ok())
                })
                .count()
        }),
    }
}

pub fn proc_status(notes: &mut Vec<String>) -> Option<ProcStatus> {
    let text = match fs::read_to_string("/proc/self/status") {
        Ok(text) => text,
        Err(error) => {
            notes.push(format!("could not read /proc/self/status: {error}"));
            return None;
        }
    };
    match parse_proc_status(&text) {
        Ok(status) => Some(status),
        Err(error) => {
            notes.push(error.to_string());
            None
        }
    }
}

pub fn mounts(notes: &mut Vec<String>) -> BTreeMap<String, MountCheck> {
    let mountinfo = match fs::read_to_string("/proc/self/mountinfo") {
        Ok(text) => parse_mountinfo(&text).unwrap_or_else(|error| {
            notes.push(error.to_string());
            Vec::new()
        }),
        Err(error) => {
            notes.push(format!("could not read /proc/self/mountinfo: {error}"));
            Vec::new()
        }
    };
    MOUNT_PATHS
        .iter()
        .map(|&path| (path.to_owned(), mount_check(path, &mountinfo)))
        .collect()
}

fn mount_check(path: &str, mountinfo: &[MountInfo]) -> MountCheck {
    let flags = rustix::fs::statvfs(path).ok().map(|vfs| vfs.f_flag);
    let flag = |bit: StatVfsMountFlags| flags.map(|flags| flags.contains(bit));
    let by_id = rustix::fs::statx(rustix::fs::CWD, path, AtFlags::empty(), StatxFlags::MNT_ID)
        .ok()
        .filter(|statx| StatxFlags::from_bits_retain(statx.stx_mask).contains(StatxFlags::MNT_ID))
        .and_then(|statx| {
            mountinfo
                .iter()
                .find(|mount| mount.mount_id == statx.stx_mnt_id)
        });
    let entry = by_id.or_else(|| {
        let canonical = fs::canonicalize(path).ok()?;
        mount_for_path(mountinfo, canonical.to_str()?)
    });
    MountCheck {
        exists: fs::metadata(path).is_ok(),
        read_only: flag(StatVfsMountFlags::RDONLY),
        noexec: flag(StatVfsMountFlags::NOEXEC),
        nosuid: flag(StatVfsMountFlags::NOSUID),
        nodev: flag(StatVfsMountFlags::NODEV),
        fs_type: entry.map(|mount| mount.fs_type.clone()),
        mount_point: entry.map(|mount| mount.mount_point.clone()),
        source: entry.map(|mount| mount.source.clone()),
    }
}

pub fn writes(pid: i32, notes: &mut Vec<String>) -> BTreeMap<String, Outcome> {
    WRITE_DIRS
        .iter()
        .map(|&dir| {
            let path = scratch_path(dir, "write", pid);
            let outcome = match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(file) => {
                    drop(file);
                    remove_scratch(&path, notes);
                    Outcome::Ok(0)
                }
                Err(error) => Outcome::from_io_error(&error),
            };
            (dir.to_owned(), outcome)
        })
        .collect()
}

pub fn tmp_exec(pid: i32, notes: &mut Vec<String>) -> TmpExec {
    let path = scratch_path(TMP, "exec", pid);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(&path)
        .and_then(|mut file| {
            let created = file.write_all(EXEC_SCRIPT);
            // Whatever the umask took away, the script is to be 0755.
            let chmod = fs::set_permissions(&path, fs::Permissions::from_mode(0o755));
            created.and(chmod)
        });
    // The file is closed here (dropped above), so exec cannot meet ETXTBSY.
    if let Err(error) = written {
        if path.exists() {
            remove_scratch(&path, notes);
        }
        return TmpExec {
            write: Outcome::from_io_error(&error),
            exec: None,
        };
    }
    let exec = match Command::new(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(status) => match (status.code(), status_signal(&status)) {
            (Some(code), _) => Outcome::Ok(i64::from(code)),
            (None, Some(signal)) => Outcome::Signal(airlock_testkit::signal_name(signal)),
            (None, None) => Outcome::Error(format!("script ended oddly: {status}")),
        },
        Err(error) => Outcome::from_io_error(&error),
    };
    remove_scratch(&path, notes);
    TmpExec {
        write: Outcome::Ok(0),
        exec: Some(exec),
    }
}

fn status_signal(status: &std::process::ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(status)
}

pub fn network(canary: Option<&str>) -> Network {
    Network {
        interfaces: fs::read_to_string("/proc/net/dev")
            .ok()
            .map(|text| parse_net_dev(&text)),
        canary: canary.map(connect_canary),
    }
}

fn connect_canary(target: &str) -> Canary {
    let result = match target.to_socket_addrs() {
        Ok(mut addresses) => match addresses.next() {
            Some(address) => match TcpStream::connect_timeout(&address, CANARY_TIMEOUT) {
                Ok(_) => Outcome::Ok(0),
                Err(error) => Outcome::from_io_error(&error),
            },
            None => Outcome::Error("resolves to no address".to_owned()),
        },
        Err(error) => Outcome::Error(format!("cannot resolve: {error}")),
    };
    Canary {
        target: target.to_owned(),
        result,
    }
}

pub fn paths(notes: &mut Vec<String>) -> Paths {
    Paths {
        exists: EXIST_PATHS
            .iter()
            .map(|&path| (path.to_owned(), fs::symlink_metadata(path).is_ok()))
            .collect(),
        passwd_lines: fs::read_to_string("/etc/passwd")
            .ok()
            .map(|text| text.lines().count()),
        etc_entries: list_dir("/etc", notes),
        dev_entries: list_dir("/dev", notes),
    }
}

fn list_dir(dir: &str, notes: &mut Vec<String>) -> Option<Vec<String>> {
    let entries = fs::read_dir(dir).ok()?;
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .take(MAX_DIR_ENTRIES + 1)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    if names.len() > MAX_DIR_ENTRIES {
        names.truncate(MAX_DIR_ENTRIES);
        notes.push(format!(
            "{dir} has more than {MAX_DIR_ENTRIES} entries; listed the first ones"
        ));
    }
    names.sort_unstable();
    Some(names)
}

pub fn env() -> BTreeMap<String, String> {
    std::env::vars_os()
        .map(|(name, value)| {
            (
                name.to_string_lossy().into_owned(),
                value.to_string_lossy().into_owned(),
            )
        })
        .collect()
}

pub fn syscalls() -> BTreeMap<String, Outcome> {
    DangerousCall::ALL
        .iter()
        .map(|&call| (call.name().to_owned(), Outcome::from(attempt(call))))
        .collect()
}

pub fn rlimits() -> Rlimits {
    let limit = |resource| {
        let limit = rustix::process::getrlimit(resource);
        Rlimit {
            soft: limit.current,
            hard: limit.maximum,
        }
    };
    Rlimits {
        nofile: limit(Resource::Nofile),
        fsize: limit(Resource::Fsize),
        core: limit(Resource::Core),
        nproc: limit(Resource::Nproc),
        cpu: limit(Resource::Cpu),
    }
}

pub fn fill_tmp(pid: i32, notes: &mut Vec<String>) -> FillTmp {
    let path = scratch_path(TMP, "fill", pid);
    let mut file = match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
    {
        Ok(file) => file,
        Err(error) => {
            return FillTmp {
                bytes_written: 0,
                error: Some(Outcome::from_io_error(&error)),
                cap_bytes: FILL_TMP_CAP_BYTES,
            };
        }
    };
    let chunk = vec![0xa5_u8; FILL_CHUNK_BYTES];
    let mut bytes_written: u64 = 0;
    let mut error = None;
    'fill: while bytes_written < FILL_TMP_CAP_BYTES {
        let mut offset = 0;
        while offset < chunk.len() {
            match file.write(&chunk[offset..]) {
                Ok(0) => {
                    error = Some(Outcome::Error("write returned 0".to_owned()));
                    break 'fill;
                }
                Ok(n) => {
                    offset += n;
                    bytes_written += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    error = Some(Outcome::from_io_error(&e));
                    break 'fill;
                }
            }
        }
    }
    drop(file);
    remove_scratch(&path, notes);
    FillTmp {
        bytes_written,
        error,
        cap_bytes: FILL_TMP_CAP_BYTES,
    }
}
