//! One request's way through the proxy: pick an instance, rewrite the
//! request for it, send it within the request timeout, and relay the
//! answer — or answer for the upstream:
//!
//! - no instance can take it: 503, naming the environment, the region
//!   and why (the route table's reason);
//! - the connection to the instance failed (refused, or the connect
//!   timeout): the request was never sent, so the instance is ejected and
//!   the request goes to another one, up to `retries` times; 502 when
//!   they all fail (503 when that leaves no instance at all);
//! - no response head within the request timeout: 504;
//! - the exchange failed after the request was sent: 502, never retried.
//!
//! An upgrade (`Connection: upgrade`, WebSocket) answered `101` becomes a
//! tunnel: both sides' upgraded connections copied into each other, in a
//! task counted by the drain. `CONNECT` is refused (405): the sentinel
//! proxies to its environment's instances, not to addresses clients name.

use std::error::Error as StdError;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE, HOST, HeaderValue};
use hyper::http::uri;
use hyper::upgrade::OnUpgrade;
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tracing::{debug, warn};

use super::Proxy;
use super::body::ResponseBody;
use super::conn::ExchangeError;
use super::exchange::{SendError, UpstreamBody};
use super::headers;
use super::pool::{ConnectError, IDLE_PER_INSTANCE_MAX};
use crate::metrics::{NO_DEPLOYMENT, UpstreamError};
use crate::routes::Routed;
use crate::table::{NotReady, Pick};

/// The path the main listener answers itself, 200 "ok" (liveness, kept
/// for compatibility).
pub const HEALTH_PATH: &str = "/_unkey/internal/health";

/// Most times a request given back unsent by a pooled connection (closed
/// by the instance as it was taken) goes out on another connection to
/// the same instance: every idle connection may have been closed at once.
const CLOSED_RESENDS_MAX: usize = IDLE_PER_INSTANCE_MAX;

/// Why an exchange with an instance failed.
#[derive(Debug)]
enum Failure {
    /// No connection could be made: the request, never sent, is handed
    /// back for another instance.
    /// (Boxed: the rare case keeps the common result small.)
    Connect(ConnectError, Box<Request<Incoming>>),
    /// The exchange failed after the request was handed to a connection.
    Send(ExchangeError),
}

/// `error` and its sources, `: `-separated (hyper's errors say little
/// without their sources).
fn chain(error: &dyn StdError) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// The origin form (path and query, `/` when empty) of a request's URI,
/// as an HTTP/1.1 request line wants it; an HTTP/1.1 request's URI is
/// already one, kept as is.
fn origin_form(uri: Uri) -> Uri {
    if uri.scheme().is_none() && uri.authority().is_none() {
        return uri;
    }
    match uri.path_and_query() {
        Some(path) if path.as_str() != "/" => {
            let mut parts = uri::Parts::default();
            parts.path_and_query = Some(path.clone());
            // Only a path, taken from a valid URI: always valid.
            Uri::from_parts(parts).unwrap_or_default()
        }
        _ => Uri::default(),
    }
}

