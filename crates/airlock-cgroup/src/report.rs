//! What `airlock doctor` says about cgroups: each needed piece, present or not, where, and
//! why not. Reading only: nothing is created or moved.

use std::fmt;
use std::path::{Path, PathBuf};

use rustix::fs::{Access, access};

use crate::hierarchy::{UnifiedMount, V1_CONTROLLERS, V2_CONTROLLERS};
use crate::manager::GroupDir;
use crate::{CgroupVersion, Hierarchy, ParentSpec, v1, v2};

/// Whether a piece is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Presence {
    /// Found.
    Present,
    /// Not found; see the explanation.
    Missing,
    /// Cannot be told yet; see the explanation.
    Unknown,
}

/// One line of the report: what the probe found of one cgroup feature (the native
/// backend's doctor turns these into its checks, `airlock_core::doctor::Check`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    /// What was checked (`memory`, `swap accounting`, `cgroup.kill`, ...).
    pub name: &'static str,
    /// The outcome.
    pub presence: Presence,
    /// Where it was found or looked for.
    pub location: Option<PathBuf>,
    /// What it means when not simply present, in words an operator can act on.
    pub explanation: Option<String>,
}

/// The parent of the job groups.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ParentCheck {
    /// The parent directories that would be used (empty when none can be chosen).
    pub paths: Vec<PathBuf>,
    /// Whether this process can create them or groups in them.
    pub writable: bool,
    /// Why not, or what `CgroupManager::new` will do first.
    pub explanation: Option<String>,
}

/// The cgroup part of `airlock doctor`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HierarchyReport {
    /// The interface the job groups would use.
    pub version: CgroupVersion,
    /// memory, cpu, cpuacct (v1) or cpu.stat (v2), pids.
    pub controllers: Vec<Finding>,
    /// `memory.memsw.*` (v1) or `memory.swap.max` (v2): without it swap is not capped.
    pub swap_accounting: Finding,
    /// TCP socket buffers charged to the job: `memory.kmem.tcp.limit_in_bytes` (v1), socket
    /// accounting not turned off on the kernel command line (v2). Without it a job's socket
    /// buffers escape its memory limit; the native backend refuses such a host.
    pub tcp_accounting: Finding,
    /// `cgroup.kill` (v2, Linux 5.14+); otherwise the pidfd sweep kills.
    pub cgroup_kill: Finding,
    /// Peak memory: `memory.max_usage_in_bytes` (v1) or `memory.peak` (v2, Linux 5.19+).
    pub memory_peak: Finding,
    /// The parent [`ParentSpec::Auto`] (or the given spec) resolves to.
    pub parent: ParentCheck,
}

impl HierarchyReport {
    /// Whether job groups can be created with every limit: all controllers present and the
    /// parent writable. Swap accounting is reported but not required here: the policy decides.
    pub fn ready(&self) -> bool {
        self.controllers
            .iter()
            .all(|c| c.presence == Presence::Present)
            && self.parent.writable
    }
}

impl Hierarchy {
    /// The report for [`ParentSpec::Auto`].
    pub fn report(&self) -> HierarchyReport {
        self.report_for(&ParentSpec::Auto)
    }

    /// The report for a given parent spec.
    pub fn report_for(&self, spec: &ParentSpec) -> HierarchyReport {
        let version = self.version();
        let mut note = None;
        let planned: Result<Vec<GroupDir>, String> = match version {
            CgroupVersion::V1 => v1::plan_parents(self, spec).map_err(|e| e.to_string()),
            CgroupVersion::V2 => v2::plan_parent(self, spec, std::process::id())
                .map(|p| {
                    note = p
                        .move_self_to
                        .map(|s| format!("airlock will first move itself into {}", s.display()));
                    vec![p.parent]
                })
                .map_err(|e| e.to_string()),
        };
        let parent = match &planned {
            Ok(dirs) => {
                let mut check = parent_check(dirs);
                if check.explanation.is_none() {
                    check.explanation = note;
                }
                check
            }
            Err(e) => ParentCheck {
                paths: Vec::new(),
                writable: false,
                explanation: Some(e.clone()),
            },
        };
        let parents = planned.unwrap_or_default();
        match version {
            CgroupVersion::V1 => self.report_v1(&parents, parent),
            CgroupVersion::V2 => self.report_v2(&parents, parent),
        }
    }

