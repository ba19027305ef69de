//! The real probe, run on the host outside any sandbox: its report must be well formed and
//! match what this test process sees, and running it (as root, here) must change nothing.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

use airlock_testkit::{DangerousCall, Outcome, ProbeReport, REPORT_VERSION, parse_proc_status};

const PROBE: &str = env!("CARGO_BIN_EXE_airlock-probe");

const MARKER_NAME: &str = "AIRLOCK_PROBE_TEST_MARKER";
const MARKER_VALUE: &str = "visible-to-the-probe";

fn run_probe(args: &[&str]) -> ProbeReport {
    let output = Command::new(PROBE)
        .arg("report")
        .args(args)
        .env(MARKER_NAME, MARKER_VALUE)
        .output()
        .expect("probe runs");
    assert!(
        output.status.success(),
        "probe failed: {:?}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).expect("UTF-8 report");
    assert_eq!(stdout.lines().count(), 1, "one line of JSON: {stdout}");
    ProbeReport::from_json(&stdout).expect("report parses")
}

fn scratch_files_left(pid: i32) -> Vec<String> {
    ["/", "/work", "/usr", "/etc", "/tmp", "/dev"]
        .iter()
        .flat_map(|dir| {
            ["write", "exec", "fill"]
                .map(|what| Path::new(dir).join(format!(".airlock-probe-{what}-{pid}")))
        })
        .filter(|path| path.symlink_metadata().is_ok())
        .map(|path| path.display().to_string())
        .collect()
}

#[test]
fn host_report_is_well_formed_and_matches_this_process() {
    let report = run_probe(&[]);
    assert_eq!(report.version, REPORT_VERSION);
    assert!(report.notes.is_empty(), "notes: {:?}", report.notes);

    let identity = &report.identity;
    assert_eq!(identity.uid, rustix::process::getuid().as_raw());
    assert_eq!(identity.gid, rustix::process::getgid().as_raw());
    assert_eq!(identity.euid, rustix::process::geteuid().as_raw());
    assert_eq!(identity.egid, rustix::process::getegid().as_raw());
    assert_eq!(identity.ppid, rustix::process::getpid().as_raw_pid());
    assert!(identity.pid > 0);
    assert!(!identity.hostname.is_empty());
    assert!(identity.visible_processes.unwrap_or(0) >= 2);

    let ours = parse_proc_status(&std::fs::read_to_string("/proc/self/status").unwrap()).unwrap();
    let status = report.status.as_ref().expect("status read");
    assert_eq!(status.cap_bnd, ours.cap_bnd);
    assert_eq!(status.seccomp, ours.seccomp);
    assert_eq!(status.no_new_privs, ours.no_new_privs);
    if identity.euid == 0 && ours.seccomp == 0 {
        // Root on a plain host: full capabilities, no filter.
        assert_eq!(status.cap_eff, status.cap_bnd);
    }

    assert_eq!(
        report.env.get(MARKER_NAME).map(String::as_str),
        Some(MARKER_VALUE)
    );
    assert!(
        report
            .network
            .interfaces
            .as_ref()
            .unwrap()
            .contains(&"lo".to_owned())
    );
    assert_eq!(report.network.canary, None);
    assert_eq!(report.fill_tmp, None);
    assert!(report.paths.exists["/etc/passwd"]);
    assert!(report.paths.passwd_lines.unwrap() >= 1);
    assert!(
        report
            .paths
            .etc_entries
            .as_ref()
            .unwrap()
            .contains(&"passwd".to_owned())
    );
    assert!(
        report
            .paths
            .dev_entries
            .as_ref()
            .unwrap()
            .contains(&"null".to_owned())
    );

    let rlimits = &report.rlimits;
    let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    assert_eq!(rlimits.nofile.soft, nofile.current);
    assert_eq!(rlimits.nofile.hard, nofile.maximum);

    let json = report.to_json().unwrap();
    assert_eq!(ProbeReport::from_json(&json).unwrap(), report);
}

#[test]
fn host_mounts_and_writes_are_described() {
    let report = run_probe(&[]);
    for path in ["/", "/work", "/tmp", "/proc", "/dev", "/usr", "/etc"] {
        let mount = &report.mounts[path];
        assert_eq!(mount.exists, Path::new(path).exists(), "{path}");
        if mount.exists {
            assert!(mount.read_only.is_some(), "{path}: {mount:?}");
            assert!(mount.fs_type.is_some(), "{path}: {mount:?}");
        }
    }
    assert_eq!(report.mounts["/"].mount_point.as_deref(), Some("/"));
    assert_eq!(report.mounts["/proc"].fs_type.as_deref(), Some("proc"));
    assert_eq!(report.writes.len(), 6);
    assert_eq!(report.writes["/tmp"], Outcome::Ok(0));
    assert_eq!(report.tmp_exec.write, Outcome::Ok(0));
    let tmp_noexec = report.mounts["/tmp"].noexec == Some(true);
    let expected_exec = if tmp_noexec {
        Outcome::errno("EACCES")
    } else {
        Outcome::Ok(0)
    };
    assert_eq!(report.tmp_exec.exec, Some(expected_exec));
    assert_eq!(
        scratch_files_left(report.identity.pid),
        Vec::<String>::new()
    );
}

#[test]
fn host_syscall_attempts_are_harmless() {
    let report = run_probe(&[]);
    assert_eq!(report.syscalls.len(), DangerousCall::ALL.len());
    for &call in DangerousCall::ALL {
        let outcome = report.syscall(call).expect("every call is reported");
        assert!(
            matches!(outcome, Outcome::Ok(_) | Outcome::Errno(_)),
            "{}: {outcome:?}",
            call.name()
        );
    }
    assert!(report.syscall(DangerousCall::Getpid).unwrap().is_ok());
    assert!(
        report
            .syscall(DangerousCall::SocketInetStream)
            .unwrap()
            .is_ok()
    );

    // The arguments make these fail even for root with every capability; EPERM where a
    // filter (a container runtime's, say) stops them first, ENOSYS where the kernel lacks
    // them. None may ever succeed.
    let must_fail: &[(DangerousCall, &[&str])] = &[
        (DangerousCall::Mount, &["ENOENT"]),
        (DangerousCall::Umount2, &["EINVAL"]),
        (DangerousCall::PivotRoot, &["ENOENT"]),
        (DangerousCall::Fsopen, &["EINVAL"]),
        (DangerousCall::Fsmount, &["EINVAL"]),
        (DangerousCall::OpenTree, &["EINVAL"]),
        (DangerousCall::MoveMount, &["EINVAL"]),
        (DangerousCall::MountSetattr, &["EINVAL"]),
        (DangerousCall::Setns, &["EBADF"]),
        (DangerousCall::Bpf, &["EINVAL"]),
        (DangerousCall::Keyctl, &["EOPNOTSUPP"]),
        (DangerousCall::AddKey, &["EINVAL"]),
        (DangerousCall::IoUringSetup, &["EFAULT", "EINVAL"]),
        (DangerousCall::PerfEventOpen, &["EFAULT", "EACCES"]),
        (DangerousCall::Userfaultfd, &["EINVAL"]),
        (DangerousCall::KexecLoad, &["EINVAL"]),
        (DangerousCall::KexecFileLoad, &["EINVAL"]),
        (DangerousCall::InitModule, &["ENOEXEC"]),
        (DangerousCall::FinitModule, &["EINVAL", "EBADF"]),
        (DangerousCall::OpenByHandleAt, &["EBADF", "EFAULT"]),
        (DangerousCall::ClockSettime, &["EINVAL"]),
        (DangerousCall::Settimeofday, &["EINVAL"]),
        (DangerousCall::Reboot, &["EINVAL"]),
        (DangerousCall::Swapon, &["EINVAL"]),
        (DangerousCall::Acct, &["ENOENT"]),
    ];
    for (call, expected) in must_fail {
        let outcome = report.syscall(*call).unwrap();
        let errno = outcome.errno_name().unwrap_or("(none)");
        assert!(
            expected.contains(&errno) || ["EPERM", "ENOSYS"].contains(&errno),
            "{}: {outcome:?}, expected one of {expected:?}, EPERM or ENOSYS",
            call.name()
        );
    }
}

#[test]
fn canary_reports_connect_and_refusal() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let open = listener.local_addr().unwrap().to_string();
    let closed = {
        let spare = TcpListener::bind("127.0.0.1:0").unwrap();
        spare.local_addr().unwrap().to_string()
    };
    let report = run_probe(&["--canary", &open]);
    let canary = report.network.canary.unwrap();
    assert_eq!(canary.target, open);
    assert_eq!(canary.result, Outcome::Ok(0));

    let report = run_probe(&["--canary", &closed]);
    assert_eq!(
        report.network.canary.unwrap().result,
        Outcome::errno("ECONNREFUSED")
    );
}

#[test]
fn fill_tmp_stops_at_an_error_or_the_cap_and_cleans_up() {
    let report = run_probe(&["--fill-tmp"]);
    let fill = report.fill_tmp.expect("fill_tmp reported");
    match &fill.error {
        None => assert_eq!(fill.bytes_written, fill.cap_bytes),
        Some(error) => assert!(fill.bytes_written <= fill.cap_bytes, "{error:?}"),
    }
    assert_eq!(
        scratch_files_left(report.identity.pid),
        Vec::<String>::new()
    );
}

#[test]
fn bad_command_lines_exit_2() {
    for args in [
        &[][..],
        &["scan"],
        &["report", "--canary"],
        &["report", "--bogus"],
    ] {
        let output = Command::new(PROBE).args(args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(output.stdout.is_empty());
    }
}

#[test]
fn probe_path_finds_the_built_probe_from_a_test_executable() {
    if std::env::var_os(airlock_testkit::PROBE_ENV).is_some() {
        eprintln!("skipped: {} is set", airlock_testkit::PROBE_ENV);
        return;
    }
    assert_eq!(airlock_testkit::probe_path(), Path::new(PROBE));
    assert_eq!(airlock_testkit::require_probe().unwrap(), Path::new(PROBE));
}
