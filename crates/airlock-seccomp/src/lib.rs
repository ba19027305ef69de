//! airlock-seccomp: the seccomp policy in `policy/seccomp.json`, parsed and checked, and
//! its renderings: BPF programs (native backend) and an OCI profile (container backends,
//! Kubernetes). Pure data and no `unsafe`: the one thing done with a kernel, installing the
//! BPF programs, is `airlock_sys::seccomp::install`.
//!
//! The policy is reviewed data in seccompiler's JSON format with two filters, installed in
//! this order:
//!
//! 1. `allow`: an allowlist. Anything not listed fails with `ENOSYS`, so new syscalls and
//!    the x32 ABI (`nr | 0x40000000`) look unimplemented and libc falls back gracefully.
//! 2. `deny`: the calls that must never run (mount family, namespaces, ptrace, kexec,
//!    modules, bpf, io_uring, ...) and argument rules (namespace flags of `clone`, raw and
//!    packet sockets, terminal injection ioctls). They fail with `EPERM`.
//!
//! The kernel runs every installed filter and keeps the most restrictive action; between two
//! `errno` results the most recently installed filter's errno wins, so a call both filters
//! refuse fails with the deny filter's `EPERM`. Calls made through another architecture's
//! ABI (`int 0x80`, i386) kill the process: seccompiler checks the audit arch first.
//!
//! The policy is parsed once into a [`SeccompPolicy`], which has two renderings:
//! [`SeccompPolicy::to_bpf`], the BPF programs of the native backend, and
//! [`SeccompPolicy::to_oci_profile`], the one-filter OCI profile the container backends
//! (Docker, Podman, gVisor) and Kubernetes load.
//!
//! The built-in policy is compiled at build time (`build.rs`, [`CompiledSeccomp::builtin`];
//! a test checks it against the run-time compiler) and the supervisor ships the BPF
//! programs to the sandbox init process, which installs them
//! (`airlock_sys::seccomp::install`) just before `execve`.
#![forbid(unsafe_code)]

mod oci;

pub use oci::OciRuntime;

use std::collections::BTreeMap;
use std::fmt;

use seccompiler::{TargetArch, sock_filter};
use serde::{Deserialize, Serialize};

/// The reviewed policy, `policy/seccomp.json`, embedded at build time.
pub const BUILTIN_POLICY_JSON: &str = include_str!("../../../policy/seccomp.json");

/// The architecture the policy is written for (syscall names and argument layout).
const TARGET_ARCH: TargetArch = TargetArch::x86_64;

/// The longest BPF program the kernel accepts (`BPF_MAXINSNS`).
pub const BPF_MAX_INSTRUCTIONS: usize = 4096;

/// Size of one `struct sock_filter`.
pub const SOCK_FILTER_BYTES: usize = 8;

/// `BPF_LD | BPF_W | BPF_ABS`: load a 32-bit word of `seccomp_data`.
const BPF_LOAD_WORD: u16 = 0x20;
/// `BPF_JMP | BPF_JEQ | BPF_K`: compare the accumulator with a constant.
const BPF_JUMP_EQ: u16 = 0x15;
/// Offset of the syscall number in `struct seccomp_data`.
const SECCOMP_DATA_NR_OFFSET: u32 = 0;

/// One of the two filters of the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FilterName {
    /// The allowlist; everything else fails with `ENOSYS`.
    Allow,
    /// The denylist, installed second; its matches fail with `EPERM`.
    Deny,
}

impl FilterName {
    /// Both filters in the order they are installed.
    pub const INSTALL_ORDER: [FilterName; 2] = [FilterName::Allow, FilterName::Deny];

    /// The filter's key in the policy JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            FilterName::Allow => "allow",
            FilterName::Deny => "deny",
        }
    }

    fn from_key(key: &str) -> Option<Self> {
        Self::INSTALL_ORDER
            .into_iter()
            .find(|name| name.as_str() == key)
    }
}

