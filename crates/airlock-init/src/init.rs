//! The sandbox init: the airlock binary re-executed as `airlock __airlock-init`, a fresh,
//! single-threaded process that builds the sandbox from its plan and runs the job.
//!
//! Process tree (host pids on the left):
//!
//! ```text
//! supervisor (tokio; never forks itself)
//!  └─ helper     joins the job cgroup, enters a new user namespace, unshares mnt/pid/net/
//!      │         ipc/uts/cgroup namespaces owned by it
//!      ├─ creator    (as root; short-lived) becomes the namespace's owner, an unused host
//!      │             uid, and creates it; the helper writes its id maps and joins it
//!      ├─ mapper     (rootless; short-lived, still in the host user namespace) writes the
//!      │             id maps of the namespace the helper created
//!      └─ init       pid 1 of the new pid namespace: sets vm.memfd_noexec (as root),
//!          │         builds the root, reaps orphans
//!          └─ job    drops every privilege, installs seccomp, execs the interpreter
//! ```
//!
//! Each step reports failure as an [`InitEvent::Failed`] on the status descriptor, naming
//! the step; the supervisor turns it into an error observation. When init (pid 1) exits,
//! the kernel kills every process left in the namespace, so nothing of the job outlives it.

use std::ffi::CString;
use std::fs;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use airlock_sys::mount::{self as sysmount, flags};
use airlock_sys::process::{self, Fork, UnshareFlags};
use rustix::process::{Pid, Resource, Rlimit, Signal, WaitOptions};

use crate::plan::{
    CONTROL_FD, HANDOFF_FD, IdMapping, InitEvent, JOB_ID_IN_SANDBOX, MountOptions, MountStep,
    PLAN_FD, ProgramRole, RlimitResource, STATUS_FD, SandboxPlan, Usage, WORK_MOUNT_FD,
};

/// Largest plan accepted (the seccomp programs and environment dominate).
const PLAN_MAX_BYTES: u64 = 4 << 20;

/// Largest file a [`MountStep::FileCopy`] copies (a CA bundle is a few hundred KiB).
const FILE_COPY_MAX_BYTES: u64 = 8 << 20;

/// The sandbox's OOM score: the kernel's first choice when the memory limit is hit. The
/// helper sets it for itself, so the init and the job inherit it; among equal scores the
/// largest process goes first, which is the job's, not the init's.
const JOB_OOM_SCORE_ADJ: &str = "1000";

/// `vm.memfd_noexec` 2: no memfd of the pid namespace can ever be executable (`MFD_EXEC`
/// is refused, and every memfd is sealed non-executable).
const MEMFD_NOEXEC_ENFORCED: &str = "2";

/// Exit code of a job process that failed before exec (reported separately as an event).
const EXEC_FAILED_EXIT: i32 = 127;

/// A failed step.
struct StepFailure {
    step: String,
    errno: Option<i32>,
    detail: String,
    /// The failure was already reported by a child process.
    reported: bool,
}

impl StepFailure {
    fn new(step: impl Into<String>, err: &io::Error) -> Self {
        Self {
            step: step.into(),
            errno: err.raw_os_error(),
            detail: err.to_string(),
            reported: false,
        }
    }

    fn already_reported() -> Self {
        Self {
            step: String::new(),
            errno: None,
            detail: String::new(),
            reported: true,
        }
    }

    fn event(&self) -> InitEvent {
        InitEvent::Failed {
            step: self.step.clone(),
            errno: self.errno,
            detail: self.detail.clone(),
        }
    }
}

trait Step<T> {
    fn step(self, name: impl FnOnce() -> String) -> Result<T, StepFailure>;
}

impl<T> Step<T> for io::Result<T> {
    fn step(self, name: impl FnOnce() -> String) -> Result<T, StepFailure> {
        self.map_err(|e| StepFailure::new(name(), &e))
    }
}

impl<T> Step<T> for rustix::io::Result<T> {
    fn step(self, name: impl FnOnce() -> String) -> Result<T, StepFailure> {
        self.map_err(|e| StepFailure::new(name(), &io::Error::from(e)))
    }
}

fn report(status: &OwnedFd, event: &InitEvent) {
    let line = event.to_line();
    // One write of at most EVENT_MAX_BYTES (< PIPE_BUF) is atomic; a failure here means the
    // supervisor is gone, and there is nobody left to tell.
    let _ = rustix::io::write(status, &line);
}

/// Entry point of `airlock __airlock-init`. Must run before any thread or runtime starts.
pub fn main() -> ! {
    // Its name is `init`, as its argv[0] is: executed from a memfd it would otherwise be
    // the descriptor's number, and the airlock binary's name before that.
    let _ = rustix::thread::set_name(c"init");
    if let Some(reap) = ReapArgs::from_args(std::env::args_os().skip(1)) {
        run_reaper(reap)
    }
    let status = match process::claim_inherited_fd(STATUS_FD) {
        Ok(fd) => fd,
        Err(_) => process::exit_now(2),
    };
    match run_helper(&status) {
        Ok(()) => process::exit_now(0),
        Err(failure) => {
            if !failure.reported {
                report(&status, &failure.event());
            }
            process::exit_now(1)
        }
    }
}

fn read_plan() -> Result<SandboxPlan, StepFailure> {
    let fd = process::claim_inherited_fd(PLAN_FD).step(|| "read plan".into())?;
    let mut bytes = Vec::new();
    fs::File::from(fd)
        .take(PLAN_MAX_BYTES)
        .read_to_end(&mut bytes)
        .step(|| "read plan".into())?;
    serde_json::from_slice(&bytes).map_err(|e| StepFailure {
        step: "parse plan".into(),
        errno: None,
        detail: e.to_string(),
        reported: false,
    })
}

