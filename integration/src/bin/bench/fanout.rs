//! `fan-out`: one node, fsync on, `--watchers` watch streams of one region
//! with the region's agent certificate, `--streams-per-connection` streams
//! on each QUIC connection (each connection from its own client endpoint,
//! i.e. its own UDP socket, as separate agents would have).
//! Then `--count` deploys, one at a time and 300 ms apart (like etcd's
//! `fanout_bench.py --interval 0.3`); for each, the time from its
//! acknowledgement to its event at every watcher.
//!
//! Figures: ack → event over every (deploy, watcher) pair; ack → last
//! watcher (all notified) and request → last watcher per deploy; and the
//! process's RSS growth per idle watch stream. Watchers and node share the
//! process, so that growth counts the client side of each stream too (its
//! QUIC stream state, its task and buffers) — an upper bound on the
//! node's share.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use integration::cluster::TestNode;
use integration::stats::Summary;
use transport::stream::FramedStream;
use wire::agent::{AgentRequest, WatchEvent, WatchRequest};
use wire::frame::FRAME_BYTES_MAX;
use wire::hello::Protocol;

use crate::common::{REGION, changed_deployment, deploy, print_value, vm_rss_kib};
use crate::print_summary;

const SCENARIO: &str = "fan-out";
/// Pause between the measured deploys.
const ROUND_INTERVAL: Duration = Duration::from_millis(300);
/// Bound on every watcher's full sync, and on one deploy reaching every
/// watcher.
const WATCHERS_TIMEOUT: Duration = Duration::from_secs(60);
/// Wait after the streams are open before reading the RSS (late
/// allocations, the allocator settling).
const SETTLE: Duration = Duration::from_secs(1);
/// Slowest deploys listed with their time.
const SLOWEST_SHOWN: usize = 8;
/// Most watch streams one run opens.
pub(crate) const WATCHERS_MAX: usize = 100_000;
/// Most streams per QUIC connection (the node's bidirectional stream
/// limit per connection is 1,024).
pub(crate) const STREAMS_PER_CONNECTION_MAX: usize = 1_000;

/// What a watcher task tells the scenario.
enum Signal {
    Synced,
    Event(Instant),
}

