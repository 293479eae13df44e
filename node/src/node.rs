//! Starting a node: open the Raft log and the state machine under the data
//! directory, start openraft, initialise a single-node cluster on first
//! start, and serve QUIC.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use config::NodeConfig;
use openraft::BasicNode;
use tracing::{info, warn};

use crate::clock::{Clock, SystemClock};
use crate::jobs;
use crate::raft::Raft;
use crate::raft::log_store::LogStore;
use crate::raft::network::{self, Network};
use crate::raft::state_machine::StateMachine;
use crate::replica::{Limits, NodeState, write};
use crate::runtime::RaftRuntime;
use crate::server;
use transport::closing::Closed;

/// File names under the data directory.
pub const RAFT_LOG_FILE: &str = "raft-log.redb";
pub const STATE_FILE: &str = "state.redb";
pub const SNAPSHOT_DIR: &str = "snapshots";

/// A started node.
pub struct RunningNode {
    pub state: Arc<NodeState>,
    pub endpoint: quinn::Endpoint,
    pub local_addr: SocketAddr,
    /// Dropped to stop the node's background tasks (the leader jobs).
    stop_background: tokio::sync::watch::Sender<()>,
    /// Resolve once the Raft log's and the state machine's databases and
    /// the UDP socket are closed.
    released: [Closed; 3],
}

impl RunningNode {
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
            ..
        } = self;
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

/// Bound on waiting for connections to close when a node shuts down.
pub const SHUTDOWN_DRAIN_TIMEOUT_MS: u64 = 1_000;
/// Bound on waiting for the node's databases and socket to close when it
/// shuts down.
pub const SHUTDOWN_RELEASE_TIMEOUT_MS: u64 = 5_000;

/// Opens the node's stores and starts Raft and the QUIC server.
pub async fn start(config: &NodeConfig) -> Result<RunningNode> {
    start_with_clock(config, Arc::new(SystemClock)).await
}

pub async fn start_with_clock(config: &NodeConfig, clock: Arc<dyn Clock>) -> Result<RunningNode> {
    transport::tls::install_crypto_provider();
    let data_dir: PathBuf = config.data_dir.clone();
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("cannot create data directory {}", data_dir.display()))?;

    let log_path = data_dir.join(RAFT_LOG_FILE);
    let log_store = LogStore::open(&log_path)
        .with_context(|| format!("cannot open the Raft log {}", log_path.display()))?;
    let state_path = data_dir.join(STATE_FILE);
    let store = Arc::new(transport::closing::Tracked::new(
        storage::Store::open(&state_path)
            .with_context(|| format!("cannot open the state machine {}", state_path.display()))?,
    ));
    let (log_closed, store_closed) = (log_store.closed(), store.closed());
    let state_machine = StateMachine::new(store.clone(), &data_dir.join(SNAPSHOT_DIR))
        .context("cannot open the state machine")?;
    let applied_pk = state_machine.applied_pk();

    let tls_paths = transport::tls::TlsPaths {
        ca_cert: config.tls.ca_cert.clone(),
        cert: config.tls.cert.clone(),
        key: config.tls.key.clone(),
    };
    let server_config = transport::tls::server_config(
        &tls_paths,
        &[wire::agent::ALPN, wire::operator::ALPN, network::ALPN],
    )
    .context("cannot load the node's TLS files")?;
    let (endpoint, socket_closed) =
        transport::endpoint::server_endpoint(config.listen_addr, server_config)
            .with_context(|| format!("cannot listen on {}", config.listen_addr))?;
    let local_addr = endpoint.local_addr().context("endpoint address")?;
    let network = Network::new(
        endpoint.clone(),
        transport::tls::client_config(&tls_paths, network::ALPN)
            .context("cannot load the node's TLS files")?,
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
    .context("invalid Raft settings")?;
    let raft_runtime =
        RaftRuntime::start(config.node_id).context("cannot start the Raft thread")?;
    let raft = {
        let node_id = config.node_id;
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
            .context("the Raft thread stopped")?
            .context("cannot start Raft")?
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
    if config.peers.is_empty() && !raft.is_initialized().await.context("raft state")? {
        raft.initialize(configured_members.clone())
            .await
            .context("cannot initialise the single-node cluster")?;
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
        watch_permits: Arc::new(tokio::sync::Semaphore::new(limits.watch_streams_max)),
        limits,
        clock,
        raft_runtime,
    });
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
        stop_background,
        released: [log_closed, store_closed, socket_closed],
    })
}
