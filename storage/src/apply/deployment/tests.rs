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

/// The stored deployment `id`.
fn stored(store: &crate::Store, id: &str) -> wire::model::Deployment {
    store.read().unwrap().deployment(id).unwrap().unwrap()
}

/// `action` on `id`, guarded by the stored record (as the workflow
/// guards what it decides).
fn transition(
    store: &crate::Store,
    id: &str,
    action: crate::command::DeployAction,
) -> crate::Mutation {
    crate::Mutation::Deploy(crate::command::DeployTransition {
        deployment_id: id.into(),
        expected: wire::rules::deploy::deploy_guard(&stored(store, id)),
        action,
    })
}

/// Deploys `id` (environment `env`, region `eu`) through every step to
/// ready and live at `now_ms`; the live one it replaces gets its
/// standby scheduled at `now_ms + 1_000`.
fn live(store: &crate::Store, now_ms: u64, id: &str) {
    use crate::command::DeployAction;
    let out = apply_one(store, now_ms, create(id, &["eu"], 1));
    assert!(out.iter().all(Result::is_ok), "{out:?}");
    for action in [
        DeployAction::Advance {
            to: DeploymentStatus::Network,
            reason: "test".into(),
        },
        DeployAction::Advance {
            to: DeploymentStatus::Finalizing,
            reason: "test".into(),
        },
        DeployAction::Finalize {
            standby_replaced_at_ms: now_ms + 1_000,
        },
    ] {
        let step = transition(store, id, action);
        assert_eq!(
            apply_one(store, now_ms, vec![step]),
            vec![Ok(Outcome::Recorded)]
        );
    }
    let environment = store.read().unwrap().environment("env").unwrap().unwrap();
    assert_eq!(environment.live_deployment_id.as_deref(), Some(id));
}

fn set_state_at(
    id: &str,
    desired_state: DesiredState,
    at_ms: Option<u64>,
    force: bool,
) -> crate::Mutation {
    crate::Mutation::SetDesiredState(crate::mutations::SetDesiredState {
        deployment_id: id.into(),
        desired_state,
        at_ms,
        force,
    })
}

/// The error of a mutation refused with `code`; the store must be left
/// as it was.
fn refused(store: &crate::Store, now_ms: u64, m: crate::Mutation, code: wire::ErrorCode) -> String {
    let before = store.read().unwrap().state_hash().unwrap();
    let last_pk = store.read().unwrap().last_pk();
    let out = apply_one(store, now_ms, vec![m]);
    let [Err(e)] = out.as_slice() else {
        panic!("not refused: {out:?}");
    };
    assert_eq!(e.code, code, "{e}");
    let view = store.read().unwrap();
    assert_eq!(
        view.state_hash().unwrap(),
        before,
        "a refusal writes nothing"
    );
    assert_eq!(view.last_pk(), last_pk);
    e.message.clone()
}

/// `ctrl archive`: an archived deployment never runs again — not by a
/// start, not as a rollback target (named or not), not by an update.
#[test]
fn an_archived_deployment_is_refused_to_start_as_a_rollback_target_and_for_update() {
    use wire::ErrorCode::FailedPrecondition;
    let store = store();
    live(&store, 10, "d1");
    live(&store, 20, "d2");
    // d1 was ready and live: a rollback target until it is archived
    // (not live, so no force needed).
    let out = apply_one(
        &store,
        30,
        vec![set_state_at("d1", DesiredState::Archived, None, false)],
    );
    let Ok(Outcome::Deployment(d)) = &out[0] else {
        panic!("{out:?}");
    };
    assert_eq!(d.desired_state, DesiredState::Archived);
    assert_eq!(
        d.status,
        DeploymentStatus::Ready,
        "it was ready; not a failure"
    );
    let t = store.read().unwrap().topology("d1", "eu").unwrap().unwrap();
    assert_eq!((t.desired_state, t.replicas), (DesiredState::Stopped, 0));

    let e = refused(
        &store,
        40,
        set_state("d1", DesiredState::Running),
        FailedPrecondition,
    );
    assert!(e.contains("archived: it cannot run again"), "{e}");
    let e = refused(
        &store,
        40,
        set_state_at("d1", DesiredState::Running, Some(1_000), false),
        FailedPrecondition,
    );
    assert!(e.contains("archived"), "a scheduled start too: {e}");

    let rollback = |to: Option<&str>| {
        crate::Mutation::Rollback(crate::mutations::Rollback {
            environment_id: "env".into(),
            to: to.map(str::to_string),
        })
    };
    let e = refused(&store, 40, rollback(Some("d1")), FailedPrecondition);
    assert!(e.contains("\"d1\" is archived"), "{e}");
    // Without a target, the archived one is not chosen: nothing is left.
    let e = refused(&store, 40, rollback(None), FailedPrecondition);
    assert!(e.contains("no earlier deployment"), "{e}");

    let update = crate::Mutation::UpdateDeployment(crate::mutations::UpdateDeployment {
        deployment_id: "d1".into(),
        update: wire::operator::DeploymentUpdate {
            replicas: Some(3),
            ..Default::default()
        },
    });
    let e = refused(&store, 40, update.clone(), FailedPrecondition);
    assert!(e.contains("archived and cannot change"), "{e}");
    assert_eq!(stored(&store, "d1").replicas, 1);

    // The same requests on d2, not archived, are accepted (the refusals
    // above are the archive's, not the state's).
    live(&store, 50, "d3");
    let out = apply_one(&store, 60, vec![rollback(Some("d2"))]);
    assert!(out[0].is_ok(), "{out:?}");
}

