//! The janitor's `sweep` against the fake API server alone (no Docker): it lists airlock's
//! Pods by label, page by page, and deletes exactly those past their deadline plus the
//! grace; Pods not airlock's, not expired, without a deadline, or in another namespace stay.

use std::collections::BTreeSet;
use std::time::Duration;

use airlock_kube::pod::SELECTOR_MANAGED;
use airlock_kube::sweep::{JANITOR_GRACE, LIST_PAGE_PODS, sweep};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::Api;
use pretty_assertions::assert_eq;
use serde_json::json;

use super::common::policy;
use super::fake::{Clients, FakeCluster};
use super::install::{AIRLOCK_TOKEN, NAMESPACE, prepared};

const DEADLINE_SECS: i64 = 95;

#[derive(Clone, Copy)]
enum Label {
    Managed,
    Other,
    None,
}

/// A Pod created `age` ago with `activeDeadlineSeconds` `deadline`, running or pending.
fn pod(name: &str, namespace: &str, label: Label, age: Duration, deadline: Option<i64>) -> Pod {
    let labels = match label {
        Label::Managed => json!({"airlock.managed": "true", "airlock.job": name}),
        Label::Other => json!({"airlock.managed": "false", "app": "web"}),
        Label::None => json!({"app": "web"}),
    };
    let created = Timestamp::now()
        .checked_sub(SignedDuration::try_from(age).unwrap())
        .unwrap();
    let mut pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "uid": format!("uid-{name}")},
        "spec": {"containers": [{"name": "job", "image": "x"}]},
        "status": {"phase": "Pending"}
    }))
    .unwrap();
    pod.metadata.creation_timestamp = Some(Time(created));
    pod.spec.as_mut().unwrap().active_deadline_seconds = deadline;
    pod
}

/// Past the deadline plus the grace, by `by`.
fn expired_age(by: Duration) -> Duration {
    Duration::from_secs(DEADLINE_SECS as u64) + JANITOR_GRACE + by
}

struct Seeded {
    expired: BTreeSet<String>,
    all: BTreeSet<String>,
    managed_here: usize,
}

/// `managed` airlock Pods in the namespace, every third expired (some running), the rest
/// young or just inside the grace; and Pods the janitor must leave alone, all long expired
/// by age: another app's, one labelled `airlock.managed=false`, airlock's without a
/// deadline, and airlock's in another namespace.
fn seed(cluster: &FakeCluster, managed: usize) -> Seeded {
    let state = &cluster.state;
    let (mut expired, mut all) = (BTreeSet::new(), BTreeSet::new());
    let mut add = |p: Pod, running: bool| {
        let name = p.metadata.name.clone().unwrap();
        all.insert(name.clone());
        let mut p = p;
        if running {
            p.status = Some(serde_json::from_value(json!({"phase": "Running"})).unwrap());
            state.set_log(&name, |log| log.started = true);
        }
        state.insert_pod(p);
        name
    };
    for i in 0..managed {
        let name = format!("airlock-{i:05}");
        let (age, is_expired) = match i % 3 {
            0 => (expired_age(Duration::from_secs(30 + i as u64)), true),
            // Inside the grace: the kubelet has ended it, airlock may still be deleting it.
            1 => (expired_age(Duration::ZERO) - Duration::from_secs(20), false),
            _ => (Duration::from_secs(5), false),
        };
        let name = add(
            pod(&name, NAMESPACE, Label::Managed, age, Some(DEADLINE_SECS)),
            i % 2 == 0,
        );
        if is_expired {
            expired.insert(name);
        }
    }
    let old = expired_age(Duration::from_secs(3600));
    for i in 0..40 {
        // Interleaved with airlock's names, and before and after them.
        for prefix in ["airlock-0", "web-", "a-"] {
            add(
                pod(
                    &format!("{prefix}{i:04}x"),
                    NAMESPACE,
                    Label::None,
                    old,
                    Some(DEADLINE_SECS),
                ),
                false,
            );
        }
    }
    add(
        pod(
            "airlock-other-label",
            NAMESPACE,
            Label::Other,
            old,
            Some(DEADLINE_SECS),
        ),
        true,
    );
    add(
        pod("airlock-no-deadline", NAMESPACE, Label::Managed, old, None),
        false,
    );
    add(
        pod(
            "airlock-elsewhere",
            "default",
            Label::Managed,
            old,
            Some(DEADLINE_SECS),
        ),
        false,
    );
    Seeded {
        expired,
        all,
        managed_here: managed + 1,
    }
}

