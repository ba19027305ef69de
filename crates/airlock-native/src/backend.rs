//! The supervisor: prepares a job's directory, cgroup and plan, starts the sandbox helper,
//! runs the job through the supervision core (`airlock_core::supervise`: bounded output,
//! wall time, the output flood limit) with the helper's pipes as its output and killing the
//! helper as its kill, and tears everything down.

use airlock_host::jobdir::{JobDir, RuntimeDir};
use airlock_host::out::{self, OUT_SPARE_INODES, OutCaps};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_cgroup::{
    CgroupManager, CgroupVersion, Hierarchy, JobCgroup, JobLimits, JobStats, ParentSpec,
};
use airlock_core::capture::CapturedOutput;
use airlock_core::policy::{CgroupParent, DegradedControl, NetworkMode, Policy, RootfsSpec};
use airlock_core::supervise::{JobOutput, Kill, PipeSource, Sandbox, Supervision, supervise};
use airlock_core::{
    Backend, BackendError, BackendKind, BoxFuture, Capabilities, JobSpec, LimitHit, OutputTap,
    RunReport, Teardown, Termination,
};
use airlock_sys::seccomp::CompiledSeccomp;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use crate::error::NativeError;
use crate::helper::{Helper, HelperCommand, HelperInput, HelperOutput, Placement, Started};
use crate::init_program::InitProgram;
use crate::minimal_root::{MinimalRoot, MinimalRootSpec, ProgramState};
use crate::mount_plan::{self, JobMounts, OutMount, ROOT_TMPFS_BYTES, RootfsLayout};
use crate::plan::{
    CONTROL_FD, HANDOFF_FD, INIT_ARG, INIT_PROCESSES, IdMapping, InitEvent, MSGQUEUE_RLIMIT_BYTES,
    NAMESPACE_OWNER_SLOTS, PLAN_FD, PROXY_PORT, ProgramRole, RlimitResource, RlimitSetting,
    SIGPENDING_RLIMIT, STATUS_FD, SandboxPlan, USER_NAMESPACE_LIMITS,
};

/// Longest time from starting the helper to the program's exec.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for the helper to exit after it was killed.
pub const KILL_GRACE: Duration = Duration::from_secs(5);
/// Longest wait for the output pipes to close once every job process is gone.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for the job's cgroup to empty during teardown.
pub const TEARDOWN_WAIT: Duration = Duration::from_secs(5);
/// Most status events read from one sandbox (it sends three at most).
pub const STATUS_EVENTS_MAX: usize = 16;
/// Longest status line read.
pub const STATUS_LINE_MAX_BYTES: u64 = 4096;
/// RLIMIT_CORE of the job: 1, not 0. The kernel ignores the core limit when
/// `kernel.core_pattern` is a pipe (systemd-coredump, apport), except that 1 means "no
/// dump"; and a file dump needs at least a page. So 1 is the value that disables both.
pub const CORE_RLIMIT_BYTES: u64 = 1;
/// The job's environment: its own, plus in proxy mode where the proxy is.
fn job_env(job: &JobSpec) -> Vec<(String, String)> {
    match job.network {
        NetworkMode::Proxy => {
            airlock_core::job::proxy_env(&job.env, PROXY_PORT, &job.network_policy)
        }
        NetworkMode::None => job.env.clone(),
    }
}

/// The next job user namespace's owner slot: consecutive within this process (so up to
/// [`NAMESPACE_OWNER_SLOTS`] sandboxes of one airlock never share an owner), from a random
/// start (so two airlock processes on one host rarely do; when they do, the two jobs share
/// the owner's host-wide per-user counts, each still bounded by its own namespace's).
fn next_owner_slot() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    let next = NEXT.get_or_init(|| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        // Truncation intended: any 32 bits of the random hash are a start.
        AtomicU32::new(hasher.finish() as u32)
    });
    next.fetch_add(1, Ordering::Relaxed) % NAMESPACE_OWNER_SLOTS
}

/// Whether the kernel has `vm.memfd_noexec` (Linux 6.3+, per pid namespace).
pub fn memfd_noexec_available() -> bool {
    std::path::Path::new(MEMFD_NOEXEC_SYSCTL).exists()
}

/// The sysctl that makes memfds non-executable.
pub const MEMFD_NOEXEC_SYSCTL: &str = "/proc/sys/vm/memfd_noexec";

/// Extra CPU seconds of the RLIMIT_CPU backstop beyond what the wall-time limit allows.
pub const CPU_RLIMIT_SLACK_SECS: u64 = 2;

/// How the native backend is set up.
#[derive(Debug, Clone)]
pub struct NativeConfig {
    /// The airlock binary, re-executed as the sandbox init where the kernel refuses to
    /// execute the small init it carries from a memfd (`init_program.rs`).
    pub helper: PathBuf,
    /// Where job directories are created.
    pub runtime_dir: PathBuf,
    /// Where job cgroups are created.
    pub cgroup_parent: CgroupParent,
    /// As root: the first host id of the range the sandbox ids map to.
    pub host_uid_base: u32,
    /// Weaker shapes the policy accepts.
    pub allow_degraded: Vec<DegradedControl>,
    /// The image store `image:` rootfs specs are resolved in (`[images] store`).
    pub image_store: PathBuf,
    /// Where the minimal host root is prepared ([`crate::minimal_root::cache_dir`]).
    pub cache_dir: PathBuf,
    /// What the minimal host root (`rootfs = "host"`) holds.
    pub minimal_root: MinimalRootSpec,
}

impl NativeConfig {
    /// The configuration a policy asks for, with `helper` as the init binary.
    pub fn from_policy(policy: &Policy, helper: PathBuf) -> Self {
        Self {
            helper,
            runtime_dir: RuntimeDir::default_path(),
            cgroup_parent: policy.native.cgroup_parent.clone(),
            host_uid_base: policy.native.host_uid_base,
            allow_degraded: policy.native.allow_degraded.clone(),
            image_store: airlock_oci::store::store_dir(&policy.images),
            cache_dir: crate::minimal_root::cache_dir(),
            minimal_root: MinimalRootSpec::from_policy(policy),
        }
    }
}