impl fmt::Display for FilterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Errors of parsing, compiling or rendering the seccomp policy.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The policy is not valid JSON of the expected shape.
    #[error("parse seccomp policy")]
    ParsePolicy(#[source] serde_json::Error),
    /// The policy has a filter other than `allow` and `deny`.
    #[error("seccomp policy has unknown filter {name:?}")]
    UnknownFilter {
        /// The unexpected filter key.
        name: String,
    },
    /// One of the two filters is missing from the policy.
    #[error("seccomp policy has no {name} filter")]
    MissingFilter {
        /// The missing filter.
        name: FilterName,
    },
    /// A rule has no comment giving its reason.
    #[error("seccomp rule for {syscall} in the {filter} filter has no comment")]
    MissingComment {
        /// The filter holding the rule.
        filter: FilterName,
        /// The rule's syscall.
        syscall: String,
    },
    /// A syscall has an unconditional rule and another rule in the same filter. seccompiler
    /// would silently keep only the conditional rules.
    #[error("seccomp rules for {syscall} in the {filter} filter conflict")]
    ConflictingRules {
        /// The filter holding the rules.
        filter: FilterName,
        /// The syscall listed more than once.
        syscall: String,
    },
    /// seccompiler refused the policy (unknown syscall name, identical actions, too long, ...).
    #[error("compile seccomp policy")]
    CompilePolicy(#[source] seccompiler::Error),
    /// The syscall number of a policy entry could not be determined for rendering.
    #[error("look up the number of syscall {syscall}")]
    SyscallNumber {
        /// The syscall name.
        syscall: String,
    },
    /// The policy's actions are not the shape an OCI profile can say (the allowlist must
    /// answer mismatches with an errno, the denylist its matches).
    #[error("seccomp {name} filter has actions the OCI profile cannot express")]
    OciShape {
        /// The filter with the unexpected actions.
        name: FilterName,
    },
    /// An argument comparison the OCI rendering does not support (only `eq` and
    /// `masked_eq` are).
    #[error(
        "seccomp rule for {syscall} has a comparison the OCI profile renderer does not support"
    )]
    OciUnsupported {
        /// The rule's syscall.
        syscall: String,
    },
    /// A syscall has rules on both lists that the OCI renderer does not know how to make
    /// disjoint (an OCI profile is one filter).
    #[error(
        "seccomp policy: {syscall} is on both the allow and the deny list; teach the OCI profile renderer how to make its rules disjoint"
    )]
    OciOverlap {
        /// The syscall on both lists.
        syscall: String,
    },
}

/// One classic BPF instruction (`struct sock_filter`), serialized as `[code, jt, jf, k]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "(u16, u8, u8, u32)", into = "(u16, u8, u8, u32)")]
pub struct BpfInstruction {
    /// Opcode.
    pub code: u16,
    /// Jump offset if the condition holds.
    pub jt: u8,
    /// Jump offset if the condition does not hold.
    pub jf: u8,
    /// Immediate operand.
    pub k: u32,
}

impl From<(u16, u8, u8, u32)> for BpfInstruction {
    fn from((code, jt, jf, k): (u16, u8, u8, u32)) -> Self {
        Self { code, jt, jf, k }
    }
}

impl From<BpfInstruction> for (u16, u8, u8, u32) {
    fn from(insn: BpfInstruction) -> Self {
        (insn.code, insn.jt, insn.jf, insn.k)
    }
}

impl From<&sock_filter> for BpfInstruction {
    fn from(insn: &sock_filter) -> Self {
        Self {
            code: insn.code,
            jt: insn.jt,
            jf: insn.jf,
            k: insn.k,
        }
    }
}

impl From<BpfInstruction> for sock_filter {
    fn from(insn: BpfInstruction) -> Self {
        sock_filter {
            code: insn.code,
            jt: insn.jt,
            jf: insn.jf,
            k: insn.k,
        }
    }
}

/// The reviewed policy, parsed and checked: the one source of both renderings.
#[derive(Debug)]
pub struct SeccompPolicy {
    /// The text it was parsed from, which seccompiler compiles to BPF.
    json: String,
    filters: BTreeMap<FilterName, PolicyFilter>,
}

impl SeccompPolicy {
    /// Parses the embedded policy, [`BUILTIN_POLICY_JSON`].
    pub fn builtin() -> Result<Self, SeccompError> {
        Self::parse(BUILTIN_POLICY_JSON)
    }

    /// Parses a policy in seccompiler's JSON format.
    ///
    /// The policy must have exactly the filters `allow` and `deny`, a non-empty comment on
    /// every rule, and no syscall listed both unconditionally and with another rule in the
    /// same filter.
    pub fn parse(json: &str) -> Result<Self, SeccompError> {
        Ok(Self {
            json: json.to_owned(),
            filters: parse_policy(json)?,
        })
    }

