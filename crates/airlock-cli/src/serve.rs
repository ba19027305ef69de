//! `airlock serve` (the HTTP API) and `airlock token new` (a bearer token for it).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use airlock_core::ByteSize;
use airlock_core::units::parse_duration;
use airlock_engine::LoadedPolicy;
use airlock_server::{ServeConfig, TokensFile};
use anyhow::Context;
use clap::{Args, Subcommand};

use crate::error_chain;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on. Without --tokens only a loopback address is allowed.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:8700")]
    listen: SocketAddr,

    /// Policy file for jobs (default: the built-in policy). Tenants may have their own.
    #[arg(long, value_name = "FILE")]
    pub(crate) policy: Option<PathBuf>,

    /// Backend every job runs on: native, docker, podman, gvisor, kube.
    #[arg(long, value_name = "BACKEND", default_value = "native")]
    backend: String,

    /// Tokens file (TOML): tenants, their token digests, policies and limits. Without it
    /// the API needs no token and listens on loopback only.
    #[arg(long, value_name = "FILE")]
    tokens: Option<PathBuf>,

    /// Jobs running at once (default: the number of CPUs).
    #[arg(long, value_name = "N")]
    max_in_flight: Option<usize>,

    /// Jobs waiting for a slot; beyond it requests get 429 (default: 16 per job slot).
    #[arg(long, value_name = "N")]
    queue: Option<usize>,

    /// Longest wait in the queue before a 429.
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    queue_wait: String,

    /// Largest request body; larger ones get 413.
    #[arg(long, value_name = "SIZE", default_value = "16MiB")]
    max_body: String,

    /// Time for a request's headers to arrive (also the idle keep-alive timeout).
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    header_timeout: String,

    /// Time for a request's body to arrive; slower ones get 408 (never holding a job slot).
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    body_timeout: String,

    /// Longest a response write may be blocked by a client that does not read.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    write_stall_timeout: String,

    /// Most open connections.
    #[arg(long, value_name = "N", default_value_t = airlock_server::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,

    /// On SIGTERM/SIGINT, how long running jobs may finish before they are killed.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    shutdown_grace: String,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Print a new random token (alone, on stdout) and add it to a tokens file: with
    /// --tokens-file FILE the entry is appended there, otherwise its lines go to stderr.
    New {
        /// The tenant the token belongs to (appears in audit lines and logs).
        #[arg(long, value_name = "NAME")]
        tenant: String,
        /// The tenant's own policy file.
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// Jobs of this tenant running at once.
        #[arg(long, value_name = "N")]
        max_in_flight: Option<usize>,
        /// Append the entry (the token's digest, never the token) to this tokens file,
        /// created with mode 0600 when missing; refused when group or others may write it.
        #[arg(long, value_name = "FILE")]
        tokens_file: Option<PathBuf>,
        /// Mint the token in E2B's API key shape (`e2b_` and 64 hex digits), so E2B's SDKs
        /// accept it as E2B_API_KEY unchanged (docs/e2b.md); it is an ordinary token.
        #[arg(long)]
        e2b: bool,
    },
    /// Print the digest line of an existing token read from stdin.
    Hash,
}

fn duration(flag: &str, text: &str) -> anyhow::Result<Duration> {
    parse_duration(text).map_err(|e| anyhow::anyhow!("--{flag} {text:?}: {e}"))
}

