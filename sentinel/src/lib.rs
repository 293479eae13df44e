//! The sentinel: one environment's HTTP reverse proxy in one region. It
//! sends every request on its port (8040; HTTP/1.1 and h2c) to a ready
//! instance of the environment's live deployment(s), as the routes
//! document krane writes into the sentinel's routes ConfigMap says
//! (`wire::routes`), and swaps its route table without restarting when
//! that document changes.
//!
//! Modules, lowest first: [`table`] (the pure route table: weighted
//! choice, round robin, ejection, readiness), [`store`] (the last good
//! document in the state directory), [`metrics`], [`drain`] (the shutdown
//! sequence's signals), [`routes`] (the table shared, and the one way a
//! document gets in), [`source`] (the ConfigMap watch, or a file),
//! [`probe`] (puts ejected instances back), [`served`] (tells krane the
//! generation served), [`proxy`] (the main
//! listener and forwarding), [`admin`] (`/livez`, `/readyz`, `/metrics`),
//! [`config`] (flags). [`start`] wires them; [`run`] runs until a
//! shutdown future resolves, then drains.

#![forbid(unsafe_code)]

pub mod admin;
pub mod config;
pub mod drain;
pub mod metrics;
pub mod probe;
pub mod proxy;
pub mod routes;
pub mod served;
pub mod source;
pub mod store;
pub mod table;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::info;

pub use crate::config::{Config, Flags, LogFormat, RoutesSource};
use crate::drain::Drain;
use crate::metrics::Metrics;
use crate::proxy::{Proxy, ProxySettings};
use crate::routes::{Offered, Routes};
use crate::source::{ReloadError, Reloader};
use crate::store::Store;

/// The sentinel could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A listener could not be bound.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// Which listener ("proxy", "admin").
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The system's error.
        source: io::Error,
    },
}

/// Tasks aborted when dropped.
#[derive(Debug, Default)]
struct Tasks(Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// A started sentinel. Dropping it stops everything at once (no drain);
/// [`Running::shutdown`] drains.
#[derive(Debug)]
pub struct Running {
    addr: SocketAddr,
    admin_addr: SocketAddr,
    routes: Arc<Routes>,
    drain: Drain,
    reloader: Option<Reloader>,
    proxy: Option<JoinHandle<()>>,
    /// The source, the prober and the admin listener, stopped with this.
    _background: Tasks,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.drain.begin();
        self.drain.cut();
        if let Some(proxy) = &self.proxy {
            proxy.abort();
        }
    }
}

impl Running {
    /// The proxy's bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin listener's bound address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The routes served (the table, its metrics).
    pub fn routes(&self) -> &Arc<Routes> {
        &self.routes
    }

    /// Reads the routes file again, as SIGHUP does, and answers what
    /// became of its document.
    pub async fn reload(&self) -> Result<Offered, ReloadError> {
        match &self.reloader {
            Some(reloader) => reloader.reload().await,
            None => Err(ReloadError::NoFileSource),
        }
    }

    /// Starts draining: readiness false at once, no new connection.
    pub fn begin_drain(&self) {
        self.drain.begin();
    }

    /// Resolves once the main listener is closed.
    pub async fn listener_closed(&self) {
        self.drain.closed().await;
    }

    /// Drains: readiness false, the listener closed, in-flight requests
    /// finished within the drain grace (the rest cut), then everything
    /// stopped.
    pub async fn shutdown(mut self) {
        self.drain.begin();
        if let Some(proxy) = self.proxy.take() {
            let _ = proxy.await;
        }
        info!("sentinel stopped");
    }
}

/// Starts a sentinel: the stored routes loaded, both listeners bound, the
/// routes source, the prober, the admin listener and the proxy running.
/// With a routes file, its first read is done when this returns.
pub async fn start(config: Config) -> Result<Running, Error> {
    let metrics = Arc::new(Metrics::new());
    let store = config.state_dir.as_deref().map(Store::new);
    let routes = Arc::new(Routes::new(
        &config.environment_id,
        &config.region,
        metrics,
        store,
    ));
    routes.load_stored().await;
    let bind = |what: &'static str, addr: SocketAddr| async move {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { what, addr, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| Error::Bind { what, addr, source })?;
        Ok::<_, Error>((listener, bound))
    };
    let (listener, addr) = bind("proxy", config.listen).await?;
    let (admin_listener, admin_addr) = bind("admin", config.admin_addr).await?;
    let drain = Drain::new();
    let mut background = Tasks::default();
    let reloader = match &config.source {
        RoutesSource::File(path) => {
            // A file that cannot be read or is refused is logged and
            // counted; the stored routes (if any) keep serving.
            let _ = source::read_file(path, &routes).await;
            let (reloader, task) = source::file_source(path.clone(), Arc::clone(&routes));
            background.0.push(tokio::spawn(task));
            Some(reloader)
        }
        RoutesSource::ConfigMap {
            namespace,
            name,
            kubeconfig,
        } => {
            background.0.push(tokio::spawn(source::watch_configmap(
                namespace.clone(),
                name.clone(),
                kubeconfig.clone(),
                Arc::clone(&routes),
            )));
            if let Some(target) = &config.served {
                background.0.push(tokio::spawn(served::report(
                    target.clone(),
                    kubeconfig.clone(),
                    Arc::clone(&routes),
                    Arc::new(wire::clock::SystemClock),
                )));
            }
            None
        }
    };
    background.0.push(tokio::spawn(probe::run(
        Arc::clone(&routes),
        config.probe_interval,
        config.connect_timeout,
    )));
    background.0.push(tokio::spawn(admin::serve(
        admin_listener,
        Arc::clone(&routes),
        drain.clone(),
    )));
    let proxy = Arc::new(Proxy::new(
        Arc::clone(&routes),
        ProxySettings {
            connect_timeout: config.connect_timeout,
            request_timeout: config.request_timeout,
            retries: config.retries,
            connections_max: config.connections_max,
            drain_grace: config.drain_grace,
        },
        drain.clone(),
    ));
    let proxy = tokio::spawn(proxy.serve(listener));
    info!(
        environment = %config.environment_id,
        region = %config.region,
        generation = ?routes.generation(),
        "sentinel started"
    );
    Ok(Running {
        addr,
        admin_addr,
        routes,
        drain,
        reloader,
        proxy: Some(proxy),
        _background: background,
    })
}

/// Runs a sentinel until `shutdown` resolves, then drains and returns.
/// Prints `sentinel listening on ADDR (admin ADDR)` on stdout once both
/// listeners are bound (the bound ports, also for port 0).
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    let running = start(config).await?;
    println!(
        "sentinel listening on {} (admin {})",
        running.addr(),
        running.admin_addr()
    );
    shutdown.await;
    info!("shutdown asked: draining");
    running.shutdown().await;
    Ok(())
}
