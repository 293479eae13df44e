//! "Live" is where requests go: a fleet with traffic (pods answering on
//! loopback, each environment's real sentinel running in process) and
//! requests sent to the environment's sentinel address.
//!
//! - Deploy v1: requests reach v1. Deploy v2 while a client sends
//!   continuously: once v2 answers, every later request reaches v2, and
//!   the client sees no error across the flip. Roll back: requests reach
//!   v1 again (the time from the rollback's acknowledgement to the first
//!   v1 answer is printed). Across all of it the sentinel's pod template
//!   never changed (route changes restart nothing).
//! - A rollback to a standby deployment starts it and flips the route only
//!   once it runs: until then every request still reaches the live one.
//! - A deployment that declares no port is never routed: the environment
//!   keeps serving the deployment it had.
//! - The first flow again with every part a process (three `ctrl serve`,
//!   krane, the `sentinel` binary).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use integration::fleet::{Fleet, FleetConfig};
use integration::kit::operator::Operator;
use integration::kit::site::ProcessSite;
use integration::kit::wait::bounded;
use integration::requests;
use k8s_sim::resources::DEPLOYMENTS;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wire::model::DesiredState;
use wire::operator::CreateDeployment;
use wire::workload::WorkloadSpec;

/// Bound on each test.
const TEST_TIMEOUT: Duration = Duration::from_secs(100);
/// Bound on one wait for a deploy or a flip.
const WAIT: Duration = Duration::from_secs(30);
/// Bound on one request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const REGION: &str = "us-east";
const ENV: &str = "prod";
const PORT: u16 = 8080;

async fn fleet(dir: &tempfile::TempDir) -> Fleet {
    let mut config = FleetConfig::new(dir.path(), vec![REGION.to_string()]).fast();
    config.traffic = true;
    // A window in which a started deployment does not run yet.
    config.pod_ready_delay_ms = 300;
    Fleet::start(config).await.expect("fleet starts")
}

fn app(image: &str, port: Option<u16>) -> CreateDeployment {
    requests::deployment([REGION])
        .image(image)
        .replicas(2)
        .environment(ENV)
        .spec(WorkloadSpec {
            port,
            ..WorkloadSpec::default()
        })
        .build()
}

/// Deploys `image` to the environment and waits until it is ready (and
/// live); its id.
async fn deploy(operator: &Operator, image: &str, port: Option<u16>) -> String {
    let id = operator.create(app(image, port)).await.expect("create");
    operator
        .ready(&id, WAIT.as_secs())
        .await
        .unwrap_or_else(|e| panic!("{image} ready: {e}"));
    id
}

/// One `GET /` through `addr`: the status and the echo's image (or the
/// body when it is not the echo).
async fn get(addr: SocketAddr) -> Result<(u16, String), String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: prod\r\nConnection: close\r\n\r\n")
            .await
            .map_err(|e| format!("send: {e}"))?;
        let mut answer = Vec::new();
        stream
            .read_to_end(&mut answer)
            .await
            .map_err(|e| format!("read: {e}"))?;
        Ok::<_, String>(String::from_utf8_lossy(&answer).into_owned())
    };
    let text = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| "no answer in time".to_string())??;
    let status: u16 = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not HTTP: {text:?}"))?;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    let image = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["image"].as_str().map(str::to_string))
        .unwrap_or_else(|| body.to_string());
    Ok((status, image))
}

/// Sends requests until one answers 200 from `image`; how long it took.
async fn until_image(addr: SocketAddr, image: &str) -> Duration {
    let started = Instant::now();
    let mut last = None;
    while started.elapsed() < WAIT {
        match get(addr).await {
            Ok((200, seen)) if seen == image => return started.elapsed(),
            other => last = Some(other),
        }
    }
    panic!("no answer from {image} within {WAIT:?}; last: {last:?}");
}

/// What a [`Client`] saw: how many requests it sent, the failed ones (not
/// 200), and the images that answered, in order, run-length encoded.
type Seen = (u64, Vec<String>, Vec<(String, u64)>);

/// A client sending requests one after another until stopped.
struct Client {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Seen>,
    sent: Arc<AtomicU64>,
}

impl Client {
    fn start(addr: SocketAddr) -> Client {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (stop2, sent2) = (stop.clone(), sent.clone());
        let task = tokio::spawn(async move {
            let mut errors = Vec::new();
            let mut seen: Vec<(String, u64)> = Vec::new();
            while !stop2.load(Ordering::Relaxed) {
                sent2.fetch_add(1, Ordering::Relaxed);
                match get(addr).await {
                    Ok((200, image)) => match seen.last_mut() {
                        Some((last, n)) if *last == image => *n += 1,
                        _ => seen.push((image, 1)),
                    },
                    other => errors.push(format!("{other:?}")),
                }
            }
            (sent2.load(Ordering::Relaxed), errors, seen)
        });
        Client { stop, task, sent }
    }

    /// Waits until `n` more requests were sent.
    async fn after(&self, n: u64) {
        let from = self.sent.load(Ordering::Relaxed);
        while self.sent.load(Ordering::Relaxed) < from + n {
            tokio::task::yield_now().await;
        }
    }

