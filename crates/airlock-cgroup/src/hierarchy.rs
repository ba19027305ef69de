//! What the host has: cgroup mounts from `/proc/self/mountinfo`, and where this process sits in
//! each hierarchy from `/proc/self/cgroup`.

use std::path::{Path, PathBuf};

use crate::{CgroupError, CgroupVersion, fs};

/// Controllers a job needs on a cgroup v1 host (`cpuacct` gives the CPU time statistic).
pub(crate) const V1_CONTROLLERS: [&str; 4] = ["memory", "cpu", "cpuacct", "pids"];
/// Controllers a job needs on a cgroup v2 host (CPU time comes from the core `cpu.stat`).
pub(crate) const V2_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// One mounted cgroup v1 hierarchy that carries at least one controller we need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct V1Mount {
    /// Where it is mounted (`/sys/fs/cgroup/memory`).
    pub mount_point: PathBuf,
    /// The hierarchy path shown at the mount point (mountinfo field 4, usually `/`).
    pub root: String,
    /// Super options: the controllers plus flags such as `rw` and `clone_children`.
    pub options: Vec<String>,
    /// This process's cgroup in the hierarchy (from `/proc/self/cgroup`).
    pub own: Option<String>,
}

/// The mounted cgroup v2 hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnifiedMount {
    /// Where it is mounted (`/sys/fs/cgroup` or `/sys/fs/cgroup/unified`).
    pub mount_point: PathBuf,
    /// The hierarchy path shown at the mount point.
    pub root: String,
    /// Controllers available at the mount root (`cgroup.controllers`).
    pub controllers: Vec<String>,
    /// This process's cgroup (the `0::` line of `/proc/self/cgroup`).
    pub own: Option<String>,
}

impl V1Mount {
    /// Whether this hierarchy carries `controller`.
    pub(crate) fn has(&self, controller: &str) -> bool {
        self.options.iter().any(|o| o == controller)
    }

    /// This process's cgroup directory in this hierarchy.
    pub(crate) fn own_dir(&self) -> Option<PathBuf> {
        own_dir(&self.mount_point, &self.root, self.own.as_deref()?)
    }
}

impl UnifiedMount {
    /// This process's cgroup directory in the unified hierarchy.
    pub(crate) fn own_dir(&self) -> Option<PathBuf> {
        own_dir(&self.mount_point, &self.root, self.own.as_deref()?)
    }
}

/// The cgroup hierarchies of this host, as seen by this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    pub(crate) v1: Vec<V1Mount>,
    pub(crate) unified: Option<UnifiedMount>,
}

impl Hierarchy {
    /// Reads `/proc/self/mountinfo`, `/proc/self/cgroup` and the unified mount's
    /// `cgroup.controllers`. The only place that knows where procfs lives.
    pub fn detect() -> Result<Self, CgroupError> {
        let mountinfo = fs::read(Path::new("/proc/self/mountinfo"))?;
        let cgroup = fs::read(Path::new("/proc/self/cgroup"))?;
        let h = Self::from_proc_files(&mountinfo, &cgroup)?;
        match h
            .unified
            .as_ref()
            .map(|u| u.mount_point.join("cgroup.controllers"))
        {
            Some(path) => {
                let controllers = fs::read(&path)?;
                Ok(h.with_unified_controllers(&controllers))
            }
            None => Ok(h),
        }
    }

