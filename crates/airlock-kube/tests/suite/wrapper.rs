//! The wrapper the Pod runs, run here by a real `/bin/sh` with a kubelet-like environment:
//! the program sees exactly the job's environment and argv, the rlimits are lowered, and
//! split mode writes its markers first.

use std::process::Command;

use airlock_core::JobSpec;
use airlock_core::policy::KubeLogStreams;
use airlock_kube::pod;
use pretty_assertions::assert_eq;

use super::common::{policy, python};

fn run(job: &JobSpec, streams: KubeLogStreams) -> (String, String) {
    let inputs = pod::inputs(job).unwrap();
    let cmd = pod::command(job, &inputs, streams);
    let out = Command::new(&cmd[0])
        .args(&cmd[1..])
        .env_clear()
        // What a kubelet adds to every container.
        .env("KUBERNETES_SERVICE_HOST", "10.0.0.1")
        .env("HOSTNAME", "airlock")
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn the_program_sees_exactly_the_jobs_environment() {
    let policy = policy();
    let mut job = python(&policy, "1");
    job.argv = vec!["/usr/bin/env".into()];
    let (stdout, _) = run(&job, KubeLogStreams::Merged);
    let expected: String = job.env.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    assert_eq!(stdout, expected);
}

#[test]
fn argv_arrives_untouched() {
    let policy = policy();
    let mut job = python(&policy, "1");
    let args = ["it's", "a b", "$HOME", "\"q\"", "`id`", "*", ""];
    job.argv = vec!["/usr/bin/printf".into(), "[%s]\\n".into()];
    job.argv.extend(args.iter().map(|a| (*a).to_owned()));
    let (stdout, _) = run(&job, KubeLogStreams::Merged);
    let expected: String = args.iter().map(|a| format!("[{a}]\n")).collect();
    assert_eq!(stdout, expected);
}

#[test]
fn rlimits_are_lowered_and_stdin_is_empty() {
    let policy = policy();
    let mut job = python(&policy, "1");
    job.argv = vec![
        "/bin/sh".into(),
        "-c".into(),
        // `ulimit -c` would show 1 byte as 0 blocks.
        "ulimit -n; ulimit -f; grep '^Max core' /proc/self/limits | tr -s ' '; cat; echo end"
            .into(),
    ];
    let (stdout, _) = run(&job, KubeLogStreams::Merged);
    let blocks = job.limits.file_size.as_u64() / 512;
    assert_eq!(
        stdout,
        format!(
            "{}\n{blocks}\nMax core file size 1 1 bytes \nend\n",
            job.limits.open_files
        )
    );
}

#[test]
fn split_mode_marks_both_streams_first() {
    let policy = policy();
    let mut job = python(&policy, "1");
    job.argv = vec![
        "/bin/sh".into(),
        "-c".into(),
        "echo out; echo err >&2".into(),
    ];
    let (stdout, stderr) = run(&job, KubeLogStreams::Split);
    assert_eq!(stdout, format!("airlock-stdout:{}\nout\n", job.id));
    assert_eq!(stderr, format!("airlock-stderr:{}\nerr\n", job.id));
}
