//! TCP socket buffers of a container, held to its memory limit (issue 19 finding 3).
//!
//! A socket's buffers are kernel memory. On cgroup v1 they are charged to a memory cgroup
//! only if that very group has `memory.kmem.tcp.limit_in_bytes` set before the socket is
//! created (the kernel looks at the creating task's own group, not at its parents: a limit
//! on a parent bounds nothing below it). Docker 20.10 with runc 1.1 accepts
//! `KernelMemoryTCP` and leaves the file unlimited. So airlock creates each container's memory cgroup
//! itself, with the TCP limit, after the daemon created the container (its id names the
//! group) and before it starts it; runc then joins the existing group. The daemon places a
//! container at `<CgroupParent>/<id>` (Docker) or `<CgroupParent>/libpod-<id>` (Podman)
//! with the cgroupfs driver; after the start airlock checks that the container's process is
//! in that group, and kills it otherwise.
//!
//! On cgroup v2 socket memory is part of `memory.current` (unless the kernel was booted
//! with `cgroup.memory=nosocket`). gVisor's sockets are its own kernel's memory, which the
//! container's memory limit holds like any other.

use std::path::{Path, PathBuf};

use crate::Flavor;

/// The v1 file that turns on, and bounds, TCP accounting of a memory cgroup.
pub const TCP_LIMIT_FILE: &str = "memory.kmem.tcp.limit_in_bytes";
/// The kernel parameter that turns socket accounting off on every hierarchy.
pub const NOSOCKET: &str = "cgroup.memory=nosocket";

/// How a daemon's containers have their TCP buffers charged to their memory limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TcpAccounting {
    /// Nothing to do: cgroup v2 charges socket memory to `memory.current`, and gVisor's
    /// sockets are memory of its own kernel.
    Inherent,
    /// cgroup v1 with the cgroupfs driver: airlock creates each container's memory group.
    V1(V1Groups),
}

/// Where the containers' v1 memory groups are: `<memory mount>/<parent>/<prefix><id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V1Groups {
    /// The memory hierarchy's mount point (`/sys/fs/cgroup/memory`).
    mount: PathBuf,
    /// The daemon's `CgroupParent` for airlock's containers, without a leading `/`.
    parent: &'static str,
    /// What precedes the container id in its group's name.
    prefix: &'static str,
}

/// The `CgroupParent` of airlock's Docker containers on v1.
pub const DOCKER_PARENT: &str = "airlock-docker";
/// The `CgroupParent` of airlock's Podman containers on v1.
pub const PODMAN_PARENT: &str = "airlock-podman";

/// What the host and daemon say, as [`plan`] reads it.
#[derive(Debug, Clone, Copy)]
pub struct HostFacts<'a> {
    /// The daemon's `CgroupVersion` (`"1"`, `"2"`), if it said.
    pub cgroup_version: Option<&'a str>,
    /// The daemon's `CgroupDriver` (`cgroupfs`, `systemd`), if it said.
    pub cgroup_driver: Option<&'a str>,
    /// `/proc/self/mountinfo`.
    pub mountinfo: &'a str,
    /// `/proc/cmdline`.
    pub cmdline: &'a str,
    /// Whether airlock runs as root (only root can create groups in the host hierarchy).
    pub root: bool,
}

/// How containers of `flavor` get their TCP buffers charged on this host, or why they
/// cannot be (the host is then refused: never run a job unbounded).
pub fn plan(flavor: Flavor, facts: &HostFacts<'_>) -> Result<TcpAccounting, String> {
    if flavor == Flavor::Gvisor {
        return Ok(TcpAccounting::Inherent);
    }
    let nosocket = facts.cmdline.split_whitespace().any(|w| w == NOSOCKET);
    if nosocket {
        return Err(format!(
            "the kernel was booted with {NOSOCKET}, so no memory cgroup charges TCP socket \
             buffers and a job's sockets could pin memory far past its limit; boot without it"
        ));
    }
    match facts.cgroup_version {
        Some("2") => return Ok(TcpAccounting::Inherent),
        Some("1") => {}
        other => {
            return Err(format!(
                "the daemon reports cgroup version {other:?}; airlock bounds TCP socket \
                 buffers on versions 1 and 2 only"
            ));
        }
    }
    if facts.cgroup_driver != Some("cgroupfs") {
        return Err(format!(
            "on cgroup v1 airlock must create each container's memory cgroup to set its TCP \
             buffer limit (memory.kmem.tcp.limit_in_bytes), which it can only with the \
             cgroupfs driver; the daemon's driver is {:?}: set it to cgroupfs (dockerd \
             \"exec-opts\": [\"native.cgroupdriver=cgroupfs\"], Podman cgroup_manager = \
             \"cgroupfs\") or use cgroup v2",
            facts.cgroup_driver.unwrap_or("unknown")
        ));
    }
    if !facts.root {
        return Err(
            "on cgroup v1 airlock must create each container's memory cgroup to set \
                    its TCP buffer limit, which needs root"
                .to_owned(),
        );
    }
    let mount = memory_mount(facts.mountinfo)?;
    let (parent, prefix) = match flavor {
        Flavor::Podman => (PODMAN_PARENT, "libpod-"),
        Flavor::Docker | Flavor::Gvisor => (DOCKER_PARENT, ""),
    };
    Ok(TcpAccounting::V1(V1Groups {
        mount,
        parent,
        prefix,
    }))
}

