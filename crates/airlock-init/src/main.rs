//! airlock-init: the sandbox init ([`airlock_init::init::main`]) as an executable of its
//! own, small and statically linked, which the native backend carries inside the airlock
//! binary and executes for each sandbox instead of the whole airlock binary
//! (`crates/airlock-native/src/init_program.rs`, built by that crate's `build.rs`).
//!
//! It holds no code of its own and must not grow any: anything the init does belongs in the
//! library, which the airlock binary runs too.
#![forbid(unsafe_code)]

fn main() {
    airlock_init::init::main()
}