pub(crate) async fn fan_out(watchers: usize, rounds: usize, per_connection: usize) -> Result<()> {
    ensure!(
        (1..=WATCHERS_MAX).contains(&watchers),
        "--watchers must be in 1..={WATCHERS_MAX}"
    );
    ensure!(
        (1..=STREAMS_PER_CONNECTION_MAX).contains(&per_connection),
        "--streams-per-connection must be in 1..={STREAMS_PER_CONNECTION_MAX}"
    );
    let node = TestNode::start_with(|config| {
        config.limits.watch_streams_max = config.limits.watch_streams_max.max(watchers);
    })
    .await?;
    let client = node.client()?;
    deploy(&client).await?; // connects, warms the write path
    let rss_before = vm_rss_kib()?;

    let agent = integration::cluster::as_agent(&node.operator, REGION);
    transport::tls::install_crypto_provider();
    let tls = transport::tls::client_config(
        &transport::tls::TlsPaths {
            ca_cert: agent.tls.ca_cert.clone(),
            cert: agent.tls.cert.clone(),
            key: agent.tls.key.clone(),
        },
        wire::agent::ALPN,
    )?;
    let addr = node.node.local_addr;
    let connections = watchers.div_ceil(per_connection);
    let opened = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Signal)>();
    let mut tasks = tokio::task::JoinSet::new();
    let mut held = Vec::with_capacity(connections);
    for c in 0..connections {
        let endpoint =
            transport::endpoint::client_endpoint(transport::endpoint::client_bind_addr(addr))?;
        let (connection, _) = transport::endpoint::connect_any(
            &endpoint,
            &tls,
            &[addr],
            &agent.server_name,
            agent.request_timeout_ms,
        )
        .await?;
        for w in (c * per_connection)..((c + 1) * per_connection).min(watchers) {
            let mut stream =
                transport::stream::open_call(&connection, Protocol::Agent, FRAME_BYTES_MAX).await?;
            stream
                .send(&AgentRequest::Watch(WatchRequest {
                    region: REGION.to_string(),
                    cursor: 0,
                    epoch: 0,
                }))
                .await?;
            let tx = tx.clone();
            tasks.spawn(async move { watcher(w, stream, tx).await });
        }
        held.push((endpoint, connection));
    }
    drop(tx);
    let mut synced = 0_usize;
    let deadline = tokio::time::Instant::now() + WATCHERS_TIMEOUT;
    while synced < watchers {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some((_, Signal::Synced))) => synced += 1,
            Ok(Some((_, Signal::Event(_)))) => {}
            Ok(None) => bail!("every watcher ended"),
            Err(_) => bail!("{synced}/{watchers} watchers synced in {WATCHERS_TIMEOUT:?}"),
        }
    }
    let open_time = opened.elapsed();
    tokio::time::sleep(SETTLE).await;
    let rss_after = vm_rss_kib()?;
    let grown_kib = rss_after.saturating_sub(rss_before);
    print_value(
        SCENARIO,
        "rss_per_idle_watch_stream_kib",
        serde_json::json!((grown_kib as f64 / watchers as f64 * 100.0).round() / 100.0),
        serde_json::json!({
            "watchers": watchers,
            "connections": connections,
            "rss_mib_before": rss_before / 1024,
            "rss_mib_after": rss_after / 1024,
            "includes": "server and in-process client side of each stream",
            "open_and_sync_all_ms": open_time.as_millis(),
        }),
    );

    let mut per_watcher = Vec::with_capacity(watchers * rounds);
    let mut to_all = Vec::with_capacity(rounds);
    // (ms since the streams were opened, ack → all notified in µs) per
    // deploy: periodic stalls show up as evenly spaced slow rounds.
    let mut timeline: Vec<(u128, u128)> = Vec::with_capacity(rounds);
    let mut request_to_all = Vec::with_capacity(rounds);
    let mut before_ack = 0_usize;
    for _ in 0..rounds {
        tokio::time::sleep(ROUND_INTERVAL).await;
        let sent = Instant::now();
        deploy(&client).await?;
        let acked = Instant::now();
        let mut got = vec![false; watchers];
        let mut count = 0_usize;
        let mut last = acked;
        let deadline = tokio::time::Instant::now() + WATCHERS_TIMEOUT;
        while count < watchers {
            let (w, at) = match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some((w, Signal::Event(at)))) => (w, at),
                Ok(Some((_, Signal::Synced))) => continue,
                Ok(None) => bail!("every watcher ended"),
                Err(_) => bail!("{count}/{watchers} watchers notified in {WATCHERS_TIMEOUT:?}"),
            };
            ensure!(!got[w], "watcher {w} got two events for one deploy");
            got[w] = true;
            count += 1;
            if at < acked {
                before_ack += 1;
            }
            last = last.max(at);
            per_watcher.push(at.saturating_duration_since(acked));
        }
        to_all.push(last.saturating_duration_since(acked));
        timeline.push((
            acked.saturating_duration_since(opened).as_millis(),
            last.saturating_duration_since(acked).as_micros(),
        ));
        request_to_all.push(last.saturating_duration_since(sent));
    }
    let extra = serde_json::json!({
        "watchers": watchers,
        "connections": connections,
        "deploys": rounds,
        "events_before_ack": before_ack,
    });
    for (figure, samples) in [
        ("ack_to_event_per_watcher", &mut per_watcher),
        ("ack_to_all_notified", &mut to_all),
        ("request_to_all_notified", &mut request_to_all),
    ] {
        let s = Summary::of(samples).context("no deploys measured")?;
        print_summary(SCENARIO, figure, &s, extra.clone());
    }
    timeline.sort_by_key(|(_, us)| std::cmp::Reverse(*us));
    timeline.truncate(SLOWEST_SHOWN);
    timeline.sort();
    print_value(
        SCENARIO,
        "slowest_deploys_ms_since_open_and_us",
        serde_json::json!(timeline),
        serde_json::json!({"watchers": watchers}),
    );
    tasks.abort_all();
    drop(held);
    node.node.shutdown().await;
    Ok(())
}

/// Reads one watch stream: `Synced` at its `SyncEnd`, then `Event` at each
/// deployment change. Ends with the stream.
async fn watcher(
    index: usize,
    mut stream: FramedStream,
    tx: tokio::sync::mpsc::UnboundedSender<(usize, Signal)>,
) {
    while let Ok(Some(event)) = stream.recv::<WatchEvent>().await {
        let signal = match &event {
            WatchEvent::SyncEnd { .. } => Signal::Synced,
            WatchEvent::Error(e) => {
                tracing::warn!("watcher {index}: {e}");
                return;
            }
            event if changed_deployment(event).is_some() => Signal::Event(Instant::now()),
            _ => continue,
        };
        if tx.send((index, signal)).is_err() {
            return;
        }
    }
}
