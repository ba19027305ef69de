//! `airlock doctor` for the native backend: what this host can enforce, control by control,
//! each missing piece with the reason and the fix.

use std::fs;
use std::path::Path;

use airlock_cgroup::{Hierarchy, ParentSpec, Presence};
use airlock_core::doctor::Check;
use airlock_core::policy::{CgroupParent, Policy, RootfsSpec};

fn read_trimmed(path: &str) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

/// Checks everything that does not need to start a sandbox.
pub fn diagnose(policy: &Policy) -> Vec<Check> {
    let mut report = Vec::new();
    let root = rustix::process::geteuid().is_root();

    let uname = rustix::system::uname();
    report.push(Check::ok(
        "kernel",
        format!(
            "Linux {} ({})",
            uname.release().to_string_lossy(),
            uname.machine().to_string_lossy()
        ),
    ));

    let missing_ns: Vec<&str> = ["user", "mnt", "pid", "net", "ipc", "uts", "cgroup"]
        .into_iter()
        .filter(|ns| !Path::new("/proc/self/ns").join(ns).exists())
        .collect();
    if missing_ns.is_empty() {
        report.push(Check::ok(
            "namespaces",
            "user, mount, pid, network, ipc, uts and cgroup namespaces are available",
        ));
    } else {
        report.push(Check::missing(
            "namespaces",
            format!("this kernel lacks: {}", missing_ns.join(", ")),
            "use a kernel built with CONFIG_USER_NS, CONFIG_PID_NS, CONFIG_NET_NS, \
             CONFIG_IPC_NS, CONFIG_UTS_NS and CONFIG_CGROUPS",
        ));
    }

    report.push(user_namespace_check(root));
    for check in cgroup_checks(policy) {
        report.push(check);
    }

    match airlock_seccomp::CompiledSeccomp::builtin() {
        Ok(_)
            if fs::read_to_string("/proc/self/status")
                .is_ok_and(|s| s.lines().any(|l| l.starts_with("Seccomp:"))) =>
        {
            report.push(Check::ok(
                "seccomp",
                "seccomp-bpf available; the allowlist and denylist filters compile",
            ));
        }
        Ok(_) => report.push(Check::missing(
            "seccomp",
            "the kernel does not report seccomp support",
            "use a kernel built with CONFIG_SECCOMP_FILTER",
        )),
        Err(e) => report.push(Check::missing(
            "seccomp",
            format!("the seccomp policy does not compile: {e}"),
            "this is a bug in airlock's policy/seccomp.json",
        )),
    }

    report.push(id_mapping_check(policy, root));
    report.push(per_user_budget_check(root));
    report.push(oom_score_check());
    report.push(memfd_exec_check(root));
    report.push(sandbox_init_check());

    let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    match nofile.maximum {
        Some(hard) if hard < u64::from(policy.limits.open_files) => report.push(Check::missing(
            "rlimits",
            format!(
                "airlock's hard open-files limit is {hard}, below the policy's open_files {}",
                policy.limits.open_files
            ),
            "raise `ulimit -Hn` before starting airlock (needs CAP_SYS_RESOURCE) or lower open_files",
        )),
        _ => report.push(Check::ok(
            "rlimits",
            format!(
                "open files {}, file size {}, core dumps off, CPU-time backstop",
                policy.limits.open_files, policy.limits.file_size
            ),
        )),
    }

    for check in rootfs_checks(policy) {
        report.push(check);
    }
    report
}

