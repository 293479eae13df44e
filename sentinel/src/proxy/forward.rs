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
//! task counted by the drain.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::http::uri::{self, PathAndQuery, Scheme};
use hyper::upgrade::OnUpgrade;
use hyper::{Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::TokioIo;
use tracing::{debug, warn};

use super::Proxy;
use super::body::Slot;
use super::headers;
use crate::metrics::{NO_DEPLOYMENT, UpstreamError};
use crate::routes::Routed;
use crate::table::{NotReady, Pick};

/// The path the main listener answers itself, 200 "ok" (liveness, kept
/// for compatibility).
pub const HEALTH_PATH: &str = "/_unkey/internal/health";

/// The body of every response the proxy sends.
pub(super) type ResponseBody = BoxBody<Bytes, hyper::Error>;

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

/// The URI of a request for `pick`: `http://`, the instance, and the
/// client's path and query (the parts shared, not copied).
fn upstream_uri(pick: &Pick, path: &PathAndQuery) -> Result<Uri, hyper::http::Error> {
    if !path.as_str().starts_with('/') {
        // Not an origin-form path (`*`): made from text as it always was.
        return Ok(format!("http://{}{path}", pick.instance).parse::<Uri>()?);
    }
    let mut parts = uri::Parts::default();
    parts.scheme = Some(Scheme::HTTP);
    parts.authority = Some(pick.authority.clone());
    parts.path_and_query = Some(path.clone());
    Ok(Uri::from_parts(parts)?)
}

/// A plain-text response.
fn text(status: StatusCode, body: String) -> Response<ResponseBody> {
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
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
            return text(StatusCode::OK, "ok\n".into());
        }
        let started = Instant::now();
        let _in_flight = self.routes.metrics().in_flight();
        let upgrade =
            request.version() == Version::HTTP_11 && headers::is_upgrade(request.headers());
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));
        let (mut parts, body) = request.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        headers::ensure_host(&mut parts.headers, parts.uri.authority());
        headers::strip_hop_by_hop(&mut parts.headers, upgrade);
        headers::add_forwarded(&mut parts.headers, forwarded_for);
        let slot = Slot::new(body);
        let attempts = self.settings.retries.saturating_add(1);
        let mut failed: Vec<Pick> = Vec::new();
        for _ in 0..attempts {
            let routed = match self.routes.pick() {
                Ok(routed) => routed,
                Err(why) => return self.unavailable(&why, started),
            };
            let pick = &routed.pick;
            let uri = match upstream_uri(pick, &path) {
                Ok(uri) => uri,
                Err(e) => {
                    // The path came from a parsed URI and the instance is
                    // a socket address: not expected.
                    return self.bad_gateway(&routed, UpstreamError::Send, &e, started);
                }
            };
            let mut outgoing = Request::new(slot.body());
            *outgoing.method_mut() = parts.method.clone();
            *outgoing.uri_mut() = uri;
            *outgoing.version_mut() = Version::HTTP_11;
            *outgoing.headers_mut() = parts.headers.clone();
            let sent =
                tokio::time::timeout(self.settings.request_timeout, self.client.request(outgoing))
                    .await;
            match sent {
                Ok(Ok(response)) => {
                    return self.relay(response, &routed, client_upgrade, started);
                }
                Ok(Err(e)) if e.is_connect() => {
                    let metrics = self.routes.metrics();
                    metrics.upstream_error(&pick.deployment_id, UpstreamError::Connect);
                    if self.routes.eject(pick.instance) {
                        warn!(
                            instance = %pick.instance,
                            deployment = %pick.deployment_id,
                            "instance ejected: {}", chain(&e)
                        );
                    }
                    if !slot.unread() {
                        // Not expected: the body is read only once a
                        // connection exists.
                        return self.bad_gateway(&routed, UpstreamError::Connect, &e, started);
                    }
                    failed.push(routed.pick);
                }
                Ok(Err(e)) => return self.bad_gateway(&routed, UpstreamError::Send, &e, started),
                Err(_) => return self.timed_out(&routed, started),
            }
        }
        if let Some(why) = self.routes.why_not_ready() {
            return self.unavailable(&why, started);
        }
        let deployment = failed
            .last()
            .map_or(NO_DEPLOYMENT, |pick| &*pick.deployment_id)
            .to_string();
        self.routes.metrics().request(
            &deployment,
            StatusCode::BAD_GATEWAY.as_u16(),
            started.elapsed().as_secs_f64(),
        );
        text(
            StatusCode::BAD_GATEWAY,
            format!(
                "bad gateway: could not connect to {} instance(s) of deployment {deployment}\n",
                failed.len()
            ),
        )
    }

    /// Relays an upstream response; a `101` to an upgrade request starts
    /// the tunnel.
    fn relay(
        &self,
        mut response: Response<Incoming>,
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
            upgraded = true;
            let upstream_upgrade = hyper::upgrade::on(&mut response);
            self.tunnel(client_upgrade, upstream_upgrade, pick);
        }
        headers::strip_hop_by_hop(response.headers_mut(), upgraded);
        routed
            .metrics
            .request(status.as_u16(), started.elapsed().as_secs_f64());
        response.map(|body| body.boxed())
    }

    /// Copies bytes both ways between the client's and the instance's
    /// upgraded connections until either closes or the drain cuts it.
    fn tunnel(&self, client: OnUpgrade, upstream: OnUpgrade, pick: &Pick) {
        let guard = self.drain.tunnel();
        let cut = self.drain.cut_signal();
        let instance = pick.instance;
        tokio::spawn(async move {
            let _guard = guard;
            let copy = async {
                let (client, upstream) = tokio::try_join!(client, upstream)
                    .map_err(|e| format!("upgrade failed: {}", chain(&e)))?;
                let mut client = TokioIo::new(client);
                let mut upstream = TokioIo::new(upstream);
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