fn config(args: ServeArgs) -> anyhow::Result<ServeConfig> {
    let policy = match &args.policy {
        Some(path) => {
            LoadedPolicy::from_file(path).map_err(|e| anyhow::anyhow!(error_chain(&e)))?
        }
        None => LoadedPolicy::builtin(),
    };
    let mut config = ServeConfig::new(args.listen, policy);
    config.backend = args
        .backend
        .parse()
        .map_err(|e: String| anyhow::anyhow!("--backend: {e}"))?;
    if let Some(path) = &args.tokens {
        config.tokens = Some(TokensFile::load(path).map_err(|e| anyhow::anyhow!(error_chain(&e)))?);
    }
    if let Some(n) = args.max_in_flight {
        anyhow::ensure!(n >= 1, "--max-in-flight must be at least 1");
        config.admission.max_in_flight = n;
        config.admission.queue = n * 16;
    }
    if let Some(n) = args.queue {
        config.admission.queue = n;
    }
    config.admission.queue_wait_max = duration("queue-wait", &args.queue_wait)?;
    let max_body: ByteSize = args
        .max_body
        .parse()
        .map_err(|e| anyhow::anyhow!("--max-body {:?}: {e}", args.max_body))?;
    config.max_body_bytes =
        usize::try_from(max_body.as_u64()).context("--max-body is too large")?;
    config.conn.header_timeout = duration("header-timeout", &args.header_timeout)?;
    config.body_timeout = duration("body-timeout", &args.body_timeout)?;
    config.conn.write_stall_timeout = duration("write-stall-timeout", &args.write_stall_timeout)?;
    config.conn.max_connections = args.max_connections;
    config.shutdown_grace = duration("shutdown-grace", &args.shutdown_grace)?;
    Ok(config)
}

pub fn serve(args: ServeArgs) -> ExitCode {
    let config = match config(args) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("airlock serve: {e:#}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("airlock serve: start runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let authenticated = config.tokens.is_some();
    let kind = config.backend;
    let backends = move |loaded: &LoadedPolicy| airlock_server::open_backend(kind, loaded);
    let result = runtime.block_on(airlock_server::serve(config, &backends, |addr| {
        eprintln!(
            "airlock serve: listening on http://{addr} ({})",
            if authenticated {
                "bearer tokens required"
            } else {
                "no tokens file: unauthenticated, loopback only"
            }
        );
    }));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("airlock serve: {}", error_chain(&e));
            ExitCode::from(1)
        }
    }
}

pub fn token(command: TokenCommand) -> ExitCode {
    match command {
        TokenCommand::New {
            tenant,
            policy,
            max_in_flight,
            tokens_file,
            e2b,
        } => {
            let generated = if e2b {
                airlock_server::auth::generate_e2b_token()
            } else {
                airlock_server::auth::generate_token()
            };
            let token = match generated {
                Ok(token) => token,
                Err(e) => {
                    eprintln!("airlock token new: {}", error_chain(&e));
                    return ExitCode::from(1);
                }
            };
            let entry = match airlock_server::auth::tokens_file_entry(
                &tenant,
                &token,
                policy.as_deref(),
                max_in_flight,
            ) {
                Ok(entry) => entry,
                Err(e) => {
                    eprintln!("airlock token new: {e}");
                    return ExitCode::from(2);
                }
            };
            // stdout carries the token alone, so `airlock token new ... > token.txt` (or
            // `TOKEN=$(airlock token new ...)`) gets exactly the secret.
            match &tokens_file {
                Some(path) => {
                    if let Err(e) = airlock_server::auth::append_to_tokens_file(path, &entry) {
                        eprintln!("airlock token new: {}", error_chain(&e));
                        return ExitCode::from(1);
                    }
                    eprintln!(
                        "airlock token new: tenant {tenant} added to {} (its digest only); the \
                         token below is shown once and stored nowhere",
                        path.display()
                    );
                }
                None => eprint!(
                    "# The token is on stdout: give it to the client as `Authorization: Bearer \
                     <token>`;\n# it is shown once and stored nowhere. Add these lines to the \
                     tokens file (--tokens FILE),\n# or rerun with --tokens-file FILE to append \
                     them:\n{entry}"
                ),
            }
            println!("{token}");
            ExitCode::SUCCESS
        }
        TokenCommand::Hash => {
            let mut line = String::new();
            if let Err(e) = std::io::stdin().read_line(&mut line) {
                eprintln!("airlock token hash: read stdin: {e}");
                return ExitCode::from(1);
            }
            println!("{}", airlock_server::auth::token_digest(line.trim()));
            ExitCode::SUCCESS
        }
    }
}