/// The helper: cgroup, namespaces, id maps, then the init.
fn run_helper(status: &OwnedFd) -> Result<(), StepFailure> {
    let plan = read_plan()?;
    let handoff = if plan.handoff_count() > 0 {
        Some(process::claim_inherited_fd(HANDOFF_FD).step(|| "claim handoff socket".into())?)
    } else {
        None
    };
    let work_mount = if plan
        .mounts
        .iter()
        .any(|step| matches!(step, MountStep::AttachWork { .. }))
    {
        Some(process::claim_inherited_fd(WORK_MOUNT_FD).step(|| "claim /work's mount".into())?)
    } else {
        None
    };

    // 0. Die with the supervisor: if it is killed, the sandbox must not outlive it. If it
    //    died before the signal was armed, we have already been reparented.
    arm_death_signal(&plan)?;

    // 1. Join the job's cgroup before anything else, so every later process is counted
    //    and the cgroup namespace below is rooted at the job's group. On v1 the files are
    //    `tasks`, which move the calling thread alone: the whole process only while it has
    //    one thread, which a fresh exec that started none has (checked, not assumed).
    if !plan.cgroup_join.is_empty() {
        match process::thread_count() {
            Ok(1) => {}
            Ok(n) => {
                return Err(StepFailure::new(
                    "join cgroup",
                    &io::Error::other(format!("the helper has {n} threads, not one")),
                ));
            }
            Err(e) => return Err(StepFailure::new("join cgroup: count threads", &e)),
        }
    }
    for file in &plan.cgroup_join {
        fs::write(file, "0").step(|| format!("join cgroup {}", file.display()))?;
    }

    // 1b. A zygote's template: the rlimit-counted budgets' ceilings its children share,
    //     raised while still host root (the user namespace created next takes them).
    apply_rlimits(&plan.helper_rlimits)?;

    // 2. The OOM score, while still host root: written by a process with CAP_SYS_RESOURCE
    //    it also becomes the minimum (oom_score_adj_min), which every descendant inherits,
    //    so the job cannot lower it again. Without that capability (a container's root) it
    //    is only raised, and the job may lower it back to its inherited minimum.
    fs::write("/proc/self/oom_score_adj", JOB_OOM_SCORE_ADJ).step(|| "set oom_score_adj".into())?;

    // 3. The user namespace, then new namespaces for everything else, owned by it;
    //    CLONE_NEWPID applies to our children.
    match plan.namespace_owner {
        Some(owner) => enter_owned_user_namespace(&plan, status, owner)?,
        None => enter_own_user_namespace(&plan, status)?,
    }
    process::unshare_namespaces(
        UnshareFlags::NEWNS
            | UnshareFlags::NEWPID
            | UnshareFlags::NEWNET
            | UnshareFlags::NEWIPC
            | UnshareFlags::NEWUTS
            | UnshareFlags::NEWCGROUP,
    )
    .step(|| "unshare namespaces".into())?;

    // 4. The namespace's own per-user counts (we hold CAP_SYS_RESOURCE there). The sysctls
    //    resolve to the writer's user namespace, so the host's /proc serves. A count the
    //    kernel does not have (older than the entry) is skipped.
    for (name, value) in &plan.user_namespace_limits {
        let path = Path::new("/proc/sys/user").join(name);
        match fs::write(&path, value.to_string()) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(StepFailure::new(format!("write {}", path.display()), &e)),
        }
    }

    // 5. The init: pid 1 of the new pid namespace. A pipe tells it whether we still live.
    let (alive_read, alive_write) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).step(|| "create pipe".into())?;
    let init = match process::fork().step(|| "fork init".into())? {
        Fork::Child => {
            drop(alive_write);
            run_init(plan, status, alive_read, handoff, work_mount)
        }
        Fork::Parent(pid) => pid,
    };
    drop(alive_read);
    drop(work_mount);
    // As root we are still host uid 0 inside the namespace (the init needed that): become
    // the namespace's root, which owns nothing of the host.
    if plan.namespace_owner.is_some() {
        become_namespace_root()?;
        arm_death_signal(&plan)?;
    }
    drop(handoff);
    // The job's stdio belongs to the job: stop holding it, so the supervisor sees EOF as
    // soon as the job's processes are gone.
    detach_stdio().step(|| "detach stdio".into())?;
    let _ = rustix::process::waitpid(Some(init), WaitOptions::empty());
    drop(alive_write);
    Ok(())
}

/// Dies with the supervisor, and checks it is still there (a change of credentials
/// clears the signal, so this is repeated after each).
fn arm_death_signal(plan: &SandboxPlan) -> Result<(), StepFailure> {
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .step(|| "set parent death signal".into())?;
    if rustix::process::getppid().map(|p| p.as_raw_nonzero().get()) != Some(plan.supervisor_pid) {
        return Err(StepFailure::new(
            "check supervisor",
            &io::Error::other("the supervisor is gone"),
        ));
    }
    Ok(())
}

/// In-sandbox uid and gid 0 (an unprivileged host id), so files created have a mapped owner.
fn become_namespace_root() -> Result<(), StepFailure> {
    rustix::thread::set_thread_res_gid(gid(0), gid(0), gid(0))
        .step(|| "setresgid 0 in namespace".into())?;
    rustix::thread::set_thread_groups(&[]).step(|| "setgroups in namespace".into())?;
    rustix::thread::set_thread_res_uid(uid(0), uid(0), uid(0))
        .step(|| "setresuid 0 in namespace".into())
}

