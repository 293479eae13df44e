//! The workload spec end to end, on a site of one region (ctrl node, the
//! simulator and its krane):
//!
//! - A deployment with a port, a command, an HTTP health check, a stop
//!   signal, a grace period, pod labels and annotations and a secret
//!   becomes ready; the simulated cluster holds the objects krane built
//!   (the Service's port, the probes, the Secret owned by the StatefulSet
//!   and referenced from the container), and kubectl shows them.
//! - The secret value is in the simulated Secret and nowhere else: not
//!   in `ctrl get -o json`, not in the logs (every line at debug, of the
//!   node and krane, which run in this process), not in any byte of the
//!   node's data directory (Raft log, state file), not in a debug bundle.
//! - Readiness gates "running": a pod whose readiness probe fails (the
//!   simulator's `failing_readiness`) never counts as running, and the
//!   deploy fails by its deadline with the reason "readiness probe
//!   failing".
//! - `ctrl scale` / `ctrl update` roll through the StatefulSet; the
//!   Secret is repaired and garbage-collected like the other objects.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use config::NodeConfig;
use integration::fleet::{Fleet, FleetConfig};
use integration::kit::wait::bounded;
use k8s_sim::resources::{SECRETS, SERVICES, STATEFUL_SETS};
use wire::model::DeploymentStatus;
use wire::workload::{HealthCheck, Probe, SecretValue, WorkloadSpec};

const TEST_TIMEOUT: Duration = Duration::from_secs(120);
const WAIT: Duration = Duration::from_secs(30);
const READY_TIMEOUT_S: u64 = 30;
const REGION: &str = "us-east";
const NAMESPACE: &str = "krane";
const SECRET: &str = "pa55-Wörd-4f9c1e77-never-shown";
const UNREADY_IMAGE: &str = "registry.local/unready:1";

/// Every log line of this process (node and krane run in it), at debug.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn configure(config: &mut NodeConfig) {
    // The node has just become leader: deadlines may fire soon after.
    config.deploy.leader_grace_ms = 100;
}

