//! The composition root: starting a node wires everything together — open
//! the Raft log and the state machine under the data directory, start
//! openraft on its own thread ([`crate::runtime`]), initialise a
//! single-node cluster on first start, serve QUIC ([`crate::server`]) and
//! supervise the leader jobs ([`crate::jobs`]). Nothing else in the crate
//! imports this module; [`RunningNode`] is what the binary and the tests
//! hold.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use config::NodeConfig;
use openraft::BasicNode;
use tracing::{info, warn};

use crate::clock::{Clock, SystemClock};
use crate::jobs;
use crate::metrics::{self, Metrics};
use crate::raft::log_store::LogStore;
use crate::raft::network::{self, Network};
use crate::raft::purge_bound::PurgeBound;
use crate::raft::state_machine::StateMachine;
use crate::raft::{NodeId, Raft};
use crate::replica::{FatalError, Limits, NodeState, write};
use crate::runtime::RaftRuntime;
use crate::server;
use transport::closing::Closed;
use transport::http::{HttpServer, Probe};
use transport::reload::ReloadingTls;

/// File names under the data directory.
pub const RAFT_LOG_FILE: &str = "raft-log.redb";
/// The replicated state (redb) under the data directory.
pub const STATE_FILE: &str = "state.redb";
/// The directory of Raft snapshots under the data directory.
pub const SNAPSHOT_DIR: &str = "snapshots";

/// A started node.
pub struct RunningNode {
    /// What the request handlers share (Raft, store, limits, clock).
    pub state: Arc<NodeState>,
    /// The QUIC endpoint the node listens and dials on.
    pub endpoint: quinn::Endpoint,
    /// The address the endpoint is bound to (the real port if 0 was asked).
    pub local_addr: SocketAddr,
    /// The address the metrics and health listener is bound to, when
    /// `metrics_addr` is set (the real port if 0 was asked).
    pub metrics_addr: Option<SocketAddr>,
    /// The metrics and health listener; dropped (stopped) first on
    /// shutdown.
    metrics_server: Option<HttpServer>,
    /// Dropped to stop the node's background tasks (the leader jobs).
    stop_background: tokio::sync::watch::Sender<()>,
    /// Resolve once the Raft log's and the state machine's databases and
    /// the UDP socket are closed.
    released: [Closed; 3],
}

impl RunningNode {
    /// Resolves once Raft has stopped on a fatal error (see
    /// [`NodeState::fatal`]): the node no longer applies anything, so its
    /// owner must stop it (`ctrl serve` exits non-zero). Never resolves for
    /// a node that is shut down.
    pub fn fatal(&self) -> impl Future<Output = FatalError> + Send + 'static {
        self.state.fatal()
    }

    /// Stops serving, shuts Raft down, and returns once the node's
    /// databases and UDP socket are closed, so the node can start again at
    /// once in the same process. Returns whether they were closed within
    /// [`SHUTDOWN_RELEASE_TIMEOUT_MS`] (a warning says so if not: a task
    /// still holds the node).
    pub async fn shutdown(self) -> bool {
        let RunningNode {
            state,
            endpoint,
            stop_background,
            released,
            metrics_server,
            ..
        } = self;
        if let Some(server) = metrics_server {
            server.stop().await;
        }
        let node_id = state.node_id;
        endpoint.close(0u32.into(), b"shutting down");
        drop(stop_background);
        let _ = state.raft.shutdown().await;
        // The last holder of the node's state stops its Raft thread; the
        // log writer ends once nothing can queue for it.
        drop(state);
        // Peers that are gone never confirm the close; their connections
        // would hold the endpoint until the idle timeout.
        let drain = Duration::from_millis(SHUTDOWN_DRAIN_TIMEOUT_MS);
        let _ = tokio::time::timeout(drain, endpoint.wait_idle()).await;
        drop(endpoint);
        let bound = Duration::from_millis(SHUTDOWN_RELEASE_TIMEOUT_MS);
        let [log, store, socket] = released;
        let closed = async { tokio::join!(log.wait(), store.wait(), socket.wait()) };
        let released = tokio::time::timeout(bound, closed).await.is_ok();
        if !released {
            warn!(
                node_id,
                "the node's databases or UDP socket are still open \
                 {SHUTDOWN_RELEASE_TIMEOUT_MS} ms after shutdown; starting it again in this \
                 process may fail"
            );
        }
        released
    }
}

