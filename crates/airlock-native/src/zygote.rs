//! The warm pool's fork server (`[native] zygote`, issue 18): one trusted Python
//! interpreter per template that imports the policy's preload list once and then only
//! forks, each child building its own sandbox before it waits for its job.
//!
//! The zygote runs in a sandbox of its own (the template's: the same root, limits and
//! environment as the jobs it serves) as that sandbox's root, with the capabilities a
//! child's setup needs inside the template's namespaces and none outside
//! ([`ProgramRole::Zygote`]). It never runs job code and never holds job data: a fork
//! request carries only descriptors (the child's stdio pipes, status pipe, control pipe,
//! a socket to the host, a detached mount of the child's own `/work`, and its cgroup's
//! `cgroup.procs` files), which the zygote closes as soon as it has forked. Its program,
//! `zygote.py`, is the one place where a child's privileged setup is written down; the
//! child's plan ([`ChildPlan`]) is derived here from the very [`SandboxPlan`] a fresh
//! sandbox of the template would get, so the data has one source.
//!
//! Each child, in order: writes itself into its job cgroup; sends the host a pidfd of
//! itself (the kernel adds its pid in the host's pid namespace, which must agree); enters
//! a user namespace of its own (mapped 1:1 onto the template's by the zygote, which is
//! still in the template's, so that per-user kernel counts are the child's alone); new mount, cgroup,
//! net, ipc, uts and pid namespaces; a fresh `/tmp`, `/dev/shm` and `/out` and its own
//! `/work`; then pid 1 (fresh `/proc`, per-namespace counts, the masks) and the job
//! process (rlimits, every capability dropped and checked, uid 65534, `no_new_privs`, the
//! job's environment, reseeded random state, the modules of a fresh interpreter plus the
//! preloaded ones, stdio and the control pipe only, both seccomp filters), which says it
//! started and waits for its job as a warm sandbox's bootstrap does. From the host's side
//! a child is then a [`Launched`] sandbox like any other.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_cgroup::{CpuPriority, JobCgroup};
use airlock_core::warm::python;
use airlock_core::{JobId, JobSpec};
use airlock_host::jobdir::{JobDir, WorkBacking};
use airlock_seccomp::FilterName;
use serde::Serialize;
use tokio::io::AsyncReadExt;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use crate::backend::{NativeBackend, STATUS_EVENTS_MAX};
use crate::error::NativeError;
use crate::helper::{Helper, HelperInput, HelperOutput};
use crate::launch::{Launched, await_start, read_events, unix_socket_pair};
use crate::mount_plan::PROC_READONLY;
use crate::plan::{
    IdMapping, InitEvent, JOB_ID_IN_SANDBOX, MSGQUEUE_RLIMIT_BYTES, MountOptions, MountStep,
    ProgramRole, RlimitResource, RlimitSetting, SIGPENDING_RLIMIT, SandboxPlan,
    USER_NAMESPACE_LIMITS,
};
use crate::teardown::teardown;

/// The zygote's program: its loop, and each child's setup.
const ZYGOTE_PY: &str = include_str!("zygote.py");

/// Most children of one zygote alive at once, waiting or running a job. Their per-user
/// counts add up in the template's user namespace and in its owner's on the host, so this
/// bounds what they may take together ([`child_namespace_limits`]); beyond it, the pool
/// starts sandboxes from scratch.
pub const ZYGOTE_CHILDREN_MAX: u32 = 16;

/// Longest wait for a zygote to start, import its preload list and say it is ready (the
/// import runs at the lowest CPU priority, behind whatever jobs run).
pub const ZYGOTE_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Longest wait for the zygote's answer to a fork request, and then for the child to
/// register its pidfd.
pub const FORK_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest message the zygote sends (a reply to a request).
const REPLY_MAX_BYTES: usize = 512;

/// Bytes of the zygote's own stdout and stderr kept for the log when it fails.
const DIAGNOSTICS_MAX_BYTES: usize = 4096;

/// Descriptors of a fork request before the cgroup's `cgroup.procs` files: stdin,
/// stdout, stderr, status, control, the host socket, the `/work` mount.
const FORK_FIXED_FDS: usize = 7;

/// The mount steps of a fresh sandbox that each child makes again over the template's:
/// tmpfs targets.
const CHILD_TMPFS_TARGETS: &[&str] = &["tmp", "dev/shm", "out"];

/// What every child of a zygote is told once, at the zygote's start (`zygote.py` reads
/// it): the part of the template's [`SandboxPlan`] a child applies itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChildPlan {
    /// The child's user namespace: ids 1:1 onto the template's.
    pub uid_map: String,
    /// As `uid_map`.
    pub gid_map: String,
    /// `/proc/sys/user/<name>` of the child's user namespace.
    pub user_namespace_limits: Vec<(String, u64)>,
    /// Tmpfs mounts made again over the template's (`/tmp`, `/dev/shm`, `/out`).
    pub mounts: Vec<MountStep>,
    /// The options of the job's `/work`.
    pub work: MountOptions,
    /// The options of a session's `/work` (always writable), in place of `work` when a
    /// fork is for a session's job.
    pub session_work: MountOptions,
    /// The options of a session's own `/tmp`, attached in place of the fresh one when a
    /// fork for a session carries it.
    pub session_tmp: MountOptions,
    /// pid 1's: the fresh `/proc`, then its masks and read-only subtrees.
    pub proc: Vec<MountStep>,
    /// The sandbox's host name.
    pub hostname: String,
    /// Whether to bring `lo` up.
    pub loopback_up: bool,
    /// The job's working directory.
    pub cwd: String,
    /// The job's rlimits.
    pub rlimits: Vec<RlimitSetting>,
    /// The job's whole environment.
    pub env: Vec<(String, String)>,
    /// The uid and gid the job runs as.
    pub job_id: u32,
    /// The seccomp programs, allow then deny, as hex of `struct sock_filter` arrays.
    pub seccomp: Vec<String>,
    /// Whether pid 1 hands the host an open `/out`.
    pub send_out_dir: bool,
    /// How many `cgroup.procs` descriptors each fork request carries.
    pub cgroup_procs: usize,
}