    /// Compiles the policy to BPF for x86_64, one program per filter.
    pub fn to_bpf(&self) -> Result<CompiledSeccomp, SeccompError> {
        let mut programs = seccompiler::compile_from_json(self.json.as_bytes(), TARGET_ARCH)
            .map_err(SeccompError::CompilePolicy)?;
        let mut take = |name: FilterName| {
            programs
                .remove(name.as_str())
                .map(|program| program.iter().map(BpfInstruction::from).collect::<Vec<_>>())
                .ok_or(SeccompError::MissingFilter { name })
        };
        Ok(CompiledSeccomp {
            allow: take(FilterName::Allow)?,
            deny: take(FilterName::Deny)?,
        })
    }

    /// Renders the policy as one OCI seccomp profile (JSON text, for Docker's `SecurityOpt:
    /// seccomp=…`, Podman's profile file and a Kubernetes `Localhost` profile).
    ///
    /// `runtime` says which kernel enforces it: see [`OciRuntime`] for the rules that differ.
    pub fn to_oci_profile(&self, runtime: OciRuntime) -> Result<String, SeccompError> {
        oci::to_oci_profile(self, runtime)
    }

    fn filter(&self, name: FilterName) -> Result<&PolicyFilter, SeccompError> {
        self.filters
            .get(&name)
            .ok_or(SeccompError::MissingFilter { name })
    }
}

/// The compiled policy: one BPF program per filter, installed `allow` then `deny`.
///
/// Compiled once by the supervisor and shipped to the sandbox init process inside its plan
/// (hence `Serialize + Deserialize`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompiledSeccomp {
    allow: Vec<BpfInstruction>,
    deny: Vec<BpfInstruction>,
}

impl CompiledSeccomp {
    /// The embedded policy, [`BUILTIN_POLICY_JSON`], as compiled at build time
    /// (`build.rs`): what [`Self::from_policy_json`] makes of it, without its cost on every
    /// run (parsing and compiling the policy took more than a millisecond of each
    /// `airlock run`).
    ///
    /// Never fails; the `Result` is kept for callers that may compile another policy.
    pub fn builtin() -> Result<Self, SeccompError> {
        let program = |insns: &[(u16, u8, u8, u32)]| {
            insns.iter().copied().map(BpfInstruction::from).collect()
        };
        Ok(Self {
            allow: program(BUILTIN_ALLOW),
            deny: program(BUILTIN_DENY),
        })
    }

    /// Compiles a policy in seccompiler's JSON format for x86_64.
    ///
    /// The policy must have exactly the filters `allow` and `deny`, a non-empty comment on
    /// every rule, and no syscall listed both unconditionally and with another rule in the
    /// same filter.
    pub fn from_policy_json(json: &str) -> Result<Self, SeccompError> {
        SeccompPolicy::parse(json)?.to_bpf()
    }

    /// The BPF program of one filter.
    pub fn program(&self, name: FilterName) -> &[BpfInstruction] {
        match name {
            FilterName::Allow => &self.allow,
            FilterName::Deny => &self.deny,
        }
    }

    /// The BPF program of one filter as the kernel reads it: an array of `struct
    /// sock_filter` (`u16 code, u8 jt, u8 jf, u32 k`, native byte order, 8 bytes each),
    /// for a process that installs it without airlock-sys (the zygote's children, which
    /// pass it to `seccomp(2)` through Python's `ctypes`).
    pub fn program_bytes(&self, name: FilterName) -> Vec<u8> {
        let program = self.program(name);
        let mut bytes = Vec::with_capacity(program.len() * SOCK_FILTER_BYTES);
        for insn in program {
            bytes.extend_from_slice(&insn.code.to_ne_bytes());
            bytes.push(insn.jt);
            bytes.push(insn.jf);
            bytes.extend_from_slice(&insn.k.to_ne_bytes());
        }
        bytes
    }
}

// BUILTIN_ALLOW and BUILTIN_DENY: the built-in policy's programs, compiled by build.rs.
include!(concat!(env!("OUT_DIR"), "/builtin_seccomp.rs"));

