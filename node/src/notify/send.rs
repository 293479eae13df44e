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