/// The mount point of the v1 memory hierarchy, which must show the whole hierarchy (its
/// root is `/`), so that the daemon's group paths are paths under it.
fn memory_mount(mountinfo: &str) -> Result<PathBuf, String> {
    for line in mountinfo.lines() {
        let Some((mount, fs)) = line.split_once(" - ") else {
            continue;
        };
        let mut fs = fs.split_whitespace();
        if fs.next() != Some("cgroup") {
            continue;
        }
        let options = fs.nth(1).unwrap_or_default();
        if !options.split(',').any(|o| o == "memory") {
            continue;
        }
        let fields: Vec<&str> = mount.split_whitespace().collect();
        let (Some(root), Some(point)) = (fields.get(3), fields.get(4)) else {
            continue;
        };
        if *root != "/" {
            return Err(format!(
                "the v1 memory hierarchy is mounted at {point} from {root}, not from its \
                 root, so airlock cannot create the daemon's container groups in it"
            ));
        }
        return Ok(PathBuf::from(point));
    }
    Err("no v1 memory cgroup hierarchy is mounted".to_owned())
}

impl V1Groups {
    /// The `CgroupParent` to ask the daemon for.
    pub fn cgroup_parent(&self) -> String {
        format!("/{}", self.parent)
    }

    /// The directory holding the containers' groups.
    pub fn parent_dir(&self) -> PathBuf {
        self.mount.join(self.parent)
    }

    /// The group of container `id`, relative to the hierarchy's root, as
    /// `/proc/<pid>/cgroup` shows it.
    pub fn group_path(&self, id: &str) -> String {
        format!("/{}/{}{id}", self.parent, self.prefix)
    }

    /// The directory of container `id`'s group.
    pub fn group_dir(&self, id: &str) -> PathBuf {
        self.parent_dir().join(format!("{}{id}", self.prefix))
    }

    /// Whether the kernel can charge TCP buffers to v1 memory groups here.
    pub fn kernel_accounts_tcp(&self) -> bool {
        self.mount.join(TCP_LIMIT_FILE).exists()
    }

    /// Creates container `id`'s group with its TCP limit, before the daemon starts it.
    pub fn create(&self, id: &str, limit: u64) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(self.parent_dir())?;
        let dir = self.group_dir(id);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            // The daemon never creates it before the start: left by a crashed airlock for
            // the same id, which cannot be; setting the limit again is right either way.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        std::fs::write(dir.join(TCP_LIMIT_FILE), limit.to_string())?;
        Ok(dir)
    }

    /// Checks that process `pid` is in container `id`'s group; the error says which memory
    /// group it is in instead. A process that is gone is not in the wrong group.
    pub fn check_member(&self, pid: u32, id: &str) -> Result<(), String> {
        let cgroup = match std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            // Reaped between the open and the read: gone, like NotFound.
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) => {
                return Ok(());
            }
            Err(e) => return Err(format!("read /proc/{pid}/cgroup: {e}")),
        };
        let expected = self.group_path(id);
        match memory_group(&cgroup) {
            Some(actual) if actual == expected => Ok(()),
            // v1 shows `/` for a task that is exiting; the container's first process ending
            // ends all of it.
            _ if exiting(pid) => Ok(()),
            actual => Err(format!(
                "the container's process is in memory cgroup {actual:?}, not in {expected}, \
                 where airlock set its TCP buffer limit"
            )),
        }
    }

    /// Removes container `id`'s group (the runtime usually did when it removed the
    /// container); a group that is gone is fine.
    pub fn remove(&self, id: &str) -> std::io::Result<()> {
        remove_dir(&self.group_dir(id))
    }

    /// The container ids whose groups are in the parent directory.
    pub fn group_ids(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.parent_dir()) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let id = name.strip_prefix(self.prefix)?;
                is_container_id(id).then(|| id.to_owned())
            })
            .collect()
    }
}

/// `PF_EXITING` in a task's flags.
const PF_EXITING: u64 = 0x4;

/// Whether process `pid` is gone or exiting (`PF_EXITING` in the flags, field 9 of
/// `/proc/<pid>/stat`).
fn exiting(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat_flags(&stat).is_some_and(|flags| flags & PF_EXITING != 0),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// The flags field of a `/proc/<pid>/stat` line. The command name may hold spaces and
/// parentheses, so fields are counted from its last `)`: state is the first after it,
/// flags the seventh.
fn stat_flags(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(6)?.parse().ok()
}

/// A full container id: 64 lowercase hex digits.
fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The memory hierarchy's line of a `/proc/<pid>/cgroup`: `4:memory:/path`.
fn memory_group(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    })
}

