//! `airlock doctor`: what this host can enforce, control by control, ending with a real
//! sandboxed job.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use airlock_core::{JobRequest, Outcome};
use airlock_engine::LoadedPolicy;
use airlock_native::doctor::{Check, DoctorReport, Status, diagnose};
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
    let mut report = diagnose(&loaded.policy);
    report.push(live_check(&loaded));
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

/// Runs a real job through the native backend: the only proof that every control applies.
fn live_check(loaded: &LoadedPolicy) -> Check {
    const CONTROL: &str = "sandbox end to end";
    let outcome = (|| -> Result<String, String> {
        let helper = airlock_native::backend::current_exe().map_err(|e| error_chain(&e))?;
        let config = airlock_native::NativeConfig::from_policy(&loaded.policy, helper);
        let backend = airlock_native::NativeBackend::new(config).map_err(|e| error_chain(&e))?;
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
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let started = Instant::now();
        let report = runtime
            .block_on(backend.run_job(&spec))
            .map_err(|e| error_chain(&e))?;
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
