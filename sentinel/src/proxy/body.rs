//! A request body that can be sent again while it was never read.
//!
//! The upstream client consumes the request it is given. A connection
//! that fails is found before the body is first polled, so the body waits
//! in a shared slot until then: after a connect failure the proxy takes it
//! back from the slot and retries on another instance. Once the client
//! polled it, the slot is empty and no retry is possible — which is the
//! rule: never retry after the request was sent.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

/// Where the body waits until first polled.
#[derive(Debug, Clone)]
pub(super) struct Slot(Arc<Mutex<Option<Incoming>>>);

impl Slot {
    /// A slot holding `body`.
    pub(super) fn new(body: Incoming) -> Self {
        Slot(Arc::new(Mutex::new(Some(body))))
    }

    /// The slot's lock; the slot holds an `Option` only, so a poisoned
    /// lock is used as is.
    fn lock(&self) -> MutexGuard<'_, Option<Incoming>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the body was never polled (a retry may send it).
    pub(super) fn unread(&self) -> bool {
        self.lock().is_some()
    }

    /// A body for one attempt.
    pub(super) fn body(&self) -> RetryBody {
        RetryBody {
            slot: self.clone(),
            body: None,
        }
    }
}

/// One attempt's request body.
#[derive(Debug)]
pub(super) struct RetryBody {
    slot: Slot,
    body: Option<Incoming>,
}

impl Body for RetryBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if this.body.is_none() {
            this.body = this.slot.lock().take();
        }
        match this.body.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            // Another attempt took the body: nothing to send.
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.body {
            Some(body) => body.is_end_stream(),
            None => self.slot.lock().as_ref().is_none_or(|b| b.is_end_stream()),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.body {
            Some(body) => body.size_hint(),
            None => self
                .slot
                .lock()
                .as_ref()
                .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint()),
        }
    }
}
