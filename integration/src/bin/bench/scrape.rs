//! `scrape`: the CPU one scrape of `/metrics` costs a node holding
//! `--resources` deployments (default 10,000) with `--watchers` watch
//! streams open (default 1,000).
//!
//! Three nodes, each its own process (this binary's `serve-node`); node 1
//! is scraped and watched, and its CPU read from /proc apart from the
//! bench's. Deployments are created 64 at a
//! time; the leader's workflow starts them (no agent runs, so they stay
//! deploying). The watch streams watch a region with nothing deployed, so
//! they cost no full sync and no events; the node counts them all the same.
//! The node's background CPU (Raft heartbeats, the streams' keep-alives,
//! workflow rounds) is measured over an idle window before each burst of
//! scrapes and subtracted: figure = (burst CPU − idle rate × burst time) /
//! scrapes, the median of `--count` rounds (default 5).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt;
use integration::processes::ProcessCluster;
use integration::scrape::{free_tcp_addr, gauge, get};
use integration::stats::Summary;
use node::client::Client;
use wire::agent::{AgentRequest, WatchEvent, WatchRequest};
use wire::frame::FRAME_BYTES_MAX;
use wire::hello::Protocol;

use crate::common::{REGION, cpu_seconds, deploy, print_value};
use crate::print_summary;

const SCENARIO: &str = "scrape";
/// Nodes of the cluster, as at a site.
const NODES: u64 = 3;
/// The node scraped, whose CPU is measured (node 1: `pids()[0]`).
const SCRAPED: u64 = 1;
/// The region the watch streams watch: nothing is deployed there.
const WATCHED_REGION: &str = "eu-west";
/// Creates in flight while the deployments are made.
const CREATES_IN_FLIGHT: usize = 64;
/// Streams per QUIC connection of the watchers.
const STREAMS_PER_CONNECTION: usize = 250;
/// Scrapes per measured burst.
const SCRAPES_PER_BURST: usize = 200;
/// The idle window measured before each burst.
const IDLE_WINDOW: Duration = Duration::from_secs(2);
/// Bound on the deployments being created and started.
const LOAD_TIMEOUT: Duration = Duration::from_secs(300);
/// Bound on every watch stream answering its (empty) full sync.
const WATCHERS_TIMEOUT: Duration = Duration::from_secs(60);
/// Most deployments one run creates.
pub(crate) const RESOURCES_MAX: usize = 100_000;

