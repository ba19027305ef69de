//! A `dir:` rootfs (for example one made by debootstrap) replaces the host's view.

use pretty_assertions::assert_eq;

use super::common::TestEnv;
use crate::require_native;

/// Where `.ci/run` puts a debootstrap minbase rootfs.
const ROOTFS_ENV: &str = "AIRLOCK_TEST_ROOTFS";

#[test]
fn dir_rootfs_is_the_jobs_whole_world() {
    require_native!();
    let rootfs = std::env::var(ROOTFS_ENV).unwrap_or_default();
    airlock_testkit::require!(
        !rootfs.is_empty() && std::path::Path::new(&rootfs).join("usr").is_dir(),
        format!("{ROOTFS_ENV} does not name a rootfs (.ci/run builds one with debootstrap)")
    );
    let env = TestEnv::new();
    let policy = env.policy(&format!("[filesystem]\nrootfs = \"dir:{rootfs}\""));
    let source = "cat /etc/debian_version >/dev/null && echo debian\n\
                  command -v python3 || echo no-python\n\
                  id -un\n\
                  touch /usr/x 2>/dev/null || echo usr-read-only";
    let run = env.run_json(&[
        "--policy",
        policy.to_str().unwrap(),
        "-l",
        "sh",
        "-c",
        source,
    ]);
    assert_eq!(run.obs["ok"], true, "{:#}", run.obs);
    assert_eq!(
        run.obs["stdout"],
        "debian\nno-python\nnobody\nusr-read-only\n"
    );
}