impl ChildPlan {
    /// The child's part of `plan`, the plan a fresh sandbox of the template gets, with
    /// the job rlimits of `budgets`.
    pub fn from_plan(
        plan: &SandboxPlan,
        limits: &ChildLimits,
        budgets: &RlimitBudgets,
    ) -> Result<Self, NativeError> {
        let missing = |what: &str| NativeError::Zygote {
            step: "plan a child",
            detail: format!("the template's mount plan has no {what}"),
        };
        let mounts: Vec<MountStep> = plan
            .mounts
            .iter()
            .filter(|s| {
                matches!(s, MountStep::Tmpfs { target, .. }
                    if CHILD_TMPFS_TARGETS.contains(&target.as_str()))
            })
            .cloned()
            .collect();
        let work = plan
            .mounts
            .iter()
            .find_map(|s| match s {
                MountStep::Bind {
                    target, options, ..
                }
                | MountStep::AttachWork { target, options }
                    if target == "work" =>
                {
                    Some(*options)
                }
                _ => None,
            })
            .ok_or_else(|| missing("/work"))?;
        let proc = proc_steps(&plan.mounts);
        if !matches!(proc.first(), Some(MountStep::Proc { .. })) {
            return Err(missing("/proc"));
        }
        let map = format!("0 0 {}\n", IdMapping::ROOT_RANGE);
        Ok(Self {
            uid_map: map.clone(),
            gid_map: map,
            user_namespace_limits: child_namespace_limits(limits),
            mounts,
            work,
            session_work: crate::mount_plan::workdir_options(airlock_core::policy::WorkdirMode::Rw),
            session_tmp: crate::mount_plan::SESSION_TMP_OPTIONS,
            proc,
            hostname: plan.hostname.clone(),
            loopback_up: plan.loopback_up,
            cwd: plan.cwd.clone(),
            rlimits: plan
                .rlimits
                .iter()
                .map(|setting| {
                    budgets
                        .job
                        .iter()
                        .find(|b| b.resource == setting.resource)
                        .copied()
                        .unwrap_or(*setting)
                })
                .collect(),
            env: plan.env.clone(),
            job_id: JOB_ID_IN_SANDBOX,
            seccomp: FilterName::INSTALL_ORDER
                .iter()
                .map(|f| hex::encode(plan.seccomp.program_bytes(*f)))
                .collect(),
            send_out_dir: plan.send_out_dir,
            cgroup_procs: plan.cgroup_join.len(),
        })
    }
}

/// The `/proc` mount of a plan and the masks and read-only subtrees that follow it.
fn proc_steps(mounts: &[MountStep]) -> Vec<MountStep> {
    mounts
        .iter()
        .skip_while(|s| !matches!(s, MountStep::Proc { .. }))
        .take_while(|s| {
            matches!(
                s,
                MountStep::Proc { .. } | MountStep::Mask { .. } | MountStep::ReadonlyBind { .. }
            )
        })
        .cloned()
        .collect()
}

/// The host's per-user inotify budgets, which every child of one zygote draws on as the
/// template's owner: the kernel checks a per-user count at each user namespace up to the
/// host's (`fs.inotify.max_user_*`), and all children of a zygote have the same owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildLimits {
    /// `fs.inotify.max_user_instances` of the host.
    pub host_inotify_instances: u64,
    /// `fs.inotify.max_user_watches` of the host.
    pub host_inotify_watches: u64,
}

impl ChildLimits {
    /// The host's values (the kernel's defaults when unreadable).
    pub fn of_host() -> Self {
        let read = |name: &str, default: u64| {
            std::fs::read_to_string(format!("/proc/sys/fs/inotify/{name}"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(default)
        };
        Self {
            host_inotify_instances: read("max_user_instances", 128),
            host_inotify_watches: read("max_user_watches", 8192),
        }
    }
}

/// A fresh sandbox's count of `name` ([`USER_NAMESPACE_LIMITS`]).
fn fresh_limit(name: &str) -> u64 {
    USER_NAMESPACE_LIMITS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, v)| *v)
}

/// One child's share of an inotify budget: a fresh sandbox's, or less, so that
/// [`ZYGOTE_CHILDREN_MAX`] children together stay within the host's per-user value.
fn child_share(name: &str, host: u64) -> u64 {
    (host / u64::from(ZYGOTE_CHILDREN_MAX)).clamp(1, fresh_limit(name).max(1))
}

/// A child's per-namespace counts: a fresh sandbox's, with the inotify budgets cut to a
/// share of the host's (one owner for all the zygote's children).
pub fn child_namespace_limits(limits: &ChildLimits) -> Vec<(String, u64)> {
    USER_NAMESPACE_LIMITS
        .iter()
        .map(|(name, value)| {
            let value = match *name {
                "max_inotify_instances" => child_share(name, limits.host_inotify_instances),
                "max_inotify_watches" => child_share(name, limits.host_inotify_watches),
                _ => *value,
            };
            ((*name).to_owned(), value)
        })
        .collect()
}

/// How many namespaces of each kind the template counts per child it may hold at once.
/// A child's namespaces are not uncounted when it exits: the kernel frees a user namespace
/// from a work queue once its last reference goes, and a network namespace (which holds
/// one on its owner) is cleaned up later still, in batches after an RCU grace period. With
/// room for exactly [`ZYGOTE_CHILDREN_MAX`], a busy pool's next child found the count full
/// of namespaces of children already gone (`unshare user namespaces: No space left on
/// device`, issue 34) and the pool fell back to fresh sandboxes. The headroom is only the
/// zygote's: each child sets its own counts to 0 before any job code runs, and seccomp
/// refuses namespace creation to jobs anyway.
pub const ZYGOTE_NAMESPACE_HEADROOM: u64 = 4;

