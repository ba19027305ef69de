//! `airlock kube …` (built with the `kube` feature): prepare a job namespace once
//! (`install`), print airlock's seccomp filter as a node-local profile
//! (`seccomp-profile`).

use std::path::PathBuf;
use std::process::ExitCode;

use airlock_engine::LoadedPolicy;
use airlock_kube::install::{DEFAULT_SUBJECT, Identity, InstallPlan};
use clap::{Args, Subcommand};

use crate::error_chain;

#[derive(Debug, Args)]
pub struct KubeArgs {
    #[command(subcommand)]
    command: KubeCommand,
}

#[derive(Debug, Subcommand)]
enum KubeCommand {
    /// Prepare the policy's job namespace (as a cluster admin): Pod Security restricted
    /// labels, a deny-all NetworkPolicy, ResourceQuota and LimitRange, the job service
    /// account (no token), and airlock's narrow Role and RoleBinding. Idempotent.
    Install {
        /// The policy whose [kube] section and ceilings size the objects.
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// airlock's identity in the cluster, as NAMESPACE/NAME of a service account.
        #[arg(long, value_name = "NS/NAME", conflicts_with = "user")]
        service_account: Option<String>,
        /// airlock's identity as a kubeconfig user name (airlock run outside the cluster).
        #[arg(long, value_name = "NAME")]
        user: Option<String>,
        /// Print the manifests as YAML instead of applying them.
        #[arg(long)]
        print: bool,
    },
    /// Print airlock's seccomp filter as an OCI profile, for `seccomp_profile =
    /// "Localhost:<path>"` (install it below the kubelet's seccomp directory on every node).
    SeccompProfile,
}

fn load(policy: Option<&PathBuf>) -> Result<LoadedPolicy, String> {
    match policy {
        Some(path) => LoadedPolicy::from_file(path).map_err(|e| error_chain(&e)),
        None => Ok(LoadedPolicy::builtin()),
    }
}

pub fn kube(args: KubeArgs) -> ExitCode {
    match args.command {
        KubeCommand::SeccompProfile => match airlock_engine::seccomp::oci_profile() {
            Ok(profile) => {
                println!("{profile}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("airlock: {}", error_chain(&e));
                ExitCode::from(1)
            }
        },
        KubeCommand::Install {
            policy,
            service_account,
            user,
            print,
        } => {
            let loaded = match load(policy.as_ref()) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("airlock: {e}");
                    return ExitCode::from(2);
                }
            };
            let identity = match (service_account, user) {
                (_, Some(user)) => Identity::User(user),
                (Some(sa), None) => match sa.split_once('/') {
                    Some((ns, name)) if !ns.is_empty() && !name.is_empty() => {
                        Identity::ServiceAccount(ns.to_owned(), name.to_owned())
                    }
                    _ => {
                        eprintln!("airlock: --service-account must be NAMESPACE/NAME");
                        return ExitCode::from(2);
                    }
                },
                (None, None) => Identity::ServiceAccount(
                    DEFAULT_SUBJECT.0.to_owned(),
                    DEFAULT_SUBJECT.1.to_owned(),
                ),
            };
            let plan = InstallPlan::from_policy(&loaded.policy, identity);
            if print {
                return match airlock_kube::install::objects(&plan) {
                    Ok(objects) => {
                        print!("{}", airlock_kube::yaml::to_yaml_stream(&objects));
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("airlock: {e}");
                        ExitCode::from(1)
                    }
                };
            }
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
            let result = runtime.block_on(async {
                let client = airlock_kube::backend::connect(&loaded.policy.kube).await?;
                airlock_kube::install::apply(&client, &plan).await
            });
            match result {
                Ok(applied) => {
                    for what in applied {
                        println!("applied {what}");
                    }
                    println!(
                        "namespace {} is ready for airlock's job Pods",
                        plan.namespace
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("airlock: {}", error_chain(&e));
                    ExitCode::from(1)
                }
            }
        }
    }
}
