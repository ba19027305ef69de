//! A started container running its job: the job's stdin and the egress proxy, the
//! container as the supervision core's [`Sandbox`] (its wait stream, a kill request) and its
//! attach stream as the core's output, then how it ended, read from its state.

use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::Arc;

use airlock_core::supervise::{
    Chunk, JobOutput, Kill, OutputSource, PipeSource, Sandbox, Supervision, supervise,
};
use airlock_core::{JobSpec, LimitHit, OutputTap, RunReport, StreamKind, Termination};
use airlock_host::exits::{ExitWatch, ProcessEnd};
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::query_parameters::WaitContainerOptions;
use futures_core::Stream;
use tokio::io::AsyncWriteExt;

use crate::Flavor;
use crate::backend::{AbortOnDrop, DRAIN_TIMEOUT, DockerBackend, KILL_GRACE, Ready, engine, next};
use crate::error::DockerError;
use crate::handoff::OutputHandoff;
use crate::image::CheckedImage;
use crate::launch::Started;
use crate::teardown::kill;

/// Exit codes above this (up to 128 + 64) mean "killed by signal (code - 128)": the Engine
/// API reports only an exit code, and runtimes report a signal death as 128 + N.
pub const SIGNAL_EXIT_BASE: i64 = 128;
/// SIGKILL.
const SIGKILL: i32 = 9;
/// The highest signal number.
pub const SIGNAL_MAX: i64 = 64;

