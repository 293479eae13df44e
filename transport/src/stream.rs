//! One call per bidirectional stream, as length-prefixed postcard frames
//! ([`wire::frame`], read and written by [`crate::frame`]). The client opens the stream and sends a
//! [`Hello`] first; the server reads and checks it before anything else.
//! Every read is bounded by the stream's `frame_bytes_max`, checked before
//! the payload is allocated.

use std::time::Duration;

use quinn::{RecvStream, SendStream};
use serde::Serialize;
use serde::de::DeserializeOwned;
use wire::hello::{Hello, Protocol};
use wire::{ErrorCode, WireError};

use crate::error::TransportError;
use crate::frame::{FrameReader, write_frame};

/// Largest hello frame; a real one is about ten bytes, so a peer that is
/// not speaking this protocol is refused without reading much.
pub const HELLO_BYTES_MAX: usize = 64;
/// How long a server waits for the hello of a new stream.
pub const HELLO_TIMEOUT_MS: u64 = 10_000;

/// Both directions of one call, framed.
#[derive(Debug)]
pub struct FramedStream {
    send: SendStream,
    recv: FrameReader<RecvStream>,
    frame_bytes_max: usize,
}

impl FramedStream {
    /// Wraps a QUIC stream pair; frames over `frame_bytes_max` are refused both ways.
    pub fn new(send: SendStream, recv: RecvStream, frame_bytes_max: usize) -> FramedStream {
        FramedStream {
            send,
            recv: FrameReader::new(recv, frame_bytes_max),
            frame_bytes_max,
        }
    }

    /// The largest frame payload this stream sends or accepts, in bytes.
    pub fn frame_bytes_max(&self) -> usize {
        self.frame_bytes_max
    }

    /// Sends one message as one frame; a message over `frame_bytes_max`
    /// is refused before anything is sent.
    pub async fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), TransportError> {
        write_frame(&mut self.send, msg, self.frame_bytes_max).await?;
        Ok(())
    }

    /// The next message; `None` when the peer finished its side cleanly
    /// between frames. A frame over `frame_bytes_max` fails with
    /// [`wire::frame::FrameError::TooLarge`] before its payload is read or
    /// allocated. After any error the stream is no longer in step; answer
    /// on the send side and finish. Cancel-safe: a dropped call loses
    /// nothing, the next one goes on with the same frame.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> Result<Option<T>, TransportError> {
        Ok(self.recv.read_frame().await?)
    }

    /// Ends this side of the call: the peer reads `None` after the frames
    /// already sent. Does not wait for the peer.
    pub async fn finish(&mut self) -> Result<(), TransportError> {
        self.send.finish()?;
        Ok(())
    }

    /// Completes when the peer no longer reads this stream (it stopped or
    /// dropped it, or the connection is gone); for noticing that a
    /// long-lived stream, such as a watch, was abandoned.
    pub async fn closed(&self) {
        let _ = self.send.stopped().await;
    }

    /// The raw quinn streams. Nothing is read past the last frame
    /// received, so the receive side goes on at the next frame.
    pub fn into_parts(self) -> (SendStream, RecvStream) {
        (self.send, self.recv.into_inner())
    }
}

/// Opens a call: a new bidirectional stream on `connection`, with the hello
/// for `protocol` already sent.
pub async fn open_call(
    connection: &quinn::Connection,
    protocol: Protocol,
    frame_bytes_max: usize,
) -> Result<FramedStream, TransportError> {
    let (send, recv) = connection.open_bi().await?;
    let mut stream = FramedStream::new(send, recv, frame_bytes_max);
    stream.send(&Hello::new(protocol)).await?;
    Ok(stream)
}

/// A stream whose hello was refused: the stream, for answering with the
/// protocol's own error message, and the error to answer with. Nothing has
/// been sent on it.
#[derive(Debug)]
pub struct AcceptError {
    /// The stream, to answer on.
    pub stream: FramedStream,
    /// Why the hello was refused.
    pub error: WireError,
}

impl From<AcceptError> for TransportError {
    fn from(e: AcceptError) -> TransportError {
        TransportError::Refused(e.error)
    }
}

impl std::fmt::Display for AcceptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stream refused: {}", self.error)
    }
}

impl std::error::Error for AcceptError {}

/// Accepts a call on a stream the peer opened: reads the hello (bounded by
/// [`HELLO_BYTES_MAX`] and [`HELLO_TIMEOUT_MS`]) and checks it against
/// `expected`. On refusal it sends nothing itself.
pub async fn accept_call(
    send: SendStream,
    recv: RecvStream,
    expected: Protocol,
    frame_bytes_max: usize,
) -> Result<FramedStream, AcceptError> {
    let mut stream = FramedStream::new(send, recv, frame_bytes_max);
    stream
        .recv
        .set_max_bytes(HELLO_BYTES_MAX.min(frame_bytes_max));
    let read = stream.recv.read_frame::<Hello>();
    let read = tokio::time::timeout(Duration::from_millis(HELLO_TIMEOUT_MS), read).await;
    stream.recv.set_max_bytes(frame_bytes_max);
    let error = match read {
        Ok(Ok(Some(hello))) => match hello.check(expected) {
            Ok(()) => return Ok(stream),
            Err(e) => e,
        },
        Ok(Ok(None)) => WireError::new(ErrorCode::BadFrame, "stream ended before its hello"),
        Ok(Err(e)) => TransportError::Frame(e).to_wire(),
        Err(_) => WireError::new(
            ErrorCode::BadFrame,
            format!("no hello within {HELLO_TIMEOUT_MS} ms"),
        ),
    };
    Err(AcceptError { stream, error })
}
