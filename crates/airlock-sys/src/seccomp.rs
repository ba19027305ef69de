//! Installs the seccomp filters the supervisor compiled (`airlock_seccomp`, where the
//! policy, its checks and its renderings live) on the calling thread.

use airlock_seccomp::{BPF_MAX_INSTRUCTIONS, BpfInstruction, CompiledSeccomp, FilterName};
use seccompiler::{BpfProgram, sock_filter};

/// Why the filters were not installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The policy is written for x86_64 and this build runs elsewhere.
    #[error("seccomp policy is for x86_64 only")]
    UnsupportedArch,
    /// A compiled program is empty or longer than the kernel accepts.
    #[error("seccomp {filter} program has {len} instructions")]
    InvalidProgram {
        /// The filter whose program is invalid.
        filter: FilterName,
        /// Its number of instructions.
        len: usize,
    },
    /// The kernel refused to install a filter.
    #[error("install seccomp {filter} filter")]
    Install {
        /// The filter that could not be installed.
        filter: FilterName,
        /// What seccompiler reported.
        #[source]
        source: seccompiler::Error,
    },
}

/// Installs both filters of `compiled` on the calling thread, `allow` then `deny`.
///
/// Preconditions: the caller is single-threaded (no TSYNC is used, so other threads
/// would stay unfiltered) and has already set `no_new_privs` (seccompiler sets it again,
/// which is harmless). Run it just before `execve`: the filters apply to everything the
/// thread does afterwards, including the rest of this function.
///
/// Every program is converted and checked before the first filter goes in; nothing
/// allocates after that. An error after the first filter leaves the thread partly
/// filtered: the caller must not exec the job then.
pub fn install(compiled: &CompiledSeccomp) -> Result<(), InstallError> {
    if !cfg!(target_arch = "x86_64") {
        return Err(InstallError::UnsupportedArch);
    }
    let programs = FilterName::INSTALL_ORDER
        .into_iter()
        .map(|filter| Ok((filter, to_program(filter, compiled.program(filter))?)))
        .collect::<Result<Vec<_>, InstallError>>()?;
    for (filter, program) in &programs {
        seccompiler::apply_filter(program).map_err(|source| InstallError::Install {
            filter: *filter,
            source,
        })?;
    }
    Ok(())
}

/// Converts a program to seccompiler's type, checking the length the kernel accepts
/// (seccompiler truncates the length to `u16` without checking).
fn to_program(filter: FilterName, program: &[BpfInstruction]) -> Result<BpfProgram, InstallError> {
    if program.is_empty() || program.len() > BPF_MAX_INSTRUCTIONS {
        return Err(InstallError::InvalidProgram {
            filter,
            len: program.len(),
        });
    }
    Ok(program.iter().copied().map(sock_filter::from).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compiled(allow: Vec<BpfInstruction>, deny: Vec<BpfInstruction>) -> CompiledSeccomp {
        // As the init receives it: the plan's JSON.
        serde_json::from_value(serde_json::json!({ "allow": allow, "deny": deny })).unwrap()
    }

    #[test]
    fn oversized_programs_are_not_installed() {
        assert!(matches!(
            install(&compiled(Vec::new(), Vec::new())),
            Err(InstallError::InvalidProgram {
                filter: FilterName::Allow,
                len: 0
            })
        ));
        let insn = BpfInstruction {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: 0x7fff_0000,
        };
        let huge = compiled(vec![insn; 1], vec![insn; BPF_MAX_INSTRUCTIONS + 1]);
        // Checked before anything is installed, so this thread stays unfiltered.
        assert!(matches!(
            install(&huge),
            Err(InstallError::InvalidProgram { filter: FilterName::Deny, len }) if len == 4097
        ));
    }
}