/// Renders a policy for review: one line per rule, sorted by syscall name (then filter in
/// install order, then position in the file), with its filter, number, action, argument
/// conditions and comment. Deterministic, so a snapshot test shows every policy change.
pub fn render_policy(json: &str) -> Result<String, SeccompError> {
    let parsed = SeccompPolicy::parse(json)?;
    let compiled = parsed.to_bpf()?;
    let policy = &parsed.filters;

    let mut numbers: BTreeMap<&str, u32> = BTreeMap::new();
    let mut rows = Vec::new();
    for (name, filter) in policy {
        for (position, rule) in filter.filter.iter().enumerate() {
            let number = match numbers.get(rule.syscall.as_str()) {
                Some(number) => *number,
                None => {
                    let number = syscall_number(&rule.syscall)?;
                    numbers.insert(&rule.syscall, number);
                    number
                }
            };
            let conditions = match &rule.args {
                None => "-".to_owned(),
                Some(args) => args
                    .iter()
                    .map(render_condition)
                    .collect::<Vec<_>>()
                    .join(" && "),
            };
            rows.push(Row {
                sort_key: (rule.syscall.clone(), *name, position),
                number,
                action: filter.match_action.to_string(),
                conditions,
                comment: rule.comment.clone(),
            });
        }
    }
    rows.sort_by(|a, b| a.sort_key.cmp(&b.sort_key));

    let syscall_width = rows
        .iter()
        .map(|row| row.sort_key.0.len())
        .max()
        .unwrap_or(0);
    let action_width = rows.iter().map(|row| row.action.len()).max().unwrap_or(0);
    let conditions_width = rows
        .iter()
        .map(|row| row.conditions.len())
        .max()
        .unwrap_or(0);

    let mut out = String::from("# seccomp policy for x86_64, filters in install order\n");
    for (name, filter) in policy {
        out.push_str(&format!(
            "# {name}: {} rules, no match -> {}, match -> {}, {} BPF instructions\n",
            filter.filter.len(),
            filter.mismatch_action,
            filter.match_action,
            compiled.program(*name).len(),
        ));
    }
    for row in rows {
        let (syscall, filter, _) = &row.sort_key;
        out.push_str(
            format!(
                "{filter:<5}  {syscall:<syscall_width$}  {number:>3}  {action:<action_width$}  \
                 {conditions:<conditions_width$}  # {comment}",
                number = row.number,
                action = row.action,
                conditions = row.conditions,
                comment = row.comment,
            )
            .trim_end(),
        );
        out.push('\n');
    }
    Ok(out)
}

/// One line of [`render_policy`].
struct Row {
    sort_key: (String, FilterName, usize),
    number: u32,
    action: String,
    conditions: String,
    comment: String,
}

fn render_condition(condition: &PolicyCondition) -> String {
    let width = match condition.arg_len {
        ArgLen::Dword => "u32",
        ArgLen::Qword => "u64",
    };
    let arg = format!("arg{}:{width}", condition.index);
    let val = condition.val;
    match condition.op {
        CmpOp::Eq => format!("{arg} == {val:#x}"),
        CmpOp::Ne => format!("{arg} != {val:#x}"),
        CmpOp::Ge => format!("{arg} >= {val:#x}"),
        CmpOp::Gt => format!("{arg} > {val:#x}"),
        CmpOp::Le => format!("{arg} <= {val:#x}"),
        CmpOp::Lt => format!("{arg} < {val:#x}"),
        CmpOp::MaskedEq(mask) => format!("{arg} & {mask:#x} == {val:#x}"),
    }
}

/// The number seccompiler's table gives a syscall on [`TARGET_ARCH`], read back from a
/// one-rule probe filter: arch check (3 instructions), load of the number, then the
/// comparison with it.
fn syscall_number(syscall: &str) -> Result<u32, SeccompError> {
    let probe = serde_json::json!({
        "probe": {
            "mismatch_action": "allow",
            "match_action": "trap",
            "filter": [{ "syscall": syscall }],
        }
    });
    let lookup_failed = || SeccompError::SyscallNumber {
        syscall: syscall.to_owned(),
    };
    let programs = seccompiler::compile_from_json(probe.to_string().as_bytes(), TARGET_ARCH)
        .map_err(|_| lookup_failed())?;
    let program = programs.get("probe").ok_or_else(lookup_failed)?;
    match (program.get(3), program.get(4)) {
        (Some(load), Some(compare))
            if load.code == BPF_LOAD_WORD
                && load.k == SECCOMP_DATA_NR_OFFSET
                && compare.code == BPF_JUMP_EQ =>
        {
            Ok(compare.k)
        }
        _ => Err(lookup_failed()),
    }
}

