//! airlock-init: the sandbox init (`airlock_native::init::main`) as an executable of its
//! own, small and statically linked, which the native backend carries inside the airlock
//! binary and executes for each sandbox instead of the whole airlock binary
//! (`crates/airlock-native/src/init_program.rs`, built by that crate's `build.rs`).
//!
//! It compiles the very same source files as airlock-native (`init.rs`, the steps, and
//! `plan.rs`, the plan they execute), so the sandbox it builds is the same, step by step,
//! whichever executable builds it. It holds no code of its own and must not grow any:
//! anything the init does belongs in those files. No `unsafe` here either: that lives in
//! airlock-sys.
#![forbid(unsafe_code)]

// The supervisor's half of the plan (constants, builders) is unused here.
#[allow(dead_code, unused_imports)]
#[path = "../../airlock-native/src/plan.rs"]
mod plan;

#[path = "../../airlock-native/src/init.rs"]
mod init;

fn main() {
    init::main()
}
