//! A slow consumer is cut off and resumes: a raw QUIC client opens a watch
//! with its region's agent certificate and never reads; changes far larger
//! than its flow-control window are written; the node sends no more than
//! the window, resets the stream with
//! `node::server::watch::SLOW_CONSUMER_RESET_CODE` within
//! `limits.slow_consumer_timeout_ms` of blocking, and a fresh watch from the
//! old cursor gets every change, in order.

use std::time::Duration;

use integration::cluster::{TestNode, as_agent};
use integration::kit::wait::bounded;
use node::client::Client;
use node::server::watch::SLOW_CONSUMER_RESET_CODE;
use tokio::time::Instant;
use transport::stream::open_call;
use transport::tls::TlsPaths;
use wire::agent::{AgentRequest, ResourceChange, WatchEvent, WatchRequest};
use wire::hello::Protocol;
use wire::model::Resource;
use wire::operator::CreateDeployment;

const TEST_TIMEOUT: Duration = Duration::from_secs(60);
const REGION: &str = "us-east";
/// The node's bound on one event waiting for room in a consumer's window.
const SLOW_CONSUMER_TIMEOUT_MS: u64 = 300;
/// How long after the last write the reset must have arrived: the timeout
/// plus generous room for a loaded debug build.
const RESET_WITHIN: Duration = Duration::from_secs(15);
/// Deployments written while the consumer does not read.
const DEPLOYMENTS: usize = 32;
/// Each deployment carries this many environment values of
/// [`ENV_VALUE_BYTES`]: about 120 KiB per change event, 3.8 MiB in all.
const ENV_VARS: usize = 4;
const ENV_VALUE_BYTES: usize = 30 * 1024;
/// A QUIC stream's receive window with the transport's settings (quinn's
/// default: 1.25 MB), what the node may hold for the unread stream.
const STREAM_WINDOW_BYTES: u64 = 1_250_000;
/// What the raw client may receive in all: the window plus packet and
/// handshake overhead — far less than the changes written.
const RECEIVED_BYTES_MAX: u64 = STREAM_WINDOW_BYTES + 256 * 1024;

fn big_deployment(n: usize) -> CreateDeployment {
    (0..ENV_VARS)
        .fold(
            integration::requests::deployment([REGION]).environment(format!("env-{n}")),
            |deployment, i| deployment.env_var(format!("BLOB_{i}"), "x".repeat(ENV_VALUE_BYTES)),
        )
        .build()
}

/// The cursor a full sync of the region ends at.
async fn synced_cursor(agent: &Client) -> u64 {
    let mut watch = agent.watch(REGION, 0).await.expect("watch");
    loop {
        match watch.next().await.expect("event") {
            Some(WatchEvent::SyncEnd { cursor }) => return cursor,
            Some(WatchEvent::SyncStart { .. } | WatchEvent::SyncItem(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_stops_reading_is_reset_and_resumes_from_its_cursor() {
    bounded(TEST_TIMEOUT, scenario()).await;
}

async fn scenario() {
    let node = TestNode::start_with(|config| {
        config.limits.slow_consumer_timeout_ms = SLOW_CONSUMER_TIMEOUT_MS;
    })
    .await
    .expect("node starts");
    let operator = node.operator().unwrap();
    let small = integration::requests::deployment([REGION])
        .environment("env-0")
        .build();
    operator.create(small).await.expect("create");
    let agent = node.agent_client(REGION).unwrap();
    // The workflow writes the first deployment's rows when it starts it,
    // after the create's answer: a sync before that ends at cursor 0.
    let cursor = integration::kit::wait::wait_until(
        tokio::time::Instant::now() + TEST_TIMEOUT,
        "the first deployment's rows",
        async || match synced_cursor(&agent).await {
            0 => Err(0),
            cursor => Ok(cursor),
        },
    )
    .await
    .expect("the first deployment starts");

    // The slow consumer: a watch from `cursor` that is never read.
    let agent_tls = as_agent(&node.operator, REGION).tls;
    let tls = TlsPaths {
        ca_cert: agent_tls.ca_cert,
        cert: agent_tls.cert,
        key: agent_tls.key,
    };
    let client_config = transport::tls::client_config(&tls, wire::agent::ALPN).unwrap();
    let addr = node.node.local_addr;
    let endpoint =
        transport::endpoint::client_endpoint(transport::endpoint::client_bind_addr(addr)).unwrap();
    let (connection, _) = transport::endpoint::connect_any(
        &endpoint,
        &client_config,
        &[addr],
        &node.operator.server_name,
        5_000,
    )
    .await
    .expect("connect");
    let mut stream = open_call(&connection, Protocol::Agent, wire::frame::FRAME_BYTES_MAX)
        .await
        .unwrap();
    stream
        .send(&AgentRequest::Watch(WatchRequest {
            region: REGION.into(),
            cursor,
            epoch: 0,
        }))
        .await
        .unwrap();
    let (_send, mut unread) = stream.into_parts();

    let mut created = Vec::new();
    for n in 1..=DEPLOYMENTS {
        created.push(operator.create(big_deployment(n)).await.expect("create"));
    }
    let written = Instant::now();
    let written_bytes = (DEPLOYMENTS * ENV_VARS * ENV_VALUE_BYTES) as u64;

    // The node resets the stream (awaited without reading a byte of it).
    let reset = tokio::time::timeout(RESET_WITHIN, unread.received_reset())
        .await
        .unwrap_or_else(|_| panic!("no reset within {RESET_WITHIN:?} of the last write"));
    assert_eq!(
        reset.expect("stream state").map(|code| code.into_inner()),
        Some(u64::from(SLOW_CONSUMER_RESET_CODE)),
        "reset with the slow-consumer code"
    );
    let received = connection.stats().udp_rx.bytes;
    println!(
        "reset {:?} after the last write; the client received {received} bytes of {written_bytes} written",
        written.elapsed()
    );
    assert!(
        received <= RECEIVED_BYTES_MAX,
        "the node sent {received} bytes to a consumer that read nothing (window {STREAM_WINDOW_BYTES})"
    );
    drop(unread);
    connection.close(0u32.into(), b"done");

    // The consumer comes back with its old cursor and gets every change.
    let mut resumed = agent.watch(REGION, cursor).await.expect("watch");
    let mut seen = Vec::new();
    let mut last = cursor;
    while seen.len() < created.len() {
        match resumed.next().await.expect("event") {
            Some(WatchEvent::Change {
                version,
                change: ResourceChange::Apply(Resource::DeploymentTopology(topology)),
            }) => {
                assert!(version > last, "version {version} after {last}");
                last = version;
                assert_eq!(topology.env_vars.len(), ENV_VARS);
                seen.push(topology.deployment_id);
            }
            // The workflow's start also writes each environment's sentinel
            // and each deployment's policy.
            Some(WatchEvent::Change {
                version,
                change:
                    ResourceChange::Apply(Resource::Sentinel(_) | Resource::CiliumNetworkPolicy(_)),
            }) => {
                assert!(version > last, "version {version} after {last}");
                last = version;
            }
            Some(WatchEvent::Progress { .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, created, "every change, in order");
    node.node.shutdown().await;
}
