//! The pods' echo, on the loopback pod network
//! ([`PodNetwork::Loopback`](super::network::PodNetwork)): for each served
//! pod, a listener on `podIP:containerPort` for every declared TCP port,
//! answering every HTTP/1.1 request with `200` and a JSON body naming the
//! pod:
//!
//! ```json
//! {"pod": "web-0", "namespace": "apps", "image": "app:1",
//!  "labels": {"app": "web"}, "method": "GET", "path": "/x", "query": "a=1"}
//! ```
//!
//! (`image` is the first container's; `query` is `""` without one.)
//! A request to [`SLEEP_PATH`]`?ms=N` answers the same after `N`
//! milliseconds (at most [`SLEEP_MS_MAX`]; otherwise `400`): a slow
//! upstream for drain tests. A request asking for a WebSocket upgrade gets
//! `501`.
//!
//! Listeners follow the controller's [`EndpointChange`]s: the driver binds
//! them with the store locked, in the pass that makes a pod Running, so a
//! client that sees the pod Running can connect at once; a pod deleted or
//! no longer Running has its listener closed (new connections refused)
//! before the driver moves on, while requests in flight may finish (for at
//! most [`DRAIN_MS_MAX`]). A failed bind (address in use) is logged and the
//! pod stays Running without an echo. Shutting the simulator down closes
//! every listener and drops every connection. [`Simulator::echo_addrs`]
//! and [`Simulator::wait_echo`] tell which addresses listen now.
//!
//! With `server`, the only code of the simulator touching sockets.
//!
//! [`Simulator::echo_addrs`]: super::Simulator::echo_addrs
//! [`Simulator::wait_echo`]: super::Simulator::wait_echo

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderMap, HeaderValue, UPGRADE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch as channel};
use tokio::task::JoinSet;

use super::Shared;
use super::network::{Endpoint, EndpointChange, PodIdentity};

/// The path of the slow answer: `/_sim/sleep?ms=N`.
pub const SLEEP_PATH: &str = "/_sim/sleep";

/// Longest wait [`SLEEP_PATH`] accepts, in milliseconds.
pub const SLEEP_MS_MAX: u64 = 60_000;

/// Longest a closed listener's connections may finish their requests
/// in, in milliseconds (then they are dropped).
pub const DRAIN_MS_MAX: u64 = SLEEP_MS_MAX + 5_000;

/// Most connections one listener serves at once; more wait in its
/// backlog.
pub const CONNECTIONS_MAX: usize = 256;

/// Longest the driver waits for a listener to report itself closed.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Pause after a failed accept (e.g. out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The body of an echo's answer.
pub fn echo_body(identity: &PodIdentity, method: &str, path: &str, query: &str) -> Value {
    json!({
        "pod": identity.name,
        "namespace": identity.namespace,
        "image": identity.image,
        "labels": identity.labels,
        "method": method,
        "path": path,
        "query": query,
    })
}

/// The `ms` of a [`SLEEP_PATH`] query, checked against [`SLEEP_MS_MAX`].
pub fn sleep_ms(query: &str) -> Result<u64, String> {
    let ms = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("ms="))
        .ok_or_else(|| format!("{SLEEP_PATH} needs ?ms=N"))?;
    match ms.parse::<u64>() {
        Ok(ms) if ms <= SLEEP_MS_MAX => Ok(ms),
        _ => Err(format!(
            "{SLEEP_PATH}: ms must be a whole number of milliseconds up to {SLEEP_MS_MAX}, not {ms:?}"
        )),
    }
}

/// One listener of a served pod.
struct Listener {
    addr: SocketAddr,
    /// Dropped or fired: the listener closes.
    close: oneshot::Sender<()>,
    /// Fires (or errs) once the listening socket is closed.
    closed: oneshot::Receiver<()>,
}

/// A served pod.
struct Served {
    endpoint: Endpoint,
    /// What its connections answer with; replaced on a label change.
    identity: channel::Sender<Arc<PodIdentity>>,
    /// Its bound listeners (ports whose bind failed are absent).
    listeners: Vec<Listener>,
}