    /// Builds the view from the text of `/proc/self/mountinfo` and `/proc/self/cgroup`. Pure.
    ///
    /// Without the unified mount's `cgroup.controllers`, the controllers on the unified
    /// hierarchy are taken to be the needed ones not bound to a v1 mount; [`Self::detect`]
    /// replaces that guess with the file's content via [`Self::with_unified_controllers`].
    pub fn from_proc_files(mountinfo: &str, proc_self_cgroup: &str) -> Result<Self, CgroupError> {
        let mut v1: Vec<(String, V1Mount)> = Vec::new();
        let mut unified: Option<UnifiedMount> = None;
        for (index, line) in mountinfo.lines().enumerate() {
            let Some(m) = parse_mountinfo_line(line) else {
                return Err(CgroupError::Parse {
                    path: PathBuf::from("/proc/self/mountinfo"),
                    what: "a mountinfo line",
                    detail: format!("line {}: {}", index + 1, fs::shorten(line)),
                });
            };
            match m.fstype.as_str() {
                "cgroup" => {
                    let options: Vec<String> =
                        m.super_options.split(',').map(String::from).collect();
                    let wanted = V1_CONTROLLERS
                        .iter()
                        .any(|c| options.iter().any(|o| o == c));
                    // Named hierarchies (`name=systemd`) and controllers we do not use are
                    // ignored; a hierarchy mounted twice (same device) is used once.
                    if wanted && !v1.iter().any(|(dev, _)| *dev == m.device) {
                        v1.push((
                            m.device,
                            V1Mount {
                                mount_point: m.mount_point,
                                root: m.root,
                                options,
                                own: None,
                            },
                        ));
                    }
                }
                "cgroup2" if unified.is_none() => {
                    unified = Some(UnifiedMount {
                        mount_point: m.mount_point,
                        root: m.root,
                        controllers: Vec::new(),
                        own: None,
                    });
                }
                _ => {}
            }
        }
        let mut v1: Vec<V1Mount> = v1.into_iter().map(|(_, m)| m).collect();
        if v1.is_empty() && unified.is_none() {
            return Err(CgroupError::NoCgroupMount);
        }

        for line in proc_self_cgroup.lines().filter(|l| !l.trim().is_empty()) {
            let mut parts = line.splitn(3, ':');
            let (Some(id), Some(list), Some(path)) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(CgroupError::Parse {
                    path: PathBuf::from("/proc/self/cgroup"),
                    what: "an `id:controllers:path` line",
                    detail: fs::shorten(line),
                });
            };
            if id == "0" && list.is_empty() {
                if let Some(u) = unified.as_mut() {
                    u.own = Some(path.to_owned());
                }
                continue;
            }
            for m in &mut v1 {
                if list.split(',').any(|c| m.has(c)) {
                    m.own = Some(path.to_owned());
                }
            }
        }

        if let Some(u) = unified.as_mut() {
            u.controllers = V2_CONTROLLERS
                .iter()
                .filter(|c| !v1.iter().any(|m| m.has(c)))
                .map(|c| (*c).to_owned())
                .collect();
        }
        Ok(Self { v1, unified })
    }

    /// Replaces the guessed controller list of the unified hierarchy with the content of its
    /// root `cgroup.controllers` (space separated, e.g. `cpuset cpu io memory pids`).
    #[must_use]
    pub fn with_unified_controllers(mut self, cgroup_controllers: &str) -> Self {
        if let Some(u) = self.unified.as_mut() {
            u.controllers = cgroup_controllers
                .split_whitespace()
                .map(String::from)
                .collect();
        }
        self
    }

    /// V2 when the unified hierarchy has memory, pids and cpu available; a hybrid host with
    /// those controllers on v1 mounts is V1. A host with a unified mount and no v1 hierarchy
    /// carrying them is also V2 even when one is unavailable, so that the error and the report
    /// name the missing v2 controller rather than a v1 mount.
    pub fn version(&self) -> CgroupVersion {
        let Some(u) = &self.unified else {
            return CgroupVersion::V1;
        };
        let complete = V2_CONTROLLERS
            .iter()
            .all(|c| u.controllers.iter().any(|x| x == c));
        if complete || self.v1.is_empty() {
            CgroupVersion::V2
        } else {
            CgroupVersion::V1
        }
    }

    /// The v1 hierarchy carrying `controller`, if mounted.
    pub(crate) fn v1_mount(&self, controller: &str) -> Option<&V1Mount> {
        self.v1.iter().find(|m| m.has(controller))
    }

    /// The directory of the CPU controller's group that `proc_pid_cgroup` (the text of a
    /// process's `/proc/<pid>/cgroup`) names: in the v1 hierarchy carrying `cpu` if there is
    /// one, else in the unified one. `None` when the file names no such group or its path
    /// is not below the mount's root. Pure.
    pub fn cpu_dir_of(&self, proc_pid_cgroup: &str) -> Option<PathBuf> {
        let lines = proc_pid_cgroup.lines().filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            Some((parts.next()?, parts.next()?, parts.next()?))
        });
        match self.v1_mount("cpu") {
            Some(mount) => lines
                .filter(|(_, list, _)| list.split(',').any(|c| c == "cpu"))
                .find_map(|(_, _, path)| own_dir(&mount.mount_point, &mount.root, path)),
            None => {
                let unified = self.unified.as_ref()?;
                lines
                    .filter(|(id, list, _)| *id == "0" && list.is_empty())
                    .find_map(|(_, _, path)| own_dir(&unified.mount_point, &unified.root, path))
            }
        }
    }

    /// Sets the CPU priority of a group airlock did not create (a container's, which its
    /// engine made), found with [`Hierarchy::cpu_dir_of`]: the same values as
    /// [`crate::JobCgroup::set_cpu_priority`] writes for a job's own group.
    pub fn set_cpu_priority_of(
        &self,
        dir: &Path,
        priority: crate::CpuPriority,
    ) -> Result<(), CgroupError> {
        if self.v1_mount("cpu").is_some() {
            crate::v1::write_cpu_shares(dir, priority)
        } else {
            crate::v2::write_cpu_priority(dir, priority)
        }
    }
}

