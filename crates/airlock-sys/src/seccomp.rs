//! Seccomp: compiling the policy in `policy/seccomp.json` and installing it.
