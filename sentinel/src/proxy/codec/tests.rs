//! The wire format without sockets: request heads, response heads and
//! their framing, the chunked decoder fed in every split.

use super::*;

fn head(method: Method, uri: &str, headers: &[(&str, &str)], framing: RequestFraming) -> String {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    let mut out = Vec::new();
    encode_request_head(&method, &uri.parse().unwrap(), &map, framing, &mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn a_request_head_is_written_in_origin_form_with_its_framing() {
    assert_eq!(
        head(
            Method::GET,
            "/a/b?c=d",
            &[("host", "app"), ("x-a", "1")],
            RequestFraming::Empty
        ),
        "GET /a/b?c=d HTTP/1.1\r\nhost: app\r\nx-a: 1\r\n\r\n"
    );
    // A method that usually carries a body says it has none.
    assert_eq!(
        head(Method::POST, "/", &[], RequestFraming::Empty),
        "POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n"
    );
    // The client's framing fields are replaced by the body's.
    assert_eq!(
        head(
            Method::PUT,
            "/x",
            &[("content-length", "99"), ("transfer-encoding", "chunked")],
            RequestFraming::Length(5)
        ),
        "PUT /x HTTP/1.1\r\ncontent-length: 5\r\n\r\n"
    );
    assert_eq!(
        head(
            Method::POST,
            "/x",
            &[("content-length", "5")],
            RequestFraming::Chunked
        ),
        "POST /x HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    assert_eq!(RequestFraming::of(true, Some(5)), RequestFraming::Empty);
    assert_eq!(RequestFraming::of(false, Some(0)), RequestFraming::Empty);
    assert_eq!(
        RequestFraming::of(false, Some(5)),
        RequestFraming::Length(5)
    );
    assert_eq!(RequestFraming::of(false, None), RequestFraming::Chunked);
}

fn parse(text: &str) -> ResponseHead {
    parse_response_head(text.as_bytes(), &Method::GET)
        .unwrap()
        .unwrap()
}

#[test]
fn a_response_head_is_parsed_once_complete() {
    let text = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-a: 1\r\nx-a: 2\r\n\r\nhi";
    for end in 0..text.len() - 2 {
        assert!(
            parse_response_head(&text.as_bytes()[..end], &Method::GET)
                .unwrap()
                .is_none(),
            "complete at {end}"
        );
    }
    let head = parse(text);
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.framing, ResponseFraming::Length(2));
    assert!(head.keep_alive);
    assert_eq!(head.length, text.len() - 2);
    assert_eq!(head.headers.get_all("x-a").iter().count(), 2);
}

#[test]
fn the_body_is_delimited_as_rfc_9112_says() {
    assert_eq!(
        parse("HTTP/1.1 204 No Content\r\n\r\n").framing,
        ResponseFraming::Empty
    );
    assert_eq!(
        parse("HTTP/1.1 304 Not Modified\r\ncontent-length: 10\r\n\r\n").framing,
        ResponseFraming::Empty
    );
    assert_eq!(
        parse("HTTP/1.1 100 Continue\r\n\r\n").framing,
        ResponseFraming::Empty
    );
    let head = parse_response_head(
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n",
        &Method::HEAD,
    )
    .unwrap()
    .unwrap();
    assert_eq!(head.framing, ResponseFraming::Empty);
    assert!(head.keep_alive);
    let head = parse("HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n");
    assert_eq!(head.framing, ResponseFraming::Upgrade);
    assert!(!head.keep_alive);
    let head = parse("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n");
    assert_eq!(head.framing, ResponseFraming::Chunked);
    assert!(head.keep_alive);
    let head = parse("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n");
    assert_eq!(head.framing, ResponseFraming::UntilClose);
    assert!(!head.keep_alive);
    // Both: Transfer-Encoding wins, Content-Length goes, no reuse.
    let head = parse("HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n");
    assert_eq!(head.framing, ResponseFraming::Chunked);
    assert!(!head.keep_alive);
    assert!(!head.headers.contains_key(CONTENT_LENGTH));
    let head = parse("HTTP/1.1 200 OK\r\n\r\n");
    assert_eq!(head.framing, ResponseFraming::UntilClose);
    assert!(!head.keep_alive);
    assert_eq!(
        parse("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").framing,
        ResponseFraming::Empty
    );
}

#[test]
fn keep_alive_follows_the_version_and_connection() {
    assert!(!parse("HTTP/1.1 200 OK\r\ncontent-length: 1\r\nconnection: Close\r\n\r\n").keep_alive);
    assert!(
        !parse("HTTP/1.1 200 OK\r\ncontent-length: 1\r\nconnection: x, close\r\n\r\n").keep_alive
    );
    assert!(!parse("HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n").keep_alive);
    assert!(
        parse("HTTP/1.0 200 OK\r\ncontent-length: 1\r\nconnection: keep-alive\r\n\r\n").keep_alive
    );
}

#[test]
fn a_bad_head_is_an_error_naming_what_is_wrong() {
    let error = |text: &str| parse_response_head(text.as_bytes(), &Method::GET).unwrap_err();
    assert!(matches!(error("SMTP 220 hi\r\n\r\n"), CodecError::Head(_)));
    assert!(matches!(
        error("HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n"),
        CodecError::ContentLength(_)
    ));
    assert!(matches!(
        error("HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n"),
        CodecError::ContentLength(_)
    ));
    // Repeated and equal is allowed.
    assert_eq!(
        parse("HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\n").framing,
        ResponseFraming::Length(2)
    );
    let mut long = String::from("HTTP/1.1 200 OK\r\n");
    while long.len() < HEAD_BYTES_MAX {
        long.push_str("x-filler: 0123456789012345678901234567890123456789\r\n");
    }
    assert!(matches!(error(&long), CodecError::HeadTooLong));
    let mut many = String::from("HTTP/1.1 200 OK\r\n");
    for i in 0..=HEADERS_MAX {
        many.push_str(&format!("x-{i}: 1\r\n"));
    }
    many.push_str("\r\n");
    assert!(matches!(error(&many), CodecError::HeadTooLong));
}

/// Decodes `input` fed in pieces of `step` bytes: the data and whether
/// the end was seen.
fn decode(input: &[u8], step: usize) -> Result<(Vec<u8>, bool), CodecError> {
    let mut decoder = ChunkedDecoder::default();
    let mut buf = BytesMut::new();
    let mut data = Vec::new();
    for piece in input.chunks(step) {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf)? {
                Decoded::Data(bytes) => data.extend_from_slice(&bytes),
                Decoded::NeedMore => break,
                Decoded::End => return Ok((data, true)),
            }
        }
    }
    Ok((data, false))
}