fn user_namespace_check(root: bool) -> Check {
    let max = read_trimmed("/proc/sys/user/max_user_namespaces")
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    if max == 0 {
        return Check::missing(
            "user namespaces",
            "user.max_user_namespaces is 0",
            "sysctl -w user.max_user_namespaces=15000",
        );
    }
    if !root {
        if read_trimmed("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
            return Check::missing(
                "user namespaces",
                "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone=0)",
                "sysctl -w kernel.unprivileged_userns_clone=1, or run airlock as root",
            );
        }
        if read_trimmed("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref()
            == Some("1")
        {
            return Check::missing(
                "user namespaces",
                "AppArmor restricts unprivileged user namespaces (Ubuntu 23.10+)",
                "add an AppArmor profile granting `userns` to the airlock binary, or \
                 sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or run as root",
            );
        }
    }
    Check::ok(
        "user namespaces",
        format!("user.max_user_namespaces = {max}"),
    )
}

/// What makes job cgroups possible for a user who cannot create them, on the host's
/// cgroup version (`None`: not known): delegation by systemd exists only on v2, while on v1
/// root must make a group in each controller's hierarchy and hand it over.
pub(crate) fn cgroup_fix(version: Option<airlock_cgroup::CgroupVersion>) -> String {
    const DEGRADED: &str = "or accept rlimits instead with [native] allow_degraded = [\"cgroup\"]";
    const V1: &str = "run as root; or, on this cgroup v1 host, have root create a group in \
        each of the memory, pids, cpu and cpuacct hierarchies, chown it (and its cgroup.procs \
        and tasks) to you, and name it with [native] cgroup_parent (systemd's Delegate=yes does \
        not delegate v1 controllers)";
    const V2: &str = "run as root, or inside a delegated cgroup v2 subtree \
        (systemd-run --user --scope -p Delegate=yes airlock ...), or set [native] cgroup_parent \
        to a delegated group";
    match version {
        Some(airlock_cgroup::CgroupVersion::V1) => format!("{V1}, {DEGRADED}"),
        Some(airlock_cgroup::CgroupVersion::V2) => format!("{V2}, {DEGRADED}"),
        None => format!("{V2}; {V1}; {DEGRADED}"),
    }
}

fn cgroup_checks(policy: &Policy) -> Vec<Check> {
    let hierarchy = match Hierarchy::detect() {
        Ok(h) => h,
        Err(e) => {
            return vec![Check::missing(
                "cgroup",
                format!("no usable cgroup filesystem: {e}"),
                "mount cgroup2 at /sys/fs/cgroup (or the v1 memory, cpu, cpuacct and pids hierarchies)",
            )];
        }
    };
    let spec = match &policy.native.cgroup_parent {
        CgroupParent::Auto => ParentSpec::Auto,
        CgroupParent::Path(p) => ParentSpec::Path(p.clone()),
    };
    let r = hierarchy.report_for(&spec);
    let version = match r.version {
        airlock_cgroup::CgroupVersion::V1 => "v1",
        airlock_cgroup::CgroupVersion::V2 => "v2",
    };
    let mut checks = Vec::new();
    for c in r.controllers.iter() {
        let name = format!("cgroup {version} {}", c.name);
        let place = c
            .location
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        checks.push(match c.presence {
            Presence::Present => Check::ok(&name, place),
            Presence::Missing | Presence::Unknown => Check::missing(
                &name,
                c.explanation
                    .clone()
                    .unwrap_or_else(|| "not available".into()),
                "enable the controller (v2: add it to cgroup.subtree_control of the parent; \
                 v1: mount its hierarchy)",
            ),
        });
    }
    let swap_fix = match r.version {
        airlock_cgroup::CgroupVersion::V1 => "boot with swapaccount=1, or run without swap",
        airlock_cgroup::CgroupVersion::V2 => {
            "enable the memory controller for airlock's cgroup parent (memory.swap.max lives there)"
        }
    };
    checks.push(match r.swap_accounting.presence {
        Presence::Present => Check::ok(
            &format!("cgroup {version} swap limit"),
            "swap accounting present: jobs get no swap",
        ),
        Presence::Unknown => Check::warning(
            &format!("cgroup {version} swap limit"),
            r.swap_accounting
                .explanation
                .clone()
                .unwrap_or_else(|| "not known until airlock's cgroup parent exists".into()),
            swap_fix,
        ),
        Presence::Missing => {
            let why = r
                .swap_accounting
                .explanation
                .clone()
                .unwrap_or_else(|| "swap accounting is off".into());
            let name = format!("cgroup {version} swap limit");
            match crate::backend::swap_gap(false) {
                // No swap on this host: the memory limit is the whole bound.
                None => Check::ok(&name, format!("{why}; but this host has no swap enabled")),
                Some(gap)
                    if policy
                        .native
                        .allow_degraded
                        .contains(&airlock_core::policy::DegradedControl::Swap) =>
                {
                    Check::warning(
                        &name,
                        format!("{gap}; the policy accepts it (every observation lists this)"),
                        swap_fix,
                    )
                }
                Some(gap) => Check::missing(
                    &name,
                    format!("{gap}: jobs are refused"),
                    format!("{swap_fix}; or swapoff -a; or [native] allow_degraded = [\"swap\"]"),
                ),
            }
        }
    });
    let tcp_name = format!("cgroup {version} tcp memory");
    checks.push(match r.tcp_accounting.presence {
        Presence::Present => Check::ok(
            &tcp_name,
            match r.version {
                airlock_cgroup::CgroupVersion::V1 => {
                    "memory.kmem.tcp.limit_in_bytes: each job's TCP buffers are limited to its \
                     memory limit"
                }
                airlock_cgroup::CgroupVersion::V2 => {
                    "socket buffers are charged to each job's memory.current"
                }
            },
        ),
        Presence::Unknown => Check::warning(
            &tcp_name,
            r.tcp_accounting
                .explanation
                .clone()
                .unwrap_or_else(|| "not known until airlock's cgroup parent exists".into()),
            "none needed if the kernel has memory.kmem.tcp.* (v1) or socket accounting (v2)",
        ),
        Presence::Missing => Check::missing(
            &tcp_name,
            format!(
                "{}: jobs are refused",
                r.tcp_accounting
                    .explanation
                    .clone()
                    .unwrap_or_else(|| "no TCP accounting".into())
            ),
            "boot without cgroup.memory=nosocket (and, on v1, with CONFIG_MEMCG_KMEM), or use cgroup v2",
        ),
    });
    checks.push(if r.parent.writable {
        Check::ok(
            "cgroup parent",
            r.parent
                .paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        )
    } else {
        let why = r
            .parent
            .explanation
            .clone()
            .unwrap_or_else(|| "airlock cannot create job cgroups".into());
        let fix = cgroup_fix(Some(r.version));
        if policy
            .native
            .allow_degraded
            .contains(&airlock_core::policy::DegradedControl::Cgroup)
        {
            Check::warning(
                "cgroup parent",
                format!(
                    "{why}; the policy accepts the degraded shape: memory and pids as rlimits, \
                     no CPU share (every observation lists this)"
                ),
                fix,
            )
        } else {
            Check::missing("cgroup parent", why, fix)
        }
    });
    checks
}

/// Who the job's per-user kernel counts (inotify instances, message queue bytes, queued
/// signals, namespaces) are charged to, and the limits inside its user namespace.
fn per_user_budget_check(root: bool) -> Check {
    let limits: Vec<String> = crate::plan::USER_NAMESPACE_LIMITS
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    let owner = if root {
        "each job's user namespace is owned by its own unused host uid of the mapped range, \
         so host root's per-user counts are not charged"
    } else {
        "jobs' user namespaces are owned by your uid, which their per-user counts are charged \
         to besides"
    };
    Check::ok(
        "per-user budgets",
        format!(
            "{owner}; in the namespace: {}; RLIMIT_MSGQUEUE {} bytes, RLIMIT_SIGPENDING {}",
            limits.join(", "),
            crate::plan::MSGQUEUE_RLIMIT_BYTES,
            crate::plan::SIGPENDING_RLIMIT
        ),
    )
}

/// Whether code a job writes to a memfd can be executed.
fn memfd_exec_check(root: bool) -> Check {
    let fix = "run airlock as root on Linux 6.3 or later";
    match (root, crate::backend::memfd_noexec_available()) {
        (true, true) => Check::ok(
            "memfd exec",
            "each job's pid namespace gets vm.memfd_noexec = 2: no memfd can be executed",
        ),
        (true, false) => Check::warning(
            "memfd exec",
            "this kernel has no vm.memfd_noexec (Linux 6.3+): a job can execute code it \
             wrote to a memfd (docs/native.md)",
            fix,
        ),
        (false, _) => Check::warning(
            "memfd exec",
            "rootless: vm.memfd_noexec can be set only by host uid 0, so a job can execute \
             code it wrote to a memfd (docs/native.md)",
            fix,
        ),
    }
}

/// Which executable builds each sandbox: the small static init from a memfd, or airlock
/// itself where memfds cannot be executed (slower; the same sandbox either way).
fn sandbox_init_check() -> Check {
    let airlock = crate::backend::current_exe().unwrap_or_else(|_| "airlock".into());
    Check::ok(
        "sandbox init",
        crate::init_program::InitProgram::new(airlock).describe(),
    )
}

/// Whether the job's OOM score can be pinned (its minimum set, not only its value).
fn oom_score_check() -> Check {
    let pinned = rustix::thread::capabilities(None).is_ok_and(|caps| {
        caps.effective
            .contains(rustix::thread::CapabilitySet::SYS_RESOURCE)
    });
    if pinned {
        Check::ok(
            "oom score",
            "jobs run at oom_score_adj 1000, pinned as their minimum (CAP_SYS_RESOURCE): a job \
             cannot lower it",
        )
    } else {
        Check::warning(
            "oom score",
            "airlock lacks CAP_SYS_RESOURCE: jobs start at oom_score_adj 1000 but can lower it \
             back to 0 (the memory limit still holds; only the OOM killer's choice between a \
             job and other processes of its cgroup is affected)",
            "run airlock with CAP_SYS_RESOURCE (root outside a container has it)",
        )
    }
}

fn id_mapping_check(policy: &Policy, root: bool) -> Check {
    if !root {
        return Check::ok(
            "uid mapping",
            "rootless: only your own uid and gid exist in the sandbox, as 65534",
        );
    }
    let base = u64::from(policy.native.host_uid_base);
    let end = base + u64::from(airlock_core::policy::NativePolicy::MAPPED_IDS);
    let mut clashes = Vec::new();
    for (file, field) in [("/etc/passwd", 2usize), ("/etc/group", 2usize)] {
        if let Ok(text) = fs::read_to_string(file) {
            for line in text.lines() {
                let parts: Vec<&str> = line.split(':').collect();
                if let Some(id) = parts.get(field).and_then(|s| s.parse::<u64>().ok())
                    && (base..end).contains(&id)
                {
                    clashes.push(format!("{file}: {}", parts[0]));
                }
            }
        }
    }
    for file in ["/etc/subuid", "/etc/subgid"] {
        if let Ok(text) = fs::read_to_string(file) {
            for line in text.lines() {
                let parts: Vec<&str> = line.split(':').collect();
                if let (Some(start), Some(count)) = (
                    parts.get(1).and_then(|s| s.parse::<u64>().ok()),
                    parts.get(2).and_then(|s| s.parse::<u64>().ok()),
                ) && start < end
                    && base < start + count
                {
                    clashes.push(format!("{file}: {line}"));
                }
            }
        }
    }
    if clashes.is_empty() {
        Check::ok(
            "uid mapping",
            format!(
                "sandbox ids 0..65535 map to unused host ids {base}..{}; the job runs as host uid {}",
                end - 1,
                base + 65_534
            ),
        )
    } else {
        Check::missing(
            "uid mapping",
            format!(
                "host ids {base}..{} are in use: {}",
                end - 1,
                clashes.join("; ")
            ),
            "set [native] host_uid_base to an unused range",
        )
    }
}

fn rootfs_checks(policy: &Policy) -> Vec<Check> {
    let root = match &policy.filesystem.rootfs {
        RootfsSpec::Host | RootfsSpec::HostFull => Path::new("/").to_owned(),
        RootfsSpec::Dir(p) => p.clone(),
        RootfsSpec::Image { reference, digest } => match image_checks(policy, reference, digest) {
            Ok((tree, checks)) => {
                let mut all = checks;
                all.extend(language_checks(policy, &tree));
                return all;
            }
            Err(check) => return vec![check],
        },
    };
    let mut checks = Vec::new();
    if !root.join("usr").is_dir() {
        checks.push(Check::missing(
            "rootfs",
            format!("{} has no usr/ directory", root.display()),
            "point rootfs at a complete root filesystem (e.g. made by debootstrap)",
        ));
        return checks;
    }
    checks.push(Check::ok(
        "rootfs",
        format!("{} (read-only)", policy.filesystem.rootfs),
    ));
    checks.extend(language_checks(policy, &root));
    checks.extend(host_root_check(policy));
    if matches!(policy.filesystem.rootfs, RootfsSpec::Host) {
        let cache = crate::minimal_root::cache_dir();
        let (bytes, copies) = crate::minimal_root::cache_usage(&cache);
        checks.push(Check::ok(
            "root cache",
            format!(
                "{copies} prepared minimal root(s), {} MiB under {} (one per root shape, \
                 plus any a running sandbox still mounts)",
                bytes >> 20,
                cache.join("roots").display()
            ),
        ));
    }
    checks
}

/// What the host rootfs kinds show the job: the minimal root's content (nothing is
/// copied here), or a warning that `host-full` shows every program of the host.
fn host_root_check(policy: &Policy) -> Option<Check> {
    use crate::minimal_root::{self, MinimalRootSpec, ProgramState, RootData};
    match policy.filesystem.rootfs {
        RootfsSpec::Host | RootfsSpec::HostFull if !minimal_root::overlayfs_available() => {
            Some(Check::missing(
                "host root",
                "this kernel has no overlayfs (/proc/filesystems): every job would be refused",
                "load it as root (modprobe overlay), or use rootfs = \"dir:...\" or \"image:...\"",
            ))
        }
        RootfsSpec::HostFull => Some(Check::warning(
            "host root",
            "rootfs = \"host-full\" shows jobs every program installed on the host \
             (compilers, ssh, curl, git, cloud and container tools), each surface a job does \
             not need",
            "use rootfs = \"host\" (the minimal root: the languages' interpreters, their \
             standard libraries and a few utilities) and name package directories jobs \
             import in [filesystem] site_packages",
        )),
        RootfsSpec::Host => {
            let spec = MinimalRootSpec::from_policy(policy);
            let collected = RootData::builtin()
                .map_err(std::io::Error::other)
                .and_then(|data| minimal_root::collect(&spec, &data));
            Some(match collected {
                Err(e) => Check::missing(
                    "host root",
                    format!("the minimal root cannot be assembled: {e}"),
                    "check the languages' interpreters and [filesystem] site_packages",
                ),
                Ok(c) => {
                    let broken: Vec<String> = c
                        .programs
                        .iter()
                        .filter_map(|(p, s)| match s {
                            ProgramState::Broken { reason } => Some(format!("{p}: {reason}")),
                            _ => None,
                        })
                        .collect();
                    if broken.is_empty() {
                        Check::ok(
                            "host root",
                            format!(
                                "minimal: {} host paths for {}, copied once into {}{}",
                                c.paths().count(),
                                spec.programs.join(", "),
                                minimal_root::cache_dir().display(),
                                if c.missing_utilities.is_empty() {
                                    String::new()
                                } else {
                                    format!(
                                        "; utilities this host lacks: {}",
                                        c.missing_utilities.join(", ")
                                    )
                                }
                            ),
                        )
                    } else {
                        Check::warning(
                            "host root",
                            format!("broken interpreters: {}", broken.join("; ")),
                            "reinstall them, or remove their [languages] entries",
                        )
                    }
                }
            })
        }
        RootfsSpec::Dir(_) | RootfsSpec::Image { .. } => None,
    }
}

/// The image a policy pins: in the store, unpacked (unpacking it now if needed), and
/// made within `[images] rebuild_age_days` (older is a warning: rebuild it).
fn image_checks(
    policy: &Policy,
    reference: &str,
    digest: &str,
) -> Result<(std::path::PathBuf, Vec<Check>), Check> {
    let store_dir = airlock_oci::store::store_dir(&policy.images);
    let spec = format!("image:{reference}@{digest}");
    let fix = format!(
        "add it to the store {}: airlock image build SPEC, airlock image import ARCHIVE or \
         airlock image pull REF@{digest}",
        store_dir.display()
    );
    let store = airlock_oci::ImageStore::open_existing(&store_dir)
        .map_err(|e| Check::missing("rootfs", format!("{spec}: {e}"), fix.clone()))?;
    let record = store
        .resolve(digest)
        .map_err(|e| Check::missing("rootfs", format!("{spec}: {e}"), fix.clone()))?;
    let tree = airlock_oci::store::rootfs_for_job(&store_dir, reference, digest).map_err(|e| {
        Check::missing(
            "rootfs",
            format!("{spec}: cannot unpack: {e}"),
            "rebuild or re-import the image; airlock refuses images with setuid files, \
                 device nodes or paths leaving the tree",
        )
    })?;
    let mut checks = vec![Check::ok(
        "rootfs",
        format!(
            "{spec} (image id {}, {} layer(s), read-only from {})",
            record.id,
            record.layers.len(),
            tree.display()
        ),
    )];
    let age = record.age(std::time::SystemTime::now());
    let age_days = age.as_secs() / 86_400;
    let made = airlock_oci::store::format_rfc3339(record.made_unix_secs());
    let max_days = u64::from(policy.images.rebuild_age_days);
    checks.push(if age_days >= max_days {
        Check::warning(
            "image age",
            format!("{spec} was made {made}, {age_days} days ago: older than the policy's rebuild age of {max_days} days"),
            "rebuild it (airlock image build SPEC) to pick up security updates, and pin the new digest",
        )
    } else {
        Check::ok(
            "image age",
            format!("made {made}, {age_days} days ago (rebuild age {max_days} days)"),
        )
    });
    Ok((tree, checks))
}

fn language_checks(policy: &Policy, root: &Path) -> Vec<Check> {
    let mut checks = Vec::new();
    for (name, spec) in &policy.languages {
        let program = &spec.command[0];
        let found = if program.contains('/') {
            root.join(program.trim_start_matches('/')).exists()
        } else {
            ["usr/local/bin", "usr/bin", "bin"]
                .iter()
                .any(|dir| root.join(dir).join(program).exists())
        };
        checks.push(if found {
            Check::ok(&format!("language {name}"), format!("{program} found"))
        } else {
            Check::warning(
                &format!("language {name}"),
                format!("{program} is not in the rootfs: {name} jobs will be refused"),
                format!("install {program} in the rootfs, or remove [languages.{name}]"),
            )
        });
    }
    checks
}
