//! Tests of `storage/src/apply/cilium`.
use wire::agent::ResourceChange;
use wire::model::{ResourceKey, ResourceType};

use crate::test_support::*;
use crate::{Mutation, Outcome};

#[test]
fn a_deleted_policy_streams_as_a_delete() {
    let store = store();
    apply_one(
        &store,
        1,
        vec![Mutation::UpsertCiliumNetworkPolicy(policy("p1", "eu"))],
    );
    let out = apply_one(
        &store,
        2,
        vec![Mutation::DeleteCiliumNetworkPolicy(
            crate::mutations::DeleteCiliumNetworkPolicy {
                id: "p1".into(),
                region: "eu".into(),
            },
        )],
    );
    assert_eq!(out, vec![Ok(Outcome::Recorded)]);
    let view = store.read().unwrap();
    let rows = view.changes_after("eu", 0, 10).unwrap();
    assert_eq!(rows.iter().map(|(pk, _)| *pk).collect::<Vec<_>>(), [1, 2]);
    let key = ResourceKey {
        resource_type: ResourceType::CiliumNetworkPolicy,
        resource_id: "p1".into(),
        region: "eu".into(),
    };
    // Both rows, the old upsert included, now stream as the delete.
    for (_, row) in &rows {
        assert_eq!(
            view.change_event(row).unwrap(),
            ResourceChange::Delete(key.clone())
        );
    }
}

fn applied(id: &str, region: &str, version: u64) -> Mutation {
    Mutation::ReportApply(wire::model::ApplyReport {
        key: ResourceKey {
            resource_type: ResourceType::CiliumNetworkPolicy,
            resource_id: id.into(),
            region: region.into(),
        },
        version,
        outcome: wire::model::ApplyOutcome::Applied,
        at_ms: 5,
    })
}

fn applied_version(store: &crate::Store) -> Option<u64> {
    let view = store.read().unwrap();
    view.policy_applied("p1", "eu").unwrap().map(|a| a.version)
}

#[test]
fn the_newest_applied_version_is_kept_until_the_policy_goes() {
    let store = store();
    let upsert = || vec![Mutation::UpsertCiliumNetworkPolicy(policy("p1", "eu"))];
    apply_one(&store, 1, upsert());
    apply_one(&store, 2, upsert());
    // No policy there; a version it never had: nothing written.
    let out = apply_one(&store, 3, vec![applied("p2", "eu", 1), applied_at("p1", 1)]);
    assert_eq!(out[0].as_ref().unwrap_err().code, wire::ErrorCode::NotFound);
    assert_eq!(out[1], Ok(Outcome::Recorded));
    let out = apply_one(&store, 3, vec![applied_at("p1", 3)]);
    assert_eq!(
        out[0].as_ref().unwrap_err().code,
        wire::ErrorCode::BadRequest
    );
    assert_eq!(applied_version(&store), Some(1));
    // Newer is kept; an older one arriving late changes nothing.
    apply_one(&store, 4, vec![applied_at("p1", 2), applied_at("p1", 1)]);
    assert_eq!(applied_version(&store), Some(2));
    // Only policies are reported.
    let mut other = applied_at("p1", 1);
    if let Mutation::ReportApply(report) = &mut other {
        report.key.resource_type = ResourceType::Sentinel;
    }
    let out = apply_one(&store, 5, vec![other]);
    assert_eq!(
        out[0].as_ref().unwrap_err().code,
        wire::ErrorCode::BadRequest
    );
    // The delete forgets it: a policy made again starts unapplied.
    apply_one(
        &store,
        6,
        vec![Mutation::DeleteCiliumNetworkPolicy(
            crate::mutations::DeleteCiliumNetworkPolicy {
                id: "p1".into(),
                region: "eu".into(),
            },
        )],
    );
    assert_eq!(applied_version(&store), None);
    apply_one(&store, 7, upsert());
    assert_eq!(applied_version(&store), None);
}

fn applied_at(id: &str, version: u64) -> Mutation {
    applied(id, "eu", version)
}

fn rejected(resource_type: ResourceType, id: &str, version: u64) -> Mutation {
    Mutation::ReportApply(wire::model::ApplyReport {
        key: ResourceKey {
            resource_type,
            resource_id: id.into(),
            region: "eu".into(),
        },
        version,
        outcome: wire::model::ApplyOutcome::Rejected {
            reason: "spec.x: Invalid value".into(),
            code: 422,
            field: Some("spec.x".into()),
        },
        at_ms: 6,
    })
}

