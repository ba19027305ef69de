//! `airlock doctor`.

use std::process::ExitCode;

use clap::Args;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn doctor(_args: DoctorArgs) -> ExitCode {
    ExitCode::from(1)
}