/// The template's per-namespace counts: room for [`ZYGOTE_CHILDREN_MAX`] children, each
/// with its own user, mount, pid, net, ipc, uts and cgroup namespace (times
/// [`ZYGOTE_NAMESPACE_HEADROOM`] for the ones the kernel has not freed yet) and its inotify
/// share; the zygote itself needs nothing.
pub fn template_namespace_limits(limits: &ChildLimits) -> Vec<(String, u64)> {
    let children = u64::from(ZYGOTE_CHILDREN_MAX);
    let namespaces = children * ZYGOTE_NAMESPACE_HEADROOM;
    child_namespace_limits(limits)
        .into_iter()
        .map(|(name, child)| {
            let value = match name.as_str() {
                "max_inotify_instances" | "max_inotify_watches" => child * children,
                "max_user_namespaces"
                | "max_mnt_namespaces"
                | "max_pid_namespaces"
                | "max_net_namespaces"
                | "max_ipc_namespaces"
                | "max_uts_namespaces"
                | "max_cgroup_namespaces" => namespaces,
                _ => child,
            };
            (name, value)
        })
        .collect()
}

/// The rlimit-counted budgets (message queue bytes, queued signals) of a zygote's
/// children. The kernel counts them per user up the chain of user namespaces, and checks
/// each level against a ceiling the namespace took from its creator's (soft) rlimit: so the
/// children's jobs, each limited by its own rlimit, also add up in the template's
/// namespace and in its owner's on the host, against the template's ceiling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlimitBudgets {
    /// What the template's helper sets (soft and hard) as host root before it creates the
    /// user namespace: the sum over [`ZYGOTE_CHILDREN_MAX`] jobs, where airlock's own
    /// limits allow it or it may raise them (`CAP_SYS_RESOURCE`).
    pub helper: Vec<RlimitSetting>,
    /// The job rlimits a child gets in place of a fresh sandbox's: where the sum cannot be
    /// had, each job gets its share of what can, so that no child can take another's.
    pub job: Vec<RlimitSetting>,
}

impl RlimitBudgets {
    /// The budgets for a process whose hard limits are `hard(resource)` and which may or
    /// may not raise them.
    pub fn new(hard: impl Fn(RlimitResource) -> u64, may_raise: bool) -> Self {
        let children = u64::from(ZYGOTE_CHILDREN_MAX);
        let mut budgets = Self {
            helper: Vec::new(),
            job: Vec::new(),
        };
        for (resource, per_job) in [
            (RlimitResource::Msgqueue, MSGQUEUE_RLIMIT_BYTES),
            (RlimitResource::Sigpending, SIGPENDING_RLIMIT),
        ] {
            let wanted = per_job * children;
            let hard = hard(resource);
            let ceiling = if may_raise { wanted } else { wanted.min(hard) };
            budgets.helper.push(RlimitSetting {
                resource,
                value: ceiling,
            });
            budgets.job.push(RlimitSetting {
                resource,
                value: per_job.min(ceiling / children),
            });
        }
        budgets
    }

    /// The budgets of this process (the supervisor, whose limits the helper inherits).
    pub fn of_this_process() -> Self {
        let may_raise = rustix::thread::capabilities(None).is_ok_and(|sets| {
            sets.effective
                .contains(rustix::thread::CapabilitySet::SYS_RESOURCE)
        });
        Self::new(
            |resource| {
                let resource = match resource {
                    RlimitResource::Msgqueue => rustix::process::Resource::Msgqueue,
                    _ => rustix::process::Resource::Sigpending,
                };
                rustix::process::getrlimit(resource)
                    .maximum
                    .unwrap_or(u64::MAX)
            },
            may_raise,
        )
    }
}

/// The zygote's `python3 <flags> -c PROGRAM` argv for `template`, or `None` unless the
/// template's command ends with its source file.
pub fn zygote_argv(template: &JobSpec, preload: &[String]) -> Option<Vec<String>> {
    let program = format!(
        "{}{}{}",
        python::PYTHON_PRELOAD,
        python::run_job_program(crate::plan::CONTROL_FD),
        ZYGOTE_PY
            .replace("{MODULES}", &python::module_list(preload))
            .replace(
                "{KERNEL_MODULES}",
                &python::module_list(python::KERNEL_MODULES)
            )
            .replace("{STATUS_FD}", &crate::plan::STATUS_FD.to_string())
    );
    python::interpreter_running(template, program)
}

/// The template's plan: `plan` (a fresh sandbox's, for the template job, without its
/// `/work`) with the zygote as its program. Its `/proc` is left unmasked: a child mounts its own `/proc` from a user
/// namespace of its own, which the kernel allows only where a `/proc` is fully visible
/// already; the zygote itself is trusted, and each child masks its own.
fn template_plan(
    mut plan: SandboxPlan,
    name: &str,
    argv: Vec<String>,
    budgets: &RlimitBudgets,
) -> SandboxPlan {
    let limits = ChildLimits::of_host();
    plan.job_id = name.to_owned();
    plan.argv = argv;
    plan.cwd = "/".to_owned();
    plan.mounts.retain(|s| match s {
        MountStep::Mask { target } => !target.starts_with("proc/"),
        MountStep::ReadonlyBind { target } => !PROC_READONLY.contains(&target.as_str()),
        // Each child attaches its own job's /work over the empty directory; a mount of
        // the template's own would stay under it, in every job's mount table.
        MountStep::Bind { target, .. } | MountStep::AttachWork { target, .. } => target != "work",
        _ => true,
    });
    plan.rlimits = vec![RlimitSetting {
        resource: RlimitResource::Core,
        value: crate::backend::CORE_RLIMIT_BYTES,
    }];
    plan.user_namespace_limits = template_namespace_limits(&limits);
    plan.helper_rlimits = budgets.helper.clone();
    plan.program = ProgramRole::Zygote;
    plan.control_fd = true;
    plan
}

