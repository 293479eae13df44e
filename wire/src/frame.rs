//! Length-prefixed postcard frames.
//!
//! A frame is a 4-byte little-endian payload length followed by the postcard
//! encoding of one message. The length is checked against a maximum
//! **before** any buffer for the payload is allocated, so a peer cannot make
//! us allocate more than the limit. [`FrameDecoder`] is the sans-I/O core;
//! its async driver (reading a stream, writing frames) is
//! `transport::frame`, so the decoder the fuzzer exercises is the one that
//! reads every stream.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Default largest payload of one frame. A full sync streams one resource
/// per frame, so this bounds a single resource, not a region.
pub const FRAME_BYTES_MAX: usize = 1 << 20;

/// Size of the length prefix.
pub const LEN_PREFIX_BYTES: usize = 4;

/// Largest input buffer a [`FrameDecoder`] keeps once it is empty again;
/// a larger one (left by a large frame) is released, so a long-lived
/// stream does not hold on to its largest frame.
pub const RETAINED_BYTES_MAX: usize = 64 * 1024;

/// Why a frame could not be encoded, read or decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// A payload longer than the limit.
    #[error("frame of {len_bytes} bytes exceeds the limit of {max_bytes} bytes")]
    TooLarge {
        /// The payload length the prefix announced or the message needs.
        len_bytes: usize,
        /// The limit in force.
        max_bytes: usize,
    },
    /// The stream ended before the frame was complete.
    #[error("stream ended inside a frame ({got_bytes} of {expected_bytes} bytes received)")]
    Truncated {
        /// Bytes the frame needs (prefix included).
        expected_bytes: usize,
        /// Bytes received before the end.
        got_bytes: usize,
    },
    /// The payload is not a valid encoding of the expected message.
    #[error("frame payload does not decode: {0}")]
    Decode(postcard::Error),
    /// The message cannot be encoded (postcard refused it).
    #[error("message does not encode: {0}")]
    Encode(postcard::Error),
    /// Reading or writing the stream failed (raised by the async driver,
    /// `transport::frame`, never by the sans-I/O code here).
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
///
/// A driver that must not read past a frame (so that the stream stays in
/// step for whoever reads it next) reads at most
/// [`FrameDecoder::bytes_needed`] bytes at a time.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    max_bytes: usize,
}

impl FrameDecoder {
    /// A decoder refusing payloads over `max_bytes`. It reserves room for
    /// one length prefix, so reading a prefix, and refusing one over the
    /// limit, allocates nothing more.
    pub fn new(max_bytes: usize) -> Self {
        FrameDecoder {
            buf: Vec::with_capacity(LEN_PREFIX_BYTES),
            max_bytes,
        }
    }

    /// The payload limit checked against the next prefix.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Changes the payload limit; it applies to every prefix checked from
    /// now on (a stream may read its first frame under a tighter limit).
    pub fn set_max_bytes(&mut self, max_bytes: usize) {
        self.max_bytes = max_bytes;
    }

    /// Appends bytes read from the stream to the input buffer.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes still missing from the frame at the head of the input: the
    /// rest of the length prefix while it is incomplete, then the rest of
    /// the payload. `0` when a whole frame is buffered, or when the prefix
    /// is over the limit ([`FrameDecoder::next_frame`] reports that).
    pub fn bytes_needed(&self) -> usize {
        let Some(prefix) = self.buf.first_chunk::<LEN_PREFIX_BYTES>() else {
            return LEN_PREFIX_BYTES - self.buf.len();
        };
        match payload_len(*prefix, self.max_bytes) {
            Ok(len_bytes) => (LEN_PREFIX_BYTES + len_bytes).saturating_sub(self.buf.len()),
            Err(_) => 0,
        }
    }

    /// The next whole message, `None` if more bytes are needed. A frame
    /// whose payload does not decode is consumed, so the next call starts
    /// at the following frame; a prefix over the limit is refused again on
    /// every call.
    pub fn next_frame<T: DeserializeOwned>(&mut self) -> Result<Option<T>, FrameError> {
        self.next_frame_with(decode)
    }