/// As root: a user namespace owned by `owner`, an unprivileged host uid, joined with our
/// host root credentials.
///
/// The kernel charges per-user counts (inotify instances, message queue bytes, queued
/// signals, namespaces) to each user namespace's owner up the chain, so a namespace created
/// by host root lets its job exhaust root's. A child becomes `owner` and creates it; we
/// write its id maps (host root may map any ids) and join it. Joining keeps our host uid 0,
/// mapped to nothing inside, with every capability there and none outside: the init,
/// forked next, is then the one process of the sandbox that may set the pid namespace's
/// `vm.memfd_noexec` (the kernel wants host uid 0 and CAP_SYS_ADMIN over the namespace).
fn enter_owned_user_namespace(
    plan: &SandboxPlan,
    status: &OwnedFd,
    owner: u32,
) -> Result<(), StepFailure> {
    let pipe =
        || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).step(|| "create pipe".into());
    let (created_read, created_write) = pipe()?;
    let (hold_read, hold_write) = pipe()?;
    let creator = match process::fork().step(|| "fork namespace creator".into())? {
        Fork::Child => {
            drop((created_read, hold_write));
            let code = match create_user_namespace_as(owner, &created_write) {
                Ok(()) => {
                    // Keep the namespace alive until the helper has joined it (EOF).
                    let mut byte = [0u8; 1];
                    let _ = rustix::io::read(&hold_read, &mut byte);
                    0
                }
                Err(failure) => {
                    report(status, &failure.event());
                    1
                }
            };
            process::exit_now(code)
        }
        Fork::Parent(pid) => pid,
    };
    drop((created_write, hold_read));
    let mut byte = [0u8; 1];
    let n = rustix::io::read(&created_read, &mut byte).step(|| "wait for user namespace".into())?;
    if n == 0 {
        let _ = rustix::process::waitpid(Some(creator), WaitOptions::empty());
        return Err(StepFailure::already_reported());
    }
    let proc_dir = PathBuf::from(format!("/proc/{}", creator.as_raw_nonzero()));
    let joined = (|| {
        let namespace = rustix::fs::open(
            proc_dir.join("ns/user"),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .step(|| "open the job's user namespace".into())?;
        fs::write(proc_dir.join("uid_map"), plan.ids.uid_map()).step(|| "write uid_map".into())?;
        fs::write(proc_dir.join("gid_map"), plan.ids.gid_map()).step(|| "write gid_map".into())?;
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&namespace),
            Some(rustix::thread::LinkNameSpaceType::User),
        )
        .step(|| "join the job's user namespace".into())
    })();
    drop(hold_write);
    let _ = rustix::process::waitpid(Some(creator), WaitOptions::empty());
    joined?;
    // Joining dropped the parent-death signal (new credentials).
    arm_death_signal(plan)
}

/// The namespace creator: becomes `owner` (dropping every host capability) and creates the
/// user namespace, then says so on `created`.
fn create_user_namespace_as(owner: u32, created: &OwnedFd) -> Result<(), StepFailure> {
    rustix::thread::set_thread_groups(&[]).step(|| "setgroups [] before unshare".into())?;
    rustix::thread::set_thread_res_gid(gid(owner), gid(owner), gid(owner))
        .step(|| format!("setresgid {owner} before unshare"))?;
    rustix::thread::set_thread_res_uid(uid(owner), uid(owner), uid(owner))
        .step(|| format!("setresuid {owner} before unshare"))?;
    process::unshare_namespaces(UnshareFlags::NEWUSER).step(|| "unshare user namespace".into())?;
    rustix::io::write(created, b"u").step(|| "report user namespace".into())?;
    Ok(())
}

/// Rootless: our own user namespace; a mapper child, still in the host user namespace,
/// writes its id maps (only a process there may).
fn enter_own_user_namespace(plan: &SandboxPlan, status: &OwnedFd) -> Result<(), StepFailure> {
    let helper_pid = rustix::process::getpid();
    let (go_read, go_write) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).step(|| "create pipe".into())?;
    let mapper = match process::fork().step(|| "fork id mapper".into())? {
        Fork::Child => {
            drop(go_write);
            let code = match run_mapper(&go_read, helper_pid, &plan.ids) {
                Ok(()) => 0,
                Err(failure) => {
                    report(status, &failure.event());
                    1
                }
            };
            process::exit_now(code)
        }
        Fork::Parent(pid) => pid,
    };
    drop(go_read);
    process::unshare_namespaces(UnshareFlags::NEWUSER).step(|| "unshare user namespace".into())?;
    rustix::io::write(&go_write, b"m").step(|| "signal id mapper".into())?;
    drop(go_write);
    let mapped = rustix::process::waitpid(Some(mapper), WaitOptions::empty())
        .step(|| "wait for id mapper".into())?;
    if mapped.is_none_or(|(_, st)| st.exit_status() != Some(0)) {
        return Err(StepFailure::already_reported());
    }
    if let IdMapping::Root { .. } = plan.ids {
        become_namespace_root()?;
    }
    Ok(())
}

fn uid(n: u32) -> rustix::process::Uid {
    rustix::process::Uid::from_raw(n)
}

fn gid(n: u32) -> rustix::process::Gid {
    rustix::process::Gid::from_raw(n)
}

fn detach_stdio() -> io::Result<()> {
    let null = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    rustix::stdio::dup2_stdin(&null)?;
    rustix::stdio::dup2_stdout(&null)?;
    rustix::stdio::dup2_stderr(&null)?;
    Ok(())
}

fn run_mapper(go: &OwnedFd, helper: Pid, ids: &IdMapping) -> Result<(), StepFailure> {
    let mut byte = [0u8; 1];
    let n = rustix::io::read(go, &mut byte).step(|| "wait for unshare".into())?;
    if n == 0 {
        // The helper failed before unsharing and reports that itself.
        return Err(StepFailure::already_reported());
    }
    let proc_dir = PathBuf::from(format!("/proc/{}", helper.as_raw_nonzero()));
    if ids.deny_setgroups() {
        fs::write(proc_dir.join("setgroups"), "deny").step(|| "write setgroups".into())?;
    }
    fs::write(proc_dir.join("uid_map"), ids.uid_map()).step(|| "write uid_map".into())?;
    fs::write(proc_dir.join("gid_map"), ids.gid_map()).step(|| "write gid_map".into())?;
    Ok(())
}