/// What a fork for a session's job changes of a child: its `/work` is the session's
/// workspace and its `/tmp` the session's own when it keeps one (host directories, each
/// attached from a detached copy of its mount), and its CPU-time limit is the one of the
/// job's wall time (a kernel's is the session's `ttl`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionMounts {
    /// The session's workspace on the host.
    pub work: std::path::PathBuf,
    /// The session's `/tmp` on the host, when it keeps one; else the child's is fresh.
    pub tmp: Option<std::path::PathBuf>,
    /// `RLIMIT_CPU` of the job, in seconds.
    pub cpu_rlimit_secs: u64,
    /// A kernel session's driver: it keeps the modules the driver imports
    /// ([`python::KERNEL_MODULES`]), already imported by the zygote.
    pub kernel: bool,
}

/// A detached copy (`open_tree` clone, close-on-exec) of the mount at `path`, for a child
/// to attach.
fn detached_copy(path: &std::path::Path, step: &'static str) -> Result<OwnedFd, NativeError> {
    rustix::mount::open_tree(
        rustix::fs::CWD,
        path,
        rustix::mount::OpenTreeFlags::OPEN_TREE_CLONE
            | rustix::mount::OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(|e| zygote_io(step, &e.into()))
}

/// A running zygote: its template sandbox and the socket to it. Every child holds an
/// `Arc` of it: the template's init outlives the zygote while a child runs, and the pool
/// removes the template once no child is left.
pub(crate) struct Zygote {
    name: String,
    started_at: Instant,
    socket: tokio::sync::Mutex<Option<AsyncFd<OwnedFd>>>,
    cgroup_procs: usize,
    template: Mutex<Option<Template>>,
    diagnostics: Arc<Mutex<Vec<u8>>>,
    /// Set once the zygote was seen gone.
    ended: std::sync::atomic::AtomicBool,
    /// Jobs waiting on a fork now: while there are any, the template sandbox runs at
    /// normal CPU priority.
    jobs_waiting: Mutex<usize>,
}

/// The zygote's sandbox held at normal CPU priority while a job waits on its fork
/// ([`Zygote::raised_for_a_job`]); back to the lowest once no job waits.
pub(crate) struct RaisedForJob<'a> {
    zygote: &'a Zygote,
}

impl Drop for RaisedForJob<'_> {
    fn drop(&mut self) {
        self.zygote.count_job_waiting(false);
    }
}

/// The template sandbox a zygote runs in.
struct Template {
    launched: Launched,
    jobdir: JobDir,
    cgroup: Option<JobCgroup>,
}