    async fn stop(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("client task")
    }
}

/// The sentinel Deployment's pod template in the simulated cluster.
fn sentinel_template(fleet: &Fleet) -> Value {
    let deployments = fleet.regions[0]
        .sim
        .list(&DEPLOYMENTS, Some("sentinel"), "");
    assert_eq!(deployments.len(), 1, "one sentinel: {deployments:?}");
    deployments[0]["spec"]["template"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_and_rollback_move_requests_without_a_failed_request() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let fleet = fleet(&dir).await;
        let operator = Operator::new(&fleet.operator).unwrap();
        let sentinels = fleet.regions[0].sentinels.as_ref().expect("traffic");

        let v1 = deploy(&operator, "app:1", Some(PORT)).await;
        let addr = sentinels.wait_addr(ENV, WAIT).await.unwrap();
        until_image(addr, "app:1").await;
        let template = sentinel_template(&fleet);

        // v2 while a client sends continuously.
        let client = Client::start(addr);
        client.after(5).await;
        let v2 = deploy(&operator, "app:2", Some(PORT)).await;
        until_image(addr, "app:2").await;
        client.after(20).await;
        let (sent, errors, seen) = client.stop().await;
        assert!(
            errors.is_empty(),
            "failed requests during the flip: {errors:?}"
        );
        let images: Vec<&str> = seen.iter().map(|(i, _)| i.as_str()).collect();
        assert_eq!(
            images,
            ["app:1", "app:2"],
            "v1, then v2 only, over {sent} requests: {seen:?}"
        );
        assert!(seen[1].1 >= 20, "{seen:?}");

        // Rollback: back to v1, timed from the acknowledgement.
        let client = Client::start(addr);
        client.after(5).await;
        let back = operator.rollback(ENV, None).await.expect("rollback");
        assert_eq!(back.id, v1);
        let flip = until_image(addr, "app:1").await;
        println!("rollback acknowledged → first v1 answer through the sentinel: {flip:?}");
        client.after(20).await;
        let (_, errors, seen) = client.stop().await;
        assert!(
            errors.is_empty(),
            "failed requests during the rollback: {errors:?}"
        );
        assert_eq!(
            seen.last().map(|(i, _)| i.as_str()),
            Some("app:1"),
            "{seen:?}"
        );
        assert_eq!(
            operator.environment(ENV).await.unwrap().live_deployment_id,
            Some(v1.clone())
        );
        assert_ne!(v1, v2);

        // Routes changed three times; the sentinel's pods never did.
        assert_eq!(sentinel_template(&fleet), template);
        // And ctrl shows the generation the sentinel says it serves.
        let (generation, since_ms) = operator.until_served(ENV, REGION, WAIT).await.unwrap();
        let route = operator.describe_environment(ENV).await.unwrap().routes[0].clone();
        assert_eq!(generation, route.route.version);
        assert!(since_ms >= route.route.updated_at_ms, "{route:?}");
        fleet.shutdown().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_to_a_standby_deployment_flips_only_once_it_runs() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let fleet = fleet(&dir).await;
        let operator = Operator::new(&fleet.operator).unwrap();
        let sentinels = fleet.regions[0].sentinels.as_ref().expect("traffic");

        let v1 = deploy(&operator, "app:1", Some(PORT)).await;
        let addr = sentinels.wait_addr(ENV, WAIT).await.unwrap();
        deploy(&operator, "app:2", Some(PORT)).await;
        until_image(addr, "app:2").await;
        // v1 goes to standby: its pods go.
        operator
            .set_desired_state(&v1, DesiredState::Standby)
            .await
            .expect("standby");
        let deadline = tokio::time::Instant::now() + WAIT;
        operator
            .wait_deployment(&v1, deadline, "no instance left", |v| {
                v.instances.is_empty()
            })
            .await
            .expect("v1 stopped");

        // The rollback starts v1; requests keep reaching v2 until it runs.
        let client = Client::start(addr);
        client.after(5).await;
        operator.rollback(ENV, Some(&v1)).await.expect("rollback");
        until_image(addr, "app:1").await;
        let view = operator.deployment(&v1).await.unwrap();
        assert!(
            view.instances
                .iter()
                .any(|i| i.status == wire::model::InstanceStatus::Running),
            "v1 answered before ctrl saw it run: {view:#?}"
        );
        client.after(10).await;
        let (_, errors, seen) = client.stop().await;
        assert!(errors.is_empty(), "failed requests: {errors:?}");
        let images: Vec<&str> = seen.iter().map(|(i, _)| i.as_str()).collect();
        assert_eq!(images, ["app:2", "app:1"], "{seen:?}");
        fleet.shutdown().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_without_a_port_is_never_routed() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let fleet = fleet(&dir).await;
        let operator = Operator::new(&fleet.operator).unwrap();
        let sentinels = fleet.regions[0].sentinels.as_ref().expect("traffic");

        deploy(&operator, "app:1", Some(PORT)).await;
        let addr = sentinels.wait_addr(ENV, WAIT).await.unwrap();
        until_image(addr, "app:1").await;
        let portless = deploy(&operator, "app:2", None).await;
        // Live in ctrl, but not routable: the route stays on v1.
        assert_eq!(
            operator.environment(ENV).await.unwrap().live_deployment_id,
            Some(portless)
        );
        for _ in 0..10 {
            assert_eq!(get(addr).await, Ok((200, "app:1".to_string())));
        }
        fleet.shutdown().await.unwrap();
    })
    .await;
}

