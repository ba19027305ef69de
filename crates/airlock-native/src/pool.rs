//! Warm sandboxes: Python jobs for a long-running server start in a sandbox that was built
//! ahead of time, with the interpreter already loaded.
//!
//! A warm sandbox is an ordinary sandbox (its own job directory, cgroup, namespaces, uid
//! 65534, seccomp) whose program is a small bootstrap run by the job's own interpreter
//! with the job's own flags, environment and limits. The bootstrap blocks reading the
//! control pipe ([`CONTROL_FD`](crate::plan::CONTROL_FD)). Delivering a job writes its
//! files into `/work`, sends its arguments on that pipe and closes it; the bootstrap then
//! runs `/work/<file>` as `__main__`, as `python3 -I /work/<file>` would (the bootstrap
//! and its message are every backend's: `airlock_core::warm::python`). Each warm sandbox
//! runs one job and is torn down like any other; the pool (`airlock_core::warm`, shared
//! with the container backends) starts a replacement in the background. A job the template
//! does not fit (other limits, environment, network, `/out`, language) runs in a fresh
//! sandbox as always.

use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_cgroup::{CpuPriority, JobCgroup};
use airlock_core::warm::python::{self, WarmStdin};
use airlock_core::warm::{WarmPool, WarmSandboxes};
use airlock_core::{
    BackendKind, BoxFuture, Capabilities, JobId, JobSpec, OutputTap, RunReport, Teardown,
};

use crate::backend::{Launched, NativeBackend, teardown};
use crate::error::NativeError;
use crate::plan::CONTROL_FD;
use airlock_host::jobdir::JobDir;

/// The native backend with a pool of warm sandboxes for one language's jobs.
pub type PooledNative = WarmPool<NativeWarm>;

/// Keeps `size` sandboxes started for jobs like `template` (a job of the pool's language
/// with the policy's defaults), starting them in the background; one unused for
/// `idle_max` is torn down and replaced. Must be called inside a tokio runtime.
pub fn start(
    backend: Arc<NativeBackend>,
    template: JobSpec,
    size: usize,
    idle_max: Duration,
    preload: Vec<String>,
) -> Result<PooledNative, NativeError> {
    if let Some(reason) = python::unsupported_template(&template) {
        return Err(NativeError::Unsupported {
            control: "warm pool",
            reason,
        });
    }
    let argv = python::warm_argv(&template, &preload, CONTROL_FD).unwrap_or_default();
    let sandboxes = NativeWarm {
        backend,
        template,
        argv,
    };
    Ok(WarmPool::start(Arc::new(sandboxes), size, idle_max))
}

/// How the native backend's warm sandboxes start, wait and take their job: the pool's side
/// of [`PooledNative`].
pub struct NativeWarm {
    backend: Arc<NativeBackend>,
    template: JobSpec,
    /// The warm program: the template's interpreter and flags running the bootstrap.
    argv: Vec<String>,
}

impl std::fmt::Debug for NativeWarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeWarm")
            .field("language", &self.template.language)
            .finish_non_exhaustive()
    }
}

/// A started sandbox waiting for its job.
pub struct WaitingSandbox {
    name: String,
    launched: Launched,
    jobdir: JobDir,
    cgroup: Option<JobCgroup>,
}

impl NativeWarm {
    /// Starts one warm sandbox.
    async fn launch_warm(&self) -> Result<WaitingSandbox, NativeError> {
        let backend = &self.backend;
        let template = &self.template;
        let name = format!("warm-{}", JobId::generate().as_str());
        let ids = backend.id_mapping();
        let jobdir = JobDir::create_empty(backend.runtime_dir(), &name, &ids)?;
        let cgroup = backend.create_cgroup(&name, template)?;
        // Built and kept at the lowest CPU priority, so that a job running meanwhile is never
        // slowed by the sandbox being made for the next one. Only speed depends on it.
        if let Some(cgroup) = &cgroup
            && let Err(e) = cgroup.set_cpu_priority(CpuPriority::Background)
        {
            tracing::warn!(sandbox = %name, error = %e,
                "cannot lower a warm sandbox's CPU priority; it starts at normal priority");
        }
        let mut plan = match backend.plan(template, &jobdir, cgroup.as_ref(), None) {
            Ok(plan) => plan,
            Err(e) => {
                let _ = tokio::task::spawn_blocking(move || teardown(cgroup, jobdir)).await;
                return Err(e);
            }
        };
        plan.job_id.clone_from(&name);
        plan.argv.clone_from(&self.argv);
        plan.control_fd = true;
        match backend.launch(&name, &plan, true).await {
            Ok(launched) => Ok(WaitingSandbox {
                name,
                launched,
                jobdir,
                cgroup,
            }),
            Err(e) => {
                let _ = tokio::task::spawn_blocking(move || teardown(cgroup, jobdir)).await;
                Err(e)
            }
        }
    }

