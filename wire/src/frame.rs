//! Length-prefixed postcard frames.
//!
//! A frame is a 4-byte little-endian payload length followed by the postcard
//! encoding of one message. The length is checked against a maximum
//! **before** any buffer for the payload is allocated, so a peer cannot make
//! us allocate more than the limit. [`FrameDecoder`] is the sans-I/O core;
//! [`read_frame`] and [`write_frame`] are thin async wrappers.

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Default largest payload of one frame. A full sync streams one resource
/// per frame, so this bounds a single resource, not a region.
pub const FRAME_BYTES_MAX: usize = 1 << 20;

/// Size of the length prefix.
pub const LEN_PREFIX_BYTES: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len_bytes} bytes exceeds the limit of {max_bytes} bytes")]
    TooLarge { len_bytes: usize, max_bytes: usize },
    #[error("stream ended inside a frame ({got_bytes} of {expected_bytes} bytes received)")]
    Truncated {
        expected_bytes: usize,
        got_bytes: usize,
    },
    #[error("frame payload does not decode: {0}")]
    Decode(postcard::Error),
    #[error("message does not encode: {0}")]
    Encode(postcard::Error),
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// Encodes `msg` as one frame (prefix and payload).
pub fn encode<T: Serialize>(msg: &T, max_bytes: usize) -> Result<Vec<u8>, FrameError> {
    let mut out = vec![0u8; LEN_PREFIX_BYTES];
    out = postcard::to_extend(msg, out).map_err(FrameError::Encode)?;
    let len_bytes = out.len() - LEN_PREFIX_BYTES;
    if len_bytes > max_bytes {
        return Err(FrameError::TooLarge {
            len_bytes,
            max_bytes,
        });
    }
    // The check above bounds len_bytes by max_bytes, which callers keep far
    // below u32::MAX.
    let prefix = u32::try_from(len_bytes).map_err(|_| FrameError::TooLarge {
        len_bytes,
        max_bytes,
    })?;
    out[..LEN_PREFIX_BYTES].copy_from_slice(&prefix.to_le_bytes());
    Ok(out)
}

/// Reads a payload length from its prefix and checks it against the limit.
pub fn payload_len(prefix: [u8; LEN_PREFIX_BYTES], max_bytes: usize) -> Result<usize, FrameError> {
    let len_bytes = u32::from_le_bytes(prefix) as usize;
    if len_bytes > max_bytes {
        return Err(FrameError::TooLarge {
            len_bytes,
            max_bytes,
        });
    }
    Ok(len_bytes)
}

/// Decodes one payload; trailing bytes are an error.
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    let (msg, rest) = postcard::take_from_bytes(payload).map_err(FrameError::Decode)?;
    if !rest.is_empty() {
        return Err(FrameError::Decode(postcard::Error::DeserializeBadEncoding));
    }
    Ok(msg)
}

/// A sans-I/O frame decoder: feed it bytes as they arrive, take whole
/// messages out. It never holds more than one prefix plus one maximum-size
/// payload of undecoded input per call to [`FrameDecoder::push`].
#[derive(Debug)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    max_bytes: usize,
}

impl FrameDecoder {
    pub fn new(max_bytes: usize) -> Self {
        FrameDecoder {
            buf: Vec::new(),
            max_bytes,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole message, `None` if more bytes are needed.
    pub fn next_frame<T: DeserializeOwned>(&mut self) -> Result<Option<T>, FrameError> {
        let Some(prefix) = self.buf.first_chunk::<LEN_PREFIX_BYTES>() else {
            return Ok(None);
        };
        let len_bytes = payload_len(*prefix, self.max_bytes)?;
        let end = LEN_PREFIX_BYTES + len_bytes;
        if self.buf.len() < end {
            return Ok(None);
        }
        let msg = decode(&self.buf[LEN_PREFIX_BYTES..end]);
        self.buf.drain(..end);
        msg.map(Some)
    }

    /// Call at end of input: an incomplete frame is an error.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let expected_bytes = match self.buf.first_chunk::<LEN_PREFIX_BYTES>() {
            Some(prefix) => LEN_PREFIX_BYTES + u32::from_le_bytes(*prefix) as usize,
            None => LEN_PREFIX_BYTES,
        };
        Err(FrameError::Truncated {
            expected_bytes,
            got_bytes: self.buf.len(),
        })
    }
}

