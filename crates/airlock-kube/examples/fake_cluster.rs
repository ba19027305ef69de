//! The end-to-end tests' fake cluster (`airlock_testkit::fake_cluster`: an API server on
//! 127.0.0.1 and a test kubelet running each Pod as a container on the local Docker daemon)
//! as a process of its own, for suites that run the `airlock` binary against it for a
//! while: the conformance suite's `kube` backend, started by `scripts/ci/kube.sh`.
//!
//! `fake_cluster KUBECONFIG` starts the cluster, writes a kubeconfig naming it to
//! KUBECONFIG, prints `ready http://127.0.0.1:PORT` on stdout, and runs until SIGTERM or
//! SIGINT; then it removes every container its kubelet created (and only those: they carry
//! its instance label) and exits. Needs root (the kubelet writes Pod volumes under /run).
//! The Docker socket is `$AIRLOCK_DOCKER_SOCKET`, else /var/run/docker.sock.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::PathBuf;

use airlock_testkit::fake_cluster as fake;
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(kubeconfig), None) = (args.next(), args.next()) else {
        eprintln!("usage: fake_cluster KUBECONFIG");
        return std::process::ExitCode::from(2);
    };
    let socket = std::env::var_os("AIRLOCK_DOCKER_SOCKET")
        .map_or_else(|| PathBuf::from("/var/run/docker.sock"), PathBuf::from);
    // Subscribed before the cluster exists, so a signal during start-up is not lost.
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");

    let cluster = fake::FakeCluster::start(&socket).await;
    cluster.write_kubeconfig(PathBuf::from(kubeconfig).as_path());
    println!("ready http://{}", cluster.addr);
    std::io::stdout().flush().expect("stdout");

    tokio::select! {
        _ = term.recv() => eprintln!("fake cluster: SIGTERM"),
        _ = int.recv() => eprintln!("fake cluster: SIGINT"),
    }
    // Stop serving and running Pods first, so nothing new starts while removing.
    let instance = cluster.state.instance.clone();
    let pods = cluster.state.pod_names();
    // A Pod deleted while its kubelet task still waited for the daemon has volumes left.
    let ever = cluster.state.pods_ever();
    drop(cluster);
    let docker = fake::kubelet::connect(&socket).expect("docker client");
    let mut removed = 0;
    // Until none is left: a Pod's task may have had a create request in flight, and the
    // daemon may take a while to kill a container of many processes.
    let deadline = std::time::Instant::now() + fake::kubelet::REMOVE_TIMEOUT;
    loop {
        match fake::kubelet::remove_all(&docker, &instance).await {
            // None listed any more: all gone.
            Ok(0) => break,
            Ok(_) if std::time::Instant::now() > deadline => {
                eprintln!("fake cluster: its containers are still there");
                return std::process::ExitCode::FAILURE;
            }
            Ok(n) => removed += n,
            Err(e) if std::time::Instant::now() > deadline => {
                eprintln!("fake cluster: cannot remove its containers: {e}");
                return std::process::ExitCode::FAILURE;
            }
            Err(e) => eprintln!("fake cluster: removing its containers: {e}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    for pod in &ever {
        fake::kubelet::release_volumes(pod);
    }
    eprintln!(
        "fake cluster: stopped; {} pod(s) in its API, {removed} removal(s) of containers",
        pods.len()
    );
    std::process::ExitCode::SUCCESS
}
