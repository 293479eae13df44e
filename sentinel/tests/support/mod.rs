//! Shared by the sentinel's loopback tests: small upstream servers that
//! answer their own name (and can be killed, held, or upgraded), a
//! routes file, a sentinel config on free loopback ports, HTTP clients,
//! and bounded waits.

#![allow(dead_code, unreachable_pub)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sentinel::{Config, RoutesSource};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use wire::routes::{ROUTES_FORMAT, RouteBackend, RoutesDocument};

/// The bound of every test.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `test` within [`TEST_TIMEOUT`].
pub async fn bounded<F: Future>(test: F) -> F::Output {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .expect("the test did not finish in time")
}

/// A small upstream: answers `GET /` with its name (and the `Host` and
/// `x-forwarded-for` it got as headers), holds `/slow` until released,
/// answers `/ws` upgrades with 101 and echoes bytes. One request per
/// connection (`Connection: close`), so a killed upstream refuses the
/// next request at once.
pub struct Upstream {
    pub name: &'static str,
    pub addr: SocketAddr,
    tasks: JoinSet<()>,
    conns: Arc<std::sync::Mutex<JoinSet<()>>>,
    /// Requests to `/slow` that arrived.
    pub arrived: mpsc::UnboundedReceiver<()>,
    release: Arc<Semaphore>,
}

impl Upstream {
    /// An upstream on a free loopback port.
    pub async fn start(name: &'static str) -> Upstream {
        Self::start_on(name, SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// An upstream on `addr` (again, after a kill).
    pub async fn start_on(name: &'static str, addr: SocketAddr) -> Upstream {
        let listener = TcpListener::bind(addr).await.expect("bind an upstream");
        let addr = listener.local_addr().unwrap();
        let (arrived_tx, arrived) = mpsc::unbounded_channel();
        let release = Arc::new(Semaphore::new(0));
        let mut tasks = JoinSet::new();
        let conns_release = Arc::clone(&release);
        let conns = Arc::new(std::sync::Mutex::new(JoinSet::new()));
        let conns_for_accept = Arc::clone(&conns);
        tasks.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let arrived_tx = arrived_tx.clone();
                let release = Arc::clone(&conns_release);
                let service = service_fn(move |request: Request<Incoming>| {
                    let arrived_tx = arrived_tx.clone();
                    let release = Arc::clone(&release);
                    async move { Ok::<_, Infallible>(answer(name, request, arrived_tx, release).await) }
                });
                conns_for_accept.lock().unwrap().spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(false)
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        Upstream {
            name,
            addr,
            tasks,
            conns,
            arrived,
            release,
        }
    }

    /// Lets one held `/slow` request answer.
    pub fn release_one(&self) {
        self.release.add_permits(1);
    }

    /// Stops listening and closes every connection; answers the address
    /// it listened on.
    pub async fn kill(mut self) -> SocketAddr {
        self.tasks.shutdown().await;
        let mut conns = std::mem::take(&mut *self.conns.lock().unwrap());
        conns.shutdown().await;
        self.addr
    }
}

fn respond(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
}

async fn answer(
    name: &'static str,
    mut request: Request<Incoming>,
    arrived: mpsc::UnboundedSender<()>,
    release: Arc<Semaphore>,
) -> Response<Full<Bytes>> {
    match request.uri().path() {
        "/slow" => {
            let _ = arrived.send(());
            let permit = release.acquire().await.expect("never closed");
            permit.forget();
            respond(StatusCode::OK, &format!("{name} slow"))
        }
        "/ws" => {
            let upgrade = hyper::upgrade::on(&mut request);
            tokio::spawn(async move {
                let Ok(upgraded) = upgrade.await else {
                    return;
                };
                let mut io = TokioIo::new(upgraded);
                let mut buf = [0u8; 1024];
                loop {
                    match io.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if io.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
            let mut response = respond(StatusCode::SWITCHING_PROTOCOLS, "");
            response
                .headers_mut()
                .insert("connection", "upgrade".parse().unwrap());
            response
                .headers_mut()
                .insert("upgrade", "websocket".parse().unwrap());
            response
        }
        _ => {
            let mut response = respond(StatusCode::OK, name);
            for (seen, header) in [
                ("x-seen-host", "host"),
                ("x-seen-forwarded-for", "x-forwarded-for"),
                ("x-seen-forwarded-proto", "x-forwarded-proto"),
            ] {
                if let Some(value) = request.headers().get(header) {
                    response.headers_mut().insert(seen, value.clone());
                }
            }
            response
        }
    }
}

/// A routes document for `prod` in `eu`.
pub fn document(generation: u64, backends: &[(&str, u32, &[SocketAddr])]) -> RoutesDocument {
    RoutesDocument {
        format: ROUTES_FORMAT,
        environment_id: "prod".into(),
        region: "eu".into(),
        generation,
        changed_at_ms: 1_700_000_000_000,
        backends: backends
            .iter()
            .map(|(id, weight, instances)| RouteBackend {
                deployment_id: id.to_string(),
                weight: *weight,
                instances: instances.iter().map(|a| a.to_string()).collect(),
            })
            .collect(),
    }
}

/// Writes `document` to `path`.
pub fn write_routes(path: &Path, document: &RoutesDocument) {
    std::fs::write(path, document.to_json()).expect("write the routes file");
}

/// A sentinel config for `prod` in `eu` over `source`, on free loopback
/// ports, with short probe and connect timings.
pub fn config(source: RoutesSource) -> Config {
    let mut config = Config::new("prod", "eu", source);
    config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.admin_addr = SocketAddr::from(([127, 0, 0, 1], 0));
    config.probe_interval = Duration::from_millis(50);
    config.connect_timeout = Duration::from_millis(500);
    config.request_timeout = Duration::from_secs(10);
    config.drain_grace = Duration::from_secs(10);
    config
}

/// An HTTP/1.1 client.
pub fn http1() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// An h2c (HTTP/2 over plain TCP, prior knowledge) client.
pub fn h2c() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// A GET of `http://addr{path}` on `client`: status, headers and body.
pub async fn get_with(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    path: &str,
) -> (StatusCode, hyper::HeaderMap, String) {
    let request = Request::get(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.request(request).await.expect("a response");
    let status = response.status();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

/// A GET over HTTP/1.1: status and body.
pub async fn get(addr: SocketAddr, path: &str) -> (StatusCode, String) {
    let (status, _, body) = get_with(&http1(), addr, path).await;
    (status, body)
}
