//! Tests of `storage/src/apply/notify`.
use wire::ErrorCode;
use wire::notify::{DeliveryState, NotifyEndpoint};

use super::*;
use crate::command::DeployAction;
use crate::test_support::*;
use crate::{Guard, Mutation, Store};

fn endpoint(name: &str) -> Mutation {
    Mutation::AddNotifyEndpoint(NotifyEndpoint {
        name: name.into(),
        url: format!("http://127.0.0.1:9/{name}"),
        secret: None,
        created_at_ms: 0,
    })
}

/// Creates deployment `id`, starts it and fails it: one event.
fn fail(store: &Store, now_ms: u64, id: &str) {
    let out = apply_one(store, now_ms, create(id, &["eu"], 1));
    assert!(out.iter().all(Result::is_ok), "{out:?}");
    let out = apply_one(
        store,
        now_ms,
        vec![Mutation::Deploy(crate::command::DeployTransition {
            deployment_id: id.into(),
            expected: Guard {
                step: "deploying".into(),
                revision: 2,
            },
            action: DeployAction::Fail {
                reason: "deadline".into(),
            },
        })],
    );
    assert_eq!(out, vec![Ok(Outcome::Recorded)]);
}

fn deliveries(store: &Store) -> Vec<Delivery> {
    store.read().unwrap().deliveries(0, 1_000).unwrap()
}

fn attempt(delivery: &Delivery, action: DeliveryAction) -> Mutation {
    Mutation::Deliver(DeliveryTransition {
        delivery_id: delivery.id,
        expected: delivery_guard(delivery),
        action,
    })
}

#[test]
fn a_rollout_start_is_announced_in_its_own_apply() {
    let store = store();
    let out = apply_one(
        &store,
        5,
        vec![
            endpoint("chat"),
            Mutation::UpsertSentinel(sentinel("s1", "eu")),
            Mutation::UpsertSentinel(sentinel("s2", "eu")),
        ],
    );
    assert!(out.iter().all(Result::is_ok), "{out:?}");
    let start = Mutation::StartRollout(wire::rollout::RolloutOptions {
        image: "sentinel:new".into(),
        wave_percents: vec![50, 100],
        bake_ms: 0,
        max_failures: 0,
        concurrency: 0,
        deadline_ms: 60_000,
        notify: None,
    });
    let out = apply_one(&store, 10, vec![start]);
    assert!(out.iter().all(Result::is_ok), "{out:?}");
    let rows = deliveries(&store);
    assert!(
        rows.iter().any(|r| matches!(
            &r.event,
            NotifyEvent::RolloutStarted { image, waves: 2, sentinels: 2, .. }
                if image == "sentinel:new"
        ) && r.created_at_ms == 10),
        "{rows:#?}"
    );
}

#[test]
fn a_rollout_started_with_notify_goes_to_that_endpoint_only() {
    let store = store();
    let out = apply_one(
        &store,
        5,
        vec![
            endpoint("chat"),
            endpoint("pager"),
            Mutation::UpsertSentinel(sentinel("s1", "eu")),
        ],
    );
    assert!(out.iter().all(Result::is_ok), "{out:?}");
    let start = |notify: &str| {
        Mutation::StartRollout(wire::rollout::RolloutOptions {
            image: "sentinel:new".into(),
            wave_percents: vec![100],
            bake_ms: 0,
            max_failures: 0,
            concurrency: 0,
            deadline_ms: 60_000,
            notify: Some(notify.into()),
        })
    };
    // An endpoint that does not exist: refused, nothing written.
    let out = apply_one(&store, 8, vec![start("nowhere")]);
    assert_eq!(out[0].as_ref().unwrap_err().code, ErrorCode::NotFound);
    assert!(store.read().unwrap().latest_rollout().unwrap().is_none());
    let out = apply_one(&store, 10, vec![start("pager")]);
    assert!(out.iter().all(Result::is_ok), "{out:?}");
    let rows = deliveries(&store);
    assert!(!rows.is_empty());
    assert!(rows.iter().all(|r| r.endpoint == "pager"), "{rows:#?}");
}

