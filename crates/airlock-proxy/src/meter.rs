//! A socket wrapper that notes activity and, on upstream sockets, counts bytes and takes
//! them from the proxy's byte budget before they move, so the budget is never overrun.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::state::{Activity, Counters, Shared};

/// Budget and counters of an upstream socket.
struct Upstream {
    shared: Arc<Shared>,
    counters: Arc<Counters>,
}

impl Upstream {
    fn refuse(&self) -> io::Error {
        self.counters.budget_refused.store(true, Ordering::SeqCst);
        io::Error::other("airlock proxy: byte limit reached")
    }
}

/// A metered socket.
pub(crate) struct Metered<T> {
    inner: T,
    activity: Arc<Activity>,
    upstream: Option<Upstream>,
}

impl<T> Metered<T> {
    /// A client socket: activity only.
    pub(crate) fn client(inner: T, activity: Arc<Activity>) -> Self {
        Self {
            inner,
            activity,
            upstream: None,
        }
    }

    /// An upstream socket: activity, byte counts and the byte budget.
    pub(crate) fn upstream(
        inner: T,
        activity: Arc<Activity>,
        shared: Arc<Shared>,
        counters: Arc<Counters>,
    ) -> Self {
        Self {
            inner,
            activity,
            upstream: Some(Upstream { shared, counters }),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Metered<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(upstream) = &this.upstream else {
            let before = buf.filled().len();
            let result = Pin::new(&mut this.inner).poll_read(cx, buf);
            if buf.filled().len() > before {
                this.activity.touch();
            }
            return result;
        };
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let granted = upstream.shared.reserve_bytes(buf.remaining() as u64);
        if granted == 0 {
            return Poll::Ready(Err(upstream.refuse()));
        }
        // `granted` ≤ `buf.remaining()`, which is a usize.
        let window = usize::try_from(granted).unwrap_or(usize::MAX);
        let mut limited = ReadBuf::new(buf.initialize_unfilled_to(window));
        let result = Pin::new(&mut this.inner).poll_read(cx, &mut limited);
        let n = match &result {
            Poll::Ready(Ok(())) => limited.filled().len(),
            _ => 0,
        };
        buf.advance(n);
        upstream.shared.refund_bytes(granted - n as u64);
        if n > 0 {
            upstream.counters.down.fetch_add(n as u64, Ordering::SeqCst);
            this.activity.touch();
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Metered<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let Some(upstream) = &this.upstream else {
            let result = Pin::new(&mut this.inner).poll_write(cx, buf);
            if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
                this.activity.touch();
            }
            return result;
        };
        if buf.is_empty() {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        let granted = upstream.shared.reserve_bytes(buf.len() as u64);
        if granted == 0 {
            return Poll::Ready(Err(upstream.refuse()));
        }
        let window = usize::try_from(granted).unwrap_or(usize::MAX);
        let result = Pin::new(&mut this.inner).poll_write(cx, &buf[..window]);
        let n = match &result {
            Poll::Ready(Ok(n)) => *n,
            _ => 0,
        };
        upstream.shared.refund_bytes(granted - n as u64);
        if n > 0 {
            upstream.counters.up.fetch_add(n as u64, Ordering::SeqCst);
            this.activity.touch();
        }
        result
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
