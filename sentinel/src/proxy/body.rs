//! The body of every response the proxy sends: an instance's body
//! relayed as it comes, or a short text the proxy wrote itself — one
//! enum, not a boxed trait object, so a response costs no allocation of
//! its own.
//!
//! A relayed body holds the lease of its upstream connection and gives
//! it back to the pool the moment the body is seen to end (the last data
//! frame, the end of the stream, or a body that was empty from the
//! start). A body that fails or is dropped before its end drops its
//! lease: that connection is never reused.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::pool::Lease;

/// A response body.
#[derive(Debug)]
pub(super) enum ResponseBody {
    /// An instance's response body, with its connection's lease until
    /// the body ends.
    Upstream {
        /// The body.
        body: Incoming,
        /// The connection, given back at the body's end.
        lease: Option<Lease>,
    },
    /// A text of the proxy's own, sent whole (`None` once sent).
    Text(Option<Bytes>),
}

impl ResponseBody {
    /// An instance's body; `lease` goes back to the pool at its end.
    pub(super) fn upstream(body: Incoming, lease: Option<Lease>) -> Self {
        ResponseBody::Upstream { body, lease }
    }

    /// A text body.
    pub(super) fn text(text: Bytes) -> Self {
        ResponseBody::Text(Some(text))
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ResponseBody::Upstream { body, lease } => {
                let frame = std::task::ready!(Pin::new(&mut *body).poll_frame(cx));
                match &frame {
                    Some(Ok(_)) if !body.is_end_stream() => {}
                    // The last frame, or the end: the connection is free.
                    Some(Ok(_)) | None => {
                        if let Some(lease) = lease.take() {
                            lease.release();
                        }
                    }
                    // The exchange failed: the connection is not reused.
                    Some(Err(_)) => *lease = None,
                }
                Poll::Ready(frame)
            }
            ResponseBody::Text(text) => Poll::Ready(text.take().map(|t| Ok(Frame::data(t)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Upstream { body, .. } => body.is_end_stream(),
            ResponseBody::Text(text) => text.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Upstream { body, .. } => body.size_hint(),
            ResponseBody::Text(text) => {
                SizeHint::with_exact(text.as_ref().map_or(0, |t| t.len() as u64))
            }
        }
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        // A body empty from the start (`Content-Length: 0`, a `204`, an
        // answer to `HEAD`) is dropped unpolled: it ended all the same.
        if let ResponseBody::Upstream { body, lease } = self {
            if body.is_end_stream() {
                if let Some(lease) = lease.take() {
                    lease.release();
                }
            }
        }
    }
}