#[test]
fn a_failure_creates_one_delivery_per_endpoint_with_one_event_id() {
    let store = store();
    fail(&store, 10, "d0");
    assert!(deliveries(&store).is_empty(), "no endpoint, no delivery");
    assert_eq!(store.read().unwrap().notify_event_seq(), 1);
    let out = apply_one(&store, 20, vec![endpoint("chat"), endpoint("pager")]);
    assert!(out.iter().all(Result::is_ok), "{out:?}");
    fail(&store, 30, "d1");
    let rows = deliveries(&store);
    assert_eq!(rows.len(), 2);
    for row in &rows {
        assert_eq!(row.event_id, 2);
        assert_eq!(row.state, DeliveryState::Pending);
        assert_eq!((row.created_at_ms, row.next_attempt_at_ms), (30, 30));
        assert!(matches!(
            &row.event,
            NotifyEvent::DeploymentFailed { deployment_id, reason, .. }
                if deployment_id == "d1" && reason == "deadline"
        ));
    }
    assert_eq!(
        rows.iter().map(|r| r.endpoint.as_str()).collect::<Vec<_>>(),
        ["chat", "pager"]
    );
    let view = store.read().unwrap();
    assert_eq!(view.pending_deliveries(10).unwrap(), rows);
}

#[test]
fn reaching_ready_creates_a_notification() {
    let store = store();
    apply_one(&store, 1, vec![endpoint("chat")]);
    apply_one(&store, 2, create("d1", &["eu"], 1));
    let step = |step: &str, revision, action| {
        Mutation::Deploy(crate::command::DeployTransition {
            deployment_id: "d1".into(),
            expected: Guard {
                step: step.into(),
                revision,
            },
            action,
        })
    };
    let advance = |to| DeployAction::Advance {
        to,
        reason: "ready".into(),
    };
    let out = apply_one(
        &store,
        3,
        vec![
            step(
                "deploying",
                2,
                advance(wire::model::DeploymentStatus::Network),
            ),
            step(
                "network",
                3,
                advance(wire::model::DeploymentStatus::Finalizing),
            ),
            step(
                "finalizing",
                4,
                DeployAction::Finalize {
                    standby_replaced_at_ms: 100,
                },
            ),
        ],
    );
    assert!(out.iter().all(|o| *o == Ok(Outcome::Recorded)), "{out:?}");
    let rows = deliveries(&store);
    assert_eq!(rows.len(), 1, "one event, at ready only");
    assert!(matches!(
        &rows[0].event,
        NotifyEvent::DeploymentReady { deployment_id, image, .. }
            if deployment_id == "d1" && !image.is_empty()
    ));
    assert_eq!(rows[0].created_at_ms, 3, "in the apply of the transition");
}