/// The native backend.
pub struct NativeBackend {
    config: NativeConfig,
    runtime: RuntimeDir,
    /// `None` only when the policy accepts the degraded shape and no cgroup is usable.
    cgroups: Option<CgroupManager>,
    /// What holds only in a weaker form (empty when the full shape holds).
    degraded: Vec<String>,
    ids: IdMapping,
    seccomp: CompiledSeccomp,
    host_layout: RootfsLayout,
    /// The minimal host root, prepared on the first `rootfs = "host"` job.
    minimal: MinimalRoot,
    /// What the helper is executed from.
    init: InitProgram,
}

impl std::fmt::Debug for NativeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeBackend")
            .field("config", &self.config)
            .field("ids", &self.ids)
            .finish_non_exhaustive()
    }
}

impl NativeBackend {
    /// Checks the host and prepares what every job shares (cgroup parent, runtime
    /// directory, compiled seccomp filter, host rootfs layout).
    pub fn new(config: NativeConfig) -> Result<Self, NativeError> {
        let euid = rustix::process::geteuid();
        let ids = if euid.is_root() {
            IdMapping::Root {
                host_base: config.host_uid_base,
            }
        } else {
            IdMapping::Rootless {
                host_uid: euid.as_raw(),
                host_gid: rustix::process::getegid().as_raw(),
            }
        };
        let (cgroups, degraded) = match open_cgroups(&config) {
            Ok(manager) => (Some(manager), Vec::new()),
            Err(reason) if config.allow_degraded.contains(&DegradedControl::Cgroup) => {
                tracing::info!(%reason, "no usable cgroup: limits fall back to rlimits, as the policy allows");
                (
                    None,
                    DEGRADED_WITHOUT_CGROUP
                        .iter()
                        .map(|s| (*s).to_owned())
                        .collect(),
                )
            }
            Err(reason) => {
                return Err(NativeError::Unsupported {
                    control: "cgroup",
                    reason: format!(
                        "{reason}. The memory, CPU and process limits need a cgroup airlock may \
                         manage: run as root, or inside a delegated cgroup v2 subtree \
                         (systemd-run --user --scope -p Delegate=yes airlock ...), or accept \
                         rlimits instead with [native] allow_degraded = [\"cgroup\"]"
                    ),
                });
            }
        };
        // Checked once, like the cgroup hierarchy itself: every job of this backend, fresh
        // or warm, then runs with the shape (and the degraded list) decided here.
        let mut degraded = degraded;
        if let Some(manager) = &cgroups
            && let Some(gap) = swap_gap(manager.swap_accounting())
        {
            if config.allow_degraded.contains(&DegradedControl::Swap) {
                tracing::info!(%gap, "swap is not capped, as the policy allows");
                degraded.push(DEGRADED_SWAP.to_owned());
            } else {
                return Err(swap_refusal(gap));
            }
        }
        // Socket buffers outside the memory limit let a job pin host memory many times its
        // limit (v1 charges them only with a TCP limit set); no weaker shape is offered.
        if let Some(manager) = &cgroups
            && !manager.tcp_accounting()
        {
            return Err(NativeError::Unsupported {
                control: "tcp memory",
                reason: TCP_ACCOUNTING_MISSING.to_owned(),
            });
        }
        let runtime = RuntimeDir::open(&config.runtime_dir)?;
        let seccomp = CompiledSeccomp::builtin()?;
        let host_layout = RootfsLayout::probe_host().map_err(|source| NativeError::Rootfs {
            path: PathBuf::from("/"),
            source,
        })?;
        sweep_stale_jobs(&runtime, cgroups.as_ref());
        let minimal = MinimalRoot::new(config.minimal_root.clone(), config.cache_dir.clone());
        let init = InitProgram::new(config.helper.clone());
        Ok(Self {
            minimal,
            init,
            config,
            runtime,
            cgroups,
            degraded,
            ids,
            seccomp,
            host_layout,
        })
    }

    /// The cgroup manager (for doctor and leak checks); `None` in the degraded shape.
    pub fn cgroups(&self) -> Option<&CgroupManager> {
        self.cgroups.as_ref()
    }

    /// Controls that hold only in a weaker form on this host.
    pub fn degraded(&self) -> &[String] {
        &self.degraded
    }

    /// The runtime directory (for leak checks).
    pub fn runtime_dir(&self) -> &RuntimeDir {
        &self.runtime
    }