impl std::fmt::Debug for Zygote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Zygote")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Zygote {
    /// Starts a zygote for jobs like `template` whose interpreter imported `preload`, and
    /// waits until it is ready to fork. Root mode only.
    pub(crate) async fn start(
        backend: &NativeBackend,
        template: &JobSpec,
        preload: &[String],
    ) -> Result<Arc<Self>, NativeError> {
        let ids = backend.id_mapping();
        if !matches!(ids, IdMapping::Root { .. }) {
            return Err(NativeError::Unsupported {
                control: "zygote",
                reason: "a zygote's children map their ids through the template's, which only \
                         a root airlock has; warm sandboxes start from scratch instead"
                    .into(),
            });
        }
        let argv = zygote_argv(template, preload).ok_or_else(|| NativeError::Zygote {
            step: "start",
            detail: format!(
                "the command {:?} does not end with the source file",
                template.argv
            ),
        })?;
        let name = format!("zygote-{}", JobId::generate().as_str());
        // The template's own /work is never a job's (each child attaches its job's).
        let jobdir =
            JobDir::create_empty(backend.runtime_dir(), &name, &ids, WorkBacking::Directory)?;
        let cgroup = match backend.create_cgroup(&name, template) {
            Ok(cgroup) => cgroup,
            Err(e) => {
                remove_quietly(None, jobdir).await;
                return Err(e);
            }
        };
        if let Some(cgroup) = &cgroup
            && let Err(e) = cgroup.set_cpu_priority(CpuPriority::Background)
        {
            tracing::warn!(zygote = %name, error = %e,
                "cannot lower a zygote's CPU priority; it runs at normal priority");
        }
        let plan = match backend.plan(template, &jobdir, cgroup.as_ref(), None) {
            Ok(plan) => plan,
            Err(e) => {
                remove_quietly(cgroup, jobdir).await;
                return Err(e);
            }
        };
        let budgets = RlimitBudgets::of_this_process();
        if budgets.job.iter().any(|b| {
            plan.rlimits
                .iter()
                .any(|r| r.resource == b.resource && r.value != b.value)
        }) {
            tracing::info!(zygote = %name, budgets = ?budgets.job,
                "airlock cannot raise the rlimit ceilings its zygote's children share \
                 (no CAP_SYS_RESOURCE): each forked job gets its share");
        }
        let child_plan = match ChildPlan::from_plan(&plan, &ChildLimits::of_host(), &budgets) {
            Ok(child_plan) => child_plan,
            Err(e) => {
                remove_quietly(cgroup, jobdir).await;
                return Err(e);
            }
        };
        let plan = template_plan(plan, &name, argv, &budgets);
        let mut launched = match backend.launch(&name, &plan, false, None).await {
            Ok(launched) => launched,
            Err(e) => {
                remove_quietly(cgroup, jobdir).await;
                return Err(e);
            }
        };
        let diagnostics = Arc::new(Mutex::new(Vec::new()));
        let (stdout, stderr) = take_output(&mut launched);
        for stream in [stdout, stderr] {
            tokio::spawn(keep_tail(stream, diagnostics.clone()));
        }
        let socket = launched.control.take();
        let zygote = Arc::new(Self {
            name,
            started_at: Instant::now(),
            socket: tokio::sync::Mutex::new(None),
            cgroup_procs: child_plan.cgroup_procs,
            template: Mutex::new(Some(Template {
                launched,
                jobdir,
                cgroup,
            })),
            diagnostics,
            ended: std::sync::atomic::AtomicBool::new(false),
            jobs_waiting: Mutex::new(0),
        });
        let ready = async {
            let socket = socket.ok_or_else(|| NativeError::Zygote {
                step: "start",
                detail: "the template sandbox has no zygote socket".into(),
            })?;
            let socket = airlock_sys::process::async_owned_fd(
                socket,
                tokio::io::Interest::READABLE | tokio::io::Interest::WRITABLE,
            )
            .map_err(|e| zygote_io("register the zygote socket", &e))?;
            let config = serde_json::to_vec(&child_plan).map_err(|e| NativeError::Zygote {
                step: "start",
                detail: format!("encode the children's plan: {e}"),
            })?;
            // With the plan, the sandbox init's memfd, which each child's leader and pid 1
            // execute once the sandbox is built (init.rs, `REAP_ARG`).
            let init = backend.init_memfd();
            send(&socket, &config, init.as_slice()).await?;
            let reply = tokio::time::timeout(ZYGOTE_READY_TIMEOUT, receive_reply(&socket)).await;
            match reply {
                Ok(Ok(reply)) if reply == b"ready" => Ok(socket),
                Ok(Ok(reply)) => Err(NativeError::Zygote {
                    step: "start",
                    detail: String::from_utf8_lossy(&reply).into_owned(),
                }),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(NativeError::Zygote {
                    step: "start",
                    detail: format!("not ready within {} s", ZYGOTE_READY_TIMEOUT.as_secs()),
                }),
            }
        }
        .await;
        match ready {
            Ok(socket) => {
                *zygote.socket.lock().await = Some(socket);
                tracing::debug!(zygote = %zygote.name, "zygote ready");
                Ok(zygote)
            }
            Err(e) => {
                // Give the zygote's last words a moment to arrive, for the log.
                tokio::time::sleep(Duration::from_millis(50)).await;
                let said = zygote.said();
                zygote.remove().await;
                Err(match e {
                    NativeError::Zygote { step, detail } if !said.is_empty() => {
                        NativeError::Zygote {
                            step,
                            detail: format!("{detail}; it said: {said}"),
                        }
                    }
                    e => e,
                })
            }
        }
    }

    /// Raises the zygote's sandbox to normal CPU priority until the guard is dropped: a
    /// job waits on the next fork. At the lowest priority, as its refills run, a zygote
    /// gets next to no CPU while jobs keep every CPU busy.
    pub(crate) fn raised_for_a_job(&self) -> RaisedForJob<'_> {
        self.count_job_waiting(true);
        RaisedForJob { zygote: self }
    }

    fn count_job_waiting(&self, arriving: bool) {
        let Ok(mut waiting) = self.jobs_waiting.lock() else {
            return;
        };
        let before = *waiting;
        *waiting = if arriving {
            before + 1
        } else {
            before.saturating_sub(1)
        };
        let priority = match (before, *waiting) {
            (0, 1) => CpuPriority::Normal,
            (1, 0) => CpuPriority::Background,
            _ => return,
        };
        // Written while the count is held, so that a raise and a lowering never cross.
        let template = self.template.lock();
        if let Ok(template) = template
            && let Some(cgroup) = template.as_ref().and_then(|t| t.cgroup.as_ref())
            && let Err(e) = cgroup.set_cpu_priority(priority)
        {
            tracing::debug!(zygote = %self.name, error = %e, ?priority,
                "cannot change the zygote's CPU priority");
        }
    }

    /// Its name (`zygote-<id>`), also its job directory's and cgroup's.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// When it became ready.
    pub(crate) fn started_at(&self) -> Instant {
        self.started_at
    }

    /// The tail of what the zygote printed (nothing, unless it failed).
    pub(crate) fn said(&self) -> String {
        let bytes = self
            .diagnostics
            .lock()
            .map(|d| d.clone())
            .unwrap_or_default();
        String::from_utf8_lossy(&bytes).trim().to_owned()
    }

    /// Whether it can still fork: its template sandbox runs and the zygote has neither
    /// exited nor closed its socket.
    pub(crate) fn is_usable(&self) -> bool {
        use std::sync::atomic::Ordering;
        if self.ended.load(Ordering::Relaxed) {
            return false;
        }
        let Ok(mut template) = self.template.lock() else {
            return false;
        };
        let Some(template) = template.as_mut() else {
            return false;
        };
        let mut alive = template.launched.child.is_running();
        // The init reports the zygote's end on the template's status pipe.
        while let Ok(event) = template.launched.events.try_recv() {
            if matches!(
                event,
                InitEvent::Exited { .. } | InitEvent::Signaled { .. } | InitEvent::Failed { .. }
            ) {
                alive = false;
            }
        }
        if !alive {
            self.ended.store(true, Ordering::Relaxed);
        }
        alive
    }

    /// Stops forking: the zygote sees its socket close and exits. The template stays
    /// while children of it run; [`Zygote::remove`] removes it.
    pub(crate) async fn retire(&self) {
        self.socket.lock().await.take();
    }

    /// Removes the template sandbox, and with it every process still in it (every child
    /// of this zygote, waiting or running: call it once none is left, or at shutdown).
    pub(crate) async fn remove(&self) {
        self.retire().await;
        let template = self.template.lock().ok().and_then(|mut t| t.take());
        if let Some(Template {
            launched,
            jobdir,
            cgroup,
        }) = template
        {
            launched.kill().await;
            remove_quietly(cgroup, jobdir).await;
            tracing::debug!(zygote = %self.name, "zygote removed");
        }
    }

    /// Forks a child into the sandbox prepared for it (`jobdir`, `cgroup`), and waits
    /// until its job process is ready for a job, as [`NativeBackend::launch`] waits for a
    /// warm sandbox's program.
    pub(crate) async fn fork(
        &self,
        label: &str,
        jobdir: &JobDir,
        cgroup: Option<&JobCgroup>,
        send_out_dir: bool,
    ) -> Result<Launched, NativeError> {
        self.fork_with(label, jobdir, cgroup, send_out_dir, None)
            .await
    }

    /// [`Zygote::fork`], for a session's job when `session` is given: the child attaches
    /// the session's own `/tmp` (when it keeps one) in place of a fresh tmpfs, and sets the
    /// CPU-time limit of the job's wall time in place of the template's.
    pub(crate) async fn fork_with(
        &self,
        label: &str,
        jobdir: &JobDir,
        cgroup: Option<&JobCgroup>,
        send_out_dir: bool,
        session: Option<&SessionMounts>,
    ) -> Result<Launched, NativeError> {
        let spawned_at = Instant::now();
        let procs: Vec<OwnedFd> = cgroup
            // `tasks` on v1 (one thread, no global lock: the forked leader has one thread),
            // `cgroup.procs` on v2, as for a helper (docs/speed.md).
            .map(JobCgroup::join_files)
            .unwrap_or_default()
            .iter()
            .map(|path| {
                rustix::fs::open(
                    path,
                    rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )
                .map_err(|e| zygote_io("open the job cgroup's join file", &e.into()))
            })
            .collect::<Result<_, _>>()?;
        if procs.len() != self.cgroup_procs {
            return Err(NativeError::Zygote {
                step: "fork",
                detail: format!(
                    "the job cgroup has {} join files, the zygote expects {}",
                    procs.len(),
                    self.cgroup_procs
                ),
            });
        }
        // A session's workspace (its job written into it already: NativeWarm::
        // fork_for_session); else the job directory's detached tmpfs (the child attaches
        // it, and the host keeps writing the job into it through its own descriptor), else
        // a detached copy of the bind of its work/ directory.
        let work = match (session, jobdir.work_mount()) {
            (Some(session), _) => {
                detached_copy(&session.work, "detach a mount of the session's /work")?
            }
            (None, Some(mount)) => rustix::io::fcntl_dupfd_cloexec(mount, 0)
                .map_err(|e| zygote_io("hand over the job's /work", &e.into()))?,
            (None, None) => detached_copy(&jobdir.work(), "detach a mount of the job's /work")?,
        };
        let session_tmp = session
            .and_then(|s| s.tmp.as_deref())
            .map(|tmp| detached_copy(tmp, "detach a mount of the session's /tmp"))
            .transpose()?;
        let request = match session {
            None => b"fork".to_vec(),
            Some(s) => format!(
                "fork-session cpu={} tmp={} kernel={}",
                s.cpu_rlimit_secs,
                u8::from(session_tmp.is_some()),
                u8::from(s.kernel)
            )
            .into_bytes(),
        };
        let pipe = || {
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
                .map_err(|e| zygote_io("create a pipe", &e.into()))
        };
        let (stdin_read, stdin_write) = pipe()?;
        let (stdout_read, stdout_write) = pipe()?;
        let (stderr_read, stderr_write) = pipe()?;
        let (status_read, status_write) = pipe()?;
        let (control_read, control_write) = pipe()?;
        let (host_end, child_end) = unix_socket_pair(rustix::net::SocketType::SEQPACKET)
            .map_err(|e| zygote_io("create the child's socket", &e.into()))?;
        rustix::net::sockopt::set_socket_passcred(&host_end, true)
            .map_err(|e| zygote_io("pass credentials on the child's socket", &e.into()))?;
        let mut theirs: Vec<BorrowedFd<'_>> = vec![
            stdin_read.as_fd(),
            stdout_write.as_fd(),
            stderr_write.as_fd(),
            status_write.as_fd(),
            control_read.as_fd(),
            child_end.as_fd(),
            work.as_fd(),
        ];
        theirs.extend(procs.iter().map(AsFd::as_fd));
        debug_assert_eq!(theirs.len(), FORK_FIXED_FDS + self.cgroup_procs);
        theirs.extend(session_tmp.as_ref().map(AsFd::as_fd));

        let status_receiver = tokio::net::unix::pipe::Receiver::from_owned_fd(status_read)
            .map_err(|e| zygote_io("status pipe", &e))?;
        let (event_tx, mut events) = mpsc::channel(STATUS_EVENTS_MAX);
        let status_task = tokio::spawn(read_events(status_receiver, event_tx));

        let reply = {
            let socket = self.socket.lock().await;
            let socket = socket.as_ref().ok_or_else(|| NativeError::Zygote {
                step: "fork",
                detail: "the zygote is retired".into(),
            })?;
            send(socket, &request, &theirs).await?;
            tokio::time::timeout(FORK_TIMEOUT, receive_reply(socket))
                .await
                .map_err(|_| NativeError::Zygote {
                    step: "fork",
                    detail: format!("no answer within {} s", FORK_TIMEOUT.as_secs()),
                })??
        };
        drop(theirs);
        drop((
            stdin_read,
            stdout_write,
            stderr_write,
            status_write,
            control_read,
        ));
        drop((child_end, work, procs, session_tmp));
        if !reply.starts_with(b"forked ") {
            return Err(NativeError::Zygote {
                step: "fork",
                detail: String::from_utf8_lossy(&reply).into_owned(),
            });
        }
        tracing::trace!(sandbox = %label, reply = %String::from_utf8_lossy(&reply), "zygote forked");

        // The child's leader registers with a pidfd of itself; the kernel says which
        // process sent it, in our pid namespace.
        let host_end =
            airlock_sys::process::async_owned_fd(host_end, tokio::io::Interest::READABLE)
                .map_err(|e| zygote_io("register the child's socket", &e))?;
        let registered = tokio::time::timeout(FORK_TIMEOUT, receive_registration(&host_end)).await;
        let registration = match registered {
            Ok(Ok(registration)) => registration,
            Ok(Err(e)) => {
                return Err(child_failure(&mut events, e).await);
            }
            Err(_) => {
                return Err(NativeError::Zygote {
                    step: "register",
                    detail: format!(
                        "the child did not register within {} s",
                        FORK_TIMEOUT.as_secs()
                    ),
                });
            }
        };
        let registered_at = spawned_at.elapsed();
        let mut child = Helper::adopt(registration.pidfd)
            .map_err(|e| zygote_io("hold the child's pidfd", &e))?;
        let started_at = await_start(label, &mut events, &mut child).await?;
        tracing::debug!(sandbox = %label,
            registered_us = registered_at.as_micros() as u64,
            cgroup_move_us = registration.cgroup_move.as_micros() as u64,
            ready_us = started_at.saturating_duration_since(spawned_at).as_micros() as u64,
            "forked sandbox ready");
        // Then pid 1 of the child's pid namespace, registered the same way before it forked
        // the job process (so before the start was reported): its end is the job's end
        // (docs/speed.md, "The reply does not wait for the teardown").
        let pid1 = match tokio::time::timeout(FORK_TIMEOUT, receive_registration(&host_end)).await {
            Ok(Ok(registration)) => Helper::adopt(registration.pidfd)
                .map_err(|e| zygote_io("hold the child's pid 1's pidfd", &e))?,
            Ok(Err(e)) => {
                child.start_kill();
                return Err(e);
            }
            Err(_) => {
                child.start_kill();
                return Err(NativeError::Zygote {
                    step: "register",
                    detail: "the child's pid 1 did not register".into(),
                });
            }
        };
        let host_end = host_end.into_inner();
        let out_dir = if send_out_dir {
            let out = crate::handoff::receive_handoff(&host_end)
                .into_iter()
                .next();
            if out.is_none() {
                child.start_kill();
                return Err(NativeError::Helper(
                    "the sandbox did not hand over /out".into(),
                ));
            }
            out
        } else {
            None
        };
        let stdin: HelperInput = Box::pin(
            tokio::net::unix::pipe::Sender::from_owned_fd(stdin_write)
                .map_err(|e| zygote_io("stdin pipe", &e))?,
        );
        let output = |fd: OwnedFd| -> Result<HelperOutput, NativeError> {
            Ok(Box::pin(
                tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
                    .map_err(|e| zygote_io("output pipe", &e))?,
            ))
        };
        Ok(Launched {
            child,
            pid1: Some(pid1),
            stdin: Some(stdin),
            stdout: output(stdout_read)?,
            stderr: output(stderr_read)?,
            events,
            status_task,
            out_dir,
            proxy_listener: None,
            control: Some(control_write),
            spawned_at,
            started_at,
        })
    }
}

