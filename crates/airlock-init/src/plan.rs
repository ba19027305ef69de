//! The sandbox plan: everything the in-sandbox init needs, decided by the supervisor and
//! sent over an inherited pipe as JSON. The init executes it step by step and decides
//! nothing itself, so every security decision is made (and unit-tested) on the supervisor
//! side.

use std::path::PathBuf;

use airlock_seccomp::CompiledSeccomp;
use serde::{Deserialize, Serialize};

pub use airlock_host::ids::{IdMapping, JOB_ID_IN_SANDBOX, NAMESPACE_OWNER_SLOTS};

/// The hidden first argument that turns the airlock binary into the sandbox init.
pub const INIT_ARG: &str = "__airlock-init";

/// The descriptor number on which the init reads its plan.
pub const PLAN_FD: i32 = 3;

/// The descriptor number on which the init reports [`InitEvent`]s.
pub const STATUS_FD: i32 = 4;

/// The descriptor number of a unix socket on which the init hands the supervisor, in one
/// message before the job starts, descriptors it can only create inside the sandbox: an
/// open `/out` (it keeps the tmpfs alive after the sandbox is gone, so the files can be
/// released) and the egress proxy's listening socket (bound in the job's own network
/// namespace, so the job reaches the proxy and nothing else).
pub const HANDOFF_FD: i32 = 5;

/// The descriptor number of a warm sandbox's control pipe: the program (a bootstrap that
/// started ahead of its job) reads the job's arguments from it once the job is delivered,
/// and end-of-file starts the job. Only the supervisor holds the write end.
pub const CONTROL_FD: i32 = 6;

/// The descriptor number of the job's `/work` when it is a tmpfs mounted nowhere on the
/// host (`airlock_host::jobdir::WorkBacking::DetachedTmpfs`): the init attaches it
/// ([`MountStep::AttachWork`]), so the job's mount table names no host path.
pub const WORK_MOUNT_FD: i32 = 7;

/// The port of the egress proxy on the job's own 127.0.0.1.
pub const PROXY_PORT: u16 = airlock_core::job::PROXY_PORT;

/// Processes of the sandbox machinery that live in the job's cgroup beside the job: the
/// helper that created the namespaces and the pid-1 init. `pids.max` is raised by this
/// much so the job itself gets exactly the policy's `pids`.
pub const INIT_PROCESSES: u32 = 2;

/// Per-user counts of the job's user namespace (`/proc/sys/user/<name>` inside it), set by
/// the helper as the namespace's root before anything of the job runs. They bound each uid
/// of the namespace (the job runs as one), below the host-wide per-user limits that the
/// namespace's owner is charged too. Namespaces: none (seccomp refuses creating them anyway;
/// this is the kernel's own second line).
pub const USER_NAMESPACE_LIMITS: &[(&str, u64)] = &[
    // fs.inotify.max_user_instances is 128 by default: a job gets a quarter.
    ("max_inotify_instances", 32),
    ("max_inotify_watches", 8192),
    ("max_fanotify_groups", 0),
    ("max_fanotify_marks", 0),
    ("max_user_namespaces", 0),
    ("max_mnt_namespaces", 0),
    ("max_pid_namespaces", 0),
    ("max_net_namespaces", 0),
    ("max_ipc_namespaces", 0),
    ("max_uts_namespaces", 0),
    ("max_cgroup_namespaces", 0),
    ("max_time_namespaces", 0),
];

/// The job's `RLIMIT_MSGQUEUE`: bytes of POSIX message queues (the kernel's default for a user).
pub const MSGQUEUE_RLIMIT_BYTES: u64 = 819_200;

/// The job's `RLIMIT_SIGPENDING`: signals queued to it at once (the host default is tens of
/// thousands, each a kernel allocation).
pub const SIGPENDING_RLIMIT: u64 = 1024;

/// Mount options that matter for security.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MountOptions {
    /// Read-only.
    pub readonly: bool,
    /// Ignore set-uid bits.
    pub nosuid: bool,
    /// No device nodes.
    pub nodev: bool,
    /// No execution.
    pub noexec: bool,
}

