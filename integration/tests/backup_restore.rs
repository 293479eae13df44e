//! Backup and restore with the real `ctrl` binary: a backup taken from a
//! three-node cluster under write load verifies offline; a damaged or
//! truncated copy is refused by `backup verify` and by `restore`, naming
//! what is wrong; the backup restored onto three fresh data directories on
//! other ports starts as one cluster whose every node has the backup's
//! state (the state hash `verify` printed), under a new epoch and the same
//! cluster id, and takes writes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use config::{AgentConfig, ConfigFile, PeerConfig, TlsFiles};
use integration::cluster::TestCluster;
use integration::fleet::Timings;
use integration::kit::binaries;
use integration::kit::krane::{self, Krane};
use integration::kit::wait::{bounded, wait_until};
use k8s_sim::resources::STATEFUL_SETS;
use k8s_sim::{SimConfig, Simulator};
use node::client::Client;
use wire::operator::request::StateHash;

/// Bound on the scenario (building ctrl and krane comes before it).
const TEST_TIMEOUT: Duration = Duration::from_secs(120);
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// Writes made before the backup, at least.
const WRITES_BEFORE_BACKUP: u64 = 20;
/// The region of the krane process (it has a certificate in the test CA).
const REGION: &str = "us-east";
/// The namespace krane applies deployments in (its default).
const NAMESPACE: &str = "krane";

/// A deployment of one replica to [`REGION`] in an environment of its own.
fn deployment(environment: &str) -> wire::operator::CreateDeployment {
    integration::requests::deployment([REGION])
        .owner("ws_1", "proj_1", environment)
        .own_environment()
        .build()
}

/// Whether the simulator holds the StatefulSet of deployment `id`.
fn applied(sim: &Simulator, id: &str) -> bool {
    sim.get(&STATEFUL_SETS, NAMESPACE, &wire::k8s_name::deployment(id))
        .is_some()
}

/// Writes krane's config: the simulator, `endpoints`, its data directory,
/// its `/metrics` on a free loopback port (returned).
fn write_agent_config(
    dir: &std::path::Path,
    sim: &Simulator,
    endpoints: &[SocketAddr],
) -> SocketAddr {
    let mut agent = AgentConfig::new(
        REGION,
        endpoints.iter().map(|a| (*a).into()).collect(),
        TlsFiles::in_dir(&dir.join("certs"), &format!("agent-{REGION}")),
    );
    let kubeconfig = dir.join(format!("{REGION}.kubeconfig"));
    sim.write_kubeconfig(&kubeconfig).unwrap();
    agent.kubeconfig = Some(kubeconfig);
    agent.data_dir = dir.join(format!("krane-{REGION}"));
    Timings::FAST.apply(&mut agent);
    let metrics_addr = testkit::ports::free_tcp_addr().unwrap();
    agent.metrics_addr = Some(metrics_addr);
    std::fs::write(dir.join("krane.toml"), agent.to_toml_string()).unwrap();
    metrics_addr
}

fn free_addr() -> SocketAddr {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("a free port");
    socket.local_addr().expect("its address")
}

/// The value after `key` on the line that starts with it.
fn field(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key:?} in {text}"))
        .trim()
        .to_string()
}

