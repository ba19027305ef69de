//! The policy rendered as one OCI seccomp profile (the JSON Docker, Podman, gVisor and
//! Kubernetes load), so a container job meets the same filter as a native one. Docker's own
//! default profile is not enough: it allows `ptrace` and (in Docker 20.10) `io_uring_setup`,
//! both of which DESIGN S5 denies.
//!
//! An OCI profile is one filter, so a syscall on both lists needs its rules made disjoint.
//! Four are today (`clone`, `socket`, `mknod`/`mknodat`, `ioctl`), each handled by name
//! below; any other overlap is an error, and the container backends then refuse to run jobs
//! rather than guess (fail closed).

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::{CmpOp, FilterName, PolicyAction, PolicyCondition, SeccompError, SeccompPolicy};

/// `SOCK_STREAM` and `SOCK_DGRAM`: the IP socket types a job may open.
const IP_SOCKET_TYPES: [u64; 2] = [1, 2];
/// The mask that strips `SOCK_NONBLOCK` and `SOCK_CLOEXEC` from a socket type.
const SOCKET_TYPE_MASK: u64 = 0xf;
/// `S_IFMT`: the file type bits of a `mknod` mode.
const FILE_TYPE_MASK: u64 = 0o170000;
/// The file types a job may `mknod`: a regular file (type 0 or `S_IFREG`), a FIFO and a
/// unix socket. Devices (`S_IFCHR`, `S_IFBLK`) are on the denylist.
const MKNOD_FILE_TYPES: [u64; 4] = [0, 0o100000, 0o010000, 0o140000];

/// One argument condition as an OCI profile can say it.
#[derive(Debug, Clone)]
struct OciCondition {
    index: u64,
    /// `None`: equality with `value`; `Some(mask)`: `arg & mask == value`.
    mask: Option<u64>,
    value: u64,
}

/// One rule of a filter, its conditions in OCI terms.
#[derive(Debug)]
struct OciRule<'a> {
    syscall: &'a str,
    args: Vec<OciCondition>,
}

fn oci_condition(syscall: &str, condition: &PolicyCondition) -> Result<OciCondition, SeccompError> {
    let mask = match condition.op {
        CmpOp::Eq => None,
        CmpOp::MaskedEq(mask) => Some(mask),
        CmpOp::Ne | CmpOp::Ge | CmpOp::Gt | CmpOp::Le | CmpOp::Lt => {
            return Err(SeccompError::OciUnsupported {
                syscall: syscall.to_owned(),
            });
        }
    };
    Ok(OciCondition {
        index: u64::from(condition.index),
        mask,
        value: condition.val,
    })
}

fn oci_rules(policy: &SeccompPolicy, name: FilterName) -> Result<Vec<OciRule<'_>>, SeccompError> {
    policy
        .filter(name)?
        .filter
        .iter()
        .map(|rule| {
            let args = rule
                .args
                .iter()
                .flatten()
                .map(|c| oci_condition(&rule.syscall, c))
                .collect::<Result<_, _>>()?;
            Ok(OciRule {
                syscall: &rule.syscall,
                args,
            })
        })
        .collect()
}

/// The errno of an `errno(n)` action; the OCI rendering knows no other shape of the policy.
fn errno_of(action: &PolicyAction, name: FilterName) -> Result<u32, SeccompError> {
    match action {
        PolicyAction::Errno(errno) => Ok(*errno),
        _ => Err(SeccompError::OciShape { name }),
    }
}

fn render_args(args: &[OciCondition]) -> Value {
    Value::Array(
        args.iter()
            .map(|c| match c.mask {
                None => json!({"index": c.index, "value": c.value, "valueTwo": 0, "op": "SCMP_CMP_EQ"}),
                Some(mask) => json!({"index": c.index, "value": mask, "valueTwo": c.value, "op": "SCMP_CMP_MASKED_EQ"}),
            })
            .collect(),
    )
}