    /// The sandbox init's executable memfd, if it is one the kernel executes.
    pub(crate) fn init_memfd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.init.executable_memfd()
    }

    /// The id mapping in use.
    pub fn id_mapping(&self) -> IdMapping {
        self.ids
    }

    fn check_supported(&self, job: &JobSpec) -> Result<(), NativeError> {
        if let RootfsSpec::Image { reference, digest } = &job.filesystem.rootfs {
            // Before anything of the job exists: the image must be in the store; unpacked
            // into the cache now if it is not yet (never pulled).
            self.image_rootfs(reference, digest)?;
        }
        let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        if let Some(hard) = nofile.maximum
            && hard < u64::from(job.limits.open_files)
        {
            return Err(NativeError::Unsupported {
                control: "rlimit",
                reason: format!(
                    "the policy's open_files is {} but airlock's own hard limit is {hard}, \
                     and raising a hard limit needs CAP_SYS_RESOURCE; lower open_files or \
                     start airlock with a higher `ulimit -Hn`",
                    job.limits.open_files
                ),
            });
        }
        Ok(())
    }

    /// The read-only tree of the image pinned by `digest`, from the image store.
    fn image_rootfs(&self, reference: &str, digest: &str) -> Result<PathBuf, NativeError> {
        airlock_oci::store::rootfs_for_job(&self.config.image_store, reference, digest).map_err(
            |e| NativeError::Rootfs {
                path: self.config.image_store.clone(),
                source: std::io::Error::other(format!(
                    "image {reference}@{digest}: {}",
                    airlock_core::error::chain(&e)
                )),
            },
        )
    }

    /// The minimal root's layout for `job`, refusing a job whose interpreter the host
    /// lacks or cannot run.
    fn minimal_layout(&self, job: &JobSpec) -> Result<RootfsLayout, NativeError> {
        crate::minimal_root::require_overlayfs()?;
        let prepared = self.minimal.get()?;
        if let Some(program) = job.argv.first() {
            match prepared.manifest.programs.get(program) {
                Some(ProgramState::Missing) => {
                    return Err(NativeError::InterpreterMissing {
                        detail: format!(
                            "{program} is not installed on this host (looked in {}), so the \
                             minimal root (rootfs = \"host\") has none",
                            crate::minimal_root::JOB_PATH_DIRS.join(":")
                        ),
                    });
                }
                Some(ProgramState::Broken { reason }) => {
                    return Err(NativeError::InterpreterMissing {
                        detail: format!("{program} on this host cannot run: {reason}"),
                    });
                }
                Some(ProgramState::Found { .. }) | None => {}
            }
        }
        RootfsLayout::probe_prepared(&prepared.tree, &prepared.spare).map_err(|source| {
            NativeError::Rootfs {
                path: prepared.tree.clone(),
                source,
            }
        })
    }

    /// The sandbox's plan. `trust_bundle`: the job's CA bundle on the host, when the
    /// proxy intercepts TLS (bound over the root's bundle; a root without one refuses
    /// the job).
    pub(crate) fn plan(
        &self,
        job: &JobSpec,
        jobdir: &JobDir,
        cgroup: Option<&JobCgroup>,
        trust_bundle: Option<&Path>,
    ) -> Result<SandboxPlan, NativeError> {
        let layout = match &job.filesystem.rootfs {
            RootfsSpec::Host => self.minimal_layout(job)?,
            RootfsSpec::HostFull => {
                // The whole host view, but through overlays of the job's own: no inode of
                // the host's system directories is the job's.
                crate::minimal_root::require_overlayfs()?;
                let mut layout = self.host_layout.clone();
                layout.overlay_spare =
                    Some(crate::minimal_root::spare_dir(&self.config.cache_dir)?);
                layout
            }
            RootfsSpec::Dir(path) => {
                RootfsLayout::probe_dir(path).map_err(|source| NativeError::Rootfs {
                    path: path.clone(),
                    source,
                })?
            }
            RootfsSpec::Image { reference, digest } => {
                // The unpacked tree is used like a dir: rootfs (top-level entries bound
                // read-only).
                let tree = self.image_rootfs(reference, digest)?;
                RootfsLayout::probe_dir(&tree)
                    .map_err(|source| NativeError::Rootfs { path: tree, source })?
            }
        };
        if trust_bundle.is_some() {
            layout
                .check_trust_bundle_target()
                .map_err(|reason| NativeError::Unsupported {
                    control: "TLS interception",
                    reason,
                })?;
        }
        let mounts = mount_plan::build_mount_plan(
            &layout,
            &JobMounts {
                workdir: jobdir.work(),
                workdir_mode: job.filesystem.workdir,
                tmp_bytes: job.limits.tmp.as_u64(),
                out: job.filesystem.out.enabled.then(|| OutMount {
                    size_bytes: job.filesystem.out.max_bytes.as_u64(),
                    // Every released file needs an inode; directories need some too.
                    inodes: u64::from(job.filesystem.out.max_files) + OUT_SPARE_INODES,
                }),
                trust_bundle: trust_bundle.map(Path::to_path_buf),
            },
        );
        let cpu_secs = (job.limits.timeout.as_secs_f64() * f64::from(job.limits.cpus.millis())
            / 1000.0)
            .ceil() as u64
            + CPU_RLIMIT_SLACK_SECS;
        let mut rlimits = vec![
            RlimitSetting {
                resource: RlimitResource::Nofile,
                value: u64::from(job.limits.open_files),
            },
            RlimitSetting {
                resource: RlimitResource::Fsize,
                value: job.limits.file_size.as_u64(),
            },
            RlimitSetting {
                resource: RlimitResource::Core,
                value: CORE_RLIMIT_BYTES,
            },
            RlimitSetting {
                resource: RlimitResource::Cpu,
                value: cpu_secs,
            },
        ];
        // Per-user budgets the job is charged in its own namespace (the owner is charged too).
        rlimits.push(RlimitSetting {
            resource: RlimitResource::Msgqueue,
            value: MSGQUEUE_RLIMIT_BYTES,
        });
        rlimits.push(RlimitSetting {
            resource: RlimitResource::Sigpending,
            value: SIGPENDING_RLIMIT,
        });
        if cgroup.is_none() {
            // The degraded shape: per-process address space for memory, per-namespace
            // process count for pids. No CPU share is possible; the CPU-time cap stays.
            rlimits.push(RlimitSetting {
                resource: RlimitResource::As,
                value: job.limits.memory.as_u64(),
            });
            // The helper and the init live in the job's user namespace too.
            rlimits.push(RlimitSetting {
                resource: RlimitResource::Nproc,
                value: u64::from(job.limits.pids + INIT_PROCESSES),
            });
        }
        Ok(SandboxPlan {
            job_id: job.id.to_string(),
            supervisor_pid: rustix::process::getpid().as_raw_nonzero().get(),
            cgroup_join: cgroup.map(JobCgroup::join_files).unwrap_or_default(),
            ids: self.ids,
            namespace_owner: self.ids.namespace_owner(next_owner_slot()),
            user_namespace_limits: USER_NAMESPACE_LIMITS
                .iter()
                .map(|(name, value)| ((*name).to_owned(), *value))
                .collect(),
            // Only host uid 0 may set it, and only the root mode's sandbox has that uid.
            memfd_noexec: matches!(self.ids, IdMapping::Root { .. }) && memfd_noexec_available(),
            new_root: jobdir.root(),
            root_size_bytes: ROOT_TMPFS_BYTES,
            mounts,
            hostname: mount_plan::HOSTNAME.to_owned(),
            loopback_up: true,
            cwd: airlock_core::job::WORKDIR.to_owned(),
            rlimits,
            argv: job.argv.clone(),
            env: job_env(job),
            seccomp: self.seccomp.clone(),
            send_out_dir: job.filesystem.out.enabled,
            proxy_port: (job.network == NetworkMode::Proxy).then_some(PROXY_PORT),
            control_fd: false,
            program: ProgramRole::Job,
            helper_rlimits: Vec::new(),
        })
    }

    /// Runs one job in a fresh sandbox and removes the sandbox.
    pub async fn run_job(&self, job: &JobSpec) -> Result<RunReport, NativeError> {
        self.run_job_with(job, None).await
    }

    /// Like [`NativeBackend::run_job`], passing kept output to `tap` as it is read.
    pub async fn run_job_with(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
    ) -> Result<RunReport, NativeError> {
        Teardown::removed(self.run_job_then_teardown(job, tap).await).await
    }

    /// Like [`NativeBackend::run_job_with`], but returns once the job's processes are gone
    /// and its report is built, leaving the removal of the cgroup and the job directory to
    /// the returned [`Teardown`] (see [`Backend::run_then_teardown`]).
    pub async fn run_job_then_teardown(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
    ) -> Result<(RunReport, Teardown), NativeError> {
        self.check_supported(job)?;
        let proxy_config = proxy_config(job)?;
        tracing::debug!(job_id = %job.id, "creating sandbox");
        let jobdir = JobDir::create(&self.runtime, job, &self.ids)?;
        let trust_bundle = match proxy_config.as_ref().and_then(|c| c.trust_bundle_pem()) {
            Some(pem) => Some(jobdir.write_trust_bundle(pem)?),
            None => None,
        };
        let cgroup = self.create_cgroup(job.id.as_str(), job)?;
        let plan = self.plan(job, &jobdir, cgroup.as_ref(), trust_bundle.as_deref())?;
        tracing::debug!(job_id = %job.id, "plan ready");
        let supervised = match self
            .launch(job.id.as_str(), &plan, job.stdin.is_some())
            .await
        {
            Ok(launched) => self.finish(job, launched, tap, proxy_config, None).await,
            Err(e) => Err(e),
        };
        tracing::debug!(job_id = %job.id, "job over; ending its processes");
        self.conclude(job, supervised, cgroup, jobdir, Duration::ZERO)
            .await
    }

    /// The job's cgroup (named `name`), or `None` in the degraded shape.
    pub(crate) fn create_cgroup(
        &self,
        name: &str,
        job: &JobSpec,
    ) -> Result<Option<JobCgroup>, NativeError> {
        let limits = JobLimits {
            memory_bytes: job.limits.memory.as_u64(),
            cpu_millis: job.limits.cpus.millis(),
            pids_max: job.limits.pids + INIT_PROCESSES,
        };
        Ok(match &self.cgroups {
            Some(manager) => Some(manager.create_job(name, &limits)?),
            None => None,
        })
    }

    /// Ends the job, whatever happened: kills what is left of its processes and waits for
    /// them to be gone, reads the accounting, releases `/out`, and builds the report. The
    /// cgroup and the job directory are then removed by the returned [`Teardown`]; on an
    /// error, or when a process outlived the kill, they are removed before this returns.
    /// `cpu_before` is CPU time the group had used before the job was delivered (a warm
    /// sandbox's start), left out of the job's figure.
    pub(crate) async fn conclude(
        &self,
        job: &JobSpec,
        supervised: Result<Supervised, NativeError>,
        cgroup: Option<JobCgroup>,
        jobdir: JobDir,
        cpu_before: Duration,
    ) -> Result<(RunReport, Teardown), NativeError> {
        // Blocking work, off the async threads.
        let ended = tokio::task::spawn_blocking(move || {
            let ended = end_processes(cgroup.as_ref());
            (ended, cgroup)
        })
        .await;
        let (ended, cgroup) = match ended {
            Ok(ended) => ended,
            Err(join) => return Err(NativeError::Helper(format!("end-of-job task: {join}"))),
        };
        let stats = match (ended, supervised.as_ref()) {
            (
                Ok(Ended {
                    stats,
                    all_gone: true,
                }),
                Ok(_),
            ) => stats,
            (ended, _) => {
                // Nothing to report, or processes the report could not wait for: the
                // sandbox goes now, and the first error is the job's.
                let removed = removal(cgroup, jobdir).await;
                supervised?;
                ended?;
                removed?;
                return Err(NativeError::Helper(
                    "a process of the job outlived its kill; the sandbox was removed".into(),
                ));
            }
        };
        let teardown = {
            let job_id = job.id.clone();
            Teardown::new(async move {
                if let Err(e) = removal(cgroup, jobdir).await {
                    tracing::warn!(job_id = %job_id, error = %e, "sandbox not fully removed");
                } else {
                    tracing::debug!(job_id = %job_id, "sandbox removed");
                }
            })
        };
        let mut supervised = supervised?;
        let released = match supervised.out_dir.take() {
            Some(dir) => {
                let caps = OutCaps {
                    max_files: job.filesystem.out.max_files,
                    max_bytes: job.filesystem.out.max_bytes.as_u64(),
                    max_file_bytes: job.filesystem.out.max_file_bytes.as_u64(),
                };
                tokio::task::spawn_blocking(move || out::release(&dir, caps))
                    .await
                    .map_err(|e| NativeError::Helper(format!("release task: {e}")))?
            }
            None => out::Released::default(),
        };
        let (cpu_time, peak_memory_bytes, oom_kills) = match stats {
            Some(stats) => (
                stats.cpu_time.map(|t| t.saturating_sub(cpu_before)),
                stats.peak_memory_bytes,
                stats.oom_kills,
            ),
            // Without a cgroup, the init's view of the processes it reaped.
            None => (
                supervised
                    .usage
                    .map(|u| Duration::from_millis(u.cpu_ms).saturating_sub(cpu_before)),
                supervised.usage.map(|u| u.max_rss_bytes),
                0,
            ),
        };
        let report = RunReport {
            termination: supervised.termination,
            limit_hit: supervised.limit_hit,
            oom_kills,
            stdout: supervised.stdout,
            stderr: supervised.stderr,
            duration: supervised.duration,
            setup: supervised.setup,
            cpu_time,
            peak_memory_bytes,
            // The pinned digest, as the container backends report it.
            image_digest: match &job.filesystem.rootfs {
                RootfsSpec::Image { digest, .. } => Some(digest.clone()),
                RootfsSpec::Host | RootfsSpec::HostFull | RootfsSpec::Dir(_) => None,
            },
            degraded: self.degraded.clone(),
            out_files: released.files,
            out_rejected: released.rejected,
            network: supervised.network,
        };
        Ok((report, teardown))
    }

    /// Starts the helper with `plan` and waits until the program has started (phase 1:
    /// sandbox construction, up to the program's exec). `label` names the sandbox in logs.
    pub(crate) async fn launch(
        &self,
        label: &str,
        plan: &SandboxPlan,
        stdin_piped: bool,
    ) -> Result<Launched, NativeError> {
        let spawned_at = Instant::now();
        let (plan_read, plan_write) = cloexec_pipe()?;
        let (status_read, status_write) = cloexec_pipe()?;
        // A warm sandbox's program reads its job from a pipe; a zygote talks with the pool
        // over a socket (its children's plan in, one request per child it forks).
        let control = match (plan.control_fd, plan.program) {
            (false, _) => None,
            (true, ProgramRole::Job) => Some(cloexec_pipe()?),
            (true, ProgramRole::Zygote) => Some(
                unix_socket_pair(rustix::net::SocketType::SEQPACKET)
                    .map_err(|e| NativeError::Helper(format!("create zygote socket: {e}")))?,
            ),
        };
        let handoff = if plan.handoff_count() > 0 {
            Some(
                unix_socket_pair(rustix::net::SocketType::STREAM)
                    .map_err(|e| NativeError::Helper(format!("create /out socket: {e}")))?,
            )
        } else {
            None
        };
        let mut fds = vec![(&plan_read, PLAN_FD), (&status_write, STATUS_FD)];
        if let Some((_, child_end)) = &handoff {
            fds.push((child_end, HANDOFF_FD));
        }
        if let Some((control_read, _)) = &control {
            fds.push((control_read, CONTROL_FD));
        }
        // On cgroup v2 the helper is created inside the job's group (one cgroup.procs file,
        // whose directory is the group); it then has nothing to join.
        let cgroup_v2_dir = match (&self.cgroups, plan.cgroup_join.as_slice()) {
            (Some(manager), [procs]) if manager.version() == CgroupVersion::V2 => procs.parent(),
            _ => None,
        };
        let mut command = HelperCommand {
            program: self.init.program(),
            args: &[INIT_ARG],
            stdin_piped,
            fds: &fds,
        };
        let started = match Helper::start(&command, cgroup_v2_dir) {
            Err(refused) if self.init.is_memfd(command.program) => {
                // The memfd could not be executed here: the airlock binary, which holds
                // the same init, then serves; if it does, later helpers start from it.
                command.program = self.init.airlock();
                let started = Helper::start(&command, cgroup_v2_dir);
                if started.is_ok() {
                    self.init.refuse_memfd(&refused);
                }
                started
            }
            other => other,
        };
        let program = command.program.to_owned();
        let Started {
            helper: mut child,
            stdin,
            stdout,
            stderr,
        } = started.map_err(|source| NativeError::SpawnHelper {
            path: program.clone(),
            source,
        })?;
        drop(plan_read);
        drop(status_write);
        let control = control.map(|(_theirs, ours)| ours);
        tracing::debug!(sandbox = %label, placement = ?child.placement, program = %program.display(), "helper spawned");
        let handoff = handoff.map(|(ours, _theirs)| ours);

        let plan_json = match child.placement {
            Placement::Born => {
                let mut born = plan.clone();
                born.cgroup_join.clear();
                serde_json::to_vec(&born)
            }
            Placement::Joins => serde_json::to_vec(plan),
        }
        .map_err(|e| NativeError::Helper(format!("encode plan: {e}")))?;
        let mut plan_sender = tokio::net::unix::pipe::Sender::from_owned_fd(plan_write)
            .map_err(|e| NativeError::Helper(format!("plan pipe: {e}")))?;
        tokio::spawn(async move {
            // EPIPE means the helper died early; its exit is handled below.
            let _ = plan_sender.write_all(&plan_json).await;
        });

        let status_receiver = tokio::net::unix::pipe::Receiver::from_owned_fd(status_read)
            .map_err(|e| NativeError::Helper(format!("status pipe: {e}")))?;
        let (event_tx, mut events) = mpsc::channel(STATUS_EVENTS_MAX);
        let status_task = tokio::spawn(read_events(status_receiver, event_tx));

        let started_at = await_start(label, &mut events, &mut child).await?;

        // What the init handed over before the start is queued on the handoff socket now.
        let mut handed = handoff
            .as_ref()
            .map(crate::handoff::receive_handoff)
            .unwrap_or_default()
            .into_iter();
        let out_dir = if plan.send_out_dir {
            handed.next()
        } else {
            None
        };
        let proxy_listener = if plan.proxy_port.is_some() {
            handed.next()
        } else {
            None
        };
        if plan.send_out_dir && out_dir.is_none() {
            child.start_kill();
            return Err(NativeError::Helper(
                "the sandbox did not hand over /out".into(),
            ));
        }
        if plan.proxy_port.is_some() && proxy_listener.is_none() {
            child.start_kill();
            return Err(NativeError::Helper(
                "the sandbox did not hand over the proxy socket".into(),
            ));
        }
        Ok(Launched {
            child,
            stdin,
            stdout,
            stderr,
            events,
            status_task,
            out_dir,
            proxy_listener,
            control,
            spawned_at,
            started_at,
        })
    }

    /// Phase 2: delivers the job to a launched sandbox (its stdin, and on a warm sandbox
    /// the `control` message), then runs it against the wall clock and the flood limit.
    /// The clock starts when the program has started, or for a warm sandbox when the
    /// control message is sent.
    pub(crate) async fn finish(
        &self,
        job: &JobSpec,
        launched: Launched,
        tap: Option<OutputTap>,
        proxy_config: Option<Arc<airlock_proxy::ProxyConfig>>,
        control: Option<Vec<u8>>,
    ) -> Result<Supervised, NativeError> {
        let Launched {
            mut child,
            stdin,
            stdout,
            stderr,
            mut events,
            status_task,
            out_dir,
            proxy_listener,
            control: control_pipe,
            spawned_at,
            started_at,
        } = launched;
        if let (Some(mut stdin), Some(bytes)) = (stdin, job.stdin.clone()) {
            tokio::spawn(async move {
                // The job may exit without reading its input.
                let _ = stdin.write_all(&bytes).await;
            });
        }
        // The proxy accepts on the socket bound inside the job's network namespace and
        // dials out from ours: the job has no route anywhere, only this listener.
        let proxy = match (proxy_listener, proxy_config) {
            (Some(listener), Some(config)) => Some(
                airlock_proxy::spawn(std::net::TcpListener::from(listener), config).map_err(
                    |e| {
                        child.start_kill();
                        NativeError::Helper(format!("start the egress proxy: {e}"))
                    },
                )?,
            ),
            (None, Some(_)) => {
                child.start_kill();
                return Err(NativeError::Helper(
                    "the sandbox did not hand over the proxy socket".into(),
                ));
            }
            _ => None,
        };

        let (clock_from, setup) = match (control_pipe, control) {
            (Some(pipe), Some(message)) => {
                let mut sender = tokio::net::unix::pipe::Sender::from_owned_fd(pipe)
                    .map_err(|e| NativeError::Helper(format!("control pipe: {e}")))?;
                tokio::spawn(async move {
                    // Dropping the sender afterwards is the end-of-file that starts the job.
                    // EPIPE means the sandbox is gone; its exit is handled below.
                    let _ = sender.write_all(&message).await;
                });
                (Instant::now(), Duration::ZERO)
            }
            (None, None) => (started_at, started_at.saturating_duration_since(spawned_at)),
            _ => {
                child.start_kill();
                return Err(NativeError::Helper(
                    "a warm sandbox needs its control message, and only a warm sandbox takes one"
                        .into(),
                ));
            }
        };

        let supervised = supervise(
            Supervision::of(job, clock_from, DRAIN_TIMEOUT),
            HelperSandbox { child },
            PipeSource::new(stdout, stderr),
            JobOutput::new(&job.limits, tap),
        )
        .await?;

        // The status pipe closes once the helper and the init are gone.
        if tokio::time::timeout(DRAIN_TIMEOUT, status_task)
            .await
            .is_err()
        {
            tracing::warn!(job_id = %job.id, "status pipe still open after the helper exited");
        }
        let mut termination = Termination::Unknown;
        let mut usage = None;
        while let Ok(event) = events.try_recv() {
            match event {
                InitEvent::Exited { code, usage: u } => {
                    termination = Termination::Exited(code);
                    usage = u;
                }
                InitEvent::Signaled { signal, usage: u } => {
                    termination = Termination::Signaled(signal);
                    usage = u;
                }
                InitEvent::Started | InitEvent::Failed { .. } => {}
            }
        }
        let network = match proxy {
            Some(proxy) => Some(proxy.shutdown().await.into_report()),
            None => None,
        };
        Ok(Supervised {
            network,
            out_dir,
            termination,
            usage,
            limit_hit: supervised.limit_hit,
            stdout: supervised.stdout,
            stderr: supervised.stderr,
            duration: supervised.duration,
            setup,
        })
    }
}

