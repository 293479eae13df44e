//! The admin listener, apart from the traffic: `/livez` (200 while the
//! process serves), `/readyz` (200 only when the route table can serve a
//! request and the sentinel is not draining; 503 with the reason
//! otherwise) and `/metrics` (Prometheus text). HTTP/1.1, a bounded
//! number of connections; it keeps answering while the proxy drains, so
//! probes see `/readyz` turn 503.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use crate::drain::Drain;
use crate::routes::Routes;

/// Most admin connections at once (probes and scrapes).
const ADMIN_CONNECTIONS_MAX: usize = 64;
/// Longest wait for a request head on an admin connection.
const ADMIN_HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// Wait after a failed accept.
const ACCEPT_ERROR_PAUSE_MS: u64 = 100;
/// The content type of `/metrics`: OpenMetrics text, which Prometheus
/// reads.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What `/readyz` answers: `Ok(text)` for 200, `Err(reason)` for 503.
pub fn readiness(routes: &Routes, drain: &Drain) -> Result<String, String> {
    if drain.is_draining() {
        return Err("not ready: draining\n".into());
    }
    match routes.why_not_ready() {
        None => Ok(format!(
            "ready: generation {}\n",
            routes.generation().unwrap_or(0)
        )),
        Some(why) => Err(format!(
            "not ready: environment {} in region {}: {why}\n",
            routes.environment_id(),
            routes.region()
        )),
    }
}

fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn answer(request: &Request<Incoming>, routes: &Routes, drain: &Drain) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    match request.uri().path() {
        "/livez" => respond(StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" => match readiness(routes, drain) {
            Ok(text) => respond(StatusCode::OK, TEXT, text),
            Err(text) => respond(StatusCode::SERVICE_UNAVAILABLE, TEXT, text),
        },
        "/metrics" => respond(
            StatusCode::OK,
            METRICS_CONTENT_TYPE,
            routes.metrics().render(),
        ),
        _ => respond(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: /livez, /readyz, /metrics\n".into(),
        ),
    }
}

/// Serves `listener` for ever.
pub async fn serve(listener: TcpListener, routes: Arc<Routes>, drain: Drain) {
    let slots = Arc::new(Semaphore::new(ADMIN_CONNECTIONS_MAX));
    loop {
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            // The semaphore is never closed.
            return;
        };
        let (stream, remote) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                warn!("admin accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_PAUSE_MS)).await;
                continue;
            }
        };
        let routes = Arc::clone(&routes);
        let drain = drain.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let response = answer(&request, &routes, &drain);
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_millis(ADMIN_HEADER_READ_TIMEOUT_MS))
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = connection.await {
                debug!(%remote, "admin connection ended: {e}");
            }
            drop(permit);
        });
    }
}