#[test]
fn attempts_are_guarded_and_move_the_due_time() {
    let store = store();
    apply_one(&store, 1, vec![endpoint("chat")]);
    fail(&store, 10, "d1");
    let first = deliveries(&store).remove(0);
    let failed = DeliveryAction::Failed {
        error: "HTTP 500 ".to_string() + &"x".repeat(2 * DELIVERY_ERROR_BYTES_MAX),
        next_attempt_at_ms: 5_000,
    };
    let out = apply_one(&store, 100, vec![attempt(&first, failed.clone())]);
    assert_eq!(out, vec![Ok(Outcome::Recorded)]);
    let second = deliveries(&store).remove(0);
    assert_eq!(second.attempts, 1);
    assert_eq!(second.state, DeliveryState::Pending);
    assert_eq!(second.next_attempt_at_ms, 5_000);
    assert_eq!(second.last_attempt_at_ms, Some(100));
    assert_eq!(
        second.last_error.as_ref().map(String::len),
        Some(DELIVERY_ERROR_BYTES_MAX)
    );
    assert_eq!(
        store.read().unwrap().pending_deliveries(10).unwrap(),
        vec![second.clone()],
        "the index follows the due time"
    );

    // A late result decided on the first version changes nothing.
    let hash = store.read().unwrap().state_hash().unwrap();
    let out = apply_one(
        &store,
        200,
        vec![attempt(&first, DeliveryAction::Delivered)],
    );
    assert!(matches!(out[0], Ok(Outcome::GuardFailed { .. })), "{out:?}");
    assert_eq!(store.read().unwrap().state_hash().unwrap(), hash);

    apply_one(
        &store,
        300,
        vec![attempt(&second, DeliveryAction::Delivered)],
    );
    let delivered = deliveries(&store).remove(0);
    assert_eq!(delivered.state, DeliveryState::Delivered);
    assert_eq!(delivered.delivered_at_ms, Some(300));
    assert_eq!(delivered.attempts, 2);
    assert!(
        store
            .read()
            .unwrap()
            .pending_deliveries(10)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_dead_delivery_is_replayed_and_a_pending_one_is_not() {
    let store = store();
    apply_one(&store, 1, vec![endpoint("chat")]);
    fail(&store, 10, "d1");
    let row = deliveries(&store).remove(0);
    let replay = Mutation::ReplayDelivery(crate::mutations::ReplayDelivery {
        delivery_id: row.id,
    });
    let out = apply_one(&store, 20, vec![replay.clone()]);
    assert_eq!(
        out[0].as_ref().unwrap_err().code,
        ErrorCode::FailedPrecondition
    );
    let gave_up = DeliveryAction::GaveUp {
        error: "refused".into(),
    };
    apply_one(&store, 30, vec![attempt(&row, gave_up)]);
    let dead = deliveries(&store).remove(0);
    assert_eq!(dead.state, DeliveryState::Dead);
    assert!(
        store
            .read()
            .unwrap()
            .pending_deliveries(10)
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        apply_one(&store, 40, vec![replay]),
        vec![Ok(Outcome::Recorded)]
    );
    let again = deliveries(&store).remove(0);
    assert_eq!(again.state, DeliveryState::Pending);
    assert_eq!((again.attempts, again.next_attempt_at_ms), (0, 40));
    assert_eq!(again.event_id, row.event_id, "the same event id");
    let out = apply_one(
        &store,
        50,
        vec![Mutation::ReplayDelivery(crate::mutations::ReplayDelivery {
            delivery_id: 99,
        })],
    );
    assert_eq!(out[0].as_ref().unwrap_err().code, ErrorCode::NotFound);
}

#[test]
fn removing_an_endpoint_kills_its_pending_deliveries() {
    let store = store();
    apply_one(&store, 1, vec![endpoint("chat"), endpoint("pager")]);
    fail(&store, 10, "d1");
    let out = apply_one(
        &store,
        20,
        vec![Mutation::RemoveNotifyEndpoint(
            crate::mutations::RemoveNotifyEndpoint {
                name: "chat".into(),
            },
        )],
    );
    assert_eq!(
        out,
        vec![Ok(Outcome::EndpointRemoved { deliveries_dead: 1 })]
    );
    let rows = deliveries(&store);
    assert_eq!(rows[0].state, DeliveryState::Dead);
    assert_eq!(rows[0].last_error.as_deref(), Some(ENDPOINT_REMOVED));
    assert_eq!(rows[1].state, DeliveryState::Pending);
    let out = apply_one(
        &store,
        30,
        vec![Mutation::ReplayDelivery(crate::mutations::ReplayDelivery {
            delivery_id: 1,
        })],
    );
    assert_eq!(
        out[0].as_ref().unwrap_err().code,
        ErrorCode::FailedPrecondition
    );
    let out = apply_one(
        &store,
        30,
        vec![Mutation::RemoveNotifyEndpoint(
            crate::mutations::RemoveNotifyEndpoint {
                name: "chat".into(),
            },
        )],
    );
    assert_eq!(out[0].as_ref().unwrap_err().code, ErrorCode::NotFound);
}

#[test]
fn endpoints_are_validated_unique_and_bounded() {
    let store = store();
    assert_eq!(
        apply_one(&store, 1, vec![endpoint("chat")]),
        vec![Ok(Outcome::Recorded)]
    );
    let out = apply_one(&store, 2, vec![endpoint("chat")]);
    assert_eq!(out[0].as_ref().unwrap_err().code, ErrorCode::Conflict);
    let bad = Mutation::AddNotifyEndpoint(NotifyEndpoint {
        name: "x".into(),
        url: "ftp://h/".into(),
        secret: None,
        created_at_ms: 0,
    });
    let out = apply_one(&store, 3, vec![bad]);
    assert_eq!(out[0].as_ref().unwrap_err().code, ErrorCode::BadRequest);
    let more: Vec<Mutation> = (1..ENDPOINTS_MAX)
        .map(|i| endpoint(&format!("e{i}")))
        .collect();
    let out = apply_one(&store, 4, more);
    assert!(out.iter().all(Result::is_ok), "{out:?}");
    let out = apply_one(&store, 5, vec![endpoint("one-too-many")]);
    assert_eq!(out[0].as_ref().unwrap_err().code, ErrorCode::BadRequest);
    let view = store.read().unwrap();
    let stored = view.notify_endpoints().unwrap();
    assert_eq!(stored.len(), ENDPOINTS_MAX);
    assert_eq!(
        stored[0].created_at_ms, 1,
        "stamped with the command's time"
    );
}

#[test]
fn at_the_bound_delivered_ones_go_first_and_undelivered_ones_are_never_dropped() {
    let store = store().with_deliveries_max(3);
    apply_one(&store, 1, vec![endpoint("chat")]);
    for (i, id) in ["d1", "d2", "d3"].into_iter().enumerate() {
        fail(&store, 10 + i as u64, id);
    }
    let rows = deliveries(&store);
    assert_eq!(rows.len(), 3);
    // The second is delivered: the fourth event takes its place.
    apply_one(
        &store,
        20,
        vec![attempt(&rows[1], DeliveryAction::Delivered)],
    );
    fail(&store, 30, "d4");
    let ids: Vec<u64> = deliveries(&store).iter().map(|d| d.id).collect();
    assert_eq!(ids, [1, 3, 4]);
    assert_eq!(store.read().unwrap().notify_dropped(), 0);
    // Full of undelivered ones: the fifth is not stored, and counted.
    fail(&store, 40, "d5");
    let ids: Vec<u64> = deliveries(&store).iter().map(|d| d.id).collect();
    assert_eq!(ids, [1, 3, 4], "no pending delivery was deleted");
    let view = store.read().unwrap();
    assert_eq!(view.notify_dropped(), 1);
    assert_eq!(view.notify_event_seq(), 5);
}

#[test]
fn a_snapshot_carries_endpoints_deliveries_and_counters() {
    let store = store();
    apply_one(&store, 1, vec![endpoint("chat")]);
    fail(&store, 10, "d1");
    fail(&store, 11, "d2");
    let row = deliveries(&store).remove(0);
    apply_one(&store, 20, vec![attempt(&row, DeliveryAction::Delivered)]);
    let (bytes, _) = store.export_snapshot().unwrap();
    let copy = Store::in_memory().unwrap();
    copy.import_snapshot(&bytes).unwrap();
    let (a, b) = (store.read().unwrap(), copy.read().unwrap());
    assert_eq!(a.state_hash().unwrap(), b.state_hash().unwrap());
    assert_eq!(b.pending_deliveries(10).unwrap().len(), 1, "index rebuilt");
    assert_eq!(b.delivery_seq(), 2);
}
