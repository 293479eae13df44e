//! Exchanges against a scripted instance on loopback: every framing,
//! interim responses, upgrades, request bodies, and which closed
//! connections hand a request back.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use futures::stream;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::{Method, Request, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::*;
use crate::proxy::codec::CodecError;
use crate::proxy::pool::Pool;

/// What the scripted instance does with one request on a connection.
#[derive(Clone)]
enum Step {
    /// Answers these bytes (in pieces of at most `split` bytes).
    Answer(&'static [u8], usize),
    /// Closes the connection without answering.
    Close,
}

/// A scripted instance: on each connection it reads a request (its
/// head, and a body of the length it declares or up to the last chunk),
/// sends what it read on `seen`, and plays the next step of `steps`
/// (steps run across connections in order). After the last step it
/// closes.
async fn instance(steps: Vec<Step>) -> (SocketAddr, mpsc::UnboundedReceiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, requests) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut steps = steps.into_iter().peekable();
        'connections: loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let mut buf = Vec::new();
            loop {
                let request = loop {
                    if let Some(length) = request_length(&buf) {
                        break buf.drain(..length).collect::<Vec<u8>>();
                    }
                    let mut piece = [0_u8; 4096];
                    match stream.read(&mut piece).await {
                        Ok(0) | Err(_) => continue 'connections,
                        Ok(n) => buf.extend_from_slice(&piece[..n]),
                    }
                };
                let _ = seen.send(request);
                match steps.next() {
                    Some(Step::Answer(bytes, split)) => {
                        for piece in bytes.chunks(split) {
                            stream.write_all(piece).await.unwrap();
                            stream.flush().await.unwrap();
                            tokio::task::yield_now().await;
                        }
                        if steps.peek().is_none() {
                            continue 'connections;
                        }
                    }
                    Some(Step::Close) | None => continue 'connections,
                }
            }
        }
    });
    (addr, requests)
}

/// The length of the first whole request in `buf`, when there is one.
fn request_length(buf: &[u8]) -> Option<usize> {
    let head = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let text = std::str::from_utf8(&buf[..head]).ok()?.to_ascii_lowercase();
    if text.contains("transfer-encoding: chunked") {
        let end = buf[head..].windows(5).position(|w| w == b"0\r\n\r\n")?;
        return Some(head + end + 5);
    }
    let length = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |v| v.trim().parse::<usize>().unwrap());
    (buf.len() >= head + length).then_some(head + length)
}

/// Sends `request` on a lease from `pool`.
async fn send<B>(
    pool: &Pool,
    addr: SocketAddr,
    request: Request<B>,
) -> Result<Response<UpstreamBody>, SendError<B>>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let lease = match pool.checkout(addr) {
        Ok(lease) => lease,
        Err(stack) => pool.connect(addr, stack).await.unwrap(),
    };
    lease.send(request).await
}

fn get(path: &str) -> Request<Empty<Bytes>> {
    Request::builder()
        .uri(path)
        .header("host", "app")
        .body(Empty::new())
        .unwrap()
}

async fn text(response: Response<UpstreamBody>) -> Result<String, ExchangeError> {
    let body = response.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8(body.to_vec()).unwrap())
}

fn pool() -> Pool {
    Pool::new(Duration::from_secs(1))
}