/// Parses and checks the policy's shape; seccompiler does the rest when compiling.
fn parse_policy(json: &str) -> Result<BTreeMap<FilterName, PolicyFilter>, SeccompError> {
    let raw: BTreeMap<String, PolicyFilter> =
        serde_json::from_str(json).map_err(SeccompError::ParsePolicy)?;
    let mut policy = BTreeMap::new();
    for (key, filter) in raw {
        let name = FilterName::from_key(&key).ok_or(SeccompError::UnknownFilter { name: key })?;
        check_rules(name, &filter.filter)?;
        policy.insert(name, filter);
    }
    for name in FilterName::INSTALL_ORDER {
        if !policy.contains_key(&name) {
            return Err(SeccompError::MissingFilter { name });
        }
    }
    Ok(policy)
}

fn check_rules(filter: FilterName, rules: &[PolicyRule]) -> Result<(), SeccompError> {
    // Per syscall: (has an unconditional rule, number of rules).
    let mut seen: BTreeMap<&str, (bool, usize)> = BTreeMap::new();
    for rule in rules {
        if rule.comment.trim().is_empty() {
            return Err(SeccompError::MissingComment {
                filter,
                syscall: rule.syscall.clone(),
            });
        }
        let entry = seen.entry(rule.syscall.as_str()).or_default();
        entry.0 |= rule.args.is_none();
        entry.1 += 1;
        if entry.0 && entry.1 > 1 {
            return Err(SeccompError::ConflictingRules {
                filter,
                syscall: rule.syscall.clone(),
            });
        }
    }
    Ok(())
}