#[test]
fn a_chunked_body_decodes_however_it_is_split() {
    let body = b"5\r\nhello\r\n1;ext=1\r\n \r\nA\r\n0123456789\r\n0\r\nx-trailer: 1\r\n\r\n";
    for step in 1..=body.len() {
        let (data, ended) = decode(body, step).unwrap();
        assert_eq!(data, b"hello 0123456789", "step {step}");
        assert!(ended);
    }
    // What follows the end stays in the buffer.
    let mut decoder = ChunkedDecoder::default();
    let mut buf = BytesMut::from(&b"0\r\n\r\nHTTP"[..]);
    assert_eq!(decoder.decode(&mut buf).unwrap(), Decoded::End);
    assert!(decoder.ended());
    assert_eq!(&buf[..], b"HTTP");
}

#[test]
fn a_bad_chunked_body_is_an_error() {
    assert!(matches!(decode(b"zz\r\n", 64), Err(CodecError::ChunkSize)));
    assert!(matches!(decode(b"\r\n", 64), Err(CodecError::ChunkSize)));
    assert!(matches!(
        decode(b"11111111111111111\r\n", 64),
        Err(CodecError::ChunkSize)
    ));
    assert!(matches!(
        decode(b"2\r\nabXY", 64),
        Err(CodecError::ChunkEnd)
    ));
    let long = vec![b'1'; CHUNK_LINE_BYTES_MAX];
    assert!(matches!(
        decode(&long, 64),
        Err(CodecError::ChunkLineTooLong)
    ));
    let mut trailers = b"0\r\n".to_vec();
    while trailers.len() <= HEAD_BYTES_MAX + 64 {
        trailers.extend_from_slice(b"x-t: 0123456789\r\n");
    }
    assert!(matches!(
        decode(&trailers, 4096),
        Err(CodecError::TrailersTooLong)
    ));
}

#[test]
fn a_head_with_more_fields_than_usual_is_parsed_whole() {
    let mut text = String::from("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n");
    for i in 1..HEADERS_MAX {
        text.push_str(&format!("x-{i}: {i}\r\n"));
    }
    text.push_str("\r\n");
    let head = parse(&text);
    assert_eq!(head.headers.len(), HEADERS_MAX);
    assert_eq!(head.headers["x-127"], "127");
}
