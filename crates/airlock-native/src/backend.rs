//! The native backend: its configuration, opening it on a host, and the run of one job,
//! which strings the phases each file holds (the same names in every backend crate):
//! `launch.rs` (plan the sandbox, create its cgroup, start the helper), `supervise.rs` (the
//! running job under the supervision core, then its report), `teardown.rs` (ending its
//! processes, removing the sandbox), `host_checks.rs` (what opening checks of the host) and
//! `sweep.rs` (what a dead instance left).

use airlock_host::jobdir::{JobDir, RuntimeDir, WorkBacking};
use std::path::{Path, PathBuf};
use std::time::Duration;

use airlock_cgroup::CgroupManager;
use airlock_core::policy::{CgroupParent, DegradedControl, Policy, RootfsSpec};
use airlock_core::{
    Backend, BackendError, BackendKind, BoxFuture, Capabilities, JobSpec, OutputTap, RunReport,
    Teardown,
};
use airlock_seccomp::CompiledSeccomp;

use crate::error::NativeError;
use crate::host_checks::{open_cgroups, swap_refusal};
use crate::init_program::InitProgram;
use crate::launch::proxy_config;
use crate::minimal_root::{MinimalRoot, MinimalRootSpec};
use crate::mount_plan::RootfsLayout;
use crate::plan::IdMapping;
use crate::sweep::sweep_stale_jobs;

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

pub use crate::host_checks::{
    DEGRADED_SWAP, DEGRADED_WITHOUT_CGROUP, MEMFD_NOEXEC_SYSCTL, TCP_ACCOUNTING_MISSING,
    memfd_noexec_available, swap_gap,
};
pub use crate::launch::{CORE_RLIMIT_BYTES, CPU_RLIMIT_SLACK_SECS};

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
    pub(crate) config: NativeConfig,
    pub(crate) runtime: RuntimeDir,
    /// `None` only when the policy accepts the degraded shape and no cgroup is usable.
    pub(crate) cgroups: Option<CgroupManager>,
    /// What holds only in a weaker form (empty when the full shape holds).
    pub(crate) degraded: Vec<String>,
    pub(crate) ids: IdMapping,
    pub(crate) seccomp: CompiledSeccomp,
    pub(crate) host_layout: RootfsLayout,
    /// The minimal host root, prepared on the first `rootfs = "host"` job.
    pub(crate) minimal: MinimalRoot,
    /// What the helper is executed from.
    pub(crate) init: InitProgram,
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
                         manage: {fix}",
                        fix = crate::doctor::cgroup_fix(
                            airlock_cgroup::Hierarchy::detect()
                                .ok()
                                .map(|h| h.version())
                        ),
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

    /// Where `job`'s directory keeps `/work`: as root, a tmpfs of its own mounted nowhere
    /// on the host, of the job's memory size (its pages are charged to the job's memory
    /// anyway), so the job's mount table shows no host path; rootless, where the kernel
    /// lets airlock make none, a directory bound by path.
    pub(crate) fn work_backing(&self, job: &JobSpec) -> WorkBacking {
        match self.ids {
            IdMapping::Root { .. } => WorkBacking::DetachedTmpfs {
                size_bytes: job.limits.memory.as_u64(),
            },
            IdMapping::Rootless { .. } => WorkBacking::Directory,
        }
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
    pub(crate) fn image_rootfs(
        &self,
        reference: &str,
        digest: &str,
    ) -> Result<PathBuf, NativeError> {
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
        let jobdir = JobDir::create(&self.runtime, job, &self.ids, self.work_backing(job))?;
        let trust_bundle = match proxy_config.as_ref().and_then(|c| c.trust_bundle_pem()) {
            Some(pem) => Some(jobdir.write_trust_bundle(pem)?),
            None => None,
        };
        let cgroup = self.create_cgroup(job.id.as_str(), job)?;
        let plan = self.plan(job, &jobdir, cgroup.as_ref(), trust_bundle.as_deref())?;
        tracing::debug!(job_id = %job.id, "plan ready");
        let supervised = match self
            .launch(
                job.id.as_str(),
                &plan,
                job.stdin.is_some(),
                jobdir.work_mount(),
            )
            .await
        {
            Ok(launched) => self.finish(job, launched, tap, proxy_config, None).await,
            Err(e) => Err(e),
        };
        tracing::debug!(job_id = %job.id, "job over; ending its processes");
        self.conclude(job, supervised, cgroup, jobdir, Duration::ZERO)
            .await
    }
}

impl Backend for NativeBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Native
    }

    fn capabilities(&self) -> Capabilities {
        crate::provider::CAPABILITIES
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