/// Reads one frame. `Ok(None)` on a clean end of stream between frames.
pub async fn read_frame<R, T>(reader: &mut R, max_bytes: usize) -> Result<Option<T>, FrameError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    let mut prefix = [0u8; LEN_PREFIX_BYTES];
    let mut got_bytes = 0;
    while got_bytes < LEN_PREFIX_BYTES {
        let n = reader.read(&mut prefix[got_bytes..]).await?;
        if n == 0 {
            if got_bytes == 0 {
                return Ok(None);
            }
            return Err(FrameError::Truncated {
                expected_bytes: LEN_PREFIX_BYTES,
                got_bytes,
            });
        }
        got_bytes += n;
    }
    let len_bytes = payload_len(prefix, max_bytes)?;
    let mut payload = vec![0u8; len_bytes];
    let mut got_bytes = 0;
    while got_bytes < len_bytes {
        let n = reader.read(&mut payload[got_bytes..]).await?;
        if n == 0 {
            return Err(FrameError::Truncated {
                expected_bytes: LEN_PREFIX_BYTES + len_bytes,
                got_bytes: LEN_PREFIX_BYTES + got_bytes,
            });
        }
        got_bytes += n;
    }
    decode(&payload).map(Some)
}

/// Writes one frame.
pub async fn write_frame<W, T>(writer: &mut W, msg: &T, max_bytes: usize) -> Result<(), FrameError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    let bytes = encode(msg, max_bytes)?;
    writer.write_all(&bytes).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_prefix_is_refused_before_allocation() {
        let mut decoder = FrameDecoder::new(16);
        decoder.push(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decoder.next_frame::<u32>(),
            Err(FrameError::TooLarge { len_bytes, max_bytes: 16 }) if len_bytes == u32::MAX as usize
        ));
    }

    #[test]
    fn encode_refuses_messages_over_the_limit() {
        let big = vec![7u8; 100];
        assert!(matches!(encode(&big, 50), Err(FrameError::TooLarge { .. })));
        assert!(encode(&big, 200).is_ok());
    }

    #[test]
    fn decoder_yields_frames_split_anywhere() {
        let mut bytes = encode(&"hello".to_string(), 64).unwrap();
        bytes.extend(encode(&"world".to_string(), 64).unwrap());
        for split in 0..bytes.len() {
            let mut decoder = FrameDecoder::new(64);
            let mut out = Vec::new();
            for chunk in [&bytes[..split], &bytes[split..]] {
                decoder.push(chunk);
                while let Some(s) = decoder.next_frame::<String>().unwrap() {
                    out.push(s);
                }
            }
            decoder.finish().unwrap();
            assert_eq!(out, ["hello", "world"]);
        }
    }

    #[test]
    fn trailing_bytes_in_a_payload_are_an_error() {
        let mut bytes = encode(&1u8, 64).unwrap();
        bytes[0] += 1;
        bytes.push(0);
        let mut decoder = FrameDecoder::new(64);
        decoder.push(&bytes);
        assert!(matches!(
            decoder.next_frame::<u8>(),
            Err(FrameError::Decode(_))
        ));
    }

    #[tokio::test]
    async fn read_frame_reports_truncation_and_clean_eof() {
        let bytes = encode(&"hello".to_string(), 64).unwrap();
        let mut truncated = &bytes[..bytes.len() - 1];
        assert!(matches!(
            read_frame::<_, String>(&mut truncated, 64).await,
            Err(FrameError::Truncated { .. })
        ));
        let mut empty: &[u8] = &[];
        assert!(
            read_frame::<_, String>(&mut empty, 64)
                .await
                .unwrap()
                .is_none()
        );
        let mut whole = &bytes[..];
        assert_eq!(
            read_frame::<_, String>(&mut whole, 64)
                .await
                .unwrap()
                .unwrap(),
            "hello"
        );
    }
}
