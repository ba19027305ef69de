//! Waking each side of a kernel session's protocol as soon as the other has written,
//! rather than at its next poll.
//!
//! The protocol is files in the workspace's control directory, and stays so: they are
//! what every backend that binds the workspace can carry. Polling alone cost a call half
//! of each side's interval on average (the driver looked every 5 ms, the host every
//! 10 ms), several milliseconds of a call that itself takes one. So each side also gets a
//! wake-up, and keeps polling as the fallback where the wake-up cannot reach it:
//!
//! - host → kernel: a FIFO in the control directory (`wake`), which the host makes and
//!   holds open read-write and non-blocking, writing a byte once a call's order is in
//!   place. The driver waits on it with its poll interval as the timeout, and lengthens
//!   the timeout only once a byte has come (a sandbox whose FIFO is not the host's, as
//!   under gVisor, never sends one, and polls as before).
//! - kernel → host: one inotify instance per manager, a watch per kernel's control
//!   directory, waking the session's waiter when a file is made or finished there (its
//!   `ready`, a call's `res-N.done`). inotify sees what a sandbox writes through the bind
//!   since it is the same file system on the host. Without inotify (no instance left) the
//!   host polls as before.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError};

use rustix::fs::inotify;
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

/// What makes the host look again: a file made (`ready`, `res-N.done`), renamed into place
/// or finished in the control directory. Not every write: a call that prints a lot would
/// wake the host for each, and its streamed output is read at the poll interval as before.
const WAKE_EVENTS: inotify::WatchFlags = inotify::WatchFlags::CREATE
    .union(inotify::WatchFlags::MOVED_TO)
    .union(inotify::WatchFlags::CLOSE_WRITE)
    .union(inotify::WatchFlags::ONLYDIR);

/// The manager's one inotify instance and the waiter of each watched control directory.
pub(super) struct ControlWatch {
    fd: AsyncFd<OwnedFd>,
    waiters: Mutex<HashMap<i32, Arc<Notify>>>,
}

impl std::fmt::Debug for ControlWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlWatch").finish_non_exhaustive()
    }
}

impl ControlWatch {
    /// The instance, with its reader running on the current tokio runtime until the
    /// returned handle aborts it; `None` when the host gives no instance (then every
    /// session polls).
    pub(super) fn start() -> Option<(Arc<Self>, tokio::task::AbortHandle)> {
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)
            .map_err(|e| {
                tracing::info!(error = %e,
                    "no inotify instance: kernel sessions poll for their results");
            })
            .ok()?;
        let fd = airlock_sys::process::async_owned_fd(fd, tokio::io::Interest::READABLE)
            .map_err(|e| tracing::info!(error = %e, "inotify not pollable: kernel sessions poll"))
            .ok()?;
        let watch = Arc::new(Self {
            fd,
            waiters: Mutex::new(HashMap::new()),
        });
        let reader = tokio::spawn(read_events(watch.clone())).abort_handle();
        Some((watch, reader))
    }

    /// Wakes `waiter` whenever a file is made or finished in the directory `dir` (held
    /// open, so the watch is on that directory whatever its name comes to point at);
    /// `None` when it cannot be watched (the caller polls).
    pub(super) fn watch(self: &Arc<Self>, dir: &OwnedFd, waiter: Arc<Notify>) -> Option<Watched> {
        let path = format!("/proc/self/fd/{}", dir.as_raw_fd());
        let wd = inotify::add_watch(self.fd.get_ref(), path, WAKE_EVENTS)
            .map_err(|e| tracing::debug!(error = %e, "cannot watch a kernel's control directory"))
            .ok()?;
        self.waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(wd, waiter);
        Some(Watched {
            watch: self.clone(),
            wd,
        })
    }

    fn wake(&self, wd: i32, gone: bool) {
        let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        let waiter = if gone {
            waiters.remove(&wd)
        } else {
            waiters.get(&wd).cloned()
        };
        if let Some(waiter) = waiter {
            waiter.notify_one();
        }
    }
}

/// A watch on one kernel's control directory, removed on drop.
pub(super) struct Watched {
    watch: Arc<ControlWatch>,
    wd: i32,
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.watch
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.wd);
        // Already gone when the directory or its workspace was (the kernel said so).
        let _ = inotify::remove_watch(self.watch.fd.get_ref(), self.wd);
    }
}

/// Reads the instance's events until the manager aborts it.
async fn read_events(strong: Arc<ControlWatch>) {
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    loop {
        let mut guard = match strong.fd.readable().await {
            Ok(guard) => guard,
            Err(e) => {
                tracing::warn!(error = %e, "inotify failed: kernel sessions poll from now on");
                return;
            }
        };
        let mut reader = inotify::Reader::new(strong.fd.get_ref().as_fd(), &mut buf);
        loop {
            match reader.next() {
                Ok(event) => {
                    let gone = event.events().contains(inotify::ReadFlags::IGNORED);
                    strong.wake(event.wd(), gone);
                }
                Err(rustix::io::Errno::AGAIN) => {
                    guard.clear_ready();
                    break;
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "inotify read failed: kernel sessions poll from now on");
                    return;
                }
            }
        }
    }
}

/// The host's end of a kernel's wake-up FIFO.
#[derive(Debug)]
pub(super) struct KernelBell(OwnedFd);

impl KernelBell {
    pub(super) fn new(fd: OwnedFd) -> Self {
        Self(fd)
    }

    /// Tells the kernel an order is in place. Never blocks: a full FIFO already holds a
    /// wake-up, and the driver polls anyway.
    pub(super) fn ring(&self) {
        let _ = rustix::io::write(&self.0, b"!");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn open_dir(path: &std::path::Path) -> OwnedFd {
        rustix::fs::open(
            path,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap()
    }

    /// A file made in a watched directory wakes its waiter (no poll is involved here: the
    /// waits are on the watch alone); a watch of another directory wakes only its own;
    /// a dropped watch lets its waiter go.
    #[tokio::test]
    async fn a_file_made_in_a_watched_directory_wakes_only_its_waiter() {
        let Some((watch, reader)) = ControlWatch::start() else {
            panic!("no inotify instance on this host");
        };
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let (woken_a, woken_b) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let watched_a = watch.watch(&open_dir(&a), woken_a.clone()).unwrap();
        let _watched_b = watch.watch(&open_dir(&b), woken_b.clone()).unwrap();

        std::fs::write(a.join("res-1.done"), b"").unwrap();
        tokio::time::timeout(Duration::from_secs(30), woken_a.notified())
            .await
            .expect("the file made in a woke its waiter");
        // b's waiter has no permit: only an event in b would have given it one.
        assert!(
            tokio::time::timeout(Duration::from_millis(200), woken_b.notified())
                .await
                .is_err()
        );

        // Dropped, the watch lets its waiter go; events in b still wake b's.
        drop(watched_a);
        assert_eq!(
            Arc::strong_count(&woken_a),
            1,
            "the dropped watch kept its waiter"
        );
        std::fs::write(a.join("res-2.done"), b"").unwrap();
        std::fs::write(b.join("ready"), b"").unwrap();
        tokio::time::timeout(Duration::from_secs(30), woken_b.notified())
            .await
            .expect("b's waiter woken");
        reader.abort();
    }
}