/// Pid 1 of the sandbox.
fn run_init(
    plan: SandboxPlan,
    status: &OwnedFd,
    alive: OwnedFd,
    handoff: Option<OwnedFd>,
    work_mount: Option<OwnedFd>,
) -> ! {
    match init_and_spawn(&plan, status, alive, handoff, work_mount) {
        Ok(job) => reap_until_job_exits(Some(status), job, plan.program == ProgramRole::Zygote),
        Err(failure) => {
            if !failure.reported {
                report(status, &failure.event());
            }
            process::exit_now(1)
        }
    }
}

fn init_and_spawn(
    plan: &SandboxPlan,
    status: &OwnedFd,
    alive: OwnedFd,
    handoff: Option<OwnedFd>,
    work_mount: Option<OwnedFd>,
) -> Result<Pid, StepFailure> {
    if plan.namespace_owner.is_some() {
        // Still host uid 0 (see enter_owned_user_namespace), now in the new pid namespace:
        // the moment to forbid executable memfds in it, for good (a child namespace cannot
        // lower it, and nothing in this one can write it once the uid is gone).
        if plan.memfd_noexec {
            fs::write("/proc/sys/vm/memfd_noexec", MEMFD_NOEXEC_ENFORCED)
                .step(|| "set vm.memfd_noexec".into())?;
        }
        become_namespace_root()?;
    }
    // Die with the helper. If it died before this line, the pipe has hung up.
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .step(|| "set parent death signal".into())?;
    let mut fds = [rustix::event::PollFd::new(
        &alive,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    if rustix::event::poll(&mut fds, Some(&zero)).step(|| "check helper".into())? > 0 {
        return Err(StepFailure::new(
            "check helper",
            &io::Error::other("helper is gone"),
        ));
    }
    drop(alive);

    build_root(plan, work_mount)?;
    rustix::system::sethostname(plan.hostname.as_bytes()).step(|| "sethostname".into())?;
    if plan.loopback_up {
        airlock_sys::net::bring_up_loopback().step(|| "bring up lo".into())?;
    }
    if let Some(socket) = handoff {
        hand_over(plan, &socket)?;
    }

    let (exec_read, exec_write) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).step(|| "create pipe".into())?;
    let job = match process::fork().step(|| "fork job".into())? {
        Fork::Child => {
            drop(exec_read);
            run_job(plan, status, exec_write)
        }
        Fork::Parent(pid) => pid,
    };
    drop(exec_write);
    // EOF: the exec succeeded (the pipe is close-on-exec). A byte: the job reported why not.
    let mut byte = [0u8; 1];
    let exec_failed = matches!(rustix::io::read(&exec_read, &mut byte), Ok(n) if n > 0);
    if !exec_failed {
        report(status, &InitEvent::Started);
    }
    detach_stdio().step(|| "detach stdio".into())?;
    Ok(job)
}

/// Reaps every child (orphans are reparented to pid 1) until the job itself exits, then
/// reports how it ended and exits, which tears down the pid namespace. With `outlive_job`
/// (a zygote's template) it reports the program's end and goes on reaping until no process
/// of the namespace is left: the zygote's children, each running a job in namespaces of
/// its own below this one, would otherwise end with it. Without `status` (a forked
/// sandbox's leader, waiting for its pid 1) nothing is reported.
fn reap_until_job_exits(status: Option<&OwnedFd>, job: Pid, outlive_job: bool) -> ! {
    loop {
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((pid, st))) if pid == job && outlive_job => {
                let Some(status) = status else { continue };
                let event = match (st.exit_status(), st.terminating_signal()) {
                    (Some(code), _) => InitEvent::Exited { code, usage: None },
                    (None, Some(signal)) => InitEvent::Signaled {
                        signal,
                        usage: None,
                    },
                    (None, None) => continue,
                };
                report(status, &event);
            }
            Ok(Some((pid, st))) if pid == job => {
                let Some(status) = status else {
                    if st.exit_status().is_some() || st.terminating_signal().is_some() {
                        process::exit_now(0)
                    }
                    continue;
                };
                let usage = process::children_usage().ok().map(|(cpu, rss)| Usage {
                    cpu_ms: u64::try_from(cpu.as_millis()).unwrap_or(u64::MAX),
                    max_rss_bytes: rss,
                });
                let event = if let Some(code) = st.exit_status() {
                    InitEvent::Exited { code, usage }
                } else if let Some(signal) = st.terminating_signal() {
                    InitEvent::Signaled { signal, usage }
                } else {
                    continue;
                };
                report(status, &event);
                process::exit_now(0)
            }
            Ok(_) => continue,
            Err(rustix::io::Errno::INTR) => continue,
            // No child left: only reached when outliving the job.
            Err(rustix::io::Errno::CHILD) => process::exit_now(0),
            Err(_) => process::exit_now(1),
        }
    }
}

/// The first argument of a reaper: `init reap PID quiet`, or `init reap PID report
/// [READY_FD]`.
pub const REAP_ARG: &str = "reap";

/// What a zygote's child executes once its sandbox is built (`zygote.py`): its leader
/// (`quiet`, waiting for the sandbox's pid 1) and its pid 1 (`report`, waiting for the job
/// and reporting how it ended on [`STATUS_FD`]). Until then they are forks of the zygote's
/// interpreter; as this small program instead, they hold none of its memory, so their
/// exits, on the path from the job's end to its reply, free a few pages rather than the
/// interpreter's whole address space (about 0.4 ms each, docs/speed.md). pid 1 executes
/// it before the sandbox is reported started (`READY_FD`: the job process's readiness
/// pipe, at end of file once it is ready), so that no sandbox counted ready still has
/// that exec to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ReapArgs {
    /// The child whose exit ends this process.
    child: Pid,
    /// Whether to report the child's end on [`STATUS_FD`].
    report: bool,
    /// Where to learn that the child is ready, to report it started first.
    ready: Option<i32>,
}

