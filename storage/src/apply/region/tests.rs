//! Tests of `storage/src/apply/region`.
use wire::ErrorCode;
use wire::model::{FailedApply, Heartbeat, RegionSource, ResourceKey, ResourceType};

use crate::test_support::*;
use crate::{Mutation, Outcome, Store};

fn heartbeat(cursor: u64) -> Heartbeat {
    Heartbeat {
        agent_version: "0.1.0".into(),
        cursor,
        interval_ms: 1_000,
        applied_resources: 2,
        failed_applies: vec![FailedApply::new(
            ResourceKey {
                resource_type: ResourceType::Sentinel,
                resource_id: "s1".into(),
                region: "eu".into(),
            },
            "forbidden",
        )],
        // Replaced by the command's time.
        at_ms: 999_999,
    }
}

fn record(region: &str, cursor: u64) -> Mutation {
    Mutation::RecordHeartbeat(crate::mutations::RecordHeartbeat {
        region: region.into(),
        heartbeat: heartbeat(cursor),
    })
}

fn hash(store: &Store) -> u64 {
    store.read().unwrap().state_hash().unwrap()
}

#[test]
fn adding_a_region_is_idempotent() {
    let store = Store::in_memory().unwrap();
    let out = apply_one(&store, 5, vec![add_region("eu")]);
    let Ok(Outcome::Region(first)) = &out[0] else {
        panic!("{out:?}")
    };
    assert!(first.schedulable);
    assert_eq!(first.registered_by, RegionSource::Operator);
    assert_eq!(
        (first.created_at_ms, first.last_heartbeat.clone()),
        (5, None)
    );
    let before = hash(&store);
    let again = apply_one(&store, 9, vec![add_region("eu")]);
    assert_eq!(again, vec![Ok(Outcome::Region(first.clone()))]);
    assert_eq!(hash(&store), before, "a second add changes nothing");
    let bad = apply_one(&store, 9, vec![add_region("EU")]);
    assert_eq!(bad[0].as_ref().unwrap_err().code, ErrorCode::BadRequest);
    assert_eq!(store.read().unwrap().list_regions().unwrap().len(), 1);
}

#[test]
fn the_first_heartbeat_registers_the_region_and_the_next_replace_it() {
    let store = Store::in_memory().unwrap();
    assert_eq!(
        apply_one(&store, 10, vec![record("eu", 3)]),
        vec![Ok(Outcome::Recorded)]
    );
    let region = store
        .read()
        .unwrap()
        .region("eu")
        .unwrap()
        .expect("registered");
    assert_eq!(region.registered_by, RegionSource::Heartbeat);
    assert!(region.schedulable);
    assert_eq!(region.created_at_ms, 10);
    let last = region.last_heartbeat.expect("a heartbeat");
    assert_eq!(
        (last.cursor, last.at_ms),
        (3, 10),
        "stamped with ctrl's time"
    );
    assert_eq!(last.failed_applies.len(), 1);

    apply_one(&store, 20, vec![record("eu", 8)]);
    let region = store.read().unwrap().region("eu").unwrap().unwrap();
    assert_eq!(region.created_at_ms, 10);
    let last = region.last_heartbeat.unwrap();
    assert_eq!((last.cursor, last.at_ms), (8, 20));
    // No change rows: regions are not streamed.
    assert_eq!(store.read().unwrap().last_pk(), 0);
}

#[test]
fn a_heartbeat_out_of_bounds_writes_nothing() {
    let store = Store::in_memory().unwrap();
    let before = hash(&store);
    let mut bad = heartbeat(1);
    bad.interval_ms = 0;
    let out = apply_one(
        &store,
        10,
        vec![Mutation::RecordHeartbeat(
            crate::mutations::RecordHeartbeat {
                region: "eu".into(),
                heartbeat: bad,
            },
        )],
    );
    assert_eq!(out[0].as_ref().unwrap_err().code, ErrorCode::BadRequest);
    assert!(store.read().unwrap().region("eu").unwrap().is_none());
    assert_eq!(hash(&store), before);
}

#[test]
fn cordon_and_uncordon() {
    let store = Store::in_memory().unwrap();
    apply_one(&store, 1, vec![add_region("eu")]);
    let cordon = Mutation::SetRegionSchedulable(crate::mutations::SetRegionSchedulable {
        name: "eu".into(),
        schedulable: false,
    });
    let out = apply_one(&store, 2, vec![cordon.clone()]);
    let Ok(Outcome::Region(region)) = &out[0] else {
        panic!("{out:?}")
    };
    assert!(!region.schedulable);
    let before = hash(&store);
    apply_one(&store, 3, vec![cordon]);
    assert_eq!(hash(&store), before, "cordoning twice changes nothing");
    apply_one(
        &store,
        4,
        vec![Mutation::SetRegionSchedulable(
            crate::mutations::SetRegionSchedulable {
                name: "eu".into(),
                schedulable: true,
            },
        )],
    );
    assert!(
        store
            .read()
            .unwrap()
            .region("eu")
            .unwrap()
            .unwrap()
            .schedulable
    );
}

#[test]
fn an_unknown_region_is_not_found_naming_it() {
    let store = Store::in_memory().unwrap();
    let out = apply_one(
        &store,
        1,
        vec![Mutation::SetRegionSchedulable(
            crate::mutations::SetRegionSchedulable {
                name: "mars".into(),
                schedulable: false,
            },
        )],
    );
    let error = out[0].as_ref().unwrap_err();
    assert_eq!(error.code, ErrorCode::NotFound);
    assert!(error.message.contains("\"mars\""), "{}", error.message);
}

#[test]
fn a_deployment_naming_an_unknown_or_cordoned_region_is_refused_and_writes_nothing() {
    let store = Store::in_memory().unwrap();
    apply_one(
        &store,
        1,
        vec![
            add_region("eu"),
            add_region("us"),
            Mutation::SetRegionSchedulable(crate::mutations::SetRegionSchedulable {
                name: "us".into(),
                schedulable: false,
            }),
        ],
    );
    let before = hash(&store);
    let last_pk = store.read().unwrap().last_pk();
    let out = apply_one(&store, 2, vec![submit("d1", &["eu", "us", "ap"], 1)]);
    let error = out[0].as_ref().unwrap_err();
    assert_eq!(error.code, ErrorCode::BadRequest);
    assert!(
        error.message.contains("\"us\" is cordoned") && error.message.contains("\"ap\" is unknown"),
        "{}",
        error.message
    );
    assert!(!error.message.contains("\"eu\""), "{}", error.message);
    assert_eq!(hash(&store), before, "the refusal wrote nothing");
    let view = store.read().unwrap();
    assert_eq!(view.last_pk(), last_pk);
    assert!(view.deployment("d1").unwrap().is_none());
    drop(view);

    // Uncordoned and added, the same create goes through.
    apply_one(
        &store,
        3,
        vec![
            Mutation::SetRegionSchedulable(crate::mutations::SetRegionSchedulable {
                name: "us".into(),
                schedulable: true,
            }),
            add_region("ap"),
        ],
    );
    let out = apply_one(&store, 4, vec![submit("d1", &["eu", "us", "ap"], 1)]);
    assert!(
        matches!(out[0], Ok(Outcome::DeploymentCreated { .. })),
        "{out:?}"
    );
}