fn pods_left(cluster: &FakeCluster) -> BTreeSet<String> {
    cluster.state.pod_names().into_iter().collect()
}

fn deletes(cluster: &FakeCluster) -> BTreeSet<String> {
    let writes = cluster.state.writes();
    let set: BTreeSet<String> = writes
        .iter()
        .filter_map(|w| w.strip_prefix("DELETE ").map(str::to_owned))
        .collect();
    assert_eq!(
        set.len(),
        writes.len(),
        "a Pod deleted twice, or a write not a delete: {writes:?}"
    );
    set
}

#[tokio::test]
async fn the_janitor_deletes_exactly_the_expired_airlock_pods_across_pages() {
    let cluster = FakeCluster::api_only().await;
    // More than two pages of airlock's Pods.
    let managed = 2 * LIST_PAGE_PODS as usize + 234;
    let seeded = seed(&cluster, managed);
    let api: Api<Pod> = Api::namespaced(cluster.client(), NAMESPACE);

    let removed = sweep(&api).await.unwrap();
    assert_eq!(removed, seeded.expired.len());
    assert_eq!(deletes(&cluster), seeded.expired);
    let left: BTreeSet<String> = seeded.all.difference(&seeded.expired).cloned().collect();
    assert_eq!(pods_left(&cluster), left);

    // Listed by label, a page at a time, each page after the last.
    let lists: Vec<_> = cluster
        .state
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET")
        .collect();
    let pages = seeded.managed_here.div_ceil(LIST_PAGE_PODS as usize);
    assert_eq!(lists.len(), pages, "{lists:#?}");
    for (i, list) in lists.iter().enumerate() {
        assert_eq!(list.path, format!("/api/v1/namespaces/{NAMESPACE}/pods"));
        assert_eq!(
            list.query.get("labelSelector").map(String::as_str),
            Some(SELECTOR_MANAGED)
        );
        assert_eq!(list.query.get("limit"), Some(&LIST_PAGE_PODS.to_string()));
        assert_eq!(list.query.contains_key("continue"), i > 0, "{list:?}");
    }

    // A second sweep finds nothing more.
    assert_eq!(sweep(&api).await.unwrap(), 0);
    assert_eq!(pods_left(&cluster), left);
}

/// The API server may end a page short of `limit`, even empty, and still continue (it
/// filters by label after reading a page from etcd): the janitor reads on to the end.
#[tokio::test]
async fn the_janitor_reads_on_past_short_and_empty_pages() {
    let cluster = FakeCluster::api_only().await;
    cluster.state.inner.lock().unwrap().sparse_pages = true;
    // 600 Pods of another app sort before airlock's: the first page has none of them.
    for i in 0..600 {
        cluster.state.insert_pod(pod(
            &format!("a-web-{i:04}"),
            NAMESPACE,
            Label::None,
            expired_age(Duration::from_secs(60)),
            Some(DEADLINE_SECS),
        ));
    }
    let seeded = seed(&cluster, 30);
    let api: Api<Pod> = Api::namespaced(cluster.client(), NAMESPACE);
    assert_eq!(sweep(&api).await.unwrap(), seeded.expired.len());
    assert_eq!(deletes(&cluster), seeded.expired);
    let lists = cluster
        .state
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET")
        .count();
    assert!(lists >= 2, "{lists} list(s)");
}

/// airlock's own identity may sweep with the Role `airlock kube install` grants, and
/// without it the sweep fails as a list that was refused, deleting nothing.
#[tokio::test]
async fn the_janitor_runs_with_the_role_install_grants() {
    let cluster = prepared(&policy()).await;
    let seeded = seed(&cluster, 12);
    let api: Api<Pod> = Api::namespaced(cluster.client_as(AIRLOCK_TOKEN), NAMESPACE);
    assert_eq!(sweep(&api).await.unwrap(), seeded.expired.len());
    assert_eq!(deletes(&cluster), seeded.expired);

    let stranger = FakeCluster::api_only().await;
    stranger.state.add_user(AIRLOCK_TOKEN, "airlock");
    seed(&stranger, 3);
    let api: Api<Pod> = Api::namespaced(stranger.client_as(AIRLOCK_TOKEN), NAMESPACE);
    let err = sweep(&api).await.unwrap_err();
    assert!(
        matches!(&err, airlock_kube::KubeError::Api { operation: "list", source, .. }
            if airlock_kube::error::status_code(source) == Some(403)),
        "{err:?}"
    );
    assert_eq!(stranger.state.writes(), Vec::<String>::new());
}
