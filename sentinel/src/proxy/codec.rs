//! The HTTP/1.1 wire format of the upstream side, free of I/O: a
//! forwarded request's head written into a buffer, an instance's
//! response head parsed from one (`httparse`), how the response body is
//! delimited (RFC 9112 §6.3), and the chunked transfer coding both ways.
//!
//! Everything an instance sends is bounded: a head of at most
//! [`HEAD_BYTES_MAX`] bytes and [`HEADERS_MAX`] fields, a chunk-size line
//! of at most [`CHUNK_LINE_BYTES_MAX`] bytes, trailers of at most
//! [`HEAD_BYTES_MAX`] bytes (read and dropped). What breaks a bound or
//! the grammar is a [`CodecError`] naming it, never a panic.

use bytes::{Buf, Bytes, BytesMut};
use hyper::header::{CONNECTION, CONTENT_LENGTH, HeaderName, HeaderValue, TRANSFER_ENCODING};
use hyper::{HeaderMap, Method, StatusCode, Uri};

/// Most bytes of a response head (status line and fields).
pub(super) const HEAD_BYTES_MAX: usize = 64 * 1024;
/// Most header fields of a response head.
pub(super) const HEADERS_MAX: usize = 128;
/// Header fields a response head usually stays within (parsed at the
/// first try).
const HEADERS_USUAL: usize = 24;
/// Most bytes of a chunk-size line (size, extensions, CRLF).
pub(super) const CHUNK_LINE_BYTES_MAX: usize = 4096;

/// What an instance sent that cannot be read as HTTP/1.1.
#[derive(Debug, thiserror::Error)]
pub(super) enum CodecError {
    /// The response head is not HTTP/1.x.
    #[error("malformed response head: {0}")]
    Head(httparse::Error),
    /// The response head is longer than [`HEAD_BYTES_MAX`].
    #[error("response head longer than {HEAD_BYTES_MAX} bytes")]
    HeadTooLong,
    /// A header field name or value is not valid.
    #[error("invalid response header {0:?}")]
    Header(String),
    /// `Content-Length` is not one decimal number.
    #[error("invalid content-length {0:?}")]
    ContentLength(String),
    /// The status code is outside 100..=999.
    #[error("invalid status code {0}")]
    Status(u16),
    /// A chunk-size line is not hex digits (and extensions) ending in CRLF.
    #[error("malformed chunk size line")]
    ChunkSize,
    /// A chunk-size line longer than [`CHUNK_LINE_BYTES_MAX`].
    #[error("chunk size line longer than {CHUNK_LINE_BYTES_MAX} bytes")]
    ChunkLineTooLong,
    /// A chunk's data is not followed by CRLF.
    #[error("chunk data not followed by CRLF")]
    ChunkEnd,
    /// The trailer section is longer than [`HEAD_BYTES_MAX`].
    #[error("trailers longer than {HEAD_BYTES_MAX} bytes")]
    TrailersTooLong,
}

/// How a request's body goes upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RequestFraming {
    /// No body.
    Empty,
    /// A body of this many bytes, sent as is (`Content-Length`).
    Length(u64),
    /// A body of unknown length, chunked.
    Chunked,
}

impl RequestFraming {
    /// The framing of a body that is `ended` already, or whose exact
    /// length is `exact` when known.
    pub(super) fn of(ended: bool, exact: Option<u64>) -> Self {
        match (ended, exact) {
            (true, _) | (false, Some(0)) => RequestFraming::Empty,
            (false, Some(length)) => RequestFraming::Length(length),
            (false, None) => RequestFraming::Chunked,
        }
    }
}

/// Whether a request with `method` and no body should say
/// `Content-Length: 0` (those that usually carry one: an instance may
/// refuse them without it).
fn wants_zero_length(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::DELETE | Method::OPTIONS | Method::TRACE
    )
}

