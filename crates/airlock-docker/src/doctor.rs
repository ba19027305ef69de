//! `airlock doctor` for the Engine API backends: the socket, the daemon's version, its
//! runtimes, how TCP buffers are bounded, and whether the policy's image is present with the pinned digest.

use airlock_core::doctor::{Check, Status};
use airlock_core::policy::{Policy, RootfsSpec};

use crate::Flavor;
use crate::backend::DockerConfig;
use crate::host_checks::GVISOR_SECCOMP_FLAG;
use crate::tcp::TcpAccounting;

fn check(control: &str, status: Status, detail: impl Into<String>, fix: Option<&str>) -> Check {
    Check {
        control: control.to_owned(),
        status,
        detail: detail.into(),
        fix: fix.map(str::to_owned),
    }
}

/// Where the warm containers' jobs' ends come from ([`crate::warm`], docs/docker.md "How a
/// warm container's job ends"): the kernel's process events where this airlock has them,
/// else the daemon's exit handling, tens of milliseconds later per job.
fn warm_ends(flavor: Flavor) -> Check {
    let control = format!("{}: warm containers' ends", flavor.as_str());
    match flavor {
        Flavor::Gvisor => check(
            &control,
            Status::Ok,
            "from the daemon (a gVisor container's first process is its sandbox)",
            None,
        ),
        Flavor::Docker | Flavor::Podman => match airlock_host::exits::ExitEvents::shared() {
            Ok(_) => check(
                &control,
                Status::Ok,
                "from the kernel (the first process's pidfd and the process events), without waiting for the daemon",
                None,
            ),
            Err(reason) => check(
                &control,
                Status::Warning,
                format!("from the daemon, each job waiting for its exit handling: {reason}"),
                Some("run airlock as root on the host (not in another network namespace)"),
            ),
        },
    }
}

