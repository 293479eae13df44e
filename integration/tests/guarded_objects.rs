//! krane's guarded apply and delete (`agent::k8s::apply` / `delete`)
//! against the Kubernetes simulator: an object of the name that lacks
//! the `app.kubernetes.io/managed-by=krane` label is never written —
//! the apply fails with `K8sError::Foreign` (a 409 rejection naming the
//! object) and the delete answers `Outcome::Foreign` — while an object
//! carrying the label is applied and deleted.

use std::collections::BTreeMap;
use std::time::Duration;

use agent::k8s::{self, FOREIGN_CODE, K8sError, MANAGED_BY_LABEL, MANAGED_BY_VALUE, Outcome};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_sim::resources::CONFIG_MAPS;
use k8s_sim::{SimConfig, Simulator};
use kube::Api;
use kube::api::PostParams;

const TEST_TIMEOUT: Duration = Duration::from_secs(60);
const NAMESPACE: &str = "guarded";

/// A ConfigMap `name` holding `value`, with krane's label if `managed`.
fn config_map(name: &str, value: &str, managed: bool) -> ConfigMap {
    let labels = managed
        .then(|| BTreeMap::from([(MANAGED_BY_LABEL.to_string(), MANAGED_BY_VALUE.to_string())]));
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(NAMESPACE.to_string()),
            labels,
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("value".to_string(), value.to_string())])),
        ..ConfigMap::default()
    }
}

/// The `value` key of ConfigMap `name` in the simulator, if it exists.
fn stored_value(sim: &Simulator, name: &str) -> Option<String> {
    let object = sim.get(&CONFIG_MAPS, NAMESPACE, name)?;
    Some(
        object["data"]["value"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

#[tokio::test]
async fn objects_without_the_managed_by_label_are_neither_applied_nor_deleted() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let sim = Simulator::start(SimConfig::default()).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        sim.write_kubeconfig(&kubeconfig).unwrap();
        let client = k8s::client(Some(&kubeconfig)).await.unwrap();
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(NAMESPACE.to_string()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap();
        // Someone else's object, created outside krane.
        Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
            .create(&PostParams::default(), &config_map("theirs", "mine", false))
            .await
            .unwrap();

        // Apply over it: refused for good, as a 409 naming the object.
        let error = k8s::apply(&client, NAMESPACE, &config_map("theirs", "krane's", true))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, K8sError::Foreign { kind: "ConfigMap", namespace, name }
                if namespace == NAMESPACE && name == "theirs"),
            "{error:?}"
        );
        let rejection = error.rejection().expect("a foreign object is a rejection");
        assert_eq!(rejection.code, FOREIGN_CODE);
        assert_eq!(rejection.code, 409);
        assert!(
            rejection.reason.contains("ConfigMap guarded/theirs"),
            "{}",
            rejection.reason
        );
        assert_eq!(stored_value(&sim, "theirs").as_deref(), Some("mine"));
        let labels =
            sim.get(&CONFIG_MAPS, NAMESPACE, "theirs").unwrap()["metadata"]["labels"].clone();
        assert!(labels.get(MANAGED_BY_LABEL).is_none(), "{labels}");

        // Delete it: left alone.
        let outcome = k8s::delete::<ConfigMap>(&client, NAMESPACE, "theirs")
            .await
            .unwrap();
        assert_eq!(outcome, Outcome::Foreign);
        assert_eq!(stored_value(&sim, "theirs").as_deref(), Some("mine"));

        // krane's own object: created, updated, deleted; then absent is done.
        let ours = |value| config_map("ours", value, true);
        let applied = k8s::apply(&client, NAMESPACE, &ours("1")).await.unwrap();
        assert_eq!(applied, Outcome::Done);
        assert_eq!(stored_value(&sim, "ours").as_deref(), Some("1"));
        let applied = k8s::apply(&client, NAMESPACE, &ours("2")).await.unwrap();
        assert_eq!(applied, Outcome::Done);
        assert_eq!(stored_value(&sim, "ours").as_deref(), Some("2"));
        let deleted = k8s::delete::<ConfigMap>(&client, NAMESPACE, "ours")
            .await
            .unwrap();
        assert_eq!(deleted, Outcome::Done);
        assert_eq!(stored_value(&sim, "ours"), None);
        let deleted = k8s::delete::<ConfigMap>(&client, NAMESPACE, "ours")
            .await
            .unwrap();
        assert_eq!(deleted, Outcome::Done);

        sim.shutdown().await;
    })
    .await
    .expect("the test ends within its bound");
}
