//! The async driver of `wire`'s sans-I/O framing: [`FrameReader`] feeds a
//! [`FrameDecoder`] from any [`AsyncRead`], [`write_frame`] writes one
//! encoded frame. The decoding rules (the limit checked before any
//! allocation, truncation, trailing bytes) are the decoder's alone, so the
//! decoder the fuzzer exercises is the one every stream is read with.
//!
//! The reader never reads past the frame it decodes (at most
//! [`FrameDecoder::bytes_needed`] bytes per read), so once a frame is
//! returned the underlying stream is in step for anyone who reads it next.

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use wire::frame::{self, FrameDecoder, FrameError, LEN_PREFIX_BYTES};

/// Most bytes asked of the underlying reader at once while reading a
/// payload (the reader's buffer grows up to this size).
pub const READ_CHUNK_BYTES_MAX: usize = 16 * 1024;

/// Reads frames from `R` through a [`FrameDecoder`].
///
/// Cancel-safe between reads: if a [`FrameReader::read_frame`] future is
/// dropped, the bytes it had read stay in the decoder and the next call
/// goes on with the same frame.
#[derive(Debug)]
pub struct FrameReader<R> {
    reader: R,
    decoder: FrameDecoder,
    /// Payload bytes on their way from the reader to the decoder; empty
    /// until a payload longer than a prefix is read.
    chunk: Vec<u8>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader refusing payloads over `max_bytes`.
    pub fn new(reader: R, max_bytes: usize) -> FrameReader<R> {
        FrameReader {
            reader,
            decoder: FrameDecoder::new(max_bytes),
            chunk: Vec::new(),
        }
    }

    /// The payload limit checked against the next prefix.
    pub fn max_bytes(&self) -> usize {
        self.decoder.max_bytes()
    }

    /// Changes the payload limit for the frames read from now on.
    pub fn set_max_bytes(&mut self, max_bytes: usize) {
        self.decoder.set_max_bytes(max_bytes);
    }

    /// The next message; `Ok(None)` on a clean end of stream between
    /// frames (and on every call after it). A prefix over the limit is
    /// [`FrameError::TooLarge`] before any of the payload is read or
    /// allocated; an end of stream inside a frame is
    /// [`FrameError::Truncated`].
    pub async fn read_frame<T: DeserializeOwned>(&mut self) -> Result<Option<T>, FrameError> {
        self.read_frame_with(frame::decode).await
    }

    /// As [`FrameReader::read_frame`], the payload read by `read` (see
    /// [`FrameDecoder::next_frame_with`]). Cancel-safe in the same way.
    pub async fn read_frame_with<T>(
        &mut self,
        mut read: impl FnMut(&[u8]) -> Result<T, FrameError>,
    ) -> Result<Option<T>, FrameError> {
        loop {
            if let Some(msg) = self.decoder.next_frame_with(&mut read)? {
                return Ok(Some(msg));
            }
            // `next_frame` returned `None`: the prefix is incomplete, or
            // within the limit with its payload incomplete; either way
            // `need` is at least one byte.
            let need = self.decoder.bytes_needed();
            let mut small = [0u8; LEN_PREFIX_BYTES];
            let buf: &mut [u8] = if need <= small.len() {
                &mut small[..need]
            } else {
                let len = need.min(READ_CHUNK_BYTES_MAX);
                if self.chunk.len() < len {
                    self.chunk.resize(len, 0);
                }
                &mut self.chunk[..len]
            };
            let n = self.reader.read(buf).await?;
            if n == 0 {
                self.decoder.finish()?;
                return Ok(None);
            }
            self.decoder.push(&buf[..n]);
        }
    }

    /// The underlying reader. Bytes of a frame whose read did not complete
    /// (a cancelled [`FrameReader::read_frame`]) are lost with the reader.
    pub fn into_inner(self) -> R {
        self.reader
    }
}

/// Writes `msg` as one frame; a message over `max_bytes` is refused before
/// anything is written.
pub async fn write_frame<W, T>(writer: &mut W, msg: &T, max_bytes: usize) -> Result<(), FrameError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    let bytes = frame::encode(msg, max_bytes)?;
    writer.write_all(&bytes).await?;
    Ok(())
}