/// Waits until the sandbox's program has started (its `Started` event), at most
/// [`SETUP_TIMEOUT`]: the moment its wall time may start. A setup failure the sandbox
/// reported is the error; a sandbox that did not start in time is killed.
pub(crate) async fn await_start(
    label: &str,
    events: &mut mpsc::Receiver<InitEvent>,
    child: &mut Helper,
) -> Result<Instant, NativeError> {
    let setup_deadline = tokio::time::sleep(SETUP_TIMEOUT);
    tokio::pin!(setup_deadline);
    let mut final_event = None;
    let started_at = loop {
        tokio::select! {
            event = events.recv() => match event {
                Some(InitEvent::Started) => {
                    tracing::debug!(sandbox = %label, "program started");
                    break Some(Instant::now());
                }
                Some(failed @ InitEvent::Failed { .. }) => {
                    final_event = Some(failed);
                    break None;
                }
                Some(other) => {
                    tracing::warn!(sandbox = %label, ?other, "event before start");
                    final_event = Some(other);
                }
                None => break None,
            },
            _ = &mut setup_deadline => {
                child.start_kill();
                let _ = tokio::time::timeout(KILL_GRACE, child.wait()).await;
                return Err(NativeError::Helper(format!(
                    "the sandbox was not ready within {} s", SETUP_TIMEOUT.as_secs()
                )));
            }
        }
    };
    if let Some(started_at) = started_at {
        return Ok(started_at);
    }
    let _ = tokio::time::timeout(KILL_GRACE, child.wait()).await;
    Err(match final_event {
        Some(InitEvent::Failed {
            step,
            errno,
            detail,
        }) => {
            if step == "exec" && errno == Some(rustix::io::Errno::NOENT.raw_os_error()) {
                NativeError::InterpreterMissing { detail }
            } else {
                NativeError::Setup {
                    step,
                    errno,
                    detail,
                }
            }
        }
        _ => NativeError::Helper("the sandbox init ended without reporting why".into()),
    })
}