impl DockerBackend {
    /// Runs a cold job's started container to its end: the egress proxy in proxy mode,
    /// then the job's stdin and [`DockerBackend::supervise_started`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn run_started(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
        ready: &Ready,
        image: &CheckedImage,
        name: &str,
        started: Started,
        proxy_config: Option<Arc<airlock_proxy::ProxyConfig>>,
    ) -> Result<RunReport, DockerError> {
        // Proxy mode: bind the proxy's socket in the container's own network namespace,
        // serve it, then release the program (it waits for one line on stdin).
        let proxy = match &proxy_config {
            Some(config) => Some(
                self.start_proxy(&ready.docker, name, config.clone())
                    .await?,
            ),
            None => None,
        };
        let mut stdin_bytes = Vec::new();
        if proxy.is_some() {
            stdin_bytes.push(b'\n');
        }
        if let Some(bytes) = &job.stdin {
            stdin_bytes.extend_from_slice(bytes);
        }
        let mut report = self
            .supervise_started(job, tap, ready, image, name, started, stdin_bytes, None)
            .await?
            .0;
        report.network = match proxy {
            Some(proxy) => Some(proxy.shutdown().await.into_report()),
            None => None,
        };
        Ok(report)
    }

    /// Runs a started container's job to its end through the supervision core, its wall
    /// time from `started.started_at`: writes `stdin_bytes` to its stdin and closes it,
    /// reads its output, kills it at a limit, and reads how it ended, which the daemon
    /// tells. With `reported` (a warm container on Docker or Podman) its output and end
    /// come without the daemon (docs/docker.md, "How a warm container's job ends"): the
    /// output from pipes handed to its job, the end from a pidfd of its first process
    /// (readable once every process of its pid namespace is gone), the exit status from the
    /// kernel's process events; when those cannot tell the status, it is the daemon's,
    /// waited for as on the cold path.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn supervise_started(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
        ready: &Ready,
        image: &CheckedImage,
        name: &str,
        started: Started,
        stdin_bytes: Vec<u8>,
        reported: Option<ReportedEnd>,
    ) -> Result<(RunReport, EndSource), DockerError> {
        let docker = &ready.docker;
        let Started {
            output,
            mut input,
            started_at,
            setup,
            ..
        } = started;
        // The writer holds the attach connection's write half: a job that never reads its
        // input would keep the connection (and the daemon's delivery of its output to it)
        // open past this job, so it ends with the job.
        let _stdin_writer = if stdin_bytes.is_empty() {
            drop(input);
            None
        } else {
            Some(AbortOnDrop(tokio::spawn(async move {
                // The job may exit without reading its input.
                let _ = input.write_all(&stdin_bytes).await;
                let _ = input.shutdown().await;
            })))
        };
        let clock = Supervision::of(job, started_at, DRAIN_TIMEOUT);
        let job_output = JobOutput::new(&job.limits, tap);
        let Some(reported) = reported else {
            let wait = stopped(docker, name);
            let supervised = supervise(
                clock,
                ContainerSandbox { docker, name, wait },
                AttachSource {
                    output,
                    job_id: job.id.as_str(),
                },
                job_output,
            )
            .await?;
            tracing::debug!(job_id = %job.id, "container stopped and its output drained");
            let ended = self
                .ended_per_daemon(docker, name, supervised.limit_hit)
                .await?;
            tracing::debug!(job_id = %job.id, "container state read");
            return Ok((
                container_report(ended, supervised, setup, image),
                EndSource::Engine,
            ));
        };
        // The attach stream carries the message and the job's stdin only; it is held
        // until the job's end, as on the cold path.
        let _attached_output = output;
        let ReportedEnd {
            pid,
            pidfd,
            watch,
            handoff,
        } = reported;
        let [stdout, stderr] =
            handoff
                .complete(pid)
                .await
                .map_err(|reason| DockerError::OutputHandoff {
                    container: name.to_owned(),
                    reason,
                })?;
        let receiver = |fd| {
            tokio::net::unix::pipe::Receiver::from_owned_fd(fd).map_err(|source| {
                DockerError::OutputPipes {
                    container: name.to_owned(),
                    source,
                }
            })
        };
        let supervised = supervise(
            clock,
            ReportedSandbox {
                pidfd,
                watch: &watch,
                docker,
                name,
            },
            PipeSource::new(receiver(stdout)?, receiver(stderr)?),
            job_output,
        )
        .await?;
        let limit_hit = supervised.limit_hit;
        let (ended, source) = match supervised.exit {
            Some(ProcessEnd::Status(raw)) => {
                let termination = airlock_host::exits::termination(raw);
                // As for Podman above: only the kernel sends the job's pid 1 a SIGKILL that
                // airlock did not.
                let oom_kills = killed_by_the_kernel(termination, limit_hit);
                ((termination, oom_kills), EndSource::Kernel)
            }
            other => {
                let why = match other {
                    Some(ProcessEnd::Unknown(why)) => why,
                    _ => "it was not seen to end",
                };
                tracing::debug!(job_id = %job.id, reason = why, "the job's status comes from the daemon");
                let mut wait = stopped(docker, name);
                // Bounded as the cold path's wait is after a kill: a container the daemon
                // never reports stopped is read as it is, and removed by the teardown.
                let _ = tokio::time::timeout(KILL_GRACE, next(&mut wait)).await;
                let ended = self.ended_per_daemon(docker, name, limit_hit).await?;
                (ended, EndSource::Engine)
            }
        };
        tracing::debug!(job_id = %job.id, ?source, "warm container's job ended");
        Ok((container_report(ended, supervised, setup, image), source))
    }

    /// How a stopped container's job ended, from its state: the exit code (a signal as
    /// 128 + N, the runtimes' convention) and whether the kernel's OOM killer ended it.
    async fn ended_per_daemon(
        &self,
        docker: &Docker,
        name: &str,
        limit_hit: Option<LimitHit>,
    ) -> Result<(Termination, u64), DockerError> {
        let state = docker
            .inspect_container(name, None)
            .await
            .map_err(engine("inspect", name))?
            .state
            .unwrap_or_default();
        let termination = match state.exit_code {
            Some(code) if code > SIGNAL_EXIT_BASE && code <= SIGNAL_EXIT_BASE + SIGNAL_MAX => {
                Termination::Signaled((code - SIGNAL_EXIT_BASE) as i32)
            }
            Some(code) => Termination::Exited(i32::try_from(code).unwrap_or(i32::MAX)),
            None => Termination::Unknown,
        };
        let mut oom_kills = u64::from(state.oom_killed.unwrap_or(false));
        // Podman 4.3 on cgroup v1 does not report OOMKilled ([`killed_by_the_kernel`]).
        // gVisor's kernel may kill the job itself when it runs out of memory, before the
        // host cgroup's OOM killer acts, and the daemon then sees no OOM either.
        if matches!(self.config.flavor, Flavor::Podman | Flavor::Gvisor) {
            oom_kills = oom_kills.max(killed_by_the_kernel(termination, limit_hit));
        }
        Ok((termination, oom_kills))
    }
}

/// The daemon's answer once container `name` is no longer running (what a job's end
/// waits for on the daemon's path, and a waiting warm container is watched with).
pub(crate) type StoppedStream = Pin<
    Box<
        dyn Stream<Item = Result<bollard::models::ContainerWaitResponse, bollard::errors::Error>>
            + Send,
    >,
>;

/// [`StoppedStream`] of container `name`.
pub(crate) fn stopped(docker: &Docker, name: &str) -> StoppedStream {
    Box::pin(docker.wait_container(
        name,
        Some(WaitContainerOptions {
            condition: "not-running".to_owned(),
        }),
    ))
}

/// A container as the supervision core sees it: it ends when the daemon's wait stream
/// says it stopped, and is killed with a kill request.
struct ContainerSandbox<'a> {
    docker: &'a Docker,
    name: &'a str,
    wait: StoppedStream,
}

impl Sandbox for ContainerSandbox<'_> {
    type Exit = ();
    type Error = DockerError;

    async fn wait(&mut self) -> Result<(), DockerError> {
        // Ok, an error carrying a non-zero exit code, or the stream's end: either way it
        // stopped; how is read from the container's state afterwards.
        let _ = next(&mut self.wait).await;
        Ok(())
    }

    fn kill(&mut self) -> Kill {
        let docker = self.docker.clone();
        let name = self.name.to_owned();
        // The daemon may not answer the request until it has delivered the output the
        // job wrote meanwhile: the core keeps reading while it is pending.
        Kill::Started {
            request: Box::pin(async move { kill(&docker, &name).await }),
            grace: KILL_GRACE,
        }
    }
}

