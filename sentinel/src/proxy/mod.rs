//! The proxy: the main listener (HTTP/1.1 and h2c on one port, through
//! hyper-util's `auto` builder) and the forwarding of each request to an
//! instance the route table picks (`forward`), over the pooled upstream
//! connections of `pool`.
//!
//! The accept loop holds at most `connections_max` connections (more
//! wait in the listen backlog), and every connection is watched
//! (`watch`): when draining begins the listener is
//! closed, each connection finishes its in-flight requests and closes,
//! and whatever runs past the drain grace is cut.

mod body;
mod codec;
mod conn;
mod exchange;
mod forward;
mod headers;
mod pool;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::{debug, info, warn};

use crate::drain::Drain;
use crate::routes::Routes;

pub use forward::HEALTH_PATH;

/// Longest wait for a request's head on a client connection (slow
/// clients hold a connection slot no longer).
const HEADER_READ_TIMEOUT_MS: u64 = 30_000;
/// Most concurrent HTTP/2 streams per client connection.
const H2_STREAMS_MAX: u32 = 256;
/// Wait after a failed accept (out of file descriptors, say).
const ACCEPT_ERROR_PAUSE_MS: u64 = 100;

/// What the proxy forwards with.
#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// Upstream connect timeout.
    pub connect_timeout: Duration,
    /// Time for an upstream's response head.
    pub request_timeout: Duration,
    /// Retries on another instance after a failed connection.
    pub retries: u32,
    /// Most client connections at once.
    pub connections_max: usize,
    /// Time in-flight requests get when draining.
    pub drain_grace: Duration,
}

/// The proxy's shared state.
#[derive(Debug)]
pub struct Proxy {
    routes: Arc<Routes>,
    pool: Arc<pool::Pool>,
    settings: ProxySettings,
    drain: Drain,
}

impl Proxy {
    /// A proxy over `routes`.
    pub fn new(routes: Arc<Routes>, settings: ProxySettings, drain: Drain) -> Self {
        Proxy {
            routes,
            pool: Arc::new(pool::Pool::new(settings.connect_timeout)),
            settings,
            drain,
        }
    }

    /// Serves `listener` until draining begins, then drains: waits for
    /// the connections (and upgraded tunnels) to finish within the drain
    /// grace, and cuts what is left.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        self.pool.spawn_sweeper();
        let connections = Arc::new(watch::Connections::default());
        {
            // Its own task: it outlives this one when this one is aborted.
            let connections = Arc::clone(&connections);
            let drain = self.drain.clone();
            tokio::spawn(async move {
                drain.draining().await;
                connections.drain();
                drain.cut_signal().await;
                connections.cut();
            });
        }
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_millis(HEADER_READ_TIMEOUT_MS));
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(H2_STREAMS_MAX);
        let slots = Arc::new(Semaphore::new(self.settings.connections_max));
        loop {
            let permit = tokio::select! {
                permit = Arc::clone(&slots).acquire_owned() => match permit {
                    Ok(permit) => permit,
                    // The semaphore is never closed.
                    Err(_) => break,
                },
                () = self.drain.draining() => break,
            };
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = self.drain.draining() => break,
            };
            let (stream, remote) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_PAUSE_MS)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let proxy = Arc::clone(&self);
            // The client's `x-forwarded-for` entry, made once per connection.
            let forwarded_for = headers::forwarded_for(remote.ip());
            let service = service_fn(move |request| {
                let proxy = Arc::clone(&proxy);
                let forwarded_for = forwarded_for.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(proxy.handle(request, &forwarded_for).await)
                }
            });
            let connection = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .into_owned();
            let connection = connections.watch(connection);
            tokio::spawn(async move {
                match connection.await {
                    watch::Ended::Closed(Ok(())) => {}
                    watch::Ended::Closed(Err(e)) => {
                        debug!(%remote, "client connection ended: {e}");
                    }
                    watch::Ended::Cut => {
                        warn!(%remote, "client connection cut: the drain grace is over");
                    }
                }
                drop(permit);
            });
        }
        drop(listener);
        self.drain.listener_closed();
        // Told here too: this loop may have seen the drain first.
        connections.drain();
        let open = connections.open();
        info!(
            connections = open,
            tunnels = self.drain.tunnels(),
            "draining: no new connections; waiting for in-flight requests"
        );
        let drained = tokio::time::timeout(self.settings.drain_grace, async {
            connections.closed().await;
            self.drain.tunnels_closed().await;
        })
        .await;
        match drained {
            Ok(()) => info!("drained: every connection finished"),
            Err(_) => {
                warn!(
                    tunnels = self.drain.tunnels(),
                    "drain grace of {} ms over: cutting what still runs",
                    self.settings.drain_grace.as_millis()
                );
                self.drain.cut();
                connections.cut();
            }
        }
    }

    /// The routes served.
    pub fn routes(&self) -> &Arc<Routes> {
        &self.routes
    }
}
