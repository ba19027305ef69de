//! The container's seccomp profile: the native backend's reviewed policy
//! (`policy/seccomp.json`, two filters: an allowlist where anything else is `ENOSYS`, and a
//! denylist answering `EPERM`) rendered as one Docker/OCI profile, so a container job
//! meets the same filter as a native one. Docker's own default profile is not enough: it
//! allows `ptrace` and (in Docker 20.10) `io_uring_setup`, both of which DESIGN S5 denies.
//!
//! An OCI profile is one filter, so a syscall on both lists needs its rules made disjoint.
//! Three are today, each handled by name below; any other overlap is an error, and the
//! backend then refuses to run jobs rather than guess (fail closed).

use serde_json::{Value, json};

/// The reviewed policy, embedded at build time (the same file the native backend compiles).
pub const POLICY_JSON: &str = include_str!("../../../policy/seccomp.json");

/// `ENOSYS`, the allowlist's answer to everything else.
const ENOSYS: i64 = 38;
/// `EPERM`, the denylist's answer.
const EPERM: i64 = 1;
/// `SOCK_STREAM` and `SOCK_DGRAM`: the IP socket types a job may open.
const IP_SOCKET_TYPES: [u64; 2] = [1, 2];
/// The mask that strips `SOCK_NONBLOCK` and `SOCK_CLOEXEC` from a socket type.
const SOCKET_TYPE_MASK: u64 = 0xf;
/// `S_IFMT`: the file type bits of a `mknod` mode.
const FILE_TYPE_MASK: u64 = 0o170000;
/// The file types a job may `mknod`: a regular file (type 0 or `S_IFREG`), a FIFO and a
/// unix socket. Devices (`S_IFCHR`, `S_IFBLK`) are on the denylist.
const MKNOD_FILE_TYPES: [u64; 4] = [0, 0o100000, 0o010000, 0o140000];

/// Why the policy cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The policy is not the expected JSON.
    #[error("policy/seccomp.json: {0}")]
    Shape(String),
    /// A syscall has rules on both lists that this renderer does not know how to split.
    #[error(
        "policy/seccomp.json: {0} is on both the allow and the deny list; teach airlock-docker's seccomp renderer how to make its rules disjoint"
    )]
    Overlap(String),
}

#[derive(Debug, Clone)]
struct Cond {
    index: u64,
    /// `None`: equality with `value`; `Some(mask)`: `arg & mask == value`.
    mask: Option<u64>,
    value: u64,
}

#[derive(Debug, Clone)]
struct Rule {
    syscall: String,
    args: Vec<Cond>,
}

fn rules(policy: &Value, filter: &str) -> Result<Vec<Rule>, ProfileError> {
    let list = policy[filter]["filter"]
        .as_array()
        .ok_or_else(|| ProfileError::Shape(format!("no {filter} filter")))?;
    let mut out = Vec::with_capacity(list.len());
    for entry in list {
        let syscall = entry["syscall"]
            .as_str()
            .ok_or_else(|| ProfileError::Shape(format!("a {filter} rule without syscall")))?
            .to_owned();
        let mut args = Vec::new();
        for arg in entry["args"].as_array().into_iter().flatten() {
            let bad = || ProfileError::Shape(format!("{syscall}: bad argument condition {arg}"));
            let index = arg["index"].as_u64().ok_or_else(bad)?;
            let value = arg["val"].as_u64().ok_or_else(bad)?;
            let mask = match &arg["op"] {
                Value::String(op) if op == "eq" => None,
                Value::Object(op) => Some(
                    op.get("masked_eq")
                        .and_then(Value::as_u64)
                        .ok_or_else(bad)?,
                ),
                _ => return Err(bad()),
            };
            args.push(Cond { index, mask, value });
        }
        out.push(Rule { syscall, args });
    }
    Ok(out)
}

fn render_args(args: &[Cond]) -> Value {
    Value::Array(
        args.iter()
            .map(|c| match c.mask {
                None => json!({"index": c.index, "value": c.value, "valueTwo": 0, "op": "SCMP_CMP_EQ"}),
                Some(mask) => json!({"index": c.index, "value": mask, "valueTwo": c.value, "op": "SCMP_CMP_MASKED_EQ"}),
            })
            .collect(),
    )
}