/// Listeners being closed, to await with [`Echoes::settle`].
#[must_use = "settle it, so the closes are awaited and published"]
pub(crate) struct Closing {
    closed: Vec<oneshot::Receiver<()>>,
    changed: bool,
}

/// Every served pod's listeners, owned by the controller's driver.
pub(crate) struct Echoes {
    shared: Arc<Shared>,
    served: HashMap<String, Served>,
    /// Accept loops, then their drains.
    tasks: JoinSet<()>,
}

impl Echoes {
    pub(crate) fn new(shared: Arc<Shared>) -> Echoes {
        Echoes {
            shared,
            served: HashMap::new(),
            tasks: JoinSet::new(),
        }
    }

    /// Binds what is to be served and tells what is to stop to close; no
    /// waiting (it runs with the store locked).
    pub(crate) fn apply(&mut self, changes: Vec<EndpointChange>) -> Closing {
        while self.tasks.try_join_next().is_some() {}
        let mut closing = Closing {
            closed: Vec::new(),
            changed: !changes.is_empty(),
        };
        for change in changes {
            match change {
                EndpointChange::Serve { uid, endpoint } => {
                    if let Some(served) = self.served.get_mut(&uid) {
                        if served.endpoint.ip == endpoint.ip
                            && served.endpoint.ports == endpoint.ports
                        {
                            served
                                .identity
                                .send_replace(Arc::new(endpoint.identity.clone()));
                            served.endpoint = endpoint;
                            continue;
                        }
                    }
                    if let Some(old) = self.served.remove(&uid) {
                        close(old, &mut closing);
                    }
                    let served = self.bind(endpoint);
                    self.served.insert(uid, served);
                }
                EndpointChange::Stop { uid } => {
                    if let Some(old) = self.served.remove(&uid) {
                        close(old, &mut closing);
                    }
                }
            }
        }
        closing
    }

    /// Waits (bounded) until the listeners told to close have closed, then
    /// publishes the addresses listening now.
    pub(crate) async fn settle(&mut self, closing: Closing) {
        if !closing.changed {
            return;
        }
        for closed in closing.closed {
            // An error is a listener task gone, its socket with it.
            if tokio::time::timeout(CLOSE_WAIT, closed).await.is_err() {
                tracing::warn!("k8s-sim echo: a listener did not report closing");
            }
        }
        let now: BTreeSet<SocketAddr> = self
            .served
            .values()
            .flat_map(|s| s.listeners.iter().map(|l| l.addr))
            .collect();
        self.shared.echo_addrs.send_if_modified(|addrs| {
            let changed = *addrs != now;
            *addrs = now;
            changed
        });
    }

    /// Closes every listener and waits until they are closed.
    pub(crate) async fn close_all(&mut self) {
        let mut closing = Closing {
            closed: Vec::new(),
            changed: true,
        };
        for (_, served) in self.served.drain() {
            close(served, &mut closing);
        }
        self.settle(closing).await;
    }

    fn bind(&mut self, endpoint: Endpoint) -> Served {
        let (identity, identity_rx) = channel::channel(Arc::new(endpoint.identity.clone()));
        let mut listeners = Vec::new();
        for &port in &endpoint.ports {
            let addr = SocketAddr::from((endpoint.ip, port));
            let listener = match bind(addr) {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(%addr, pod = %endpoint.identity.name, error = %e,
                        "k8s-sim echo: cannot listen; the pod runs without an echo on this port");
                    continue;
                }
            };
            let (close, close_rx) = oneshot::channel();
            let (closed_tx, closed) = oneshot::channel();
            self.tasks.spawn(listen(
                listener,
                identity_rx.clone(),
                close_rx,
                closed_tx,
                self.shared.shutdown.subscribe(),
            ));
            listeners.push(Listener {
                addr,
                close,
                closed,
            });
        }
        Served {
            endpoint,
            identity,
            listeners,
        }
    }
}

