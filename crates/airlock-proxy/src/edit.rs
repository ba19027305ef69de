//! A body rewritten as it streams, by one [`Edit`]: the scrubbing of a secret's values from
//! an answer ([`crate::scrub::ScrubEdit`]) and the substitution of placeholders in a request
//! body ([`crate::secrets::Substitute`]). The last bytes of what has arrived, as many as
//! could begin a match not yet whole, are held back until more arrive (or the body ends),
//! so a match split across reads or chunks is still found. Trailers are dropped: they would
//! carry bytes past the edit.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

/// What is done to the bytes of a body.
pub(crate) trait Edit {
    /// How many of the last bytes that have arrived may begin a match that is not whole
    /// yet: held back until more arrive.
    fn hold(&self) -> usize;

    /// Edits every match of `input` that starts before `limit` (all of `input` when
    /// `None`, at the end of the body); returns the output and how much of `input` it
    /// consumed. A match starting before `limit` lies whole in `input`.
    fn edit(&mut self, input: &[u8], limit: Option<usize>) -> (Vec<u8>, usize);
}

/// `inner`, edited by `edit` as it streams.
pub(crate) struct EditedBody<B, E> {
    inner: B,
    edit: E,
    carry: Vec<u8>,
    ended: bool,
}

impl<B, E> EditedBody<B, E> {
    pub(crate) fn new(inner: B, edit: E) -> Self {
        Self {
            inner,
            edit,
            carry: Vec::new(),
            ended: false,
        }
    }

    /// The edit, to configure it before the body streams.
    pub(crate) fn edit_mut(&mut self) -> &mut E {
        &mut self.edit
    }
}

impl<B, E> Body for EditedBody<B, E>
where
    B: Body<Data = Bytes> + Unpin,
    E: Edit + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    this.carry.extend_from_slice(&data);
                    let limit = this.carry.len().saturating_sub(this.edit.hold());
                    let (out, used) = this.edit.edit(&this.carry, Some(limit));
                    this.carry.drain(..used.min(this.carry.len()));
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                }
                Poll::Ready(None) => {
                    this.ended = true;
                    let rest = std::mem::take(&mut this.carry);
                    let (out, _) = this.edit.edit(&rest, None);
                    if out.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        // Each edit may change the length.
        SizeHint::default()
    }
}