/// The resources a full-sync watch of `REGION` streams to an agent that
/// offers `versions`, as that agent (its certificate) would ask.
async fn full_sync_as_agent(
    fleet: &Fleet,
    versions: wire::hello::VersionRange,
) -> Vec<wire::model::Resource> {
    use transport::stream::open_call_offering;
    use wire::agent::{AgentRequest, WatchEvent, WatchRequest};
    let certs = fleet.dir.join("certs");
    let bundle = transport::certs::agent_bundle(&certs, REGION);
    let paths = transport::tls::TlsPaths {
        ca_cert: certs.join(transport::certs::CA_CERT_FILE),
        cert: bundle.cert,
        key: bundle.key,
    };
    let config = transport::tls::client_config(&paths, wire::agent::ALPN).unwrap();
    let addr = fleet.operator.endpoints[0];
    let endpoint =
        transport::endpoint::client_endpoint(transport::endpoint::client_bind_addr(addr)).unwrap();
    let (connection, _) =
        transport::endpoint::connect_any(&endpoint, &config, &[addr], "localhost", 5_000)
            .await
            .unwrap();
    let mut stream = open_call_offering(
        &connection,
        wire::hello::Protocol::Agent,
        versions,
        wire::frame::FRAME_BYTES_MAX,
    )
    .await
    .unwrap();
    let request = AgentRequest::Watch(WatchRequest {
        region: REGION.into(),
        cursor: 0,
        epoch: 0,
    });
    stream.send(&request).await.unwrap();
    let mut items = Vec::new();
    loop {
        let event: WatchEvent = tokio::time::timeout(WAIT, stream.recv())
            .await
            .expect("the node streams in time")
            .expect("an event that decodes")
            .expect("an event");
        match event {
            WatchEvent::SyncItem(resource) => items.push(resource),
            WatchEvent::SyncEnd { .. } => return items,
            _ => {}
        }
    }
}

/// An agent of protocol 5 (before routes) is streamed no route: it could
/// not decode one. One of this release gets the environment's route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_older_than_routes_is_streamed_none() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let fleet = fleet(&dir).await;
        let operator = Operator::new(&fleet.operator).unwrap();
        deploy(&operator, "app:1", Some(PORT)).await;
        let is_route = |r: &wire::model::Resource| matches!(r, wire::model::Resource::Route(_));
        let current = full_sync_as_agent(&fleet, wire::hello::PROTOCOL_VERSIONS).await;
        assert_eq!(
            current.iter().filter(|r| is_route(r)).count(),
            1,
            "this release gets the route: {current:?}"
        );
        let before = wire::hello::ROUTES_SINCE_VERSION - 1;
        let old = wire::hello::VersionRange {
            min: before,
            max: before,
        };
        let older = full_sync_as_agent(&fleet, old).await;
        assert!(!older.iter().any(is_route), "{older:?}");
        assert_eq!(older.len(), current.len() - 1, "everything else, still");
        fleet.shutdown().await.unwrap();
    })
    .await;
}

/// The same flow with every part a process: three `ctrl serve`, a krane,
/// and the sentinel as the `sentinel` binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_part_a_process_live_and_rollback_move_requests() {
    bounded(TEST_TIMEOUT, async {
        let site = ProcessSite::start_with_traffic(3, &[REGION])
            .await
            .expect("site");
        let operator = Operator::new(&site.operator).unwrap();
        let sentinels = &site.sentinels[0];

        let v1 = deploy(&operator, "app:1", Some(PORT)).await;
        let addr = sentinels.wait_addr(ENV, WAIT).await.unwrap();
        until_image(addr, "app:1").await;

        let client = Client::start(addr);
        client.after(5).await;
        deploy(&operator, "app:2", Some(PORT)).await;
        until_image(addr, "app:2").await;
        client.after(20).await;
        let (sent, errors, seen) = client.stop().await;
        assert!(
            errors.is_empty(),
            "failed requests during the flip: {errors:?}"
        );
        let images: Vec<&str> = seen.iter().map(|(i, _)| i.as_str()).collect();
        assert_eq!(images, ["app:1", "app:2"], "over {sent} requests: {seen:?}");

        let back = operator.rollback(ENV, None).await.expect("rollback");
        assert_eq!(back.id, v1);
        let flip = until_image(addr, "app:1").await;
        println!("processes: rollback acknowledged → first v1 answer: {flip:?}");
        // The sentinel process's report of what it serves reaches ctrl.
        operator.until_served(ENV, REGION, WAIT).await.unwrap();
        site.shutdown().await;
    })
    .await;
}