/// `rmdir`, with a directory that is gone not an error.
fn remove_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
        32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
        35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n";

    fn facts<'a>(version: &'a str, driver: &'a str) -> HostFacts<'a> {
        HostFacts {
            cgroup_version: Some(version),
            cgroup_driver: Some(driver),
            mountinfo: MOUNTINFO,
            cmdline: "BOOT_IMAGE=/vmlinuz ro quiet",
            root: true,
        }
    }

    #[test]
    fn v1_cgroupfs_creates_the_groups_under_airlocks_parent() {
        let Ok(TcpAccounting::V1(docker)) = plan(Flavor::Docker, &facts("1", "cgroupfs")) else {
            panic!("v1 docker");
        };
        let id = "a".repeat(64);
        assert_eq!(docker.cgroup_parent(), "/airlock-docker");
        assert_eq!(
            docker.group_dir(&id),
            Path::new("/sys/fs/cgroup/memory/airlock-docker").join(&id)
        );
        let Ok(TcpAccounting::V1(podman)) = plan(Flavor::Podman, &facts("1", "cgroupfs")) else {
            panic!("v1 podman");
        };
        assert_eq!(
            podman.group_path(&id),
            format!("/airlock-podman/libpod-{id}")
        );
    }

    #[test]
    fn v2_and_gvisor_need_nothing() {
        assert_eq!(
            plan(Flavor::Docker, &facts("2", "systemd")),
            Ok(TcpAccounting::Inherent)
        );
        assert_eq!(
            plan(Flavor::Gvisor, &facts("1", "systemd")),
            Ok(TcpAccounting::Inherent)
        );
    }

    #[test]
    fn hosts_that_cannot_bound_tcp_buffers_are_refused() {
        let systemd = plan(Flavor::Podman, &facts("1", "systemd")).unwrap_err();
        assert!(systemd.contains("\"systemd\""), "{systemd}");
        let mut nosocket = facts("2", "systemd");
        nosocket.cmdline = "ro cgroup.memory=nosocket";
        assert!(
            plan(Flavor::Docker, &nosocket)
                .unwrap_err()
                .contains(NOSOCKET)
        );
        let mut user = facts("1", "cgroupfs");
        user.root = false;
        assert!(plan(Flavor::Docker, &user).unwrap_err().contains("root"));
        let mut nested = facts("1", "cgroupfs");
        nested.mountinfo =
            "35 31 0:32 /docker/x /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert!(
            plan(Flavor::Docker, &nested)
                .unwrap_err()
                .contains("not from its root")
        );
        let mut unmounted = facts("1", "cgroupfs");
        unmounted.mountinfo = "";
        assert!(plan(Flavor::Docker, &unmounted).is_err());
        assert!(
            plan(
                Flavor::Docker,
                &HostFacts {
                    cgroup_version: None,
                    ..facts("1", "cgroupfs")
                }
            )
            .is_err()
        );
    }

    #[test]
    fn membership_is_read_from_the_memory_line() {
        let id = "b".repeat(64);
        let line = format!("9:name=systemd:/\n4:memory:/airlock-docker/{id}\n1:cpu:/\n");
        assert_eq!(
            memory_group(&line),
            Some(format!("/airlock-docker/{id}").as_str())
        );
        assert_eq!(memory_group("4:cpu,memory:/docker/x\n"), Some("/docker/x"));
        assert_eq!(memory_group("0::/\n"), None);
    }

    #[test]
    fn a_group_is_created_with_its_limit_listed_and_removed() {
        let mount = tempfile::tempdir().unwrap();
        let groups = V1Groups {
            mount: mount.path().to_owned(),
            parent: PODMAN_PARENT,
            prefix: "libpod-",
        };
        let id = "c".repeat(64);
        let dir = groups.create(&id, 64 << 20).unwrap();
        assert_eq!(
            dir,
            mount.path().join(format!("airlock-podman/libpod-{id}"))
        );
        assert_eq!(
            std::fs::read_to_string(dir.join(TCP_LIMIT_FILE)).unwrap(),
            (64u64 << 20).to_string()
        );
        // Podman's own conmon group beside it is not a container's.
        std::fs::create_dir(groups.parent_dir().join("conmon")).unwrap();
        assert_eq!(groups.group_ids(), vec![id.clone()]);
        std::fs::remove_file(dir.join(TCP_LIMIT_FILE)).unwrap();
        groups.remove(&id).unwrap();
        assert!(!dir.exists());
        groups.remove(&id).expect("a group that is gone is fine");
        assert!(groups.group_ids().is_empty());
    }

    #[test]
    fn an_exiting_task_is_told_by_its_flags() {
        let stat = "42 (py (x) y) Z 1 42 42 0 -1 4194564 0 0 0 0 0 0";
        assert_eq!(stat_flags(stat), Some(4194564));
        assert_ne!(4194564 & PF_EXITING, 0);
        assert!(!exiting(std::process::id()), "this test is not exiting");
    }

    #[test]
    fn only_full_container_ids_are_swept() {
        assert!(is_container_id(&"0f".repeat(32)));
        assert!(!is_container_id("conmon"));
        assert!(!is_container_id(&"A".repeat(64)));
    }
}
