//! Launching a Pod: the client for the cluster the policy names (connected once per
//! backend, which also starts the janitor) and the manifest of a job's Pod, held to the
//! `restricted` profile.

use airlock_core::JobSpec;
use airlock_core::policy::KubePolicy;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::{Client, Config};

use crate::backend::{JANITOR_INTERVAL, KubeBackend};
use crate::error::KubeError;
use crate::pod::{self, PodPlan};

/// Loads the client configuration the policy names: its kubeconfig and context, else
/// `$KUBECONFIG` / `~/.kube/config`, else the in-cluster service account.
pub async fn load_config(kube: &KubePolicy) -> Result<Config, KubeError> {
    let options = kube::config::KubeConfigOptions {
        context: (!kube.context.is_empty()).then(|| kube.context.clone()),
        cluster: None,
        user: None,
    };
    let origin = kube.kubeconfig.display().to_string();
    let load = |source: Box<dyn std::error::Error + Send + Sync>| KubeError::LoadConfig {
        origin: origin.clone(),
        source,
    };
    if !kube.kubeconfig.as_os_str().is_empty() {
        let file =
            kube::config::Kubeconfig::read_from(&kube.kubeconfig).map_err(|e| load(Box::new(e)))?;
        return Config::from_custom_kubeconfig(file, &options)
            .await
            .map_err(|e| load(Box::new(e)));
    }
    if options.context.is_some() {
        return Config::from_kubeconfig(&options)
            .await
            .map_err(|e| load(Box::new(e)));
    }
    Config::infer().await.map_err(|e| load(Box::new(e)))
}

/// Chooses ring as the process's TLS crypto provider, once (kube-rs is built with ring;
/// when another crate of the binary brings aws-lc-rs too, rustls will not pick one itself
/// and building a client would panic). A provider installed earlier is kept.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client for `config` (see [`install_crypto_provider`]).
pub fn client_for(config: Config) -> Result<Client, KubeError> {
    install_crypto_provider();
    Client::try_from(config).map_err(KubeError::BuildClient)
}

/// A client for the cluster the policy names (see [`load_config`]).
pub async fn connect(kube: &KubePolicy) -> Result<Client, KubeError> {
    client_for(load_config(kube).await?)
}

impl KubeBackend {
    /// The client, connected once.
    pub async fn client(&self) -> Result<&Client, KubeError> {
        self.client
            .get_or_try_init(|| async {
                let client = match &self.given {
                    Some(client) => client.clone(),
                    None => {
                        let config = load_config(&self.kube).await?;
                        let _ = self.config.set(Some(config.clone()));
                        client_for(config)?
                    }
                };
                if self.janitor {
                    let api: Api<Pod> = Api::namespaced(client.clone(), &self.kube.namespace);
                    tokio::spawn(async move {
                        loop {
                            match crate::sweep::sweep(&api).await {
                                Ok(0) => {}
                                Ok(n) => {
                                    tracing::info!(removed = n, "janitor removed expired job Pods")
                                }
                                Err(e) => {
                                    tracing::warn!(error = %e, "janitor cannot sweep job Pods")
                                }
                            }
                            tokio::time::sleep(JANITOR_INTERVAL).await;
                        }
                    });
                }
                Ok(client)
            })
            .await
    }

    /// The Pod `job` would run in (no I/O): what `run_job` creates.
    pub fn manifest(&self, job: &JobSpec) -> Result<Pod, KubeError> {
        let (reference, digest) =
            self.kube
                .image_ref(&job.filesystem.rootfs)
                .ok_or_else(|| KubeError::NotAnImage {
                    rootfs: job.filesystem.rootfs.to_string(),
                })?;
        let pod = pod::pod_manifest(
            job,
            &PodPlan {
                kube: &self.kube,
                image_reference: &reference,
                image_digest: &digest,
            },
        )?;
        let violations = crate::pss::restricted_violations(&pod);
        if !violations.is_empty() {
            return Err(KubeError::Restricted(violations.join("; ")));
        }
        Ok(pod)
    }
}