impl ReapArgs {
    fn from_args(mut args: impl Iterator<Item = std::ffi::OsString>) -> Option<Self> {
        if args.next()? != REAP_ARG {
            return None;
        }
        let child = args
            .next()?
            .to_str()?
            .parse::<i32>()
            .ok()
            .filter(|p| *p > 0)?;
        let report = match args.next()?.to_str()? {
            "report" => true,
            "quiet" => false,
            _ => return None,
        };
        let ready = match args.next() {
            Some(fd) if report => Some(fd.to_str()?.parse::<i32>().ok().filter(|fd| *fd > 2)?),
            Some(_) => return None,
            None => None,
        };
        if args.next().is_some() {
            return None;
        }
        Some(Self {
            child: Pid::from_raw(child)?,
            report,
            ready,
        })
    }
}

/// Reaps until `args.child` exits, reporting its end if asked, then exits.
fn run_reaper(args: ReapArgs) -> ! {
    // pid 1's parent is its sandbox's leader: dying with it, as before the exec (the
    // setting survives an exec that changes no credential; set again in case).
    if args.report && rustix::process::set_parent_process_death_signal(Some(Signal::KILL)).is_err()
    {
        process::exit_now(1)
    }
    if !args.report {
        reap_until_job_exits(None, args.child, false)
    }
    let Ok(status) = process::claim_inherited_fd(STATUS_FD) else {
        process::exit_now(2)
    };
    if let Some(fd) = args.ready {
        // End of file: the job process is ready. A byte: it failed, and said why itself.
        let ready = process::claim_inherited_fd(fd).ok();
        let mut byte = [0u8; 1];
        let started = ready.is_some_and(|ready| {
            loop {
                match rustix::io::read(&ready, &mut byte) {
                    Ok(n) => break n == 0,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(_) => break false,
                }
            }
        });
        if started {
            report(&status, &InitEvent::Started);
        }
    }
    reap_until_job_exits(Some(&status), args.child, false)
}

/// Hands the supervisor, in one message, what only the sandbox can create: an open `/out`
/// (it keeps the tmpfs alive after the sandbox's mount namespace is gone) and the proxy's
/// listening socket on the sandbox's own loopback.
fn hand_over(plan: &SandboxPlan, socket: &OwnedFd) -> Result<(), StepFailure> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    use std::mem::MaybeUninit;
    use std::os::fd::AsFd;
    let mut owned: Vec<OwnedFd> = Vec::with_capacity(2);
    if plan.send_out_dir {
        owned.push(
            rustix::fs::open(
                "/out",
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .step(|| "open /out".into())?,
        );
    }
    if let Some(port) = plan.proxy_port {
        let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port))
            .step(|| format!("bind the proxy socket on 127.0.0.1:{port}"))?;
        owned.push(OwnedFd::from(listener));
    }
    let fds: Vec<_> = owned.iter().map(AsFd::as_fd).collect();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(bad_input("hand over", "ancillary buffer too small"));
    }
    rustix::net::sendmsg(
        socket,
        &[io::IoSlice::new(b"h")],
        &mut control,
        SendFlags::empty(),
    )
    .step(|| "hand over descriptors".into())?;
    Ok(())
}

fn cpath(path: &Path) -> Result<CString, StepFailure> {
    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| StepFailure {
        step: "path".into(),
        errno: None,
        detail: format!("{} contains a NUL byte", path.display()),
        reported: false,
    })
}

fn mount_flags(options: &MountOptions) -> u64 {
    let mut f = 0;
    if options.readonly {
        f |= flags::RDONLY;
    }
    if options.nosuid {
        f |= flags::NOSUID;
    }
    if options.nodev {
        f |= flags::NODEV;
    }
    if options.noexec {
        f |= flags::NOEXEC;
    }
    f
}

/// Applies `options` to the mount at `target` by a bind remount, repeating the flags the
/// mount already has (the kernel refuses to clear flags locked by a parent namespace).
fn remount_bind(target: &Path, options: &MountOptions) -> Result<(), StepFailure> {
    let c = cpath(target)?;
    let existing =
        sysmount::existing_mount_flags(&c).step(|| format!("statvfs {}", target.display()))?;
    sysmount::mount(
        None,
        &c,
        None,
        flags::REMOUNT | flags::BIND | existing | mount_flags(options),
        None,
    )
    .step(|| format!("remount {}", target.display()))
}

fn mkdir_all(path: &Path, mode: u32) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
}

fn build_root(plan: &SandboxPlan, mut work_mount: Option<OwnedFd>) -> Result<(), StepFailure> {
    let root = &plan.new_root;
    // Nothing done here may propagate back to the host's mount namespace.
    sysmount::mount(None, c"/", None, flags::REC | flags::PRIVATE, None)
        .step(|| "make mounts private".into())?;
    let root_c = cpath(root)?;
    let data = CString::new(format!("size={},mode=0755", plan.root_size_bytes))
        .map_err(|_| StepFailure::already_reported())?;
    sysmount::mount(
        Some(c"airlock"),
        &root_c,
        Some(c"tmpfs"),
        flags::NOSUID | flags::NODEV,
        Some(&data),
    )
    .step(|| "mount root tmpfs".into())?;

    for step in &plan.mounts {
        apply_step(root, step, &mut work_mount)?;
    }

    // pivot_root(".", "."): the old root ends up stacked on the new one and is detached.
    rustix::process::chdir(root).step(|| "chdir new root".into())?;
    rustix::process::pivot_root(".", ".").step(|| "pivot_root".into())?;
    sysmount::unmount_detach(c".").step(|| "detach old root".into())?;
    rustix::process::chdir("/").step(|| "chdir /".into())?;
    sysmount::mount(
        None,
        c"/",
        None,
        flags::REMOUNT | flags::BIND | flags::RDONLY | flags::NOSUID | flags::NODEV,
        None,
    )
    .step(|| "remount / read-only".into())?;
    Ok(())
}

