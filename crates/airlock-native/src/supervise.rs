//! A launched native sandbox running its job: the helper as the supervision core's
//! [`Sandbox`], delivering the job (`finish`), and turning what happened into the report
//! (`conclude`).

use airlock_host::jobdir::JobDir;
use airlock_host::out::{self, OutCaps};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_cgroup::JobCgroup;
use airlock_core::capture::CapturedOutput;
use airlock_core::policy::RootfsSpec;
use airlock_core::supervise::{JobOutput, Kill, PipeSource, Sandbox, Supervision, supervise};
use airlock_core::{JobSpec, LimitHit, OutputTap, RunReport, Teardown, Termination};
use tokio::io::AsyncWriteExt;

use crate::backend::{DRAIN_TIMEOUT, KILL_GRACE, NativeBackend};
use crate::error::NativeError;
use crate::helper::Helper;
use crate::launch::Launched;
use crate::plan::InitEvent;
use crate::teardown::{Ended, end_processes, end_remaining_plumbing, removal};

impl NativeBackend {
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
            pid1,
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

        let holds_pid1 = pid1.is_some();
        let supervised = supervise(
            Supervision::of(job, clock_from, DRAIN_TIMEOUT),
            HelperSandbox { child, pid1 },
            PipeSource::new(stdout, stderr),
            JobOutput::new(&job.limits, tap),
        )
        .await?;
        // Seen to end while held by pid 1 of its namespace: every process of the job is gone.
        let pid_namespace_gone = holds_pid1 && supervised.exit.is_some();

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
            pid_namespace_gone,
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
        let pid_namespace_gone = supervised.as_ref().is_ok_and(|s| s.pid_namespace_gone);
        let ended = tokio::task::spawn_blocking(move || {
            let ended = if pid_namespace_gone {
                end_remaining_plumbing(cgroup.as_ref())
            } else {
                end_processes(cgroup.as_ref())
            };
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
            acquire: airlock_core::Acquire::Fresh,
        };
        Ok((report, teardown))
    }
}

pub(crate) struct Supervised {
    /// Whether the job was seen to end by pid 1 of its pid namespace ending: then no
    /// process of the job is left, and only the sandbox's own plumbing (a forked sandbox's
    /// leader) may still be exiting.
    pid_namespace_gone: bool,
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

/// The helper as the supervision core sees it: it ends when the helper exits (the init and
/// with it every process of the job are gone by then, or going), and is killed by killing it.
struct HelperSandbox {
    child: Helper,
    /// Pid 1 of the job's pid namespace, when held: the job ends with it.
    pid1: Option<Helper>,
}

impl Sandbox for HelperSandbox {
    type Exit = ();
    type Error = NativeError;

    async fn wait(&mut self) -> Result<(), NativeError> {
        match &mut self.pid1 {
            Some(pid1) => pid1.wait().await,
            None => self.child.wait().await,
        }
        Ok(())
    }

    fn kill(&mut self) -> Kill {
        // Killing the helper kills the init (parent-death signal), and the init's death
        // kills every process in the pid namespace. Teardown sweeps the cgroup too.
        self.child.start_kill();
        if let Some(pid1) = &mut self.pid1 {
            pid1.start_kill();
        }
        Kill::sent(KILL_GRACE)
    }
}