    fn report_v1(&self, parents: &[GroupDir], parent: ParentCheck) -> HierarchyReport {
        let controllers = V1_CONTROLLERS
            .into_iter()
            .map(|c| match self.v1_mount(c) {
                Some(m) => present(c, m.mount_point.clone()),
                None => Finding {
                    name: c,
                    presence: Presence::Missing,
                    location: None,
                    explanation: Some(format!(
                        "no cgroup v1 hierarchy with {c} is mounted \
                         (e.g. `mount -t cgroup -o {c} cgroup /sys/fs/cgroup/{c}`)"
                    )),
                },
            })
            .collect();
        let memory_dir = parents
            .iter()
            .find(|p| p.serves("memory"))
            .map(|p| p.dir.clone())
            .filter(|d| d.exists())
            .or_else(|| self.v1_mount("memory").and_then(|m| m.own_dir()));
        let swap_accounting = probe(
            "swap accounting",
            memory_dir.as_deref(),
            v1::MEMSW_LIMIT,
            "no memory.memsw.* files: the kernel runs without swap accounting (boot with \
             swapaccount=1); jobs get swappiness 0 but their swap use is not capped",
        );
        let tcp_accounting = probe(
            "tcp accounting",
            memory_dir.as_deref(),
            v1::TCP_LIMIT,
            "no memory.kmem.tcp.limit_in_bytes: this kernel does not charge TCP buffers to v1              memory cgroups (CONFIG_MEMCG_KMEM off, or booted with cgroup.memory=nosocket), so              a job's socket buffers would escape its memory limit",
        );
        let memory_peak = probe(
            "memory peak",
            memory_dir.as_deref(),
            "memory.max_usage_in_bytes",
            "no memory.max_usage_in_bytes: peak memory is not reported",
        );
        HierarchyReport {
            version: CgroupVersion::V1,
            controllers,
            swap_accounting,
            tcp_accounting,
            cgroup_kill: Finding {
                name: "cgroup.kill",
                presence: Presence::Missing,
                location: None,
                explanation: Some(
                    "cgroup v1 has no cgroup.kill: jobs are killed by a pidfd sweep".to_owned(),
                ),
            },
            memory_peak,
            parent,
        }
    }

    fn report_v2(&self, parents: &[GroupDir], parent: ParentCheck) -> HierarchyReport {
        let Some(u) = self.unified.as_ref() else {
            // version() is V2 only with a unified mount; keep the report total anyway.
            return self.report_v1(parents, parent);
        };
        let parent_dir = parents.first().map(|p| p.dir.as_path());
        let mut controllers: Vec<Finding> = V2_CONTROLLERS
            .into_iter()
            .map(|c| {
                if u.controllers.iter().any(|x| x == c) {
                    match parent_dir.and_then(|p| v2_not_delegated(&u.mount_point, p, c)) {
                        None => present(c, u.mount_point.clone()),
                        Some((control, explanation)) => Finding {
                            name: c,
                            presence: Presence::Missing,
                            location: Some(control),
                            explanation: Some(explanation),
                        },
                    }
                } else {
                    Finding {
                        name: c,
                        presence: Presence::Missing,
                        location: Some(u.mount_point.join("cgroup.controllers")),
                        explanation: Some(format!(
                            "{c} is not in cgroup.controllers: the kernel lacks it or a v1 \
                             hierarchy holds it"
                        )),
                    }
                }
            })
            .collect();
        controllers.push(present("cpu.stat", u.mount_point.clone()));
        let probe_dir = v2_probe_dir(u, parents);
        let kernel = kernel_release();
        HierarchyReport {
            version: CgroupVersion::V2,
            controllers,
            swap_accounting: probe(
                "swap accounting",
                probe_dir.as_deref(),
                v2::SWAP_MAX,
                "no memory.swap.max: the kernel runs without swap accounting; swap use is not \
                 capped",
            ),
            tcp_accounting: v2_tcp_accounting(
                &std::fs::read_to_string("/proc/cmdline").unwrap_or_default(),
            ),
            cgroup_kill: probe_or_kernel(
                "cgroup.kill",
                probe_dir.as_deref(),
                kernel,
                (5, 14),
                "Linux before 5.14 has no cgroup.kill: jobs are killed by a pidfd sweep",
            ),
            memory_peak: probe_or_kernel(
                "memory.peak",
                probe_dir.as_deref(),
                kernel,
                (5, 19),
                "Linux before 5.19 has no memory.peak: peak memory is not reported",
            ),
            parent,
        }
    }
}