impl MountOptions {
    /// `ro,nosuid,nodev`.
    pub const RO: Self = Self {
        readonly: true,
        nosuid: true,
        nodev: true,
        noexec: false,
    };
    /// `rw,nosuid,nodev`.
    pub const RW: Self = Self {
        readonly: false,
        nosuid: true,
        nodev: true,
        noexec: false,
    };
    /// `rw,nosuid,nodev,noexec`.
    pub const RW_NOEXEC: Self = Self {
        readonly: false,
        nosuid: true,
        nodev: true,
        noexec: true,
    };
    /// `ro,nosuid,nodev,noexec`.
    pub const RO_NOEXEC: Self = Self {
        readonly: true,
        nosuid: true,
        nodev: true,
        noexec: true,
    };
}

/// One step of building the new root. Targets are relative to the new root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum MountStep {
    /// Create a directory (parents must exist).
    Mkdir {
        /// Path in the new root.
        target: String,
        /// Permission bits.
        mode: u32,
    },
    /// Create a symbolic link.
    Symlink {
        /// Path of the link in the new root.
        target: String,
        /// What it points to.
        points_to: String,
    },
    /// Write a small file.
    File {
        /// Path in the new root.
        target: String,
        /// Its content.
        content: String,
        /// Permission bits.
        mode: u32,
    },
    /// Mount a tmpfs.
    Tmpfs {
        /// Mount point in the new root (created if missing).
        target: String,
        /// Size cap.
        size_bytes: u64,
        /// Permission bits of its root.
        mode: u32,
        /// Options.
        options: MountOptions,
        /// Cap on files and directories, when the count matters (`/out`).
        #[serde(default)]
        inodes: Option<u64>,
        /// In-sandbox uid and gid owning its root, when not the sandbox's root.
        #[serde(default)]
        owner: Option<u32>,
    },
    /// Bind a host path (a directory or a file) into the new root.
    Bind {
        /// Host path.
        source: PathBuf,
        /// Mount point in the new root (created if missing, as a directory or an empty file).
        target: String,
        /// Options.
        options: MountOptions,
        /// Skip silently when the source does not exist (optional extras such as CA certs).
        optional: bool,
    },
    /// Mount over the file `target` a copy of the host file `source`, held in a tmpfs of
    /// its own (staged, bound, then the staging mount detached): the job's mount table
    /// then names that tmpfs's file, not the host path (the job's CA bundle).
    FileCopy {
        /// Host file (a few MiB at most).
        source: PathBuf,
        /// An existing file in the new root.
        target: String,
        /// Options.
        options: MountOptions,
    },
    /// Attach the detached mount handed over on [`WORK_MOUNT_FD`] at `target`, then bind
    /// it onto itself with `options`: the job's view is that bind, so a read-only `/work`
    /// leaves the supervisor's descriptor writable (a warm sandbox's job is written
    /// through it after the sandbox is built).
    AttachWork {
        /// Mount point in the new root (created if missing).
        target: String,
        /// Options.
        options: MountOptions,
    },
    /// Mount a read-only overlayfs whose layers are `lower` and the empty `spare`
    /// (overlayfs needs two lower layers when it has no upper one): the files of `lower`
    /// under a superblock, and so inodes, of the job's own.
    Overlay {
        /// Host directory shown.
        lower: PathBuf,
        /// An empty host directory.
        spare: PathBuf,
        /// Mount point in the new root (created if missing).
        target: String,
        /// Options (read-only always).
        options: MountOptions,
    },
    /// Mount a fresh procfs for the job's pid namespace.
    Proc {
        /// Mount point in the new root.
        target: String,
    },
    /// Hide a path under an already mounted filesystem (for example `/proc/kcore`): a file
    /// is covered by `/dev/null`, a directory by an empty read-only tmpfs. Skipped when the
    /// path does not exist.
    Mask {
        /// Path in the new root.
        target: String,
    },
    /// Make a subtree read-only by binding it onto itself (for example `/proc/sys`).
    /// Skipped when the path does not exist.
    ReadonlyBind {
        /// Path in the new root.
        target: String,
    },
    /// Remount an existing mount point read-only (after it was populated).
    RemountReadonly {
        /// Path in the new root.
        target: String,
        /// Options to keep.
        options: MountOptions,
    },
}

