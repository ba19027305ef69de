//! The audit log: one JSON line per job, appended with a single write, optionally synced.
//! Kept apart from tracing so no log-level setting can drop a record.
//!
//! A job that will run is first *accepted*: a write-ahead record of it goes to the
//! directory beside the log (`<log>.accepted/<job id>.json`, synced), holding the line
//! the log gets should the process die before the job's end (`"interrupted": true`) and
//! the identity of the process that accepted it. The record is removed once the job's own
//! line is in the log. A later start of airlock ([`AuditLog::settle_interrupted`]) writes
//! the line of every record whose process is gone, so the log holds exactly one line for
//! every job any instance accepted. When the record cannot be written (a full disk, an I/O
//! error, a read-only file system) the job is refused: nothing runs unaudited.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use airlock_core::audit::AuditRecord;
use serde::{Deserialize, Serialize};

use crate::error::EngineError;

/// An open audit log.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    accepted_dir: PathBuf,
    fsync: bool,
    file: Mutex<LogFile>,
    /// Job lines not written when their job ended (the log could not be written): their
    /// write-ahead records stay, and the next acceptance writes them first.
    unsettled: Mutex<Vec<(PathBuf, AuditRecord)>>,
    failures: AtomicU64,
}

#[derive(Debug)]
struct LogFile {
    file: File,
    /// A write failed, so the log may end in part of a line: the next write ends it first.
    torn: bool,
}

/// What the audit log's writes look like now, for `/metrics` and `doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditHealth {
    /// Whether the last write (log line or write-ahead record) succeeded.
    pub writable: bool,
    /// Writes that failed since the log was opened.
    pub write_failures: u64,
    /// Accepted jobs whose line is not in the log yet.
    pub unsettled: usize,
}

/// A job's write-ahead record: written at acceptance, removed once the job's line is in
/// the log ([`AuditLog::settle`]).
#[derive(Debug)]
#[must_use = "an accepted job is settled with its audit line"]
pub struct Accepted {
    path: PathBuf,
}

impl Accepted {
    /// Removes the record of a job that will not run after all (it left a queue
    /// unrun and its caller was answered with a refusal): it gets no line.
    pub fn withdraw(self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// The content of a write-ahead record.
#[derive(Debug, Serialize, Deserialize)]
struct AcceptedRecord {
    owner: Owner,
    /// The line for the log if the owner dies before the job's end.
    interrupted: AuditRecord,
}

/// A process, told apart from a later one with the same pid by its start time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Owner {
    pid: u32,
    /// Field 22 of `/proc/<pid>/stat` (clock ticks since boot), and the boot's id.
    start: u64,
    boot_id: String,
}

impl Owner {
    fn current() -> Option<Self> {
        let pid = std::process::id();
        Some(Self {
            pid,
            start: start_time(pid)?,
            boot_id: boot_id()?,
        })
    }

    /// Whether the process is still running (the same one, not a reused pid).
    fn alive(&self) -> bool {
        boot_id().as_deref() == Some(self.boot_id.as_str())
            && start_time(self.pid) == Some(self.start)
    }
}

fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields count from the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

fn boot_id() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
}

impl AuditLog {
    /// Opens (creating if needed) the log for appending, and the directory of write-ahead
    /// records beside it. Mode 0600/0700: the log names tenants and hashes, which are
    /// nobody else's business.
    pub fn open(path: &Path, fsync: bool) -> Result<Self, EngineError> {
        let err = |source| EngineError::Audit {
            path: path.to_owned(),
            source,
        };
        if let Some(parent) = path.parent()
            && !parent.as_os_str().is_empty()
        {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(err)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)
            .map_err(err)?;
        let mut accepted_dir = path.as_os_str().to_owned();
        accepted_dir.push(".accepted");
        let accepted_dir = PathBuf::from(accepted_dir);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&accepted_dir)
            .map_err(|source| EngineError::Audit {
                path: accepted_dir.clone(),
                source,
            })?;
        Ok(Self {
            path: path.to_owned(),
            accepted_dir,
            fsync,
            file: Mutex::new(LogFile { file, torn: false }),
            unsettled: Mutex::new(Vec::new()),
            failures: AtomicU64::new(0),
        })
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory of write-ahead records of accepted jobs.
    pub fn accepted_dir(&self) -> &Path {
        &self.accepted_dir
    }

