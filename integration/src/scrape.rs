//! Reading the `/metrics` and probe endpoints of ctrl and krane over
//! HTTP/1.1: [`get`] a path, read one sample ([`gauge`]), and pick a free
//! loopback TCP address to serve them on ([`free_tcp_addr`]). Shared by
//! the bench's scrape scenario and the chaos checker's cursor samples.

use std::net::SocketAddr;

use anyhow::{Context, Result, ensure};
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// `GET path` on `addr` over HTTP/1.1; the body of a 2xx answer. Not
/// bounded in time: callers wrap it in a timeout.
pub async fn get(addr: SocketAddr, path: &str) -> Result<String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = Request::get(path)
        .header(hyper::header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    ensure!(status.is_success(), "GET {path}: {status}");
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The value of the sample named exactly `series` (name and labels) in a
/// Prometheus text exposition.
pub fn gauge(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

pub use testkit::ports::free_tcp_addr;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_is_found_by_its_exact_series() {
        let text = "# HELP krane_cursor_pk x\nkrane_cursor_pk 42\nkrane_cursor_pk_lag 3\n";
        assert_eq!(gauge(text, "krane_cursor_pk "), Some(42.0));
        assert_eq!(gauge(text, "krane_cursor_pk_lag"), Some(3.0));
        assert_eq!(gauge(text, "missing"), None);
    }
}