/// A container job's report: how it ended (`ended`: its termination and OOM kills), what
/// supervision saw, its setup time and image.
fn container_report<X>(
    ended: (Termination, u64),
    supervised: airlock_core::supervise::Supervised<X>,
    setup: std::time::Duration,
    image: &CheckedImage,
) -> RunReport {
    let (termination, oom_kills) = ended;
    RunReport {
        termination,
        limit_hit: supervised.limit_hit,
        oom_kills,
        stdout: supervised.stdout,
        stderr: supervised.stderr,
        duration: supervised.duration,
        setup,
        cpu_time: None,
        peak_memory_bytes: None,
        image_digest: Some(image.digest.clone()),
        degraded: Vec::new(),
        out_files: Vec::new(),
        out_rejected: Vec::new(),
        network: None,
        acquire: airlock_core::Acquire::Fresh,
    }
}

/// Whether the kernel ended the job's first process: a SIGKILL airlock did not send (no
/// limit hit) can only be the OOM killer's, since that process is its pid namespace's
/// init, which ignores SIGKILL from inside the namespace. 1 if so, else 0.
fn killed_by_the_kernel(termination: Termination, limit_hit: Option<LimitHit>) -> u64 {
    u64::from(limit_hit.is_none() && termination == Termination::Signaled(SIGKILL))
}

/// What tells a warm container's end without the daemon: a pidfd of its first process,
/// that process watched in the kernel's process events, and the pipes its job's output
/// goes to, handed over once the message is sent.
pub(crate) struct ReportedEnd {
    /// The container's first process (the job's pid 1): its host pid, and a pidfd opened
    /// while it waited.
    pub(crate) pid: u32,
    pub(crate) pidfd: tokio::io::unix::AsyncFd<OwnedFd>,
    /// Its exit, watched since before its job was delivered.
    pub(crate) watch: ExitWatch,
    /// The pipes for its job's stdout and stderr, and the socket they go over.
    pub(crate) handoff: OutputHandoff,
}

/// Where a warm container job's end was learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndSource {
    /// The kernel: the pidfd and the process events.
    Kernel,
    /// The container engine's wait and state.
    Engine,
}

/// A warm container as the supervision core sees it when its end comes from the kernel:
/// ended once its first process's pidfd is readable (its pid namespace is empty: the
/// kernel signals a namespace's init gone only after every other process of it was killed
/// and reaped), killed through that pidfd.
struct ReportedSandbox<'a> {
    pidfd: tokio::io::unix::AsyncFd<OwnedFd>,
    watch: &'a ExitWatch,
    docker: &'a Docker,
    name: &'a str,
}

/// How long the leader's exit event may follow its pidfd turning readable (it is sent
/// right after): past this the status is the daemon's.
const EXIT_EVENT_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

impl Sandbox for ReportedSandbox<'_> {
    type Exit = ProcessEnd;
    type Error = DockerError;

    async fn wait(&mut self) -> Result<ProcessEnd, DockerError> {
        // Cancel-safe: readiness is kept (never cleared), so a second call passes at once.
        let _ = self.pidfd.readable().await;
        Ok(tokio::time::timeout(EXIT_EVENT_GRACE, self.watch.ended())
            .await
            .unwrap_or(ProcessEnd::Unknown("its exit event did not come")))
    }

    fn kill(&mut self) -> Kill {
        match rustix::process::pidfd_send_signal(
            self.pidfd.get_ref(),
            rustix::process::Signal::KILL,
        ) {
            Ok(()) => Kill::sent(KILL_GRACE),
            Err(e) => {
                tracing::debug!(container = %self.name, error = %e, "kill through the pidfd; asking the daemon");
                let docker = self.docker.clone();
                let name = self.name.to_owned();
                Kill::Started {
                    request: Box::pin(async move { kill(&docker, &name).await }),
                    grace: KILL_GRACE,
                }
            }
        }
    }
}

/// The attach stream as the supervision core reads it.
struct AttachSource<'a> {
    output: Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
    job_id: &'a str,
}

impl OutputSource<DockerError> for AttachSource<'_> {
    async fn next_chunk(&mut self) -> Result<Option<Chunk>, DockerError> {
        loop {
            return Ok(match next(&mut self.output).await {
                Some(Ok(LogOutput::StdOut { message } | LogOutput::Console { message })) => {
                    Some((StreamKind::Stdout, message.to_vec()))
                }
                Some(Ok(LogOutput::StdErr { message })) => {
                    Some((StreamKind::Stderr, message.to_vec()))
                }
                Some(Ok(LogOutput::StdIn { .. })) => continue,
                Some(Err(e)) => {
                    tracing::warn!(job_id = self.job_id, error = %e, "output stream failed");
                    None
                }
                None => None,
            });
        }
    }
}