/// The reason a child that never registered gave on its status pipe (it reports the
/// failed step before it exits), else `fallback`.
async fn child_failure(
    events: &mut mpsc::Receiver<InitEvent>,
    fallback: NativeError,
) -> NativeError {
    let reported = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(event) = events.recv().await {
            if let InitEvent::Failed {
                step,
                errno,
                detail,
            } = event
            {
                return Some(NativeError::Setup {
                    step,
                    errno,
                    detail,
                });
            }
        }
        None
    })
    .await;
    reported.ok().flatten().unwrap_or(fallback)
}

/// Takes the template's output streams for draining (the zygote prints nothing unless
/// it fails).
fn take_output(launched: &mut Launched) -> (HelperOutput, HelperOutput) {
    let empty = || -> HelperOutput { Box::pin(tokio::io::empty()) };
    (
        std::mem::replace(&mut launched.stdout, empty()),
        std::mem::replace(&mut launched.stderr, empty()),
    )
}

/// Reads `stream` to its end, keeping its last [`DIAGNOSTICS_MAX_BYTES`].
async fn keep_tail(mut stream: HelperOutput, tail: Arc<Mutex<Vec<u8>>>) {
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if let Ok(mut tail) = tail.lock() {
                    tail.extend_from_slice(&buf[..n]);
                    let excess = tail.len().saturating_sub(DIAGNOSTICS_MAX_BYTES);
                    tail.drain(..excess);
                }
            }
        }
    }
}

