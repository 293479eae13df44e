//! The metrics and health listeners (`metrics_addr`) of ctrl and krane,
//! scraped over HTTP and read with a Prometheus text parser:
//!
//! - a site (one node, one region): the named metrics exist, a deploy
//!   raises the workflow's transitions and the instance counts, krane's
//!   cursor moves and both are ready;
//! - three nodes: killing the leader raises the leader changes the
//!   survivors count;
//! - three nodes behind relays: a node cut off from the majority (the
//!   leader, then a follower) is not ready, and is again once the
//!   partition heals.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use integration::cluster::TestCluster;
use integration::fleet::{Fleet, FleetConfig};
use integration::kit::wait::{bounded, wait_until, within};
use node::boot::RunningNode;
use prometheus_parse::{Scrape, Value};
use tokio::time::Instant;

/// Bound on each test.
const TEST_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound on one step (an election, a deploy, a heal).
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a deploy may take to become ready, in seconds.
const READY_TIMEOUT_S: u64 = 30;
const REGION: &str = "us-east";
/// Short Raft timeouts, so that elections and the readiness bound (the
/// election timeout) pass quickly.
fn fast_raft(config: &mut config::NodeConfig) {
    config.raft.heartbeat_interval_ms = 50;
    config.raft.election_timeout_min_ms = 300;
    config.raft.election_timeout_max_ms = 600;
    config.metrics_addr = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
}

/// `GET path` on `addr`: the status code and the body.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let request = Request::get(path)
        .header(hyper::header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// `/metrics` of `addr`, parsed.
async fn scrape(addr: SocketAddr) -> Scrape {
    let (status, body) = get(addr, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("a Prometheus exposition")
}

/// The value of the sample `name` whose labels include `labels`.
fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .find_map(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(v),
            _ => None,
        })
}

/// [`value`], which must be there.
fn must(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    value(scrape, name, labels).unwrap_or_else(|| {
        let names: Vec<&str> = scrape.samples.iter().map(|s| s.metric.as_str()).collect();
        panic!("no sample {name}{labels:?} among {names:?}")
    })
}