async fn state_hash(client: &Client) -> anyhow::Result<wire::operator::StateHash> {
    let request = StateHash {
        min_applied_index: 0,
        wait_ms: 1_000,
    };
    Ok(client.call(request).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_restores_onto_new_hosts_and_damage_is_named() {
    // Building the binaries (on a fresh checkout, nearly all of this
    // test's time) comes before the scenario's bound, bounded by
    // `binaries::BUILD_TIMEOUT`.
    let krane_bin = binaries::krane().await.expect("the krane binary");
    binaries::ctrl().await.expect("the ctrl binary");
    bounded(TEST_TIMEOUT, async {
        let mut source = TestCluster::start(3, |_| {}).await.unwrap();
        let dir = source.dir.path().to_path_buf();
        let operator_path = dir.join("operator.toml");
        std::fs::write(&operator_path, source.operator.to_toml_string()).unwrap();
        let ctrl = integration::kit::ctrl::with_config(&operator_path)
            .await
            .unwrap();

        // A krane process watches the source; a deployment it applied is
        // in the backup.
        let sim = Simulator::start(SimConfig::default()).await.unwrap();
        let source_addrs: Vec<SocketAddr> = source.configs.iter().map(|c| c.listen_addr).collect();
        let krane_metrics = write_agent_config(&dir, &sim, &source_addrs);
        let krane_data = dir.join(format!("krane-{REGION}"));
        let agent =
            Krane::start(krane_bin, &dir.join("krane.toml"), &dir.join("krane.log")).unwrap();
        let operator = source.operator().unwrap();
        let kept = operator.create(deployment("env_kept")).await.unwrap();
        wait_until(
            Instant::now() + STEP_TIMEOUT,
            "krane to apply the first deployment",
            async || applied(&sim, &kept).then_some(()).ok_or("not yet"),
        )
        .await
        .unwrap();

        // Regions the cluster starts with (the test regions), in the backup
        // too.
        let initial_regions = u64::try_from(
            source
                .operator()
                .unwrap()
                .regions()
                .await
                .unwrap()
                .regions
                .len(),
        )
        .unwrap();
        // Write load: regions added one after another until told to stop.
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let load = {
            let (operator, stop, written) =
                (source.operator().unwrap(), stop.clone(), written.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    operator
                        .add_region(&format!("r{i}"))
                        .await
                        .expect("a write");
                    i += 1;
                    written.store(i, Ordering::Relaxed);
                }
            })
        };
        wait_until(
            Instant::now() + STEP_TIMEOUT,
            "writes before the backup",
            async || {
                let n = written.load(Ordering::Relaxed);
                (n >= WRITES_BEFORE_BACKUP).then_some(()).ok_or(n)
            },
        )
        .await
        .unwrap();
        let backup = dir.join("site.ctrlbak");
        let out = ctrl
            .ok(&["backup", "--out", &backup.display().to_string()])
            .await
            .unwrap();
        assert!(out.contains("wrote"), "{out}");
        stop.store(true, Ordering::Relaxed);
        load.await.unwrap();
        let regions_written = written.load(Ordering::Relaxed);
        // A deployment after the backup: krane's cursor moves past it.
        let lost = operator.create(deployment("env_lost")).await.unwrap();
        wait_until(
            Instant::now() + STEP_TIMEOUT,
            "krane to apply the later deployment",
            async || applied(&sim, &lost).then_some(()).ok_or("not yet"),
        )
        .await
        .unwrap();

        // Offline verification prints the state's hash and counts.
        let verified = ctrl
            .ok(&["backup", "verify", &backup.display().to_string()])
            .await
            .unwrap();
        assert!(verified.trim_end().ends_with("ok"), "{verified}");
        let hash = field(&verified, "state hash ");
        let regions: u64 = field(&verified, "regions:").parse().unwrap();
        assert!(
            (WRITES_BEFORE_BACKUP + initial_regions..=regions_written + initial_regions)
                .contains(&regions),
            "{regions} regions in the backup, {regions_written} written after {initial_regions}"
        );
        let cluster_line = field(&verified, "cluster ");
        let backup_pk: u64 = field(&verified, "last pk ").parse().unwrap();
        // The object in the cluster comes before krane stores its cursor:
        // kill it once the cursor it stored is past the backup.
        wait_until(
            Instant::now() + STEP_TIMEOUT,
            "krane to store a cursor past the backup",
            async || {
                let text = integration::scrape::get(krane_metrics, "/metrics")
                    .await
                    .map_err(|e| e.to_string())?;
                let cursor = integration::scrape::gauge(&text, "krane_cursor_pk");
                (cursor.is_some_and(|c| c > backup_pk as f64))
                    .then_some(())
                    .ok_or(format!("cursor {cursor:?}"))
            },
        )
        .await
        .unwrap();
        agent.kill();
        let stored = krane::state(krane_bin, &krane_data).await.unwrap();
        let cursor_before = stored["cursor"].as_u64().expect("a cursor");
        let syncs_before = stored["full_syncs"].as_u64().expect("a full-sync count");
        assert!(
            cursor_before > backup_pk,
            "krane's cursor {cursor_before} is ahead of the backup's last pk {backup_pk}"
        );

        // Damaged and truncated copies are refused, naming the problem.
        let bytes = std::fs::read(&backup).unwrap();
        let mut flipped = bytes.clone();
        let middle = bytes.len() / 2;
        flipped[middle] ^= 0x20;
        let damaged = dir.join("damaged.ctrlbak");
        std::fs::write(&damaged, &flipped).unwrap();
        let truncated = dir.join("truncated.ctrlbak");
        std::fs::write(&truncated, &bytes[..bytes.len() - 100]).unwrap();
        for (file, expected) in [(&damaged, "checksum mismatch"), (&truncated, "truncated")] {
            let file = file.display().to_string();
            let verify = ctrl.run(&["backup", "verify", &file]).await.unwrap();
            let stderr = String::from_utf8_lossy(&verify.stderr);
            assert!(
                !verify.status.success() && stderr.contains(expected),
                "{stderr}"
            );
            let target = dir.join("refused").display().to_string();
            let restore = ctrl
                .run(&[
                    "restore",
                    &file,
                    "--data-dir",
                    &target,
                    "--node-id",
                    "1",
                    "--members",
                    "1=127.0.0.1:1",
                ])
                .await
                .unwrap();
            let stderr = String::from_utf8_lossy(&restore.stderr);
            assert!(
                !restore.status.success() && stderr.contains(expected),
                "{stderr}"
            );
            assert!(!dir.join("refused").exists(), "nothing written");
        }

        // Restore onto three fresh data directories on other ports.
        let addrs: Vec<SocketAddr> = (0..3).map(|_| free_addr()).collect();
        let members = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let dry = ctrl
            .ok(&[
                "restore",
                &backup.display().to_string(),
                "--data-dir",
                &dir.join("restored-1").display().to_string(),
                "--node-id",
                "1",
                "--members",
                &members,
                "--dry-run",
            ])
            .await
            .unwrap();
        assert!(dry.contains("dry run: nothing written"), "{dry}");
        assert!(!dir.join("restored-1").exists());
        let mut configs = Vec::new();
        for (i, addr) in addrs.iter().enumerate() {
            let id = u64::try_from(i + 1).unwrap();
            let data_dir = dir.join(format!("restored-{id}"));
            ctrl.ok(&[
                "restore",
                &backup.display().to_string(),
                "--data-dir",
                &data_dir.display().to_string(),
                "--node-id",
                &id.to_string(),
                "--members",
                &members,
            ])
            .await
            .unwrap();
            let mut config = source.configs[i].clone();
            config.data_dir = data_dir;
            config.listen_addr = *addr;
            config.advertise_addr = None;
            config.metrics_addr = None;
            config.peers = addrs
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(j, a)| PeerConfig {
                    node_id: u64::try_from(j + 1).unwrap(),
                    addr: *a,
                })
                .collect();
            configs.push(config);
        }
        // A restore never writes over a data directory.
        let again = ctrl
            .run(&[
                "restore",
                &backup.display().to_string(),
                "--data-dir",
                &configs[0].data_dir.display().to_string(),
                "--node-id",
                "1",
                "--members",
                &members,
            ])
            .await
            .unwrap();
        assert!(String::from_utf8_lossy(&again.stderr).contains("not empty"));
        // The source stops; its directory (the certificates) stays.
        for id in 1..=3 {
            source.stop(id).await.unwrap();
        }

        let mut restored = Vec::new();
        for config in &configs {
            restored.push(node::boot::start(config).await.unwrap());
        }
        let operator = config::OperatorConfig {
            endpoints: addrs.clone(),
            ..config::OperatorConfig::load(&operator_path).unwrap()
        };
        // Every node holds the backup's state.
        for addr in &addrs {
            let single = config::OperatorConfig {
                endpoints: vec![*addr],
                ..operator.clone()
            };
            let client = Client::new(&single).unwrap();
            let got = wait_until(
                Instant::now() + STEP_TIMEOUT,
                "the restored node's state hash",
                async || state_hash(&client).await.map_err(|e| e.to_string()),
            )
            .await
            .unwrap();
            assert_eq!(format!("{:016x}", got.hash), hash, "node {}", got.node_id);
        }
        // The same cluster under a new epoch.
        let restored_path = dir.join("restored-operator.toml");
        std::fs::write(&restored_path, operator.to_toml_string()).unwrap();
        let restored_ctrl = integration::kit::ctrl::with_config(&restored_path)
            .await
            .unwrap();
        let after = dir.join("after.ctrlbak");
        restored_ctrl
            .ok(&["backup", "--out", &after.display().to_string()])
            .await
            .unwrap();
        let after = restored_ctrl
            .ok(&["backup", "verify", &after.display().to_string()])
            .await
            .unwrap();
        let (old_id, old_epoch) = cluster_line.split_once(" epoch ").unwrap();
        let new_line = field(&after, "cluster ");
        let (new_id, new_epoch) = new_line.split_once(" epoch ").unwrap();
        assert_eq!(old_id, new_id);
        assert_ne!(old_epoch, new_epoch);
        // It takes writes, and `cluster check` finds the members identical.
        let client = Client::new(&operator).unwrap();
        integration::kit::operator::Operator::new(&operator)
            .unwrap()
            .add_region("after-restore")
            .await
            .unwrap();
        let check = restored_ctrl.ok(&["cluster", "check"]).await.unwrap();
        assert!(!check.contains("differ"), "{check}");
        drop(client);

        // krane, its cursor ahead of the restored cluster, syncs in full:
        // the deployment the backup never held goes, the other stays, and
        // a deploy made after the restore is applied.
        let _ = write_agent_config(&dir, &sim, &addrs);
        let agent = Krane::start(
            krane_bin,
            &dir.join("krane.toml"),
            &dir.join("krane-restored.log"),
        )
        .unwrap();
        let restored_operator = integration::kit::operator::Operator::new(&operator).unwrap();
        let fresh = restored_operator
            .create(deployment("env_fresh"))
            .await
            .unwrap();
        wait_until(
            Instant::now() + STEP_TIMEOUT,
            "krane to converge on the restored cluster",
            async || {
                let state = (
                    applied(&sim, &kept),
                    applied(&sim, &lost),
                    applied(&sim, &fresh),
                );
                (state == (true, false, true))
                    .then_some(())
                    .ok_or(format!("{state:?}"))
            },
        )
        .await
        .unwrap();
        agent.kill();
        let stored = krane::state(krane_bin, &krane_data).await.unwrap();
        assert_eq!(stored["full_syncs"], syncs_before + 1, "{stored:#}");
        let log = std::fs::read_to_string(dir.join("krane-restored.log")).unwrap();
        assert!(log.contains("the cluster's epoch changed"), "{log}");
        for node in restored {
            node.shutdown().await;
        }
    })
    .await;
}