/// Appends the head of a request to `out`: the request line (`uri` in
/// origin form), `headers` (hop-by-hop ones already stripped, so no
/// `Transfer-Encoding`), and the framing fields of `framing` in place
/// of any `Content-Length` the client sent.
pub(super) fn encode_request_head(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    framing: RequestFraming,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    match uri.path_and_query() {
        Some(path) if !path.as_str().is_empty() => out.extend_from_slice(path.as_str().as_bytes()),
        _ => out.push(b'/'),
    }
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers {
        if name == CONTENT_LENGTH || name == TRANSFER_ENCODING {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        RequestFraming::Empty if wants_zero_length(method) => {
            out.extend_from_slice(b"content-length: 0\r\n");
        }
        RequestFraming::Empty => {}
        RequestFraming::Length(length) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(length.to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        RequestFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
}

/// The size line that opens a chunk of `length` bytes.
pub(super) fn chunk_size_line(length: usize) -> Bytes {
    Bytes::from(format!("{length:x}\r\n"))
}

/// What ends each chunk's data.
pub(super) const CHUNK_END: &[u8] = b"\r\n";
/// The last chunk of a chunked body, with no trailers.
pub(super) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ResponseFraming {
    /// No body (an answer to `HEAD`, a 1xx, 204 or 304).
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// The chunked transfer coding.
    Chunked,
    /// Everything until the instance closes the connection.
    UntilClose,
    /// The connection switches protocols after the head (101).
    Upgrade,
}

/// A parsed response head.
#[derive(Debug)]
pub(super) struct ResponseHead {
    /// The status.
    pub(super) status: StatusCode,
    /// The header fields, as sent (framing ones included).
    pub(super) headers: HeaderMap,
    /// How the body is delimited.
    pub(super) framing: ResponseFraming,
    /// Whether the connection may take another request after this
    /// response's body.
    pub(super) keep_alive: bool,
    /// The head's length in bytes.
    pub(super) length: usize,
}

/// Whether a `Connection` value lists `token` (any case).
fn lists(value: &HeaderValue, token: &str) -> bool {
    value
        .as_bytes()
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// The response head at the start of `buf`, `None` while it is
/// incomplete; `method` is the request's (an answer to `HEAD` has no
/// body).
pub(super) fn parse_response_head(
    buf: &[u8],
    method: &Method,
) -> Result<Option<ResponseHead>, CodecError> {
    if buf.is_empty() {
        return Ok(None);
    }
    // Most heads fit the small array (cheap to set up per response); a
    // longer one is parsed again with room for every field allowed.
    let mut few = [httparse::EMPTY_HEADER; HEADERS_USUAL];
    let mut many;
    let mut response = httparse::Response::new(&mut few);
    let mut parsed = response.parse(buf);
    if matches!(parsed, Err(httparse::Error::TooManyHeaders)) {
        many = [httparse::EMPTY_HEADER; HEADERS_MAX];
        response = httparse::Response::new(&mut many);
        parsed = response.parse(buf);
    }
    let length = match parsed {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) if buf.len() >= HEAD_BYTES_MAX => {
            return Err(CodecError::HeadTooLong);
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(CodecError::HeadTooLong),
        Err(e) => return Err(CodecError::Head(e)),
    };
    if length > HEAD_BYTES_MAX {
        return Err(CodecError::HeadTooLong);
    }
    let code = response.code.unwrap_or_default();
    let status = StatusCode::from_u16(code).map_err(|_| CodecError::Status(code))?;
    let http10 = response.version == Some(0);
    let mut headers = HeaderMap::with_capacity(response.headers.len());
    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    let mut transfer_encoded = false;
    let mut close = http10;
    for field in response.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| CodecError::Header(field.name.to_owned()))?;
        let value = HeaderValue::from_bytes(field.value)
            .map_err(|_| CodecError::Header(field.name.to_owned()))?;
        if name == CONTENT_LENGTH {
            let text = std::str::from_utf8(field.value).unwrap_or_default();
            let parsed = text
                .trim()
                .parse::<u64>()
                .map_err(|_| CodecError::ContentLength(text.to_owned()))?;
            // Repeated fields must agree (RFC 9110 §8.6).
            if content_length.is_some_and(|seen| seen != parsed) {
                return Err(CodecError::ContentLength(text.to_owned()));
            }
            content_length = Some(parsed);
        } else if name == TRANSFER_ENCODING {
            transfer_encoded = true;
            // Chunked only when it is the final coding.
            chunked = field
                .value
                .rsplit(|&b| b == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name == CONNECTION {
            if lists(&value, "close") {
                close = true;
            } else if http10 && lists(&value, "keep-alive") {
                close = false;
            }
        }
        headers.append(name, value);
    }
    let framing = if status == StatusCode::SWITCHING_PROTOCOLS {
        ResponseFraming::Upgrade
    } else if *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        ResponseFraming::Empty
    } else if transfer_encoded {
        // Transfer-Encoding overrides Content-Length (RFC 9112 §6.3).
        if chunked {
            ResponseFraming::Chunked
        } else {
            ResponseFraming::UntilClose
        }
    } else {
        match content_length {
            Some(0) => ResponseFraming::Empty,
            Some(length) => ResponseFraming::Length(length),
            None => ResponseFraming::UntilClose,
        }
    };
    if transfer_encoded && content_length.is_some() {
        // A message that says both may be an attack on a cache between
        // us: the connection is not reused (RFC 9112 §6.1).
        headers.remove(CONTENT_LENGTH);
        close = true;
    }
    let keep_alive = !close
        && !matches!(
            framing,
            ResponseFraming::UntilClose | ResponseFraming::Upgrade
        );
    Ok(Some(ResponseHead {
        status,
        headers,
        framing,
        keep_alive,
        length,
    }))
}

/// Where the decoder of a chunked body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Before a chunk-size line.
    Size,
    /// In a chunk's data, this many bytes left.
    Data(u64),
    /// After a chunk's data, before its CRLF.
    DataEnd,
    /// After the last chunk, in the trailer section (bytes seen so far).
    Trailers(usize),
    /// The body ended.
    Done,
}

/// A step of the chunked decoder.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Decoded {
    /// Body bytes.
    Data(Bytes),
    /// More input is needed.
    NeedMore,
    /// The body ended (trailers read and dropped).
    End,
}

/// The decoder of a chunked body, fed from the connection's buffer.
#[derive(Debug)]
pub(super) struct ChunkedDecoder {
    state: ChunkState,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        ChunkedDecoder {
            state: ChunkState::Size,
        }
    }
}

