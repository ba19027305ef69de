//! The fake cluster of airlock-testkit (an API server on 127.0.0.1 and a kubelet running
//! each Pod on the local Docker daemon), with clients built as the backend builds them.

pub use airlock_testkit::fake_cluster::*;

/// Clients of a [`FakeCluster`]'s API server, from [`airlock_kube::backend::client_for`].
pub trait Clients {
    /// A client as the cluster's admin (no token).
    fn client(&self) -> kube::Client;
    /// A client sending `token` (see [`State::add_user`]).
    fn client_as(&self, token: &str) -> kube::Client;
}

impl Clients for FakeCluster {
    fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url().parse().unwrap());
        airlock_kube::backend::client_for(config).unwrap()
    }

    fn client_as(&self, token: &str) -> kube::Client {
        let mut config = kube::Config::new(self.url().parse().unwrap());
        config.auth_info.token = Some(token.to_owned().into());
        airlock_kube::backend::client_for(config).unwrap()
    }
}
