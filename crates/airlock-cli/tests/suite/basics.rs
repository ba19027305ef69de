//! A job runs, its output and exit code come back, the audit line is written.

use std::os::unix::fs::PermissionsExt;

use pretty_assertions::assert_eq;

use super::common::TestEnv;
use crate::require_native;

#[test]
fn readme_hello_job_prints_45() {
    require_native!();
    let env = TestEnv::new();
    let run = env.run_json(&["-c", "print(sum(range(10)))"]);
    assert_eq!(run.obs["ok"], true, "{:#}", run.obs);
    assert_eq!(run.obs["outcome"], "exited");
    assert_eq!(run.obs["exit_code"], 0);
    assert_eq!(run.obs["stdout"], "45\n");
    assert_eq!(run.obs["stdout_bytes"], 3);
    assert_eq!(run.obs["backend"], "native");
    assert_eq!(run.obs["policy_version"], "default-1");
    assert!(run.obs["cpu_ms"].as_u64().is_some());
    assert!(run.obs["peak_memory_bytes"].as_u64().is_some_and(|b| b > 0));
    assert_eq!(run.code, 0);
}

#[test]
fn text_mode_shows_output_and_a_summary() {
    require_native!();
    let env = TestEnv::new();
    let out = env
        .cmd()
        .args(["run", "-c", "print(sum(range(10)))"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "45\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("airlock: exited 0"), "{stderr}");
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn shell_languages_run() {
    require_native!();
    let env = TestEnv::new();
    for lang in ["bash", "sh"] {
        let run = env.run_json(&["-l", lang, "-c", "echo \"$((6*7))\"; id -u"]);
        assert_eq!(run.obs["stdout"], "42\n65534\n", "{lang}: {:#}", run.obs);
    }
}

#[test]
fn node_runs_when_the_rootfs_has_it() {
    require_native!();
    airlock_testkit::require!(
        std::path::Path::new("/usr/bin/node").exists(),
        "node is not installed on this host"
    );
    let env = TestEnv::new();
    let run = env.run_json(&[
        "-l",
        "node",
        "-c",
        "console.log([1,2,3].map(x => x * 2).join(','))",
    ]);
    assert_eq!(run.obs["stdout"], "2,4,6\n", "{:#}", run.obs);
}

#[test]
fn language_comes_from_the_file_extension() {
    require_native!();
    let env = TestEnv::new();
    let script = env.path().join("job.sh");
    std::fs::write(&script, "echo from-sh\n").unwrap();
    let run = env.run_json(&[script.to_str().unwrap()]);
    assert_eq!(run.obs["stdout"], "from-sh\n", "{:#}", run.obs);
}

#[test]
fn stdin_args_and_input_files_reach_the_program() {
    require_native!();
    let env = TestEnv::new();
    let input = env.path().join("data.csv");
    std::fs::write(&input, "a,b\n1,2\n").unwrap();
    let tool = env.path().join("tool.sh");
    std::fs::write(&tool, "#!/bin/sh\necho tool-ran\n").unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let stdin = env.path().join("stdin.txt");
    std::fs::write(&stdin, "from stdin\n").unwrap();
    let source = "import sys, subprocess\n\
                  print(open('/work/in/data.csv').read().splitlines()[1])\n\
                  print(sys.stdin.read().strip())\n\
                  print(sys.argv[1:])\n\
                  print(subprocess.run(['/work/tool.sh'], capture_output=True, text=True).stdout.strip())";
    let run = env.run_json(&[
        "-c",
        source,
        "--file",
        &format!("in/data.csv={}", input.display()),
        "--file",
        &format!("tool.sh={}", tool.display()),
        "--stdin",
        stdin.to_str().unwrap(),
        "--",
        "x",
        "y z",
    ]);
    assert_eq!(
        run.obs["stdout"], "1,2\nfrom stdin\n['x', 'y z']\ntool-ran\n",
        "{:#}",
        run.obs
    );
}

#[test]
fn every_job_gets_one_audit_line_with_the_source_hash() {
    require_native!();
    let env = TestEnv::new();
    let source = "print('audited-source-text')";
    let ok = env.run_json(&["-c", source]);
    let refused = env.run_json(&["-l", "cobol", "-c", "x"]);
    let lines = env.audit_lines();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["job_id"], ok.obs["job_id"]);
    assert_eq!(lines[1]["job_id"], refused.obs["job_id"]);
    let expected = format!("sha256:{}", {
        use std::io::Write;
        let mut child = std::process::Command::new("sha256sum")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(source.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        String::from_utf8(out.stdout).unwrap()[..64].to_owned()
    });
    assert_eq!(lines[0]["source_sha256"], expected.as_str());
    assert_eq!(lines[0]["outcome"], "exited");
    assert_eq!(lines[0]["backend"], "native");
    assert_eq!(lines[0]["policy_version"], "default-1");
    assert_eq!(lines[0]["limits"]["memory"], "256MiB");
    assert_eq!(lines[0]["stdout_bytes"], 20);
    assert!(lines[0]["duration_ms"].as_u64().is_some());
    assert_eq!(lines[1]["error_kind"], "invalid_input");
    let raw = std::fs::read_to_string(env.path().join("audit.jsonl")).unwrap();
    assert!(
        !raw.contains("audited-source-text"),
        "the audit log holds the source"
    );
}

#[test]
fn on_cgroup_v2_the_sandbox_is_created_inside_its_cgroup() {
    require_native!();
    // A pure v2 host (cgroup2 at /sys/fs/cgroup): the helper is created in the job's group
    // by clone3(CLONE_INTO_CGROUP); elsewhere it joins it by writing cgroup.procs.
    let v2 = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let env = TestEnv::new();
    let mut cmd = env.cmd();
    cmd.env("AIRLOCK_LOG", "airlock_native=debug");
    cmd.args(["run", "--json", "-l", "sh", "-c", "cat /proc/self/cgroup"]);
    let run = super::common::json_run(cmd.output().unwrap());
    assert_eq!(run.obs["ok"], true, "{:#}\n{}", run.obs, run.stderr);
    let expected = if v2 {
        "placement=Born"
    } else {
        "placement=Joins"
    };
    assert!(run.stderr.contains(expected), "v2 {v2}: {}", run.stderr);
    // Inside, the job's cgroup namespace is rooted at its own group either way.
    let cgroups = run.obs["stdout"].as_str().unwrap();
    assert!(cgroups.lines().all(|l| l.ends_with(":/")), "{cgroups}");
}

/// The sandbox's init is named neutrally: a job reading `/proc/1/cmdline` learns nothing of
/// the host's layout (where the airlock binary lives).
#[test]
fn the_init_does_not_show_the_host_path_of_airlock() {
    require_native!();
    let env = TestEnv::new();
    let run = env.run_json(&[
        "-c",
        "print(open('/proc/1/cmdline', 'rb').read().split(b'\\0')[0].decode())",
    ]);
    assert_eq!(run.obs["stdout"], "init\n", "{:#}", run.obs);
}

/// Issue 30 item 2: a helper module passed next to the code imports, while what `-I`
/// closes stays closed (PYTHON* variables ignored, no user site), and importing it leaves
/// no `__pycache__` behind.
#[test]
fn input_files_import_and_isolation_holds() {
    require_native!();
    let env = TestEnv::new();
    let util = env.path().join("util.py");
    std::fs::write(&util, "def answer():\n    return 42\n").unwrap();
    let pkg = env.path().join("helpers.py");
    std::fs::write(&pkg, "NAME = 'helpers'\n").unwrap();
    let run = env.run_json(&[
        "--file",
        &format!("util.py={}", util.display()),
        "--file",
        &format!("lib/helpers.py={}", pkg.display()),
        "-c",
        "import os, sys, util\nprint(util.answer(), sys.path[0], sys.flags.ignore_environment, sys.flags.no_user_site)\nprint(sorted(os.listdir('/work')))\nimport lib.helpers\nprint(lib.helpers.NAME)",
    ]);
    assert_eq!(run.obs["outcome"], "exited", "{:#}", run.obs);
    assert_eq!(
        run.obs["stdout"], "42 /work 1 1\n['.airlock-main.py', 'lib', 'util.py']\nhelpers\n",
        "{:#}",
        run.obs
    );
}

/// Issue 30 item 1: `main.py` is the user's name; the source has a name of airlock's own,
/// which an input file may not take.
#[test]
fn an_input_main_py_is_the_users_and_the_source_name_is_reserved() {
    require_native!();
    let env = TestEnv::new();
    let main = env.path().join("main.py");
    std::fs::write(&main, "print('the user main')\n").unwrap();
    let run = env.run_json(&[
        "--file",
        &format!("main.py={}", main.display()),
        "-c",
        "print(open('/work/main.py').read(), end='')\nimport main",
    ]);
    assert_eq!(
        run.obs["stdout"], "print('the user main')\nthe user main\n",
        "{:#}",
        run.obs
    );
    for reserved in [".airlock-main.py", ".airlock/x"] {
        let run = env.run_json(&[
            "--file",
            &format!("{reserved}={}", main.display()),
            "-c",
            "pass",
        ]);
        assert_eq!(run.obs["error"]["kind"], "invalid_input", "{:#}", run.obs);
        assert!(
            run.obs["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("airlock's own")),
            "{:#}",
            run.obs
        );
    }
}