/// The position of the first CRLF in `buf`.
fn line_end(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

impl ChunkedDecoder {
    /// Decodes what `buf` holds, consuming it: the next data, or that
    /// more input is needed, or the end.
    pub(super) fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, CodecError> {
        loop {
            match self.state {
                ChunkState::Size => {
                    let Some(end) = line_end(buf) else {
                        if buf.len() >= CHUNK_LINE_BYTES_MAX {
                            return Err(CodecError::ChunkLineTooLong);
                        }
                        return Ok(Decoded::NeedMore);
                    };
                    if end + 2 > CHUNK_LINE_BYTES_MAX {
                        return Err(CodecError::ChunkLineTooLong);
                    }
                    let line = buf.get(..end).unwrap_or_default();
                    // Extensions (`;name=value`) are ignored.
                    let digits = line
                        .split(|&b| b == b';')
                        .next()
                        .unwrap_or_default()
                        .trim_ascii();
                    if digits.is_empty() || digits.len() > 16 {
                        return Err(CodecError::ChunkSize);
                    }
                    let size = std::str::from_utf8(digits)
                        .ok()
                        .and_then(|d| u64::from_str_radix(d, 16).ok())
                        .ok_or(CodecError::ChunkSize)?;
                    buf.advance(end + 2);
                    self.state = if size == 0 {
                        ChunkState::Trailers(0)
                    } else {
                        ChunkState::Data(size)
                    };
                }
                ChunkState::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let take = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                    let data = buf.split_to(take).freeze();
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left)
                    };
                    return Ok(Decoded::Data(data));
                }
                ChunkState::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(Decoded::NeedMore);
                    }
                    if buf.get(..2) != Some(CHUNK_END) {
                        return Err(CodecError::ChunkEnd);
                    }
                    buf.advance(2);
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailers(seen) => {
                    let Some(end) = line_end(buf) else {
                        if seen + buf.len() > HEAD_BYTES_MAX {
                            return Err(CodecError::TrailersTooLong);
                        }
                        return Ok(Decoded::NeedMore);
                    };
                    let seen = seen + end + 2;
                    if seen > HEAD_BYTES_MAX {
                        return Err(CodecError::TrailersTooLong);
                    }
                    buf.advance(end + 2);
                    if end == 0 {
                        // The empty line: the body ended.
                        self.state = ChunkState::Done;
                        return Ok(Decoded::End);
                    }
                    self.state = ChunkState::Trailers(seen);
                }
                ChunkState::Done => return Ok(Decoded::End),
            }
        }
    }

    /// Whether the body ended.
    pub(super) fn ended(&self) -> bool {
        self.state == ChunkState::Done
    }
}

#[cfg(test)]
mod tests;
