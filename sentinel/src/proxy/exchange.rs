//! One exchange on an upstream connection (`conn`), done by the task serving the
//! client's request: the request head (and body) written, the response
//! head read and parsed (`codec`), and the response body read by the
//! body itself as the client side polls it. No task of the connection's
//! own and no channel between tasks: a request costs the syscalls it
//! needs and no wake-ups besides them.
//!
//! - A request whose connection turns out closed before anything came
//!   back ([`SendError::Closed`]) is handed back unsent when it can go out
//!   again safely: the connection had served a request before (an idle
//!   close racing the request, not an instance failing on it), the
//!   request has no body, and its method is idempotent. Anything else is
//!   a [`SendError::Failed`].
//! - Interim responses (`100 Continue`, `103 Early Hints`) are read and
//!   dropped; `101` hands the connection over as it is ([`UpstreamBody::
//!   take_upgraded`]), with the bytes the instance sent after the head.
//! - The body gives the connection back to the pool the moment its last
//!   byte is read, when the instance allows another request on it and
//!   sent nothing more; a body that failed or was dropped early closes
//!   its connection.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::{Request, Response, Version};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::codec::{self, ChunkedDecoder, Decoded, RequestFraming, ResponseFraming, ResponseHead};
use super::conn::{BoxError, ExchangeError};
use super::pool::Lease;

/// Why [`Lease::send`] failed.
#[derive(Debug)]
pub(super) enum SendError<B = Incoming> {
    /// The connection was closed under a request that can go out again
    /// (handed back, boxed: the rare case keeps the result small).
    Closed(io::Error, Box<Request<B>>),
    /// The exchange failed.
    Failed(ExchangeError),
}

impl Lease {
    /// Sends `request` (head already rewritten for the instance; its URI
    /// in origin form) and reads the response head.
    pub(super) async fn send<B>(
        mut self,
        request: Request<B>,
    ) -> Result<Response<UpstreamBody>, SendError<B>>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let body = request.body();
        let framing = RequestFraming::of(body.is_end_stream(), body.size_hint().exact());
        let method = request.method().clone();
        let resendable =
            self.reused() && framing == RequestFraming::Empty && method.is_idempotent();
        let conn = self.conn_mut();
        conn.head.clear();
        codec::encode_request_head(
            &method,
            request.uri(),
            request.headers(),
            framing,
            &mut conn.head,
        );
        if let Err(e) = conn.stream.write_all(&conn.head).await {
            return Err(if resendable {
                SendError::Closed(e, Box::new(request))
            } else {
                SendError::Failed(ExchangeError::Write(e))
            });
        }
        // The request, kept while it can still go out again.
        let mut kept = None;
        if framing == RequestFraming::Empty {
            if resendable {
                kept = Some(request);
            }
        } else {
            conn.write_body(request.into_body(), framing)
                .await
                .map_err(SendError::Failed)?;
        }
        let mut received = false;
        loop {
            let conn = self.conn_mut();
            match codec::parse_response_head(&conn.read, &method) {
                Ok(Some(head)) => {
                    conn.read.advance(head.length);
                    if head.status.is_informational() && head.framing != ResponseFraming::Upgrade {
                        // 100 Continue, 103 Early Hints: the final head follows.
                        continue;
                    }
                    return Ok(response(self, head));
                }
                Ok(None) => {}
                Err(e) => return Err(SendError::Failed(e.into())),
            }
            let failure = match conn.fill().await {
                Ok(0) => io::Error::from(io::ErrorKind::UnexpectedEof),
                Ok(_) => {
                    received = true;
                    continue;
                }
                Err(e) => e,
            };
            return Err(match kept {
                Some(request) if !received => SendError::Closed(failure, Box::new(request)),
                _ if failure.kind() == io::ErrorKind::UnexpectedEof => {
                    SendError::Failed(ExchangeError::Closed)
                }
                _ => SendError::Failed(ExchangeError::Read(failure)),
            });
        }
    }
}

/// A response body read from its upstream connection.
#[derive(Debug)]
pub(super) struct UpstreamBody {
    /// The connection, until the body ended or failed.
    lease: Option<Lease>,
    decoding: Decoding,
    /// Whether the connection goes back to the pool at the end.
    keep_alive: bool,
}

