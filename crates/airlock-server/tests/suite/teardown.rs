//! A job's reply waits for its processes, not for the removal of its sandbox; the server
//! is idle only once that removal is done.

use std::time::Duration;

use serde_json::json;

use super::common::*;
use crate::require_server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reply_comes_once_every_process_is_gone_and_idle_once_the_sandbox_is() {
    require_server!();
    let server = Server::start(Opts::default());
    let mut ids = Vec::new();
    for n in 0..3 {
        let marker = format!("orphan-{}-{n}", std::process::id());
        // A process of its own session, which outlives the program unless it is killed.
        let code = format!(
            "import subprocess, sys\n\
             subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', '{marker}'], start_new_session=True)\n\
             print('started')"
        );
        let answer = post_run(&server, None, &json!({"language": "python", "code": code})).await;
        assert_eq!(answer.status, 200, "{:#}", answer.body);
        assert_eq!(answer.body["stdout"], "started\n", "{:#}", answer.body);
        // Not eventually: at the time of the reply.
        assert_eq!(
            host_pids_with(&marker),
            Vec::<u32>::new(),
            "a process of the job outlived its reply"
        );
        ids.push(answer.body["job_id"].as_str().unwrap().to_owned());
    }
    let health = wait_health(&server, |h| h["jobs_in_flight"] == 0).await;
    assert_eq!(health["status"], "ok");
    // Idle means removed: no job directory, no cgroup.
    assert_eq!(leftover_job_dirs(&ids), Vec::<String>::new());
    let groups = airlock_testkit::cgroup_dir_names();
    for id in &ids {
        assert!(!groups.contains(id), "the cgroup of {id} is left");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stopped_right_after_replies_still_removes_every_sandbox() {
    require_server!();
    let mut server = Server::start(Opts::default());
    let mut ids = Vec::new();
    for _ in 0..4 {
        let answer = post_run(&server, None, &python("print('x')")).await;
        assert_eq!(answer.status, 200, "{:#}", answer.body);
        ids.push(answer.body["job_id"].as_str().unwrap().to_owned());
    }
    server.terminate();
    let status = server.wait(Duration::from_secs(30));
    assert!(status.success(), "{status:?}\n{}", server.log());
    assert_eq!(leftover_job_dirs(&ids), Vec::<String>::new());
    let groups = airlock_testkit::cgroup_dir_names();
    for id in &ids {
        assert!(!groups.contains(id), "the cgroup of {id} is left");
    }
}
