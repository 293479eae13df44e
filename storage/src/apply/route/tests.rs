//! Routes follow the live deployment, in the apply that changes it, and
//! never point at a deployment with no running instance in the region.

use wire::model::{DeploymentStatus, Route};

use crate::Mutation;
use crate::command::{DeployAction, DeployTransition, Outcome};
use crate::test_support::{apply_one, deployment, running, set_state, store};
use crate::{Guard, Store};

/// A deployment of environment `env` in `regions` with port 8080.
fn routable(id: &str, regions: &[&str]) -> Mutation {
    let mut d = deployment(id, regions, 1);
    d.spec.port = Some(8080);
    Mutation::CreateDeployment(crate::mutations::CreateDeployment { deployment: d })
}

fn step(id: &str, step: &str, revision: u64, action: DeployAction) -> Mutation {
    Mutation::Deploy(DeployTransition {
        deployment_id: id.into(),
        expected: Guard {
            step: step.into(),
            revision,
        },
        action,
    })
}

fn start(id: &str) -> Mutation {
    step(
        id,
        "pending",
        1,
        DeployAction::Start {
            k8s_namespace: "apps".into(),
            sentinels: Vec::new(),
            policies: Vec::new(),
        },
    )
}

fn advance(id: &str, from: &str, revision: u64, to: DeploymentStatus) -> Mutation {
    step(
        id,
        from,
        revision,
        DeployAction::Advance {
            to,
            reason: "test".into(),
        },
    )
}

fn report(id: &str, region: &str, n: usize) -> Mutation {
    Mutation::ReportInstances(crate::mutations::ReportInstances {
        deployment_id: id.into(),
        region: region.into(),
        instances: running(id, region, n),
    })
}

/// Created, started, instances reported in `running_in`, to `network`.
fn to_network(store: &Store, now_ms: u64, id: &str, regions: &[&str], running_in: &[&str]) {
    let mut batch = vec![routable(id, regions), start(id)];
    batch.extend(running_in.iter().map(|r| report(id, r, 1)));
    batch.push(advance(id, "deploying", 2, DeploymentStatus::Network));
    let out = apply_one(store, now_ms, batch);
    assert!(out.iter().all(Result::is_ok), "{out:?}");
}

/// From `network` to ready (and live).
fn finalize(store: &Store, now_ms: u64, id: &str) {
    let out = apply_one(
        store,
        now_ms,
        vec![
            advance(id, "network", 3, DeploymentStatus::Finalizing),
            step(
                id,
                "finalizing",
                4,
                DeployAction::Finalize {
                    standby_replaced_at_ms: now_ms + 1_000,
                },
            ),
        ],
    );
    assert!(out.iter().all(|o| *o == Ok(Outcome::Recorded)), "{out:?}");
}

fn route(store: &Store, region: &str) -> Option<Route> {
    store
        .read()
        .unwrap()
        .environment_route("env", region)
        .unwrap()
}

fn routed(store: &Store, region: &str) -> Vec<String> {
    route(store, region)
        .map(|r| r.backends.into_iter().map(|b| b.deployment_id).collect())
        .unwrap_or_default()
}

#[test]
fn a_first_deploy_is_routed_at_its_network_step_and_stays_when_live() {
    let store = store();
    to_network(&store, 10, "d1", &["eu"], &["eu"]);
    let at_network = route(&store, "eu").expect("a route");
    assert_eq!(routed(&store, "eu"), ["d1"]);
    assert_eq!(at_network.backends[0].port, 8080);
    assert_eq!(
        at_network.k8s_name,
        format!("{}-routes", at_network.sentinel_k8s_name)
    );
    finalize(&store, 20, "d1");
    assert_eq!(
        route(&store, "eu").unwrap().version,
        at_network.version,
        "made live, nothing to change: no new version"
    );
}

#[test]
fn a_new_live_deployment_takes_the_route_in_the_apply_that_makes_it_live() {
    let store = store();
    to_network(&store, 10, "d1", &["eu"], &["eu"]);
    finalize(&store, 20, "d1");
    to_network(&store, 30, "d2", &["eu"], &["eu"]);
    assert_eq!(routed(&store, "eu"), ["d1"], "d2 is not live yet");
    finalize(&store, 40, "d2");
    let r = route(&store, "eu").unwrap();
    assert_eq!(routed(&store, "eu"), ["d2"]);
    assert_eq!(r.updated_at_ms, 40);
    // A forced stop of the live one: nothing takes the traffic.
    apply_one(
        &store,
        50,
        vec![set_state("d2", wire::model::DesiredState::Standby)],
    );
    assert!(routed(&store, "eu").is_empty());
    assert_eq!(route(&store, "eu").unwrap().pending_deployment_id, None);
}