/// Sends one message, with `fds` attached.
async fn send(
    socket: &AsyncFd<OwnedFd>,
    message: &[u8],
    fds: &[BorrowedFd<'_>],
) -> Result<(), NativeError> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len().max(1)))];
    loop {
        let mut guard = socket
            .writable()
            .await
            .map_err(|e| zygote_io("write to the zygote", &e))?;
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(NativeError::Zygote {
                step: "request",
                detail: "ancillary buffer too small".into(),
            });
        }
        match rustix::net::sendmsg(
            socket.get_ref(),
            &[io::IoSlice::new(message)],
            &mut control,
            SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
        ) {
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::AGAIN) => guard.clear_ready(),
            Err(e) => return Err(zygote_io("write to the zygote", &e.into())),
        }
    }
}

/// Receives one message of at most [`REPLY_MAX_BYTES`]; end-of-file is an error (the
/// zygote is gone).
async fn receive_reply(socket: &AsyncFd<OwnedFd>) -> Result<Vec<u8>, NativeError> {
    let mut buf = vec![0u8; REPLY_MAX_BYTES];
    loop {
        let mut guard = socket
            .readable()
            .await
            .map_err(|e| zygote_io("read from the zygote", &e))?;
        match rustix::net::recv(socket.get_ref(), &mut buf, rustix::net::RecvFlags::DONTWAIT) {
            Ok((0, _)) => {
                return Err(NativeError::Zygote {
                    step: "request",
                    detail: "the zygote closed its socket".into(),
                });
            }
            Ok((n, _)) => {
                buf.truncate(n.min(REPLY_MAX_BYTES));
                return Ok(buf);
            }
            Err(rustix::io::Errno::AGAIN) => guard.clear_ready(),
            Err(e) => return Err(zygote_io("read from the zygote", &e.into())),
        }
    }
}

/// A child's registration: its pidfd, and how long its move into its cgroup took.
struct Registration {
    pidfd: OwnedFd,
    cgroup_move: Duration,
}