/// See [`SeccompPolicy::to_oci_profile`].
pub(super) fn to_oci_profile(
    policy: &SeccompPolicy,
    allow_clone3: bool,
) -> Result<String, SeccompError> {
    let allow_filter = policy.filter(FilterName::Allow)?;
    let deny_filter = policy.filter(FilterName::Deny)?;
    // The allowlist must answer everything else with an errno and allow its matches; the
    // denylist must allow everything else and answer its matches with an errno.
    if !matches!(allow_filter.match_action, PolicyAction::Allow) {
        return Err(SeccompError::OciShape {
            name: FilterName::Allow,
        });
    }
    if !matches!(deny_filter.mismatch_action, PolicyAction::Allow) {
        return Err(SeccompError::OciShape {
            name: FilterName::Deny,
        });
    }
    let default_errno = errno_of(&allow_filter.mismatch_action, FilterName::Allow)?;
    let deny_errno = errno_of(&deny_filter.match_action, FilterName::Deny)?;

    let allow = oci_rules(policy, FilterName::Allow)?;
    let deny = oci_rules(policy, FilterName::Deny)?;
    let denied: BTreeSet<&str> = deny.iter().map(|r| r.syscall).collect();
    let overlap = |name: &str| SeccompError::OciOverlap {
        syscall: name.to_owned(),
    };

    let mut unconditional: Vec<&str> = Vec::new();
    let mut entries = Vec::new();
    for rule in &allow {
        let overlapping = denied.contains(rule.syscall);
        match (rule.syscall, overlapping) {
            (_, false) if rule.args.is_empty() => unconditional.push(rule.syscall),
            (_, false) => entries.push(json!({"names": [rule.syscall], "action": "SCMP_ACT_ALLOW", "args": render_args(&rule.args)})),
            // clone: allowed only without any namespace flag the denylist names.
            ("clone", true) if rule.args.is_empty() => {
                let mask = deny
                    .iter()
                    .filter(|d| d.syscall == "clone")
                    .flat_map(|d| d.args.iter())
                    .filter(|c| c.index == 0)
                    .filter_map(|c| c.mask)
                    .fold(0u64, |acc, m| acc | m);
                entries.push(json!({"names": ["clone"], "action": "SCMP_ACT_ALLOW",
                    "args": render_args(&[OciCondition { index: 0, mask: Some(mask), value: 0 }])}));
            }
            // socket: IP families only as stream or datagram sockets, never SOCK_RAW.
            ("socket", true) if rule.args.len() == 1 && rule.args[0].index == 0 => {
                let family = rule.args[0].value;
                let raw_denied = deny.iter().any(|d| {
                    d.syscall == "socket"
                        && d.args.first().is_some_and(|c| c.index == 0 && c.value == family)
                });
                if raw_denied {
                    for typ in IP_SOCKET_TYPES {
                        entries.push(json!({"names": ["socket"], "action": "SCMP_ACT_ALLOW",
                            "args": render_args(&[rule.args[0].clone(), OciCondition { index: 1, mask: Some(SOCKET_TYPE_MASK), value: typ }])}));
                    }
                } else {
                    entries.push(json!({"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": render_args(&rule.args)}));
                }
            }
            // mknod, mknodat: allowed only for the file types that are not devices; the
            // denylist's device rules are rendered below as the deny errno.
            ("mknod" | "mknodat", true) if rule.args.is_empty() => {
                let mode_index = deny
                    .iter()
                    .filter(|d| d.syscall == rule.syscall)
                    .flat_map(|d| d.args.iter())
                    .find(|c| c.mask == Some(FILE_TYPE_MASK))
                    .map(|c| c.index)
                    .ok_or_else(|| overlap(rule.syscall))?;
                for typ in MKNOD_FILE_TYPES {
                    entries.push(json!({"names": [rule.syscall], "action": "SCMP_ACT_ALLOW",
                        "args": render_args(&[OciCondition { index: mode_index, mask: Some(FILE_TYPE_MASK), value: typ }])}));
                }
            }
            // ioctl: allowed; the denylist's TIOCSTI/TIOCLINUX need a terminal, and a
            // container job has none (no TTY is ever allocated).
            ("ioctl", true) if rule.args.is_empty() => unconditional.push("ioctl"),
            (name, true) => return Err(overlap(name)),
        }
    }
    let mut denied_unconditional: Vec<&str> = Vec::new();
    for rule in &deny {
        match rule.syscall {
            "ioctl" => {}
            "clone" | "socket" | "mknod" | "mknodat" => entries
                .push(json!({"names": [rule.syscall], "action": "SCMP_ACT_ERRNO",
                "errnoRet": deny_errno, "args": render_args(&rule.args)})),
            _ if rule.args.is_empty() => denied_unconditional.push(rule.syscall),
            other => return Err(overlap(other)),
        }
    }
    unconditional.sort_unstable();
    unconditional.dedup();
    denied_unconditional.sort_unstable();
    denied_unconditional.dedup();
    let mut syscalls = vec![json!({"names": unconditional, "action": "SCMP_ACT_ALLOW"})];
    // clone3 must look unimplemented, so libc falls back to clone (whose flags the filter
    // can read). Docker 20.10 ignores defaultErrnoRet and would answer EPERM, on which
    // glibc gives up creating threads.
    if allow_clone3 {
        syscalls.push(json!({"names": ["clone3"], "action": "SCMP_ACT_ALLOW"}));
    } else if !allow.iter().any(|r| r.syscall == "clone3") {
        syscalls.push(
            json!({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": libc::ENOSYS}),
        );
    }
    syscalls.extend(entries);
    syscalls.push(
        json!({"names": denied_unconditional, "action": "SCMP_ACT_ERRNO", "errnoRet": deny_errno}),
    );
    let profile = json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": default_errno,
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": syscalls,
    });
    Ok(profile.to_string())
}
