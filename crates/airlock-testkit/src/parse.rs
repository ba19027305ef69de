//! Parsers for the `/proc` files the probe reads. Pure functions over strings, so they are
//! tested on samples.

use crate::error::Error;
use crate::report::ProcStatus;

/// Parses the fields of `/proc/<pid>/status` the report needs.
pub fn parse_proc_status(text: &str) -> Result<ProcStatus, Error> {
    let field = |name: &'static str| {
        text.lines()
            .find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key == name).then(|| value.trim())
            })
            .ok_or(Error::StatusFieldMissing { field: name })
    };
    let cap = |name: &'static str| {
        let value = field(name)?;
        u64::from_str_radix(value, 16).map_err(|_| Error::StatusFieldInvalid {
            field: name,
            value: value.to_owned(),
        })
    };
    let number = |name: &'static str| {
        let value = field(name)?;
        value.parse::<u32>().map_err(|_| Error::StatusFieldInvalid {
            field: name,
            value: value.to_owned(),
        })
    };
    let seccomp = number("Seccomp")?;
    Ok(ProcStatus {
        cap_inh: cap("CapInh")?,
        cap_prm: cap("CapPrm")?,
        cap_eff: cap("CapEff")?,
        cap_bnd: cap("CapBnd")?,
        cap_amb: cap("CapAmb")?,
        no_new_privs: number("NoNewPrivs")? != 0,
        seccomp: u8::try_from(seccomp).map_err(|_| Error::StatusFieldInvalid {
            field: "Seccomp",
            value: seccomp.to_string(),
        })?,
        seccomp_filters: match field("Seccomp_filters") {
            Ok(_) => Some(number("Seccomp_filters")?),
            Err(_) => None,
        },
    })
}

/// One line of `/proc/<pid>/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// Unique mount id (matches `statx`'s `stx_mnt_id`).
    pub mount_id: u64,
    /// Id of the parent mount.
    pub parent_id: u64,
    /// Root of the mount within its filesystem.
    pub root: String,
    /// Mount point relative to the process's root.
    pub mount_point: String,
    /// Per-mount options (`ro,nosuid,nodev,noexec,relatime`).
    pub mount_options: String,
    /// Filesystem type (`tmpfs`, `ext4`, `proc`).
    pub fs_type: String,
    /// Mount source (`/dev/vda1`, `tmpfs`, `none`).
    pub source: String,
    /// Per-superblock options.
    pub super_options: String,
}

/// Parses `/proc/<pid>/mountinfo`: one [`MountInfo`] per line, in file order (later lines
/// are mounted on top of earlier ones).
pub fn parse_mountinfo(text: &str) -> Result<Vec<MountInfo>, Error> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(parse_mountinfo_line)
        .collect()
}

fn parse_mountinfo_line(line: &str) -> Result<MountInfo, Error> {
    let invalid = || Error::MountInfoLine {
        line: line.to_owned(),
    };
    // "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue":
    // six fixed fields, optional fields up to "-", then type, source, super options.
    let (before, after) = line.split_once(" - ").ok_or_else(invalid)?;
    let mut fixed = before.split(' ');
    let mount_id = fixed
        .next()
        .and_then(|f| f.parse().ok())
        .ok_or_else(invalid)?;
    let parent_id = fixed
        .next()
        .and_then(|f| f.parse().ok())
        .ok_or_else(invalid)?;
    let _major_minor = fixed.next().ok_or_else(invalid)?;
    let root = fixed.next().map(unescape_octal).ok_or_else(invalid)?;
    let mount_point = fixed.next().map(unescape_octal).ok_or_else(invalid)?;
    let mount_options = fixed.next().ok_or_else(invalid)?.to_owned();
    let mut tail = after.split(' ');
    let fs_type = tail.next().map(unescape_octal).ok_or_else(invalid)?;
    let source = tail.next().map(unescape_octal).ok_or_else(invalid)?;
    let super_options = tail.next().unwrap_or_default().to_owned();
    Ok(MountInfo {
        mount_id,
        parent_id,
        root,
        mount_point,
        mount_options,
        fs_type,
        source,
        super_options,
    })
}

/// Undoes the kernel's `\ooo` escaping of space, tab, newline and backslash in mountinfo.
fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escaped = bytes
            .get(index + 1..index + 4)
            .filter(|_| bytes[index] == b'\\')
            .and_then(|digits| std::str::from_utf8(digits).ok())
            .and_then(|digits| u8::from_str_radix(digits, 8).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                index += 4;
            }
            None => {
                out.push(bytes[index]);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The entry for the mount holding `path` when its mount id is unknown: the last entry
/// whose mount point is `path` or a parent directory of it, longest mount point first.
/// (`statx`'s mount id is exact and preferred; this is the fallback.)
pub fn mount_for_path<'a>(mounts: &'a [MountInfo], path: &str) -> Option<&'a MountInfo> {
    let covers = |mount_point: &str| {
        mount_point == "/"
            || path == mount_point
            || path
                .strip_prefix(mount_point)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    mounts
        .iter()
        .enumerate()
        .filter(|(_, mount)| covers(&mount.mount_point))
        .max_by_key(|(index, mount)| (mount.mount_point.len(), *index))
        .map(|(_, mount)| mount)
}

