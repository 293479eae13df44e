//! Garbage collection after a full sync, against objects left over from an
//! earlier life: created with the real kubectl (`/usr/bin/kubectl`, or
//! `$KUBECTL`) while krane is stopped with a wiped data directory, some
//! labelled managed-by krane (for a deployment and a sentinel ctrl does not
//! know), some not. On start krane full-syncs and deletes exactly the
//! managed stale ones; the current deployment, the unlabelled objects and a
//! managed object without an owner label are left alone.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use integration::fleet::{Fleet, FleetConfig};
use k8s_sim::resources::{SERVICES, STATEFUL_SETS};
use tokio::io::AsyncWriteExt;
use wire::operator::OperatorResponse;

const TEST_TIMEOUT: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(20);
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(30);
const REGION: &str = "us-east";

const LEFTOVERS: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: sentinel
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: dep-old
  namespace: krane
  labels:
    app.kubernetes.io/managed-by: krane
    unkey.com/deployment.id: dep_old
spec:
  replicas: 1
  serviceName: dep-old
  selector:
    matchLabels:
      unkey.com/deployment.id: dep_old
  template:
    metadata:
      labels:
        unkey.com/deployment.id: dep_old
    spec:
      containers:
        - name: app
          image: nginx:1.25
---
apiVersion: v1
kind: Service
metadata:
  name: snt-old
  namespace: sentinel
  labels:
    app.kubernetes.io/managed-by: krane
    unkey.com/sentinel.id: snt_old
spec:
  ports:
    - port: 8040
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: hand-made
  namespace: krane
  labels:
    unkey.com/deployment.id: dep_hand
spec:
  replicas: 1
  serviceName: hand-made
  selector:
    matchLabels:
      app: hand-made
  template:
    metadata:
      labels:
        app: hand-made
    spec:
      containers:
        - name: app
          image: nginx:1.25
---
apiVersion: v1
kind: Service
metadata:
  name: no-owner
  namespace: krane
  labels:
    app.kubernetes.io/managed-by: krane
spec:
  ports:
    - port: 80
"#;

async fn kubectl(kubeconfig: &Path, args: &[&str], stdin: &str) -> String {
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "/usr/bin/kubectl".into());
    let mut child = tokio::process::Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("kubectl not found at {kubectl} (set KUBECTL): {e}"));
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.as_bytes())
        .await
        .expect("stdin written");
    drop(input);
    let output = tokio::time::timeout(KUBECTL_TIMEOUT, child.wait_with_output())
        .await
        .expect("kubectl in time")
        .expect("kubectl ran");
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_sync_deletes_exactly_the_managed_stale_objects() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let mut config = FleetConfig::new(dir.path(), vec![REGION.into()]);
        config.reconnect_backoff_min_ms = 50;
        config.reconnect_backoff_max_ms = 100;
        let mut fleet = Fleet::start(config).await.unwrap();
        let client = fleet.client().unwrap();
        let create = integration::requests::create_deployment([REGION]);
        let OperatorResponse::Created { deployment_id: id } = client.call(&create).await.unwrap()
        else {
            panic!("not created");
        };
        let current = id.replacen("dep_", "dep-", 1);
        let region = fleet.region(REGION);
        region
            .sim
            .wait_until(WAIT, |v| v.get(&STATEFUL_SETS, "krane", &current).is_some())
            .await
            .expect("the current deployment applied");

        // An earlier life: krane's state is gone, objects are left behind.
        let region = fleet.region_mut(REGION);
        region.stop_krane().await.unwrap();
        std::fs::remove_dir_all(&region.agent.data_dir).unwrap();
        kubectl(&region.kubeconfig, &["apply", "-f", "-"], LEFTOVERS).await;
        assert!(region.sim.get(&STATEFUL_SETS, "krane", "dep-old").is_some());

        region.start_krane();
        let region = fleet.region(REGION);
        region
            .wait_krane(WAIT, |s| s.full_syncs == 1 && s.cursor > 0)
            .await
            .unwrap();
        region
            .sim
            .wait_until(WAIT, |v| {
                v.get(&STATEFUL_SETS, "krane", "dep-old").is_none()
                    && v.get(&SERVICES, "sentinel", "snt-old").is_none()
            })
            .await
            .expect("the managed stale objects are deleted");
        // Exactly those: the rest stays.
        assert!(region.sim.get(&STATEFUL_SETS, "krane", &current).is_some());
        assert!(region.sim.get(&SERVICES, "krane", &current).is_some());
        assert!(
            region
                .sim
                .get(&STATEFUL_SETS, "krane", "hand-made")
                .is_some(),
            "not labelled managed-by krane: never touched"
        );
        assert!(
            region.sim.get(&SERVICES, "krane", "no-owner").is_some(),
            "managed but without an owner label: left alone"
        );
        let listed = kubectl(
            &region.kubeconfig,
            &["get", "statefulsets", "-n", "krane", "-o", "name"],
            "",
        )
        .await;
        let mut names: Vec<&str> = listed.lines().collect();
        names.sort();
        let expected = format!("statefulset.apps/{current}");
        let mut expected = vec![expected.as_str(), "statefulset.apps/hand-made"];
        expected.sort();
        assert_eq!(names, expected);
        fleet.shutdown().await.unwrap();
    })
    .await
    .expect("test timed out");
}
