//! Binding the egress proxy's listening socket inside a container's network namespace.
//!
//! A container started with `--network none` has its own namespace with only `lo`; the job
//! must reach the proxy there, and nothing else. airlock joins that namespace on a thread of
//! its own (a network namespace is per thread), binds `127.0.0.1:<port>`, and the thread
//! ends: the socket stays in the container's namespace, while the proxy's outgoing
//! connections are made from airlock's threads, in the host's namespace.

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::AsFd;

use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

/// Binds `127.0.0.1:port` in the network namespace of process `pid`.
///
/// Runs on a dedicated thread that ends right after, never on a pooled one: a pool thread
/// left in the container's namespace would make later work (DNS lookups) happen there.
pub async fn listen_in_netns_of(pid: u32, port: u16) -> io::Result<TcpListener> {
    let namespace = File::open(format!("/proc/{pid}/ns/net"))?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("airlock-netns-bind".into())
        .spawn(move || {
            let bound =
                move_into_link_name_space(namespace.as_fd(), Some(LinkNameSpaceType::Network))
                    .map_err(io::Error::from)
                    .and_then(|()| TcpListener::bind((Ipv4Addr::LOCALHOST, port)));
            let _ = tx.send(bound);
        })?;
    rx.await
        .map_err(|_| io::Error::other("the namespace thread ended without an answer"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn binds_in_another_processs_network_namespace() {
        airlock_testkit::require!(
            airlock_testkit::require::is_root(),
            "joining another process's network namespace needs root"
        );
        // A process in a fresh network namespace of its own.
        let mut child = std::process::Command::new("unshare")
            .args(["--net", "sleep", "30"])
            .spawn()
            .unwrap();
        let pid = child.id();
        // Wait until it has unshared.
        let own = std::fs::read_link("/proc/self/ns/net").unwrap();
        for _ in 0..200 {
            if std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap() != own {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let listener = listen_in_netns_of(pid, 3128).await.unwrap();
        // The port is not bound in our namespace: this connect is refused.
        assert!(std::net::TcpStream::connect(("127.0.0.1", 3128)).is_err());
        assert_eq!(listener.local_addr().unwrap().port(), 3128);
        // And this thread is still in its own namespace.
        assert_eq!(std::fs::read_link("/proc/self/ns/net").unwrap(), own);
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