/// The fields of one mountinfo line that we use.
struct MountLine {
    device: String,
    root: String,
    mount_point: PathBuf,
    fstype: String,
    super_options: String,
}

/// `36 35 98:0 /root /mnt/point rw,noatime master:1 - cgroup cgroup rw,memory`
fn parse_mountinfo_line(line: &str) -> Option<MountLine> {
    let (left, right) = line.split_once(" - ")?;
    let mut l = left.split(' ');
    let _id = l.next()?;
    let _parent = l.next()?;
    let device = l.next()?.to_owned();
    let root = unescape(l.next()?);
    let mount_point = PathBuf::from(unescape(l.next()?));
    let mut r = right.split(' ');
    let fstype = r.next()?.to_owned();
    let _source = r.next()?;
    let super_options = r.next().unwrap_or("").to_owned();
    Some(MountLine {
        device,
        root,
        mount_point,
        fstype,
        super_options,
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\134` for a backslash).
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let v = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directory of hierarchy path `own` under a mount of hierarchy path `root`; `None` when
/// `own` is outside what the mount shows.
fn own_dir(mount_point: &Path, root: &str, own: &str) -> Option<PathBuf> {
    let rest = if root == "/" {
        own
    } else if own == root {
        ""
    } else {
        own.strip_prefix(root)?.strip_prefix('/')?
    };
    let rest = rest.trim_start_matches('/');
    if rest.split('/').any(|c| c == "..") {
        return None;
    }
    Some(if rest.is_empty() {
        mount_point.to_path_buf()
    } else {
        mount_point.join(rest)
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    /// This machine: every controller on its own v1 mount, an empty cgroup2 at `unified`.
    pub(crate) const V1_HOST_MOUNTINFO: &str = "\
23 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    pub(crate) const V1_HOST_CGROUP: &str = "\
9:name=systemd:/
8:pids:/
7:blkio:/
6:freezer:/
5:devices:/
4:memory:/process_api/e06560a26e54fc968d29901ab09954ec
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
";

    /// A systemd host on pure cgroup v2 (Debian 12, Fedora), airlock in a delegated scope.
    pub(crate) const V2_HOST_MOUNTINFO: &str = "\
22 27 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 22 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
    pub(crate) const V2_HOST_CGROUP: &str = "0::/system.slice/run-r1234.scope\n";

    /// Ubuntu 20.04 style hybrid: controllers on v1 (cpu,cpuacct co-mounted), cgroup2 at
    /// `unified` for systemd only.
    const HYBRID_MOUNTINFO: &str = "\
25 24 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:24 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
31 25 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,cpu,cpuacct
32 25 0:29 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,memory
33 25 0:30 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup rw,pids
34 25 0:28 / /mnt/again\\040here rw,relatime shared:15 - cgroup cgroup rw,cpu,cpuacct
";
    const HYBRID_CGROUP: &str = "\
12:pids:/user.slice/user-1000.slice/session-2.scope
5:memory:/user.slice/user-1000.slice/session-2.scope
4:cpu,cpuacct:/user.slice
1:name=systemd:/user.slice/user-1000.slice/session-2.scope
0::/user.slice/user-1000.slice/session-2.scope
";

    #[test]
    fn v1_host_like_this_one() -> Result<(), CgroupError> {
        let h = Hierarchy::from_proc_files(V1_HOST_MOUNTINFO, V1_HOST_CGROUP)?;
        assert_eq!(h.version(), CgroupVersion::V1);
        let points: Vec<_> = h.v1.iter().map(|m| m.mount_point.clone()).collect();
        assert_eq!(
            points,
            ["cpu", "cpuacct", "memory", "pids"]
                .map(|c| PathBuf::from("/sys/fs/cgroup").join(c))
                .to_vec()
        );
        let memory = h.v1_mount("memory").map(V1Mount::own_dir);
        assert_eq!(
            memory,
            Some(Some(PathBuf::from(
                "/sys/fs/cgroup/memory/process_api/e06560a26e54fc968d29901ab09954ec"
            )))
        );
        assert_eq!(
            h.v1_mount("pids").and_then(V1Mount::own_dir),
            Some(PathBuf::from("/sys/fs/cgroup/pids"))
        );
        // The cgroup2 mount exists but carries none of the needed controllers.
        assert_eq!(h.unified.as_ref().map(|u| u.controllers.len()), Some(0));
        Ok(())
    }

    #[test]
    fn pure_v2_systemd_host() -> Result<(), CgroupError> {
        let h = Hierarchy::from_proc_files(V2_HOST_MOUNTINFO, V2_HOST_CGROUP)?;
        assert_eq!(h.version(), CgroupVersion::V2);
        assert!(h.v1.is_empty());
        assert_eq!(
            h.unified.as_ref().and_then(UnifiedMount::own_dir),
            Some(PathBuf::from("/sys/fs/cgroup/system.slice/run-r1234.scope"))
        );
        // The real controller list decides: without memory it is not usable, and the manager
        // says which controller is missing.
        let h = h.with_unified_controllers("cpuset cpu io pids\n");
        assert_eq!(h.version(), CgroupVersion::V2);
        let err = crate::CgroupManager::new(h, crate::ParentSpec::Auto);
        assert!(matches!(
            err,
            Err(CgroupError::MissingController {
                controller: "memory",
                ..
            })
        ));
        Ok(())
    }

    #[test]
    fn hybrid_host_with_comounted_cpu_cpuacct_is_v1() -> Result<(), CgroupError> {
        let h = Hierarchy::from_proc_files(HYBRID_MOUNTINFO, HYBRID_CGROUP)?;
        assert_eq!(h.version(), CgroupVersion::V1);
        // cpu,cpuacct is one hierarchy, used once even though it is mounted twice.
        assert_eq!(h.v1.len(), 3);
        let cpu = h.v1_mount("cpu").map(|m| m.mount_point.clone());
        let cpuacct = h.v1_mount("cpuacct").map(|m| m.mount_point.clone());
        assert_eq!(cpu, Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")));
        assert_eq!(cpu, cpuacct);
        assert_eq!(
            h.v1_mount("cpu").and_then(V1Mount::own_dir),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/user.slice"))
        );
        assert!(h.v1_mount("name=systemd").is_none());
        // Even if the kernel lists controllers on cgroup2, those bound to v1 decide.
        let h = h.with_unified_controllers("");
        assert_eq!(h.version(), CgroupVersion::V1);
        Ok(())
    }

    #[test]
    fn mount_root_below_hierarchy_root() {
        // A container that bind-mounts its own subtree: root field `/docker/abc`.
        let dir = own_dir(Path::new("/sys/fs/cgroup"), "/docker/abc", "/docker/abc/x");
        assert_eq!(dir, Some(PathBuf::from("/sys/fs/cgroup/x")));
        let dir = own_dir(Path::new("/sys/fs/cgroup"), "/docker/abc", "/docker/abc");
        assert_eq!(dir, Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(
            own_dir(Path::new("/m"), "/docker/abc", "/docker/abcd"),
            None
        );
        assert_eq!(own_dir(Path::new("/m"), "/", "/../etc"), None);
    }

    #[test]
    fn no_cgroup_mount_and_garbage() {
        let r = Hierarchy::from_proc_files("23 1 0:21 / /sys rw - sysfs sysfs rw\n", "0::/\n");
        assert!(matches!(r, Err(CgroupError::NoCgroupMount)));
        let r = Hierarchy::from_proc_files("nonsense\n", "");
        assert!(matches!(r, Err(CgroupError::Parse { .. })));
        let r = Hierarchy::from_proc_files(V2_HOST_MOUNTINFO, "garbage\n");
        assert!(matches!(r, Err(CgroupError::Parse { .. })));
    }

    #[test]
    fn a_containers_cpu_group_is_found_from_its_proc_cgroup() -> Result<(), CgroupError> {
        let id = "0123abcd";
        let v1 = Hierarchy::from_proc_files(V1_HOST_MOUNTINFO, V1_HOST_CGROUP)?;
        let container = format!(
            "4:memory:/airlock-docker/{id}\n2:cpuacct:/airlock-docker/{id}\n1:cpu:/airlock-docker/{id}\n0::/\n"
        );
        assert_eq!(
            v1.cpu_dir_of(&container),
            Some(PathBuf::from(format!(
                "/sys/fs/cgroup/cpu/airlock-docker/{id}"
            )))
        );
        let hybrid = Hierarchy::from_proc_files(HYBRID_MOUNTINFO, HYBRID_CGROUP)?;
        assert_eq!(
            hybrid.cpu_dir_of(&format!("4:cpu,cpuacct:/docker/{id}\n0::/docker/{id}\n")),
            Some(PathBuf::from(format!(
                "/sys/fs/cgroup/cpu,cpuacct/docker/{id}"
            )))
        );
        let v2 = Hierarchy::from_proc_files(V2_HOST_MOUNTINFO, V2_HOST_CGROUP)?;
        assert_eq!(
            v2.cpu_dir_of(&format!("0::/system.slice/docker-{id}.scope\n")),
            Some(PathBuf::from(format!(
                "/sys/fs/cgroup/system.slice/docker-{id}.scope"
            )))
        );
        assert_eq!(v2.cpu_dir_of("1:cpu:/x\n"), None, "no unified line");
        assert_eq!(v1.cpu_dir_of("1:cpu:/../x\n"), None);
        Ok(())
    }

    #[test]
    fn a_foreign_groups_cpu_priority_takes_the_job_groups_values() -> Result<(), CgroupError> {
        let tree = tempfile::tempdir().map_err(|source| CgroupError::ReadDir {
            path: PathBuf::from("tempdir"),
            source,
        })?;
        let v1 = Hierarchy::from_proc_files(V1_HOST_MOUNTINFO, V1_HOST_CGROUP)?;
        v1.set_cpu_priority_of(tree.path(), crate::CpuPriority::Background)?;
        assert_eq!(fs::read(&tree.path().join("cpu.shares"))?, "2");
        v1.set_cpu_priority_of(tree.path(), crate::CpuPriority::Normal)?;
        assert_eq!(fs::read(&tree.path().join("cpu.shares"))?, "1024");
        let v2 = Hierarchy::from_proc_files(V2_HOST_MOUNTINFO, V2_HOST_CGROUP)?;
        v2.set_cpu_priority_of(tree.path(), crate::CpuPriority::Normal)?;
        assert_eq!(fs::read(&tree.path().join("cpu.weight"))?, "100");
        Ok(())
    }

    #[test]
    fn unescape_octal() {
        assert_eq!(unescape("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape("/x\\134y"), "/x\\y");
        assert_eq!(unescape("/trailing\\04"), "/trailing\\04");
    }
}