/// The egress proxy's configuration for a proxy-mode job, checked before anything is
/// created: a secret whose value is missing on the host refuses the job.
pub(crate) fn proxy_config(
    job: &JobSpec,
) -> Result<Option<Arc<airlock_proxy::ProxyConfig>>, NativeError> {
    Ok(match job.network {
        NetworkMode::Proxy => Some(Arc::new(
            airlock_proxy::ProxyConfig::from_policy(
                &job.network_policy,
                &job.network_allow,
                |name| std::env::var(name).ok(),
            )
            .map_err(|e| NativeError::Unsupported {
                control: "egress proxy",
                reason: e.to_string(),
            })?,
        )),
        NetworkMode::None => None,
    })
}

/// A sandbox whose program has started: the helper (for a zygote's child, the sandbox's
/// leader) and what the supervisor holds of it.
pub(crate) struct Launched {
    pub(crate) child: Helper,
    pub(crate) stdin: Option<HelperInput>,
    pub(crate) stdout: HelperOutput,
    pub(crate) stderr: HelperOutput,
    pub(crate) events: mpsc::Receiver<InitEvent>,
    pub(crate) status_task: tokio::task::JoinHandle<()>,
    pub(crate) out_dir: Option<std::os::fd::OwnedFd>,
    pub(crate) proxy_listener: Option<std::os::fd::OwnedFd>,
    /// A warm sandbox's control pipe (write end), or a zygote's socket.
    pub(crate) control: Option<std::os::fd::OwnedFd>,
    pub(crate) spawned_at: Instant,
    pub(crate) started_at: Instant,
}

