//! The one error type of this crate. Variants are named after the operation that failed and
//! carry the path or value it failed on; messages never repeat their `source`.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while detecting, creating, limiting, killing or removing
/// cgroups.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// Reading a cgroupfs or procfs file failed.
    #[error("read {path}")]
    ReadFile {
        /// The file that could not be read.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Writing a cgroupfs file failed.
    #[error("write {value:?} to {path}")]
    WriteFile {
        /// The file that could not be written.
        path: PathBuf,
        /// What was being written.
        value: String,
        /// The underlying error.
        source: io::Error,
    },
    /// Creating a cgroup directory failed.
    #[error("create cgroup directory {path}")]
    CreateDir {
        /// The directory that could not be created.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Listing a cgroup directory failed.
    #[error("list cgroup directory {path}")]
    ReadDir {
        /// The directory that could not be listed.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Removing a cgroup directory failed (`EBUSY`: processes are still in it).
    #[error("remove cgroup directory {path}")]
    RemoveDir {
        /// The directory that stays behind.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A file's content is not what the kernel documents for it.
    #[error("parse {what} in {path}: {detail}")]
    Parse {
        /// The file being parsed (`/proc/self/mountinfo`, a cgroupfs file, ...).
        path: PathBuf,
        /// What was expected.
        what: &'static str,
        /// The offending content, shortened.
        detail: String,
    },
    /// No cgroup v1 or v2 filesystem is mounted.
    #[error("no cgroup filesystem is mounted (checked /proc/self/mountinfo)")]
    NoCgroupMount,
    /// A controller the job limits need is not available.
    #[error("cgroup controller {controller} is unavailable: {reason}")]
    MissingController {
        /// `memory`, `cpu`, `cpuacct` or `pids`.
        controller: &'static str,
        /// Why, in words an operator can act on.
        reason: String,
    },
    /// `/proc/self/cgroup` does not say where this process is in a hierarchy we need.
    #[error("this process's cgroup in the {hierarchy} hierarchy is unknown or outside its mount")]
    OwnCgroupUnknown {
        /// The hierarchy (`memory`, `unified`, ...).
        hierarchy: String,
    },
    /// The automatic parent cannot be used on this host.
    #[error("cannot choose a parent cgroup under {own}: {reason}")]
    AutoParent {
        /// This process's own cgroup directory.
        own: PathBuf,
        /// Why, and how to fix it.
        reason: String,
    },
    /// An explicit parent path is not a plain relative path.
    #[error("invalid parent cgroup path {path:?}: {reason}")]
    InvalidParent {
        /// The path as given.
        path: PathBuf,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Enabling controllers for children failed because the cgroup has processes of its own
    /// (the cgroup v2 "no internal processes" rule).
    #[error("enable {controllers} in {path}: the cgroup has processes of its own")]
    InternalProcesses {
        /// The `cgroup.subtree_control` file.
        path: PathBuf,
        /// The controllers being enabled.
        controllers: String,
    },
    /// A job name is not `[A-Za-z0-9_-]{1,64}`.
    #[error("invalid job cgroup name {name:?}: {reason}")]
    InvalidName {
        /// The name as given (shortened).
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A job limit is out of the range the kernel accepts.
    #[error("invalid job limit {limit}: {reason}")]
    InvalidLimit {
        /// Which limit.
        limit: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A job group with this name already exists under the parent.
    #[error("job cgroup {path} already exists")]
    AlreadyExists {
        /// The existing directory.
        path: PathBuf,
    },
    /// Opening a pidfd for a group member failed (other than: the process is gone).
    #[error("pidfd_open for pid {pid}")]
    PidfdOpen {
        /// The process id.
        pid: i32,
        /// The underlying error.
        source: rustix::io::Errno,
    },
    /// Sending SIGKILL through a pidfd failed (other than: the process is gone).
    #[error("send SIGKILL to pid {pid}")]
    Signal {
        /// The process id.
        pid: i32,
        /// The underlying error.
        source: rustix::io::Errno,
    },
    /// The kill sweep hit its round bound with processes still in the group.
    #[error("{path} still has {remaining} process(es) after {rounds} kill rounds")]
    KillIncomplete {
        /// The group's directory.
        path: PathBuf,
        /// Processes still listed after the last round.
        remaining: usize,
        /// Rounds made.
        rounds: u32,
    },
}