/// Applies one step; `work_mount` is taken by the [`MountStep::AttachWork`] step.
fn apply_step(
    root: &Path,
    step: &MountStep,
    work_mount: &mut Option<OwnedFd>,
) -> Result<(), StepFailure> {
    match step {
        MountStep::Mkdir { target, mode } => {
            let path = root.join(target);
            match fs::DirBuilder::new().mode(*mode).create(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(StepFailure::new(format!("mkdir /{target}"), &e)),
            }
            // The umask must not narrow the mode (e.g. 1777).
            fs::set_permissions(&path, fs::Permissions::from_mode(*mode))
                .step(|| format!("chmod /{target}"))?;
        }
        MountStep::Symlink { target, points_to } => {
            std::os::unix::fs::symlink(points_to, root.join(target))
                .step(|| format!("symlink /{target}"))?;
        }
        MountStep::File {
            target,
            content,
            mode,
        } => {
            let path = root.join(target);
            let mut file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(*mode)
                .open(&path)
                .step(|| format!("create /{target}"))?;
            io::Write::write_all(&mut file, content.as_bytes())
                .step(|| format!("write /{target}"))?;
        }
        MountStep::Tmpfs {
            target,
            size_bytes,
            mode,
            options,
            inodes,
            owner,
        } => {
            let path = root.join(target);
            mkdir_all(&path, 0o755).step(|| format!("mkdir /{target}"))?;
            let mut data = format!("size={size_bytes},mode={mode:o}");
            if let Some(n) = inodes {
                data.push_str(&format!(",nr_inodes={n}"));
            }
            if let Some(id) = owner {
                data.push_str(&format!(",uid={id},gid={id}"));
            }
            let data = CString::new(data).map_err(|_| StepFailure::already_reported())?;
            sysmount::mount(
                Some(c"tmpfs"),
                &cpath(&path)?,
                Some(c"tmpfs"),
                mount_flags(options),
                Some(&data),
            )
            .step(|| format!("mount tmpfs /{target}"))?;
        }
        MountStep::Bind {
            source,
            target,
            options,
            optional,
        } => {
            let meta = match fs::metadata(source) {
                Ok(meta) => meta,
                Err(e) if *optional && e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(StepFailure::new(format!("stat {}", source.display()), &e)),
            };
            let path = root.join(target);
            if meta.is_dir() {
                mkdir_all(&path, 0o755).step(|| format!("mkdir /{target}"))?;
            } else if fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
                // A file of a read-only root (the CA bundle): mounted over as it is, since
                // opening it to create it would fail there.
            } else {
                if let Some(parent) = path.parent() {
                    mkdir_all(parent, 0o755).step(|| format!("mkdir for /{target}"))?;
                }
                fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o644)
                    .open(&path)
                    .step(|| format!("create mount point /{target}"))?;
            }
            sysmount::mount(
                Some(&cpath(source)?),
                &cpath(&path)?,
                None,
                flags::BIND,
                None,
            )
            .step(|| format!("bind {} to /{target}", source.display()))?;
            remount_bind(&path, options)?;
        }
        MountStep::FileCopy {
            source,
            target,
            options,
        } => {
            let mut content = Vec::new();
            fs::File::open(source)
                .and_then(|file| file.take(FILE_COPY_MAX_BYTES + 1).read_to_end(&mut content))
                .step(|| format!("read {}", source.display()))?;
            if content.len() as u64 > FILE_COPY_MAX_BYTES {
                return Err(bad_input(
                    "copy a file",
                    &format!(
                        "{} is larger than {FILE_COPY_MAX_BYTES} bytes",
                        source.display()
                    ),
                ));
            }
            let stage = root.join(".airlock-stage");
            mkdir_all(&stage, 0o700).step(|| "mkdir the staging directory".into())?;
            let stage_c = cpath(&stage)?;
            let data = CString::new(format!("size={},mode=0755", content.len() + 65536))
                .map_err(|_| StepFailure::already_reported())?;
            sysmount::mount(
                Some(c"airlock-file"),
                &stage_c,
                Some(c"tmpfs"),
                flags::NOSUID | flags::NODEV | flags::NOEXEC,
                Some(&data),
            )
            .step(|| "mount the staging tmpfs".into())?;
            let copy = stage.join("file");
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&copy)
                .and_then(|mut file| io::Write::write_all(&mut file, &content))
                .step(|| format!("copy {}", source.display()))?;
            fs::set_permissions(&copy, fs::Permissions::from_mode(0o644))
                .step(|| format!("chmod the copy of {}", source.display()))?;
            let path = root.join(target);
            sysmount::mount(
                Some(&cpath(&copy)?),
                &cpath(&path)?,
                None,
                flags::BIND,
                None,
            )
            .step(|| format!("bind the copy of {} to /{target}", source.display()))?;
            remount_bind(&path, options)?;
            // The bind keeps the copy; the staging mount and directory go.
            sysmount::unmount_detach(&stage_c).step(|| "detach the staging tmpfs".into())?;
            fs::remove_dir(&stage).step(|| "remove the staging directory".into())?;
        }
        MountStep::AttachWork { target, options } => {
            let Some(mount) = work_mount.take() else {
                return Err(bad_input(
                    "attach /work",
                    "no detached mount was handed over",
                ));
            };
            let path = root.join(target);
            mkdir_all(&path, 0o755).step(|| format!("mkdir /{target}"))?;
            rustix::mount::move_mount(
                &mount,
                "",
                rustix::fs::CWD,
                &path,
                rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
            )
            .step(|| format!("attach the job's mount at /{target}"))?;
            drop(mount);
            let c = cpath(&path)?;
            sysmount::mount(Some(&c), &c, None, flags::BIND, None)
                .step(|| format!("bind /{target} onto itself"))?;
            remount_bind(&path, options)?;
        }
        MountStep::Overlay {
            lower,
            spare,
            target,
            options,
        } => {
            let path = root.join(target);
            mkdir_all(&path, 0o755).step(|| format!("mkdir /{target}"))?;
            // The layers are named relative to the spare's grandparent (a prepared root's
            // directory of copies: `copy-<key>/root/usr:copy-<key>/empty`), our working
            // directory for the mount: overlayfs shows the names as given in the job's
            // mount table, which then holds no host path.
            let base = spare
                .parent()
                .and_then(Path::parent)
                .filter(|base| base.parent().is_some());
            if let Some(base) = base {
                rustix::process::chdir(base)
                    .step(|| format!("chdir {} for the overlay's layers", base.display()))?;
            }
            let layer = |p: &Path| -> Result<String, StepFailure> {
                let p = base.and_then(|base| p.strip_prefix(base).ok()).unwrap_or(p);
                let text = p.to_str().unwrap_or(",");
                // overlayfs splits its options on ',' and its layers on ':'.
                if text.contains([',', ':', '\\']) {
                    return Err(bad_input(
                        "overlay",
                        &format!("{} has a ',', ':' or '\\' in its path", p.display()),
                    ));
                }
                Ok(text.to_owned())
            };
            let data = CString::new(format!("lowerdir={}:{}", layer(lower)?, layer(spare)?))
                .map_err(|_| bad_input("overlay", "a layer path contains a NUL byte"))?;
            sysmount::mount(
                Some(c"airlock-root"),
                &cpath(&path)?,
                Some(c"overlay"),
                mount_flags(options) | flags::RDONLY,
                Some(&data),
            )
            .step(|| {
                format!(
                    "mount overlay of {} on /{target} (overlayfs in a user namespace needs Linux 5.11+)",
                    lower.display()
                )
            })?;
        }
        MountStep::Proc { target } => {
            let path = root.join(target);
            sysmount::mount(
                Some(c"proc"),
                &cpath(&path)?,
                Some(c"proc"),
                flags::NOSUID | flags::NODEV | flags::NOEXEC,
                None,
            )
            .step(|| format!("mount proc /{target}"))?;
        }
        MountStep::Mask { target } => {
            let path = root.join(target);
            let meta = match fs::symlink_metadata(&path) {
                Ok(meta) => meta,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(StepFailure::new(format!("stat /{target}"), &e)),
            };
            if meta.is_dir() {
                sysmount::mount(
                    Some(c"tmpfs"),
                    &cpath(&path)?,
                    Some(c"tmpfs"),
                    flags::RDONLY | flags::NOSUID | flags::NODEV | flags::NOEXEC,
                    Some(c"size=4k,mode=0555"),
                )
                .step(|| format!("mask /{target}"))?;
            } else {
                sysmount::mount(Some(c"/dev/null"), &cpath(&path)?, None, flags::BIND, None)
                    .step(|| format!("mask /{target}"))?;
                remount_bind(&path, &MountOptions::RO_NOEXEC)?;
            }
        }
        MountStep::ReadonlyBind { target } => {
            let path = root.join(target);
            if fs::symlink_metadata(&path).is_err() {
                return Ok(());
            }
            let c = cpath(&path)?;
            sysmount::mount(Some(&c), &c, None, flags::BIND | flags::REC, None)
                .step(|| format!("bind /{target}"))?;
            remount_bind(&path, &MountOptions::RO_NOEXEC)?;
        }
        MountStep::RemountReadonly { target, options } => {
            remount_bind(&root.join(target), options)?;
        }
    }
    Ok(())
}