impl Launched {
    /// Whether the sandbox's helper is still running (a warm sandbox waiting for its job).
    pub(crate) fn is_alive(&mut self) -> bool {
        self.child.is_running()
    }

    /// Kills the sandbox (the helper; the init and the job follow it) and waits for it.
    pub(crate) async fn kill(mut self) {
        self.child.start_kill();
        let _ = tokio::time::timeout(KILL_GRACE, self.child.wait()).await;
    }
}

pub(crate) struct Supervised {
    network: Option<airlock_core::observation::NetworkReport>,
    out_dir: Option<std::os::fd::OwnedFd>,
    termination: Termination,
    usage: Option<crate::plan::Usage>,
    limit_hit: Option<LimitHit>,
    stdout: CapturedOutput,
    stderr: CapturedOutput,
    duration: Duration,
    pub(crate) setup: Duration,
}

/// What is known once a job's processes were ended.
pub(crate) struct Ended {
    /// The cgroup's accounting (`None` without a cgroup).
    stats: Option<JobStats>,
    /// Whether the group emptied within [`TEARDOWN_WAIT`].
    all_gone: bool,
}

/// Kills every process left in the job's cgroup, waits for the group to empty and reads
/// its accounting. Without a cgroup the processes ended with the init's pid namespace.
pub(crate) fn end_processes(cgroup: Option<&JobCgroup>) -> Result<Ended, NativeError> {
    let Some(cgroup) = cgroup else {
        return Ok(Ended {
            stats: None,
            all_gone: true,
        });
    };
    let killed = cgroup.kill_all();
    let all_gone = cgroup.wait_empty(TEARDOWN_WAIT).unwrap_or(false);
    let stats = cgroup.stats();
    killed?;
    Ok(Ended {
        stats: Some(stats?),
        all_gone,
    })
}

