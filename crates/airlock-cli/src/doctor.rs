//! `airlock doctor`: what this host can enforce, control by control, ending with a real
//! sandboxed job.

use std::path::PathBuf;
use std::process::ExitCode;

use airlock_core::BackendKind;
use airlock_core::doctor::{DoctorReport, Status};
use airlock_engine::LoadedPolicy;
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
    let report = runtime.block_on(airlock_engine::doctor::doctor(kind, &loaded));
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
