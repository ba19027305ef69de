//! A small fake Kubernetes cluster for end-to-end tests, on 127.0.0.1: an API server with
//! enough of the Pod API for the kube backend (create, get, list, watch, delete, log with
//! follow, `limitBytes` and `stream`), and a test "kubelet" that runs each Pod as a real
//! container on this machine's Docker daemon, mapping the Pod's fields to the container
//! (read-only root, uid/gid, capabilities, no-new-privileges, memory, CPU, a node-wide
//! pids limit like the kubelet's `podPidsLimit`, memory-backed emptyDirs as a kubelet
//! mounts them (a tmpfs of the size limit on the node, mode 1777, no `noexec`, `nosuid` or
//! `nodev`, bound in), downward API files as read-only binds, `seccompProfile` RuntimeDefault
//! as Docker's default profile and Localhost from [`kubelet::SECCOMP_ROOT`]), writing the
//! status back and serving the logs.
//!
//! What it does not model: scheduling, image pulls (the image must be in the local store),
//! Pod networking (containers get no network at all, where a real Pod has an interface
//! whose egress the namespace's NetworkPolicy denies), admission (Pod Security is checked
//! by the unit tests), graceful termination (deletion kills with SIGKILL at once).
//!
//! The API server alone ([`FakeCluster::api_only`], no Docker) also serves what `airlock
//! kube install`, `airlock doctor` and the janitor use: server-side apply of the namespace
//! objects, RuntimeClasses, SelfSubjectAccessReviews answered from the stored RBAC objects
//! for users named by bearer tokens, and Pod lists by label selector, page by page.
//!
//! airlock-kube's tests start it in their process (feature `fake-cluster`), and its
//! `examples/fake_cluster.rs` runs it as a process of its own. It lives here, not in
//! airlock-kube's tests, so that the kube backend depends on no other backend, not even for
//! its tests: the kubelet talks to the Docker daemon through bollard itself.
//!
//! Clients: [`FakeCluster::url`] is the API server's address; airlock-kube's tests build
//! their clients from it the way the backend does.
// A test fixture: a fake that cannot do what a test asked of it fails that test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod apiserver;
pub mod kubelet;
pub mod store;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

pub use apiserver::State;

/// A running fake cluster; stops when dropped.
pub struct FakeCluster {
    /// The API server's address, on 127.0.0.1.
    pub addr: SocketAddr,
    /// What the API server holds, for tests to look at and change.
    pub state: Arc<State>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl FakeCluster {
    /// Starts the API server and the kubelet (talking to the Docker daemon at `socket`).
    pub async fn start(socket: &Path) -> Self {
        let state = State::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(apiserver::serve(listener, state.clone()));
        // Subscribed before any Pod can be created, so none is missed.
        let events = state.events.subscribe();
        let kubelet = tokio::spawn(kubelet::run(state.clone(), socket.to_owned(), events));
        Self {
            addr,
            state,
            tasks: vec![server, kubelet],
        }
    }

    /// The API server alone: Pods stay as created (no kubelet runs them), no Docker needed.
    pub async fn api_only() -> Self {
        let state = State::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(apiserver::serve(listener, state.clone()));
        Self {
            addr,
            state,
            tasks: vec![server],
        }
    }

    /// The API server's URL, `http://127.0.0.1:PORT`. A client sending no token is its
    /// admin; one sending a token is the user [`State::add_user`] gave it.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig file naming the fake API server (for the `airlock` binary), as its admin.
    pub fn write_kubeconfig(&self, path: &Path) {
        self.write_kubeconfig_as(path, None);
    }

    /// A kubeconfig file naming the fake API server, sending `token` when given.
    pub fn write_kubeconfig_as(&self, path: &Path, token: Option<&str>) {
        let user = token.map_or_else(|| "{}".to_owned(), |t| format!("{{token: {t}}}"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\nusers:\n- name: airlock\n  user: {user}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: airlock\ncurrent-context: fake\n",
            self.addr
        );
        std::fs::write(path, text).unwrap();
    }
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