/// v2 charges socket buffers to `memory.current` unless the command line turns it off.
fn v2_tcp_accounting(cmdline: &str) -> Finding {
    let location = Some(PathBuf::from("/proc/cmdline"));
    if v2::socket_accounting_disabled(cmdline) {
        Finding {
            name: "tcp accounting",
            presence: Presence::Missing,
            location,
            explanation: Some(
                "the kernel was booted with cgroup.memory=nosocket: a job's socket buffers                  escape its memory limit"
                    .to_owned(),
            ),
        }
    } else {
        Finding {
            name: "tcp accounting",
            presence: Presence::Present,
            location,
            explanation: Some("socket buffers are part of memory.current".to_owned()),
        }
    }
}

/// Whether job groups under `parent` can get controller `c` from this process: every
/// existing cgroup from the mount root down to `parent` must enable it for its children
/// (`cgroup.subtree_control`) or let this process enable it. The kernel having it at the
/// root is not enough: a rootless airlock in a delegated subtree gets only what was
/// delegated. Returns the `cgroup.subtree_control` that stands in the way and why. Levels
/// without the file (a fake tree) are passed over.
fn v2_not_delegated(mount: &Path, parent: &Path, c: &str) -> Option<(PathBuf, String)> {
    let rel = parent.strip_prefix(mount).ok()?;
    let mut level = mount.to_path_buf();
    let mut levels = vec![level.clone()];
    for component in rel.components() {
        level.push(component);
        levels.push(level.clone());
    }
    for dir in levels.iter().take_while(|d| d.is_dir()) {
        let control = dir.join("cgroup.subtree_control");
        let Ok(enabled) = std::fs::read_to_string(&control) else {
            continue;
        };
        if enabled.split_whitespace().any(|e| e == c) {
            continue;
        }
        if access(&control, Access::WRITE_OK).is_err() {
            return Some((control, v2::not_delegated_reason(c)));
        }
    }
    None
}

/// A non-root cgroup with the memory controller enabled, to look for the optional files
/// in: the parent if it exists, else this process's own cgroup, else a child of the mount
/// root (a systemd slice or scope). A cgroup whose parent does not enable memory for it has
/// no `memory.*` files at all: looking there would report a kernel with swap accounting and
/// `memory.peak` as one without them.
fn v2_probe_dir(u: &UnifiedMount, parents: &[GroupDir]) -> Option<PathBuf> {
    let chosen = parents
        .first()
        .map(|p| p.dir.clone())
        .into_iter()
        .chain(u.own_dir().filter(|d| *d != u.mount_point))
        .find(|d| d.is_dir() && memory_enabled(d, true));
    if chosen.is_some() {
        return chosen;
    }
    let mut children: Vec<PathBuf> = std::fs::read_dir(&u.mount_point)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    children.sort();
    children.into_iter().find(|d| memory_enabled(d, false))
}

/// Whether `dir/cgroup.controllers` lists memory. The real cgroupfs always has the file; a
/// fake tree may not, and then `if_unknown` decides.
fn memory_enabled(dir: &Path, if_unknown: bool) -> bool {
    match std::fs::read_to_string(dir.join("cgroup.controllers")) {
        Ok(text) => text.split_whitespace().any(|c| c == "memory"),
        Err(_) => if_unknown,
    }
}

fn present(name: &'static str, location: PathBuf) -> Finding {
    Finding {
        name,
        presence: Presence::Present,
        location: Some(location),
        explanation: None,
    }
}

/// Looks for `file` in `dir`.
fn probe(name: &'static str, dir: Option<&Path>, file: &str, missing: &str) -> Finding {
    let Some(dir) = dir else {
        return Finding {
            name,
            presence: Presence::Unknown,
            location: None,
            explanation: Some(
                "no cgroup with the memory controller enabled exists to look in yet; known \
                 once the parent is created"
                    .to_owned(),
            ),
        };
    };
    let path = dir.join(file);
    if path.exists() {
        present(name, path)
    } else {
        Finding {
            name,
            presence: Presence::Missing,
            location: Some(path),
            explanation: Some(missing.to_owned()),
        }
    }
}