/// The job process: drop everything, then exec. Never returns.
fn run_job(plan: &SandboxPlan, status: &OwnedFd, exec_failed: OwnedFd) -> ! {
    let failure = match prepare_and_exec(plan) {
        Ok(never) => match never {},
        Err(failure) => failure,
    };
    report(status, &failure.event());
    let _ = rustix::io::write(&exec_failed, b"F");
    process::exit_now(EXEC_FAILED_EXIT)
}

enum Never {}

fn prepare_and_exec(plan: &SandboxPlan) -> Result<Never, StepFailure> {
    rustix::process::setsid().step(|| "setsid".into())?;
    apply_rlimits(&plan.rlimits)?;
    match plan.program {
        ProgramRole::Job => drop_privileges(plan)?,
        // The zygote keeps the namespace root's capabilities (see ProgramRole::Zygote); its
        // children drop them, each for its own job.
        ProgramRole::Zygote => {
            rustix::thread::set_no_new_privs(true).step(|| "set no_new_privs".into())?;
        }
    }

    rustix::process::chdir(plan.cwd.as_str()).step(|| format!("chdir {}", plan.cwd))?;

    let program = resolve_program(plan)?;
    let argv: Vec<CString> = plan
        .argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| bad_input("argv", "an argument contains a NUL byte"))?;
    let envp: Vec<CString> = plan
        .env
        .iter()
        .map(|(k, v)| CString::new(format!("{k}={v}")))
        .collect::<Result<_, _>>()
        .map_err(|_| bad_input("env", "a variable contains a NUL byte"))?;
    process::reset_signals().step(|| "reset signals".into())?;
    // A warm sandbox's program keeps the control pipe; everything else above stdio closes.
    let control = if plan.control_fd {
        Some(process::claim_inherited_fd(CONTROL_FD).step(|| "claim control pipe".into())?)
    } else {
        None
    };
    process::set_cloexec_from(3).step(|| "close inherited descriptors".into())?;
    if let Some(control) = &control {
        rustix::io::fcntl_setfd(control, rustix::io::FdFlags::empty())
            .step(|| "keep control pipe".into())?;
    }

    // Last: from here on, only what the filter allows.
    if plan.program == ProgramRole::Job {
        airlock_sys::seccomp::install(&plan.seccomp).map_err(|e| StepFailure {
            step: "install seccomp".into(),
            errno: None,
            detail: e.to_string(),
            reported: false,
        })?;
    }
    let err = process::execve(&program, &argv, &envp);
    Err(StepFailure::new(
        format!("exec {}", program.to_string_lossy()),
        &err,
    ))
}