/// How the rest of a body is read.
#[derive(Debug)]
enum Decoding {
    /// This many bytes left.
    Length(u64),
    /// Chunked.
    Chunked(ChunkedDecoder),
    /// Until the instance closes the connection.
    UntilClose,
    /// A switched protocol: the connection is the tunnel's.
    Upgrade,
    /// Nothing (more).
    Ended,
}

impl UpstreamBody {
    /// The body of `head`, read from `lease`'s connection.
    fn new(lease: Lease, head: &ResponseHead) -> Self {
        let decoding = match head.framing {
            ResponseFraming::Empty => {
                if head.keep_alive {
                    lease.release();
                }
                return UpstreamBody {
                    lease: None,
                    decoding: Decoding::Ended,
                    keep_alive: false,
                };
            }
            ResponseFraming::Length(length) => Decoding::Length(length),
            ResponseFraming::Chunked => Decoding::Chunked(ChunkedDecoder::default()),
            ResponseFraming::UntilClose => Decoding::UntilClose,
            ResponseFraming::Upgrade => Decoding::Upgrade,
        };
        UpstreamBody {
            lease: Some(lease),
            decoding,
            keep_alive: head.keep_alive,
        }
    }

    /// The connection of a switched protocol and the bytes the instance
    /// sent after the `101` head; `None` for any other body.
    pub(super) fn take_upgraded(&mut self) -> Option<(TcpStream, BytesMut)> {
        if !matches!(self.decoding, Decoding::Upgrade) {
            return None;
        }
        self.decoding = Decoding::Ended;
        let conn = self.lease.take()?.into_conn();
        Some((conn.stream, conn.read))
    }

    /// The body ended: its connection goes back when it may.
    fn finish(&mut self) {
        self.decoding = Decoding::Ended;
        if let Some(lease) = self.lease.take() {
            if self.keep_alive {
                lease.release();
            }
        }
    }

    /// The body failed: its connection is closed.
    fn fail(&mut self, e: ExchangeError) -> Poll<Option<Result<Frame<Bytes>, ExchangeError>>> {
        self.decoding = Decoding::Ended;
        self.lease = None;
        Poll::Ready(Some(Err(e)))
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = ExchangeError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ExchangeError>>> {
        let this = self.get_mut();
        loop {
            let Some(lease) = this.lease.as_mut() else {
                return Poll::Ready(None);
            };
            let conn = lease.conn_mut();
            match &mut this.decoding {
                Decoding::Ended | Decoding::Upgrade => return Poll::Ready(None),
                Decoding::Length(left) => {
                    if !conn.read.is_empty() {
                        let take = usize::try_from(*left)
                            .unwrap_or(usize::MAX)
                            .min(conn.read.len());
                        let data = conn.read.split_to(take).freeze();
                        *left -= take as u64;
                        if *left == 0 {
                            this.finish();
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
                Decoding::Chunked(decoder) => match decoder.decode(&mut conn.read) {
                    Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Ok(Decoded::End) => {
                        this.finish();
                        return Poll::Ready(None);
                    }
                    Ok(Decoded::NeedMore) => {}
                    Err(e) => return this.fail(e.into()),
                },
                Decoding::UntilClose => {
                    if !conn.read.is_empty() {
                        let data = conn.read.split().freeze();
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
            }
            match ready!(conn.poll_fill(cx)) {
                Ok(0) if matches!(this.decoding, Decoding::UntilClose) => {
                    this.decoding = Decoding::Ended;
                    this.lease = None;
                    return Poll::Ready(None);
                }
                Ok(0) => return this.fail(ExchangeError::Truncated),
                Ok(_) => {}
                Err(e) => return this.fail(ExchangeError::Read(e)),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.decoding {
            Decoding::Ended | Decoding::Upgrade | Decoding::Length(0) => true,
            Decoding::Chunked(decoder) => decoder.ended(),
            Decoding::Length(_) | Decoding::UntilClose => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.decoding {
            Decoding::Ended | Decoding::Upgrade => SizeHint::with_exact(0),
            Decoding::Length(left) => SizeHint::with_exact(*left),
            Decoding::Chunked(_) | Decoding::UntilClose => SizeHint::default(),
        }
    }
}

/// The response of `head`, its body read from `lease`.
fn response(lease: Lease, head: ResponseHead) -> Response<UpstreamBody> {
    let body = UpstreamBody::new(lease, &head);
    let mut response = Response::new(body);
    *response.status_mut() = head.status;
    *response.version_mut() = Version::HTTP_11;
    *response.headers_mut() = head.headers;
    response
}

#[cfg(test)]
mod tests;
