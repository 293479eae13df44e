//! One call per bidirectional stream, as length-prefixed postcard frames
//! ([`wire::frame`], read and written by [`crate::frame`]). The client opens the stream and sends a
//! [`Hello`] first, its request right behind it (no round trip of its
//! own); the server reads and checks the hello before anything else, keeps
//! the version both speak for the stream, and answers nothing on success.
//!
//! A protocol-4 node cannot read the ranged hello and refuses the stream
//! (its protocol's refusal, [`ErrorCode::BadFrame`], sent before it reads
//! the request). The client recognises that refusal in place of the first
//! answer and, if its range holds [`LEGACY_HELLO_VERSION`], opens the call
//! once more with a [`LegacyHello`] and sends the same frames again: the
//! refusal proves the node never read them, so even a non-repeatable
//! request runs at most once.
//! Every read is bounded by the stream's `frame_bytes_max`, checked before
//! the payload is allocated.

use std::time::Duration;

use quinn::{RecvStream, SendStream};
use serde::Serialize;
use serde::de::DeserializeOwned;
use wire::hello::{
    Hello, LEGACY_HELLO_VERSION, LegacyHello, PROTOCOL_VERSIONS, PeerHello, Protocol, VersionRange,
    hello_refusal,
};
use wire::{ErrorCode, WireError};

use crate::error::TransportError;
use crate::frame::{FrameReader, write_frame};

/// Largest hello frame; a real one is about ten bytes, so a peer that is
/// not speaking this protocol is refused without reading much.
pub const HELLO_BYTES_MAX: usize = 64;
/// How long a server waits for the hello of a new stream.
pub const HELLO_TIMEOUT_MS: u64 = 10_000;
/// Most frames a client keeps, until the first answer, for sending again
/// after a protocol-4 node refused its hello (each at most the stream's
/// `frame_bytes_max`); a call sending more before reading cannot fall back.
pub const REPLAY_FRAMES_MAX: usize = 4;

/// Both directions of one call, framed.
#[derive(Debug)]
pub struct FramedStream {
    send: SendStream,
    recv: FrameReader<RecvStream>,
    frame_bytes_max: usize,
    version: u32,
    fallback: Fallback,
}

/// A client stream's way back to the legacy hello.
#[derive(Debug)]
enum Fallback {
    /// None: a server's stream, a legacy hello, a first answer read, or a
    /// range without [`LEGACY_HELLO_VERSION`].
    Settled,
    /// A ranged hello went out and no answer came yet: what to send again.
    Pending(Box<Replay>),
    /// A fallback was cancelled half way: the frames may have reached the
    /// node on the stream it had opened, so they are not sent a third time.
    Interrupted,
}

/// What a client sent after its ranged hello, until the first answer.
#[derive(Debug)]
struct Replay {
    connection: quinn::Connection,
    protocol: Protocol,
    /// The encoded frames, prefixes included (at most
    /// [`REPLAY_FRAMES_MAX`]).
    frames: Vec<Vec<u8>>,
    finished: bool,
}

/// The first frame a client reads after a ranged hello.
enum First<T> {
    /// The node refused the hello without reading anything else.
    HelloRefused,
    /// Anything else, for the caller.
    Answer(T),
}

impl FramedStream {
    /// Wraps a QUIC stream pair; frames over `frame_bytes_max` are refused both ways.
    pub fn new(send: SendStream, recv: RecvStream, frame_bytes_max: usize) -> FramedStream {
        FramedStream {
            send,
            recv: FrameReader::new(recv, frame_bytes_max),
            frame_bytes_max,
            version: PROTOCOL_VERSIONS.max,
            fallback: Fallback::Settled,
        }
    }

    /// The protocol version of this stream. A server's: the one its hello
    /// agreed on (the highest both speak). A client's: the newest it
    /// offered (nothing answers the hello), or [`LEGACY_HELLO_VERSION`]
    /// once it fell back to the legacy hello.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The largest frame payload this stream sends or accepts, in bytes.
    pub fn frame_bytes_max(&self) -> usize {
        self.frame_bytes_max
    }