/// Removes the cgroup and the job directory of a sandbox whose processes were ended.
pub(crate) fn remove_sandbox(cgroup: Option<JobCgroup>, jobdir: JobDir) -> Result<(), NativeError> {
    let removed = cgroup.map(JobCgroup::remove).transpose();
    if let Err(e) = jobdir.remove() {
        tracing::warn!(error = %e, "cannot remove job directory");
    }
    removed?;
    Ok(())
}

/// [`remove_sandbox`] off the async threads.
async fn removal(cgroup: Option<JobCgroup>, jobdir: JobDir) -> Result<(), NativeError> {
    tokio::task::spawn_blocking(move || remove_sandbox(cgroup, jobdir))
        .await
        .map_err(|join| NativeError::Helper(format!("removal task: {join}")))?
}

/// Ends the processes and removes the sandbox in one go, for sandboxes that never ran a
/// job (a warm sandbox discarded, or one that failed to start).
pub(crate) fn teardown(
    cgroup: Option<JobCgroup>,
    jobdir: JobDir,
) -> Result<Option<JobStats>, NativeError> {
    let ended = end_processes(cgroup.as_ref());
    let removed = remove_sandbox(cgroup, jobdir);
    let ended = ended?;
    removed?;
    Ok(ended.stats)
}

/// What is weaker without a cgroup, as listed in observations and audit lines.
pub const DEGRADED_WITHOUT_CGROUP: &[&str] = &[
    "memory: RLIMIT_AS per process instead of a cgroup limit for the whole job",
    "pids: RLIMIT_NPROC per user namespace instead of a cgroup limit",
    "cpu: no CPU share, only the RLIMIT_CPU time cap",
    "accounting: cpu and peak memory from the processes the init reaped",
];

/// Why a host without TCP accounting in its memory cgroups is refused.
pub const TCP_ACCOUNTING_MISSING: &str = "this kernel does not charge TCP socket buffers to memory cgroups (v1: no \
     memory.kmem.tcp.limit_in_bytes, CONFIG_MEMCG_KMEM off or cgroup.memory=nosocket; v2: \
     booted with cgroup.memory=nosocket), so a job's sockets could pin memory far past its \
     limit; boot without cgroup.memory=nosocket, or use cgroup v2";

/// What the observation lists when the policy accepts an uncapped swap.
pub const DEGRADED_SWAP: &str =
    "memory: swap is on and not accounted, so a job may page out beyond its memory limit";

/// Why the memory limit cannot hold with no swap: `Some` when the cgroup hierarchy cannot
/// cap swap and the host has swap enabled (`SwapTotal` in `/proc/meminfo` above zero).
/// With swap accounting the memory limit is the whole bound, and nothing is read.
pub fn swap_gap(swap_accounting: bool) -> Option<String> {
    if swap_accounting {
        return None;
    }
    // Unreadable /proc/meminfo: no evidence of swap either way; the cgroup check stands.
    swap_gap_in(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default())
}

/// [`swap_gap`] of a host without swap accounting whose `/proc/meminfo` is `meminfo`.
fn swap_gap_in(meminfo: &str) -> Option<String> {
    let swap_kib = meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix("SwapTotal:")?;
        rest.trim()
            .trim_end_matches("kB")
            .trim()
            .parse::<u64>()
            .ok()
    })?;
    (swap_kib > 0).then(|| {
        format!(
            "this host has {} MiB of swap and its cgroups do not account swap, so a job could \
             page out beyond its memory limit",
            swap_kib / 1024
        )
    })
}

fn swap_refusal(gap: String) -> NativeError {
    NativeError::Unsupported {
        control: "swap",
        reason: format!(
            "{gap}. Enable swap accounting (cgroup v1: boot with swapaccount=1; v2: the \
             memory controller with memory.swap.max), or turn swap off (swapoff -a), or accept \
             it with [native] allow_degraded = [\"swap\"]"
        ),
    }
}

/// Opens the cgroup hierarchy and checks that job groups can be created under the parent.
fn open_cgroups(config: &NativeConfig) -> Result<CgroupManager, String> {
    let hierarchy = Hierarchy::detect().map_err(|e| e.to_string())?;
    let parent = match &config.cgroup_parent {
        CgroupParent::Auto => ParentSpec::Auto,
        CgroupParent::Path(p) => ParentSpec::Path(p.clone()),
    };
    let report = hierarchy.report_for(&parent);
    if !report.parent.writable {
        return Err(report
            .parent
            .explanation
            .clone()
            .unwrap_or_else(|| "the cgroup parent is not writable".to_owned()));
    }
    CgroupManager::new(hierarchy, parent).map_err(|e| e.to_string())
}

