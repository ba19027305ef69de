//! Pod statuses as the kubelet writes them, read as job states; and the split-stream
//! markers.

use airlock_core::{StreamKind, Termination};
use airlock_kube::backend::MarkerFilter;
use airlock_kube::status::{Ended, PodState, pod_state, termination};
use k8s_openapi::api::core::v1::Pod;
use pretty_assertions::assert_eq;

fn pod(status: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "airlock-x"},
        "status": status,
    }))
    .unwrap()
}

fn terminated(exit: i32, reason: &str) -> serde_json::Value {
    serde_json::json!({"phase": if exit == 0 { "Succeeded" } else { "Failed" },
        "containerStatuses": [{"name": "job", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": exit, "reason": reason}}}]})
}

#[test]
fn states_from_the_kubelet() {
    assert_eq!(
        pod_state(&pod(serde_json::json!({"phase": "Pending"}))),
        PodState::Waiting(String::new())
    );
    let unschedulable = pod(
        serde_json::json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available"}]}),
    );
    assert_eq!(
        pod_state(&unschedulable),
        PodState::Waiting("Unschedulable: 0/3 nodes are available".into())
    );
    let creating = pod(
        serde_json::json!({"phase": "Pending", "containerStatuses": [{"name": "job", "image": "i", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
    );
    assert_eq!(
        pod_state(&creating),
        PodState::Waiting("ContainerCreating".into())
    );
    let pull = pod(
        serde_json::json!({"phase": "Pending", "containerStatuses": [{"name": "job", "image": "i", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}}}]}),
    );
    assert_eq!(
        pod_state(&pull),
        PodState::Failed {
            reason: "ErrImagePull".into(),
            message: "not found".into()
        }
    );
    let running = pod(
        serde_json::json!({"phase": "Running", "containerStatuses": [{"name": "job", "image": "i", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}),
    );
    assert_eq!(pod_state(&running), PodState::Running);
}

#[test]
fn endings_map_to_outcomes() {
    let ended = |status| match pod_state(&pod(status)) {
        PodState::Ended(e) => e,
        other => panic!("{other:?}"),
    };
    let ok = ended(terminated(0, "Completed"));
    assert_eq!(termination(&ok), Termination::Exited(0));
    assert!(!ok.oom && !ok.deadline);
    let oom = ended(terminated(137, "OOMKilled"));
    assert!(oom.oom);
    assert_eq!(termination(&oom), Termination::Signaled(9));
    assert_eq!(
        termination(&ended(terminated(3, "Error"))),
        Termination::Exited(3)
    );
    let mut deadline = terminated(137, "Error");
    deadline["reason"] = "DeadlineExceeded".into();
    let deadline = ended(deadline);
    assert!(deadline.deadline);
    // The deadline hit before the kubelet recorded the container.
    let bare = ended(serde_json::json!({"phase": "Failed", "reason": "DeadlineExceeded"}));
    assert_eq!(
        bare,
        Ended {
            exit_code: None,
            signal: None,
            oom: false,
            deadline: true,
            evicted: false
        }
    );
    assert_eq!(termination(&bare), Termination::Unknown);
    let evicted = ended(serde_json::json!({"phase": "Failed", "reason": "Evicted"}));
    assert!(evicted.evicted);
    // A container that could not start is the sandbox's failure, not the job's.
    assert!(matches!(
        pod_state(&pod(terminated(128, "StartError"))),
        PodState::Failed { .. }
    ));
}

#[test]
fn markers_are_stripped_and_a_mixing_cluster_is_caught() {
    let id = "0197-abc".to_owned();
    let mut out = MarkerFilter::new(StreamKind::Stdout, Some(id.clone()));
    assert_eq!(out.push(b"airlock-std").unwrap(), b"");
    assert_eq!(out.push(b"out:0197-abc\nhel").unwrap(), b"hel");
    assert_eq!(out.push(b"lo\n").unwrap(), b"lo\n");
    assert_eq!(out.finish().unwrap(), b"");
    // A cluster that ignores stream=: the stderr stream starts with stdout's marker.
    let mut err = MarkerFilter::new(StreamKind::Stderr, Some(id.clone()));
    let e = err.push(b"airlock-stdout:0197-abc\nout\n").unwrap_err();
    assert!(e.to_string().contains("PodLogsQuerySplitStreams"), "{e}");
    // The wrapper failed before its marker: what it said is kept.
    let mut err = MarkerFilter::new(StreamKind::Stderr, Some(id.clone()));
    assert_eq!(
        err.push(b"airlock: cannot set rlimits\n").unwrap(),
        b"airlock: cannot set rlimits\n"
    );
    // A marker without its newline at the very end (nothing else was written).
    let mut out = MarkerFilter::new(StreamKind::Stdout, Some(id));
    assert_eq!(out.push(b"airlock-stdout:0197-abc").unwrap(), b"");
    assert_eq!(out.finish().unwrap(), b"");
    // Merged mode passes everything.
    let mut merged = MarkerFilter::new(StreamKind::Stdout, None);
    assert_eq!(
        merged.push(b"airlock-stderr:x\n").unwrap(),
        b"airlock-stderr:x\n"
    );
}

#[test]
fn the_janitor_takes_only_expired_airlock_pods() {
    use airlock_kube::sweep::is_expired;
    use k8s_openapi::jiff::Timestamp;
    let make = |managed: bool, age_secs: i64, deadline: Option<i64>| -> Pod {
        let created = Timestamp::from_second(1_800_000_000).unwrap();
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "creationTimestamp": created.to_string(),
                         "labels": if managed { serde_json::json!({"airlock.managed": "true"}) } else { serde_json::json!({}) }},
            "spec": {"containers": []}
        }))
        .unwrap();
        p.spec.as_mut().unwrap().active_deadline_seconds = deadline;
        let _ = age_secs;
        p
    };
    let now = |age: i64| Timestamp::from_second(1_800_000_000 + age).unwrap();
    assert!(
        !is_expired(&make(true, 0, Some(95)), now(100)),
        "within deadline + grace"
    );
    assert!(is_expired(&make(true, 0, Some(95)), now(95 + 61)));
    assert!(
        !is_expired(&make(false, 0, Some(95)), now(10_000)),
        "not airlock's"
    );
    assert!(
        !is_expired(&make(true, 0, None), now(10_000)),
        "no deadline: not one airlock made"
    );
}