/// Why a node did not start; each names the file, address or setting at
/// fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The data directory could not be created.
    #[error("cannot create the data directory {} (data_dir): {source}", path.display())]
    DataDir {
        /// The directory (`data_dir`).
        path: PathBuf,
        /// Why creating it failed.
        #[source]
        source: std::io::Error,
    },
    /// The Raft log file could not be opened.
    #[error("cannot open the Raft log {}: {source}", path.display())]
    RaftLog {
        /// The log file.
        path: PathBuf,
        /// Why opening it failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The state file could not be opened.
    #[error("cannot open the state file {}: {source}", path.display())]
    StateFile {
        /// The state file.
        path: PathBuf,
        /// Why opening it failed.
        #[source]
        source: storage::StorageError,
    },
    #[error(
        "cannot open the state machine over {} with snapshots in {}: {source}",
        path.display(),
        snapshot_dir.display()
    )]
    /// The Raft state machine could not be built over the state file.
    StateMachine {
        /// The state file.
        path: PathBuf,
        /// The snapshot directory.
        snapshot_dir: PathBuf,
        /// openraft's storage error.
        #[source]
        source: openraft::StorageError<NodeId>,
    },
    #[error(
        "cannot load the node's TLS files (tls.ca_cert {}, tls.cert {}, tls.key {}): {source}",
        paths.ca_cert.display(),
        paths.cert.display(),
        paths.key.display()
    )]
    /// The node's TLS files could not be loaded.
    Tls {
        /// The CA, certificate and key files tried.
        paths: transport::tls::TlsPaths,
        /// Why loading them failed.
        #[source]
        source: transport::TransportError,
    },
    /// The secrets key file could not be loaded.
    #[error("cannot load the secrets key file (secrets_key): {0}")]
    SecretsKey(#[source] transport::sealing::SealError),
    /// The revoked certificates could not be read from the state file.
    #[error("cannot read the revoked certificates from the state: {0}")]
    Revocations(String),
    /// The QUIC endpoint could not be opened on the listen address.
    #[error("cannot listen on {addr} (listen_addr): {source}")]
    Listen {
        /// The configured `listen_addr`.
        addr: SocketAddr,
        /// Why it failed.
        #[source]
        source: transport::TransportError,
    },
    /// The bound endpoint could not report its address.
    #[error("cannot read the address the endpoint for {addr} is bound to: {source}")]
    LocalAddr {
        /// The configured `listen_addr`.
        addr: SocketAddr,
        /// Why the query failed.
        #[source]
        source: std::io::Error,
    },
    /// The metrics and health listener could not bind `metrics_addr`.
    #[error("cannot listen on {addr} (metrics_addr): {source}")]
    Metrics {
        /// The configured `metrics_addr`.
        addr: SocketAddr,
        /// Why binding failed.
        #[source]
        source: std::io::Error,
    },
    /// The `[raft]` settings do not make a valid openraft config.
    #[error("invalid [raft] settings: {0}")]
    RaftSettings(#[source] openraft::ConfigError),
    /// The thread Raft runs on could not be spawned.
    #[error("cannot start the Raft thread of node {node_id}: {source}")]
    RaftThread {
        /// This node's id.
        node_id: NodeId,
        /// Why spawning failed.
        #[source]
        source: std::io::Error,
    },
    /// The Raft thread stopped before Raft started.
    #[error("the Raft thread of node {node_id} stopped while Raft was starting")]
    RaftThreadStopped {
        /// This node's id.
        node_id: NodeId,
    },
    /// Raft itself failed to start.
    #[error("cannot start Raft on node {node_id}: {source}")]
    Raft {
        /// This node's id.
        node_id: NodeId,
        /// openraft's fatal error.
        #[source]
        source: openraft::error::Fatal<NodeId>,
    },
    /// A single-node cluster could not be initialised.
    #[error("cannot initialise the single-node cluster of node {node_id} (no peers): {reason}")]
    Initialize {
        /// This node's id.
        node_id: NodeId,
        /// Why openraft refused.
        reason: String,
    },
}

/// Bound on waiting for connections to close when a node shuts down.
pub const SHUTDOWN_DRAIN_TIMEOUT_MS: u64 = 1_000;
/// Bound on waiting for the node's databases and socket to close when it
/// shuts down.
pub const SHUTDOWN_RELEASE_TIMEOUT_MS: u64 = 5_000;

/// Opens the node's stores and starts Raft and the QUIC server.
pub async fn start(config: &NodeConfig) -> Result<RunningNode, StartError> {
    start_with_clock(config, Arc::new(SystemClock)).await
}

/// [`start`], with the time and randomness of `clock`.
pub async fn start_with_clock(
    config: &NodeConfig,
    clock: Arc<dyn Clock>,
) -> Result<RunningNode, StartError> {
    transport::tls::install_crypto_provider();
    let data_dir: PathBuf = config.data_dir.clone();
    std::fs::create_dir_all(&data_dir).map_err(|source| StartError::DataDir {
        path: data_dir.clone(),
        source,
    })?;

    let log_path = data_dir.join(RAFT_LOG_FILE);
    // The log is purged no further than the snapshot the state machine has
    // on disk.
    let purge_bound = PurgeBound::default();
    let log_store =
        LogStore::open(&log_path, purge_bound.clone()).map_err(|e| StartError::RaftLog {
            path: log_path.clone(),
            source: e.into(),
        })?;
    let state_path = data_dir.join(STATE_FILE);
    let store = Arc::new(transport::closing::Tracked::new(
        storage::Store::open(&state_path).map_err(|source| StartError::StateFile {
            path: state_path.clone(),
            source,
        })?,
    ));
    let (log_closed, store_closed) = (log_store.closed(), store.closed());
    let snapshot_dir = data_dir.join(SNAPSHOT_DIR);
    let state_machine =
        StateMachine::new(store.clone(), &snapshot_dir, purge_bound).map_err(|source| {
            StartError::StateMachine {
                path: state_path.clone(),
                snapshot_dir: snapshot_dir.clone(),
                source,
            }
        })?;
    let tls_paths = transport::tls::TlsPaths {
        ca_cert: config.tls.ca_cert.clone(),
        cert: config.tls.cert.clone(),
        key: config.tls.key.clone(),
    };
    let tls_error = |source| StartError::Tls {
        paths: tls_paths.clone(),
        source,
    };
    let tls = ReloadingTls::load(&tls_paths, "node").map_err(tls_error)?;
    let metrics = Arc::new(Metrics::new(
        log_store.committed_index(),
        state_path.clone(),
        log_path.clone(),
        config.raft.election_timeout_max_ms,
        tls.clone(),
        log_store.stats(),
        state_machine.stats(),
    ));
    let applied_pk = state_machine.applied_pk();
    let wake = state_machine.wake();
    // Stamped time never goes backwards, nor below the last applied time.
    let clock: Arc<dyn Clock> = Arc::new(crate::clock::StampClock::new(
        clock,
        state_machine.applied_stamp_ms(),
    ));

    // Every handshake, served or dialled, uses the material `tls` holds
    // now: a reload (see `transport::reload`) reaches new connections of
    // the server, the Raft network and forwarding alike.
    let server_config = tls
        .server_config(&[wire::agent::ALPN, wire::operator::ALPN, network::ALPN])
        .map_err(tls_error)?;
    let keyring = match &config.secrets_key {
        Some(path) => Some(Arc::new(
            transport::sealing::Keyring::load(path).map_err(StartError::SecretsKey)?,
        )),
        None => None,
    };
    let (endpoint, socket_closed) =
        transport::endpoint::server_endpoint(config.listen_addr, server_config).map_err(
            |source| StartError::Listen {
                addr: config.listen_addr,
                source,
            },
        )?;
    let local_addr = endpoint
        .local_addr()
        .map_err(|source| StartError::LocalAddr {
            addr: config.listen_addr,
            source,
        })?;
    let network = Network::new(
        endpoint.clone(),
        tls.client_config(network::ALPN).map_err(tls_error)?,
        config::tls::DEFAULT_SERVER_NAME.to_string(),
        config.limits.frame_bytes_max,
    );

    let raft_config = openraft::Config {
        cluster_name: "ctrl".into(),
        heartbeat_interval: config.raft.heartbeat_interval_ms,
        election_timeout_min: config.raft.election_timeout_min_ms,
        election_timeout_max: config.raft.election_timeout_max_ms,
        max_payload_entries: config.raft.max_payload_entries,
        snapshot_max_chunk_size: network::SNAPSHOT_CHUNK_BYTES,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(
            config.raft.snapshot_logs_since_last,
        ),
        max_in_snapshot_log_to_keep: config.raft.logs_kept_after_snapshot,
        ..Default::default()
    }
    .validate()
    .map_err(StartError::RaftSettings)?;
    let node_id = config.node_id;
    let raft_runtime =
        RaftRuntime::start(node_id).map_err(|source| StartError::RaftThread { node_id, source })?;
    let raft = {
        let network = network.clone();
        raft_runtime
            .handle()
            .spawn(async move {
                Raft::new(
                    node_id,
                    Arc::new(raft_config),
                    network,
                    log_store,
                    state_machine,
                )
                .await
            })
            .await
            .map_err(|_| StartError::RaftThreadStopped { node_id })?
            .map_err(|source| StartError::Raft { node_id, source })?
    };

    let advertise = config.advertise_addr.unwrap_or(local_addr);
    let mut configured_members = BTreeMap::from([(
        config.node_id,
        BasicNode {
            addr: advertise.to_string(),
        },
    )]);
    for peer in &config.peers {
        configured_members.insert(
            peer.node_id,
            BasicNode {
                addr: peer.addr.to_string(),
            },
        );
    }
    let initialize_error = |reason: String| StartError::Initialize { node_id, reason };
    let initialized = raft.is_initialized().await;
    if config.peers.is_empty() && !initialized.map_err(|e| initialize_error(e.to_string()))? {
        raft.initialize(configured_members.clone())
            .await
            .map_err(|e| initialize_error(e.to_string()))?;
        info!(
            node_id = config.node_id,
            "initialised a single-node cluster"
        );
    }

    let limits = Limits {
        frame_bytes_max: config.limits.frame_bytes_max,
        watch_catch_up_wait_ms: config.limits.watch_catch_up_wait_ms,
        progress_interval_ms: config.watch.progress_interval_ms,
        sync_page_resources: config.watch.sync_page_resources,
        request_timeout_ms: config.limits.request_timeout_ms,
        watch_streams_max: config.limits.watch_streams_max,
        slow_consumer_timeout_ms: config.limits.slow_consumer_timeout_ms,
    };
    let batcher = write::batch::Batcher::start(
        raft.clone(),
        clock.clone(),
        write::batch::batch_bytes_max(config.limits.frame_bytes_max),
    );
    let state = Arc::new(NodeState {
        node_id: config.node_id,
        raft,
        batcher,
        configured_members,
        network,
        store,
        applied_pk,
        wake,
        watch_permits: Arc::new(tokio::sync::Semaphore::new(limits.watch_streams_max)),
        limits,
        deploy: config.deploy.clone(),
        clock,
        raft_runtime,
        metrics: metrics.clone(),
        keyring,
        revocations: Arc::new(crate::app::revocations::RevocationList::default()),
        // Paths only: a node config names its certificate and key files,
        // never their contents.
        config_toml: toml::to_string(config).unwrap_or_else(|e| format!("# not encodable: {e}\n")),
    });
    tokio::spawn(metrics::follow_leader(state.raft.server_metrics(), metrics));
    // Loaded before the server accepts a connection, then kept in step.
    state
        .revocations
        .reload(&*state)
        .map_err(|e| StartError::Revocations(e.message))?;
    tokio::spawn(crate::app::revocations::follow(
        Arc::downgrade(&state),
        state.revocations.clone(),
    ));
    // Ends once the node is gone (it holds `tls` weakly).
    tokio::spawn(ReloadingTls::watch(
        Arc::downgrade(&tls),
        Duration::from_millis(config.tls.reload_interval_ms),
    ));
    drop(tls);
    let metrics_server = match config.metrics_addr {
        Some(addr) => Some(
            HttpServer::start(addr, Arc::new(NodeProbe(state.clone())))
                .await
                .map_err(|source| StartError::Metrics { addr, source })?,
        ),
        None => None,
    };
    let metrics_addr = metrics_server.as_ref().map(HttpServer::local_addr);
    tokio::spawn(server::run(endpoint.clone(), state.clone()));
    let (stop_background, background_stopped) = tokio::sync::watch::channel(());
    let leader_jobs = jobs::leader_jobs(&state, config);
    tokio::spawn(jobs::supervise_raft(
        state.clone(),
        leader_jobs,
        background_stopped,
    ));
    info!(node_id = config.node_id, addr = %local_addr, "serving");
    Ok(RunningNode {
        state,
        endpoint,
        local_addr,
        metrics_addr,
        metrics_server,
        stop_background,
        released: [log_closed, store_closed, socket_closed],
    })
}

/// The node's answers on `metrics_addr`.
struct NodeProbe(Arc<NodeState>);

impl Probe for NodeProbe {
    fn metrics(&self) -> String {
        self.0.metrics_text()
    }

    fn ready(&self) -> Result<(), String> {
        self.0.metrics.ready(&self.0.raft.metrics().borrow())
    }
}