    /// Sends one message as one frame; a message over `frame_bytes_max`
    /// is refused before anything is sent.
    pub async fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), TransportError> {
        let Fallback::Pending(replay) = &mut self.fallback else {
            write_frame(&mut self.send, msg, self.frame_bytes_max).await?;
            return Ok(());
        };
        let bytes = wire::frame::encode(msg, self.frame_bytes_max)?;
        self.send.write_all(&bytes).await.map_err(io_error)?;
        if replay.frames.len() < REPLAY_FRAMES_MAX {
            replay.frames.push(bytes);
        } else {
            self.fallback = Fallback::Settled;
        }
        Ok(())
    }

    /// The next message; `None` when the peer finished its side cleanly
    /// between frames. A frame over `frame_bytes_max` fails with
    /// [`wire::frame::FrameError::TooLarge`] before its payload is read or
    /// allocated. After any error the stream is no longer in step; answer
    /// on the send side and finish. Cancel-safe: a dropped call loses
    /// nothing, the next one goes on with the same frame.
    ///
    /// A client's first answer may instead be a protocol-4 node's refusal
    /// of the ranged hello: the call is then opened again with the legacy
    /// hello, the frames sent so far sent again, and the answer read there.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> Result<Option<T>, TransportError> {
        let protocol = match &self.fallback {
            Fallback::Settled => return Ok(self.recv.read_frame().await?),
            Fallback::Interrupted => return Err(TransportError::Refused(interrupted())),
            Fallback::Pending(replay) => replay.protocol,
        };
        let first = self
            .recv
            .read_frame_with(|payload| match hello_refusal(protocol, payload) {
                Some(error) if error.code == ErrorCode::BadFrame => Ok(First::HelloRefused),
                _ => wire::frame::decode::<T>(payload).map(First::Answer),
            })
            .await;
        let refused = matches!(first, Ok(Some(First::HelloRefused)));
        let fallback = std::mem::replace(
            &mut self.fallback,
            if refused {
                Fallback::Interrupted
            } else {
                Fallback::Settled
            },
        );
        match first? {
            Some(First::Answer(answer)) => Ok(Some(answer)),
            None => Ok(None),
            Some(First::HelloRefused) => {
                let Fallback::Pending(replay) = fallback else {
                    return Err(TransportError::Refused(interrupted()));
                };
                *self = reopen_legacy(*replay, self.frame_bytes_max).await?;
                Ok(self.recv.read_frame().await?)
            }
        }
    }

    /// Ends this side of the call: the peer reads `None` after the frames
    /// already sent. Does not wait for the peer.
    pub async fn finish(&mut self) -> Result<(), TransportError> {
        self.send.finish()?;
        if let Fallback::Pending(replay) = &mut self.fallback {
            replay.finished = true;
        }
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
/// of this build for `protocol` already sent. Nothing waits for an answer
/// to it: a refusal comes in place of the call's first answer (see
/// [`FramedStream::recv`] for a protocol-4 node's).
pub async fn open_call(
    connection: &quinn::Connection,
    protocol: Protocol,
    frame_bytes_max: usize,
) -> Result<FramedStream, TransportError> {
    open_call_offering(connection, protocol, PROTOCOL_VERSIONS, frame_bytes_max).await
}

/// As [`open_call`], offering `versions` (a test posing as another
/// release). The fallback to the legacy hello is armed only if `versions`
/// holds [`LEGACY_HELLO_VERSION`].
pub async fn open_call_offering(
    connection: &quinn::Connection,
    protocol: Protocol,
    versions: VersionRange,
    frame_bytes_max: usize,
) -> Result<FramedStream, TransportError> {
    let (send, recv) = connection.open_bi().await?;
    let mut stream = FramedStream::new(send, recv, frame_bytes_max);
    stream.version = versions.max;
    stream.send(&Hello::offering(protocol, versions)).await?;
    if versions.contains(LEGACY_HELLO_VERSION) {
        stream.fallback = Fallback::Pending(Box::new(Replay {
            connection: connection.clone(),
            protocol,
            frames: Vec::new(),
            finished: false,
        }));
    }
    Ok(stream)
}

/// Opens a call with a [`LegacyHello`] at `version`, as protocols 1 to 4
/// did (a test posing as such a client; this build falls back to it by
/// itself).
pub async fn open_legacy_call(
    connection: &quinn::Connection,
    protocol: Protocol,
    version: u32,
    frame_bytes_max: usize,
) -> Result<FramedStream, TransportError> {
    let (send, recv) = connection.open_bi().await?;
    let mut stream = FramedStream::new(send, recv, frame_bytes_max);
    stream.version = version;
    stream.send(&LegacyHello::new(protocol, version)).await?;
    Ok(stream)
}

/// The call of `replay` opened again with the legacy hello and its frames
/// sent again.
async fn reopen_legacy(
    replay: Replay,
    frame_bytes_max: usize,
) -> Result<FramedStream, TransportError> {
    let mut stream = open_legacy_call(
        &replay.connection,
        replay.protocol,
        LEGACY_HELLO_VERSION,
        frame_bytes_max,
    )
    .await?;
    for frame in &replay.frames {
        stream.send.write_all(frame).await.map_err(io_error)?;
    }
    if replay.finished {
        stream.finish().await?;
    }
    Ok(stream)
}

fn interrupted() -> WireError {
    WireError::new(
        ErrorCode::Unavailable,
        "the call was interrupted while it was opened again for a protocol-4 node; \
         it may have reached the node",
    )
}

fn io_error(e: quinn::WriteError) -> TransportError {
    wire::frame::FrameError::Io(e.into()).into()
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

/// Which hellos a server reads, and which versions it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloReader {
    /// The versions served.
    pub versions: VersionRange,
    /// Whether the ranged [`Hello`] is read (the [`LegacyHello`] always is).
    pub ranged: bool,
}

impl HelloReader {
    /// This build: either hello, [`PROTOCOL_VERSIONS`].
    pub const THIS_RELEASE: HelloReader = HelloReader {
        versions: PROTOCOL_VERSIONS,
        ranged: true,
    };

    /// A protocol-4 node as it shipped: only the legacy hello, at exactly
    /// version 4 (a test posing as the previous release).
    pub const PROTOCOL_4: HelloReader = HelloReader {
        versions: VersionRange::exactly(LEGACY_HELLO_VERSION),
        ranged: false,
    };
}

/// Accepts a call on a stream the peer opened: reads the hello (bounded by
/// [`HELLO_BYTES_MAX`] and [`HELLO_TIMEOUT_MS`]) and checks it against
/// `expected` and [`PROTOCOL_VERSIONS`]. On refusal it sends nothing itself.
pub async fn accept_call(
    send: SendStream,
    recv: RecvStream,
    expected: Protocol,
    frame_bytes_max: usize,
) -> Result<FramedStream, AcceptError> {
    accept_call_reading(
        send,
        recv,
        expected,
        HelloReader::THIS_RELEASE,
        frame_bytes_max,
    )
    .await
}

/// As [`accept_call`], reading hellos as `reader` says (a test posing as
/// another release).
pub async fn accept_call_reading(
    send: SendStream,
    recv: RecvStream,
    expected: Protocol,
    reader: HelloReader,
    frame_bytes_max: usize,
) -> Result<FramedStream, AcceptError> {
    let mut stream = FramedStream::new(send, recv, frame_bytes_max);
    stream
        .recv
        .set_max_bytes(HELLO_BYTES_MAX.min(frame_bytes_max));
    let read = stream
        .recv
        .read_frame_with(|payload| PeerHello::decode(payload, reader.ranged));
    let read = tokio::time::timeout(Duration::from_millis(HELLO_TIMEOUT_MS), read).await;
    stream.recv.set_max_bytes(frame_bytes_max);
    let error = match read {
        Ok(Ok(Some(hello))) => match hello.check(expected, reader.versions) {
            Ok(version) => {
                stream.version = version;
                return Ok(stream);
            }
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
