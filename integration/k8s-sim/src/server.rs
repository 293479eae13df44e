//! The HTTP/1.1 server: accepts loopback connections, reads each request
//! (body bounded by [`api::BODY_BYTES_MAX`]), answers it through
//! [`api::handle`] with the store locked, and streams watches. The only
//! code of the simulator touching sockets.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::api::{self, Outcome};
use super::meta::rfc3339;
use super::route::{Query, URI_BYTES_MAX};
use super::status::ApiError;
use super::{Shared, watch};

/// Most connections served at once; more wait in the listen backlog.
pub(crate) const CONNECTIONS_MAX: usize = 1024;

/// Pause after a failed accept (e.g. out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Serves until shutdown, then drops every connection (and so every watch).
pub(super) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept(), if connections.len() < CONNECTIONS_MAX => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let shared = shared.clone();
                    let open = Open::count(&shared);
                    connections.spawn(async move {
                        let _open = open;
                        let service = service_fn(move |req| respond(shared.clone(), req));
                        // A client closing mid-request is not our error.
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "k8s-sim: accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
    connections.shutdown().await;
}

/// One accepted connection, counted in [`Shared::connections`] until
/// dropped (when the server is done with it, or its task is aborted).
struct Open(Arc<Shared>);

impl Open {
    fn count(shared: &Arc<Shared>) -> Open {
        shared.connections.send_modify(|n| *n += 1);
        Open(shared.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.connections.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Sends one request to the server at `addr` on a connection of its own
/// and reads the answer to its end (`Connection: close`).
pub(super) async fn request_once(addr: SocketAddr) -> std::io::Result<()> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(b"GET /version HTTP/1.1\r\nHost: k8s-sim\r\nConnection: close\r\n\r\n")
        .await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    if answer.starts_with(b"HTTP/1.1 ") {
        Ok(())
    } else {
        Err(std::io::Error::other("k8s-sim: not an HTTP answer"))
    }
}

/// The first of `denied` that `body` names as a JSON string (the image
/// in quotes, as any encoding of a container carries it).
fn denied_image(denied: &[String], body: &[u8]) -> Option<String> {
    denied
        .iter()
        .find(|image| {
            let quoted = format!("\"{image}\"");
            body.windows(quoted.len()).any(|w| w == quoted.as_bytes())
        })
        .cloned()
}

fn header(headers: &HeaderMap, name: hyper::header::HeaderName) -> &str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

async fn respond(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    let query = parts.uri.query().unwrap_or("");
    if path.len() + query.len() > URI_BYTES_MAX {
        let e = ApiError::bad_request(format!("request URI longer than {URI_BYTES_MAX} bytes"));
        return Ok(json(e.code, &e.to_status()));
    }
    let body = match Limited::new(body, api::BODY_BYTES_MAX).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            let error = if e
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                ApiError::too_large(api::BODY_BYTES_MAX)
            } else {
                ApiError::bad_request(format!("reading the request body: {e}"))
            };
            return Ok(json(error.code, &error.to_status()));
        }
    };
    let request = api::Request {
        method: parts.method.as_str(),
        path,
        query: Query::parse(query),
        content_type: header(&parts.headers, CONTENT_TYPE),
        accept: header(&parts.headers, hyper::header::ACCEPT),
        user_agent: header(&parts.headers, hyper::header::USER_AGENT),
        body: &body,
    };
    if let Some(access) = super::audit::access(request.method, path, &request.query) {
        shared.record_access(access);
    }
    if request.method == "DELETE"
        && let Some(name) = path.rsplit('/').next()
        && shared.settings().refused_deletes.iter().any(|n| n == name)
    {
        let e = ApiError {
            code: 403,
            reason: "Forbidden",
            message: format!(
                "admission webhook \"deny-delete.k8s-sim.test\" denied the request: {name} may not be deleted"
            ),
            details: None,
        };
        return Ok(json(e.code, &e.to_status()));
    }
    if matches!(request.method, "POST" | "PUT" | "PATCH")
        && let Some(image) = denied_image(&shared.settings().denied_images, &body)
    {
        let e = ApiError {
            code: 403,
            reason: "Forbidden",
            message: format!(
                "admission webhook \"images.k8s-sim.test\" denied the request: image {image} is not allowed in this cluster"
            ),
            details: None,
        };
        return Ok(json(e.code, &e.to_status()));
    }
    let now = rfc3339(SystemTime::now());
    let outcome = shared.write(|store| api::handle(store, &request, &now));
    tracing::debug!(method = request.method, path, query, "k8s-sim request");
    Ok(match outcome {
        Outcome::Json(code, value) => json(code, &value),
        Outcome::Text(code, text) => {
            let mut r = Response::new(Full::new(Bytes::from(text)).boxed_unsync());
            *r.status_mut() = status_code(code);
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            r
        }
        Outcome::Watch(spec) => {
            let stream = watch::stream(shared.clone(), *spec);
            let mut r = Response::new(StreamBody::new(stream).boxed_unsync());
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
    })
}

fn status_code(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

fn json(code: u16, value: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(value.to_string())).boxed_unsync());
    *r.status_mut() = status_code(code);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

#[cfg(test)]
mod tests {
    use super::denied_image;

    #[test]
    fn a_body_naming_a_denied_image_as_a_string_is_denied_and_no_other() {
        let denied = vec!["chaos/denied:1".to_string()];
        let body = br#"{"spec":{"containers":[{"name":"app","image":"chaos/denied:1"}]}}"#;
        assert_eq!(
            denied_image(&denied, body).as_deref(),
            Some("chaos/denied:1")
        );
        // A longer image that starts with it, or the name outside a
        // string, is not it.
        let other = br#"{"image":"chaos/denied:10","note":"chaos/denied:1 is denied"}"#;
        assert_eq!(denied_image(&denied, other), None);
        assert_eq!(denied_image(&[], body), None);
    }
}
