//! Deleting a job's Pod (write 2 of 2) and waiting until it is gone, also when the job's
//! future is dropped (the Pod guard).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use kube::{Client, Config};

use crate::backend::{DELETE_GRACE_SECS, DELETE_WAIT, retry_throttled};
use crate::error::{KubeError, status_code};
use crate::launch::client_for;
use crate::supervise::PodWatch;

/// Deletes a job's Pod when the job's future is dropped before it did so itself (SIGINT,
/// SIGTERM, a server shutting down).
///
/// As for the Docker backend's container guard, the delete runs on a thread of its own with
/// a private runtime (and a fresh client when the configuration is known), and drop waits
/// for it up to [`DELETE_WAIT`].
pub struct PodGuard {
    client: Client,
    config: Option<Config>,
    namespace: String,
    name: Option<String>,
}

impl std::fmt::Debug for PodGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodGuard")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl PodGuard {
    /// A guard for the Pod `name`.
    pub fn new(client: Client, config: Option<Config>, namespace: &str, name: &str) -> Self {
        Self {
            client,
            config,
            namespace: namespace.to_owned(),
            name: Some(name.to_owned()),
        }
    }

    /// Deletes the Pod now, waits until it is gone, and disarms the guard.
    pub async fn delete(mut self, api: &Api<Pod>) -> Result<(), KubeError> {
        match self.name.take() {
            Some(name) => delete_pod(api, &name).await,
            None => Ok(()),
        }
    }
}

/// Deletes a Pod (a 404 is fine) and waits until it is gone: a running container is
/// stopped by the kubelet before the Pod object disappears, so when this returns nothing
/// of the job runs.
pub async fn delete_pod(api: &Api<Pod>, name: &str) -> Result<(), KubeError> {
    let object = || format!("pod {name}");
    let params = DeleteParams {
        grace_period_seconds: Some(DELETE_GRACE_SECS),
        ..Default::default()
    };
    let pending = match retry_throttled(|| api.delete(name, &params)).await {
        Ok(either) => either.left(),
        Err(e) if status_code(&e) == Some(404) => None,
        Err(source) => {
            return Err(KubeError::Api {
                operation: "delete",
                object: object(),
                source,
            });
        }
    };
    // Deleted at once (it had ended): done. Otherwise wait for the kubelet.
    let Some(pod) = pending else {
        return Ok(());
    };
    let mut watch = PodWatch::new(api, name, &pod);
    let _ = watch.next().await; // the version the delete returned
    let wait = async {
        loop {
            if watch.next().await?.is_none() {
                return Ok::<(), KubeError>(());
            }
        }
    };
    match tokio::time::timeout(DELETE_WAIT, wait).await {
        Ok(result) => result,
        Err(_) => Err(KubeError::DeleteTimeout {
            pod: object(),
            seconds: DELETE_WAIT.as_secs(),
        }),
    }
}

impl Drop for PodGuard {
    fn drop(&mut self) {
        let Some(name) = self.name.take() else {
            return;
        };
        tracing::info!(pod = %name, "job interrupted: deleting its pod");
        let client = self.client.clone();
        let config = self.config.clone();
        let namespace = self.namespace.clone();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("airlock-kube-delete".into())
            .spawn(move || {
                let result = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("runtime: {e}"))
                    .and_then(|runtime| {
                        runtime.block_on(async {
                            let client = match config {
                                Some(config) => client_for(config).map_err(|e| e.to_string())?,
                                None => client,
                            };
                            let api: Api<Pod> = Api::namespaced(client, &namespace);
                            delete_pod(&api, &name).await.map_err(|e| e.to_string())
                        })
                    });
                let _ = done_tx.send(result);
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the pod deletion thread");
            return;
        }
        match done_rx.recv_timeout(DELETE_WAIT + Duration::from_secs(5)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "cannot delete an interrupted job's pod"),
            Err(_) => tracing::error!("deleting an interrupted job's pod timed out"),
        }
    }
}