/// What the `flavor` backend can do here under `policy`, one [`Check`] per item. Talks to
/// the daemon (read-only requests: version, info, image inspect).
pub async fn doctor(policy: &Policy, flavor: Flavor) -> Vec<Check> {
    let prefix = flavor.as_str();
    let mut checks = Vec::new();
    let (config, engine) = match DockerConfig::from_policy(policy, flavor)
        .and_then(|config| Ok((config, crate::engine::socket(&policy.docker, flavor)?)))
    {
        Ok(resolved) => resolved,
        Err(e) => {
            checks.push(check(
                &format!("{prefix}: socket"),
                Status::Missing,
                e.to_string(),
                None,
            ));
            return checks;
        }
    };
    // Which daemon this is and why: DOCKER_HOST may point elsewhere than the policy's file.
    let socket = format!("{} ({})", config.socket.display(), engine.source);
    if !config.socket.exists() {
        checks.push(check(
            &format!("{prefix}: socket"),
            Status::Missing,
            format!("{socket} does not exist"),
            Some(match flavor {
                Flavor::Podman => "start the service: podman system service --time=0 unix:///run/podman/podman.sock, or set [docker] podman_socket",
                Flavor::Docker | Flavor::Gvisor => "start dockerd, or set DOCKER_HOST=unix:///path or [docker] docker_socket",
            }),
        ));
        return checks;
    }
    let docker = match crate::engine::connect(&config.socket) {
        Ok(docker) => docker,
        Err(e) => {
            checks.push(check(
                &format!("{prefix}: socket"),
                Status::Missing,
                format!("{socket}: {e}"),
                None,
            ));
            return checks;
        }
    };
    let docker = match docker.negotiate_version().await {
        Ok(docker) => docker,
        Err(e) => {
            checks.push(check(
                &format!("{prefix}: daemon"),
                Status::Missing,
                format!("{socket} does not answer: {e}"),
                Some("is the daemon running, and may airlock use its socket?"),
            ));
            return checks;
        }
    };
    checks.push(check(
        &format!("{prefix}: socket"),
        Status::Ok,
        socket,
        None,
    ));
    match docker.version().await {
        Ok(v) => checks.push(check(
            &format!("{prefix}: daemon"),
            Status::Ok,
            format!(
                "version {}, API {}",
                v.version.unwrap_or_default(),
                v.api_version.unwrap_or_default()
            ),
            None,
        )),
        Err(e) => checks.push(check(
            &format!("{prefix}: daemon"),
            Status::Missing,
            e.to_string(),
            None,
        )),
    }
    match docker.info().await {
        Ok(info) => {
            checks.push(match crate::host_checks::tcp_accounting(flavor, &info) {
                Ok(TcpAccounting::Inherent) => check(
                    &format!("{prefix}: tcp buffers"),
                    Status::Ok,
                    match flavor {
                        Flavor::Gvisor => {
                            "gVisor's sockets are its own kernel's memory, held by the memory limit"
                        }
                        Flavor::Docker | Flavor::Podman => {
                            "cgroup v2 charges socket memory to the memory limit"
                        }
                    },
                    None,
                ),
                Ok(TcpAccounting::V1(groups)) => check(
                    &format!("{prefix}: tcp buffers"),
                    Status::Ok,
                    format!(
                        "cgroup v1: each container's memory cgroup is created under {} with \
                         memory.kmem.tcp.limit_in_bytes = its memory limit",
                        groups.parent_dir().display()
                    ),
                    None,
                ),
                Err(e) => check(
                    &format!("{prefix}: tcp buffers"),
                    Status::Missing,
                    format!("{e}; jobs are refused"),
                    None,
                ),
            });
            let runtimes = info.runtimes.unwrap_or_default();
            let mut names: Vec<&str> = runtimes.keys().map(String::as_str).collect();
            names.sort_unstable();
            let default = info.default_runtime.unwrap_or_default();
            let detail = format!("available: {}; default {default}", names.join(", "));
            match &config.runtime {
                Some(runtime) if flavor == Flavor::Podman && *runtime != default => {
                    checks.push(check(
                        &format!("{prefix}: runtime {runtime}"),
                        Status::Missing,
                        format!(
                            "{detail}: the service's Docker-compatible API runs every container \
                             with its default runtime, so jobs are refused"
                        ),
                        Some("make it the service's default (containers.conf [engine] runtime), or set podman_runtime = \"\""),
                    ));
                }
                Some(runtime) if !runtimes.is_empty() && !runtimes.contains_key(runtime) => {
                    checks.push(check(
                        &format!("{prefix}: runtime {runtime}"),
                        Status::Missing,
                        detail,
                        Some("register it in daemon.json \"runtimes\" (runsc: {\"path\": \"/usr/bin/runsc\", \"runtimeArgs\": [\"--network=none\", \"--oci-seccomp\"]})"),
                    ));
                }
                Some(runtime) if flavor == Flavor::Gvisor => {
                    let args = runtimes
                        .get(runtime)
                        .and_then(|r| r.runtime_args.clone())
                        .unwrap_or_default();
                    if args.iter().any(|a| a == GVISOR_SECCOMP_FLAG) {
                        checks.push(check(
                            &format!("{prefix}: runtime {runtime}"),
                            Status::Ok,
                            format!("{detail}; args {args:?}"),
                            None,
                        ));
                    } else {
                        checks.push(check(
                            &format!("{prefix}: runtime {runtime}"),
                            Status::Missing,
                            format!("{detail}; args {args:?}: without {GVISOR_SECCOMP_FLAG} the job would run without a seccomp filter, so jobs are refused"),
                            Some("add \"--oci-seccomp\" to the runtime's runtimeArgs in daemon.json"),
                        ));
                    }
                }
                _ => checks.push(check(
                    &format!("{prefix}: runtime"),
                    Status::Ok,
                    detail,
                    None,
                )),
            }
            let rootless = info
                .security_options
                .iter()
                .flatten()
                .any(|o| o.contains("rootless"));
            let root = rustix::process::geteuid().is_root();
            checks.push(if root && !rootless {
                check(
                    &format!("{prefix}: /out"),
                    Status::Ok,
                    "a size-capped tmpfs mounted by airlock on the host",
                    None,
                )
            } else {
                check(
                    &format!("{prefix}: /out"),
                    Status::Warning,
                    "needs airlock as root and a rootful daemon; jobs asking for /out are refused",
                    None,
                )
            });
        }
        Err(e) => checks.push(check(
            &format!("{prefix}: runtime"),
            Status::Missing,
            e.to_string(),
            None,
        )),
    }
    if policy.docker.warm_pool_of(flavor.kind()) > 0 {
        checks.push(warm_ends(flavor));
    }
    match &policy.filesystem.rootfs {
        RootfsSpec::Image { reference, digest } => {
            match crate::image::check(&docker, prefix, reference, digest).await {
                Ok(image) => checks.push(check(
                    &format!("{prefix}: image"),
                    Status::Ok,
                    format!("{reference} is {}", image.id),
                    None,
                )),
                Err(e) => checks.push(check(
                    &format!("{prefix}: image"),
                    Status::Missing,
                    e.to_string(),
                    Some("docker load / docker import the image, then pin the id it shows"),
                )),
            }
        }
        other => checks.push(check(
            &format!("{prefix}: image"),
            Status::Missing,
            format!("the policy's rootfs is {other:?}; container backends run images only"),
            Some("set [filesystem] rootfs = \"image:REF@sha256:…\""),
        )),
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warm_ends_line_says_where_each_backends_ends_come_from() {
        let gvisor = warm_ends(Flavor::Gvisor);
        assert_eq!(gvisor.status, Status::Ok);
        assert!(
            gvisor.detail.starts_with("from the daemon"),
            "{}",
            gvisor.detail
        );
        for flavor in [Flavor::Docker, Flavor::Podman] {
            let line = warm_ends(flavor);
            assert_eq!(line.control, format!("{flavor}: warm containers' ends"));
            match airlock_host::exits::ExitEvents::shared() {
                Ok(_) => {
                    assert_eq!(line.status, Status::Ok);
                    assert!(
                        line.detail.starts_with("from the kernel"),
                        "{}",
                        line.detail
                    );
                }
                Err(reason) => {
                    assert_eq!(line.status, Status::Warning);
                    assert!(line.detail.contains(&reason), "{}", line.detail);
                    assert!(line.fix.is_some());
                }
            }
        }
    }
}
