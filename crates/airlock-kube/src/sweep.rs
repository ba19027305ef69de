//! The janitor: deletes airlock's job Pods that outlived their deadline (airlock crashed, or
//! lost its connection, before its own delete). Only Pods labelled `airlock.managed=true`
//! are listed or deleted.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams};

use crate::backend::retry_throttled;
use crate::error::{KubeError, status_code};
use crate::pod::SELECTOR_MANAGED;

/// Time past a Pod's `activeDeadlineSeconds` (counted from its creation) before the
/// janitor deletes it: the kubelet has ended it by then, and a live airlock has deleted it.
pub const JANITOR_GRACE: Duration = Duration::from_secs(60);
/// Most Pods listed per page.
pub const LIST_PAGE_PODS: u32 = 500;

/// Whether `pod` is airlock's and past its deadline plus [`JANITOR_GRACE`] at `now`.
/// A Pod without a creation time or deadline is never expired (it is not one airlock made).
pub fn is_expired(pod: &Pod, now: Timestamp) -> bool {
    let managed = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(crate::pod::LABEL_MANAGED))
        .is_some_and(|v| v == "true");
    let Some(created) = &pod.metadata.creation_timestamp else {
        return false;
    };
    let Some(deadline) = pod.spec.as_ref().and_then(|s| s.active_deadline_seconds) else {
        return false;
    };
    let age = now.as_second().saturating_sub(created.0.as_second());
    let limit = deadline.saturating_add(i64::try_from(JANITOR_GRACE.as_secs()).unwrap_or(i64::MAX));
    managed && age > limit
}

/// Deletes expired job Pods in `api`'s namespace; returns how many.
pub async fn sweep(api: &Api<Pod>) -> Result<usize, KubeError> {
    let mut removed = 0;
    let mut params = ListParams::default()
        .labels(SELECTOR_MANAGED)
        .limit(LIST_PAGE_PODS);
    loop {
        let page = retry_throttled(|| api.list(&params))
            .await
            .map_err(|source| KubeError::Api {
                operation: "list",
                object: "airlock's pods".to_owned(),
                source,
            })?;
        let now = Timestamp::now();
        for pod in &page.items {
            if !is_expired(pod, now) {
                continue;
            }
            let Some(name) = pod.metadata.name.as_deref() else {
                continue;
            };
            tracing::info!(pod = %name, "deleting an expired job pod");
            let delete = DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            };
            match retry_throttled(|| api.delete(name, &delete)).await {
                Ok(_) => removed += 1,
                Err(e) if status_code(&e) == Some(404) => {}
                Err(e) => {
                    tracing::warn!(pod = %name, error = %e, "cannot delete an expired job pod")
                }
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(removed),
        }
    }
}
