//! A started container running its job: the job's stdin and the egress proxy, the
//! container as the supervision core's [`Sandbox`] (its wait stream, a kill request) and its
//! attach stream as the core's output, then how it ended, read from its state.

use std::pin::Pin;
use std::sync::Arc;

use airlock_core::supervise::{
    Chunk, JobOutput, Kill, OutputSource, Sandbox, Supervision, supervise,
};
use airlock_core::{JobSpec, OutputTap, RunReport, StreamKind, Termination};
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::query_parameters::WaitContainerOptions;
use futures_core::Stream;
use tokio::io::AsyncWriteExt;

use crate::Flavor;
use crate::backend::{AbortOnDrop, DRAIN_TIMEOUT, DockerBackend, KILL_GRACE, Ready, engine, next};
use crate::error::DockerError;
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
            .supervise_started(job, tap, ready, image, name, started, stdin_bytes)
            .await?;
        report.network = match proxy {
            Some(proxy) => Some(proxy.shutdown().await.into_report()),
            None => None,
        };
        Ok(report)
    }

    /// Runs a started container's job to its end through the supervision core, its wall
    /// time from `started.started_at`: writes `stdin_bytes` to its stdin and closes it,
    /// reads its output, kills it at a limit, and reads how it ended.
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
    ) -> Result<RunReport, DockerError> {
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

        let wait: Pin<Box<dyn Stream<Item = _> + Send>> = Box::pin(docker.wait_container(
            name,
            Some(WaitContainerOptions {
                condition: "not-running".to_owned(),
            }),
        ));
        let supervised = supervise(
            Supervision::of(job, started_at, DRAIN_TIMEOUT),
            ContainerSandbox { docker, name, wait },
            AttachSource {
                output,
                job_id: job.id.as_str(),
            },
            JobOutput::new(&job.limits, tap),
        )
        .await?;
        tracing::debug!(job_id = %job.id, "container stopped and its output drained");
        let limit_hit = supervised.limit_hit;
        let state = docker
            .inspect_container(name, None)
            .await
            .map_err(engine("inspect", name))?
            .state
            .unwrap_or_default();
        tracing::debug!(job_id = %job.id, "container state read");
        let termination = match state.exit_code {
            Some(code) if code > SIGNAL_EXIT_BASE && code <= SIGNAL_EXIT_BASE + SIGNAL_MAX => {
                Termination::Signaled((code - SIGNAL_EXIT_BASE) as i32)
            }
            Some(code) => Termination::Exited(i32::try_from(code).unwrap_or(i32::MAX)),
            None => Termination::Unknown,
        };
        let mut oom_kills = u64::from(state.oom_killed.unwrap_or(false));
        // Podman 4.3 on cgroup v1 does not report OOMKilled. The job's pid 1 ignores
        // SIGKILL from inside its namespace, so a SIGKILL airlock did not send came from
        // the kernel: the OOM killer.
        // gVisor's kernel may kill the job itself when it runs out of memory, before the
        // host cgroup's OOM killer acts, and the daemon then sees no OOM either.
        if matches!(self.config.flavor, Flavor::Podman | Flavor::Gvisor)
            && limit_hit.is_none()
            && termination == Termination::Signaled(SIGKILL)
        {
            oom_kills = oom_kills.max(1);
        }
        Ok(RunReport {
            termination,
            limit_hit,
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
        })
    }
}

/// A container as the supervision core sees it: it ends when the daemon's wait stream
/// says it stopped, and is killed with a kill request.
struct ContainerSandbox<'a> {
    docker: &'a Docker,
    name: &'a str,
    wait: Pin<
        Box<
            dyn Stream<
                    Item = Result<bollard::models::ContainerWaitResponse, bollard::errors::Error>,
                > + Send,
        >,
    >,
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
