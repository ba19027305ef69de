//! The container a job runs in, as pure data: the Engine API's create body for the
//! reference shape of DESIGN §5 (`--network none --read-only --tmpfs /tmp --user
//! 65534:65534 --cap-drop ALL --security-opt no-new-privileges --memory --cpus
//! --pids-limit -v JOBDIR:/work:ro -w /work`), built from a checked [`JobSpec`]. No I/O
//! here, so every field is unit-tested.

use std::collections::HashMap;
use std::path::Path;

use airlock_core::JobSpec;
use airlock_core::job::WORKDIR;
use airlock_core::policy::WorkdirMode;
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig, ResourcesUlimits};

use crate::Flavor;

/// The job's uid and gid inside the container (DESIGN S5).
pub const JOB_UID: u32 = 65534;
/// The container's hostname, as on the native backend.
pub const HOSTNAME: &str = "airlock";
/// Where `/out` is mounted.
pub const OUT_DIR: &str = "/out";
/// The label every container airlock creates carries, and the only one it ever removes.
pub const LABEL_MANAGED: &str = "airlock.managed";
/// The label holding the job id.
pub const LABEL_JOB: &str = "airlock.job";
/// The label holding the boot id of the host whose airlock created the container.
pub const LABEL_BOOT: &str = "airlock.boot";
/// The label holding the backend kind.
pub const LABEL_BACKEND: &str = "airlock.backend";
/// The label of a warm container (created and started before its job): `true`.
pub const LABEL_WARM: &str = "airlock.warm";
/// `CpuShares` of a warm container while it starts and waits: the smallest the engines
/// take (runc and runsc write `cpu.shares` 2 on cgroup v1 and map it to `cpu.weight` 1 on
/// v2), so a job running meanwhile is not slowed by the container made for the next one.
/// Its job gets the kernel's default share ([`crate::warm`]).
pub const WARM_CPU_SHARES: i64 = 2;
/// RLIMIT_CORE of the job: 1, not 0, for the reason given at
/// `airlock_native::backend::CORE_RLIMIT_BYTES`.
pub const CORE_RLIMIT_BYTES: i64 = 1;
/// Runs the program with exactly the job's environment. The daemon adds variables of its
/// own to every container (`HOSTNAME`, and `container` on Podman); `env -i` clears them
/// before the interpreter starts, so the job sees exactly DESIGN S1's allowlist. Every
/// Debian-based image has it.
pub const ENV_WRAPPER: &str = "/usr/bin/env";
/// gVisor: host tasks its sandbox may use per task of the job, for the backstop pids limit
/// on the sandbox's host cgroup. The job's own limit is RLIMIT_NPROC inside the sandbox
/// (gVisor's kernel counts the job's tasks itself); the host cgroup holds the Sentry's
/// threads and, on the ptrace platform, a stub process with a handful of traced threads
/// for each task of the job (measured: 63 sleeping processes use 362 host tasks, an idle
/// sandbox 43). Hitting the backstop kills the whole sandbox, so it sits well above that.
pub const GVISOR_HOST_TASKS_PER_TASK: i64 = 16;
/// gVisor: host tasks of the sandbox itself, on top of the per-task allowance.
pub const GVISOR_HOST_TASKS_BASE: i64 = 256;
/// gVisor: device nodes its kernel puts in every container's `/dev` beyond the native
/// backend's minimal set (null, zero, full, random, urandom), each hidden under a bind of
/// an empty read-only file. runsc builds `/dev` itself: the OCI spec's device list does
/// not shape it and its masked paths are ignored (runsc 2022-12), and it has no flag to
/// leave these out.
pub const GVISOR_HIDDEN_DEVICE_NODES: [&str; 1] = ["/dev/fuse"];
/// gVisor: directories of its `/dev` hidden under an empty read-only tmpfs (`/dev/net`
/// holds `tun`).
pub const GVISOR_HIDDEN_DEVICE_DIRS: [&str; 1] = ["/dev/net"];
/// The options of the empty read-only tmpfs laid over paths the job must not see.
pub const EMPTY_TMPFS: &str = "ro,noexec,nosuid,nodev,size=4k";