#[tokio::test]
async fn bodies_of_every_framing_are_read_whole_however_they_arrive() {
    const CHUNKED: &[u8] =
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
    const LENGTH: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfghij";
    for split in [1, 7, 4096] {
        let (addr, _) = instance(vec![
            Step::Answer(CHUNKED, split),
            Step::Answer(LENGTH, split),
        ])
        .await;
        let pool = pool();
        let response = send(&pool, addr, get("/")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(text(response).await.unwrap(), "abcde", "split {split}");
        // Back in the pool, and taken again.
        assert_eq!(pool.idle(addr), 1);
        let response = send(&pool, addr, get("/")).await.unwrap();
        assert_eq!(text(response).await.unwrap(), "fghij");
        assert_eq!(pool.idle(addr), 1);
    }
}

#[tokio::test]
async fn a_body_until_close_ends_with_the_connection_which_is_not_kept() {
    let (addr, _) = instance(vec![Step::Answer(b"HTTP/1.1 200 OK\r\n\r\nall of it", 4)]).await;
    let pool = pool();
    let response = send(&pool, addr, get("/")).await.unwrap();
    assert_eq!(text(response).await.unwrap(), "all of it");
    assert_eq!(pool.idle(addr), 0);
}

#[tokio::test]
async fn a_truncated_body_is_an_error_and_its_connection_is_not_kept() {
    let (addr, _) = instance(vec![Step::Answer(
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
        4096,
    )])
    .await;
    let pool = pool();
    let response = send(&pool, addr, get("/")).await.unwrap();
    assert!(matches!(
        text(response).await,
        Err(ExchangeError::Truncated)
    ));
    assert_eq!(pool.idle(addr), 0);
}

#[tokio::test]
async fn bytes_past_a_response_keep_its_connection_out_of_the_pool() {
    let (addr, _) = instance(vec![Step::Answer(
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhiEXTRA",
        4096,
    )])
    .await;
    let pool = pool();
    let response = send(&pool, addr, get("/")).await.unwrap();
    assert_eq!(text(response).await.unwrap(), "hi");
    assert_eq!(pool.idle(addr), 0);
}

#[tokio::test]
async fn interim_responses_are_skipped() {
    let (addr, _) = instance(vec![Step::Answer(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
        5,
    )])
    .await;
    let pool = pool();
    let response = send(&pool, addr, get("/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert!(!response.headers().contains_key("link"));
    assert_eq!(text(response).await.unwrap(), "ok");
}

#[tokio::test]
async fn a_switch_of_protocols_hands_over_the_connection_and_what_came_early() {
    let (addr, _) = instance(vec![Step::Answer(
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\nconnection: upgrade\r\n\r\nearly",
        4096,
    )])
    .await;
    let pool = pool();
    let mut response = send(&pool, addr, get("/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    let (_stream, mut early) = response.body_mut().take_upgraded().unwrap();
    // The rest may come in a later read: only what came with the head
    // is handed over, and it is a prefix.
    assert!(b"early".starts_with(&early.split()));
    assert!(response.body_mut().take_upgraded().is_none());
    assert_eq!(pool.idle(addr), 0);
}

#[tokio::test]
async fn request_bodies_go_out_with_their_length_or_chunked() {
    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
    let (addr, mut seen) = instance(vec![Step::Answer(OK, 4096), Step::Answer(OK, 4096)]).await;
    let pool = pool();
    let request = Request::builder()
        .method(Method::PUT)
        .uri("/put")
        .header("host", "app")
        .body(Full::new(Bytes::from_static(b"12345")))
        .unwrap();
    let response = send(&pool, addr, request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        seen.recv().await.unwrap(),
        b"PUT /put HTTP/1.1\r\nhost: app\r\ncontent-length: 5\r\n\r\n12345"
    );
    let frames = stream::iter(
        [&b"ab"[..], &b""[..], &b"cde"[..]]
            .map(|piece| Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(piece)))),
    );
    let request = Request::builder()
        .method(Method::POST)
        .uri("/post")
        .body(StreamBody::new(frames))
        .unwrap();
    send(&pool, addr, request).await.unwrap();
    assert_eq!(
        seen.recv().await.unwrap(),
        b"POST /post HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n"
    );
}

#[tokio::test]
async fn a_reused_connection_closed_under_an_idempotent_request_hands_it_back() {
    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    let (addr, _) = instance(vec![
        Step::Answer(OK, 4096),
        Step::Close,
        Step::Answer(OK, 4096),
        Step::Close,
    ])
    .await;
    let pool = pool();
    text(send(&pool, addr, get("/")).await.unwrap())
        .await
        .unwrap();
    // Reused, closed before answering: the GET comes back unsent.
    match send(&pool, addr, get("/again")).await {
        Err(SendError::Closed(_, request)) => assert_eq!(request.uri(), "/again"),
        other => panic!("expected the request back, got {other:?}"),
    }
    text(send(&pool, addr, get("/")).await.unwrap())
        .await
        .unwrap();
    // A POST is never sent twice.
    let post = Request::builder()
        .method(Method::POST)
        .uri("/post")
        .body(Empty::<Bytes>::new())
        .unwrap();
    assert!(matches!(
        send(&pool, addr, post).await,
        Err(SendError::Failed(ExchangeError::Closed))
    ));
}

#[tokio::test]
async fn a_new_connection_closed_before_answering_is_a_failure() {
    let (addr, _) = instance(vec![Step::Close]).await;
    let pool = pool();
    assert!(matches!(
        send(&pool, addr, get("/")).await,
        Err(SendError::Failed(ExchangeError::Closed))
    ));
}

#[tokio::test]
async fn a_malformed_answer_is_a_codec_error() {
    let (addr, _) = instance(vec![Step::Answer(b"NOT HTTP AT ALL\r\n\r\n", 4096)]).await;
    let pool = pool();
    assert!(matches!(
        send(&pool, addr, get("/")).await,
        Err(SendError::Failed(ExchangeError::Codec(CodecError::Head(_))))
    ));
}