/// A resource limit to set before exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RlimitSetting {
    /// Which limit.
    pub resource: RlimitResource,
    /// Soft and hard value.
    pub value: u64,
}

/// The rlimits airlock sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RlimitResource {
    /// Open files.
    Nofile,
    /// Largest file written.
    Fsize,
    /// Core dumps.
    Core,
    /// CPU seconds (a backstop behind the wall-time kill).
    Cpu,
    /// Address space: the memory limit when no cgroup is available (degraded).
    As,
    /// Processes of the job's uid in its user namespace: the pids limit when no cgroup is
    /// available (degraded; per user namespace since Linux 5.14).
    Nproc,
    /// Bytes of POSIX message queues.
    Msgqueue,
    /// Queued signals.
    Sigpending,
}

/// Everything the init needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxPlan {
    /// For messages.
    pub job_id: String,
    /// The supervisor's pid: the helper dies with it (parent-death signal) and checks it is
    /// still its parent after arming that signal.
    pub supervisor_pid: i32,
    /// The files the helper writes `0` to before anything else, to join the job's cgroup
    /// (v1: each hierarchy's `tasks`, v2: `cgroup.procs`; `airlock_cgroup::JobCgroup::join_files`).
    pub cgroup_join: Vec<PathBuf>,
    /// The id mapping.
    pub ids: IdMapping,
    /// The host uid and gid the helper switches to before it creates the user namespace,
    /// which that uid then owns ([`IdMapping::namespace_owner`]); `None` rootless.
    #[serde(default)]
    pub namespace_owner: Option<u32>,
    /// `/proc/sys/user/<name>` values of the job's user namespace ([`USER_NAMESPACE_LIMITS`]).
    #[serde(default)]
    pub user_namespace_limits: Vec<(String, u64)>,
    /// Whether the init sets `vm.memfd_noexec = 2` in the job's pid namespace (root mode on
    /// Linux 6.3+, where it is per pid namespace), so code written to a memfd cannot run.
    #[serde(default)]
    pub memfd_noexec: bool,
    /// Host path of the empty directory the new root's tmpfs is mounted on.
    pub new_root: PathBuf,
    /// Size of the new root's tmpfs (it holds only the synthesized `/etc` and mount points).
    pub root_size_bytes: u64,
    /// Steps that build the new root, in order.
    pub mounts: Vec<MountStep>,
    /// The sandbox's host name.
    pub hostname: String,
    /// Whether to bring `lo` up.
    pub loopback_up: bool,
    /// The job's working directory.
    pub cwd: String,
    /// rlimits.
    pub rlimits: Vec<RlimitSetting>,
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// The program's whole environment.
    pub env: Vec<(String, String)>,
    /// The seccomp filters, installed last before exec.
    pub seccomp: CompiledSeccomp,
    /// Whether to hand over an open descriptor of `/out` on [`HANDOFF_FD`].
    pub send_out_dir: bool,
    /// When set, bind a listening socket on the sandbox's `127.0.0.1:<port>` and hand it over
    /// on [`HANDOFF_FD`] (after `/out`, when both are sent).
    pub proxy_port: Option<u16>,
    /// Whether the program inherits the control pipe's read end on [`CONTROL_FD`] (warm
    /// sandboxes only; a zygote gets its end of a socket there instead).
    #[serde(default)]
    pub control_fd: bool,
    /// What the program is: a job's (every privilege dropped, both filters installed) or a
    /// warm pool's zygote.
    #[serde(default)]
    pub program: ProgramRole,
    /// rlimits the helper sets on itself (soft and hard) as host root, before it creates
    /// the user namespace, which takes its per-namespace ceilings of the rlimit-counted
    /// budgets from them. A zygote's template raises the message-queue and queued-signal
    /// ceilings to the sum its children may hold (`airlock_native::zygote`); empty otherwise.
    #[serde(default)]
    pub helper_rlimits: Vec<RlimitSetting>,
}