    /// As [`FrameDecoder::next_frame`], the payload read by `read` instead
    /// of decoded as one type (a payload that may be one of several
    /// messages). `read` sees the whole payload and nothing else.
    pub fn next_frame_with<T>(
        &mut self,
        read: impl FnOnce(&[u8]) -> Result<T, FrameError>,
    ) -> Result<Option<T>, FrameError> {
        let Some(prefix) = self.buf.first_chunk::<LEN_PREFIX_BYTES>() else {
            return Ok(None);
        };
        let len_bytes = payload_len(*prefix, self.max_bytes)?;
        let end = LEN_PREFIX_BYTES + len_bytes;
        if self.buf.len() < end {
            return Ok(None);
        }
        let msg = read(&self.buf[LEN_PREFIX_BYTES..end]);
        self.buf.drain(..end);
        if self.buf.is_empty() && self.buf.capacity() > RETAINED_BYTES_MAX {
            self.buf = Vec::with_capacity(LEN_PREFIX_BYTES);
        }
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

    #[test]
    fn bytes_needed_stops_at_the_frame_boundary() {
        let frame = encode(&"hello".to_string(), 64).unwrap();
        let mut stream = frame.clone();
        stream.extend(encode(&"next".to_string(), 64).unwrap());
        let mut decoder = FrameDecoder::new(64);
        let mut read = 0;
        // Reading one byte at a time, never more than asked for, ends
        // exactly at the end of the first frame.
        while decoder.next_frame::<String>().unwrap().is_none() {
            let need = decoder.bytes_needed();
            assert!(
                need > 0 && read + need <= frame.len(),
                "need {need} at {read}"
            );
            decoder.push(&stream[read..read + 1]);
            read += 1;
        }
        assert_eq!(read, frame.len());
        assert_eq!(decoder.bytes_needed(), LEN_PREFIX_BYTES);
        decoder.finish().unwrap();
    }

    #[test]
    fn bytes_needed_is_zero_for_a_refused_prefix_and_the_limit_can_change() {
        let frame = encode(&"hello".to_string(), 64).unwrap();
        let mut decoder = FrameDecoder::new(2);
        decoder.push(&frame[..LEN_PREFIX_BYTES]);
        assert!(matches!(
            decoder.next_frame::<String>(),
            Err(FrameError::TooLarge { max_bytes: 2, .. })
        ));
        assert_eq!(decoder.bytes_needed(), 0);
        decoder.set_max_bytes(64);
        assert_eq!(decoder.max_bytes(), 64);
        assert_eq!(decoder.bytes_needed(), frame.len() - LEN_PREFIX_BYTES);
        decoder.push(&frame[LEN_PREFIX_BYTES..]);
        assert_eq!(decoder.next_frame::<String>().unwrap().unwrap(), "hello");
    }

    #[test]
    fn finish_reports_truncation_and_a_clean_end() {
        let bytes = encode(&"hello".to_string(), 64).unwrap();
        let mut decoder = FrameDecoder::new(64);
        decoder.finish().unwrap();
        decoder.push(&bytes[..bytes.len() - 1]);
        assert!(decoder.next_frame::<String>().unwrap().is_none());
        assert!(matches!(
            decoder.finish(),
            Err(FrameError::Truncated { expected_bytes, got_bytes })
                if expected_bytes == bytes.len() && got_bytes == bytes.len() - 1
        ));
        let mut decoder = FrameDecoder::new(64);
        decoder.push(&bytes[..2]);
        assert!(matches!(
            decoder.finish(),
            Err(FrameError::Truncated {
                expected_bytes: LEN_PREFIX_BYTES,
                got_bytes: 2
            })
        ));
    }

    #[test]
    fn a_large_frame_does_not_stay_allocated() {
        let big = vec![7u8; 2 * RETAINED_BYTES_MAX];
        let bytes = encode(&big, FRAME_BYTES_MAX).unwrap();
        let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX);
        decoder.push(&bytes);
        assert_eq!(decoder.next_frame::<Vec<u8>>().unwrap().unwrap(), big);
        assert!(decoder.buf.capacity() <= RETAINED_BYTES_MAX);
    }
}