    /// Whether the log is being written, and how often it was not.
    pub fn health(&self) -> AuditHealth {
        let unsettled = lock(&self.unsettled).len();
        let torn = lock(&self.file).torn;
        AuditHealth {
            writable: !torn && unsettled == 0,
            write_failures: self.failures.load(Ordering::Relaxed),
            unsettled,
        }
    }

    /// Appends one job record.
    pub fn append(&self, record: &AuditRecord) -> Result<(), EngineError> {
        self.append_line(&record.to_json_line())
    }

    /// Appends one line (already JSON, newline-terminated).
    pub fn append_line(&self, line: &str) -> Result<(), EngineError> {
        let err = |source| EngineError::Audit {
            path: self.path.clone(),
            source,
        };
        let mut log = lock(&self.file);
        let result = (|| -> std::io::Result<()> {
            if log.torn && !ends_with_newline(&log.file)? {
                // The failed write left part of a line: end it, so that the next line
                // parses (the part does not, and says so to whoever reads it).
                log.file.write_all(b"\n")?;
            }
            // One write call with O_APPEND: lines from concurrent writers never interleave.
            log.file.write_all(line.as_bytes())?;
            if self.fsync {
                log.file.sync_data()?;
            }
            Ok(())
        })();
        match result {
            Ok(()) => {
                log.torn = false;
                Ok(())
            }
            Err(e) => {
                log.torn = true;
                self.failures.fetch_add(1, Ordering::Relaxed);
                Err(err(e))
            }
        }
    }

    /// Accepts a job about to run: writes (and, with `fsync`, syncs) its write-ahead record, holding
    /// `interrupted`, the line the log gets should this process die before the job ends.
    /// Lines of earlier jobs the log could not take are written first. An error means the
    /// job must not run: its end could not be audited.
    pub fn accept(&self, interrupted: &AuditRecord) -> Result<Accepted, EngineError> {
        self.write_unsettled()?;
        let path = self
            .accepted_dir
            .join(format!("{}.json", interrupted.job_id.as_str()));
        let err = |source| EngineError::Audit {
            path: self.accepted_dir.clone(),
            source,
        };
        let owner = Owner::current().ok_or_else(|| {
            err(std::io::Error::other(
                "this process's start time is not readable from /proc",
            ))
        })?;
        let mut record = interrupted.clone();
        record.interrupted = true;
        let text = serde_json::to_vec(&AcceptedRecord {
            owner,
            interrupted: record,
        })
        .map_err(|e| err(std::io::Error::other(e)))?;
        let written = (|| -> std::io::Result<()> {
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            file.write_all(&text)?;
            // A SIGKILL leaves the page cache; syncing guards against a power loss, at
            // the cost the policy's `fsync` accepts for the log itself.
            if self.fsync {
                file.sync_all()?;
                File::open(&self.accepted_dir)?.sync_all()?;
            }
            Ok(())
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&path);
            self.failures.fetch_add(1, Ordering::Relaxed);
            return Err(err(e));
        }
        Ok(Accepted { path })
    }