/// What [`container_body`] needs besides the job.
#[derive(Debug, Clone)]
pub struct ContainerPlan<'a> {
    /// Docker with runc, Podman, or Docker with runsc.
    pub flavor: Flavor,
    /// The image's id (`sha256:…`), never a tag: what was checked is what runs.
    pub image_id: &'a str,
    /// The host directory bound at `/work`.
    pub workdir: &'a Path,
    /// The host directory (a size-capped tmpfs) bound at `/out`, when enabled.
    pub out_dir: Option<&'a Path>,
    /// The OCI runtime; `None` for the daemon's default.
    pub runtime: Option<&'a str>,
    /// This host's boot id (for the stale-container sweep).
    pub boot_id: &'a str,
    /// The seccomp profile, see [`crate::seccomp`]: its JSON for Docker, a path on the
    /// daemon's host for Podman.
    pub seccomp_profile: &'a str,
    /// Proxy mode: the port the egress proxy listens on inside the container.
    pub proxy_port: Option<u16>,
    /// An empty file the job may not write, bound read-only over the device nodes to hide
    /// ([`GVISOR_HIDDEN_DEVICE_NODES`]).
    pub empty_file: &'a Path,
    /// The job's CA bundle on the host, when the proxy intercepts TLS: bound read-only at
    /// [`airlock_core::job::TRUST_BUNDLE_PATH`] (over the image's bundle, or where an image
    /// without one would have it).
    pub trust_bundle: Option<&'a Path>,
    /// Podman: RLIMIT_NPROC to set explicitly. Rootful Podman otherwise asks for a default
    /// above its own hard limit, which runc cannot set once every capability is dropped.
    /// The job's real process limit is the pids cgroup.
    pub nproc_ceiling: Option<i64>,
    /// The daemon's `CgroupParent` for the container, when airlock creates its memory
    /// cgroup ([`crate::tcp`]); `None` for the daemon's default.
    pub cgroup_parent: Option<&'a str>,
    /// The sandbox the container is: the job's id, or a warm container's own name (its
    /// job comes later). Names the container and its `airlock.job` label, as it names the
    /// job directory, which the stale-container sweep matches it with.
    pub sandbox: &'a str,
    /// A warm container: the program that waits for the job on stdin (the job's interpreter
    /// and flags running the bootstrap, `airlock_core::warm::python`), run in place of the
    /// job's argv. Everything else is the cold container's.
    pub warm_argv: Option<&'a [String]>,
}

/// The labels of a sandbox's container (`sandbox`: the job id, or the warm container's
/// name).
pub fn labels(sandbox: &str, flavor: Flavor, boot_id: &str, warm: bool) -> HashMap<String, String> {
    let mut labels = HashMap::from([
        (LABEL_MANAGED.to_owned(), "true".to_owned()),
        (LABEL_JOB.to_owned(), sandbox.to_owned()),
        (LABEL_BOOT.to_owned(), boot_id.to_owned()),
        (LABEL_BACKEND.to_owned(), flavor.kind().to_string()),
    ]);
    if warm {
        labels.insert(LABEL_WARM.to_owned(), "true".to_owned());
    }
    labels
}

/// The container's name: unique per sandbox (a job's id, or a warm container's name), and
/// telling whose it is in `docker ps`.
pub fn container_name(sandbox: &str) -> String {
    format!("airlock-{sandbox}")
}

/// The command: [`ENV_WRAPPER`] `-i NAME=VALUE... argv...`.
pub fn command(job: &JobSpec, proxy_port: Option<u16>) -> Vec<String> {
    command_running(job, &job.argv, proxy_port)
}

/// [`command`] with `argv` as the program (a warm container's bootstrap).
fn command_running(job: &JobSpec, argv: &[String], proxy_port: Option<u16>) -> Vec<String> {
    let env = job_env(job, proxy_port);
    let mut cmd = Vec::with_capacity(env.len() + argv.len() + 6);
    if proxy_port.is_some() {
        // Proxy mode: the program waits for one line on stdin, which airlock sends once the
        // proxy listens inside the container's network namespace (which exists only once the
        // container has started).
        cmd.extend(PROXY_GATE.iter().map(|s| (*s).to_owned()));
    }
    cmd.push(ENV_WRAPPER.to_owned());
    cmd.push("-i".to_owned());
    cmd.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    cmd.extend(argv.iter().cloned());
    cmd
}