/// Renders the policy as a Docker seccomp profile (JSON text for `SecurityOpt:
/// seccomp=…`).
///
/// `allow_clone3`: gVisor answers every `SCMP_ACT_ERRNO` of an OCI profile with `EPERM`
/// (its runsc of 2022 ignores `errnoRet`), on which glibc gives up creating threads instead
/// of falling back to `clone`. There `clone3` is allowed: its namespace flags create
/// namespaces of gVisor's own kernel, never of the host's.
pub fn docker_profile(policy_json: &str, allow_clone3: bool) -> Result<String, ProfileError> {
    let policy: Value =
        serde_json::from_str(policy_json).map_err(|e| ProfileError::Shape(e.to_string()))?;
    let allow = rules(&policy, "allow")?;
    let deny = rules(&policy, "deny")?;
    let denied: std::collections::BTreeSet<&str> =
        deny.iter().map(|r| r.syscall.as_str()).collect();

    let mut unconditional = Vec::new();
    let mut entries = Vec::new();
    for rule in &allow {
        let overlapping = denied.contains(rule.syscall.as_str());
        match (rule.syscall.as_str(), overlapping) {
            (_, false) if rule.args.is_empty() => unconditional.push(rule.syscall.clone()),
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
                    "args": render_args(&[Cond { index: 0, mask: Some(mask), value: 0 }])}));
            }
            // socket: IP families only as stream or datagram sockets, never SOCK_RAW.
            ("socket", true) if rule.args.len() == 1 && rule.args[0].index == 0 => {
                let family = rule.args[0].value;
                let raw_denied = deny.iter().any(|d| {
                    d.syscall == "socket" && d.args.first().is_some_and(|c| c.index == 0 && c.value == family)
                });
                if raw_denied {
                    for typ in IP_SOCKET_TYPES {
                        entries.push(json!({"names": ["socket"], "action": "SCMP_ACT_ALLOW",
                            "args": render_args(&[rule.args[0].clone(), Cond { index: 1, mask: Some(SOCKET_TYPE_MASK), value: typ }])}));
                    }
                } else {
                    entries.push(json!({"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": render_args(&rule.args)}));
                }
            }
            // mknod, mknodat: allowed only for the file types that are not devices; the
            // denylist's device rules are rendered below as EPERM.
            ("mknod" | "mknodat", true) if rule.args.is_empty() => {
                let mode_index = deny
                    .iter()
                    .filter(|d| d.syscall == rule.syscall)
                    .flat_map(|d| d.args.iter())
                    .find(|c| c.mask == Some(FILE_TYPE_MASK))
                    .map(|c| c.index)
                    .ok_or_else(|| ProfileError::Overlap(rule.syscall.clone()))?;
                for typ in MKNOD_FILE_TYPES {
                    entries.push(json!({"names": [rule.syscall], "action": "SCMP_ACT_ALLOW",
                        "args": render_args(&[Cond { index: mode_index, mask: Some(FILE_TYPE_MASK), value: typ }])}));
                }
            }
            // ioctl: allowed; the denylist's TIOCSTI/TIOCLINUX need a terminal, and a
            // container job has none (no TTY is ever allocated).
            ("ioctl", true) if rule.args.is_empty() => unconditional.push("ioctl".to_owned()),
            (name, true) => return Err(ProfileError::Overlap(name.to_owned())),
        }
    }
    let mut denied_unconditional = Vec::new();
    for rule in &deny {
        match rule.syscall.as_str() {
            "ioctl" => {}
            "clone" | "socket" | "mknod" | "mknodat" => entries
                .push(json!({"names": [rule.syscall], "action": "SCMP_ACT_ERRNO",
                "errnoRet": EPERM, "args": render_args(&rule.args)})),
            _ if rule.args.is_empty() => denied_unconditional.push(rule.syscall.clone()),
            other => return Err(ProfileError::Overlap(other.to_owned())),
        }
    }
    unconditional.sort();
    unconditional.dedup();
    denied_unconditional.sort();
    denied_unconditional.dedup();
    let mut syscalls = vec![json!({"names": unconditional, "action": "SCMP_ACT_ALLOW"})];
    // clone3 must look unimplemented, so libc falls back to clone (whose flags the filter
    // can read). Docker 20.10 ignores defaultErrnoRet and would answer EPERM, on which
    // glibc gives up creating threads.
    if allow_clone3 {
        syscalls.push(json!({"names": ["clone3"], "action": "SCMP_ACT_ALLOW"}));
    } else if !allow.iter().any(|r| r.syscall == "clone3") {
        syscalls.push(json!({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS}));
    }
    syscalls.extend(entries);
    syscalls.push(
        json!({"names": denied_unconditional, "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM}),
    );
    let profile = json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": ENOSYS,
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": syscalls,
    });
    Ok(profile.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> Value {
        serde_json::from_str(&docker_profile(POLICY_JSON, false).unwrap()).unwrap()
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

    #[test]
    fn overlapping_rules_are_disjoint() {
        let p = profile();
        let clone = actions_for(&p, "clone");
        assert!(
            clone
                .iter()
                .any(|r| r["action"] == "SCMP_ACT_ALLOW" && r["args"][0]["valueTwo"] == 0)
        );
        assert!(
            clone
                .iter()
                .filter(|r| r["action"] == "SCMP_ACT_ERRNO")
                .count()
                >= 7
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

    /// The typed renderer in airlock-sys replaces this one: same bytes, both flavours.
    #[test]
    fn the_typed_renderer_gives_the_same_profile() {
        let policy = airlock_sys::seccomp::SeccompPolicy::builtin().unwrap();
        for allow_clone3 in [false, true] {
            assert_eq!(
                policy.to_oci_profile(allow_clone3).unwrap(),
                docker_profile(POLICY_JSON, allow_clone3).unwrap(),
                "allow_clone3 = {allow_clone3}"
            );
        }
    }

    #[test]
    fn an_unknown_overlap_is_refused() {
        let policy = r#"{"allow": {"filter": [{"syscall": "read"}]},
                          "deny": {"filter": [{"syscall": "read", "args": [{"index": 0, "type": "dword", "op": "eq", "val": 3}]}]}}"#;
        assert!(matches!(
            docker_profile(policy, false),
            Err(ProfileError::Overlap(_))
        ));
    }
}
