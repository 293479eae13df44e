//! The small HTTP/1 listener of ctrl and krane for operations: `/metrics`
//! (the Prometheus text exposition), `/livez` and `/readyz`. What they
//! answer comes from a [`Probe`] the binary supplies; this module knows
//! nothing of nodes or agents.
//!
//! It is bounded like everything else: at most [`HTTP_CONNECTIONS_MAX`]
//! connections at once (more wait in the accept queue), headers within
//! [`HTTP_HEADER_READ_TIMEOUT_MS`], a whole connection within
//! [`HTTP_CONNECTION_TIMEOUT_MS`]. Dropping the [`HttpServer`] stops the
//! listener and every connection it serves.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::CONTENT_TYPE;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinSet;
use tracing::debug;

/// Most connections served at once.
pub const HTTP_CONNECTIONS_MAX: usize = 64;
/// Longest wait for a request's headers.
pub const HTTP_HEADER_READ_TIMEOUT_MS: u64 = 5_000;
/// Longest life of one connection.
pub const HTTP_CONNECTION_TIMEOUT_MS: u64 = 30_000;
/// The content type of `/metrics`: OpenMetrics text, which Prometheus
/// scrapes natively and which its classic text parsers read.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the listener asks the binary.
pub trait Probe: Send + Sync + 'static {
    /// The metrics exposition, read at scrape time.
    fn metrics(&self) -> String;
    /// `Ok` when ready to serve, else a one-line reason (`/readyz`
    /// answers 503 with it).
    fn ready(&self) -> Result<(), String>;
}

/// A running listener; [`HttpServer::stop`] stops it and waits until
/// every connection is gone (dropping it stops it without waiting).
#[derive(Debug)]
pub struct HttpServer {
    local_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpServer {
    /// Binds `addr` (port 0 picks a free port) and serves `probe` on it.
    pub async fn start(addr: SocketAddr, probe: Arc<dyn Probe>) -> std::io::Result<HttpServer> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(accept(listener, probe, stopped));
        Ok(HttpServer {
            local_addr,
            stop: Some(stop),
            task,
        })
    }

    /// Stops listening and returns once every connection (and with it the
    /// probe) is dropped.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }

    /// The address bound (the real port if 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if self.stop.is_some() {
            self.task.abort();
        }
    }
}

async fn accept(listener: TcpListener, probe: Arc<dyn Probe>, mut stop: oneshot::Receiver<()>) {
    let permits = Arc::new(Semaphore::new(HTTP_CONNECTIONS_MAX));
    // Aborting this task drops the set, which aborts every connection.
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            _ = &mut stop => break,
            accepted = async {
                let permit = permits.clone().acquire_owned().await;
                (permit, listener.accept().await)
            } => accepted,
        };
        let (permit, (socket, peer)) = match accepted {
            (Ok(permit), Ok(accepted)) => (permit, accepted),
            (Err(_), _) => break,
            (_, Err(e)) => {
                debug!("metrics listener: accept failed: {e}");
                continue;
            }
        };
        let probe = probe.clone();
        connections.spawn(async move {
            let _permit = permit;
            let service = service_fn(move |request| {
                let probe = probe.clone();
                async move { Ok::<_, Infallible>(answer(probe.as_ref(), &request)) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_millis(HTTP_HEADER_READ_TIMEOUT_MS))
                .serve_connection(TokioIo::new(socket), service);
            let bound = Duration::from_millis(HTTP_CONNECTION_TIMEOUT_MS);
            match tokio::time::timeout(bound, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!(%peer, "metrics connection failed: {e}"),
                Err(_) => debug!(%peer, "metrics connection closed after {bound:?}"),
            }
        });
    }
    drop(probe);
    connections.shutdown().await;
}

/// The answer to one request.
pub fn answer(probe: &dyn Probe, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    route(probe, request.method(), request.uri().path())
}

fn route(probe: &dyn Probe, method: &Method, path: &str) -> Response<Full<Bytes>> {
    if method != Method::GET && method != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into());
    }
    match path {
        "/metrics" => {
            let mut response = text(StatusCode::OK, probe.metrics());
            if let Ok(value) = METRICS_CONTENT_TYPE.parse() {
                response.headers_mut().insert(CONTENT_TYPE, value);
            }
            response
        }
        "/livez" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => match probe.ready() {
            Ok(()) => text(StatusCode::OK, "ok\n".into()),
            Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
        },
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = "text/plain; charset=utf-8".parse() {
        response.headers_mut().insert(CONTENT_TYPE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Result<(), String>);

    impl Probe for Fixed {
        fn metrics(&self) -> String {
            "# TYPE up gauge\nup 1\n# EOF\n".into()
        }
        fn ready(&self) -> Result<(), String> {
            self.0.clone()
        }
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        socket.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn serves_over_tcp_until_stopped() {
        let probe = Arc::new(Fixed(Err("no leader".into())));
        let server = HttpServer::start("127.0.0.1:0".parse().unwrap(), probe.clone())
            .await
            .unwrap();
        let addr = server.local_addr();
        let ready = get(addr, "/readyz").await;
        assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
        assert!(ready.ends_with("no leader\n"), "{ready}");
        let metrics = get(addr, "/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(metrics.contains("\nup 1\n"), "{metrics}");
        server.stop().await;
        assert_eq!(Arc::strong_count(&probe), 1, "the server let the probe go");
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    #[test]
    fn routes() {
        let ready = Fixed(Ok(()));
        let get = Method::GET;
        assert_eq!(route(&ready, &get, "/livez").status(), StatusCode::OK);
        assert_eq!(route(&ready, &get, "/readyz").status(), StatusCode::OK);
        let metrics = route(&ready, &get, "/metrics");
        assert_eq!(metrics.status(), StatusCode::OK);
        assert_eq!(
            metrics.headers()[CONTENT_TYPE].to_str().unwrap(),
            METRICS_CONTENT_TYPE
        );
        assert_eq!(route(&ready, &get, "/nope").status(), StatusCode::NOT_FOUND);
        assert_eq!(
            route(&ready, &Method::POST, "/livez").status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        let unready = Fixed(Err("no leader".into()));
        assert_eq!(
            route(&unready, &get, "/readyz").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(route(&unready, &get, "/livez").status(), StatusCode::OK);
    }
}