#[test]
fn a_region_where_the_live_deployment_runs_nowhere_waits_for_its_instances() {
    let store = store();
    to_network(&store, 10, "d1", &["eu", "us"], &["eu", "us"]);
    finalize(&store, 20, "d1");
    // d2 runs in eu only when it goes live (min ready regions aside).
    to_network(&store, 30, "d2", &["eu", "us"], &["eu"]);
    finalize(&store, 40, "d2");
    assert_eq!(routed(&store, "eu"), ["d2"]);
    let us = route(&store, "us").unwrap();
    assert_eq!(
        routed(&store, "us"),
        ["d1"],
        "never a deployment with no instance there"
    );
    assert_eq!(us.pending_deployment_id.as_deref(), Some("d2"));
    // A report without a running instance changes nothing.
    let mut pending = running("d2", "us", 1);
    pending[0].status = wire::model::InstanceStatus::Pending;
    apply_one(
        &store,
        50,
        vec![Mutation::ReportInstances(
            crate::mutations::ReportInstances {
                deployment_id: "d2".into(),
                region: "us".into(),
                instances: pending,
            },
        )],
    );
    assert_eq!(route(&store, "us").unwrap().version, us.version);
    // The report that shows it running flips the route, in its apply.
    apply_one(&store, 60, vec![report("d2", "us", 1)]);
    let flipped = route(&store, "us").unwrap();
    assert_eq!(routed(&store, "us"), ["d2"]);
    assert_eq!(flipped.pending_deployment_id, None);
    assert_eq!(flipped.updated_at_ms, 60);
}

#[test]
fn a_deployment_without_a_port_is_never_routed() {
    let store = store();
    to_network(&store, 10, "d1", &["eu"], &["eu"]);
    finalize(&store, 20, "d1");
    let before = route(&store, "eu").unwrap();
    let mut portless = deployment("d2", &["eu"], 1);
    portless.spec.port = None;
    let out = apply_one(
        &store,
        30,
        vec![
            Mutation::CreateDeployment(crate::mutations::CreateDeployment {
                deployment: portless,
            }),
            start("d2"),
            report("d2", "eu", 1),
            advance("d2", "deploying", 2, DeploymentStatus::Network),
        ],
    );
    assert!(out.iter().all(Result::is_ok), "{out:?}");
    finalize(&store, 40, "d2");
    assert_eq!(
        route(&store, "eu").unwrap(),
        before,
        "the route stays on d1"
    );
}

/// krane's report that route `id`'s sentinel serves `version`.
fn served(id: &str, region: &str, version: u64, at_ms: u64) -> Mutation {
    Mutation::ReportApply(wire::model::ApplyReport {
        key: wire::model::ResourceKey {
            resource_type: wire::model::ResourceType::Route,
            resource_id: id.into(),
            region: region.into(),
        },
        version,
        outcome: wire::model::ApplyOutcome::Applied,
        at_ms,
    })
}

#[test]
fn the_generation_a_sentinel_serves_is_recorded_once_and_never_ahead_of_the_route() {
    let store = store();
    to_network(&store, 10, "d1", &["eu"], &["eu"]);
    let r = route(&store, "eu").expect("a route");
    let key = wire::model::ResourceKey {
        resource_type: wire::model::ResourceType::Route,
        resource_id: r.id.clone(),
        region: "eu".into(),
    };
    // A version the route never had is refused.
    let ahead = apply_one(&store, 11, vec![served(&r.id, "eu", r.version + 1, 11)]);
    assert!(ahead[0].is_err(), "{ahead:?}");
    let out = apply_one(&store, 12, vec![served(&r.id, "eu", r.version, 12)]);
    assert_eq!(out, vec![Ok(Outcome::Recorded)]);
    let report = store.read().unwrap().apply_report(&key).unwrap().unwrap();
    assert_eq!((report.version, report.at_ms), (r.version, 12));
    // The same again changes nothing (a krane restart reports again).
    apply_one(&store, 13, vec![served(&r.id, "eu", r.version, 13)]);
    let again = store.read().unwrap().apply_report(&key).unwrap().unwrap();
    assert_eq!(again.at_ms, 12);
    // A route of another region is unknown.
    let other = apply_one(&store, 14, vec![served(&r.id, "us", r.version, 14)]);
    assert!(other[0].is_err(), "{other:?}");
}