fn spec(secret_file_value: &str) -> WorkloadSpec {
    WorkloadSpec {
        port: Some(8080),
        command: vec!["/app/server".into()],
        args: vec!["--listen".into(), ":8080".into()],
        health: Some(HealthCheck {
            probe: Probe::Http {
                path: "/healthz".into(),
                port: None,
            },
            period_s: 5,
            timeout_s: 2,
            failure_threshold: 3,
        }),
        shutdown_signal: Some("SIGQUIT".into()),
        termination_grace_s: Some(45),
        pod_labels: BTreeMap::from([("team".to_string(), "payments".to_string())]),
        pod_annotations: BTreeMap::from([("prometheus.io/scrape".to_string(), "true".to_string())]),
        secret_env: BTreeMap::from([(
            "DATABASE_URL".to_string(),
            SecretValue::Plain(secret_file_value.to_string()),
        )]),
    }
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Every file under `dir` that holds `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path)
                && bytes.windows(needle.len()).any(|w| w == needle)
            {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_spec_is_built_and_its_secret_shows_only_in_the_cluster() {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish(),
    )
    .expect("the one subscriber of this test binary");
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let mut config = FleetConfig::new(dir.path(), vec![REGION.into()]);
        config.failing_readiness = vec![UNREADY_IMAGE.into()];
        config.configure_node = configure;
        let fleet = Fleet::start(config).await.expect("the site starts");
        let operator = fleet.operator().unwrap();

        let request = integration::requests::deployment([REGION])
            .own_environment()
            .image("registry.local/app:1")
            .replicas(2)
            .env_var("GREETING", "hello")
            .spec(spec(SECRET))
            .build();
        let id = operator.create(request).await.expect("created");
        let view = operator
            .ready(&id, READY_TIMEOUT_S)
            .await
            .unwrap_or_else(|e| panic!("{id} not ready: {e}"));
        assert_eq!(view.deployment.status, DeploymentStatus::Ready);

        // The objects, as the simulated cluster holds them.
        let name = wire::k8s_name::deployment(&id);
        let sim = &fleet.region(REGION).sim;
        let service = sim.get(&SERVICES, NAMESPACE, &name).expect("service");
        assert_eq!(service["spec"]["ports"][0]["port"], 8080);
        assert_eq!(service["spec"]["ports"][0]["targetPort"], 8080);
        let sts = sim.get(&STATEFUL_SETS, NAMESPACE, &name).expect("sts");
        let template = &sts["spec"]["template"];
        let container = &template["spec"]["containers"][0];
        assert_eq!(container["ports"][0]["containerPort"], 8080);
        assert_eq!(container["command"][0], "/app/server");
        assert_eq!(container["args"][1], ":8080");
        for probe in ["readinessProbe", "livenessProbe"] {
            assert_eq!(container[probe]["httpGet"]["path"], "/healthz");
            assert_eq!(container[probe]["httpGet"]["port"], 8080);
            assert_eq!(container[probe]["periodSeconds"], 5);
        }
        assert_eq!(container["lifecycle"]["stopSignal"], "SIGQUIT");
        assert_eq!(template["spec"]["terminationGracePeriodSeconds"], 45);
        assert_eq!(template["metadata"]["labels"]["team"], "payments");
        assert_eq!(
            template["metadata"]["annotations"]["prometheus.io/scrape"],
            "true"
        );
        let reference = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "DATABASE_URL")
            .expect("the secret's variable")
            .clone();
        assert!(reference.get("value").is_none(), "{reference}");
        assert_eq!(
            reference["valueFrom"]["secretKeyRef"]["name"],
            name.as_str()
        );
        let secret = sim.get(&SECRETS, NAMESPACE, &name).expect("secret");
        assert_eq!(
            secret["data"]["DATABASE_URL"],
            base64(SECRET.as_bytes()),
            "the value is in the cluster's Secret"
        );
        let owner = &secret["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "StatefulSet");
        assert_eq!(owner["uid"], sts["metadata"]["uid"]);

        // kubectl shows them.
        let kubectl = fleet.region(REGION).kubectl();
        let shown = kubectl
            .ok(&["get", "statefulset", &name, "-n", NAMESPACE, "-o", "json"])
            .await
            .expect("kubectl get statefulset");
        assert!(shown.contains("\"stopSignal\": \"SIGQUIT\""), "{shown}");
        assert!(shown.contains("\"secretKeyRef\""), "{shown}");
        let shown = kubectl
            .ok(&[
                "get",
                "secret",
                &name,
                "-n",
                NAMESPACE,
                "-o",
                "jsonpath={.data.DATABASE_URL}",
            ])
            .await
            .expect("kubectl get secret");
        assert_eq!(shown.trim(), base64(SECRET.as_bytes()));
        let shown = kubectl
            .ok(&[
                "get",
                "service",
                &name,
                "-n",
                NAMESPACE,
                "-o",
                "jsonpath={.spec.ports[0].port}",
            ])
            .await
            .expect("kubectl get service");
        assert_eq!(shown.trim(), "8080");

        // Nowhere else.
        let ctrl = integration::kit::ctrl::with_config(&fleet.operator_path)
            .await
            .unwrap();
        let json = ctrl
            .ok(&["get", "deployment", &id, "-o", "json"])
            .await
            .expect("ctrl get");
        assert!(!json.contains(SECRET), "{json}");
        assert!(json.contains("DATABASE_URL"), "the name is shown: {json}");
        let bundle = dir.path().join("bundle.tar.gz");
        ctrl.ok(&["debug", "bundle", "--out", bundle.to_str().unwrap()])
            .await
            .expect("debug bundle");
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(
            std::fs::File::open(&bundle).unwrap(),
        ));
        let mut bundled = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            std::io::Read::read_to_end(&mut entry, &mut bundled).unwrap();
        }
        assert!(!bundled.is_empty());
        assert!(
            !bundled
                .windows(SECRET.len())
                .any(|w| w == SECRET.as_bytes()),
            "the debug bundle holds the secret"
        );
        let data_dir = dir.path().join("ctrl-1");
        let holding = files_holding(&data_dir, b"DATABASE_URL");
        assert!(
            !holding.is_empty(),
            "the Raft log (written durably) holds the variable's name: {holding:?}"
        );
        assert_eq!(
            files_holding(&data_dir, SECRET.as_bytes()),
            Vec::<String>::new(),
            "no file of the node holds the value"
        );
        let logged = logs.0.lock().unwrap().clone();
        assert!(
            String::from_utf8_lossy(&logged).contains("DEBUG"),
            "debug lines were captured"
        );
        assert!(
            !logged.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
            "a log line holds the secret"
        );

        // The readiness gate.
        let request = integration::requests::deployment([REGION])
            .own_environment()
            .image(UNREADY_IMAGE)
            .replicas(1)
            .progress_deadline_ms(2_000)
            .spec(WorkloadSpec {
                secret_env: BTreeMap::new(),
                ..spec("")
            })
            .build();
        let id = operator.create(request).await.expect("created");
        let e = operator
            .ready(&id, READY_TIMEOUT_S)
            .await
            .expect_err("never ready");
        let view = operator.deployment(&id).await.unwrap();
        assert_eq!(view.deployment.status, DeploymentStatus::Failed, "{e}");
        let reason = view.deployment.workflow.reason.unwrap_or_default();
        assert!(reason.contains("readiness probe failing"), "{reason}");
        assert!(
            view.instances
                .iter()
                .all(|i| i.status == wire::model::InstanceStatus::Pending),
            "{:?}",
            view.instances
        );
        let name = wire::k8s_name::deployment(&id);
        sim.wait_until(WAIT, |v| {
            v.pods(NAMESPACE, &format!("unkey.com/deployment.id={id}"))
                .iter()
                .all(|p| p["status"]["phase"] == "Running" && !k8s_sim::pod_ready(p))
        })
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        fleet.shutdown().await.unwrap();
    })
    .await;
}

/// `ctrl scale` and `ctrl update` on a running deployment: the
/// StatefulSet scales, then rolls a new size and health check out (its
/// template changes; scaling alone leaves the pods as they are), and the
/// instance reports say how far the rollout got (updated / running).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_and_update_roll_through_the_stateful_set() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let config = FleetConfig::new(dir.path(), vec![REGION.into()]);
        let fleet = Fleet::start(config).await.expect("the site starts");
        let operator = fleet.operator().unwrap();
        let request = integration::requests::deployment([REGION])
            .own_environment()
            .image("registry.local/app:2")
            .replicas(1)
            .spec(WorkloadSpec {
                port: Some(8080),
                ..WorkloadSpec::default()
            })
            .build();
        let id = operator.create(request).await.expect("created");
        operator
            .ready(&id, READY_TIMEOUT_S)
            .await
            .unwrap_or_else(|e| panic!("{id} not ready: {e}"));
        let name = wire::k8s_name::deployment(&id);
        let selector = format!("unkey.com/deployment.id={id}");
        let sim = &fleet.region(REGION).sim;
        let first_pod_uid = |v: &k8s_sim::View<'_>| {
            v.pods(NAMESPACE, &selector)
                .iter()
                .find(|p| p["metadata"]["name"] == format!("{name}-0").as_str())
                .map(|p| p["metadata"]["uid"].clone())
        };
        let uid = sim.inspect(|v| first_pod_uid(v)).expect("pod 0");
        let ctrl = integration::kit::ctrl::with_config(&fleet.operator_path)
            .await
            .unwrap();

        ctrl.ok(&["scale", &id, "--replicas", "3"])
            .await
            .expect("ctrl scale");
        let all_three = |view: &wire::operator::DeploymentView| {
            view.deployment.replicas == 3
                && view.instances.len() == 3
                && view
                    .instances
                    .iter()
                    .all(|i| i.status == wire::model::InstanceStatus::Running && i.updated)
        };
        operator
            .wait_deployment(
                &id,
                tokio::time::Instant::now() + WAIT,
                "3 replicas",
                all_three,
            )
            .await
            .expect("scaled");
        assert_eq!(
            sim.inspect(|v| first_pod_uid(v)),
            Some(uid.clone()),
            "scaling rolls no pod"
        );

        ctrl.ok(&[
            "update",
            &id,
            "--cpu-millicores",
            "300",
            "--health-http",
            "/ready",
        ])
        .await
        .expect("ctrl update");
        sim.wait_until(WAIT, |v| {
            let Some(sts) = v.get(&STATEFUL_SETS, NAMESPACE, &name) else {
                return false;
            };
            let container = &sts["spec"]["template"]["spec"]["containers"][0];
            container["resources"]["limits"]["cpu"] == "300m"
                && container["readinessProbe"]["httpGet"]["path"] == "/ready"
                && sts["status"]["updatedReplicas"] == 3
                && first_pod_uid(v).is_some_and(|u| u != uid)
        })
        .await
        .expect("rolled out");
        let view = operator
            .wait_deployment(
                &id,
                tokio::time::Instant::now() + WAIT,
                "rolled out",
                |view| all_three(view) && view.instances.iter().all(|i| i.cpu_millicores == 300),
            )
            .await
            .expect("reported rolled out");
        assert_eq!(view.deployment.cpu_millicores, 300);
        assert_eq!(view.deployment.status, DeploymentStatus::Ready);
        let text = ctrl.ok(&["get", "deployment", &id]).await.unwrap();
        assert!(text.contains("started, 3/3 running, 3/3 updated"), "{text}");
        assert!(text.contains("health:      http /ready"), "{text}");

        // An update the spec does not allow is refused, naming the field.
        let out = ctrl
            .run(&["update", &id, "--health-http", "no-slash"])
            .await
            .unwrap();
        assert!(!out.status.success());
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains("health.path"), "{said}");
        fleet.shutdown().await.unwrap();
    })
    .await;
}

/// A leftover managed Secret of a deployment krane no longer knows (as
/// after a wiped data directory).
const LEFTOVER_SECRET: &str = r#"
apiVersion: v1
kind: Secret
metadata:
  name: dep-gone
  namespace: krane
  labels:
    app.kubernetes.io/managed-by: krane
    unkey.com/deployment.id: dep_gone
type: Opaque
data:
  TOKEN: b2xk
"#;

/// The Secret is repaired like the other objects (deleted or changed by
/// hand, krane applies it again from its snapshot) and garbage-collected
/// after a full sync when its deployment is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secret_is_repaired_and_collected_like_the_other_objects() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let config = FleetConfig::new(dir.path(), vec![REGION.into()]).fast();
        let mut fleet = Fleet::start(config).await.expect("the site starts");
        let operator = fleet.operator().unwrap();
        let request = integration::requests::deployment([REGION])
            .own_environment()
            .spec(WorkloadSpec {
                secret_env: BTreeMap::from([(
                    "TOKEN".to_string(),
                    SecretValue::Plain("t0k3n".into()),
                )]),
                ..WorkloadSpec::default()
            })
            .build();
        let id = operator.create(request).await.expect("created");
        operator
            .ready(&id, READY_TIMEOUT_S)
            .await
            .unwrap_or_else(|e| panic!("{id} not ready: {e}"));
        let name = wire::k8s_name::deployment(&id);
        let want = base64(b"t0k3n");
        let region = fleet.region(REGION);
        let kubectl = region.kubectl();

        // Deleted by hand: applied again.
        kubectl
            .ok(&["delete", "secret", &name, "-n", NAMESPACE])
            .await
            .expect("kubectl delete secret");
        region
            .sim
            .wait_until(WAIT, |v| {
                v.get(&SECRETS, NAMESPACE, &name)
                    .is_some_and(|s| s["data"]["TOKEN"] == want.as_str())
            })
            .await
            .expect("the deleted Secret is back");
        // Changed by hand: changed back.
        kubectl
            .ok(&[
                "patch",
                "secret",
                &name,
                "-n",
                NAMESPACE,
                "--type=merge",
                "-p",
                r#"{"data":{"TOKEN":"aGFja2Vk"}}"#,
            ])
            .await
            .expect("kubectl patch secret");
        region
            .sim
            .wait_until(WAIT, |v| {
                v.get(&SECRETS, NAMESPACE, &name)
                    .is_some_and(|s| s["data"]["TOKEN"] == want.as_str())
            })
            .await
            .expect("the changed Secret is repaired");

        // A wiped state and a leftover Secret: the full sync collects it.
        let region = fleet.region_mut(REGION);
        region.stop_krane().await.unwrap();
        std::fs::remove_dir_all(&region.agent.data_dir).unwrap();
        region
            .kubectl()
            .ok_with_stdin(&["apply", "-f", "-"], LEFTOVER_SECRET)
            .await
            .expect("a leftover");
        region.start_krane();
        let region = fleet.region(REGION);
        region
            .wait_krane(WAIT, |s| s.full_syncs == 1 && s.cursor > 0)
            .await
            .unwrap();
        region
            .sim
            .wait_until(WAIT, |v| v.get(&SECRETS, NAMESPACE, "dep-gone").is_none())
            .await
            .expect("the leftover Secret is collected");
        assert!(
            region.sim.get(&SECRETS, NAMESPACE, &name).is_some(),
            "the live deployment's Secret stays"
        );

        // Stopped: the Secret goes with the StatefulSet.
        operator.stop(&id).await.expect("stopped");
        region
            .sim
            .wait_until(WAIT, |v| {
                v.get(&SECRETS, NAMESPACE, &name).is_none()
                    && v.get(&STATEFUL_SETS, NAMESPACE, &name).is_none()
            })
            .await
            .expect("the Secret is deleted with its deployment");
        fleet.shutdown().await.unwrap();
    })
    .await;
}