#[test]
fn a_rejection_of_any_resource_is_kept_against_its_version() {
    let store = store();
    apply_one(&store, 1, create("dep_a", &["eu"], 1));
    apply_one(
        &store,
        2,
        vec![Mutation::UpsertCiliumNetworkPolicy(policy("p1", "eu"))],
    );
    let key = |resource_type, id: &str| ResourceKey {
        resource_type,
        resource_id: id.into(),
        region: "eu".into(),
    };
    let topology = store
        .read()
        .unwrap()
        .topology("dep_a", "eu")
        .unwrap()
        .unwrap();
    let out = apply_one(
        &store,
        3,
        vec![
            rejected(ResourceType::DeploymentTopology, "dep_a", topology.version),
            // No such topology (any more): a refused delete, kept.
            rejected(ResourceType::DeploymentTopology, "dep_b", 1),
            // A version it never had.
            rejected(
                ResourceType::DeploymentTopology,
                "dep_a",
                topology.version + 9,
            ),
            rejected(ResourceType::CiliumNetworkPolicy, "p1", 2),
        ],
    );
    assert_eq!(out[0], Ok(Outcome::Recorded));
    assert_eq!(out[1], Ok(Outcome::Recorded));
    assert_eq!(
        out[2].as_ref().unwrap_err().code,
        wire::ErrorCode::BadRequest
    );
    assert_eq!(out[3], Ok(Outcome::Recorded));
    let view = store.read().unwrap();
    let refused_delete = view
        .apply_report(&key(ResourceType::DeploymentTopology, "dep_b"))
        .unwrap()
        .expect("the refused delete is kept");
    assert_eq!(refused_delete.version, 1);
    let found = view
        .rejected(
            &key(ResourceType::DeploymentTopology, "dep_a"),
            topology.version,
        )
        .unwrap()
        .expect("the rejection");
    assert_eq!(
        found.outcome.rejection().unwrap(),
        "Kubernetes refused it (422): spec.x: Invalid value"
    );
    // A later version is not the rejected one; another type's key is not it.
    assert!(
        view.rejected(
            &key(ResourceType::DeploymentTopology, "dep_a"),
            topology.version + 1
        )
        .unwrap()
        .is_none()
    );
    assert!(
        view.apply_report(&key(ResourceType::Sentinel, "dep_a"))
            .unwrap()
            .is_none()
    );
    // The policy's rejection replaced nothing applied; a newer applied
    // version replaces the rejection.
    assert!(
        view.rejected(&key(ResourceType::CiliumNetworkPolicy, "p1"), 2)
            .unwrap()
            .is_some()
    );
    drop(view);
    apply_one(
        &store,
        4,
        vec![Mutation::UpsertCiliumNetworkPolicy(policy("p1", "eu"))],
    );
    apply_one(&store, 5, vec![applied_at("p1", 3)]);
    let view = store.read().unwrap();
    assert!(
        view.rejected(&key(ResourceType::CiliumNetworkPolicy, "p1"), 3)
            .unwrap()
            .is_none()
    );
    assert_eq!(
        view.policy_applied("p1", "eu").unwrap().map(|a| a.version),
        Some(3)
    );
}

#[test]
fn a_rejected_sentinel_version_fails_its_deploy() {
    let store = store();
    let out = apply_one(
        &store,
        1,
        vec![Mutation::DeploySentinel(crate::mutations::DeploySentinel {
            sentinel: sentinel("s1", "eu"),
            deadline_ms: 600_000,
        })],
    );
    let Ok(Outcome::SentinelDeployed { version, .. }) = out[0] else {
        panic!("{out:?}");
    };
    // A rejection of an older version changes nothing.
    apply_one(
        &store,
        2,
        vec![rejected(ResourceType::Sentinel, "s1", version - 1)],
    );
    let row = store.read().unwrap().sentinel("s1", "eu").unwrap().unwrap();
    assert_eq!(
        row.deploy.status,
        wire::model::SentinelDeployStatus::Progressing
    );
    apply_one(
        &store,
        3,
        vec![rejected(ResourceType::Sentinel, "s1", version)],
    );
    let row = store.read().unwrap().sentinel("s1", "eu").unwrap().unwrap();
    assert_eq!(row.deploy.status, wire::model::SentinelDeployStatus::Failed);
    assert_eq!(row.deploy.ended_at_ms, Some(3));
    assert_eq!(
        row.deploy.reason.as_deref(),
        Some("Kubernetes refused it (422): spec.x: Invalid value")
    );
}

/// The policies' index by name: another environment's policy of a taken
/// name is refused by key; a delete frees the name; an import rebuilds it.
#[test]
fn a_name_held_by_another_environment_is_found_by_key_and_freed_by_a_delete() {
    let store = store();
    let upsert = |store: &crate::Store, id: &str, environment: &str| {
        let mut p = policy(id, "eu");
        p.environment_id = environment.into();
        p.k8s_name = "cnp-web".into();
        apply_one(store, 5, vec![Mutation::UpsertCiliumNetworkPolicy(p)])
            .pop()
            .unwrap()
    };
    assert!(upsert(&store, "p1", "env-a").is_ok());
    // The holder itself may replace its document.
    assert!(upsert(&store, "p1", "env-a").is_ok());
    let refused = upsert(&store, "p2", "env-b").unwrap_err();
    assert_eq!(refused.code, wire::ErrorCode::Conflict, "{refused}");
    assert!(refused.message.contains("env-a"), "{refused}");
    // An import keeps the name taken.
    let (snapshot, _) = store.export_snapshot().unwrap();
    let copy = crate::Store::in_memory().unwrap();
    copy.import_snapshot(&snapshot).unwrap();
    assert!(upsert(&copy, "p2", "env-b").is_err());
    // A delete frees it.
    let out = apply_one(
        &store,
        6,
        vec![Mutation::DeleteCiliumNetworkPolicy(
            crate::mutations::DeleteCiliumNetworkPolicy {
                id: "p1".into(),
                region: "eu".into(),
            },
        )],
    );
    assert!(out[0].is_ok(), "{out:?}");
    assert!(upsert(&store, "p2", "env-b").is_ok());
}