/// Interface names from `/proc/net/dev` (two header lines, then `name: counters`).
pub fn parse_net_dev(text: &str) -> Vec<String> {
    text.lines()
        .skip(2)
        .filter_map(|line| line.split_once(':'))
        .map(|(name, _)| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    const STATUS_SANDBOXED: &str = "Name:\tairlock-probe
Umask:\t0022
State:\tR (running)
Uid:\t65534\t65534\t65534\t65534
Gid:\t65534\t65534\t65534\t65534
Groups:\t
CapInh:\t0000000000000000
CapPrm:\t0000000000000000
CapEff:\t0000000000000000
CapBnd:\t0000000000000000
CapAmb:\t0000000000000000
NoNewPrivs:\t1
Seccomp:\t2
Seccomp_filters:\t1
Speculation_Store_Bypass:\tthread vulnerable
";

    const STATUS_ROOT_OLD_KERNEL: &str = "Name:\tbash
CapInh:\t0000000000000000
CapPrm:\t000001ffffffffff
CapEff:\t000001ffffffffff
CapBnd:\t000001ffffffffff
CapAmb:\t0000000000000000
NoNewPrivs:\t0
Seccomp:\t0
";

    #[test]
    fn status_of_a_sandboxed_process() {
        let status = parse_proc_status(STATUS_SANDBOXED).unwrap();
        assert_eq!(
            status,
            ProcStatus {
                cap_inh: 0,
                cap_prm: 0,
                cap_eff: 0,
                cap_bnd: 0,
                cap_amb: 0,
                no_new_privs: true,
                seccomp: 2,
                seccomp_filters: Some(1),
            }
        );
    }

    #[test]
    fn status_of_root_without_seccomp_filters_line() {
        let status = parse_proc_status(STATUS_ROOT_OLD_KERNEL).unwrap();
        assert_eq!(status.cap_eff, 0x1ff_ffff_ffff);
        assert_eq!(status.cap_bnd, 0x1ff_ffff_ffff);
        assert!(!status.no_new_privs);
        assert_eq!(status.seccomp, 0);
        assert_eq!(status.seccomp_filters, None);
    }

    #[test]
    fn status_errors_name_the_field() {
        let missing = STATUS_ROOT_OLD_KERNEL.replace("CapAmb:\t0000000000000000\n", "");
        assert!(matches!(
            parse_proc_status(&missing),
            Err(Error::StatusFieldMissing { field: "CapAmb" })
        ));
        let invalid = STATUS_ROOT_OLD_KERNEL.replace("CapEff:\t000001ffffffffff", "CapEff:\tzz");
        assert!(matches!(
            parse_proc_status(&invalid),
            Err(Error::StatusFieldInvalid {
                field: "CapEff",
                ..
            })
        ));
    }

    const MOUNTINFO: &str = "\
22 1 0:21 / / ro,nosuid,nodev,relatime - tmpfs airlock-root ro,size=1024k
23 22 253:1 /usr /usr ro,nosuid,nodev,relatime master:1 - ext4 /dev/vda1 rw
24 22 0:22 / /tmp rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,size=16384k
25 22 0:23 / /proc rw,nosuid,nodev,noexec,relatime shared:5 master:2 - proc proc rw
26 22 253:1 /srv/jobs/my\\040job /work ro,nosuid,nodev,noexec - ext4 /dev/vda1 rw
27 24 0:24 / /tmp rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,size=8192k
";

    #[test]
    fn mountinfo_fields_optional_fields_and_escapes() {
        let mounts = parse_mountinfo(MOUNTINFO).unwrap();
        assert_eq!(mounts.len(), 6);
        assert_eq!(
            mounts[1],
            MountInfo {
                mount_id: 23,
                parent_id: 22,
                root: "/usr".to_owned(),
                mount_point: "/usr".to_owned(),
                mount_options: "ro,nosuid,nodev,relatime".to_owned(),
                fs_type: "ext4".to_owned(),
                source: "/dev/vda1".to_owned(),
                super_options: "rw".to_owned(),
            }
        );
        assert_eq!(mounts[3].fs_type, "proc");
        assert_eq!(mounts[4].root, "/srv/jobs/my job");
    }

    #[test]
    fn mountinfo_rejects_garbage() {
        assert!(matches!(
            parse_mountinfo("22 1 0:21 / / rw"),
            Err(Error::MountInfoLine { .. })
        ));
        assert!(matches!(
            parse_mountinfo("x 1 0:21 / / rw - tmpfs tmpfs rw"),
            Err(Error::MountInfoLine { .. })
        ));
    }

    #[test]
    fn mount_for_path_prefers_longest_then_topmost() {
        let mounts = parse_mountinfo(MOUNTINFO).unwrap();
        let id = |path| mount_for_path(&mounts, path).map(|m| m.mount_id);
        assert_eq!(id("/"), Some(22));
        assert_eq!(id("/etc"), Some(22));
        assert_eq!(id("/usr/bin/env"), Some(23));
        assert_eq!(id("/usrx"), Some(22));
        assert_eq!(id("/tmp"), Some(27));
        assert_eq!(id("/work"), Some(26));
    }

    #[test]
    fn unescape_leaves_plain_and_broken_escapes_alone() {
        assert_eq!(unescape_octal("a\\134b\\011c"), "a\\b\tc");
        assert_eq!(unescape_octal("trailing\\04"), "trailing\\04");
        assert_eq!(unescape_octal("plain"), "plain");
    }

    #[test]
    fn net_dev_interfaces() {
        let text = "\
Inter-|   Receive                            |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets
    lo:     120       2    0    0    0     0          0         0      120       2
  eth0: 9999999   12345    0    0    0     0          0         0   888888    4321
";
        assert_eq!(parse_net_dev(text), vec!["lo", "eth0"]);
        assert!(parse_net_dev("").is_empty());
    }
}
