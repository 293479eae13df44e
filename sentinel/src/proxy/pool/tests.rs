//! The pool against a small instance on loopback: connections kept,
//! reused, closed, swept.

use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

/// Longest wait for the reactor to see a connection closed.
const CLOSE_SEEN_WITHIN: Duration = Duration::from_secs(5);

/// A server answering `hi` to every request on a connection, and
/// closing the connection `close_after` after each answer when set
/// (`Connection: close` when zero).
async fn server(close_after: Option<Duration>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = vec![0_u8; 4096];
                let mut seen = Vec::new();
                loop {
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    if !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        continue;
                    }
                    let close = close_after == Some(Duration::ZERO);
                    let head = if close { "connection: close\r\n" } else { "" };
                    let answer = if seen.starts_with(b"GET /empty ") {
                        format!("HTTP/1.1 204 No Content\r\n{head}\r\n")
                    } else {
                        format!("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n{head}\r\nhi")
                    };
                    seen.clear();
                    stream.write_all(answer.as_bytes()).await.unwrap();
                    if let Some(after) = close_after {
                        tokio::time::sleep(after).await;
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// One GET of `path` on a lease from `pool` (new when none is idle),
/// its body read to the end: the body, and whether the connection was
/// reused.
async fn get(pool: &Pool, addr: SocketAddr, path: &str) -> (Bytes, bool) {
    let lease = match pool.checkout(addr) {
        Ok(lease) => lease,
        Err(stack) => pool.connect(addr, stack).await.unwrap(),
    };
    let reused = lease.reused();
    let request = Request::builder()
        .uri(path)
        .header("host", "test")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = lease.send(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (body, reused)
}

/// Waits (bounded) until `pool` finds nothing idle for `addr` that can
/// take a request.
async fn until_closed_seen(pool: &Pool, addr: SocketAddr) {
    let start = Instant::now();
    while pool.checkout(addr).is_ok() || pool.idle(addr) > 0 {
        assert!(
            start.elapsed() < CLOSE_SEEN_WITHIN,
            "the closed connection is still taken"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_connection_goes_back_once_its_body_ended_and_is_reused() {
    let addr = server(None).await;
    let pool = Pool::new(Duration::from_secs(1));
    let (body, reused) = get(&pool, addr, "/").await;
    assert_eq!(body, "hi");
    assert!(!reused);
    assert_eq!(pool.idle(addr), 1);
    let (body, reused) = get(&pool, addr, "/").await;
    assert_eq!(body, "hi");
    assert!(reused);
    assert_eq!(pool.idle(addr), 1);
    // Taken and dropped before its exchange: never back.
    let lease = pool.checkout(addr).unwrap();
    drop(lease);
    assert_eq!(pool.idle(addr), 0);
}

#[tokio::test]
async fn an_empty_answer_frees_its_connection_as_soon_as_its_head_came() {
    let addr = server(None).await;
    let pool = Pool::new(Duration::from_secs(1));
    let stack = pool.checkout(addr).unwrap_err();
    let lease = pool.connect(addr, stack).await.unwrap();
    let request = Request::builder()
        .uri("/empty")
        .header("host", "test")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = lease.send(request).await.unwrap();
    assert_eq!(response.status(), 204);
    assert!(hyper::body::Body::is_end_stream(response.body()));
    assert_eq!(pool.idle(addr), 1);
}

#[tokio::test]
async fn a_connection_told_to_close_is_not_kept() {
    let addr = server(Some(Duration::ZERO)).await;
    let pool = Pool::new(Duration::from_secs(1));
    let (body, _) = get(&pool, addr, "/").await;
    assert_eq!(body, "hi");
    assert_eq!(pool.idle(addr), 0);
}

#[tokio::test]
async fn a_connection_the_instance_closed_while_idle_is_not_taken() {
    let addr = server(Some(Duration::from_millis(10))).await;
    let pool = Pool::new(Duration::from_secs(1));
    get(&pool, addr, "/").await;
    until_closed_seen(&pool, addr).await;
    // The sweep finds the same.
    get(&pool, addr, "/").await;
    let start = Instant::now();
    loop {
        pool.sweep();
        if pool.idle(addr) == 0 {
            break;
        }
        assert!(start.elapsed() < CLOSE_SEEN_WITHIN, "the sweep kept it");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn the_sweep_closes_what_idled_too_long_and_forgets_the_instance() {
    let addr = server(None).await;
    let pool = Pool::new(Duration::from_secs(1));
    get(&pool, addr, "/").await;
    for _ in 0..IDLE_TICKS {
        pool.sweep();
        assert_eq!(pool.idle(addr), 1);
    }
    pool.sweep();
    assert_eq!(pool.idle(addr), 0);
    assert!(pool.shared.stacks.read().unwrap().is_empty());
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let pool = Pool::new(Duration::from_secs(1));
    let stack = pool.checkout(addr).unwrap_err();
    assert!(matches!(
        pool.connect(addr, stack).await,
        Err(ConnectError::Io(_))
    ));
}
