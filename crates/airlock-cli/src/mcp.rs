//! `airlock mcp`: the MCP tool server on stdio (stdout carries only MCP messages; logs go
//! to stderr), and `airlock tool-schema`: the run_code tool's schema for function calling
//! or as MCP lists it, for clients that build their tool from it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use airlock_core::BackendKind;
use airlock_engine::{AuditLog, Engine, LoadedPolicy};
use airlock_mcp::EngineExecutor;
use airlock_mcp::tool::ToolSchemaFormat;
use clap::{Args, ValueEnum};

use crate::error_chain;

/// How long to wait for interrupted jobs to be torn down and audited before exiting.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

#[derive(Debug, Args)]
pub struct McpArgs {
    /// Policy file for jobs (default: the built-in policy).
    #[arg(long, value_name = "FILE")]
    pub(crate) policy: Option<PathBuf>,

    /// Backend every job runs on: native, docker, podman, gvisor, kube.
    #[arg(long, value_name = "BACKEND", default_value = "native")]
    backend: String,

    /// Jobs running at once (default: the number of CPUs).
    #[arg(long, value_name = "N")]
    max_in_flight: Option<usize>,
}

pub fn mcp(args: McpArgs) -> ExitCode {
    let loaded = match &args.policy {
        Some(path) => match LoadedPolicy::from_file(path) {
            Ok(loaded) => loaded,
            Err(e) => {
                eprintln!("airlock mcp: {}", error_chain(&e));
                return ExitCode::from(2);
            }
        },
        None => LoadedPolicy::builtin(),
    };
    let kind: BackendKind = match args.backend.parse() {
        Ok(kind) => kind,
        Err(e) => {
            eprintln!("airlock mcp: --backend: {e}");
            return ExitCode::from(2);
        }
    };
    let audit = match AuditLog::open(&loaded.audit_path(), loaded.policy.audit.fsync) {
        Ok(audit) => audit,
        Err(e) => {
            eprintln!("airlock mcp: {}", error_chain(&e));
            return ExitCode::from(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("airlock mcp: start runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let max_in_flight = args
        .max_in_flight
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    let result = runtime.block_on(async move {
        let backend = airlock_server::open_backend(kind, &loaded);
        if let Err(e) = &backend {
            tracing::error!(kind = %e.kind, error = %e.message, "backend unavailable: every job will fail");
        }
        let engine = Arc::new(Engine::new(loaded.policy, kind, backend, audit));
        let (interrupt_tx, interrupt_rx) = tokio::sync::watch::channel(None);
        let executor = Arc::new(EngineExecutor::new(engine.clone(), max_in_flight, interrupt_rx));
        let signals = async {
            use tokio::signal::unix::{SignalKind, signal};
            match (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) {
                (Ok(mut int), Ok(mut term)) => tokio::select! {
                    _ = int.recv() => "SIGINT",
                    _ = term.recv() => "SIGTERM",
                },
                _ => std::future::pending().await,
            }
        };
        let (served, reason) = tokio::select! {
            served = airlock_mcp::serve_stdio(executor.clone()) => (served, "the client closed stdin"),
            name = signals => (Ok(()), name),
        };
        // Jobs still running are killed (and audited) rather than dropped unaudited.
        let _ = interrupt_tx.send(Some(reason.to_owned()));
        if tokio::time::timeout(STOP_WAIT, executor.wait_idle()).await.is_err() {
            tracing::error!("jobs still running after they were interrupted; exiting anyway");
        }
        engine.shutdown().await;
        served
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("airlock mcp: {}", error_chain(&e));
            ExitCode::from(1)
        }
    }
}

/// The shapes `airlock tool-schema` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SchemaFormat {
    /// Chat Completions: `{"type": "function", "function": {..., "strict": true}}`.
    Chat,
    /// The Responses API: `{"type": "function", "name", ..., "strict": true}`.
    Responses,
    /// The tool as MCP's `tools/list` shows it: `name`, `description`, `inputSchema`,
    /// `outputSchema`.
    Mcp,
}

#[derive(Debug, Args)]
pub struct ToolSchemaArgs {
    /// The shape to print.
    #[arg(long, value_enum, default_value = "chat")]
    format: SchemaFormat,

    /// Policy file whose languages and limits the schema describes (default: built-in).
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
}

/// `airlock tool-schema`: prints the run_code tool's schema as one JSON document.
pub fn tool_schema(args: ToolSchemaArgs) -> ExitCode {
    let loaded = match &args.policy {
        Some(path) => match LoadedPolicy::from_file(path) {
            Ok(loaded) => loaded,
            Err(e) => {
                eprintln!("airlock tool-schema: {}", error_chain(&e));
                return ExitCode::from(2);
            }
        },
        None => LoadedPolicy::builtin(),
    };
    let policy = &loaded.policy;
    let schema = match args.format {
        SchemaFormat::Chat => airlock_mcp::tool::function_schema(policy, ToolSchemaFormat::Chat),
        SchemaFormat::Responses => {
            airlock_mcp::tool::function_schema(policy, ToolSchemaFormat::Responses)
        }
        // What `airlock mcp` lists: it keeps no sessions, so `session` is not offered
        // (airlock serve's /mcp offers it where the policy enables sessions).
        SchemaFormat::Mcp => match serde_json::to_value(airlock_mcp::tool_for(&{
            let mut stdio = policy.clone();
            stdio.sessions.enabled = false;
            stdio
        })) {
            Ok(value) => value,
            Err(e) => {
                eprintln!("airlock tool-schema: encode the tool: {e}");
                return ExitCode::from(1);
            }
        },
    };
    match serde_json::to_string_pretty(&schema) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("airlock tool-schema: encode the schema: {e}");
            ExitCode::from(1)
        }
    }
}
