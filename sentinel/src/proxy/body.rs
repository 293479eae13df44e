//! The body of every response the proxy sends: an instance's body
//! relayed as it is read (`conn::UpstreamBody`, which gives its
//! connection back to the pool at its end), or a short text the proxy
//! wrote itself — one enum, not a boxed trait object, so a response
//! costs no allocation of its own.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use super::conn::ExchangeError;
use super::exchange::UpstreamBody;

/// A response body.
#[derive(Debug)]
pub(super) enum ResponseBody {
    /// An instance's response body.
    Upstream(UpstreamBody),
    /// A text of the proxy's own, sent whole (`None` once sent).
    Text(Option<Bytes>),
}

impl ResponseBody {
    /// A text body.
    pub(super) fn text(text: Bytes) -> Self {
        ResponseBody::Text(Some(text))
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = ExchangeError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ExchangeError>>> {
        match self.get_mut() {
            ResponseBody::Upstream(body) => Pin::new(body).poll_frame(cx),
            ResponseBody::Text(text) => Poll::Ready(text.take().map(|t| Ok(Frame::data(t)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Upstream(body) => body.is_end_stream(),
            ResponseBody::Text(text) => text.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Upstream(body) => body.size_hint(),
            ResponseBody::Text(text) => {
                SizeHint::with_exact(text.as_ref().map_or(0, |t| t.len() as u64))
            }
        }
    }
}