/// Like [`probe`] with `name` as the file, falling back to the kernel release when there is
/// no non-root cgroup to look in.
fn probe_or_kernel(
    name: &'static str,
    dir: Option<&Path>,
    kernel: Option<(u32, u32)>,
    since: (u32, u32),
    missing: &str,
) -> Finding {
    if dir.is_some() {
        return probe(name, dir, name, missing);
    }
    match kernel {
        Some(k) if k >= since => Finding {
            name,
            presence: Presence::Present,
            location: None,
            explanation: Some(format!("inferred from the kernel release {}.{}", k.0, k.1)),
        },
        Some(_) => Finding {
            name,
            presence: Presence::Missing,
            location: None,
            explanation: Some(missing.to_owned()),
        },
        None => probe(name, None, name, missing),
    }
}

/// `(major, minor)` of the running kernel.
fn kernel_release() -> Option<(u32, u32)> {
    let uname = rustix::system::uname();
    parse_release(&uname.release().to_string_lossy())
}

fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether each parent, or its nearest existing ancestor, is writable by this process.
fn parent_check(dirs: &[GroupDir]) -> ParentCheck {
    let mut not_writable = Vec::new();
    for d in dirs {
        let existing = d.dir.ancestors().find(|a| a.exists());
        let ok = existing.is_some_and(|e| access(e, Access::WRITE_OK).is_ok());
        if !ok {
            not_writable.push(existing.unwrap_or(&d.dir).display().to_string());
        }
    }
    ParentCheck {
        paths: dirs.iter().map(|d| d.dir.clone()).collect(),
        writable: not_writable.is_empty(),
        explanation: (!not_writable.is_empty()).then(|| {
            format!(
                "not writable by this process: {}; run airlock as root or delegate the cgroup \
                 to its user",
                not_writable.join(", ")
            )
        }),
    }
}

