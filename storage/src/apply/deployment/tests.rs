//! Tests of `storage/src/apply/deployment`.
use wire::agent::ResourceChange;
use wire::model::{DeploymentStatus, DesiredState, Resource, ResourceType};

use crate::Outcome;
use crate::test_support::*;

#[test]
fn create_writes_one_topology_and_change_row_per_region() {
    let store = store();
    let out = apply_one(&store, 100, create("d1", &["eu", "us"], 3));
    assert_eq!(
        out,
        vec![
            Ok(Outcome::DeploymentCreated {
                deployment_id: "d1".into()
            }),
            Ok(Outcome::Recorded)
        ]
    );
    let view = store.read().unwrap();
    assert_eq!(view.last_pk(), 2);
    let eu = view.topology("d1", "eu").unwrap().unwrap();
    let us = view.topology("d1", "us").unwrap().unwrap();
    assert_eq!((eu.version, us.version), (1, 2));
    assert_eq!((eu.replicas, eu.created_at_ms), (3, 100));
    assert_eq!(eu.k8s_name, "dep-d1");
    assert_eq!(eu.k8s_namespace, "apps");
    let rows = view.changes_after("us", 0, 10).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].0, 2);
    assert_eq!(rows[0].1.resource_type, ResourceType::DeploymentTopology);
    assert_eq!(rows[0].1.created_at_ms, 100);
    assert_eq!(view.raft_meta(), Some(raft_meta(100)));
}

#[test]
fn an_update_rewrites_the_running_topologies_and_refuses_what_the_spec_forbids() {
    use wire::operator::DeploymentUpdate;
    use wire::workload::{HealthCheck, Probe};
    let store = store();
    apply_one(&store, 100, create("d1", &["eu", "us"], 3));
    let before = store.read().unwrap().topology("d1", "eu").unwrap().unwrap();
    let update = DeploymentUpdate {
        replicas: Some(5),
        cpu_millicores: Some(500),
        memory_mib: None,
        health: Some(Some(HealthCheck::new(Probe::Exec {
            command: vec!["true".into()],
        }))),
    };
    let out = apply_one(
        &store,
        200,
        vec![crate::Mutation::UpdateDeployment(
            crate::mutations::UpdateDeployment {
                deployment_id: "d1".into(),
                update: update.clone(),
            },
        )],
    );
    let Ok(Outcome::Deployment(d)) = &out[0] else {
        panic!("{out:?}");
    };
    assert_eq!((d.replicas, d.cpu_millicores, d.memory_mib), (5, 500, 256));
    assert!(d.spec.health.is_some());
    let view = store.read().unwrap();
    for region in ["eu", "us"] {
        let t = view.topology("d1", region).unwrap().unwrap();
        assert_eq!((t.replicas, t.cpu_millicores, t.memory_mib), (5, 500, 256));
        assert_eq!(t.spec.health, d.spec.health);
        assert!(t.version > before.version, "a new change row");
        assert_eq!(t.updated_at_ms, 200);
    }
    assert_eq!(
        view.changes_after("eu", before.version, 10).unwrap().len(),
        1
    );
    drop(view);

    // An HTTP check without a port: refused, nothing written.
    let last = store.read().unwrap().last_pk();
    let bad = DeploymentUpdate {
        health: Some(Some(HealthCheck::new(Probe::Http {
            path: "/healthz".into(),
            port: None,
        }))),
        ..DeploymentUpdate::default()
    };
    let out = apply_one(
        &store,
        300,
        vec![crate::Mutation::UpdateDeployment(
            crate::mutations::UpdateDeployment {
                deployment_id: "d1".into(),
                update: bad,
            },
        )],
    );
    let e = out[0].clone().unwrap_err();
    assert!(e.message.contains("health.port"), "{e}");
    assert_eq!(store.read().unwrap().last_pk(), last);
    for (id, update, code) in [
        ("nope", update.clone(), wire::ErrorCode::NotFound),
        (
            "d1",
            DeploymentUpdate::default(),
            wire::ErrorCode::BadRequest,
        ),
    ] {
        let out = apply_one(
            &store,
            300,
            vec![crate::Mutation::UpdateDeployment(
                crate::mutations::UpdateDeployment {
                    deployment_id: id.into(),
                    update,
                },
            )],
        );
        assert_eq!(out[0].clone().unwrap_err().code, code);
    }
}

/// The start of `id` as a leader decides it: a sentinel of its own
/// minting for each region (`snt-{id}-{region}`).
fn start_with_sentinels(id: &str, regions: &[&str]) -> crate::Mutation {
    let sentinels = regions
        .iter()
        .map(|r| {
            let mut s = sentinel(&format!("snt-{id}-{r}"), r);
            s.environment_id = "env".into();
            s
        })
        .collect();
    start_with(id, sentinels)
}