/// A filter as written in the policy (seccompiler's JSON format, stricter: the comment of a
/// rule is required and the legacy field aliases are refused).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFilter {
    mismatch_action: PolicyAction,
    match_action: PolicyAction,
    filter: Vec<PolicyRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyRule {
    syscall: String,
    comment: String,
    args: Option<Vec<PolicyCondition>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyCondition {
    index: u8,
    #[serde(rename = "type")]
    arg_len: ArgLen,
    op: CmpOp,
    val: u64,
    #[serde(rename = "comment")]
    _comment: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum PolicyAction {
    Allow,
    Errno(u32),
    KillThread,
    KillProcess,
    Log,
    Trace(u32),
    Trap,
}

impl fmt::Display for PolicyAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyAction::Allow => f.write_str("allow"),
            PolicyAction::Errno(errno) => write!(f, "errno({errno})"),
            PolicyAction::KillThread => f.write_str("kill_thread"),
            PolicyAction::KillProcess => f.write_str("kill_process"),
            PolicyAction::Log => f.write_str("log"),
            PolicyAction::Trace(data) => write!(f, "trace({data})"),
            PolicyAction::Trap => f.write_str("trap"),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ArgLen {
    Dword,
    Qword,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum CmpOp {
    Eq,
    Ge,
    Gt,
    Le,
    Lt,
    MaskedEq(u64),
    Ne,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use pretty_assertions::assert_eq;
    use serde_json::Value;

    use super::*;

    /// The syscalls DESIGN S5 (and the seccomp brief) require the deny filter to refuse
    /// unconditionally.
    const REQUIRED_DENIED: &[&str] = &[
        "mount",
        "umount2",
        "pivot_root",
        "move_mount",
        "open_tree",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "mount_setattr",
        "unshare",
        "setns",
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "bpf",
        "perf_event_open",
        "keyctl",
        "add_key",
        "request_key",
        "userfaultfd",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "open_by_handle_at",
        "name_to_handle_at",
        "clock_settime",
        "clock_adjtime",
        "settimeofday",
        "adjtimex",
        "reboot",
        "swapon",
        "swapoff",
        "acct",
        "chroot",
        "quotactl",
        "syslog",
        "iopl",
        "ioperm",
        "lookup_dcookie",
        "fanotify_init",
        "kcmp",
        "pidfd_getfd",
        "sethostname",
        "setdomainname",
        "uselib",
        "sysfs",
        "ustat",
        "vhangup",
        "mbind",
        "set_mempolicy",
        "migrate_pages",
        "move_pages",
        "memfd_secret",
    ];

    const CLONE_NAMESPACE_FLAGS: &[u64] = &[
        0x0002_0000, // CLONE_NEWNS
        0x0200_0000, // CLONE_NEWCGROUP
        0x0400_0000, // CLONE_NEWUTS
        0x0800_0000, // CLONE_NEWIPC
        0x1000_0000, // CLONE_NEWUSER
        0x2000_0000, // CLONE_NEWPID
        0x4000_0000, // CLONE_NEWNET
    ];

    fn policy() -> Value {
        serde_json::from_str(BUILTIN_POLICY_JSON).unwrap()
    }

    fn rules<'a>(policy: &'a Value, filter: &str) -> &'a Vec<Value> {
        policy[filter]["filter"].as_array().unwrap()
    }

    /// Syscalls with at least one rule without `args`.
    fn unconditional(policy: &Value, filter: &str) -> BTreeSet<String> {
        rules(policy, filter)
            .iter()
            .filter(|rule| rule.get("args").is_none())
            .map(|rule| rule["syscall"].as_str().unwrap().to_owned())
            .collect()
    }

    /// The argument conditions of every rule for `syscall`.
    fn conditions<'a>(policy: &'a Value, filter: &str, syscall: &str) -> Vec<&'a Vec<Value>> {
        rules(policy, filter)
            .iter()
            .filter(|rule| rule["syscall"] == syscall)
            .map(|rule| rule["args"].as_array().unwrap())
            .collect()
    }

    fn condition(index: u64, op: Value, val: u64) -> (u64, String, Value, u64) {
        (index, "dword".to_owned(), op, val)
    }

    fn shape(conditions: &[Value]) -> Vec<(u64, String, Value, u64)> {
        conditions
            .iter()
            .map(|c| {
                (
                    c["index"].as_u64().unwrap(),
                    c["type"].as_str().unwrap().to_owned(),
                    c["op"].clone(),
                    c["val"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn builtin_policy_compiles() {
        let compiled = CompiledSeccomp::builtin().unwrap();
        for name in FilterName::INSTALL_ORDER {
            let len = compiled.program(name).len();
            assert!(len > 3 && len <= BPF_MAX_INSTRUCTIONS, "{name}: {len}");
        }
    }

    #[test]
    fn the_programs_compiled_at_build_time_are_the_policys() {
        // The built-in programs skip parsing at run time: the policy they come from must
        // pass every check of `SeccompPolicy::parse` and compile to exactly them.
        let at_run_time = SeccompPolicy::builtin().unwrap().to_bpf().unwrap();
        assert_eq!(CompiledSeccomp::builtin().unwrap(), at_run_time);
    }

    #[test]
    fn program_bytes_are_sock_filters_in_native_order() {
        let compiled = CompiledSeccomp::builtin().unwrap();
        for name in FilterName::INSTALL_ORDER {
            let program = compiled.program(name);
            let bytes = compiled.program_bytes(name);
            assert_eq!(bytes.len(), program.len() * SOCK_FILTER_BYTES);
            // The kernel's own layout, as seccompiler hands it to prctl.
            let filters: Vec<sock_filter> =
                program.iter().copied().map(sock_filter::from).collect();
            for (chunk, insn) in bytes.chunks(SOCK_FILTER_BYTES).zip(&filters) {
                assert_eq!(u16::from_ne_bytes([chunk[0], chunk[1]]), insn.code);
                assert_eq!((chunk[2], chunk[3]), (insn.jt, insn.jf));
                assert_eq!(
                    u32::from_ne_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]),
                    insn.k
                );
            }
        }
        assert_eq!(std::mem::size_of::<sock_filter>(), SOCK_FILTER_BYTES);
    }

    #[test]
    fn filters_have_the_specified_actions() {
        let policy = policy();
        assert_eq!(policy.as_object().unwrap().len(), 2);
        assert_eq!(
            policy["allow"]["mismatch_action"],
            serde_json::json!({"errno": 38})
        );
        assert_eq!(policy["allow"]["match_action"], "allow");
        assert_eq!(policy["deny"]["mismatch_action"], "allow");
        assert_eq!(
            policy["deny"]["match_action"],
            serde_json::json!({"errno": 1})
        );
    }

    #[test]
    fn every_rule_has_a_comment() {
        let policy = policy();
        for filter in ["allow", "deny"] {
            for rule in rules(&policy, filter) {
                let comment = rule["comment"].as_str().unwrap_or_default();
                assert!(!comment.trim().is_empty(), "{filter}: {rule}");
            }
        }
    }

    #[test]
    fn unconditional_denies_are_not_allowed() {
        let policy = policy();
        let denied = unconditional(&policy, "deny");
        let allowed: BTreeSet<String> = rules(&policy, "allow")
            .iter()
            .map(|rule| rule["syscall"].as_str().unwrap().to_owned())
            .collect();
        let both: Vec<_> = denied.intersection(&allowed).collect();
        assert!(both.is_empty(), "denied but allowed: {both:?}");
    }

    #[test]
    fn deny_filter_covers_the_required_syscalls() {
        let policy = policy();
        let denied = unconditional(&policy, "deny");
        let missing: Vec<_> = REQUIRED_DENIED
            .iter()
            .filter(|name| !denied.contains(**name))
            .collect();
        assert!(missing.is_empty(), "not denied: {missing:?}");
    }

    #[test]
    fn deny_filter_refuses_namespace_flags_of_clone() {
        let policy = policy();
        let rules: Vec<_> = conditions(&policy, "deny", "clone")
            .into_iter()
            .map(|c| shape(c))
            .collect();
        let expected: Vec<_> = CLONE_NAMESPACE_FLAGS
            .iter()
            .map(|&bit| vec![condition(0, serde_json::json!({ "masked_eq": bit }), bit)])
            .collect();
        assert_eq!(rules, expected);
    }

    #[test]
    fn deny_filter_refuses_raw_and_packet_sockets() {
        let policy = policy();
        let rules: Vec<_> = conditions(&policy, "deny", "socket")
            .into_iter()
            .map(|c| shape(c))
            .collect();
        let raw = |domain| {
            vec![
                condition(0, "eq".into(), domain),
                condition(1, serde_json::json!({ "masked_eq": 15 }), 3),
            ]
        };
        let expected = vec![vec![condition(0, "eq".into(), 17)], raw(2), raw(10)];
        assert_eq!(rules, expected);
    }

    #[test]
    fn deny_filter_refuses_terminal_injection() {
        let policy = policy();
        let rules: Vec<_> = conditions(&policy, "deny", "ioctl")
            .into_iter()
            .map(|c| shape(c))
            .collect();
        // Compared as dword: the kernel truncates the request to 32 bits, so a qword
        // comparison could be bypassed by setting high bits.
        let expected = vec![
            vec![condition(1, "eq".into(), 0x5412)],
            vec![condition(1, "eq".into(), 0x541C)],
        ];
        assert_eq!(rules, expected);
    }

    #[test]
    fn allow_filter_restricts_socket_domains_and_personality() {
        let policy = policy();
        for syscall in ["socket", "socketpair"] {
            let rules: Vec<_> = conditions(&policy, "allow", syscall)
                .into_iter()
                .map(|c| shape(c))
                .collect();
            let expected: Vec<_> = [1, 2, 10, 16]
                .into_iter()
                .map(|domain| vec![condition(0, "eq".into(), domain)])
                .collect();
            assert_eq!(rules, expected, "{syscall}");
        }
        let rules: Vec<_> = conditions(&policy, "allow", "personality")
            .into_iter()
            .map(|c| shape(c))
            .collect();
        let expected: Vec<_> = [0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff]
            .into_iter()
            .map(|persona| vec![condition(0, "eq".into(), persona)])
            .collect();
        assert_eq!(rules, expected);
    }

    #[test]
    fn clone3_is_absent_and_clone_says_why() {
        let policy = policy();
        for filter in ["allow", "deny"] {
            assert!(
                rules(&policy, filter)
                    .iter()
                    .all(|rule| rule["syscall"] != "clone3"),
                "{filter}"
            );
        }
        let clone = rules(&policy, "allow")
            .iter()
            .find(|rule| rule["syscall"] == "clone")
            .unwrap();
        assert!(clone.get("args").is_none());
        assert!(clone["comment"].as_str().unwrap().contains("clone3"));
    }

    #[test]
    fn allow_filter_lets_the_deny_filter_be_installed() {
        // The deny filter is installed after the allow filter, through it.
        let allowed = unconditional(&policy(), "allow");
        for syscall in ["seccomp", "prctl"] {
            assert!(allowed.contains(syscall), "{syscall}");
        }
    }

    #[test]
    fn compiled_policy_round_trips_through_json() {
        let compiled = CompiledSeccomp::builtin().unwrap();
        let json = serde_json::to_string(&compiled).unwrap();
        assert!(json.starts_with("{\"allow\":[["), "{}", &json[..40]);
        let back: CompiledSeccomp = serde_json::from_str(&json).unwrap();
        assert_eq!(back, compiled);
    }

    const MINIMAL: &str = r#"{
        "allow": {"mismatch_action": {"errno": 38}, "match_action": "allow",
                  "filter": [{"syscall": "read", "comment": "read"}]},
        "deny": {"mismatch_action": "allow", "match_action": {"errno": 1},
                 "filter": [{"syscall": "mount", "comment": "mount"}]}
    }"#;

    #[test]
    fn minimal_policy_compiles() {
        let compiled = CompiledSeccomp::from_policy_json(MINIMAL).unwrap();
        assert!(!compiled.program(FilterName::Allow).is_empty());
    }

    #[test]
    fn unexpected_policies_are_refused() {
        let unknown = MINIMAL.replace("\"deny\"", "\"extra\"");
        assert!(matches!(
            CompiledSeccomp::from_policy_json(&unknown),
            Err(SeccompError::UnknownFilter { name }) if name == "extra"
        ));

        let missing = r#"{"allow": {"mismatch_action": {"errno": 38}, "match_action": "allow",
            "filter": [{"syscall": "read", "comment": "read"}]}}"#;
        assert!(matches!(
            CompiledSeccomp::from_policy_json(missing),
            Err(SeccompError::MissingFilter {
                name: FilterName::Deny
            })
        ));

        let uncommented = MINIMAL.replace(", \"comment\": \"mount\"", "");
        assert!(matches!(
            CompiledSeccomp::from_policy_json(&uncommented),
            Err(SeccompError::ParsePolicy(_))
        ));

        let empty_comment = MINIMAL.replace("\"comment\": \"mount\"", "\"comment\": \" \"");
        assert!(matches!(
            CompiledSeccomp::from_policy_json(&empty_comment),
            Err(SeccompError::MissingComment {
                filter: FilterName::Deny,
                ..
            })
        ));

        let unknown_syscall = MINIMAL.replace("\"mount\",", "\"no_such_call\",");
        assert!(matches!(
            CompiledSeccomp::from_policy_json(&unknown_syscall),
            Err(SeccompError::CompilePolicy(_))
        ));

        let unknown_field =
            MINIMAL.replace("\"syscall\": \"read\"", "\"syscall\": \"read\", \"x\": 1");
        assert!(matches!(
            CompiledSeccomp::from_policy_json(&unknown_field),
            Err(SeccompError::ParsePolicy(_))
        ));
    }

    #[test]
    fn mixing_unconditional_and_conditional_rules_is_refused() {
        let mixed = MINIMAL.replace(
            r#"{"syscall": "mount", "comment": "mount"}"#,
            r#"{"syscall": "mount", "comment": "mount"},
               {"syscall": "mount", "comment": "again",
                "args": [{"index": 0, "type": "dword", "op": "eq", "val": 0}]}"#,
        );
        assert!(matches!(
            CompiledSeccomp::from_policy_json(&mixed),
            Err(SeccompError::ConflictingRules { filter: FilterName::Deny, syscall })
                if syscall == "mount"
        ));
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn syscall_numbers_match_libc() {
        assert_eq!(syscall_number("read").unwrap(), libc::SYS_read as u32);
        assert_eq!(syscall_number("clone").unwrap(), libc::SYS_clone as u32);
        assert_eq!(
            syscall_number("io_uring_setup").unwrap(),
            libc::SYS_io_uring_setup as u32
        );
        assert!(syscall_number("no_such_call").is_err());
    }

    #[test]
    fn rendered_policy() {
        insta::assert_snapshot!(render_policy(BUILTIN_POLICY_JSON).unwrap());
    }
}
