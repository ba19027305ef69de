//! `airlock doctor`: what this host can enforce, control by control, ending with a real
//! sandboxed job.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use airlock_core::{BackendKind, JobRequest, Outcome};
use airlock_engine::LoadedPolicy;
use airlock_host::doctor::{Check, Status};
use airlock_native::doctor::{DoctorReport, diagnose};
use clap::Args;

use crate::error_chain;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Check against this policy (default: the built-in policy).
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// The backend to check: native, docker, podman, gvisor, kube.
    #[arg(long, value_name = "BACKEND", default_value = "native")]
    backend: String,
}

pub fn doctor(args: DoctorArgs) -> ExitCode {
    let loaded = match &args.policy {
        Some(path) => match LoadedPolicy::from_file(path) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("airlock: {}", error_chain(&e));
                return ExitCode::from(2);
            }
        },
        None => LoadedPolicy::builtin(),
    };
    let kind: BackendKind = match args.backend.parse() {
        Ok(kind) => kind,
        Err(e) => {
            eprintln!("airlock: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("airlock: start runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let mut report = match kind {
        BackendKind::Native => diagnose(&loaded.policy),
        BackendKind::Docker | BackendKind::Podman | BackendKind::Gvisor => {
            let flavor = match kind {
                BackendKind::Podman => airlock_docker::Flavor::Podman,
                BackendKind::Gvisor => airlock_docker::Flavor::Gvisor,
                _ => airlock_docker::Flavor::Docker,
            };
            let mut report = DoctorReport {
                backend: kind.as_str(),
                ready: true,
                checks: Vec::new(),
            };
            for check in runtime.block_on(airlock_docker::doctor::doctor(&loaded.policy, flavor)) {
                report.push(check);
            }
            report
        }
        BackendKind::Kube => {
            let mut report = DoctorReport {
                backend: kind.as_str(),
                ready: true,
                checks: Vec::new(),
            };
            #[cfg(feature = "kube")]
            for check in crate::kube::doctor_checks(&loaded, &runtime) {
                report.push(check);
            }
            #[cfg(not(feature = "kube"))]
            report.push(Check {
                control: "kube".to_owned(),
                status: Status::Missing,
                detail: "this airlock was built without the Kubernetes backend".to_owned(),
                fix: Some("rebuild with `cargo build -p airlock-cli --features kube`".to_owned()),
            });
            report
        }
    };
    // A real job, unless the backend already cannot run one.
    if kind != BackendKind::Kube || report.ready {
        report.push(live_check(&loaded, kind, &runtime));
    }
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => eprintln!("airlock: {e}"),
        }
    } else {
        print_report(&report, &loaded);
    }
    if report.ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Runs a real job through the backend: the only proof that every control applies.
fn live_check(
    loaded: &LoadedPolicy,
    kind: BackendKind,
    runtime: &tokio::runtime::Runtime,
) -> Check {
    const CONTROL: &str = "sandbox end to end";
    let outcome = (|| -> Result<String, String> {
        let backend =
            airlock_engine::backends::open(kind, loaded).map_err(|e| e.message.clone())?;
        let language = if loaded.policy.languages.contains_key("sh") {
            "sh"
        } else {
            loaded
                .policy
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
        .resolve(&loaded.policy)
        .map_err(|e| e.to_string())?;
        let started = Instant::now();
        let report = runtime
            .block_on(backend.run(&spec, None))
            .map_err(|e| e.message)?;
        let outcome = report.outcome();
        if outcome != Outcome::Exited || report.termination != airlock_core::Termination::Exited(0)
        {
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
    })();
    match outcome {
        Ok(detail) => Check {
            control: CONTROL.to_owned(),
            status: Status::Ok,
            detail,
            fix: None,
        },
        Err(detail) => Check {
            control: CONTROL.to_owned(),
            status: Status::Missing,
            detail,
            fix: Some("see the failed checks above; AIRLOCK_LOG=debug shows each step".to_owned()),
        },
    }
}

fn print_report(report: &DoctorReport, loaded: &LoadedPolicy) {
    println!(
        "airlock doctor: {} backend, policy {} ({})",
        report.backend,
        loaded.policy.version,
        loaded.origin()
    );
    let width = report
        .checks
        .iter()
        .map(|c| c.control.len())
        .max()
        .unwrap_or(10);
    for check in &report.checks {
        let status = match check.status {
            Status::Ok => "ok",
            Status::Warning => "WARNING",
            Status::Missing => "MISSING",
        };
        println!("  {status:<8} {:<width$}  {}", check.control, check.detail);
        if let Some(fix) = &check.fix {
            println!("  {:<8} {:<width$}  fix: {fix}", "", "");
        }
    }
    if report.ready {
        println!("ready: this host enforces every control the policy needs");
    } else {
        println!("NOT READY: jobs will be refused until the MISSING controls are fixed");
    }
}