/// The shell words that hold a proxy-mode job until airlock's proxy listens: `sh` reads one
/// line from stdin, then execs the real command (its arguments). The image needs `/bin/sh`.
pub const PROXY_GATE: &[&str] = &[
    "/bin/sh",
    "-c",
    "IFS= read -r _ && exec \"$@\"",
    "airlock-proxy-gate",
];

/// The job's environment, with the proxy variables in proxy mode.
pub fn job_env(job: &JobSpec, proxy_port: Option<u16>) -> Vec<(String, String)> {
    match proxy_port {
        Some(port) => airlock_core::job::proxy_env(&job.env, port, &job.network_policy),
        None => job.env.clone(),
    }
}

fn ulimit(name: &str, value: i64) -> ResourcesUlimits {
    ResourcesUlimits {
        name: Some(name.to_owned()),
        soft: Some(value),
        hard: Some(value),
    }
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The create body for `job`.
pub fn container_body(job: &JobSpec, plan: &ContainerPlan<'_>) -> ContainerCreateBody {
    let limits = &job.limits;
    let workdir_mode = match job.filesystem.workdir {
        WorkdirMode::Ro => "ro",
        WorkdirMode::Rw => "rw",
    };
    let mut binds = vec![format!(
        "{}:{WORKDIR}:{workdir_mode}",
        plan.workdir.display()
    )];
    if let Some(out) = plan.out_dir {
        binds.push(format!("{}:{OUT_DIR}:rw", out.display()));
    }
    if let Some(bundle) = plan.trust_bundle {
        binds.push(format!(
            "{}:{}:ro",
            bundle.display(),
            airlock_core::job::TRUST_BUNDLE_PATH
        ));
    }
    let mut ulimits = vec![
        ulimit("nofile", i64::from(limits.open_files)),
        ulimit("fsize", saturating_i64(limits.file_size.as_u64())),
        ulimit("core", CORE_RLIMIT_BYTES),
    ];
    let pids = i64::from(limits.pids);
    let pids_limit = match plan.flavor {
        Flavor::Docker => pids,
        Flavor::Podman => {
            if let Some(ceiling) = plan.nproc_ceiling {
                ulimits.push(ulimit("nproc", ceiling));
            }
            pids
        }
        Flavor::Gvisor => {
            // The job's limit, counted by gVisor's own kernel (sandbox-local: no other
            // container's processes of uid 65534 count, unlike RLIMIT_NPROC under runc).
            ulimits.push(ulimit("nproc", pids));
            pids * GVISOR_HOST_TASKS_PER_TASK + GVISOR_HOST_TASKS_BASE
        }
    };
    let tmp_bytes = limits.tmp.as_u64();
    let memory = saturating_i64(limits.memory.as_u64());
    let mut tmpfs = HashMap::new();
    match &job.session_tmp {
        // A session's own /tmp (size-capped on the host), as its /work is bound.
        Some(session_tmp) => binds.push(format!("{}:/tmp:rw", session_tmp.display())),
        None => {
            tmpfs.insert(
                "/tmp".to_owned(),
                format!("rw,noexec,nosuid,nodev,size={tmp_bytes}"),
            );
        }
    }
    match plan.flavor {
        Flavor::Podman => {
            // Podman's --read-only adds writable tmpfs at /run and /var/tmp; the Engine API
            // has no switch for that, so they are replaced by empty read-only ones.
            for path in ["/run", "/var/tmp"] {
                tmpfs.insert(path.to_owned(), EMPTY_TMPFS.to_owned());
            }
        }
        Flavor::Gvisor => {
            // The same /dev as native: gVisor's own FUSE and TUN devices hidden.
            for path in GVISOR_HIDDEN_DEVICE_DIRS {
                tmpfs.insert(path.to_owned(), EMPTY_TMPFS.to_owned());
            }
            for path in GVISOR_HIDDEN_DEVICE_NODES {
                binds.push(format!("{}:{path}:ro", plan.empty_file.display()));
            }
        }
        Flavor::Docker => {}
    }
    // Proxy mode always attaches stdin: the gate's line comes that way; so does a warm
    // container's job.
    let has_stdin = job.stdin.is_some() || plan.proxy_port.is_some() || plan.warm_argv.is_some();
    let program = plan.warm_argv.unwrap_or(&job.argv);
    ContainerCreateBody {
        image: Some(plan.image_id.to_owned()),
        hostname: Some(HOSTNAME.to_owned()),
        user: Some(format!("{JOB_UID}:{JOB_UID}")),
        entrypoint: Some(command_running(job, program, plan.proxy_port)),
        cmd: Some(Vec::new()),
        env: Some(
            job_env(job, plan.proxy_port)
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect(),
        ),
        working_dir: Some(WORKDIR.to_owned()),
        labels: Some(labels(
            plan.sandbox,
            plan.flavor,
            plan.boot_id,
            plan.warm_argv.is_some(),
        )),
        attach_stdin: Some(has_stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        open_stdin: Some(has_stdin),
        stdin_once: Some(has_stdin),
        tty: Some(false),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
            network_mode: Some("none".to_owned()),
            readonly_rootfs: Some(true),
            tmpfs: Some(tmpfs),
            shm_size: Some(saturating_i64(tmp_bytes)),
            binds: Some(binds),
            cap_drop: Some(vec!["ALL".to_owned()]),
            security_opt: Some(vec![
                "no-new-privileges".to_owned(),
                format!("seccomp={}", plan.seccomp_profile),
            ]),
            memory: Some(memory),
            memory_swap: Some(memory),
            nano_cpus: Some(i64::from(limits.cpus.millis()) * 1_000_000),
            cpu_shares: plan.warm_argv.map(|_| WARM_CPU_SHARES),
            pids_limit: Some(pids_limit),
            ulimits: Some(ulimits),
            runtime: plan.runtime.map(str::to_owned),
            cgroup_parent: plan.cgroup_parent.map(str::to_owned),
            init: Some(false),
            auto_remove: Some(false),
            privileged: Some(false),
            // Output goes to airlock through the attach stream only; nothing is stored.
            log_config: Some(HostConfigLogConfig {
                typ: Some("none".to_owned()),
                config: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::{JobRequest, Policy};
    use pretty_assertions::assert_eq;

    fn job(policy: &Policy) -> JobSpec {
        JobRequest {
            language: "python".into(),
            source: b"print(1)".to_vec(),
            ..Default::default()
        }
        .resolve(policy)
        .unwrap()
    }

    fn plan(flavor: Flavor) -> ContainerPlan<'static> {
        ContainerPlan {
            flavor,
            image_id: "sha256:abc",
            workdir: Path::new("/run/airlock-docker/j/work"),
            out_dir: None,
            runtime: Some("runc"),
            boot_id: "boot",
            seccomp_profile: "{}",
            empty_file: Path::new("/run/airlock-docker/j/empty"),
            trust_bundle: None,
            nproc_ceiling: Some(32768),
            proxy_port: None,
            cgroup_parent: None,
            sandbox: "job-1",
            warm_argv: None,
        }
    }

    #[test]
    fn the_reference_shape() {
        let job = job(&Policy::builtin());
        let body = container_body(&job, &plan(Flavor::Docker));
        let host = body.host_config.clone().unwrap();
        assert_eq!(body.image.as_deref(), Some("sha256:abc"));
        assert_eq!(body.user.as_deref(), Some("65534:65534"));
        assert_eq!(body.working_dir.as_deref(), Some("/work"));
        assert_eq!(body.network_disabled, Some(true));
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(host.readonly_rootfs, Some(true));
        assert_eq!(
            host.tmpfs.unwrap()["/tmp"],
            "rw,noexec,nosuid,nodev,size=16777216"
        );
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_owned()]));
        assert_eq!(
            host.security_opt,
            Some(vec![
                "no-new-privileges".to_owned(),
                "seccomp={}".to_owned()
            ])
        );
        assert_eq!(host.memory, Some(256 << 20));
        assert_eq!(host.memory_swap, host.memory, "no swap");
        assert_eq!(host.nano_cpus, Some(500_000_000));
        assert_eq!(host.pids_limit, Some(64));
        assert_eq!(
            host.binds,
            Some(vec!["/run/airlock-docker/j/work:/work:ro".to_owned()])
        );
        assert_eq!(host.privileged, Some(false));
        assert_eq!(host.runtime.as_deref(), Some("runc"));
        let ulimits: Vec<(String, i64)> = host
            .ulimits
            .unwrap()
            .into_iter()
            .map(|u| (u.name.unwrap(), u.hard.unwrap()))
            .collect();
        assert_eq!(
            ulimits,
            vec![
                ("nofile".to_owned(), 256),
                ("fsize".to_owned(), 64 << 20),
                ("core".to_owned(), 1)
            ]
        );
        assert_eq!(host.mounts, None, "no mount but /work");
        assert_eq!(body.open_stdin, Some(false));
        let labels = body.labels.unwrap();
        assert_eq!(labels[LABEL_MANAGED], "true");
        assert_eq!(labels[LABEL_JOB], "job-1");
        assert!(!labels.contains_key(LABEL_WARM));
        assert_eq!(host.cpu_shares, None, "the kernel's default share");
    }

    /// A warm container is the cold container's body but for what makes it wait: the
    /// bootstrap as its program (after the same `env -i` and environment), stdin attached,
    /// the lowest CPU share, and its label.
    #[test]
    fn a_warm_container_differs_from_a_cold_one_only_in_how_it_waits() {
        let job = job(&Policy::builtin());
        let warm_argv: Vec<String> = ["python3", "-B", "-E", "-s", "-u", "-c", "BOOTSTRAP"]
            .map(String::from)
            .to_vec();
        for flavor in [Flavor::Docker, Flavor::Gvisor, Flavor::Podman] {
            let cold = serde_json::to_value(container_body(&job, &plan(flavor))).unwrap();
            let mut warm_plan = plan(flavor);
            warm_plan.warm_argv = Some(&warm_argv);
            let mut warm = serde_json::to_value(container_body(&job, &warm_plan)).unwrap();
            let entrypoint = warm["Entrypoint"].as_array().unwrap().clone();
            let cold_entrypoint = cold["Entrypoint"].as_array().unwrap();
            let env_end = cold_entrypoint.len() - job.argv.len();
            assert_eq!(
                entrypoint[..env_end],
                cold_entrypoint[..env_end],
                "{flavor}"
            );
            assert_eq!(
                entrypoint[env_end..],
                warm_argv
                    .iter()
                    .map(|a| serde_json::json!(a))
                    .collect::<Vec<_>>()[..]
            );
            assert_eq!(warm["HostConfig"]["CpuShares"], WARM_CPU_SHARES);
            assert_eq!(warm["Labels"][LABEL_WARM], "true");
            for (key, value) in [
                ("AttachStdin", true),
                ("OpenStdin", true),
                ("StdinOnce", true),
            ] {
                assert_eq!(warm[key], value, "{key}");
                assert_eq!(cold[key], false, "{key}");
            }
            // Everything else is the cold container's, field by field.
            warm["Entrypoint"] = cold["Entrypoint"].clone();
            assert_eq!(cold["HostConfig"].get("CpuShares"), None);
            warm["HostConfig"]
                .as_object_mut()
                .unwrap()
                .remove("CpuShares");
            warm["Labels"].as_object_mut().unwrap().remove(LABEL_WARM);
            for key in ["AttachStdin", "OpenStdin", "StdinOnce"] {
                warm[key] = cold[key].clone();
            }
            assert_eq!(warm, cold, "{flavor}");
        }
    }

    #[test]
    fn env_is_exactly_the_jobs() {
        let job = job(&Policy::builtin());
        let cmd = command(&job, None);
        assert_eq!(
            cmd,
            vec![
                "/usr/bin/env",
                "-i",
                "HOME=/tmp",
                "LANG=C.UTF-8",
                "PATH=/usr/local/bin:/usr/bin:/bin",
                "PYTHONDONTWRITEBYTECODE=1",
                "python3",
                "-B",
                "-E",
                "-s",
                "-u",
                "/work/.airlock-main.py"
            ]
        );
    }

    #[test]
    fn rw_workdir_out_and_stdin() {
        let mut policy = Policy::builtin();
        policy.filesystem.workdir = WorkdirMode::Rw;
        let mut job = job(&policy);
        job.stdin = Some(b"x".to_vec());
        let mut plan = plan(Flavor::Podman);
        plan.out_dir = Some(Path::new("/run/airlock-docker/j/out"));
        plan.runtime = None;
        let body = container_body(&job, &plan);
        let host = body.host_config.unwrap();
        assert_eq!(
            host.binds,
            Some(vec![
                "/run/airlock-docker/j/work:/work:rw".to_owned(),
                "/run/airlock-docker/j/out:/out:rw".to_owned()
            ])
        );
        assert_eq!(host.runtime, None);
        assert_eq!(body.open_stdin, Some(true));
        assert_eq!(body.stdin_once, Some(true));
    }

    #[test]
    fn gvisor_limits_tasks_inside_the_sandbox() {
        let job = job(&Policy::builtin());
        let body = container_body(&job, &plan(Flavor::Gvisor));
        let host = body.host_config.unwrap();
        let nproc = host
            .ulimits
            .unwrap()
            .into_iter()
            .find(|u| u.name.as_deref() == Some("nproc"))
            .unwrap();
        assert_eq!((nproc.soft, nproc.hard), (Some(64), Some(64)));
        assert_eq!(host.pids_limit, Some(64 * 16 + 256));
    }

    #[test]
    fn gvisor_hides_its_fuse_and_tun_devices() {
        let job = job(&Policy::builtin());
        let host = container_body(&job, &plan(Flavor::Gvisor))
            .host_config
            .unwrap();
        assert_eq!(
            host.binds.unwrap(),
            vec![
                "/run/airlock-docker/j/work:/work:ro".to_owned(),
                "/run/airlock-docker/j/empty:/dev/fuse:ro".to_owned()
            ]
        );
        assert_eq!(host.tmpfs.unwrap()["/dev/net"], EMPTY_TMPFS);
        // runc and crun build /dev from the spec's device list, which has neither.
        for flavor in [Flavor::Docker, Flavor::Podman] {
            let host = container_body(&job, &plan(flavor)).host_config.unwrap();
            assert!(!host.binds.unwrap().iter().any(|b| b.contains("/dev/")));
            assert!(!host.tmpfs.unwrap().contains_key("/dev/net"));
        }
    }

    #[test]
    fn the_jobs_ca_bundle_is_bound_read_only_where_its_variables_point() {
        let job = job(&Policy::builtin());
        let mut p = plan(Flavor::Podman);
        p.trust_bundle = Some(Path::new("/run/airlock-docker/j/trust-bundle.pem"));
        let binds = container_body(&job, &p).host_config.unwrap().binds.unwrap();
        assert!(
            binds.contains(
                &"/run/airlock-docker/j/trust-bundle.pem:/etc/ssl/certs/ca-certificates.crt:ro"
                    .to_owned()
            ),
            "{binds:?}"
        );
    }

    #[test]
    fn proxy_mode_gates_the_program_and_points_it_at_the_proxy() {
        let job = job(&Policy::builtin());
        let cmd = command(&job, Some(3128));
        assert_eq!(&cmd[..4], PROXY_GATE);
        assert_eq!(cmd[4], ENV_WRAPPER);
        assert!(cmd.contains(&"HTTPS_PROXY=http://127.0.0.1:3128".to_owned()));
        assert!(cmd.contains(&"NO_PROXY=localhost,127.0.0.1,::1".to_owned()));
        let mut p = plan(Flavor::Docker);
        p.proxy_port = Some(3128);
        let body = container_body(&job, &p);
        // The gate's line arrives on stdin, so stdin is attached even without job input.
        assert_eq!(body.open_stdin, Some(true));
        assert_eq!(
            body.host_config.unwrap().network_mode.as_deref(),
            Some("none")
        );
    }
}
