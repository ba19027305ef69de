//! The removals of finished jobs' sandboxes, run after their observations are returned.
//!
//! A job's reply waits only for its processes to be gone and its output drained
//! ([`airlock_core::Backend::run_then_teardown`]); removing the cgroup, the mounts, the job
//! directory, the container or the Pod runs here, as a task of its own. It stays
//! guaranteed: whoever hands out the job's slot waits for [`PendingTeardown::wait`] before
//! reusing it, and a server shutting down waits for [`Teardowns::wait_idle`].

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use airlock_core::Teardown;
use tokio::sync::Notify;
use tracing::Instrument;

/// Counts the removals under way and wakes whoever waits for none to be left.
#[derive(Debug, Clone, Default)]
pub struct Teardowns {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    pending: AtomicUsize,
    idle: Notify,
}

/// Decrements the count when the removal task ends, even by a panic.
struct Finished(Arc<Inner>);

impl Drop for Finished {
    fn drop(&mut self) {
        if self.0.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Teardowns {
    /// A tracker with nothing under way.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `teardown` as a task of its own, its log lines in `span` (the job's). Must be
    /// called within a Tokio runtime.
    pub fn start(&self, teardown: Teardown, span: tracing::Span) -> PendingTeardown {
        if teardown.is_none() {
            return PendingTeardown::done();
        }
        self.inner.pending.fetch_add(1, Ordering::SeqCst);
        let finished = Finished(self.inner.clone());
        let task = tokio::spawn(
            async move {
                let _finished = finished;
                teardown.run().await;
            }
            .instrument(span),
        );
        PendingTeardown(Some(task))
    }

    /// How many removals are under way.
    pub fn pending(&self) -> usize {
        self.inner.pending.load(Ordering::SeqCst)
    }

    /// Waits until no removal is under way, or `timeout`; `false` when some were left.
    pub async fn wait_idle(&self, timeout: Duration) -> bool {
        let wait = async {
            loop {
                let idle = self.inner.idle.notified();
                tokio::pin!(idle);
                // Registered before the count is read, so a removal that ends in between
                // still wakes this waiter.
                idle.as_mut().enable();
                if self.pending() == 0 {
                    return;
                }
                idle.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }
}

/// One job's removal under way. Dropping it does not stop the removal.
#[derive(Debug)]
#[must_use = "the job's slot must not be reused before its sandbox is removed"]
pub struct PendingTeardown(Option<tokio::task::JoinHandle<()>>);

impl PendingTeardown {
    /// Nothing to wait for.
    pub fn done() -> Self {
        Self(None)
    }

    /// Whether the removal is over (or there was none).
    pub fn is_done(&self) -> bool {
        self.0
            .as_ref()
            .is_none_or(tokio::task::JoinHandle::is_finished)
    }

    /// Waits until the sandbox is removed (or its removal task failed, which it logs).
    pub async fn wait(self) {
        if let Some(task) = self.0
            && let Err(e) = task.await
        {
            tracing::error!(error = %e, "a sandbox removal task failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gated() -> (Teardown, tokio::sync::oneshot::Sender<()>) {
        let (open, gate) = tokio::sync::oneshot::channel::<()>();
        let teardown = Teardown::new(async move {
            let _ = gate.await;
        });
        (teardown, open)
    }

    #[tokio::test]
    async fn nothing_to_remove_is_done_at_once() {
        let teardowns = Teardowns::new();
        teardowns
            .start(Teardown::none(), tracing::Span::none())
            .wait()
            .await;
        assert_eq!(teardowns.pending(), 0);
        assert!(teardowns.wait_idle(Duration::ZERO).await);
    }

    #[tokio::test]
    async fn a_removal_is_pending_until_it_ends_and_then_wakes_the_idle_waiter() {
        let teardowns = Teardowns::new();
        let (teardown, open) = gated();
        let pending = teardowns.start(teardown, tracing::Span::none());
        assert_eq!(teardowns.pending(), 1);
        assert!(!teardowns.wait_idle(Duration::from_millis(20)).await);
        let waiter = {
            let teardowns = teardowns.clone();
            tokio::spawn(async move { teardowns.wait_idle(Duration::from_secs(10)).await })
        };
        open.send(()).expect("the removal waits on the gate");
        pending.wait().await;
        assert_eq!(teardowns.pending(), 0);
        assert!(waiter.await.expect("the waiter task"));
    }

    #[tokio::test]
    async fn a_dropped_handle_does_not_stop_the_removal() {
        let teardowns = Teardowns::new();
        let (removed_tx, removed_rx) = tokio::sync::oneshot::channel();
        drop(teardowns.start(
            Teardown::new(async move {
                tokio::task::yield_now().await;
                let _ = removed_tx.send(());
            }),
            tracing::Span::none(),
        ));
        removed_rx.await.expect("the removal ran");
        assert!(teardowns.wait_idle(Duration::from_secs(10)).await);
    }

    #[tokio::test]
    async fn a_panicking_removal_still_counts_as_ended() {
        let teardowns = Teardowns::new();
        let pending = teardowns.start(
            Teardown::new(async { panic!("removal failed") }),
            tracing::Span::none(),
        );
        pending.wait().await;
        assert_eq!(teardowns.pending(), 0);
    }
}