/// Sets each rlimit, soft and hard.
fn apply_rlimits(settings: &[crate::plan::RlimitSetting]) -> Result<(), StepFailure> {
    for setting in settings {
        let resource = match setting.resource {
            RlimitResource::Nofile => Resource::Nofile,
            RlimitResource::Fsize => Resource::Fsize,
            RlimitResource::Core => Resource::Core,
            RlimitResource::Cpu => Resource::Cpu,
            RlimitResource::As => Resource::As,
            RlimitResource::Nproc => Resource::Nproc,
            RlimitResource::Msgqueue => Resource::Msgqueue,
            RlimitResource::Sigpending => Resource::Sigpending,
        };
        rustix::process::setrlimit(
            resource,
            Rlimit {
                current: Some(setting.value),
                maximum: Some(setting.value),
            },
        )
        .step(|| format!("setrlimit {:?} {}", setting.resource, setting.value))?;
    }
    Ok(())
}

/// The job's identity and privileges: every capability set emptied, uid and gid 65534,
/// `no_new_privs`.
fn drop_privileges(plan: &SandboxPlan) -> Result<(), StepFailure> {
    // Capabilities: the bounding set first (dropping needs CAP_SETPCAP), then ambient,
    // then the identity switch, then the remaining sets explicitly (a rootless setresuid
    // to the same uid would not clear them by itself).
    process::drop_bounding_set().step(|| "drop bounding set".into())?;
    rustix::thread::clear_ambient_capability_set().step(|| "clear ambient capabilities".into())?;
    let job_gid = gid(JOB_ID_IN_SANDBOX);
    let job_uid = uid(JOB_ID_IN_SANDBOX);
    rustix::thread::set_thread_res_gid(job_gid, job_gid, job_gid)
        .step(|| "setresgid 65534".into())?;
    if !plan.ids.deny_setgroups() {
        rustix::thread::set_thread_groups(&[]).step(|| "setgroups []".into())?;
    }
    rustix::thread::set_thread_res_uid(job_uid, job_uid, job_uid)
        .step(|| "setresuid 65534".into())?;
    let none = rustix::thread::CapabilitySet::empty();
    rustix::thread::set_capabilities(
        None,
        rustix::thread::CapabilitySets {
            effective: none,
            permitted: none,
            inheritable: none,
        },
    )
    .step(|| "clear capabilities".into())?;
    rustix::thread::set_no_new_privs(true).step(|| "set no_new_privs".into())
}

fn bad_input(step: &str, detail: &str) -> StepFailure {
    StepFailure {
        step: step.into(),
        errno: None,
        detail: detail.into(),
        reported: false,
    }
}

/// Finds the program like `execvp`, in the job's own `PATH`, inside the new root.
fn resolve_program(plan: &SandboxPlan) -> Result<CString, StepFailure> {
    let name = plan
        .argv
        .first()
        .ok_or_else(|| bad_input("exec", "empty command"))?;
    let candidates: Vec<PathBuf> = if name.contains('/') {
        vec![PathBuf::from(name)]
    } else {
        let path = plan
            .env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map_or("/usr/bin:/bin", |(_, v)| v.as_str());
        path.split(':')
            .filter(|d| !d.is_empty())
            .map(|d| Path::new(d).join(name))
            .collect()
    };
    for candidate in &candidates {
        if rustix::fs::access(candidate, rustix::fs::Access::EXEC_OK).is_ok()
            && fs::metadata(candidate).is_ok_and(|m| m.is_file())
        {
            return cpath(candidate);
        }
    }
    Err(StepFailure {
        step: "exec".into(),
        errno: Some(libc_enoent()),
        detail: format!("{name}: not found in the sandbox's PATH"),
        reported: false,
    })
}

fn libc_enoent() -> i32 {
    rustix::io::Errno::NOENT.raw_os_error()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn reap_args(args: &[&str]) -> Option<ReapArgs> {
        ReapArgs::from_args(args.iter().map(OsString::from))
    }

    #[test]
    fn only_a_whole_reap_command_makes_a_reaper() {
        assert_eq!(
            reap_args(&["reap", "7", "report"]),
            Some(ReapArgs {
                child: Pid::from_raw(7).unwrap(),
                report: true,
                ready: None,
            })
        );
        assert_eq!(
            reap_args(&["reap", "2", "report", "5"]).and_then(|a| a.ready),
            Some(5)
        );
        assert_eq!(
            reap_args(&["reap", "2", "quiet"]).map(|a| a.report),
            Some(false)
        );
        // The helper's own invocation (no argument, or airlock's hidden one) is not one.
        assert_eq!(reap_args(&[]), None);
        assert_eq!(reap_args(&["__airlock-init"]), None);
        for bad in [
            &["reap", "0", "report"][..],
            &["reap", "-1", "quiet"],
            &["reap", "x", "quiet"],
            &["reap", "3", "loud"],
            &["reap", "3"],
            &["reap", "3", "quiet", "5"],
            &["reap", "3", "report", "1"],
            &["reap", "3", "report", "x"],
            &["reap", "3", "report", "5", "more"],
        ] {
            assert_eq!(reap_args(bad), None, "{bad:?}");
        }
    }
}
