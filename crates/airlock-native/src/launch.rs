//! Launching a native sandbox: the job's plan (rootfs layout, mount plan, rlimits, ids),
//! its cgroup, the egress proxy's configuration, and starting the helper with its pipes
//! and sockets up to the program's exec.

use airlock_host::jobdir::JobDir;
use airlock_host::out::OUT_SPARE_INODES;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use airlock_cgroup::{CgroupVersion, JobCgroup, JobLimits};
use airlock_core::JobSpec;
use airlock_core::policy::{NetworkMode, RootfsSpec};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use crate::backend::{
    KILL_GRACE, NativeBackend, SETUP_TIMEOUT, STATUS_EVENTS_MAX, STATUS_LINE_MAX_BYTES,
};
use crate::error::NativeError;
use crate::helper::{Helper, HelperCommand, HelperInput, HelperOutput, Placement, Started};
use crate::host_checks::memfd_noexec_available;
use crate::minimal_root::ProgramState;
use crate::mount_plan::{self, JobMounts, OutMount, ROOT_TMPFS_BYTES, RootfsLayout, WorkdirSource};
use crate::plan::{
    CONTROL_FD, HANDOFF_FD, INIT_ARG, INIT_PROCESSES, IdMapping, InitEvent, MSGQUEUE_RLIMIT_BYTES,
    MountStep, NAMESPACE_OWNER_SLOTS, PLAN_FD, PROXY_PORT, ProgramRole, RlimitResource,
    RlimitSetting, SIGPENDING_RLIMIT, STATUS_FD, SandboxPlan, USER_NAMESPACE_LIMITS, WORK_MOUNT_FD,
};

/// RLIMIT_CORE of the job: 1, not 0. The kernel ignores the core limit when
/// `kernel.core_pattern` is a pipe (systemd-coredump, apport), except that 1 means "no
/// dump"; and a file dump needs at least a page. So 1 is the value that disables both.
pub const CORE_RLIMIT_BYTES: u64 = 1;

/// Extra CPU seconds of the RLIMIT_CPU backstop beyond what the wall-time limit allows.
pub const CPU_RLIMIT_SLACK_SECS: u64 = 2;

/// The job's CPU-time limit (`RLIMIT_CPU`), a backstop behind the wall-time kill: its wall
/// time at its CPU share, and [`CPU_RLIMIT_SLACK_SECS`].
pub(crate) fn cpu_rlimit_secs(job: &JobSpec) -> u64 {
    (job.limits.timeout.as_secs_f64() * f64::from(job.limits.cpus.millis()) / 1000.0).ceil() as u64
        + CPU_RLIMIT_SLACK_SECS
}

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

impl NativeBackend {
    /// Prepares the minimal root on a thread of its own, for a long-running server whose
    /// jobs use it: the first job after a start that follows a change of the host's files
    /// (which remakes the copy, a few hundred milliseconds) then finds it made. A job that
    /// comes meanwhile waits for it, as it would have made it itself.
    pub fn prepare_minimal_root_in_background(self: &std::sync::Arc<Self>) {
        if !crate::minimal_root::overlayfs_available() {
            return;
        }
        let backend = self.clone();
        let spawned = std::thread::Builder::new()
            .name("airlock-minimal-root".into())
            .spawn(move || match backend.minimal.get() {
                Ok(prepared) => {
                    tracing::debug!(tree = %prepared.tree.display(), "minimal root ready");
                }
                // Said again, as it is, by every job that needs it.
                Err(e) => tracing::debug!(error = %e, "the minimal root could not be prepared"),
            });
        if let Err(e) = spawned {
            tracing::debug!(error = %e, "no thread to prepare the minimal root ahead of jobs");
        }
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
                workdir: match jobdir.work_mount() {
                    Some(_) => WorkdirSource::DetachedMount,
                    None => WorkdirSource::Directory(jobdir.work()),
                },
                workdir_mode: job.filesystem.workdir,
                tmp_bytes: job.limits.tmp.as_u64(),
                session_tmp: job.session_tmp.clone(),
                out: job.filesystem.out.enabled.then(|| OutMount {
                    size_bytes: job.filesystem.out.max_bytes.as_u64(),
                    // Every released file needs an inode; directories need some too.
                    inodes: u64::from(job.filesystem.out.max_files) + OUT_SPARE_INODES,
                }),
                trust_bundle: trust_bundle.map(Path::to_path_buf),
            },
        );
        let cpu_secs = cpu_rlimit_secs(job);
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

    /// Starts the helper with `plan` and waits until the program has started (phase 1:
    /// sandbox construction, up to the program's exec). `label` names the sandbox in logs.
    /// `work_mount`: the job directory's detached `/work` ([`JobDir::work_mount`]), which
    /// a plan that attaches one needs.
    pub(crate) async fn launch(
        &self,
        label: &str,
        plan: &SandboxPlan,
        stdin_piped: bool,
        work_mount: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<Launched, NativeError> {
        let attaches_work = plan
            .mounts
            .iter()
            .any(|step| matches!(step, MountStep::AttachWork { .. }));
        if attaches_work != work_mount.is_some() {
            return Err(NativeError::Helper(
                "the plan and the job directory disagree on whether /work is a detached tmpfs"
                    .into(),
            ));
        }
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
        let mut fds = vec![
            (plan_read.as_fd(), PLAN_FD),
            (status_write.as_fd(), STATUS_FD),
        ];
        if let Some((_, child_end)) = &handoff {
            fds.push((child_end.as_fd(), HANDOFF_FD));
        }
        if let Some((control_read, _)) = &control {
            fds.push((control_read.as_fd(), CONTROL_FD));
        }
        if let Some(mount) = work_mount {
            fds.push((mount, WORK_MOUNT_FD));
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
            pid1: None,
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
    /// Pid 1 of the job's pid namespace, when the supervisor holds it (a zygote's child):
    /// the kernel reports it gone only once every other process of the namespace is, so
    /// its end is the job's, and the leader's exit (the namespaces' teardown) need not be
    /// waited for.
    pub(crate) pid1: Option<Helper>,
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
