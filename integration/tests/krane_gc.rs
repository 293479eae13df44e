//! Garbage collection after a full sync, against objects left over from an
//! earlier life: created with the real kubectl (`/usr/bin/kubectl`, or
//! `$KUBECTL`) while krane is stopped with a wiped data directory, some
//! labelled managed-by krane (for a deployment and a sentinel ctrl does not
//! know), some not. On start krane full-syncs and deletes exactly the
//! managed stale ones; the current deployment, the unlabelled objects and a
//! managed object without an owner label are left alone.

use std::time::Duration;

use integration::fleet::{Fleet, FleetConfig};
use integration::kit::wait::bounded;
use k8s_sim::resources::{SERVICES, STATEFUL_SETS};

const TEST_TIMEOUT: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(20);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_sync_deletes_exactly_the_managed_stale_objects() {
    bounded(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let config = FleetConfig::new(dir.path(), vec![REGION.into()]).fast();
        let mut fleet = Fleet::start(config).await.unwrap();
        let operator = fleet.operator().unwrap();
        let id = operator
            .create(integration::requests::deployment([REGION]).build())
            .await
            .unwrap();
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
        region
            .kubectl()
            .ok_with_stdin(&["apply", "-f", "-"], LEFTOVERS)
            .await
            .unwrap();
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
        let listed = region
            .kubectl()
            .ok(&["get", "statefulsets", "-n", "krane", "-o", "name"])
            .await
            .unwrap();
        let mut names: Vec<&str> = listed.lines().collect();
        names.sort();
        let expected = format!("statefulset.apps/{current}");
        let mut expected = vec![expected.as_str(), "statefulset.apps/hand-made"];
        expected.sort();
        assert_eq!(names, expected);
        fleet.shutdown().await.unwrap();
    })
    .await;
}