/// `ctrl stop --after`: the change is scheduled, not made; apply makes it
/// only from its time on, by the time stamped in the entry (`now_ms`).
#[test]
fn a_scheduled_stop_is_applied_at_its_time_and_not_before() {
    use crate::command::DeployAction;
    let store = store();
    live(&store, 10, "d1");
    live(&store, 20, "d2");
    // d1 is no longer live; its replacement scheduled it at 1_020.
    // A newer schedule replaces that one.
    let out = apply_one(
        &store,
        100,
        vec![set_state_at(
            "d1",
            DesiredState::Stopped,
            Some(5_000),
            false,
        )],
    );
    let Ok(Outcome::Deployment(d)) = &out[0] else {
        panic!("{out:?}");
    };
    assert_eq!(d.desired_state, DesiredState::Running, "not yet");
    assert_eq!(
        d.workflow.scheduled,
        Some(wire::model::ScheduledChange {
            desired_state: DesiredState::Standby,
            at_ms: 5_000,
        })
    );
    let t = store.read().unwrap().topology("d1", "eu").unwrap().unwrap();
    assert_eq!(
        t.desired_state,
        DesiredState::Running,
        "the topology still runs"
    );
    assert!(
        wire::rules::deploy::workflow_open(d),
        "the driver looks at it"
    );

    // Decided early (or by a clock ahead of the entry's): refused.
    let early = transition(&store, "d1", DeployAction::ApplySchedule);
    let e = refused(&store, 4_999, early, wire::ErrorCode::FailedPrecondition);
    assert!(e.contains("scheduled at 5000"), "{e}");
    // The old schedule's time (1_020) has passed: it no longer counts.
    assert_eq!(stored(&store, "d1").desired_state, DesiredState::Running);

    let due = transition(&store, "d1", DeployAction::ApplySchedule);
    let last_pk = store.read().unwrap().last_pk();
    assert_eq!(
        apply_one(&store, 5_000, vec![due]),
        vec![Ok(Outcome::Recorded)]
    );
    let d = stored(&store, "d1");
    assert_eq!(d.desired_state, DesiredState::Standby);
    assert_eq!(d.workflow.scheduled, None);
    assert_eq!(d.updated_at_ms, 5_000);
    let view = store.read().unwrap();
    let t = view.topology("d1", "eu").unwrap().unwrap();
    assert_eq!((t.desired_state, t.replicas), (DesiredState::Stopped, 0));
    assert_eq!(
        (t.version, t.updated_at_ms),
        (last_pk + 1, 5_000),
        "one change row"
    );
    // d2 is untouched and still live.
    assert_eq!(
        view.environment("env")
            .unwrap()
            .unwrap()
            .live_deployment_id
            .as_deref(),
        Some("d2")
    );
    drop(view);
    // A time not after now is no schedule: the change is made at once.
    let out = apply_one(
        &store,
        6_000,
        vec![set_state_at(
            "d1",
            DesiredState::Archived,
            Some(6_000),
            false,
        )],
    );
    let Ok(Outcome::Deployment(d)) = &out[0] else {
        panic!("{out:?}");
    };
    assert_eq!(
        (d.desired_state, d.workflow.scheduled),
        (DesiredState::Archived, None)
    );
}

/// Stopping or archiving the live deployment takes `--force`, now or
/// scheduled; with it, the deployment stops being live.
#[test]
fn stopping_or_archiving_the_live_deployment_is_refused_without_force() {
    let store = store();
    live(&store, 10, "d1");
    for (state, verb) in [
        (DesiredState::Stopped, "stop"),
        (DesiredState::Standby, "stop"),
        (DesiredState::Archived, "archive"),
    ] {
        for at_ms in [None, Some(1_000)] {
            let e = refused(
                &store,
                20,
                set_state_at("d1", state, at_ms, false),
                wire::ErrorCode::FailedPrecondition,
            );
            assert!(
                e.contains("live deployment") && e.contains(&format!("{verb} it with force")),
                "{e}"
            );
        }
    }
    assert_eq!(stored(&store, "d1").workflow.scheduled, None);
    // Running the live one needs no force (a no-op).
    let out = apply_one(
        &store,
        20,
        vec![set_state_at("d1", DesiredState::Running, None, false)],
    );
    assert!(out[0].is_ok(), "{out:?}");

    let out = apply_one(
        &store,
        30,
        vec![set_state_at("d1", DesiredState::Archived, None, true)],
    );
    let Ok(Outcome::Deployment(d)) = &out[0] else {
        panic!("{out:?}");
    };
    assert_eq!(d.desired_state, DesiredState::Archived);
    let environment = store.read().unwrap().environment("env").unwrap().unwrap();
    assert_eq!(environment.live_deployment_id, None);
    assert_eq!(environment.formerly_live, ["d1"]);
    let t = store.read().unwrap().topology("d1", "eu").unwrap().unwrap();
    assert_eq!(t.desired_state, DesiredState::Stopped);
}

