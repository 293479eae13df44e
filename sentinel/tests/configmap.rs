//! The ConfigMap source against the project's Kubernetes API simulator:
//! the sentinel watches its routes ConfigMap through kube-rs, serves the
//! document in it, picks up a changed document without a restart, and
//! keeps serving when the ConfigMap is deleted or holds a refused
//! document.

#[path = "support/mod.rs"]
mod support;

use std::collections::BTreeMap;

use hyper::StatusCode;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_sim::{SimConfig, Simulator};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use sentinel::{RoutesSource, start};
use support::*;
use wire::routes::{ROUTES_CONFIGMAP_KEY, RoutesDocument};

const NAMESPACE: &str = "sentinel";

fn configmap(name: &str, document: &str, resource_version: Option<String>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(NAMESPACE.to_string()),
            resource_version,
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            ROUTES_CONFIGMAP_KEY.to_string(),
            document.to_string(),
        )])),
        ..ConfigMap::default()
    }
}

async fn replace(api: &Api<ConfigMap>, name: &str, document: &RoutesDocument) {
    replace_text(api, name, &document.to_json()).await;
}

async fn replace_text(api: &Api<ConfigMap>, name: &str, text: &str) {
    let current = api.get(name).await.expect("the ConfigMap");
    api.replace(
        name,
        &PostParams::default(),
        &configmap(name, text, current.metadata.resource_version),
    )
    .await
    .expect("replace the ConfigMap");
}

#[tokio::test]
async fn a_changed_configmap_is_served_without_a_restart() {
    bounded(async {
        let sim = Simulator::start(SimConfig::default()).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        sim.write_kubeconfig(&kubeconfig).unwrap();
        let client = {
            let file = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
            let config = kube::Config::from_custom_kubeconfig(
                file,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .unwrap();
            kube::Client::try_from(config).unwrap()
        };
        let api: Api<ConfigMap> = Api::namespaced(client, NAMESPACE);
        let name = wire::k8s_name::sentinel_routes(&wire::k8s_name::sentinel("prod-eu"));
        let a = Upstream::start("a").await;
        let b = Upstream::start("b").await;
        // A neighbour the field selector leaves out.
        api.create(
            &PostParams::default(),
            &configmap(
                "other-routes",
                &document(99, &[("dx", 1, &[b.addr])]).to_json(),
                None,
            ),
        )
        .await
        .unwrap();
        api.create(
            &PostParams::default(),
            &configmap(&name, &document(1, &[("d1", 1, &[a.addr])]).to_json(), None),
        )
        .await
        .unwrap();

        let sentinel = start(config(RoutesSource::ConfigMap {
            namespace: NAMESPACE.into(),
            name: name.clone(),
            kubeconfig: Some(kubeconfig.clone()),
        }))
        .await
        .unwrap();
        let routes = sentinel.routes().clone();
        routes.wait_until(|r| r.generation() == Some(1)).await;
        assert_eq!(
            get(sentinel.addr(), "/").await,
            (StatusCode::OK, "a".into())
        );

        replace(&api, &name, &document(2, &[("d2", 1, &[b.addr])])).await;
        routes.wait_until(|r| r.generation() == Some(2)).await;
        for _ in 0..3 {
            assert_eq!(
                get(sentinel.addr(), "/").await,
                (StatusCode::OK, "b".into())
            );
        }

        // A refused document and a deleted ConfigMap change nothing.
        replace_text(&api, &name, "{ not json").await;
        routes
            .wait_until(|r| r.metrics().refused_count("malformed") == 1)
            .await;
        api.delete(&name, &DeleteParams::default()).await.unwrap();
        assert_eq!(
            get(sentinel.addr(), "/").await,
            (StatusCode::OK, "b".into())
        );
        assert_eq!(routes.generation(), Some(2));

        // Created again, it is served again.
        api.create(
            &PostParams::default(),
            &configmap(&name, &document(3, &[("d1", 1, &[a.addr])]).to_json(), None),
        )
        .await
        .unwrap();
        routes.wait_until(|r| r.generation() == Some(3)).await;
        assert_eq!(
            get(sentinel.addr(), "/").await,
            (StatusCode::OK, "a".into())
        );
        sentinel.shutdown().await;
        sim.shutdown().await;
    })
    .await;
}
