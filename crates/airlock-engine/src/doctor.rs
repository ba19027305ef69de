//! `airlock doctor` for any backend: the backend's own checks of this host (or daemon, or
//! cluster) against the policy, then one real job through the backend, the only proof that
//! every control applies. The CLI prints what this returns; it never talks to a backend.

use std::time::Instant;

use airlock_core::doctor::{Check, DoctorReport};
use airlock_core::{BackendKind, JobRequest, Outcome, Termination};
use airlock_docker::Flavor;

use crate::LoadedPolicy;

/// The control name of the end-to-end job's line.
pub const END_TO_END: &str = "sandbox end to end";

/// Checks backend `kind` under `loaded`'s policy, then runs one trivial job through it.
///
/// Needs a tokio runtime (the container and cluster checks talk to their daemons).
pub async fn doctor(kind: BackendKind, loaded: &LoadedPolicy) -> DoctorReport {
    let mut report = match kind {
        BackendKind::Native => airlock_native::doctor::diagnose(&loaded.policy),
        BackendKind::Docker | BackendKind::Podman | BackendKind::Gvisor => {
            let mut report = DoctorReport::new(kind.as_str());
            if let Some(flavor) = Flavor::of(kind) {
                report.extend(airlock_docker::doctor::doctor(&loaded.policy, flavor).await);
            }
            report
        }
        BackendKind::Kube => {
            let mut report = DoctorReport::new(kind.as_str());
            report.extend(kube_checks(loaded).await);
            report
        }
    };
    // The job is what tells a real refusal from a check's blind spot, so it runs even after
    // a missing control, except on a cluster that is not ready: there it would only wait
    // for a Pod that cannot be admitted.
    if kind != BackendKind::Kube || report.ready {
        report.push(end_to_end(kind, loaded).await);
    }
    report
}

#[cfg(feature = "kube")]
async fn kube_checks(loaded: &LoadedPolicy) -> Vec<Check> {
    airlock_kube::doctor::diagnose(&loaded.policy).await
}

#[cfg(not(feature = "kube"))]
async fn kube_checks(_loaded: &LoadedPolicy) -> Vec<Check> {
    vec![Check::missing(
        "kube",
        "this airlock was built without the Kubernetes backend",
        "rebuild with `cargo build -p airlock-cli --features kube`",
    )]
}

/// Runs a trivial job (`exit 0` in `sh`, or `pass` in Python when the policy has no `sh`)
/// through the backend and reports how long it took.
async fn end_to_end(kind: BackendKind, loaded: &LoadedPolicy) -> Check {
    match run_trivial_job(kind, loaded).await {
        Ok(detail) => Check::ok(END_TO_END, detail),
        Err(detail) => Check::missing(
            END_TO_END,
            detail,
            "see the failed checks above; AIRLOCK_LOG=debug shows each step",
        ),
    }
}

async fn run_trivial_job(kind: BackendKind, loaded: &LoadedPolicy) -> Result<String, String> {
    let backend = crate::backends::open(kind, loaded).map_err(|e| e.message.clone())?;
    let policy = &loaded.policy;
    let language = if policy.languages.contains_key("sh") {
        "sh"
    } else {
        policy
            .languages
            .keys()
            .next()
            .map(String::as_str)
            .unwrap_or("sh")
    };
    let source = if language == "python" {
        "pass"
    } else {
        "exit 0"
    };
    let spec = JobRequest {
        language: language.to_owned(),
        source: source.as_bytes().to_vec(),
        ..Default::default()
    }
    .resolve(policy)
    .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let report = backend.run(&spec, None).await.map_err(|e| e.message)?;
    let outcome = report.outcome();
    if outcome != Outcome::Exited || report.termination != Termination::Exited(0) {
        return Err(format!(
            "a trivial {language} job ended as {}",
            outcome.as_str()
        ));
    }
    Ok(format!(
        "a {language} job ran in a full sandbox in {} ms (setup {} ms)",
        started.elapsed().as_millis(),
        report.setup.as_millis()
    ))
}
