//! An upstream connection: its socket, the bytes read from it and not
//! consumed yet, and the request head being written. Reads go into the
//! buffer (`poll_fill`); request bodies go out as they are polled, with
//! their length or chunked (`write_body`). What an exchange does with it
//! is `exchange`'s; keeping idle ones is `pool`'s.

use std::io;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Body;
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;

use super::codec::{self, CHUNK_END, CodecError, LAST_CHUNK, RequestFraming};

/// Bytes made free in the read buffer before each read.
const READ_CHUNK_BYTES: usize = 8 * 1024;

/// An upstream connection: its socket and what was read from it and not
/// consumed yet.
#[derive(Debug)]
pub(super) struct Conn {
    /// The socket.
    pub(super) stream: TcpStream,
    /// Read and not consumed yet.
    pub(super) read: BytesMut,
    /// The request head being written (its allocation kept).
    pub(super) head: Vec<u8>,
}

impl Conn {
    /// A connection over `stream`.
    pub(super) fn new(stream: TcpStream) -> Self {
        Conn {
            stream,
            read: BytesMut::with_capacity(READ_CHUNK_BYTES),
            head: Vec::with_capacity(512),
        }
    }

    /// Whether this idle connection can no longer take a request: the
    /// instance closed it, or sent something unasked. No syscall while
    /// the socket has not been seen readable.
    pub(super) fn is_closed(&self) -> bool {
        if !self.read.is_empty() {
            return true;
        }
        let mut probe = [0_u8; 1];
        !matches!(
            self.stream.try_read(&mut probe),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock
        )
    }

    /// Whether nothing read is left unconsumed (a connection with bytes
    /// past its last response is not reused).
    pub(super) fn is_clean(&self) -> bool {
        self.read.is_empty()
    }

    /// Reads what the socket has into the read buffer: the bytes read,
    /// 0 at the end of the stream.
    pub(super) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.read.reserve(READ_CHUNK_BYTES);
        loop {
            match self.read_some() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(self.stream.poll_read_ready(cx))?;
                }
                result => return Poll::Ready(result),
            }
        }
    }

    /// One read into the free part of the read buffer. A read that did
    /// not fill it drained the socket: its readiness is cleared then (as
    /// tokio's own `poll_read` does), so the next read and the idle probe
    /// of [`Conn::is_closed`] wait for the next event instead of making a
    /// syscall that finds nothing. The readiness cleared is the one seen
    /// before the read: an event after it is not lost.
    fn read_some(&mut self) -> io::Result<usize> {
        let free = self.read.capacity() - self.read.len();
        let mut read = None;
        let stream = &self.stream;
        let buf = &mut self.read;
        let result = stream.try_io(Interest::READABLE, || {
            let n = stream.try_read_buf(buf)?;
            read = Some(n);
            if n > 0 && n < free {
                Err(io::ErrorKind::WouldBlock.into())
            } else {
                Ok(n)
            }
        });
        match read {
            Some(n) => Ok(n),
            None => result,
        }
    }

    /// [`Conn::poll_fill`], awaited.
    pub(super) async fn fill(&mut self) -> io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_fill(cx)).await
    }

    /// Writes a request body (frames other than data are dropped) in
    /// `framing`.
    pub(super) async fn write_body<B>(
        &mut self,
        body: B,
        framing: RequestFraming,
    ) -> Result<(), ExchangeError>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let mut body = std::pin::pin!(body);
        let mut sent: u64 = 0;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ExchangeError::Body(e.into()))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if data.is_empty() {
                continue;
            }
            sent += data.len() as u64;
            match framing {
                RequestFraming::Length(length) if sent > length => {
                    return Err(ExchangeError::BodyLength);
                }
                RequestFraming::Chunked => {
                    let mut chunk = codec::chunk_size_line(data.len())
                        .chain(data)
                        .chain(CHUNK_END);
                    self.stream
                        .write_all_buf(&mut chunk)
                        .await
                        .map_err(ExchangeError::Write)?;
                }
                _ => self
                    .stream
                    .write_all(&data)
                    .await
                    .map_err(ExchangeError::Write)?,
            }
        }
        match framing {
            RequestFraming::Chunked => self
                .stream
                .write_all(LAST_CHUNK)
                .await
                .map_err(ExchangeError::Write),
            RequestFraming::Length(length) if sent != length => Err(ExchangeError::BodyLength),
            _ => Ok(()),
        }
    }
}

/// Why an exchange failed once the request may have reached the
/// instance.
#[derive(Debug, thiserror::Error)]
pub(super) enum ExchangeError {
    /// Writing the request failed.
    #[error("writing the request failed")]
    Write(#[source] io::Error),
    /// The client's request body failed.
    #[error("reading the request body from the client failed")]
    Body(#[source] BoxError),
    /// The client's body did not match its declared length.
    #[error("the request body did not match its content-length")]
    BodyLength,
    /// Reading the response failed.
    #[error("reading the response failed")]
    Read(#[source] io::Error),
    /// The instance closed the connection before its response head.
    #[error("the instance closed the connection before answering")]
    Closed,
    /// The instance closed the connection in the middle of a body.
    #[error("the instance closed the connection in the middle of the response body")]
    Truncated,
    /// What the instance sent is not HTTP/1.1.
    #[error(transparent)]
    Codec(#[from] CodecError),
}

/// Any error of a request body.
pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync>;