/// `ctrl cancel`: a deploy in flight ends `cancelled`, cleaned up (its
/// topologies stopped, instances and policies gone), and whatever the
/// workflow decided before the cancel no longer applies; a deploy not in
/// flight cannot be cancelled.
#[test]
fn a_cancel_ends_a_deploy_in_flight_and_nothing_else() {
    use crate::command::DeployAction;
    let store = store();
    let mut batch = create("d1", &["eu", "us"], 2);
    batch.push(crate::Mutation::ReportInstances(
        crate::mutations::ReportInstances {
            deployment_id: "d1".into(),
            region: "eu".into(),
            instances: running("d1", "eu", 2),
        },
    ));
    apply_one(&store, 10, batch);
    // The policies a start writes, as the leader proposes them.
    let d = stored(&store, "d1");
    let mut policies = Vec::new();
    for region in ["eu", "us"] {
        policies.extend(wire::rules::deploy::policies(&d, region));
    }
    assert!(!policies.is_empty());
    for p in &policies {
        apply_one(
            &store,
            10,
            vec![crate::Mutation::UpsertCiliumNetworkPolicy(p.clone())],
        );
        assert!(
            store
                .read()
                .unwrap()
                .policy(&p.id, &p.region)
                .unwrap()
                .is_some()
        );
    }
    // Decided before the cancel, applied after it.
    let late = transition(
        &store,
        "d1",
        DeployAction::Advance {
            to: DeploymentStatus::Network,
            reason: "test".into(),
        },
    );
    let cancel = |id: &str| {
        crate::Mutation::CancelDeployment(crate::mutations::CancelDeployment {
            deployment_id: id.into(),
        })
    };
    let out = apply_one(&store, 20, vec![cancel("d1")]);
    let Ok(Outcome::Deployment(d)) = &out[0] else {
        panic!("{out:?}");
    };
    assert_eq!(d.status, DeploymentStatus::Cancelled);
    assert_eq!(d.workflow.reason.as_deref(), Some("cancelled"));
    assert!(!d.workflow.make_live);
    assert!(d.workflow.steps.iter().all(|s| s.ended_at_ms.is_some()));
    let view = store.read().unwrap();
    for region in ["eu", "us"] {
        let t = view.topology("d1", region).unwrap().unwrap();
        assert_eq!(
            (t.desired_state, t.replicas),
            (DesiredState::Stopped, 0),
            "{region}"
        );
    }
    assert!(view.instances("d1").unwrap().is_empty());
    for p in &policies {
        assert!(view.policy(&p.id, &p.region).unwrap().is_none(), "{}", p.id);
    }
    let journal = view
        .journal(0, 100, 100, |e| e.deployment_id == "d1")
        .unwrap();
    let last = journal.last().unwrap();
    assert_eq!(
        (last.to, last.reason.as_str()),
        (DeploymentStatus::Cancelled, "cancelled")
    );
    assert!(
        !wire::rules::deploy::workflow_open(d),
        "nothing left for the driver"
    );
    drop(view);
    let out = apply_one(&store, 30, vec![late]);
    assert!(matches!(out[0], Ok(Outcome::GuardFailed { .. })), "{out:?}");
    assert_eq!(stored(&store, "d1").status, DeploymentStatus::Cancelled);

    // Not in flight: cancelled already, or ready.
    let e = refused(
        &store,
        40,
        cancel("d1"),
        wire::ErrorCode::FailedPrecondition,
    );
    assert!(e.contains("only a deploy in flight"), "{e}");
    live(&store, 50, "d2");
    let e = refused(
        &store,
        60,
        cancel("d2"),
        wire::ErrorCode::FailedPrecondition,
    );
    assert!(e.contains("is ready"), "{e}");
    refused(&store, 60, cancel("nope"), wire::ErrorCode::NotFound);
}

/// Archived is for good: a later stop (or a scheduled one) must not make
/// an archived deployment standby, from where a start would run it again.
#[test]
fn a_stop_does_not_unarchive_a_deployment() {
    let store = store();
    live(&store, 10, "d1");
    live(&store, 20, "d2");
    apply_one(
        &store,
        30,
        vec![set_state_at("d1", DesiredState::Archived, None, false)],
    );
    let stop = apply_one(
        &store,
        40,
        vec![set_state_at("d1", DesiredState::Stopped, None, false)],
    );
    assert!(
        matches!(&stop[0], Err(e) if e.code == wire::ErrorCode::FailedPrecondition),
        "{stop:?}"
    );
    assert_eq!(stored(&store, "d1").desired_state, DesiredState::Archived);
    let out = apply_one(&store, 50, vec![set_state("d1", DesiredState::Running)]);
    assert!(
        matches!(&out[0], Err(e) if e.code == wire::ErrorCode::FailedPrecondition),
        "an archived deployment ran again after a stop: {out:?}"
    );
}