    async fn deliver_to(
        &self,
        job: &JobSpec,
        tap: Option<OutputTap>,
        warm: WaitingSandbox,
    ) -> Result<(RunReport, Teardown), NativeError> {
        let backend = &self.backend;
        let delivered_at = Instant::now();
        let WaitingSandbox {
            name,
            launched,
            jobdir,
            cgroup,
        } = warm;
        // The job's files, then the CPU the sandbox used while waiting (left out of the
        // job's figure). Blocking work, off the async threads.
        let ids = backend.id_mapping();
        let job_files = job.clone();
        let prepared = tokio::task::spawn_blocking(move || {
            let written = jobdir.write_job(&job_files, &ids);
            let cpu_before = cgroup
                .as_ref()
                .and_then(|c| c.stats().ok())
                .and_then(|s| s.cpu_time)
                .unwrap_or_default();
            (written, cpu_before, jobdir, cgroup)
        })
        .await;
        let (written, cpu_before, jobdir, cgroup) = match prepared {
            Ok(prepared) => prepared,
            Err(join) => {
                launched.kill().await;
                return Err(NativeError::Helper(format!("deliver task: {join}")));
            }
        };
        if let Err(e) = written {
            launched.kill().await;
            let _ = tokio::task::spawn_blocking(move || teardown(cgroup, jobdir)).await;
            return Err(e.into());
        }
        // The sandbox's own stdin pipe carries the job's input, as in a fresh sandbox; a
        // fresh sandbox without input has /dev/null there, read-only.
        let stdin = match job.stdin {
            Some(_) => WarmStdin::Keep,
            None => WarmStdin::DevNullReadOnly,
        };
        let message = python::control_message(&self.template, job, stdin);
        let setup = delivered_at.elapsed();
        let supervised = backend
            .finish(job, launched, tap, None, Some(message))
            .await
            .map(|mut s| {
                s.setup = setup;
                s
            });
        tracing::debug!(job_id = %job.id, sandbox = %name, "job over; tearing down");
        backend
            .conclude(job, supervised, cgroup, jobdir, cpu_before)
            .await
    }
}

impl WarmSandboxes for NativeWarm {
    type Warm = WaitingSandbox;
    type Error = NativeError;

    fn kind(&self) -> BackendKind {
        BackendKind::Native
    }

    fn capabilities(&self) -> Capabilities {
        airlock_core::Backend::capabilities(self.backend.as_ref())
    }

    fn fits(&self, job: &JobSpec) -> bool {
        python::fits(&self.template, job)
    }

    fn start(&self) -> BoxFuture<'_, Result<WaitingSandbox, NativeError>> {
        Box::pin(self.launch_warm())
    }

    fn starts_cancel_safe(&self) -> bool {
        // The helper is killed on drop, and the cgroup and the job directory removed.
        true
    }

    fn name(warm: &WaitingSandbox) -> &str {
        &warm.name
    }

    fn is_alive(&self, warm: &mut WaitingSandbox) -> bool {
        warm.launched.is_alive()
    }

    fn raise_priority(&self, warm: &WaitingSandbox) -> Result<(), String> {
        match &warm.cgroup {
            Some(cgroup) => cgroup
                .set_cpu_priority(CpuPriority::Normal)
                .map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    fn deliver<'a>(
        &'a self,
        job: &'a JobSpec,
        tap: Option<OutputTap>,
        warm: WaitingSandbox,
    ) -> BoxFuture<'a, Result<(RunReport, Teardown), NativeError>> {
        Box::pin(self.deliver_to(job, tap, warm))
    }

    fn discard(&self, warm: WaitingSandbox) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let WaitingSandbox {
                name,
                launched,
                jobdir,
                cgroup,
            } = warm;
            launched.kill().await;
            match tokio::task::spawn_blocking(move || teardown(cgroup, jobdir)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(sandbox = %name, error = %e, "cannot tear down a warm sandbox")
                }
                Err(e) => tracing::warn!(sandbox = %name, error = %e, "teardown task failed"),
            }
        })
    }

    fn run_fresh<'a>(
        &'a self,
        job: &'a JobSpec,
        tap: Option<OutputTap>,
    ) -> BoxFuture<'a, Result<(RunReport, Teardown), NativeError>> {
        Box::pin(self.backend.run_job_then_teardown(job, tap))
    }
}
