//! The `airlock` command: run one job, check the host, check a policy.
//!
//! The hidden first argument `__airlock-init` turns this binary into the sandbox init; it
//! is dispatched before anything else happens (no argument parsing, no logging, no
//! threads), because namespace setup must run in a fresh single-threaded process.
#![forbid(unsafe_code)]

mod doctor;
mod image;
#[cfg(feature = "kube")]
mod kube;
mod mcp;
mod run;
mod serve;

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code when airlock itself could not run the job (DESIGN §3).
pub const EXIT_AIRLOCK_ERROR: u8 = 125;

#[derive(Debug, Parser)]
#[command(
    name = "airlock",
    version,
    about = "Run untrusted code in a disposable, hardened sandbox and get a bounded JSON observation back",
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one job.
    Run(Box<run::RunArgs>),
    /// Show what this host can enforce, control by control.
    Doctor(doctor::DoctorArgs),
    /// Policy files.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Images: build, import, pull by digest, list, inspect, remove, save, load.
    Image(image::ImageArgs),
    /// Serve the HTTP API (and MCP over HTTP at /mcp).
    Serve(Box<serve::ServeArgs>),
    /// Serve the run_code tool over MCP on stdio (logs go to stderr).
    Mcp(mcp::McpArgs),
    /// Print the run_code tool's schema: strict function calling (chat, responses) or MCP.
    ToolSchema(mcp::ToolSchemaArgs),
    /// Bearer tokens for `airlock serve`.
    #[command(subcommand)]
    Token(serve::TokenCommand),
    /// The Kubernetes backend: prepare a job namespace, print the seccomp profile.
    #[cfg(feature = "kube")]
    Kube(kube::KubeArgs),
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Validate a policy file (unknown keys and out-of-range values are errors).
    Check {
        /// The policy file.
        file: PathBuf,
    },
    /// Print the effective policy with every default filled in.
    Show {
        /// A policy file; the built-in policy when omitted.
        file: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    if std::env::args_os().nth(1).as_deref() == Some(OsStr::new(airlock_native::plan::INIT_ARG)) {
        airlock_native::init::main();
    }
    let cli = Cli::parse();
    // OTLP export only for the commands that run jobs, and only when the OTEL_* variables
    // or the policy's [telemetry] section ask for it (docs/telemetry.md).
    let job_command = match &cli.command {
        Command::Serve(args) => Some(("airlock serve", args.policy.as_deref())),
        Command::Mcp(args) => Some(("airlock mcp", args.policy.as_deref())),
        Command::Run(args) => Some(("airlock run", args.policy.as_deref())),
        _ => None,
    };
    let telemetry = match job_command {
        Some((command, policy)) => {
            match airlock_telemetry::Telemetry::start(&telemetry_settings(policy), command) {
                Ok(telemetry) => telemetry,
                Err(e) => {
                    eprintln!("airlock: telemetry: {}", error_chain(&e));
                    return ExitCode::from(EXIT_AIRLOCK_ERROR);
                }
            }
        }
        _ => None,
    };
    // The server logs each request and job at info; the other commands only warnings.
    init_logging(
        match cli.command {
            Command::Serve(_) => "info",
            _ => "warn",
        },
        telemetry.as_ref(),
    );
    let code = run_command(cli.command);
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    code
}

/// The policy's `[telemetry]` section, for the commands that run jobs. A policy that
/// does not load gives none here: the command itself reports why it does not load.
fn telemetry_settings(policy: Option<&std::path::Path>) -> airlock_telemetry::Settings {
    let Some(path) = policy else {
        return airlock_telemetry::Settings::default();
    };
    match airlock_engine::LoadedPolicy::from_file(path) {
        Ok(loaded) => airlock_telemetry::Settings {
            endpoint: loaded.policy.telemetry.endpoint.clone(),
            service_name: loaded.policy.telemetry.service_name.clone(),
        },
        Err(_) => airlock_telemetry::Settings::default(),
    }
}

fn run_command(command: Command) -> ExitCode {
    match command {
        Command::Run(args) => run::run(*args),
        Command::Doctor(args) => doctor::doctor(args),
        Command::Image(args) => image::image(args),
        Command::Policy(PolicyCommand::Check { file }) => policy_check(&file),
        Command::Policy(PolicyCommand::Show { file }) => policy_show(file.as_deref()),
        Command::Serve(args) => serve::serve(*args),
        Command::Mcp(args) => mcp::mcp(args),
        Command::ToolSchema(args) => mcp::tool_schema(args),
        Command::Token(command) => serve::token(command),
        #[cfg(feature = "kube")]
        Command::Kube(args) => kube::kube(args),
    }
}

fn init_logging(default: &str, telemetry: Option<&airlock_telemetry::Telemetry>) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_env("AIRLOCK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .with_filter(filter);
    // The exported spans have their own filter (the job's tree only), independent of how
    // much goes to stderr.
    tracing_subscriber::registry()
        .with(log)
        .with(telemetry.map(airlock_telemetry::Telemetry::layer))
        .init();
}

fn policy_check(file: &std::path::Path) -> ExitCode {
    match airlock_engine::LoadedPolicy::from_file(file) {
        Ok(loaded) => {
            let p = &loaded.policy;
            println!(
                "ok: {} is valid (version {}; timeout {}, memory {}, cpus {}, pids {}; network {}; rootfs {}; languages {})",
                file.display(),
                p.version,
                airlock_core::units::format_duration(p.limits.timeout),
                p.limits.memory,
                p.limits.cpus,
                p.limits.pids,
                p.network.mode,
                p.filesystem.rootfs,
                p.languages.keys().cloned().collect::<Vec<_>>().join(", "),
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("airlock: {}", error_chain(&e));
            ExitCode::from(1)
        }
    }
}

fn policy_show(file: Option<&std::path::Path>) -> ExitCode {
    let loaded = match file {
        Some(path) => airlock_engine::LoadedPolicy::from_file(path),
        None => Ok(airlock_engine::LoadedPolicy::builtin()),
    };
    match loaded {
        Ok(loaded) => {
            print!("{}", loaded.policy.to_toml());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("airlock: {}", error_chain(&e));
            ExitCode::from(1)
        }
    }
}

/// An error and its sources, joined with ": ", each text once.
pub(crate) use airlock_core::error::chain_without_repeats as error_chain;
