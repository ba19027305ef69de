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

use crate::{CmpOp, FilterName, PolicyAction, PolicyCondition, SeccompError, SeccompPolicy};

/// `SOCK_STREAM` and `SOCK_DGRAM`: the IP socket types a job may open.
const IP_SOCKET_TYPES: [u64; 2] = [1, 2];
/// The mask that strips `SOCK_NONBLOCK` and `SOCK_CLOEXEC` from a socket type.
const SOCKET_TYPE_MASK: u64 = 0xf;
/// `S_IFMT`: the file type bits of a `mknod` mode.
const FILE_TYPE_MASK: u64 = 0o170000;
/// The file types a job may `mknod`: a regular file (type 0 or `S_IFREG`), a FIFO and a
/// unix socket. Devices (`S_IFCHR`, `S_IFBLK`) are on the denylist.
const MKNOD_FILE_TYPES: [u64; 4] = [0, 0o100000, 0o010000, 0o140000];
/// `MFD_NOEXEC_SEAL` (Linux 6.3): the memfd is created without execute permission and sealed
/// so (`F_SEAL_EXEC`), so it can never be made executable.
const MFD_NOEXEC_SEAL: u64 = 0x8;

/// Which kernel enforces the profile, which decides two rules the policy file cannot say
/// alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OciRuntime {
    /// runc or crun: the host's kernel (Docker, Podman, a Kubernetes node).
    ///
    /// `clone3` must look unimplemented, so libc falls back to `clone`, whose flags the
    /// filter can read. `memfd_create` is allowed only with `MFD_NOEXEC_SEAL`: the engines
    /// refuse the `vm.memfd_noexec` sysctl that makes every memfd non-executable for a
    /// native job, so here a memfd that could be made executable is refused instead (with
    /// the profile's default `ENOSYS`, which programs take as "no memfds on this kernel" and
    /// fall back from). On kernels before 6.3, which lack the flag, no memfd can be made.
    Runc,
    /// gVisor's runsc: its own kernel, which answers every `SCMP_ACT_ERRNO` with `EPERM`
    /// (runsc of 2022 ignores `errnoRet`), on which glibc gives up creating threads instead of
    /// falling back to `clone`. There `clone3` is allowed: its namespace flags create
    /// namespaces of gVisor's kernel, never of the host's. `memfd_create` stays as the policy
    /// says: gVisor's kernel predates `MFD_NOEXEC_SEAL`, so the rule would take memfds away
    /// without closing what it closes on runc (gVisor also maps `/tmp` files `PROT_EXEC`;
    /// docs/docker.md).
    Gvisor,
}

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
    runtime: OciRuntime,
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
            // Without the flag: ENOSYS said explicitly, as for clone3 (Docker answers the
            // default action with EPERM whatever defaultErrnoRet says).
            ("memfd_create", false) if rule.args.is_empty() && runtime == OciRuntime::Runc => {
                entries.push(json!({"names": ["memfd_create"], "action": "SCMP_ACT_ALLOW",
                    "args": render_args(&[OciCondition { index: 1, mask: Some(MFD_NOEXEC_SEAL), value: MFD_NOEXEC_SEAL }])}));
                entries.push(json!({"names": ["memfd_create"], "action": "SCMP_ACT_ERRNO", "errnoRet": libc::ENOSYS,
                    "args": render_args(&[OciCondition { index: 1, mask: Some(MFD_NOEXEC_SEAL), value: 0 }])}));
            }
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
    if runtime == OciRuntime::Gvisor {
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

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;
    use crate::BUILTIN_POLICY_JSON;

    fn profile_of(json: &str, runtime: OciRuntime) -> Value {
        let text = SeccompPolicy::parse(json)
            .unwrap()
            .to_oci_profile(runtime)
            .unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn profile() -> Value {
        profile_of(BUILTIN_POLICY_JSON, OciRuntime::Runc)
    }

    fn actions_for(profile: &Value, name: &str) -> Vec<Value> {
        profile["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["names"].as_array().unwrap().iter().any(|n| n == name))
            .cloned()
            .collect()
    }

    /// The profile Docker, Podman and Kubernetes load, pretty-printed for review: every
    /// change of the policy or of this renderer shows here.
    #[test]
    fn rendered_oci_profile() {
        insta::assert_snapshot!(serde_json::to_string_pretty(&profile()).unwrap());
    }

    #[test]
    fn gvisor_differs_only_in_clone3_and_memfd_create() {
        let mut docker = profile();
        let mut gvisor = profile_of(BUILTIN_POLICY_JSON, OciRuntime::Gvisor);
        let take_clone3 = |p: &mut Value| {
            let syscalls = p["syscalls"].as_array_mut().unwrap();
            let at = syscalls
                .iter()
                .position(|e| e["names"] == json!(["clone3"]))
                .unwrap();
            syscalls.remove(at)
        };
        assert_eq!(
            take_clone3(&mut docker),
            json!({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38})
        );
        assert_eq!(
            take_clone3(&mut gvisor),
            json!({"names": ["clone3"], "action": "SCMP_ACT_ALLOW"})
        );
        // runc: memfd_create only with MFD_NOEXEC_SEAL; gVisor: in the unconditional list.
        let syscalls = docker["syscalls"].as_array_mut().unwrap();
        let memfd: Vec<Value> = syscalls
            .iter()
            .filter(|e| e["names"] == json!(["memfd_create"]))
            .cloned()
            .collect();
        syscalls.retain(|e| e["names"] != json!(["memfd_create"]));
        assert_eq!(
            memfd,
            [
                json!({"names": ["memfd_create"], "action": "SCMP_ACT_ALLOW", "args": [
                    {"index": 1, "value": 8, "valueTwo": 8, "op": "SCMP_CMP_MASKED_EQ"}]}),
                json!({"names": ["memfd_create"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38, "args": [
                    {"index": 1, "value": 8, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]})
            ]
        );
        let names = gvisor["syscalls"][0]["names"].as_array_mut().unwrap();
        let at = names.iter().position(|n| n == "memfd_create").unwrap();
        names.remove(at);
        assert_eq!(docker, gvisor);
    }

    #[test]
    fn the_native_policy_renders_with_enosys_by_default() {
        let p = profile();
        assert_eq!(p["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(p["defaultErrnoRet"], 38);
        assert_eq!(actions_for(&p, "read")[0]["action"], "SCMP_ACT_ALLOW");
        // Denied outright with EPERM, like the native filter.
        for name in [
            "mount",
            "ptrace",
            "bpf",
            "keyctl",
            "io_uring_setup",
            "io_setup",
            "io_submit",
            "unshare",
            "setns",
        ] {
            let rules = actions_for(&p, name);
            assert_eq!(rules.len(), 1, "{name}: {rules:?}");
            assert_eq!(rules[0]["action"], "SCMP_ACT_ERRNO", "{name}");
            assert_eq!(rules[0]["errnoRet"], 1, "{name}");
        }
        // Absent from both lists: ENOSYS, explicitly for clone3 (libc then uses clone).
        let clone3 = actions_for(&p, "clone3");
        assert_eq!(clone3.len(), 1);
        assert_eq!(clone3[0]["errnoRet"], 38);
    }

    /// Every syscall of the policy is in the profile, with the action its filter gives it:
    /// unconditional denies answer EPERM only, unconditional allows are allowed.
    #[test]
    fn every_policy_syscall_is_in_the_profile() {
        let policy = SeccompPolicy::builtin().unwrap();
        let p = profile();
        for name in FilterName::INSTALL_ORDER {
            for rule in &policy.filter(name).unwrap().filter {
                let rules = actions_for(&p, &rule.syscall);
                assert!(!rules.is_empty(), "{}: missing", rule.syscall);
                if rule.args.is_none() && name == FilterName::Deny {
                    assert_eq!(
                        rules,
                        [
                            json!({"names": rules[0]["names"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1})
                        ],
                        "{}",
                        rule.syscall
                    );
                }
            }
        }
    }

    #[test]
    fn overlapping_rules_are_disjoint() {
        let p = profile();
        let clone = actions_for(&p, "clone");
        let allowed: Vec<&Value> = clone
            .iter()
            .filter(|r| r["action"] == "SCMP_ACT_ALLOW")
            .collect();
        // Allowed only if no namespace flag is set: the mask is the OR of all seven.
        assert_eq!(allowed.len(), 1);
        assert_eq!(allowed[0]["args"][0]["value"], 0x7e02_0000_u64);
        assert_eq!(allowed[0]["args"][0]["valueTwo"], 0);
        assert_eq!(
            clone
                .iter()
                .filter(|r| r["action"] == "SCMP_ACT_ERRNO")
                .count(),
            7
        );
        let socket = actions_for(&p, "socket");
        // AF_INET (2) only as stream or datagram.
        let inet: Vec<&Value> = socket
            .iter()
            .filter(|r| r["action"] == "SCMP_ACT_ALLOW" && r["args"][0]["value"] == 2)
            .collect();
        assert_eq!(inet.len(), 2, "{inet:?}");
        assert!(
            inet.iter()
                .all(|r| r["args"][1]["op"] == "SCMP_CMP_MASKED_EQ")
        );
        // ioctl: allowed outright, no container job has a terminal.
        assert_eq!(
            actions_for(&p, "ioctl")
                .iter()
                .map(|r| r["action"].clone())
                .collect::<Vec<_>>(),
            ["SCMP_ACT_ALLOW"]
        );
    }

    #[test]
    fn mknod_of_devices_is_refused_and_fifos_are_allowed() {
        let p = profile();
        for (name, index) in [("mknod", 1), ("mknodat", 2)] {
            let rules = actions_for(&p, name);
            let denied: Vec<&Value> = rules
                .iter()
                .filter(|r| r["action"] == "SCMP_ACT_ERRNO")
                .collect();
            let mut denied_types: Vec<u64> = denied
                .iter()
                .map(|r| r["args"][0]["valueTwo"].as_u64().unwrap())
                .collect();
            denied_types.sort();
            assert_eq!(denied_types, [0o020000, 0o060000], "{name}: {rules:?}");
            assert!(
                denied
                    .iter()
                    .all(|r| r["errnoRet"] == 1 && r["args"][0]["index"] == index)
            );
            let allowed: Vec<u64> = rules
                .iter()
                .filter(|r| r["action"] == "SCMP_ACT_ALLOW")
                .map(|r| r["args"][0]["valueTwo"].as_u64().unwrap())
                .collect();
            assert!(allowed.contains(&0o010000), "{name}: FIFOs allowed");
            assert!(!allowed.contains(&0o020000) && !allowed.contains(&0o060000));
        }
    }

    const OVERLAPPING: &str = r#"{
        "allow": {"mismatch_action": {"errno": 38}, "match_action": "allow",
                  "filter": [{"syscall": "read", "comment": "read"}]},
        "deny": {"mismatch_action": "allow", "match_action": {"errno": 1},
                 "filter": [{"syscall": "read", "comment": "fd 3",
                             "args": [{"index": 0, "type": "dword", "op": "eq", "val": 3}]}]}
    }"#;

    #[test]
    fn an_unknown_overlap_is_refused() {
        let policy = SeccompPolicy::parse(OVERLAPPING).unwrap();
        assert!(matches!(
            policy.to_oci_profile(OciRuntime::Runc),
            Err(SeccompError::OciOverlap { syscall }) if syscall == "read"
        ));
    }

    #[test]
    fn comparisons_an_oci_profile_cannot_say_are_refused() {
        let policy = SeccompPolicy::parse(
            &OVERLAPPING
                .replace(
                    r#""syscall": "read", "comment": "fd 3""#,
                    r#""syscall": "write", "comment": "fd 3""#,
                )
                .replace(r#""op": "eq""#, r#""op": "ge""#),
        )
        .unwrap();
        assert!(matches!(
            policy.to_oci_profile(OciRuntime::Runc),
            Err(SeccompError::OciUnsupported { syscall }) if syscall == "write"
        ));
    }

    #[test]
    fn a_deny_filter_without_errno_is_refused() {
        let policy =
            SeccompPolicy::parse(&OVERLAPPING.replace(r#"{"errno": 1}"#, r#""trap""#)).unwrap();
        assert!(matches!(
            policy.to_oci_profile(OciRuntime::Runc),
            Err(SeccompError::OciShape {
                name: FilterName::Deny
            })
        ));
    }
}
