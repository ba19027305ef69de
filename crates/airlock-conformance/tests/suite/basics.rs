//! A job runs and its output, exit code and audit line come back.

use pretty_assertions::assert_eq;

use super::common::{Kind, Target};

conformance! {
    fn readme_hello_job_prints_45(t: &Target) {
        let run = t.run(&["-c", "print(sum(range(10)))"]);
        assert_eq!(run.obs["ok"], true, "{:#}\n{}", run.obs, run.stderr);
        assert_eq!(run.obs["outcome"], "exited");
        assert_eq!(run.obs["exit_code"], 0);
        assert_eq!(run.obs["stdout"], "45\n");
        assert_eq!(run.obs["stdout_bytes"], 3);
        assert_eq!(run.obs["backend"], t.kind.backend());
        assert_eq!(run.obs["policy_version"], "test-1");
        if t.kind.is_container() {
            let image = std::env::var(super::common::IMAGE_ENV).unwrap();
            let digest = image.rsplit_once('@').unwrap().1;
            assert_eq!(run.obs["image_digest"], digest);
        }
        if t.kind.base() == Kind::Kube {
            // Each weaker control the policy accepted, named in every observation.
            let degraded: Vec<&str> = run.obs["degraded"].as_array().unwrap().iter()
                .map(|d| d.as_str().unwrap().split(':').next().unwrap()).collect();
            assert_eq!(degraded, vec!["tmp_exec", "pids", "network_policy"]);
        }
        assert_eq!(run.code, 0);
        let audit = t.audit_lines();
        assert_eq!(audit.len(), 1);
        assert_eq!(audit[0]["job_id"], run.obs["job_id"]);
        assert_eq!(audit[0]["backend"], t.kind.backend());
    }

    fn exit_code_stderr_stdin_args_and_files_come_back(t: &Target) {
        let input = t.path().join("data.csv");
        std::fs::write(&input, "a,b\n1,2\n").unwrap();
        let stdin = t.path().join("stdin.txt");
        std::fs::write(&stdin, "from stdin\n").unwrap();
        let source = "import sys\n\
                      print(open('/work/in/data.csv').read().splitlines()[1])\n\
                      print(sys.stdin.read().strip())\n\
                      print(sys.argv[1:])\n\
                      print('oops', file=sys.stderr)\n\
                      sys.exit(3)";
        let file = format!("in/data.csv={}", input.display());
        let run = t.run(&["-c", source, "--file", &file, "--stdin", stdin.to_str().unwrap(), "--", "x", "y z"]);
        assert_eq!(run.obs["stdout"], "1,2\nfrom stdin\n['x', 'y z']\n", "{:#}", run.obs);
        assert_eq!(run.obs["stderr"], "oops\n");
        assert_eq!(run.obs["outcome"], "exited");
        assert_eq!(run.obs["exit_code"], 3);
        assert_eq!(run.code, 3);
    }

    fn shell_jobs_run_as_65534(t: &Target) {
        let run = t.run(&["-l", "sh", "-c", "echo \"$((6*7))\"; id -u; id -g"]);
        assert_eq!(run.obs["stdout"], "42\n65534\n65534\n", "{:#}", run.obs);
    }

    fn terminal_controls_and_invalid_utf8_are_escaped(t: &Target) {
        let run = t.run(&["-c", "import sys\nsys.stdout.buffer.write(b'\\x1b[31mred\\x07 bad:\\xff ok\\tx\\n')"]);
        assert_eq!(run.obs["stdout"], "\\x1b[31mred\\x07 bad:\\xff ok\tx\n");
    }
}
