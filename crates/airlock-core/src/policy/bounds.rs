//! Absolute sanity bounds. A policy or request outside them is malformed, whatever the
//! policy's own ceilings say.

use std::time::Duration;

/// Shortest wall-time limit.
pub const TIMEOUT_MIN: Duration = Duration::from_millis(10);
/// Longest wall-time limit.
pub const TIMEOUT_MAX: Duration = Duration::from_secs(24 * 3600);
/// Least memory a job can be given (an interpreter needs a few MiB to start).
pub const MEMORY_MIN_BYTES: u64 = 4 * 1024 * 1024;
/// Most memory a job can be given.
pub const MEMORY_MAX_BYTES: u64 = 1 << 40;
/// Smallest CPU share, in thousandths of a CPU.
pub const CPUS_MIN_MILLIS: u32 = 10;
/// Largest CPU share, in thousandths of a CPU.
pub const CPUS_MAX_MILLIS: u32 = 1024 * 1000;
/// Most processes and threads a job can be allowed.
pub const PIDS_MAX: u32 = 65_536;
/// Smallest `/tmp`.
pub const TMP_MIN_BYTES: u64 = 64 * 1024;
/// Largest `/tmp`.
pub const TMP_MAX_BYTES: u64 = 64 << 30;
/// Most output bytes kept per stream (they are held in memory per job).
pub const STREAM_KEEP_MAX_BYTES: u64 = 16 << 20;
/// Largest source a policy may allow.
pub const SOURCE_MAX_BYTES: u64 = 64 << 20;
/// Largest total of input files a policy may allow.
pub const FILES_MAX_BYTES: u64 = 4 << 30;
/// Fewest open files a job can be limited to (interpreters open a dozen at start).
pub const OPEN_FILES_MIN: u32 = 16;
/// Most open files a job can be allowed.
pub const OPEN_FILES_MAX: u32 = 1 << 20;
/// Most input files a policy may allow in one job.
pub const INPUT_FILES_MAX_COUNT: usize = 4096;
/// Most files a policy may let a job release from `/out`.
pub const OUT_FILES_MAX_COUNT: u32 = 4096;
/// Largest `/out` a policy may allow.
pub const OUT_MAX_BYTES: u64 = 4 << 30;
/// Deepest input file path (segments).
pub const INPUT_PATH_MAX_DEPTH: usize = 8;
/// Longest segment of an input file path, in bytes.
pub const INPUT_NAME_MAX_BYTES: usize = 255;
/// Most arguments passed to the program.
pub const ARGS_MAX_COUNT: usize = 256;
/// Longest single argument, in bytes.
pub const ARG_MAX_BYTES: usize = 4096;
/// Most bytes of extra environment (names and values) a job may bring.
pub const ENV_MAX_BYTES: usize = 64 * 1024;
/// Longest policy version string.
pub const VERSION_MAX_BYTES: usize = 64;
/// Most `[filesystem] site_packages` directories.
pub const SITE_PACKAGES_MAX_COUNT: usize = 32;