fn metrics_addr(node: &RunningNode) -> SocketAddr {
    node.metrics_addr.expect("metrics_addr is set")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_moves_the_metrics_of_ctrl_and_krane() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let fleet = Fleet::start(FleetConfig::new(dir.path(), vec![REGION.into()]))
            .await
            .expect("fleet starts");
        let ctrl = metrics_addr(fleet.node());
        let krane = fleet
            .region(REGION)
            .agent
            .metrics_addr
            .expect("krane metrics_addr");
        fleet
            .region(REGION)
            .wait_krane(STEP_TIMEOUT, |s| s.watching)
            .await
            .unwrap();

        assert_eq!(get(ctrl, "/livez").await.0, 200);
        assert_eq!(get(krane, "/livez").await.0, 200);
        let (status, body) = get(ctrl, "/readyz").await;
        assert_eq!(status, 200, "{body}");
        let (status, body) = get(krane, "/readyz").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(get(ctrl, "/nope").await.0, 404);

        let before = scrape(ctrl).await;
        for name in [
            "ctrl_raft_has_leader",
            "ctrl_raft_term",
            "ctrl_raft_commit_index",
            "ctrl_raft_applied_index",
            "ctrl_change_log_last_pk",
            "ctrl_change_log_floor_pk",
            "ctrl_state_file_bytes",
            "ctrl_raft_log_file_bytes",
            "ctrl_raft_leader_changes_total",
        ] {
            must(&before, name, &[]);
        }
        assert_eq!(must(&before, "ctrl_raft_has_leader", &[]), 1.0);
        assert!(must(&before, "ctrl_state_file_bytes", &[]) > 0.0);
        assert_eq!(
            must(&before, "ctrl_watch_streams_open", &[("region", REGION)]),
            1.0
        );
        assert_eq!(
            must(
                &before,
                "deployment_workflow_status",
                &[("status", "ready")]
            ),
            0.0
        );
        assert_eq!(
            must(
                &before,
                "deployment_instances_by_status",
                &[("status", "running")]
            ),
            0.0
        );
        let krane_before = scrape(krane).await;
        assert_eq!(must(&krane_before, "krane_watching", &[]), 1.0);
        assert_eq!(
            must(&krane_before, "krane_info", &[("region", REGION)]),
            1.0
        );
        let cursor_before = must(&krane_before, "krane_cursor_pk", &[]);
        must(&krane_before, "krane_full_syncs_total", &[]);
        must(&krane_before, "krane_outbox_reports", &[]);
        for (scraped, prefix) in [(&before, "ctrl"), (&krane_before, "krane")] {
            for cert in [if prefix == "ctrl" { "node" } else { "agent" }, "ca"] {
                let name = format!("{prefix}_tls_cert_expiry_seconds");
                let left = must(scraped, &name, &[("cert", cert)]);
                assert!(left > 86_400.0, "{name}{{cert={cert}}} {left}");
            }
        }

        let operator = fleet.operator().unwrap();
        let (id, _) = operator
            .deploy(
                integration::requests::deployment([REGION])
                    .replicas(2)
                    .build(),
            )
            .await
            .unwrap();
        within(
            STEP_TIMEOUT,
            "the deploy is ready",
            operator.ready(&id, READY_TIMEOUT_S),
        )
        .await
        .expect("ready");

        let after = scrape(ctrl).await;
        assert_eq!(
            must(&after, "deployment_workflow_status", &[("status", "ready")]),
            1.0
        );
        for to in ["deploying", "ready"] {
            assert!(
                must(
                    &after,
                    "deployment_workflow_transitions_total",
                    &[("to", to)]
                ) >= 1.0,
                "no transition to {to}"
            );
        }
        assert_eq!(
            must(
                &after,
                "deployment_instances_by_status",
                &[("status", "running")]
            ),
            2.0
        );
        assert!(
            must(&after, "ctrl_raft_applied_index", &[])
                > must(&before, "ctrl_raft_applied_index", &[])
        );
        // Histograms: the deploy's whole duration, its instances' start,
        // and the Raft log's commits.
        assert_eq!(
            must(
                &after,
                "deployment_workflow_duration_seconds_count",
                &[("status", "ready")]
            ),
            1.0
        );
        assert!(
            must(
                &after,
                "deployment_workflow_duration_seconds_sum",
                &[("status", "ready")]
            ) > 0.0
        );
        assert_eq!(
            must(
                &after,
                "deployment_instance_startup_time_seconds_count",
                &[]
            ),
            2.0
        );
        for name in [
            "ctrl_raft_log_fsync_seconds_count",
            "ctrl_raft_log_entries_per_commit_count",
            "ctrl_raft_apply_entries_per_batch_count",
        ] {
            assert!(
                must(&after, name, &[]) > must(&before, name, &[]),
                "{name} did not move"
            );
        }
        assert_eq!(must(&after, "deployment_instances_total", &[]), 2.0);
        assert_eq!(must(&after, "deployment_topology_regions", &[]), 1.0);
        assert_eq!(
            must(
                &after,
                "deployment_topology_status",
                &[("status", "running")]
            ),
            1.0
        );
        assert!(must(&after, "ctrl_change_log_rows", &[]) >= 4.0);
        assert!(
            must(&after, "ctrl_change_log_last_pk", &[])
                > must(&before, "ctrl_change_log_last_pk", &[])
        );
        assert!(
            must(
                &after,
                "ctrl_watch_events_sent_total",
                &[("region", REGION)]
            ) > must(
                &before,
                "ctrl_watch_events_sent_total",
                &[("region", REGION)]
            )
        );
        // krane's cursor follows the change rows it applied.
        let last_pk = must(&after, "ctrl_change_log_last_pk", &[]);
        let deadline = Instant::now() + STEP_TIMEOUT;
        wait_until(deadline, "krane's cursor at the last change", async || {
            let cursor = must(&scrape(krane).await, "krane_cursor_pk", &[]);
            if cursor >= last_pk {
                Ok(())
            } else {
                Err(cursor)
            }
        })
        .await
        .unwrap();
        assert!(last_pk > cursor_before);
        let krane_after = scrape(krane).await;
        assert!(must(&krane_after, "krane_apply_seconds_count", &[]) >= 1.0);
        assert_eq!(must(&krane_after, "krane_breaker_open", &[]), 0.0);
        must(&krane_after, "krane_lag_pk", &[]);
        must(&krane_after, "krane_collected_objects_total", &[]);
        must(&krane_after, "krane_outbox_apply_reports", &[]);
        assert!(
            must(
                &krane_after,
                "krane_applies_total",
                &[("result", "written")]
            ) >= 1.0
        );
        assert_eq!(
            must(&krane_after, "krane_applies_total", &[("result", "failed")]),
            0.0
        );
        assert_eq!(must(&krane_after, "krane_applies_failing", &[]), 0.0);
        // The running pods reached ctrl through acknowledged reports.
        assert!(
            must(
                &krane_after,
                "krane_status_reports_total",
                &[("outcome", "sent")]
            ) >= 1.0
        );
        fleet.shutdown().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_counts_a_leader_change_on_the_survivors() {
    bounded(TEST_TIMEOUT, async {
        let mut cluster = TestCluster::start(3, fast_raft).await.unwrap();
        let leader = cluster.wait_for_leader(STEP_TIMEOUT).await.unwrap();
        let mut before = Vec::new();
        for node in cluster.running().filter(|n| n.state.node_id != leader) {
            let addr = metrics_addr(node);
            let seen = must(&scrape(addr).await, "ctrl_raft_leader_changes_total", &[]);
            assert!(seen >= 1.0, "node {} saw no leader", node.state.node_id);
            before.push((node.state.node_id, addr, seen));
        }
        cluster.stop(leader).await.unwrap();
        let new_leader = cluster.wait_for_leader(STEP_TIMEOUT).await.unwrap();
        assert_ne!(new_leader, leader);
        for (id, addr, seen) in before {
            let deadline = Instant::now() + STEP_TIMEOUT;
            wait_until(deadline, "a leader change counted", async || {
                let scraped = scrape(addr).await;
                let now = must(&scraped, "ctrl_raft_leader_changes_total", &[]);
                let ready = get(addr, "/readyz").await;
                if now > seen && ready.0 == 200 {
                    Ok(())
                } else {
                    Err((id, now, ready))
                }
            })
            .await
            .unwrap();
        }
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_the_majority_is_not_ready_until_healed() {
    bounded(TEST_TIMEOUT, async {
        let cluster = TestCluster::start_with_relays(3, fast_raft).await.unwrap();
        let leader = cluster.wait_for_leader(STEP_TIMEOUT).await.unwrap();
        let addrs: Vec<(u64, SocketAddr)> = cluster
            .running()
            .map(|n| (n.state.node_id, metrics_addr(n)))
            .collect();
        for &(id, addr) in &addrs {
            let deadline = Instant::now() + STEP_TIMEOUT;
            wait_until(deadline, "every node ready", async || {
                let (status, body) = get(addr, "/readyz").await;
                if status == 200 {
                    Ok(())
                } else {
                    Err((id, status, body))
                }
            })
            .await
            .unwrap();
        }
        // The leader is cut off: it stops hearing from a quorum.
        cluster.faults.isolate(&[leader]);
        let (_, isolated) = addrs.iter().find(|(id, _)| *id == leader).copied().unwrap();
        let deadline = Instant::now() + STEP_TIMEOUT;
        let reason = wait_until(deadline, "the isolated node not ready", async || match get(
            isolated, "/readyz",
        )
        .await
        {
            (503, reason) => Ok(reason),
            other => Err(other),
        })
        .await
        .unwrap();
        eprintln!("node {leader} cut off: {}", reason.trim());
        assert_eq!(reason.trim().lines().count(), 1, "{reason}");
        assert!(
            reason.contains("quorum") || reason.contains("no known leader"),
            "{reason}"
        );
        // The others elect a leader among themselves and stay ready.
        for &(id, addr) in addrs.iter().filter(|(id, _)| *id != leader) {
            let deadline = Instant::now() + STEP_TIMEOUT;
            wait_until(deadline, "the majority ready", async || {
                let (status, body) = get(addr, "/readyz").await;
                if status == 200 {
                    Ok(())
                } else {
                    Err((id, status, body))
                }
            })
            .await
            .unwrap();
        }
        cluster.faults.heal();
        let deadline = Instant::now() + STEP_TIMEOUT;
        wait_until(deadline, "the healed node ready again", async || {
            let (status, body) = get(isolated, "/readyz").await;
            if status == 200 {
                Ok(())
            } else {
                Err((status, body))
            }
        })
        .await
        .unwrap();

        // A follower cut off loses its leader (it stands for election in
        // vain), then finds it again once healed.
        let leader = cluster.wait_for_leader(STEP_TIMEOUT).await.unwrap();
        let (follower, cut) = addrs.iter().find(|(id, _)| *id != leader).copied().unwrap();
        cluster.faults.isolate(&[follower]);
        let reason = unready(cut, "the isolated follower not ready").await;
        eprintln!("follower {follower} cut off: {}", reason.trim());
        assert!(reason.contains("no known leader"), "{reason}");
        cluster.faults.heal();
        ready(cut, "the healed follower ready again").await;
        cluster.shutdown().await;
    })
    .await;
}

/// Waits until `/readyz` of `addr` answers 200.
async fn ready(addr: SocketAddr, what: &str) {
    let deadline = Instant::now() + STEP_TIMEOUT;
    wait_until(deadline, what, async || match get(addr, "/readyz").await {
        (200, _) => Ok(()),
        other => Err(other),
    })
    .await
    .unwrap();
}

/// Waits until `/readyz` of `addr` answers 503; its reason.
async fn unready(addr: SocketAddr, what: &str) -> String {
    let deadline = Instant::now() + STEP_TIMEOUT;
    wait_until(deadline, what, async || match get(addr, "/readyz").await {
        (503, reason) => Ok(reason),
        other => Err(other),
    })
    .await
    .unwrap()
}
