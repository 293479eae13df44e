//! The leader of three `ctrl serve` processes is SIGKILLed under a steady
//! write load from several clients. A new leader is elected and writes
//! resume; after the old leader restarts, every acknowledged write is on
//! all three nodes (each asked alone) and `ctrl cluster check` finds them
//! identical. The time from the kill to the first write sent after it and
//! acknowledged is printed as a JSON line.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use config::{OperatorConfig, TlsFiles};
use node::client::{Client, ClientError};
use wire::operator::CreateDeployment;
use wire::operator::request::ListDeployments;

/// Concurrent writers.
const WRITERS: usize = 4;
/// Writes acknowledged before the kill, and again after it.
const WRITES_EACH_SIDE: usize = 40;
/// Bound on the load reaching either count.
const LOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Generous bound on kill → first write (a follower elects itself 600–800
/// ms after the last heartbeat with the default `[raft]` timings).
const FAILOVER_BOUND: Duration = Duration::from_secs(10);
/// Page size when reading every deployment back from one node.
const LIST_PAGE: u32 = 500;

/// One acknowledged write: its deployment id, when it was sent and when
/// its answer arrived.
struct Acked {
    id: String,
    sent: Instant,
    acked: Instant,
}

fn create(n: u64) -> CreateDeployment {
    CreateDeployment {
        workspace_id: "ws".into(),
        project_id: "proj".into(),
        environment_id: format!("env-{}", n % 7),
        image: "nginx:1.27".into(),
        cpu_millicores: 100,
        memory_mib: 128,
        replicas: 1,
        regions: vec!["us-east".into()],
        env_vars: BTreeMap::new(),
        progress_deadline_ms: None,
        min_ready_regions: None,
        spec: Default::default(),
    }
}

fn operator(cluster: &Cluster, ids: &[u64]) -> OperatorConfig {
    OperatorConfig {
        endpoints: ids.iter().map(|id| cluster.addrs[id]).collect(),
        tls: TlsFiles::in_dir(&cluster.certs, "operator"),
        ..OperatorConfig::default()
    }
}

/// Every deployment id node `id` holds, read from that node alone.
async fn ids_on(cluster: &Cluster, id: u64) -> BTreeSet<String> {
    // Inside the runtime: the client binds its endpoint on creation.
    let client = Client::new(&operator(cluster, &[id])).expect("client");
    let mut ids = BTreeSet::new();
    let mut after = None;
    loop {
        let page = client
            .call(ListDeployments {
                after: after.clone(),
                limit: LIST_PAGE,
            })
            .await
            .expect("list deployments");
        ids.extend(page.items.into_iter().map(|d| d.id));
        match page.next_after {
            Some(next) => after = Some(next),
            None => return ids,
        }
    }
}

/// Receives acknowledgements until `count` satisfy `wanted`, bounded.
fn collect_until(
    acks: &mpsc::Receiver<Acked>,
    into: &mut Vec<Acked>,
    count: usize,
    wanted: impl Fn(&Acked) -> bool,
) {
    let deadline = Instant::now() + LOAD_TIMEOUT;
    while into.iter().filter(|a| wanted(a)).count() < count {
        let left = deadline.saturating_duration_since(Instant::now());
        match acks.recv_timeout(left) {
            Ok(acked) => into.push(acked),
            Err(_) => panic!(
                "only {} of {count} writes acknowledged within {LOAD_TIMEOUT:?}",
                into.iter().filter(|a| wanted(a)).count()
            ),
        }
    }
}

#[test]
fn leader_killed_under_write_load_loses_no_acknowledged_write() {
    let mut cluster = Cluster::new(3, "");
    for id in 1..=3 {
        cluster.start(id);
    }
    let all = cluster.operator(&[1, 2, 3]);
    cluster.ctrl_ok(&all, &["cluster", "init"]);
    cluster.settled(&[1, 2, 3]);
    cluster.ctrl_ok(&all, &["region", "add", "us-east"]);
    let leader = cluster.settled(&[1, 2, 3]);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicU64::new(0));
    let (ack_tx, acks) = mpsc::channel();
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let client = {
            let _guard = runtime.enter();
            Client::new(&operator(&cluster, &[1, 2, 3])).expect("client")
        };
        let (stop, failed, ack_tx) = (stop.clone(), failed.clone(), ack_tx.clone());
        writers.push(runtime.spawn(async move {
            let mut n = writer as u64;
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                match client.call(create(n)).await {
                    Ok(deployment_id) => {
                        let acked = Acked {
                            id: deployment_id,
                            sent,
                            acked: Instant::now(),
                        };
                        if ack_tx.send(acked).is_err() {
                            return;
                        }
                    }
                    // A wrong answer is a bug, not a failed call.
                    Err(e @ ClientError::UnexpectedAnswer { .. }) => panic!("{e}"),
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                n += WRITERS as u64;
            }
        }));
    }
    drop(ack_tx);

    let mut acked = Vec::new();
    collect_until(&acks, &mut acked, WRITES_EACH_SIDE, |_| true);
    cluster.kill(leader);
    let killed_at = Instant::now();
    collect_until(&acks, &mut acked, WRITES_EACH_SIDE, |a| a.sent > killed_at);
    stop.store(true, Ordering::Relaxed);
    runtime.block_on(async {
        for writer in writers {
            writer.await.expect("writer task");
        }
    });
    acked.extend(acks.try_iter());

    let first_after = acked
        .iter()
        .filter(|a| a.sent > killed_at)
        .map(|a| a.acked)
        .min()
        .expect("a write after the kill");
    let failover = first_after.duration_since(killed_at);
    println!(
        "{}",
        serde_json::json!({
            "figure": "leader_kill_to_first_write_ms",
            "value": u64::try_from(failover.as_millis()).unwrap_or(u64::MAX),
            "acknowledged": acked.len(),
            "failed_calls": failed.load(Ordering::Relaxed),
            "writers": WRITERS,
        })
    );
    assert!(failover < FAILOVER_BOUND, "first write after {failover:?}");

    // The old leader returns; the three agree, and each holds every
    // acknowledged write.
    cluster.start(leader);
    cluster.settled(&[1, 2, 3]);
    cluster.check(&all);
    let expected: BTreeSet<String> = acked.iter().map(|a| a.id.clone()).collect();
    assert_eq!(expected.len(), acked.len(), "ids are unique");
    for id in 1..=3 {
        let held = runtime.block_on(ids_on(&cluster, id));
        let missing: Vec<&String> = expected.difference(&held).collect();
        assert!(
            missing.is_empty(),
            "node {id} lacks acknowledged writes {missing:?}"
        );
    }
}