fn close(served: Served, closing: &mut Closing) {
    for l in served.listeners {
        let _ = l.close.send(());
        closing.closed.push(l.closed);
    }
}

/// A listening socket, bound synchronously.
fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    TcpListener::from_std(listener)
}

/// Accepts until told to close (or shutdown), closes the socket and says
/// so, then lets the connections finish their requests (bounded).
async fn listen(
    listener: TcpListener,
    identity: channel::Receiver<Arc<PodIdentity>>,
    mut close: oneshot::Receiver<()>,
    closed: oneshot::Sender<()>,
    mut shutdown: channel::Receiver<bool>,
) {
    let (draining, draining_rx) = channel::channel(false);
    let mut connections = JoinSet::new();
    let shutting_down = loop {
        tokio::select! {
            // Fired, or its sender dropped: either way, close.
            _ = &mut close => break false,
            _ = until_true(&mut shutdown) => break true,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept(), if connections.len() < CONNECTIONS_MAX => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(connection(stream, identity.clone(), draining_rx.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "k8s-sim echo: accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    };
    drop(listener);
    let _ = closed.send(());
    if shutting_down {
        return;
    }
    draining.send_replace(true);
    let drained = async { while connections.join_next().await.is_some() {} };
    tokio::select! {
        _ = drained => {}
        _ = until_true(&mut shutdown) => {}
        _ = tokio::time::sleep(Duration::from_millis(DRAIN_MS_MAX)) => {}
    }
}

/// Serves one connection; once draining, finishes the request in flight
/// and closes.
async fn connection(
    stream: TcpStream,
    identity: channel::Receiver<Arc<PodIdentity>>,
    mut draining: channel::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |req| answer(identity.clone(), req));
    let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        // A client closing mid-request is not our error.
        _ = conn.as_mut() => return,
        _ = until_true(&mut draining) => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

/// Until the flag is set or its sender is gone (the guard `wait_for`
/// returns is not `Send`, so it is dropped here).
async fn until_true(flag: &mut channel::Receiver<bool>) {
    let _ = flag.wait_for(|set| *set).await;
}

fn wants_websocket(headers: &HeaderMap) -> bool {
    headers
        .get_all(UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("websocket"))
}

async fn answer(
    identity: channel::Receiver<Arc<PodIdentity>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if wants_websocket(req.headers()) {
        return Ok(text(
            StatusCode::NOT_IMPLEMENTED,
            "k8s-sim echo: WebSocket upgrades are not served\n".into(),
        ));
    }
    let path = req.uri().path();
    let query = req.uri().query().unwrap_or("");
    if path == SLEEP_PATH {
        match sleep_ms(query) {
            Ok(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            Err(why) => return Ok(text(StatusCode::BAD_REQUEST, format!("{why}\n"))),
        }
    }
    let identity = identity.borrow().clone();
    let body = echo_body(&identity, req.method().as_str(), path, query);
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(r)
}

fn text(code: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleep_takes_a_bounded_ms() {
        assert_eq!(sleep_ms("ms=200"), Ok(200));
        assert_eq!(sleep_ms("x=1&ms=0"), Ok(0));
        assert_eq!(sleep_ms(&format!("ms={SLEEP_MS_MAX}")), Ok(SLEEP_MS_MAX));
        for bad in [
            "",
            "ms=",
            "ms=-1",
            "ms=1.5",
            "ms=60001",
            "ms=99999999999999999999",
        ] {
            assert!(sleep_ms(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_body_names_the_pod_and_the_request() {
        let identity = PodIdentity {
            name: "web-0".into(),
            namespace: "apps".into(),
            image: "app:1".into(),
            labels: json!({"app": "web"}).as_object().unwrap().clone(),
        };
        assert_eq!(
            echo_body(&identity, "GET", "/x", "a=1"),
            json!({"pod": "web-0", "namespace": "apps", "image": "app:1",
                   "labels": {"app": "web"}, "method": "GET", "path": "/x", "query": "a=1"})
        );
    }
}