/// A plain-text response.
fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<ResponseBody> {
    let mut response = Response::new(ResponseBody::text(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

impl Proxy {
    /// Answers one client request.
    pub(super) async fn handle(
        &self,
        mut request: Request<Incoming>,
        forwarded_for: &HeaderValue,
    ) -> Response<ResponseBody> {
        if request.uri().path() == HEALTH_PATH {
            return text(StatusCode::OK, "ok\n");
        }
        if request.method() == Method::CONNECT {
            let mut response = text(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed: the sentinel does not tunnel CONNECT\n",
            );
            response.headers_mut().insert(
                ALLOW,
                HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE"),
            );
            return response;
        }
        let started = Instant::now();
        let _in_flight = self.routes.metrics().in_flight();
        let upgrade =
            request.version() == Version::HTTP_11 && headers::is_upgrade(request.headers());
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));
        let (parts, body) = request.into_parts();
        let mut headers = parts.headers;
        let has_host = headers::ensure_host(&mut headers, parts.uri.authority());
        let named_removed = headers::strip_hop_by_hop(&mut headers, upgrade);
        // Without `Host` (HTTP/1.0, or `Connection` named it), the
        // instance's address is sent.
        let host_missing = !has_host || (named_removed && !headers.contains_key(HOST));
        headers::add_forwarded(&mut headers, forwarded_for);
        // One request for every attempt: a connection that fails hands
        // it back unsent (the body untouched), nothing is copied.
        let mut outgoing = Request::new(body);
        *outgoing.method_mut() = parts.method;
        *outgoing.uri_mut() = origin_form(parts.uri);
        *outgoing.version_mut() = Version::HTTP_11;
        *outgoing.headers_mut() = headers;
        let attempts = self.settings.retries.saturating_add(1);
        let mut failed = 0_usize;
        let mut failed_deployment: Option<Arc<str>> = None;
        for attempt in 0..attempts {
            let routed = match self.routes.pick() {
                Ok(routed) => routed,
                Err(why) => return self.unavailable(&why, started),
            };
            let pick = &routed.pick;
            if host_missing {
                if let Ok(host) = HeaderValue::from_str(pick.authority.as_str()) {
                    outgoing.headers_mut().insert(HOST, host);
                }
            }
            // Each attempt gets the whole request timeout (the first from
            // the clock read at the start: one read fewer).
            let now = if attempt == 0 {
                started
            } else {
                Instant::now()
            };
            let sent = tokio::time::timeout_at(
                (now + self.settings.request_timeout).into(),
                self.exchange(pick.instance, outgoing),
            )
            .await;
            match sent {
                Ok(Ok(response)) => {
                    return self.relay(response, &routed, client_upgrade, started);
                }
                Ok(Err(Failure::Connect(e, unsent))) => {
                    let metrics = self.routes.metrics();
                    metrics.upstream_error(&pick.deployment_id, UpstreamError::Connect);
                    if self.routes.eject(pick.instance) {
                        warn!(
                            instance = %pick.instance,
                            deployment = %pick.deployment_id,
                            "instance ejected: {}", chain(&e)
                        );
                    }
                    outgoing = *unsent;
                    failed += 1;
                    failed_deployment = Some(Arc::clone(&pick.deployment_id));
                }
                Ok(Err(Failure::Send(e))) => {
                    return self.bad_gateway(&routed, UpstreamError::Send, &e, started);
                }
                Err(_) => return self.timed_out(&routed, started),
            }
        }
        if let Some(why) = self.routes.why_not_ready() {
            return self.unavailable(&why, started);
        }
        let deployment = failed_deployment.as_deref().unwrap_or(NO_DEPLOYMENT);
        self.routes.metrics().request(
            deployment,
            StatusCode::BAD_GATEWAY.as_u16(),
            started.elapsed().as_secs_f64(),
        );
        text(
            StatusCode::BAD_GATEWAY,
            format!(
                "bad gateway: could not connect to {failed} instance(s) of deployment {deployment}\n"
            ),
        )
    }

    /// Sends `request` to `instance` on a pooled connection, or a new one
    /// when none is idle, and waits for the response head. A pooled
    /// connection that turns out closed before the request went out hands
    /// it back, and it goes out on the next one.
    async fn exchange(
        &self,
        instance: SocketAddr,
        mut request: Request<Incoming>,
    ) -> Result<Response<UpstreamBody>, Failure> {
        let mut resends = 0;
        loop {
            let lease = match self.pool.checkout(instance) {
                Ok(lease) => lease,
                Err(stack) => match self.pool.connect(instance, stack).await {
                    Ok(lease) => lease,
                    Err(e) => return Err(Failure::Connect(e, Box::new(request))),
                },
            };
            match lease.send(request).await {
                Ok(response) => return Ok(response),
                Err(SendError::Closed(e, unsent)) if resends < CLOSED_RESENDS_MAX => {
                    debug!(%instance, "pooled connection closed, request unsent: {e}");
                    resends += 1;
                    request = *unsent;
                }
                Err(SendError::Closed(_, _)) => return Err(Failure::Send(ExchangeError::Closed)),
                Err(SendError::Failed(e)) => return Err(Failure::Send(e)),
            }
        }
    }

    /// Relays an upstream response; a `101` to an upgrade request starts
    /// the tunnel.
    fn relay(
        &self,
        mut response: Response<UpstreamBody>,
        routed: &Routed,
        client_upgrade: Option<OnUpgrade>,
        started: Instant,
    ) -> Response<ResponseBody> {
        let pick = &routed.pick;
        let status = response.status();
        let mut upgraded = false;
        if status == StatusCode::SWITCHING_PROTOCOLS {
            let Some(client_upgrade) = client_upgrade else {
                let e = std::io::Error::other("switched protocols unasked");
                return self.bad_gateway(routed, UpstreamError::Send, &e, started);
            };
            let Some(upstream) = response.body_mut().take_upgraded() else {
                let e = std::io::Error::other("switched protocols without a connection");
                return self.bad_gateway(routed, UpstreamError::Send, &e, started);
            };
            upgraded = true;
            self.tunnel(client_upgrade, upstream, pick);
        }
        headers::strip_hop_by_hop(response.headers_mut(), upgraded);
        routed
            .metrics
            .request(status.as_u16(), started.elapsed().as_secs_f64());
        response.map(ResponseBody::Upstream)
    }

    /// Copies bytes both ways between the client's upgraded connection
    /// and the instance's (first what the instance sent past its `101`)
    /// until either closes or the drain cuts it.
    fn tunnel(
        &self,
        client: OnUpgrade,
        (mut upstream, early): (tokio::net::TcpStream, bytes::BytesMut),
        pick: &Pick,
    ) {
        let guard = self.drain.tunnel();
        let cut = self.drain.cut_signal();
        let instance = pick.instance;
        tokio::spawn(async move {
            let _guard = guard;
            let copy = async {
                let client = client
                    .await
                    .map_err(|e| format!("upgrade failed: {}", chain(&e)))?;
                let mut client = TokioIo::new(client);
                if !early.is_empty() {
                    client
                        .write_all(&early)
                        .await
                        .map_err(|e| format!("tunnel failed: {e}"))?;
                }
                tokio::io::copy_bidirectional(&mut client, &mut upstream)
                    .await
                    .map_err(|e| format!("tunnel failed: {e}"))
            };
            tokio::select! {
                result = copy => match result {
                    Ok((up, down)) => debug!(%instance, up, down, "tunnel closed"),
                    Err(e) => debug!(%instance, "{e}"),
                },
                () = cut => warn!(%instance, "tunnel cut: the drain grace is over"),
            }
        });
    }

    /// 503: no instance can take the request.
    fn unavailable(&self, why: &NotReady, started: Instant) -> Response<ResponseBody> {
        let metrics = self.routes.metrics();
        metrics.upstream_error(NO_DEPLOYMENT, UpstreamError::NoInstance);
        metrics.request(
            NO_DEPLOYMENT,
            StatusCode::SERVICE_UNAVAILABLE.as_u16(),
            started.elapsed().as_secs_f64(),
        );
        debug!("no instance for a request: {why}");
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "service unavailable: the sentinel of environment {} in region {} has no instance to send this request to: {why}\n",
                self.routes.environment_id(),
                self.routes.region()
            ),
        )
    }

    /// 502: the exchange with `pick` failed.
    fn bad_gateway(
        &self,
        routed: &Routed,
        kind: UpstreamError,
        error: &dyn StdError,
        started: Instant,
    ) -> Response<ResponseBody> {
        let pick = &routed.pick;
        if kind != UpstreamError::Connect {
            self.routes
                .metrics()
                .upstream_error(&pick.deployment_id, kind);
        }
        routed.metrics.request(
            StatusCode::BAD_GATEWAY.as_u16(),
            started.elapsed().as_secs_f64(),
        );
        warn!(
            instance = %pick.instance,
            deployment = %pick.deployment_id,
            "upstream failed: {}", chain(error)
        );
        text(
            StatusCode::BAD_GATEWAY,
            format!(
                "bad gateway: deployment {} failed to answer\n",
                pick.deployment_id
            ),
        )
    }

    /// 504: no response head within the request timeout.
    fn timed_out(&self, routed: &Routed, started: Instant) -> Response<ResponseBody> {
        let pick = &routed.pick;
        self.routes
            .metrics()
            .upstream_error(&pick.deployment_id, UpstreamError::Timeout);
        routed.metrics.request(
            StatusCode::GATEWAY_TIMEOUT.as_u16(),
            started.elapsed().as_secs_f64(),
        );
        let timeout_ms = self.settings.request_timeout.as_millis();
        warn!(
            instance = %pick.instance,
            deployment = %pick.deployment_id,
            "upstream gave no response within {timeout_ms} ms"
        );
        text(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "gateway timeout: deployment {} did not answer within {timeout_ms} ms\n",
                pick.deployment_id
            ),
        )
    }
}