    /// Whether a job would be accepted now: a write-ahead record can be written and synced
    /// (a probe, removed at once), and no line is waiting for the log.
    pub fn probe(&self) -> Result<(), EngineError> {
        self.write_unsettled()?;
        let path = self
            .accepted_dir
            .join(format!(".probe-{}", std::process::id()));
        let written = (|| -> std::io::Result<()> {
            let mut file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&path)?;
            file.write_all(&[b' '; 512])?;
            file.sync_all()
        })();
        let _ = fs::remove_file(&path);
        written.map_err(|source| EngineError::Audit {
            path: self.accepted_dir.clone(),
            source,
        })
    }

    /// Writes the line of an accepted job and removes its write-ahead record. When the
    /// line cannot be written the record stays, and the line is written before the next
    /// job is accepted (or by the next start of airlock).
    pub fn settle(&self, accepted: Accepted, record: &AuditRecord) -> Result<(), EngineError> {
        match self.append(record) {
            Ok(()) => {
                let _ = fs::remove_file(&accepted.path);
                Ok(())
            }
            Err(e) => {
                lock(&self.unsettled).push((accepted.path, record.clone()));
                Err(e)
            }
        }
    }

    fn write_unsettled(&self) -> Result<(), EngineError> {
        let mut unsettled = lock(&self.unsettled);
        while let Some((path, record)) = unsettled.first() {
            self.append(record)?;
            let _ = fs::remove_file(path);
            unsettled.remove(0);
        }
        Ok(())
    }

    /// Writes the line of every job accepted by a process that is gone (killed, crashed)
    /// and never ended, marked `"interrupted": true`, and removes its record. Records of
    /// live processes (a server beside this `airlock run`) are left alone. Returns how
    /// many were settled.
    pub fn settle_interrupted(&self) -> Result<usize, EngineError> {
        let entries = fs::read_dir(&self.accepted_dir).map_err(|source| EngineError::Audit {
            path: self.accepted_dir.clone(),
            source,
        })?;
        let mut settled = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let Ok(text) = fs::read(&path) else { continue };
            let Ok(record) = serde_json::from_slice::<AcceptedRecord>(&text) else {
                // A record cut short by the crash itself: its job never started (the
                // record is synced before the job runs).
                tracing::warn!(path = %path.display(), "unreadable write-ahead record removed");
                let _ = fs::remove_file(&path);
                continue;
            };
            if record.owner.alive() {
                continue;
            }
            // Another sweep beside this one may have taken it: whoever removes it writes it.
            let claimed = path.with_extension("settling");
            if fs::rename(&path, &claimed).is_err() {
                continue;
            }
            match self.append(&record.interrupted) {
                Ok(()) => {
                    let _ = fs::remove_file(&claimed);
                    settled += 1;
                }
                Err(e) => {
                    let _ = fs::rename(&claimed, &path);
                    return Err(e);
                }
            }
        }
        Ok(settled)
    }
}

fn ends_with_newline(file: &File) -> std::io::Result<bool> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(true);
    }
    let mut last = [0u8; 1];
    file.read_exact_at(&mut last, len - 1)?;
    Ok(last[0] == b'\n')
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::backend::BackendKind;
    use airlock_core::error::ErrorKind;
    use airlock_core::job::JobId;
    use airlock_core::observation::Observation;

    fn interrupted_line() -> AuditRecord {
        AuditRecord::new(
            Default::default(),
            &Observation::error(
                JobId::generate(),
                BackendKind::Native,
                "test",
                ErrorKind::Internal,
                "interrupted",
            ),
        )
    }

    fn lines(log: &Path) -> Vec<serde_json::Value> {
        fs::read_to_string(log)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn jobs_of_a_dead_process_are_settled_once_and_those_of_a_live_one_are_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, true).unwrap();
        let live = interrupted_line();
        let dead = interrupted_line();
        let _live = log.accept(&live).unwrap();
        let dead_record = log.accept(&dead).unwrap();
        // The second job's process: a child that is then killed and reaped.
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let owner = Owner {
            pid: child.id(),
            start: start_time(child.id()).unwrap(),
            boot_id: boot_id().unwrap(),
        };
        assert!(owner.alive());
        let mut stored: AcceptedRecord =
            serde_json::from_slice(&fs::read(&dead_record.path).unwrap()).unwrap();
        stored.owner = owner.clone();
        fs::write(&dead_record.path, serde_json::to_vec(&stored).unwrap()).unwrap();
        assert_eq!(log.settle_interrupted().unwrap(), 0, "its owner still runs");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!owner.alive());

        // A second log on the same path (another engine, `airlock run` beside a server)
        // sweeps too: the line is written exactly once.
        let other = AuditLog::open(&path, true).unwrap();
        assert_eq!(other.settle_interrupted().unwrap(), 1);
        assert_eq!(log.settle_interrupted().unwrap(), 0);
        let written = lines(&path);
        assert_eq!(written.len(), 1, "{written:#?}");
        assert_eq!(written[0]["job_id"], dead.job_id.as_str());
        assert_eq!(written[0]["interrupted"], true);
        assert_eq!(written[0]["outcome"], "error");
        assert_eq!(written[0]["error_kind"], "internal");
        let left: Vec<_> = fs::read_dir(log.accepted_dir())
            .unwrap()
            .flatten()
            .collect();
        assert_eq!(left.len(), 1, "the live job's record stays: {left:?}");
    }

    #[test]
    fn a_settled_job_leaves_no_record_and_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, false).unwrap();
        let line = interrupted_line();
        let accepted = log.accept(&line).unwrap();
        log.settle(accepted, &line).unwrap();
        assert_eq!(fs::read_dir(log.accepted_dir()).unwrap().count(), 0);
        assert_eq!(lines(&path).len(), 1);
        assert!(lines(&path)[0].get("interrupted").is_none());
    }
}