/// Receives a child's registration (`p<microseconds of its cgroup move>` with a pidfd of
/// itself), whose pidfd must be of the process the kernel names as the sender.
async fn receive_registration(socket: &AsyncFd<OwnedFd>) -> Result<Registration, NativeError> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1), ScmCredentials(1))];
    let mut message = [0u8; 32];
    loop {
        let mut guard = socket
            .readable()
            .await
            .map_err(|e| zygote_io("read the child's registration", &e))?;
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [io::IoSliceMut::new(&mut message)];
        let received = rustix::net::recvmsg(
            socket.get_ref(),
            &mut iov,
            &mut control,
            RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
        );
        let length = match received {
            Err(rustix::io::Errno::AGAIN) => {
                guard.clear_ready();
                continue;
            }
            Err(e) => return Err(zygote_io("read the child's registration", &e.into())),
            Ok(r) if r.bytes == 0 => {
                return Err(NativeError::Zygote {
                    step: "register",
                    detail: "the child ended before it registered".into(),
                });
            }
            Ok(r) => r.bytes,
        };
        let mut pidfd = None;
        let mut sender = None;
        for message in control.drain() {
            match message {
                RecvAncillaryMessage::ScmRights(fds) => pidfd = fds.into_iter().next(),
                RecvAncillaryMessage::ScmCredentials(creds) => sender = Some(creds.pid),
                _ => {}
            }
        }
        let moved_us = message[..length.min(message.len())]
            .strip_prefix(b"p")
            .and_then(|digits| std::str::from_utf8(digits).ok()?.parse::<u64>().ok());
        let (Some(pidfd), Some(sender), Some(moved_us)) = (pidfd, sender, moved_us) else {
            return Err(NativeError::Zygote {
                step: "register",
                detail: "the child's registration lacks its pidfd, credentials or figure".into(),
            });
        };
        let held = pidfd_pid(&pidfd)?;
        if held != sender.as_raw_nonzero().get() {
            return Err(NativeError::Zygote {
                step: "register",
                detail: format!(
                    "the child's pidfd is of pid {held}, but the child is pid {}",
                    sender.as_raw_nonzero()
                ),
            });
        }
        return Ok(Registration {
            pidfd,
            cgroup_move: Duration::from_micros(moved_us),
        });
    }
}

/// The pid (in our pid namespace) of the process a pidfd refers to, from its fdinfo.
fn pidfd_pid(pidfd: &OwnedFd) -> Result<i32, NativeError> {
    let path = format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd());
    let text =
        std::fs::read_to_string(&path).map_err(|e| zygote_io("read the pidfd's fdinfo", &e))?;
    text.lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse::<i32>().ok())
        .filter(|pid| *pid > 0)
        .ok_or_else(|| NativeError::Zygote {
            step: "register",
            detail: "the child's pidfd names no live process".into(),
        })
}

fn zygote_io(step: &'static str, e: &io::Error) -> NativeError {
    NativeError::Zygote {
        step,
        detail: e.to_string(),
    }
}

/// Removes a sandbox's cgroup and directory (after its processes), logging a failure.
async fn remove_quietly(cgroup: Option<JobCgroup>, jobdir: JobDir) {
    match tokio::task::spawn_blocking(move || teardown(cgroup, jobdir)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot remove a zygote's sandbox"),
        Err(e) => tracing::warn!(error = %e, "zygote teardown task failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn rlimit_ceilings_are_summed_where_they_can_be_and_shared_out_where_not() {
        let children = u64::from(ZYGOTE_CHILDREN_MAX);
        // A host root with CAP_SYS_RESOURCE raises the ceilings; each job keeps a fresh
        // sandbox's rlimits.
        let raised = RlimitBudgets::new(|_| 819_200, true);
        assert_eq!(
            raised.helper,
            vec![
                RlimitSetting {
                    resource: RlimitResource::Msgqueue,
                    value: MSGQUEUE_RLIMIT_BYTES * children
                },
                RlimitSetting {
                    resource: RlimitResource::Sigpending,
                    value: SIGPENDING_RLIMIT * children
                },
            ]
        );
        assert_eq!(raised.job[0].value, MSGQUEUE_RLIMIT_BYTES);
        assert_eq!(raised.job[1].value, SIGPENDING_RLIMIT);
        // Without it: what the hard limits give, shared out.
        let capped = RlimitBudgets::new(
            |r| match r {
                RlimitResource::Msgqueue => 819_200,
                _ => 96_369,
            },
            false,
        );
        assert_eq!(capped.helper[0].value, 819_200);
        assert_eq!(capped.job[0].value, 819_200 / children);
        // Enough queued signals for every child without raising anything.
        assert_eq!(capped.helper[1].value, SIGPENDING_RLIMIT * children);
        assert_eq!(capped.job[1].value, SIGPENDING_RLIMIT);
        for budgets in [raised, capped] {
            for (helper, job) in budgets.helper.iter().zip(&budgets.job) {
                assert!(job.value * children <= helper.value, "{budgets:?}");
            }
        }
    }

    #[test]
    fn a_childs_namespace_counts_share_the_hosts_inotify_budget() {
        let limits = ChildLimits {
            host_inotify_instances: 128,
            host_inotify_watches: 192_546,
        };
        let child = child_namespace_limits(&limits);
        let get = |list: &[(String, u64)], name: &str| {
            list.iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| *v)
                .unwrap()
        };
        assert_eq!(get(&child, "max_inotify_instances"), 8);
        assert_eq!(get(&child, "max_inotify_watches"), 8192);
        assert_eq!(get(&child, "max_user_namespaces"), 0);
        let template = template_namespace_limits(&limits);
        // All children together fit the host's per-user budget of the template's owner.
        assert!(get(&template, "max_inotify_instances") <= 128);
        assert_eq!(
            get(&template, "max_user_namespaces"),
            u64::from(ZYGOTE_CHILDREN_MAX) * ZYGOTE_NAMESPACE_HEADROOM
        );
        assert_eq!(get(&template, "max_time_namespaces"), 0);
        assert_eq!(get(&template, "max_fanotify_groups"), 0);
        // Every count a fresh sandbox sets is set for both.
        for (name, _) in USER_NAMESPACE_LIMITS {
            get(&child, name);
            get(&template, name);
        }
    }
}