#[test]
fn two_first_deploys_of_an_environment_make_one_sentinel_per_region() {
    let store = store();
    // Both submitted, then both started in one command, each with the
    // sentinels its leader minted: the second finds the first's.
    apply_one(
        &store,
        1,
        vec![
            submit("d1", &["eu", "us"], 1),
            submit("d2", &["eu", "us"], 1),
        ],
    );
    let out = apply_one(
        &store,
        2,
        vec![
            start_with_sentinels("d1", &["eu", "us"]),
            start_with_sentinels("d2", &["eu", "us"]),
        ],
    );
    assert!(out.iter().all(Result::is_ok), "{out:?}");
    let view = store.read().unwrap();
    for region in ["eu", "us"] {
        let sentinels: Vec<String> = view
            .region_resources(region, None, 100)
            .unwrap()
            .into_iter()
            .filter_map(|r| match r {
                Resource::Sentinel(s) => Some(s.id),
                _ => None,
            })
            .collect();
        assert_eq!(sentinels, [format!("snt-d1-{region}")], "{region}");
    }
}

#[test]
fn a_refused_start_writes_nothing() {
    let store = store();
    apply_one(&store, 1, vec![submit("d1", &["eu", "us"], 1)]);
    let before = store.read().unwrap().state_hash().unwrap();
    let mut start = start_with_sentinels("d1", &["eu", "us"]);
    if let crate::Mutation::Deploy(crate::command::DeployTransition {
        action: crate::command::DeployAction::Start { sentinels, .. },
        ..
    }) = &mut start
    {
        sentinels[1].id.clear();
    }
    let out = apply_one(&store, 2, vec![start]);
    assert!(
        matches!(&out[0], Err(e) if e.code == wire::ErrorCode::BadRequest),
        "{out:?}"
    );
    let view = store.read().unwrap();
    assert_eq!(view.last_pk(), 0, "no change row");
    assert_eq!(view.state_hash().unwrap(), before);
}

#[test]
fn stop_writes_one_change_per_region_with_zero_replicas() {
    let store = store();
    apply_one(&store, 1, create("d1", &["eu", "us", "ap"], 2));
    let stop = set_state("d1", DesiredState::Stopped);
    let out = apply_one(&store, 2, vec![stop.clone()]);
    let Ok(Outcome::Deployment(d)) = &out[0] else {
        panic!("{out:?}")
    };
    // A deployment is standby where its topologies are stopped; a
    // deploy in flight that is stopped is cancelled.
    assert_eq!(d.desired_state, DesiredState::Standby);
    assert_eq!(d.status, DeploymentStatus::Cancelled);
    assert_eq!(d.updated_at_ms, 2);
    let view = store.read().unwrap();
    assert_eq!(view.last_pk(), 6);
    for region in ["eu", "us", "ap"] {
        let rows = view.changes_after(region, 3, 10).unwrap();
        assert_eq!(rows.len(), 1, "{region}");
        let t = view.topology("d1", region).unwrap().unwrap();
        assert_eq!(t.version, rows[0].0);
        assert_eq!((t.replicas, t.desired_state), (0, DesiredState::Stopped));
        // A stopped topology is still streamed as state, not a delete.
        assert!(matches!(
            view.change_event(&rows[0].1).unwrap(),
            ResourceChange::Apply(Resource::DeploymentTopology(_))
        ));
    }
    drop(view);

    // Stopping again: success, no change rows.
    let again = apply_one(&store, 3, vec![stop]);
    assert!(matches!(again[0], Ok(Outcome::Deployment(_))));
    assert_eq!(store.read().unwrap().last_pk(), 6);

    // Running again makes it pending; the workflow's start restores
    // the replicas.
    let out = apply_one(&store, 4, vec![set_state("d1", DesiredState::Running)]);
    let Ok(Outcome::Deployment(d)) = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(d.status, DeploymentStatus::Pending);
    assert_eq!(store.read().unwrap().last_pk(), 6);
    let start = crate::Mutation::Deploy(crate::command::DeployTransition {
        deployment_id: "d1".into(),
        expected: wire::rules::deploy::deploy_guard(d),
        action: crate::command::DeployAction::Start {
            k8s_namespace: "apps".into(),
            sentinels: Vec::new(),
            policies: Vec::new(),
        },
    });
    assert_eq!(
        apply_one(&store, 5, vec![start]),
        vec![Ok(Outcome::Recorded)]
    );
    let view = store.read().unwrap();
    assert_eq!(view.last_pk(), 9);
    let t = view.topology("d1", "us").unwrap().unwrap();
    assert_eq!((t.replicas, t.desired_state), (2, DesiredState::Running));
}