pub(crate) async fn scrape(deployments: usize, watchers: usize, rounds: usize) -> Result<()> {
    ensure!(
        (1..=RESOURCES_MAX).contains(&deployments),
        "--resources must be in 1..={RESOURCES_MAX}"
    );
    ensure!(
        (1..=crate::fanout::WATCHERS_MAX).contains(&watchers),
        "--watchers must be in 1..={}",
        crate::fanout::WATCHERS_MAX
    );
    let metrics_addr = free_tcp_addr()?;
    let exe = std::env::current_exe().context("cannot find the bench binary")?;
    let cluster = ProcessCluster::start_with(NODES, &exe, &["serve-node"], |config| {
        if config.node_id == SCRAPED {
            config.metrics_addr = Some(metrics_addr);
        }
        config.limits.watch_streams_max = config.limits.watch_streams_max.max(watchers);
    })
    .await?;
    let pid = cluster.pids()[0].context("the node exited")?;
    let client = Client::new(&cluster.operator)?;

    let loaded = Instant::now();
    let created = tokio::time::timeout(LOAD_TIMEOUT, create(&client, deployments))
        .await
        .context("the deployments were not created in time")??;
    // Their workflow starts them (topologies written); wait until it has,
    // so its work is not measured as the scrape's.
    let started = tokio::time::timeout(LOAD_TIMEOUT, async {
        loop {
            let text = get(metrics_addr, "/metrics").await?;
            if gauge(&text, "deployment_workflow_status{status=\"pending\"}") == Some(0.0) {
                return anyhow::Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .context("the workflow did not start every deployment in time")?;
    started?;
    let load_ms = loaded.elapsed().as_millis();

    let held = open_watchers(&cluster, watchers).await?;
    let body = get(metrics_addr, "/metrics").await?;
    let open = gauge(
        &body,
        &format!("ctrl_watch_streams_open{{region=\"{WATCHED_REGION}\"}}"),
    );
    ensure!(
        open == Some(watchers as f64),
        "the node counts {open:?} open streams, not {watchers}"
    );

    let mut per_scrape_us = Vec::with_capacity(rounds);
    let mut latencies = Vec::with_capacity(rounds * SCRAPES_PER_BURST);
    let mut idle_cpu_per_s = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let idle_from = cpu_seconds(Some(pid))?;
        let idle_started = Instant::now();
        tokio::time::sleep(IDLE_WINDOW).await;
        let idle_rate =
            (cpu_seconds(Some(pid))? - idle_from) / idle_started.elapsed().as_secs_f64();
        let burst_from = cpu_seconds(Some(pid))?;
        let burst_started = Instant::now();
        for _ in 0..SCRAPES_PER_BURST {
            let sent = Instant::now();
            get(metrics_addr, "/metrics").await?;
            latencies.push(sent.elapsed());
        }
        let burst_s = burst_started.elapsed().as_secs_f64();
        let burst_cpu = cpu_seconds(Some(pid))? - burst_from;
        let scrape_cpu = (burst_cpu - idle_rate * burst_s).max(0.0) / SCRAPES_PER_BURST as f64;
        per_scrape_us.push(scrape_cpu * 1e6);
        idle_cpu_per_s.push(idle_rate);
    }
    per_scrape_us.sort_by(f64::total_cmp);
    idle_cpu_per_s.sort_by(f64::total_cmp);
    let extra = serde_json::json!({
        "deployments": created,
        "watch_streams": watchers,
        "scrapes_per_round": SCRAPES_PER_BURST,
        "rounds": rounds,
        "rounds_us": per_scrape_us.iter().map(|us| us.round()).collect::<Vec<_>>(),
        "node_idle_cpu_ms_per_s": (idle_cpu_per_s[idle_cpu_per_s.len() / 2] * 1e3).round(),
        "exposition_bytes": body.len(),
        "deploying_gauge": gauge(&body, "deployment_workflow_status{status=\"deploying\"}"),
        "load_ms": load_ms,
    });
    print_value(
        SCENARIO,
        "node_cpu_per_scrape_us",
        serde_json::json!(per_scrape_us[per_scrape_us.len() / 2].round()),
        extra.clone(),
    );
    let s = Summary::of(&mut latencies).context("no scrapes")?;
    print_summary(SCENARIO, "scrape_latency", &s, extra);
    drop(held);
    cluster.shutdown().await;
    Ok(())
}

/// Creates `count` deployments in [`REGION`], [`CREATES_IN_FLIGHT`] at a
/// time; returns how many.
async fn create(client: &Client, count: usize) -> Result<usize> {
    let results: Vec<Result<String>> = futures::stream::iter(0..count)
        .map(|_| deploy(client))
        .buffer_unordered(CREATES_IN_FLIGHT)
        .collect()
        .await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
        bail!("{failed} of {count} creates failed, e.g.: {e:#}");
    }
    debug_assert!(REGION != WATCHED_REGION);
    Ok(results.len())
}

/// Opens `watchers` watch streams of [`WATCHED_REGION`] and waits for each
/// to end its full sync; returns what keeps them open.
async fn open_watchers(cluster: &ProcessCluster, watchers: usize) -> Result<Vec<impl Sized>> {
    let agent = integration::cluster::as_agent(&cluster.operator_of(SCRAPED), WATCHED_REGION);
    transport::tls::install_crypto_provider();
    let tls = transport::tls::client_config(
        &transport::tls::TlsPaths {
            ca_cert: agent.tls.ca_cert.clone(),
            cert: agent.tls.cert.clone(),
            key: agent.tls.key.clone(),
        },
        wire::agent::ALPN,
    )?;
    let addr = cluster.configs[0].listen_addr;
    let mut held = Vec::new();
    let deadline = tokio::time::Instant::now() + WATCHERS_TIMEOUT;
    for first in (0..watchers).step_by(STREAMS_PER_CONNECTION) {
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
        let mut streams = Vec::new();
        for _ in first..(first + STREAMS_PER_CONNECTION).min(watchers) {
            let mut stream =
                transport::stream::open_call(&connection, Protocol::Agent, FRAME_BYTES_MAX).await?;
            stream
                .send(&AgentRequest::Watch(WatchRequest {
                    region: WATCHED_REGION.to_string(),
                    cursor: 0,
                    epoch: 0,
                }))
                .await?;
            loop {
                let event = tokio::time::timeout_at(deadline, stream.recv::<WatchEvent>())
                    .await
                    .context("a watch stream's full sync did not end in time")??;
                match event {
                    Some(WatchEvent::SyncEnd { .. }) => break,
                    Some(WatchEvent::Error(e)) => bail!("watch refused: {e}"),
                    Some(_) => continue,
                    None => bail!("a watch stream ended during its full sync"),
                }
            }
            streams.push(stream);
        }
        held.push((endpoint, connection, streams));
    }
    Ok(held)
}
