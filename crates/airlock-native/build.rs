//! Builds the sandbox init as a small static executable (crates/airlock-init) and leaves it
//! in `OUT_DIR/airlock-init`, for `src/init_program.rs` to carry inside the airlock binary.
//!
//! Why: the helper that builds each sandbox used to be the whole airlock binary executed
//! again (about 30 MB, dynamically linked, 35,000 relocations): about 1.1 ms of CPU and
//! 230 more page faults per job than a small static executable on this project's machine,
//! and about 70 ms per job in the cgroup v2 VM, where every page fault is emulated
//! (docs/speed.md). Cargo cannot depend on another package's binary on stable, so this
//! script runs cargo once more for that one package: its own target directory, release
//! mode, `+crt-static`, the same lock file, offline (every crate it needs is already there:
//! it needs a subset of this crate's dependencies).
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() -> Result<(), String> {
    let var = |name: &str| env::var_os(name).ok_or_else(|| format!("cargo did not set {name}"));
    let manifest_dir = PathBuf::from(var("CARGO_MANIFEST_DIR")?);
    let workspace = manifest_dir
        .parent()
        .and_then(Path::parent)
        .ok_or("crates/airlock-native is not two levels below the workspace root")?
        .to_path_buf();
    let out_dir = PathBuf::from(var("OUT_DIR")?);
    let target = var("TARGET")?;
    let cargo = var("CARGO").unwrap_or_else(|_| "cargo".into());

    // What the init is made of: rebuild when any of it changes. Directories are scanned
    // whole by cargo.
    for path in [
        "crates/airlock-init",
        "crates/airlock-sys/src",
        "crates/airlock-sys/Cargo.toml",
        "crates/airlock-seccomp/src",
        "crates/airlock-seccomp/build.rs",
        "crates/airlock-seccomp/Cargo.toml",
        "crates/airlock-host/src",
        "crates/airlock-host/Cargo.toml",
        "crates/airlock-core/src",
        "crates/airlock-core/Cargo.toml",
        "policy",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", workspace.join(path).display());
    }

    // One target directory per build profile of the outer build (OUT_DIR is
    // TARGET_DIR/[TRIPLE/]PROFILE/build/airlock-native-HASH/out), shared by its check,
    // test and build runs, so the init is compiled once per profile, not once per hash.
    let init_target_dir = out_dir
        .ancestors()
        .nth(3)
        .unwrap_or(&out_dir)
        .join("airlock-init-build");

    // Flags of the outer build for the target, plus a static C runtime. With `--target`
    // they apply to the init only, not to build scripts and proc-macros (which cannot be
    // static).
    let mut rustflags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    for flag in ["-C", "target-feature=+crt-static"] {
        if !rustflags.is_empty() {
            rustflags.push('\x1f');
        }
        rustflags.push_str(flag);
    }

    let mut command = Command::new(&cargo);
    command
        .current_dir(&workspace)
        .args(["build", "--release", "--locked", "--offline", "--quiet"])
        .args(["--package", "airlock-init", "--bin", "airlock-init"])
        .arg("--target")
        .arg(&target)
        .arg("--target-dir")
        .arg(&init_target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", &rustflags)
        // Small and quick to load: the whole program optimized together, for size, no
        // unwinding tables to map, no symbols.
        .env("CARGO_PROFILE_RELEASE_LTO", "true")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "s")
        .env("CARGO_PROFILE_RELEASE_PANIC", "abort")
        .env("CARGO_PROFILE_RELEASE_STRIP", "true")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        // Not the outer build's: clippy's driver (and its -D warnings) when the outer run
        // is `cargo clippy`, a target directory or flags of its own.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS");
    let status = command
        .status()
        .map_err(|e| format!("run {}: {e}", Path::new(&cargo).display()))?;
    if !status.success() {
        return Err(format!(
            "building the sandbox init (crates/airlock-init) failed: {status}"
        ));
    }

    let built = init_target_dir
        .join(&target)
        .join("release")
        .join("airlock-init");
    let carried = out_dir.join("airlock-init");
    std::fs::copy(&built, &carried)
        .map_err(|e| format!("copy {} to {}: {e}", built.display(), carried.display()))?;
    Ok(())
}
