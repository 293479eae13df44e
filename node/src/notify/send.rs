//! The webhook client: one HTTP/1 POST per attempt, over plain HTTP or
//! TLS (rustls with ring, the system's root certificates), bounded by the
//! node's `notify.request_timeout_ms`. The answer's status is all that
//! counts: 2xx is delivered, anything else (or no answer in time) fails.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use hyper::header::{CONTENT_TYPE, HeaderValue, USER_AGENT};
use hyper_rustls::{ConfigBuilderExt, HttpsConnector};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tracing::warn;
use wire::notify::{Delivery, EVENT_ID_HEADER, NotifyEndpoint, SIGNATURE_HEADER};

use super::{body, signature};

/// Longest status text kept in a failure.
const REASON_BYTES_MAX: usize = 64;

/// Sends webhook deliveries.
#[derive(Clone)]
pub struct Sender {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    timeout: Duration,
}

impl Sender {
    /// A client whose attempts take at most `timeout`. HTTPS endpoints
    /// are checked against the system's root certificates; with none
    /// found, every HTTPS attempt fails (and says so), HTTP still works.
    pub fn new(timeout: Duration) -> Result<Sender, rustls::Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?;
        let tls = match builder.clone().with_native_roots() {
            Ok(with_roots) => with_roots.with_no_client_auth(),
            Err(e) => {
                warn!("webhooks: no system root certificates ({e}); https endpoints will fail");
                builder
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth()
            }
        };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Sender { client, timeout })
    }

    /// POSTs `delivery` to `endpoint`: the JSON body, the event id header,
    /// the signature header when the endpoint has a secret. `Err` says why
    /// it was not delivered.
    pub async fn send(&self, endpoint: &NotifyEndpoint, delivery: &Delivery) -> Result<(), String> {
        let body = body(delivery);
        let mut request = Request::post(endpoint.url.as_str())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header(USER_AGENT, concat!("ctrl/", env!("CARGO_PKG_VERSION")))
            .header(EVENT_ID_HEADER, delivery.event_id.to_string());
        if let Some(secret) = &endpoint.secret {
            request = request.header(SIGNATURE_HEADER, signature(secret, &body));
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("bad request: {e}"))?;
        let answer = tokio::time::timeout(self.timeout, self.client.request(request)).await;
        match answer {
            Err(_) => Err(format!("no answer within {} ms", self.timeout.as_millis())),
            Ok(Err(e)) => Err(describe(&e)),
            Ok(Ok(response)) if response.status().is_success() => Ok(()),
            Ok(Ok(response)) => {
                let status = response.status();
                let reason = status.canonical_reason().unwrap_or("");
                let reason: String = reason.chars().take(REASON_BYTES_MAX).collect();
                Err(format!("HTTP {} {reason}", status.as_u16()))
            }
        }
    }
}

/// A client error with its causes, one line.
fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::net::SocketAddr;

    use http_body_util::BodyExt;
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use hyper::{Response, StatusCode};
    use hyper_util::rt::TokioIo;
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;
    use wire::notify::{DeliveryState, NotifyEvent};

    use super::*;

    /// What the receiver saw of one request: event id, signature, body.
    type Seen = (Option<String>, Option<String>, Vec<u8>);

    /// A receiver answering every request with `status` after `delay`.
    async fn receiver(
        status: StatusCode,
        delay: Duration,
    ) -> (SocketAddr, mpsc::UnboundedReceiver<Seen>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                        let tx = tx.clone();
                        async move {
                            let header = |name: &str| {
                                request
                                    .headers()
                                    .get(name)
                                    .and_then(|v| v.to_str().ok())
                                    .map(str::to_string)
                            };
                            let seen = (header(EVENT_ID_HEADER), header(SIGNATURE_HEADER));
                            let body = request.into_body().collect().await.unwrap().to_bytes();
                            let _ = tx.send((seen.0, seen.1, body.to_vec()));
                            tokio::time::sleep(delay).await;
                            let mut response = Response::new(Full::new(Bytes::new()));
                            *response.status_mut() = status;
                            Ok::<_, Infallible>(response)
                        }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (addr, rx)
    }

    fn endpoint(addr: SocketAddr, secret: Option<&str>) -> NotifyEndpoint {
        NotifyEndpoint {
            name: "chat".into(),
            url: format!("http://{addr}/hook"),
            secret: secret.map(str::to_string),
            created_at_ms: 0,
        }
    }

    fn delivery() -> Delivery {
        Delivery {
            id: 1,
            event_id: 42,
            endpoint: "chat".into(),
            event: NotifyEvent::RolloutStarted {
                rollout_id: "ro_1".into(),
                image: "sentinel:2".into(),
                waves: 5,
                sentinels: 100,
            },
            created_at_ms: 7,
            state: DeliveryState::Pending,
            revision: 1,
            attempts: 0,
            next_attempt_at_ms: 7,
            last_attempt_at_ms: None,
            last_error: None,
            delivered_at_ms: None,
        }
    }

    #[tokio::test]
    async fn a_2xx_is_delivered_with_the_event_id_and_the_signature() {
        let (addr, mut seen) = receiver(StatusCode::NO_CONTENT, Duration::ZERO).await;
        let sender = Sender::new(Duration::from_secs(5)).unwrap();
        sender
            .send(&endpoint(addr, Some("k3y")), &delivery())
            .await
            .unwrap();
        let (event_id, signature, body) = seen.recv().await.unwrap();
        assert_eq!(event_id.as_deref(), Some("42"));
        assert_eq!(signature, Some(super::super::signature("k3y", &body)));
        assert_eq!(body, super::super::body(&delivery()));
        // Without a secret, no signature.
        sender
            .send(&endpoint(addr, None), &delivery())
            .await
            .unwrap();
        assert_eq!(seen.recv().await.unwrap().1, None);
    }

    #[tokio::test]
    async fn another_status_a_slow_answer_or_no_listener_fails() {
        let (addr, _seen) = receiver(StatusCode::SERVICE_UNAVAILABLE, Duration::ZERO).await;
        let sender = Sender::new(Duration::from_millis(300)).unwrap();
        let e = sender
            .send(&endpoint(addr, None), &delivery())
            .await
            .unwrap_err();
        assert_eq!(e, "HTTP 503 Service Unavailable");

        let (slow, _seen) = receiver(StatusCode::OK, Duration::from_secs(30)).await;
        let e = sender
            .send(&endpoint(slow, None), &delivery())
            .await
            .unwrap_err();
        assert!(e.contains("no answer within 300 ms"), "{e}");

        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        let e = sender
            .send(&endpoint(closed, None), &delivery())
            .await
            .unwrap_err();
        assert!(!e.is_empty());
    }
}