/// What a sandbox's program is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgramRole {
    /// A job: it runs as uid 65534 with no capability, `no_new_privs` and both seccomp
    /// filters.
    #[default]
    Job,
    /// A warm pool's zygote (`airlock_native::zygote`): airlock's own Python program, which never
    /// runs job code. It keeps the sandbox root's capabilities, inside the template
    /// sandbox's namespaces only (never the host's), because each child it forks builds its
    /// own namespaces and then drops them all; it gets `no_new_privs` and no seccomp filter,
    /// like the init. The init then outlives it until every process of the sandbox is gone,
    /// so that its children's jobs never end with it.
    Zygote,
}

impl SandboxPlan {
    /// How many descriptors the init hands over.
    pub fn handoff_count(&self) -> usize {
        usize::from(self.send_out_dir) + usize::from(self.proxy_port.is_some())
    }
}

/// What the init reports to the supervisor, one JSON line each, on [`STATUS_FD`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum InitEvent {
    /// The program was executed; its wall time starts now.
    Started,
    /// The program exited.
    Exited {
        /// Exit code.
        code: i32,
        /// Resource use of the program and every process the init reaped.
        usage: Option<Usage>,
    },
    /// A signal killed the program.
    Signaled {
        /// Signal number.
        signal: i32,
        /// Resource use, as for `Exited`.
        usage: Option<Usage>,
    },
    /// A setup step failed; the program never ran.
    Failed {
        /// The step, e.g. `"mount /proc"`.
        step: String,
        /// The OS error number, when there is one.
        errno: Option<i32>,
        /// A human explanation.
        detail: String,
    },
}

/// Resource use measured by the init (`getrusage` of its reaped children). Used when no
/// cgroup measures the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// User plus system CPU time.
    pub cpu_ms: u64,
    /// The largest process's peak resident size.
    pub max_rss_bytes: u64,
}

/// The longest event line the init writes. Below `PIPE_BUF`, so each write is atomic.
pub const EVENT_MAX_BYTES: usize = 2048;

impl InitEvent {
    /// The event as one line, cut to [`EVENT_MAX_BYTES`].
    pub fn to_line(&self) -> Vec<u8> {
        let mut event = self.clone();
        if let InitEvent::Failed { detail, .. } = &mut event
            && detail.len() > EVENT_MAX_BYTES / 2
        {
            let mut cut = EVENT_MAX_BYTES / 2;
            while !detail.is_char_boundary(cut) {
                cut -= 1;
            }
            detail.truncate(cut);
        }
        let mut line = serde_json::to_vec(&event).unwrap_or_else(|_| {
            br#"{"event":"failed","step":"report","errno":null,"detail":"unencodable event"}"#
                .to_vec()
        });
        line.push(b'\n');
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn every_user_namespace_limit_names_a_sysctl_of_this_kernel() {
        // The init skips a name the kernel lacks (older kernels), so a misspelt name would be
        // skipped silently: check each against this (recent) kernel.
        let kernel = rustix::system::uname();
        let release = kernel.release().to_string_lossy().into_owned();
        let mut parts = release.split(|c: char| !c.is_ascii_digit());
        let version = (
            parts
                .next()
                .and_then(|p| p.parse::<u32>().ok())
                .unwrap_or(0),
            parts
                .next()
                .and_then(|p| p.parse::<u32>().ok())
                .unwrap_or(0),
        );
        if version < (5, 13) {
            eprintln!("Linux {release} predates max_fanotify_*; nothing to check");
            return;
        }
        for (name, _) in USER_NAMESPACE_LIMITS {
            let path = std::path::Path::new("/proc/sys/user").join(name);
            assert!(path.exists(), "{} does not exist", path.display());
        }
    }

    #[test]
    fn event_lines_are_short_and_parse_back() {
        let event = InitEvent::Failed {
            step: "mount".into(),
            errno: Some(1),
            detail: "é".repeat(5000),
        };
        let line = event.to_line();
        assert!(line.len() <= EVENT_MAX_BYTES, "{}", line.len());
        let back: InitEvent = serde_json::from_slice(&line).unwrap();
        assert!(matches!(back, InitEvent::Failed { .. }));
        assert_eq!(
            InitEvent::Exited {
                code: 3,
                usage: None
            }
            .to_line(),
            b"{\"event\":\"exited\",\"code\":3,\"usage\":null}\n"
        );
    }
}