impl fmt::Display for HierarchyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let version = match self.version {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        };
        writeln!(f, "cgroup {version}")?;
        let checks = self.controllers.iter().chain([
            &self.swap_accounting,
            &self.tcp_accounting,
            &self.cgroup_kill,
            &self.memory_peak,
        ]);
        for c in checks {
            let presence = match c.presence {
                Presence::Present => "present",
                Presence::Missing => "MISSING",
                Presence::Unknown => "unknown",
            };
            write!(f, "  {:<16} {presence:<8}", c.name)?;
            if let Some(l) = &c.location {
                write!(f, " {}", l.display())?;
            }
            if let Some(e) = &c.explanation {
                write!(f, " ({e})")?;
            }
            writeln!(f)?;
        }
        let paths: Vec<String> = self
            .parent
            .paths
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let writable = if self.parent.writable {
            "writable"
        } else {
            "NOT WRITABLE"
        };
        write!(f, "  {:<16} {writable:<8} {}", "parent", paths.join(", "))?;
        if let Some(e) = &self.parent.explanation {
            write!(f, " ({e})")?;
        }
        writeln!(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CgroupError;
    use crate::hierarchy::tests::{
        V1_HOST_CGROUP, V1_HOST_MOUNTINFO, V2_HOST_CGROUP, V2_HOST_MOUNTINFO,
    };
    use pretty_assertions::assert_eq;

    #[test]
    fn kernel_release_parses() {
        assert_eq!(parse_release("6.18.44-fc-v595"), Some((6, 18)));
        assert_eq!(parse_release("5.4.0-150-generic"), Some((5, 4)));
        assert_eq!(parse_release("weird"), None);
    }

    #[test]
    fn v1_report_names_each_controller_and_the_auto_parent() -> Result<(), CgroupError> {
        let h = Hierarchy::from_proc_files(V1_HOST_MOUNTINFO, V1_HOST_CGROUP)?;
        let r = h.report();
        assert_eq!(r.version, CgroupVersion::V1);
        let names: Vec<_> = r.controllers.iter().map(|c| (c.name, c.presence)).collect();
        assert_eq!(
            names,
            vec![
                ("memory", Presence::Present),
                ("cpu", Presence::Present),
                ("cpuacct", Presence::Present),
                ("pids", Presence::Present),
            ]
        );
        assert_eq!(
            r.parent.paths,
            vec![
                PathBuf::from(
                    "/sys/fs/cgroup/memory/process_api/e06560a26e54fc968d29901ab09954ec/airlock"
                ),
                PathBuf::from("/sys/fs/cgroup/cpu/airlock"),
                PathBuf::from("/sys/fs/cgroup/cpuacct/airlock"),
                PathBuf::from("/sys/fs/cgroup/pids/airlock"),
            ]
        );
        assert_eq!(r.cgroup_kill.presence, Presence::Missing);
        assert!(r.to_string().starts_with("cgroup v1\n  memory"));
        Ok(())
    }

    fn io(source: std::io::Error) -> CgroupError {
        CgroupError::ReadFile {
            path: PathBuf::from("test setup"),
            source,
        }
    }

    fn put(p: &Path, content: &str) -> Result<(), CgroupError> {
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        std::fs::write(p, content).map_err(io)
    }

    /// A pure v2 host mounted at `root` (every file real cgroupfs would have at the root
    /// level), this process in `own`.
    fn fake_v2(root: &Path, own: &str) -> Result<Hierarchy, CgroupError> {
        let mountinfo = format!(
            "26 22 0:23 / {} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
            root.display()
        );
        put(&root.join("cgroup.controllers"), "cpu io memory pids\n")?;
        let h = Hierarchy::from_proc_files(&mountinfo, &format!("0::{own}\n"))?;
        Ok(h.with_unified_controllers("cpu io memory pids\n"))
    }

    #[test]
    fn v2_tcp_accounting_is_missing_only_with_nosocket() {
        assert_eq!(
            v2_tcp_accounting("root=/dev/vda1 ro").presence,
            Presence::Present
        );
        assert_eq!(
            v2_tcp_accounting("root=/dev/vda1 cgroup.memory=nosocket").presence,
            Presence::Missing
        );
    }

    #[test]
    fn v2_optional_files_are_looked_for_where_memory_is_enabled() -> Result<(), CgroupError> {
        let tmp = tempfile::tempdir().map_err(io)?;
        let root = tmp.path();
        let own = root.join("user.slice/session-2.scope");
        // The session's slice does not enable memory for it: no memory.* files there. That
        // says nothing about the kernel, and must not read as "no swap accounting".
        put(&own.join("cgroup.controllers"), "pids\n")?;
        put(&own.join("cgroup.kill"), "")?;
        let h = fake_v2(root, "/user.slice/session-2.scope")?;
        let spec = ParentSpec::Path("/airlock".into());
        let r = h.report_for(&spec);
        assert_eq!(r.swap_accounting.presence, Presence::Unknown, "{r}");
        // Without a cgroup to look in, the kernel release decides (this host's is recent).
        assert_ne!(r.memory_peak.presence, Presence::Missing, "{r}");

        // A slice with memory enabled is looked in instead.
        let slice = root.join("system.slice");
        put(&slice.join("cgroup.controllers"), "cpu memory pids\n")?;
        put(&slice.join("memory.peak"), "0\n")?;
        put(&slice.join("cgroup.kill"), "")?;
        let r = h.report_for(&spec);
        assert_eq!(r.swap_accounting.presence, Presence::Missing, "{r}");
        assert_eq!(
            r.swap_accounting.location,
            Some(slice.join("memory.swap.max"))
        );
        assert_eq!(r.memory_peak.presence, Presence::Present, "{r}");
        put(&slice.join("memory.swap.max"), "max\n")?;
        assert_eq!(
            h.report_for(&spec).swap_accounting.presence,
            Presence::Present
        );

        // The parent, once it exists with memory enabled, is looked in first.
        put(
            &root.join("airlock/cgroup.controllers"),
            "memory pids cpu\n",
        )?;
        let r = h.report_for(&spec);
        assert_eq!(r.swap_accounting.presence, Presence::Missing, "{r}");
        assert_eq!(
            r.swap_accounting.location,
            Some(root.join("airlock/memory.swap.max"))
        );
        Ok(())
    }

    #[test]
    fn v2_report_without_controllers_explains() -> Result<(), CgroupError> {
        let h = Hierarchy::from_proc_files(V2_HOST_MOUNTINFO, V2_HOST_CGROUP)?
            .with_unified_controllers("memory pids");
        let r = h.report();
        assert_eq!(r.version, CgroupVersion::V2);
        assert!(!r.ready());
        let missing: Vec<_> = r
            .controllers
            .iter()
            .filter(|c| c.presence != Presence::Present)
            .map(|c| c.name)
            .collect();
        assert_eq!(missing, vec!["cpu"]);
        Ok(())
    }
}
