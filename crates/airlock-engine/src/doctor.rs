//! `airlock doctor` for any backend: the backend's own checks of this host (or daemon, or
//! cluster) against the policy, then one real job through the backend, the only proof that
//! every control applies. The CLI prints what this returns; it never talks to a backend.

use std::time::Instant;

use airlock_core::doctor::{Check, DoctorReport};
use airlock_core::{BackendKind, JobRequest, Outcome, Termination};

use crate::LoadedPolicy;

/// The control name of the end-to-end job's line.
pub const END_TO_END: &str = "sandbox end to end";

/// Checks backend `kind` under `loaded`'s policy, then runs one trivial job through it.
///
/// Needs a tokio runtime (the container and cluster checks talk to their daemons).
pub async fn doctor(kind: BackendKind, loaded: &LoadedPolicy) -> DoctorReport {
    let mut report = DoctorReport::new(kind.as_str());
    report.extend(
        crate::backends::provider(kind)
            .host_checks(&loaded.policy)
            .await,
    );
    // The job is what tells a real refusal from a check's blind spot, so it runs even after
    // a missing control, except on a cluster that is not ready: there it would only wait
    // for a Pod that cannot be admitted.
    if kind != BackendKind::Kube || report.ready {
        report.push(end_to_end(kind, loaded).await);
    }
    report.push(audit_log(loaded));
    report
}

/// The control name of the audit log's line.
pub const AUDIT_LOG: &str = "audit log";

/// Whether the audit log and its write-ahead records can be written: when they cannot,
/// every job is refused (none runs unaudited).
fn audit_log(loaded: &LoadedPolicy) -> Check {
    let path = loaded.audit_path();
    match crate::AuditLog::open(&path, false).and_then(|log| log.probe()) {
        Ok(()) => Check::ok(AUDIT_LOG, format!("{} is writable", path.display())),
        Err(e) => {
            let reason = match &e {
                crate::EngineError::Audit { path, source } => {
                    format!("{}: {source}", path.display())
                }
                other => other.to_string(),
            };
            Check::missing(
                AUDIT_LOG,
                format!("not writable, so every job is refused: {reason}"),
                "free space on its file system, or point [audit] path at a writable one",
            )
        }
    }
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