/// How old an empty job cgroup with no job directory here must be before a sweep removes it:
/// a group another supervisor made a moment ago is empty until its helper joins it.
const ORPHANED_GROUP_MIN_AGE: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes what jobs of a crashed supervisor left behind: their cgroups (killing what
/// still runs there) and their directories. A live job's directory is locked by its
/// supervisor and exists for as long as its cgroup does, so neither is ever touched.
fn sweep_stale_jobs(runtime: &RuntimeDir, cgroups: Option<&CgroupManager>) {
    let _sweeping = match runtime.lock_for_sweep() {
        Ok(lock) => lock,
        Err(e) => {
            tracing::warn!(error = %e, "cannot take the runtime directory's sweep lock");
            return;
        }
    };
    let stale = match runtime.stale_jobs() {
        Ok(stale) => stale,
        Err(e) => {
            tracing::warn!(error = %e, "cannot scan the runtime directory for stale jobs");
            return;
        }
    };
    for name in &stale {
        if let Some(cgroups) = cgroups
            && let Err(e) = cgroups.remove_stale_job(name)
        {
            tracing::warn!(job = %name, error = %e, "cannot remove a stale job's cgroup");
            continue;
        }
        if let Err(e) = runtime.remove_job_dir(name) {
            tracing::warn!(job = %name, error = %e, "cannot remove a stale job directory");
        }
    }
    // Groups first, directories second: a job's directory is created before its cgroup and
    // removed after it, so a group listed here whose directory is missing afterwards is
    // truly orphaned, never a job being created right now.
    let Some(cgroups) = cgroups else {
        return;
    };
    let Ok(groups) = cgroups.job_groups() else {
        return;
    };
    let live: std::collections::BTreeSet<String> =
        runtime.job_dirs().unwrap_or_default().into_iter().collect();
    // Such a group may also be a live job of another airlock with another runtime directory
    // under the same cgroup parent: it is removed only when empty and old, never killed.
    for name in groups.iter().filter(|g| !live.contains(*g)) {
        match cgroups.remove_orphaned_group(name, ORPHANED_GROUP_MIN_AGE) {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(job = %name, "a job cgroup of no job here is in use or new: left")
            }
            Err(e) => {
                tracing::warn!(job = %name, error = %e, "cannot remove an orphaned job cgroup");
            }
        }
    }
}

/// A connected pair of close-on-exec unix sockets of `kind`.
pub(crate) fn unix_socket_pair(
    kind: rustix::net::SocketType,
) -> rustix::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        kind,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
}

fn cloexec_pipe() -> Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd), NativeError> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| NativeError::Helper(format!("create pipe: {e}")))
}

/// The helper as the supervision core sees it: it ends when the helper exits (the init and
/// with it every process of the job are gone by then, or going), and is killed by killing it.
struct HelperSandbox {
    child: Helper,
}

impl Sandbox for HelperSandbox {
    type Exit = ();
    type Error = NativeError;

    async fn wait(&mut self) -> Result<(), NativeError> {
        self.child.wait().await;
        Ok(())
    }

    fn kill(&mut self) -> Kill {
        // Killing the helper kills the init (parent-death signal), and the init's death
        // kills every process in the pid namespace. Teardown sweeps the cgroup too.
        self.child.start_kill();
        Kill::sent(KILL_GRACE)
    }
}

pub(crate) async fn read_events(
    receiver: tokio::net::unix::pipe::Receiver,
    tx: mpsc::Sender<InitEvent>,
) {
    let mut reader = BufReader::new(receiver);
    for _ in 0..STATUS_EVENTS_MAX {
        let mut line = Vec::new();
        match (&mut reader)
            .take(STATUS_LINE_MAX_BYTES)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => break,
            Ok(_) => match serde_json::from_slice::<InitEvent>(&line) {
                Ok(event) => {
                    if tx.try_send(event).is_err() {
                        tracing::warn!("too many status events from the sandbox");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "unreadable status line from the sandbox"),
            },
        }
    }
}

impl Backend for NativeBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Native
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: BackendKind::Native,
            network_proxy: true,
            out_dir: true,
            image_rootfs: false,
        }
    }

    fn run_then_teardown<'a>(
        &'a self,
        job: &'a JobSpec,
        tap: Option<OutputTap>,
    ) -> BoxFuture<'a, Result<(RunReport, Teardown), BackendError>> {
        Box::pin(async move {
            self.run_job_then_teardown(job, tap)
                .await
                .map_err(BackendError::from)
        })
    }
}

/// The helper binary to use when none is configured: this executable.
pub fn current_exe() -> Result<PathBuf, NativeError> {
    std::env::current_exe().map_err(|source| NativeError::SpawnHelper {
        path: Path::new("/proc/self/exe").to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const WITH_SWAP: &str = "MemTotal:       24000000 kB\nSwapCached:            0 kB\nSwapTotal:       2097148 kB\nSwapFree:        2097148 kB\n";
    const WITHOUT_SWAP: &str =
        "MemTotal:       24000000 kB\nSwapTotal:             0 kB\nSwapFree:              0 kB\n";

    #[test]
    fn swap_without_accounting_is_a_gap() {
        let gap = swap_gap_in(WITH_SWAP).expect("a gap");
        assert!(gap.contains("2047 MiB of swap"), "{gap}");
    }

    #[test]
    fn swap_accounting_or_no_swap_is_no_gap() {
        assert_eq!(swap_gap(true), None);
        assert_eq!(swap_gap_in(WITHOUT_SWAP), None);
        // Nothing known about swap: no evidence of a gap.
        assert_eq!(swap_gap_in(""), None);
    }

    #[test]
    fn the_swap_refusal_names_the_control_and_every_fix() {
        let NativeError::Unsupported { control, reason } = swap_refusal("gap".to_owned()) else {
            panic!("not an Unsupported error");
        };
        assert_eq!(control, "swap");
        for fix in [
            "swapaccount=1",
            "memory.swap.max",
            "swapoff",
            "allow_degraded = [\"swap\"]",
        ] {
            assert!(reason.contains(fix), "{reason}");
        }
    }
}
